"""Truncated importance sampling (config key tis_cap; grpo_loss's sampler_logp and tis_cap).

The sampler that drew the tokens (vLLM: other kernels, bf16) is not pi_old. Weighing each
token's policy term by w = min(pi_old / pi_sampler, cap) makes the expected gradient pi_old's
again: measured here by Monte Carlo against the exact on-policy gradient of a small
categorical policy, with a sampler at another temperature.
"""

import math

import pytest
import torch

from grpo_edu.training import metrics, rollouts, trainer
from grpo_edu.config import TrainConfig
from grpo_edu.algorithm.aggregation import LOSS_TYPES
from grpo_edu.algorithm.loss import grpo_loss


def batch(seed=0, N=4, S=5):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(N, S, generator=g) * 2).requires_grad_()
    old = (logp.detach() + 0.1 * torch.randn(N, S, generator=g)).clamp(max=-0.01)
    sampler = (old + 0.4 * torch.randn(N, S, generator=g)).clamp(max=-0.01)
    ref = (logp.detach() + 0.2 * torch.randn(N, S, generator=g)).clamp(max=-0.01)
    mask = torch.ones(N, S, dtype=torch.bool)
    mask[1, 3:] = False
    mask[3, 1:] = False
    advantages = torch.randn(N, generator=g)
    return logp, old, sampler, ref, mask, advantages


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_off_is_bitwise_the_loss_without_it(loss_type):
    logp, old, sampler, ref, mask, A = batch()
    options = dict(ref_logp=ref, beta=0.04, loss_type=loss_type, max_completion_length=5)
    plain = grpo_loss(logp, old, A, mask, **options)
    (g1,) = torch.autograd.grad(plain.loss, logp)
    off = grpo_loss(logp, old, A, mask, sampler_logp=sampler, tis_cap=0.0, **options)
    (g2,) = torch.autograd.grad(off.loss, logp)
    assert torch.equal(plain.loss, off.loss) and torch.equal(g1, g2)
    assert "tis/mean" not in off.metrics


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_a_hand_computed_case(loss_type):
    """Every term by its formula, in plain floats: w = min(exp(old - sampler), cap) on the policy
    term, the KL term unweighted, then grpo's or dapo's aggregation."""
    logp, old, sampler, ref, mask, A = batch(seed=1)
    cap, beta, eps = 1.3, 0.04, 0.2
    out = grpo_loss(logp, old, A, mask, ref_logp=ref, beta=beta, loss_type=loss_type,
                    sampler_logp=sampler, tis_cap=cap)
    rows, weights, truncated = [], [], 0
    for i in range(4):
        terms = []
        for t in range(5):
            if not mask[i, t]:
                continue
            lp, o, q, r = (float(x[i, t]) for x in (logp.detach(), old, sampler, ref))
            a = float(A[i])
            rho = math.exp(lp - o)
            policy = -min(rho * a, min(max(rho, 1 - eps), 1 + eps) * a)
            w_raw = math.exp(o - q)
            w = min(w_raw, cap)
            truncated += w_raw > cap
            weights.append(w)
            kl = math.exp(r - lp) - (r - lp) - 1
            terms.append(w * policy + beta * kl)
        rows.append(terms)
    tokens = sum(len(r) for r in rows)
    if loss_type == "grpo":
        expected = sum(sum(r) / len(r) for r in rows) / len(rows)
    else:
        expected = sum(sum(r) for r in rows) / tokens
    assert truncated >= 1, "the case truncates some token"
    assert out.loss.item() == pytest.approx(expected, abs=1e-6)
    assert out.metrics["tis/mean"] == pytest.approx(sum(weights) / tokens, abs=1e-6)
    assert out.metrics["tis/truncated"] == pytest.approx(truncated / tokens, abs=1e-6)


def test_padding_never_matters():
    logp, old, sampler, ref, mask, A = batch(seed=2)
    garbage = sampler.clone()
    garbage[~mask] = float("nan")
    a = grpo_loss(logp, old, A, mask, sampler_logp=sampler.masked_fill(~mask, 0.0), tis_cap=2.0)
    b = grpo_loss(logp, old, A, mask, sampler_logp=garbage, tis_cap=2.0)
    (ga,) = torch.autograd.grad(a.loss, logp)
    (gb,) = torch.autograd.grad(b.loss, logp)
    assert torch.equal(a.loss, b.loss) and torch.equal(ga, gb)


def test_bad_arguments_are_one_line_errors():
    logp, old, sampler, _, mask, A = batch()
    with pytest.raises(ValueError, match="tis_cap > 0 needs sampler_logp .* got None"):
        grpo_loss(logp, old, A, mask, tis_cap=2.0)
    with pytest.raises(ValueError, match="tis_cap must be 0 \\(off\\) or >= 1 .* got 0.5"):
        grpo_loss(logp, old, A, mask, sampler_logp=sampler, tis_cap=0.5)
    with pytest.raises(ValueError, match="sampler_logp must have logp's shape \\(4, 5\\), got \\(4, 4\\)"):
        grpo_loss(logp, old, A, mask, sampler_logp=sampler[:, :4], tis_cap=2.0)
    with pytest.raises(ValueError, match="'tis_cap' needs old_logprobs = 'recomputed'"):
        TrainConfig(tis_cap=2.0, old_logprobs="sampler")
    with pytest.raises(ValueError, match="'tis_cap' must be 0 \\(off\\) or >= 1"):
        TrainConfig(tis_cap=0.9)


