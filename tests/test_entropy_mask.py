"""Entropy masking (config key top_entropy_quantile) and the exact entropy (log_entropy): the
entropy of a token's distribution by hand, on every forward path; the threshold as NumPy's
quantile; the loss by hand (the policy term of a masked token is 0, its KL term and its place in
the normaliser stay); the mask the trainer uses recomputed independently from the weights; the
same update whatever the micro-batch size (where TRL's per-micro-batch quantile would differ);
its effect on the update; refusals and the TRL bridge. Equal to TRL's loss: tests/test_trl_parity.py;
2 processes equal 1: tests/test_distributed.py's dr_grpo runs."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import grid_checks
from grpo_edu.algorithm import entropy_mask
from grpo_edu.commands import trl_bridge
from grpo_edu.sampling import fused_llama
from grpo_edu.training import trainer, update
from grpo_edu.config import TrainConfig
from grpo_edu.algorithm.logprobs import completion_logprobs, token_entropies
from grpo_edu.algorithm.loss import grpo_loss
from test_trainer import _weights, count_digits, small_config, tiny

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- the entropy

def test_the_entropy_of_a_distribution_by_hand():
    logits = torch.tensor([[0.0, 0.0], [0.0, math.log(3.0)], [5.0, -math.inf]])
    expected = [math.log(2), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), 0.0]
    assert token_entropies(logits).tolist() == pytest.approx(expected, abs=1e-7)
    # At temperature 2 the distribution of [0, 2 ln 3] is that of [0, ln 3].
    assert token_entropies(torch.tensor([[0.0, 2 * math.log(3.0)]]), temperature=2.0).item() == pytest.approx(
        expected[1], abs=1e-7)


def test_chunks_and_bf16_change_nothing_but_rounding():
    logits = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(0)) * 3
    whole = token_entropies(logits)
    assert whole.shape == (3, 5)
    assert torch.equal(token_entropies(logits, chunk_elements=11), whole)   # one row per chunk
    exact = torch.distributions.Categorical(logits=logits.double()).entropy()
    torch.testing.assert_close(whole.double(), exact, rtol=0, atol=1e-6)
    half = token_entropies(logits.bfloat16())
    assert half.dtype == torch.float32
    torch.testing.assert_close(half.double(), torch.distributions.Categorical(
        logits=logits.bfloat16().double()).entropy(), rtol=0, atol=1e-5)


def test_the_entropy_is_trls():
    from trl.trainer.utils import entropy_from_logits
    logits = torch.randn(4, 6, 23, generator=torch.Generator().manual_seed(1)) * 2
    torch.testing.assert_close(token_entropies(logits), entropy_from_logits(logits), rtol=0, atol=1e-6)


def rows(seed=0, n=4, P=3, S=5):
    """Prompt-major rows of a tiny policy: groups of 2 sharing a prompt, right-padded completions."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 20, (n, P + S), generator=gen)
    ids[1::2, :P] = ids[0::2, :P]
    attention = torch.ones(n, P + S, dtype=torch.long)
    completion_mask = torch.ones(n, S, dtype=torch.long)
    completion_mask[1, 3:] = 0
    attention[1, P + 3:] = 0
    return ids, attention, completion_mask


@pytest.mark.parametrize("path", ["transformers", "chunked head", "fused"])
def test_every_forward_path_gives_the_entropies_of_the_sampled_distributions(path):
    policy, _ = tiny(seed=0)
    policy.eval()
    ids, attention, completion_mask = rows()
    S, T = completion_mask.shape[-1], 1.3
    with torch.no_grad():
        logits = policy(input_ids=ids, attention_mask=attention).logits[:, -S - 1:-1]
    exact = torch.distributions.Categorical(logits=logits.double() / T).entropy() * completion_mask
    with torch.no_grad():
        if path == "fused":
            got = fused_llama.completion_logprobs(policy, ids, attention, completion_mask, temperature=T,
                                                  group_size=2, entropy=True)
        else:
            got = completion_logprobs(policy, ids, attention, completion_mask, temperature=T, entropy=True,
                                      chunk_tokens=3 if path == "chunked head" else None)
    torch.testing.assert_close(got.double(), exact, rtol=0, atol=2e-5)
    assert (got[completion_mask == 0] == 0).all() and (got[completion_mask == 1] > 0).all()


# --------------------------------------------------------------------------- the threshold and the mask

