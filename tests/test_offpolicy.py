"""The corrections for stale or mismatched samples (grpo_edu.algorithm.offpolicy; config keys is_mask,
is_mask_band, ratio_cap, old_logprobs = 'proximal'): each by hand in plain floats, what it
changes in training, and its one-line errors. TRL parity: tests/test_trl_parity.py."""

import math

import pytest
import torch

from grpo_edu.commands import trl_bridge
from grpo_edu.config import TrainConfig
from grpo_edu.algorithm.aggregation import LOSS_TYPES
from grpo_edu.algorithm.loss import grpo_loss
from grpo_edu.algorithm.offpolicy import Correction, correction_weights
from test_lagging import run, without_time


def batch(seed=0, N=4, S=5, spread=0.6):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(N, S, generator=g, dtype=torch.float64) * 2).requires_grad_()
    old = (logp.detach() + 0.1 * torch.randn(N, S, generator=g, dtype=torch.float64)).clamp(max=-0.01)
    sampler = (old + spread * torch.randn(N, S, generator=g, dtype=torch.float64)).clamp(max=-0.01)
    ref = (logp.detach() + 0.2 * torch.randn(N, S, generator=g, dtype=torch.float64)).clamp(max=-0.01)
    mask = torch.ones(N, S, dtype=torch.bool)
    mask[1, 3:] = False
    mask[3, 2:] = False
    advantages = torch.randn(N, generator=g, dtype=torch.float64)
    return logp, old, sampler, ref, mask, advantages


def by_hand(logp, old, sampler, ref, mask, A, *, weight, loss_type, beta=0.04, eps=0.2, cap=0.0):
    """The loss in plain floats: weight(i, t, r) -> w, on the policy term only."""
    rows = []
    for i in range(mask.shape[0]):
        terms = []
        for t in range(mask.shape[1]):
            if not mask[i, t]:
                continue
            lp, o, q, rf = (float(x[i, t]) for x in (logp.detach(), old, sampler, ref))
            a, rho = float(A[i]), math.exp(lp - o)
            if cap:
                policy = -min(rho, cap) * a * lp
            else:
                policy = -min(rho * a, min(max(rho, 1 - eps), 1 + eps) * a)
            kl = math.exp(rf - lp) - (rf - lp) - 1
            terms.append(weight(i, t, math.exp(o - q)) * policy + beta * kl)
        rows.append(terms)
    if loss_type == "grpo":
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    return sum(sum(r) for r in rows) / sum(len(r) for r in rows)   # dapo / bnpo over this batch


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_token_mask_by_hand(loss_type):
    """w = r inside the band, 0 outside; masked tokens still count in the normaliser."""
    logp, old, sampler, ref, mask, A = batch()
    band = (0.7, 1.4)
    out = grpo_loss(logp, old, A, mask, ref_logp=ref, beta=0.04, loss_type=loss_type, sampler_logp=sampler,
                    is_mask="token", is_mask_band=band)
    ratios = [math.exp(float(old[i, t] - sampler[i, t])) for i, t in mask.nonzero().tolist()]
    outside = sum(not band[0] <= r <= band[1] for r in ratios)
    assert 0 < outside < len(ratios), "the case masks some tokens and keeps others"
    expected = by_hand(logp, old, sampler, ref, mask, A, loss_type=loss_type,
                       weight=lambda i, t, r: r if band[0] <= r <= band[1] else 0.0)
    assert out.loss.item() == pytest.approx(expected, abs=1e-12)
    assert out.metrics["is/masked"] == pytest.approx(outside / len(ratios), abs=1e-12)
    assert out.metrics["is_ratio/min"] == pytest.approx(min(ratios), rel=1e-12)
    assert out.metrics["is_ratio/max"] == pytest.approx(max(ratios), rel=1e-12)
    assert out.metrics["is_ratio/mean"] == pytest.approx(sum(ratios) / len(ratios), rel=1e-12)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_sequence_mask_by_hand(loss_type):
    """A response is kept whole (w = 1) when the geometric mean of its ratios is in the band,
    dropped whole (w = 0) when not."""
    logp, old, sampler, ref, mask, A = batch(seed=3, spread=0.5)
    band = (0.8, 1.25)
    kept = {}
    for i in range(mask.shape[0]):
        logs = [float(old[i, t] - sampler[i, t]) for t in range(mask.shape[1]) if mask[i, t]]
        kept[i] = band[0] <= math.exp(sum(logs) / len(logs)) <= band[1]
    assert 0 < sum(kept.values()) < len(kept), f"the case keeps some responses and drops others: {kept}"
    out = grpo_loss(logp, old, A, mask, ref_logp=ref, beta=0.04, loss_type=loss_type, sampler_logp=sampler,
                    is_mask="sequence", is_mask_band=band)
    expected = by_hand(logp, old, sampler, ref, mask, A, loss_type=loss_type,
                       weight=lambda i, t, r: 1.0 if kept[i] else 0.0)
    assert out.loss.item() == pytest.approx(expected, abs=1e-12)
    dropped_tokens = sum(int(mask[i].sum()) for i in kept if not kept[i])
    assert out.metrics["is/masked"] == pytest.approx(dropped_tokens / int(mask.sum()), abs=1e-12)