# --------------------------------------------------------------------------- the expected gradient

V, SAMPLES, T_SAMPLER = 6, 200_000, 1.6


def mismatched_rollout():
    """One-token completions from a categorical policy pi = softmax(theta), drawn by a sampler at
    temperature 1.6; fixed advantages A(y) = r(y) - 0.3."""
    theta = torch.tensor([1.2, -0.4, 0.3, 2.0, -1.1, 0.6], dtype=torch.float64)
    advantage = torch.tensor([1.0, 0.0, 0.5, -0.5, 1.0, 0.2], dtype=torch.float64) - 0.3
    q = torch.softmax(theta / T_SAMPLER, 0)
    y = torch.multinomial(q, SAMPLES, replacement=True, generator=torch.Generator().manual_seed(0))
    return theta, advantage, q, y


def loss_gradient(theta, advantage, q, y, tis_cap):
    """The gradient of the GRPO loss (bnpo, S = 1, pi_old = the policy: ratio 1) over the samples,
    and each sample's own contribution (for the standard error)."""
    theta = theta.clone().requires_grad_()
    logp = torch.log_softmax(theta, 0)[y][:, None]
    out = grpo_loss(logp, logp.detach(), advantage[y], torch.ones(SAMPLES, 1, dtype=torch.bool),
                    loss_type="bnpo", sampler_logp=torch.log(q)[y][:, None], tis_cap=tis_cap)
    (gradient,) = torch.autograd.grad(out.loss, theta)
    pi = torch.softmax(theta.detach(), 0)
    w = torch.clamp(pi[y] / q[y], max=tis_cap) if tis_cap else torch.ones(SAMPLES, dtype=torch.float64)
    per_sample = -(w * advantage[y])[:, None] * (torch.nn.functional.one_hot(y, V) - pi)   # -w A grad log pi
    return gradient, per_sample


def test_the_correction_restores_the_expected_gradient():
    theta, advantage, q, y = mismatched_rollout()
    pi = torch.softmax(theta, 0)
    exact = -sum(pi[k] * advantage[k] * (torch.eye(V, dtype=torch.float64)[k] - pi) for k in range(V))
    errors = {}
    for label, cap in (("without", 0.0), ("with", 1e6)):
        gradient, per_sample = loss_gradient(theta, advantage, q, y, cap)
        assert torch.allclose(gradient, per_sample.mean(0), atol=1e-12)   # the loss's gradient, sample by sample
        standard_error = per_sample.std(0) / math.sqrt(SAMPLES)
        errors[label] = float(((gradient - exact).abs() / standard_error).max())
    # Measured: 0.45 standard errors with the correction, 103 without.
    assert errors["with"] < 5, errors
    assert errors["without"] > 50, errors


def test_the_gap_metric_sees_the_mismatched_sampler():
    theta, advantage, q, y = mismatched_rollout()
    logp = torch.log_softmax(theta, 0)[y][:, None]
    mask = torch.ones(SAMPLES, 1, dtype=torch.bool)
    seen = metrics.sampler_gap(logp, torch.log(q)[y][:, None], mask)
    same = metrics.sampler_gap(logp, torch.log_softmax(theta / 1.0, 0)[y][:, None], mask)
    assert seen["sampler_gap/mean_abs"] > 0.2 and seen["sampler_gap/max_ratio"] > 1.5
    assert same["sampler_gap/mean_abs"] == 0.0 and same["sampler_gap/max_ratio"] == 1.0


def test_a_finite_cap_truncates_and_reports_it():
    theta, advantage, q, y = mismatched_rollout()
    logp = torch.log_softmax(theta, 0)[y][:, None]
    out = grpo_loss(logp, logp.detach(), advantage[y], torch.ones(SAMPLES, 1, dtype=torch.bool), loss_type="bnpo",
                    sampler_logp=torch.log(q)[y][:, None], tis_cap=1.2)
    pi = torch.softmax(theta, 0)
    raw = pi[y] / q[y]
    assert out.metrics["tis/truncated"] == pytest.approx(float((raw > 1.2).double().mean()), abs=1e-12)
    assert out.metrics["tis/mean"] == pytest.approx(float(torch.clamp(raw, max=1.2).mean()), rel=1e-9)
    assert 0 < out.metrics["tis/truncated"] < 1


def test_the_trainer_weighs_by_the_samplers_log_probs(tmp_path, monkeypatch):
    """tis_cap in training: a sampler whose log-probs read 0.5 lower than the trainer's gives
    every token the weight exp(0.5) (below the cap 2), logged as tis/mean; tis_cap = 0 logs none."""
    from test_trainer import small_config
    real_roll_out = rollouts.roll_out

    def shifted(*args, **kwargs):
        rollout = real_roll_out(*args, **kwargs)
        rollout.sampler_logp = rollout.sampler_logp - 0.5 * rollout.completion_mask
        return rollout
    monkeypatch.setattr(rollouts, "roll_out", shifted)
    runs = {}
    for cap in (0.0, 2.0):
        config = small_config(tmp_path / str(cap), steps=1, tis_cap=cap, beta=0.0, checkpoint_every=0)
        runs[cap] = trainer.train(config, log=lambda _: None).history[0]
    assert "tis/mean" not in runs[0.0]
    assert runs[2.0]["tis/mean"] == pytest.approx(math.exp(0.5), rel=1e-5)
    assert runs[2.0]["tis/truncated"] == 0.0
    assert runs[2.0]["sampler_gap/mean_abs"] == pytest.approx(0.5, abs=1e-5)