def test_the_threshold_is_numpys_quantile_over_the_real_tokens_of_every_part():
    gen = torch.Generator().manual_seed(2)
    parts = [torch.rand(3, 6, generator=gen) * 2, torch.rand(5, 6, generator=gen) * 2]
    masks = [(torch.arange(6) < torch.randint(1, 7, (len(p), 1), generator=gen)).long() for p in parts]
    parts[0][masks[0] == 0] = 99.0   # padding must not count, whatever it holds
    real = np.concatenate([p[m.bool()].numpy() for p, m in zip(parts, masks)])
    for q in (0.2, 0.5, 0.8, 1.0):
        tau = entropy_mask.threshold(parts, masks, q)
        assert tau == pytest.approx(float(np.quantile(real.astype(np.float64), 1 - q)), abs=1e-6)
        kept = sum(int(entropy_mask.high_entropy_mask(p, m, tau).sum()) for p, m in zip(parts, masks))
        assert kept == int((real >= np.float32(tau)).sum())
        assert abs(kept - q * len(real)) <= 1 + 1e-9   # the top share, to a token
    assert entropy_mask.threshold([torch.zeros(0, 6)], [torch.zeros(0, 6)], 0.2) == math.inf   # nothing to rank


@pytest.mark.parametrize("value", [0, 1.5, -0.2, True])
def test_a_quantile_outside_0_1_is_refused(value):
    with pytest.raises(ValueError, match=r"top_entropy_quantile must be a number in \(0, 1\]"):
        entropy_mask.check_quantile(value)
    # the config's rule is the module's own check (one rule, checked once), naming the key; a bool is
    # refused before it, as the wrong type
    message = "must be a float, got True" if value is True else r"must be a number in \(0, 1\]"
    with pytest.raises(ValueError, match=rf"^config key 'top_entropy_quantile' {message}"):
        TrainConfig(top_entropy_quantile=value)


def test_the_metrics_over_completions():
    entropies = [torch.tensor([[1.0, 3.0, 0.0], [0.5, 0.5, 0.5]]), torch.tensor([[4.0, 9.0, 9.0]])]
    masks = [torch.tensor([[1, 1, 0], [1, 1, 1]]), torch.tensor([[1, 0, 0]])]
    kept = [entropy_mask.high_entropy_mask(h, m, 1.0) for h, m in zip(entropies, masks)]
    metrics = entropy_mask.entropy_metrics(entropies, masks, kept, 1.0)
    assert metrics == {"entropy/mean": pytest.approx((2.0 + 0.5 + 4.0) / 3), "entropy/min": 0.5,
                       "entropy/max": 4.0, "entropy/threshold": 1.0, "entropy/kept": 3 / 6}
    assert set(entropy_mask.entropy_metrics(entropies, masks, None, 0.0)) == {"entropy/mean", "entropy/min",
                                                                             "entropy/max"}


# --------------------------------------------------------------------------- the loss