def test_a_masked_token_gets_no_policy_gradient_and_the_others_theirs():
    logp, old, sampler, ref, mask, A = batch()
    band = (0.7, 1.4)
    out = grpo_loss(logp, old, A, mask, sampler_logp=sampler, is_mask="token", is_mask_band=band, loss_type="bnpo")
    (grad,) = torch.autograd.grad(out.loss, logp)
    plain = grpo_loss(logp, old, A, mask, loss_type="bnpo")
    (plain_grad,) = torch.autograd.grad(plain.loss, logp)
    r = torch.exp(old - sampler)
    inside = mask & (r >= band[0]) & (r <= band[1])
    assert torch.equal(grad[mask & ~inside], torch.zeros_like(grad[mask & ~inside]))
    torch.testing.assert_close(grad[inside], (plain_grad * r)[inside], rtol=1e-12, atol=0)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_off_is_bitwise_the_loss_without_it(loss_type):
    logp, old, sampler, ref, mask, A = batch()
    options = dict(ref_logp=ref, beta=0.04, loss_type=loss_type, max_completion_length=5)
    plain = grpo_loss(logp, old, A, mask, **options)
    off = grpo_loss(logp, old, A, mask, sampler_logp=sampler, is_mask="none", is_mask_band=(0.9, 1.1),
                    ratio_cap=0.0, **options)
    (g1,) = torch.autograd.grad(plain.loss, logp)
    (g2,) = torch.autograd.grad(off.loss, logp)
    assert torch.equal(plain.loss, off.loss) and torch.equal(g1, g2) and off.metrics == plain.metrics


def test_the_band_decides_what_is_masked():
    """is_mask_band's effect: a wider band masks fewer tokens, and one wide enough masks none
    (then the loss is plain importance sampling, w = r)."""
    logp, old, sampler, ref, mask, A = batch()
    shares = [grpo_loss(logp, old, A, mask, sampler_logp=sampler, is_mask="token", is_mask_band=band)
              .metrics["is/masked"] for band in ((0.9, 1.1), (0.7, 1.4), (0.01, 100.0))]
    assert shares[0] > shares[1] > shares[2] == 0.0


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_the_capped_surrogate_by_hand(loss_type):
    logp, old, sampler, ref, mask, A = batch(seed=5)
    old = (logp.detach() + 0.5 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(9),
                                             dtype=torch.float64)).clamp(max=-0.01)
    cap = 1.3
    out = grpo_loss(logp, old, A, mask, ref_logp=ref, beta=0.04, loss_type=loss_type, surrogate="capped", ratio_cap=cap)
    expected = by_hand(logp, old, sampler, ref, mask, A, loss_type=loss_type, cap=cap, weight=lambda i, t, r: 1.0)
    assert out.loss.item() == pytest.approx(expected, abs=1e-12)
    rho = torch.exp(logp.detach() - old)[mask]
    assert out.metrics["ratio/capped"] == pytest.approx(float((rho > cap).double().mean()), abs=1e-12)
    assert 0 < out.metrics["ratio/capped"] < 1
    assert "clip_ratio/region" not in out.metrics