def test_a_masked_token_keeps_its_kl_and_its_place_in_the_normaliser():
    """Two completions of 2 and 3 tokens, grpo (a token mean per completion), beta 0.1, by hand."""
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -1.5, -2.5]], requires_grad=True)
    old = torch.tensor([[-1.1, -1.9, 0.0], [-0.5, -1.2, -2.4]])
    ref = torch.tensor([[-1.3, -2.2, 0.0], [-0.7, -1.0, -2.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    A = torch.tensor([1.0, -1.0])
    keep = torch.tensor([[True, False, False], [False, True, True]])
    out = grpo_loss(logp, old, A, mask, ref_logp=ref, beta=0.1, entropy_mask=keep)
    by_hand = 0.0
    for i, length in enumerate((2, 3)):
        for t in range(length):
            ratio = math.exp(logp[i, t].item() - old[i, t].item())
            policy = -min(ratio * A[i].item(), min(max(ratio, 0.8), 1.2) * A[i].item())
            d = ref[i, t].item() - logp[i, t].item()
            by_hand += (policy * keep[i, t].item() + 0.1 * (math.exp(d) - d - 1)) / length / 2
    assert out.loss.item() == pytest.approx(by_hand, abs=1e-7)
    grad, = torch.autograd.grad(out.loss, logp)
    # A masked token is pushed by its KL term alone: d/dlogp of 0.1 (e^d - d - 1) / |o| / n.
    d = ref[0, 1] - logp[0, 1]
    assert grad[0, 1].item() == pytest.approx((0.1 * (-torch.exp(d) + 1) / 2 / 2).item(), abs=1e-7)
    without_kl, = torch.autograd.grad(grpo_loss(logp, old, A, mask, entropy_mask=keep).loss, logp)
    assert without_kl[0, 1] == 0.0 and without_kl[1, 0] == 0.0 and without_kl[0, 0] != 0.0


def test_keeping_every_token_is_the_loss_without_a_mask_bitwise():
    gen = torch.Generator().manual_seed(3)
    logp = -torch.rand(2, 4, 5, generator=gen) * 3
    mask = (torch.arange(5) < torch.randint(1, 6, (2, 4, 1), generator=gen)).long()
    A = torch.randn(2, 4, generator=gen)
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        options = dict(loss_type=loss_type, max_completion_length=5, ref_logp=logp - 0.1, beta=0.04)
        plain = grpo_loss(logp, logp - 0.05, A, mask, **options)
        every = grpo_loss(logp, logp - 0.05, A, mask, entropy_mask=mask.bool(), **options)
        assert torch.equal(plain.loss, every.loss), loss_type


def test_a_mask_of_another_shape_or_type_is_refused():
    logp = -torch.rand(2, 3)
    with pytest.raises(ValueError, match=r"entropy_mask must be a bool tensor of logp's shape \(2, 3\), got "
                                         r"torch.int64 of shape \(2, 3\)"):
        grpo_loss(logp, logp, torch.ones(2), torch.ones(2, 3), entropy_mask=torch.ones(2, 3, dtype=torch.long))


# --------------------------------------------------------------------------- in the trainer

def one_step(tmp_path, name, monkeypatch=None, **overrides):
    """One training step of the tiny policy; with monkeypatch, what each micro-batch's loss was given."""
    seen = []
    if monkeypatch is not None:
        original = update.micro_batch_loss

        def recording(settings, model, part, totals, entropy_mask=None):
            seen.append((part, entropy_mask))
            return original(settings, model, part, totals, entropy_mask)
        monkeypatch.setattr(update, "micro_batch_loss", recording)
    torch.manual_seed(0)
    policy, tokenizer = tiny(seed=0)
    config = small_config(tmp_path, output_dir=str(tmp_path / name), steps=1, eval_every=100, checkpoint_every=0,
                          learning_rate=1e-2, beta=0.0, **overrides)
    result = trainer.train(config, policy=policy, tokenizer=tokenizer, log=lambda _: None,
                           reward_functions={"digits": (count_digits, 1.0)})
    return result, seen


def test_the_mask_the_trainer_uses_is_the_top_quantile_of_the_policys_entropies(tmp_path, monkeypatch):
    """Recomputed independently: transformers' forward of the starting weights, the exact entropy
    of each token's distribution, NumPy's quantile over the step's real tokens."""
    q = 0.25
    result, seen = one_step(tmp_path, "q", monkeypatch, top_entropy_quantile=q, micro_batch_size=4)
    assert len(seen) == 4   # 16 completions, 4 per micro-batch: the threshold spans all four
    policy, _ = tiny(seed=0)
    policy.eval()
    entropies, masks, used = [], [], []
    for part, chosen in seen:
        S = part.completion_mask.shape[-1]
        with torch.no_grad():
            logits = policy(input_ids=part.input_ids, attention_mask=part.attention_mask).logits[:, -S - 1:-1]
        entropies.append(torch.distributions.Categorical(logits=logits.double()).entropy())
        masks.append(part.completion_mask.bool())
        used.append(chosen)
    real = torch.cat([h[m] for h, m in zip(entropies, masks)]).numpy()
    tau = float(np.quantile(real, 1 - q))
    assert result.history[0]["entropy/threshold"] == pytest.approx(tau, abs=1e-5)
    for h, m, chosen in zip(entropies, masks, used):
        clear = (h - tau).abs() > 1e-5   # a token within rounding of the threshold may go either way
        assert torch.equal(chosen[clear], ((h >= tau) & m)[clear])
    kept = sum(int(c.sum()) for c in used)
    assert result.history[0]["entropy/kept"] == kept / len(real)
    assert 0 < kept < len(real)


def test_the_micro_batch_size_does_not_change_the_update(tmp_path, monkeypatch):
    """One micro-batch or four: the same threshold, the same tokens, the same weights. TRL's
    quantile per micro-batch would have trained other tokens in the second run."""
    whole, _ = one_step(tmp_path, "whole", top_entropy_quantile=0.25, micro_batch_size=16)
    parts, seen = one_step(tmp_path, "parts", monkeypatch, top_entropy_quantile=0.25, micro_batch_size=4)
    assert whole.history[0]["entropy/threshold"] == pytest.approx(parts.history[0]["entropy/threshold"], abs=1e-6)
    for (name, a), b in zip(_weights(whole.policy).items(), _weights(parts.policy).values()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
    # The way that depends on micro_batch_size: each micro-batch's own quantile.
    policy, _ = tiny(seed=0)
    per_part = []
    for part, _ in seen:
        S = part.completion_mask.shape[-1]
        with torch.no_grad():
            logits = policy(input_ids=part.input_ids, attention_mask=part.attention_mask).logits[:, -S - 1:-1]
        h = token_entropies(logits)
        tau = entropy_mask.threshold([h], [part.completion_mask], 0.25)
        per_part.append(entropy_mask.high_entropy_mask(h, part.completion_mask, tau))
    assert any(not torch.equal(mine, chosen) for mine, (_, chosen) in zip(per_part, seen))


def test_the_quantile_changes_the_update_and_logging_the_entropy_changes_nothing(tmp_path):
    plain, _ = one_step(tmp_path, "plain")
    logged, _ = one_step(tmp_path, "logged", log_entropy=True)
    masked, _ = one_step(tmp_path, "masked", top_entropy_quantile=0.25)
    assert all(torch.equal(a, b) for a, b in zip(_weights(plain.policy).values(), _weights(logged.policy).values()))
    assert not any(key.startswith("entropy/") for key in plain.history[0])
    assert {"entropy/mean", "entropy/min", "entropy/max"} <= set(logged.history[0])
    assert "entropy/threshold" not in logged.history[0]
    assert {key: value for key, value in logged.history[0].items() if not key.startswith(("entropy/", "time/"))} \
        == {key: value for key, value in plain.history[0].items() if not key.startswith("time/")}
    assert logged.history[0]["entropy/min"] <= logged.history[0]["entropy/mean"] <= logged.history[0]["entropy/max"]
    moved = [not torch.equal(a, b) for a, b in zip(_weights(plain.policy).values(), _weights(masked.policy).values())]
    assert any(moved)
    assert masked.history[0]["grad_norm"] < plain.history[0]["grad_norm"]   # fewer tokens push
    assert masked.history[0]["entropy/kept"] == pytest.approx(0.25, abs=0.05)


def test_the_trl_bridge_carries_the_quantile_and_refuses_it_across_micro_batches():
    ready = dict(advantage_std="sample", top_entropy_quantile=0.2)
    args = trl_bridge.grpo_config(TrainConfig(**ready), "unused")
    assert args.top_entropy_quantile == 0.2
    with pytest.raises(ValueError, match="config key 'top_entropy_quantile' cannot be carried over to TRL: "
                                         "top_entropy_quantile = 0.2 with 2 micro-batches per optimizer step: TRL "
                                         "takes the entropy quantile per micro-batch"):
        trl_bridge.grpo_config(TrainConfig(**ready, micro_batch_size=64), "unused")
    assert trl_bridge.grpo_config(TrainConfig(advantage_std="sample", micro_batch_size=64),
                                  "unused").top_entropy_quantile == 1.0


# --------------------------------------------------------------------------- benchmarks/entropy.py

RESULTS = ROOT / "benchmarks" / "results" / "entropy.json"
sys.path.insert(0, str(ROOT / "benchmarks"))
import entropy as benchmark  # noqa: E402


def test_the_results_file_holds_every_variant_and_seed():
    for run_ in grid_checks.every_variant_and_seed(RESULTS, benchmark, eval_every=25):
        q = benchmark.VARIANTS[run_["variant"]]["top_entropy_quantile"]
        kept = run_["steps"]["entropy/kept"]
        if q == 1:
            assert set(kept) == {None} and set(run_["steps"]["entropy/threshold"]) == {None}
        else:
            assert all(abs(value - q) < 0.05 for value in kept), run_["variant"]
        assert all(value > 0 for value in run_["steps"]["entropy/mean"])


@grid_checks.PINNED
def test_the_results_file_is_what_the_trainer_computes():
    """Re-train top20, seed 0, and its beta = 0 arm for 4 steps under the pin."""
    grid_checks.reproduces("entropy.py", RESULTS, "top20:0", 4)
    grid_checks.reproduces("entropy.py", RESULTS, "top20-beta0:0", 4)


def test_a_changed_threshold_is_caught():
    grid_checks.catches_a_change(RESULTS, benchmark, "top20", 0, 4, "entropy/threshold", lambda value: value * 1.0001)


def test_the_training_doc_quotes_the_results_file():
    grid_checks.training_doc_quotes_final_accuracies(RESULTS, benchmark)