def test_the_capped_surrogate_keeps_the_gradient_the_clip_removes():
    """On-policy (ratio 1) the two surrogates have the same gradient. A token whose ratio is past
    the clip with a positive advantage gets none from the clip, and min(ratio, cap) x A x grad log pi
    from the cap."""
    logp, _, _, _, mask, A = batch()
    on = {name: torch.autograd.grad(grpo_loss(logp, logp.detach(), A, mask, surrogate=name, **options).loss, logp)[0]
          for name, options in (("clip", {}), ("capped", {"ratio_cap": 2.0}))}
    torch.testing.assert_close(on["clip"], on["capped"], rtol=1e-12, atol=1e-15)
    A = torch.ones(4, dtype=torch.float64)
    old = logp.detach() - 0.5   # every ratio e^0.5 = 1.65, past the clip's 1.2
    clipped = torch.autograd.grad(grpo_loss(logp, old, A, mask, loss_type="bnpo").loss, logp)[0]
    capped = torch.autograd.grad(grpo_loss(logp, old, A, mask, loss_type="bnpo", surrogate="capped",
                                           ratio_cap=1.5).loss, logp)[0]
    far = mask   # every ratio is e^0.5
    assert torch.equal(clipped[far], torch.zeros_like(clipped[far]))
    torch.testing.assert_close(capped[far], torch.full_like(capped[far], -1.5 / float(mask.sum())), rtol=1e-12,
                               atol=0)


def test_correction_weights_are_one_on_padding_and_carry_no_gradient():
    logp, old, sampler, _, mask, _ = batch()
    for correction in (Correction(tis_cap=2.0), Correction(is_mask="token"), Correction(is_mask="sequence")):
        w, _ = correction_weights(logp, sampler, mask, correction)
        assert not w.requires_grad and torch.equal(w[~mask], torch.ones_like(w[~mask]))


@pytest.mark.parametrize("overrides, message", [
    ({"is_mask": "tokens"}, "config key 'is_mask' must be one of ('none', 'token', 'sequence'), got 'tokens'"),
    ({"is_mask_band": [1.0, 2.0]}, "config key 'is_mask_band' must be [low, high] with 0 <= low < 1 < high"),
    ({"is_mask_band": [0.5]}, "config key 'is_mask_band' must be [low, high]"),
    ({"is_mask": "token", "tis_cap": 2.0}, "config key 'tis_cap' (2.0) and config key 'is_mask' ('token') are two "
                                           "corrections"),
    ({"is_mask": "sequence", "old_logprobs": "sampler"},
     "config key 'is_mask' ('sequence') needs old_logprobs = 'recomputed' or 'proximal'"),
    ({"tis_cap": 2.0, "old_logprobs": "sampler"}, "config key 'tis_cap' needs old_logprobs = 'recomputed' or"),
    ({"ratio_cap": 1.0}, "config key 'ratio_cap' must be 0 (unused: the clipped surrogate) or a finite number > 1 (the "
                         "capped surrogate's largest weight), got 1.0"),
    ({"ratio_cap": math.inf}, "config key 'ratio_cap' must be 0"),
    ({"old_logprobs": "current"}, "config key 'old_logprobs' must be one of ('recomputed', 'sampler', 'proximal')"),
])
def test_bad_settings_are_one_line_naming_the_keys(overrides, message):
    with pytest.raises(ValueError) as error:
        TrainConfig(**overrides)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


@pytest.mark.parametrize("kwargs, message", [
    ({"is_mask": "token"}, "is_mask = 'token' needs sampler_logp"),
    ({"is_mask": "token", "tis_cap": 2.0, "sampler_logp": True}, "tis_cap (2.0) and is_mask ('token')"),
    ({"ratio_cap": 0.5}, "ratio_cap must be 0 (unused: the clipped surrogate) or a finite number > 1 (the capped"),
    ({"ratio_cap": 2.0}, "ratio_cap = 2.0 is the capped surrogate's largest weight, but surrogate = 'clip' has no cap"),
    ({"surrogate": "capped"}, "surrogate = 'capped' needs ratio_cap"),
    ({"is_mask": "token", "is_mask_band": (0.5, 0.9), "sampler_logp": True}, "is_mask_band must be [low, high]"),
])
def test_grpo_loss_refuses_in_one_line(kwargs, message):
    logp, old, sampler, _, mask, A = batch()
    if kwargs.get("sampler_logp") is True:
        kwargs["sampler_logp"] = sampler
    with pytest.raises(ValueError) as error:
        grpo_loss(logp, old, A, mask, **kwargs)
    assert message in str(error.value) and "\n" not in str(error.value)


# --------------------------------------------------------------------------- in training

def test_proximal_without_lag_is_recomputed_bitwise(tmp_path):
    a = run(tmp_path, "recomputed", steps=3)
    b = run(tmp_path, "proximal", steps=3, old_logprobs="proximal")
    assert without_time(a.history) == without_time(b.history)


def test_under_lag_proximal_moves_the_staleness_from_the_ratio_to_the_sampler_gap(tmp_path):
    """'recomputed' (the policy that sampled): the ratio sees the staleness, the sampler gap is
    rounding. 'proximal' (the policy at the update): the ratio is exactly 1, and the gap between
    pi_old and the sampler is the staleness, which is what tis_cap and is_mask then correct."""
    behaviour = run(tmp_path, "behaviour", rollout_lag=2)
    proximal = run(tmp_path, "proximal", rollout_lag=2, old_logprobs="proximal")
    for b, p in zip(behaviour.history[1:], proximal.history[1:]):
        assert b["ratio/min"] < 1.0 or b["ratio/max"] > 1.0
        assert p["ratio/min"] == p["ratio/max"] == 1.0
        assert b["sampler_gap/mean_abs"] < 1e-5 < p["sampler_gap/mean_abs"]
    assert without_time(behaviour.history[:1]) == without_time(proximal.history[:1])   # staleness 0: the same


def test_a_token_mask_under_lag_masks_and_logs_it(tmp_path):
    """A narrow band masks some stale tokens (logged), and so trains another policy than the run
    without the mask; the share masked grows with the band's narrowness."""
    plain = run(tmp_path, "plain", rollout_lag=2, old_logprobs="proximal")
    wide = run(tmp_path, "wide", rollout_lag=2, old_logprobs="proximal", is_mask="token", is_mask_band=[0.5, 2.0])
    narrow = run(tmp_path, "narrow", rollout_lag=2, old_logprobs="proximal", is_mask="token",
                 is_mask_band=[0.95, 1.05])
    assert "is/masked" not in plain.history[-1]
    masked = [sum(m["is/masked"] for m in r.history) for r in (wide, narrow)]
    assert masked[0] < masked[1] and masked[1] > 0
    assert narrow.history[0]["is/masked"] == 0.0   # the first update: no staleness, r = 1 (rounding)
    assert plain.history[-1]["loss"] != narrow.history[-1]["loss"]


def test_the_capped_surrogate_in_training(tmp_path):
    clipped = run(tmp_path, "clipped", rollout_lag=2)
    capped = run(tmp_path, "capped", rollout_lag=2, surrogate="capped", ratio_cap=1.2)
    assert "ratio/capped" in capped.history[-1] and "clip_ratio/region" not in capped.history[-1]
    assert max(m["ratio/capped"] for m in capped.history) > 0
    assert clipped.history[-1]["loss"] != capped.history[-1]["loss"]


# --------------------------------------------------------------------------- the TRL bridge

TRL_READY = {"advantage_std": "sample"}   # TRL's advantage convention, so that only the key under test decides

def test_the_bridge_maps_the_token_mask_and_the_cap():
    pytest.importorskip("trl")
    masked = trl_bridge.grpo_config(TrainConfig(engine="vllm", is_mask="token", is_mask_band=[0.4, 3.0], **TRL_READY))
    assert masked.vllm_importance_sampling_correction and masked.vllm_importance_sampling_mode == "token_mask"
    assert (masked.vllm_importance_sampling_clip_min, masked.vllm_importance_sampling_clip_max) == (0.4, 3.0)
    capped = trl_bridge.grpo_config(TrainConfig(loss_type="dapo", surrogate="capped", ratio_cap=4.0, **TRL_READY))
    assert capped.loss_type == "cispo" and capped.epsilon_high == 4.0
    proximal = trl_bridge.grpo_config(TrainConfig(old_logprobs="proximal", **TRL_READY))
    assert proximal.loss_type == "grpo"


@pytest.mark.parametrize("overrides, message", [
    ({"engine": "vllm", "is_mask": "sequence"}, "is_mask = 'sequence': TRL's sequence_mask takes the product"),
    ({"is_mask": "token"}, "is_mask = 'token' with engine = 'fused'"),
    ({"surrogate": "capped", "ratio_cap": 4.0}, "surrogate = 'capped' with loss_type = 'grpo'"),
    ({"old_logprobs": "sampler"}, "old_logprobs = 'sampler'"),
])
def test_the_bridge_refuses_what_trl_cannot_do(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", "\\(").replace(")", "\\)")):
        trl_bridge.grpo_config(TrainConfig(**overrides, **TRL_READY))
