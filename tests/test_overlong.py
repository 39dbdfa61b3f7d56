"""DAPO's overlong handling: overlong filtering (config key mask_truncated_completions: the
truncated completions' tokens leave the loss, their rewards stay in the advantages) and the soft
overlong punishment (overlong_cache: a reward term near the limit). By hand, what the trainer
does with them, TRL's reward function to the bit and the TRL bridge. Equal to TRL's loss with
mask_truncated_completions: tests/test_trl_parity.py; 2 processes equal 1: tests/test_distributed.py's
dapo runs."""

import math
import sys
from pathlib import Path

import pytest
import torch

import grid_checks
from grpo_edu.commands import trl_bridge
from grpo_edu.training import trainer, update
from grpo_edu.config import TrainConfig
from grpo_edu.algorithm.loss import grpo_loss
from grpo_edu.environment.rewards import soft_overlong_punishment
from grpo_edu.policy.models import load_policy, policy_source
from test_trainer import _weights, small_config

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- the loss

def batch():
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -1.5, -2.5], [-0.3, -0.2, -0.1]], requires_grad=True)
    old = torch.tensor([[-1.1, -1.9, 0.0], [-0.5, -1.2, -2.4], [-0.3, -0.4, 0.0]])
    ref = torch.tensor([[-1.3, -2.2, 0.0], [-0.7, -1.0, -2.0], [-0.1, -0.2, -0.3]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1]])
    return logp, old, ref, mask, torch.tensor([1.0, -1.0, 0.5])


def by_hand(logp, old, ref, mask, A, kept, loss_type):
    """The loss over the kept completions only, dividing as loss_type says: grpo by all n = 3
    completions (the excluded one counts), bnpo by the kept tokens."""
    total, tokens = 0.0, sum(int(mask[i].sum()) for i in kept)
    for i in kept:
        length = int(mask[i].sum())
        for t in range(length):
            ratio = math.exp(logp[i, t].item() - old[i, t].item())
            policy = -min(ratio * A[i].item(), min(max(ratio, 0.8), 1.2) * A[i].item())
            d = ref[i, t].item() - logp[i, t].item()
            term = policy + 0.1 * (math.exp(d) - d - 1)
            total += term / length / 3 if loss_type == "grpo" else term / tokens
    return total


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo"])
def test_an_excluded_completion_counts_nowhere_but_in_grpos_n(loss_type):
    logp, old, ref, mask, A = batch()
    excluded = torch.tensor([False, True, False])
    out = grpo_loss(logp, old, A, mask, ref_logp=ref, beta=0.1, loss_type=loss_type, excluded=excluded)
    assert out.loss.item() == pytest.approx(by_hand(logp, old, ref, mask, A, [0, 2], loss_type), abs=1e-7)
    grad, = torch.autograd.grad(out.loss, logp)
    assert (grad[1] == 0).all() and (grad[0, :2] != 0).all()   # neither its policy term nor its KL


def test_nothing_excluded_is_the_loss_without_the_argument_bitwise():
    logp, old, ref, mask, A = batch()
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        options = dict(ref_logp=ref, beta=0.1, loss_type=loss_type, max_completion_length=3)
        assert torch.equal(grpo_loss(logp, old, A, mask, **options).loss,
                           grpo_loss(logp, old, A, mask, excluded=torch.zeros(3, dtype=torch.bool), **options).loss)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_every_completion_excluded_gives_a_zero_loss_and_no_nan(level):
    logp, old, ref, mask, A = batch()
    for loss_type in ("grpo", "bnpo"):
        out = grpo_loss(logp, old, A, mask, ref_logp=ref, beta=0.1, loss_type=loss_type,
                        importance_sampling_level=level, excluded=torch.ones(3, dtype=torch.bool))
        grad, = torch.autograd.grad(out.loss, logp)
        assert out.loss.item() == 0.0 and (grad == 0).all() and all(math.isfinite(v) for v in out.metrics.values())


def test_excluded_of_another_shape_is_refused():
    logp, old, ref, mask, A = batch()
    with pytest.raises(ValueError, match=r"excluded must be a bool tensor of the advantages' shape \(3,\), got "
                                         r"torch.bool of shape \(2,\)"):
        grpo_loss(logp, old, A, mask, excluded=torch.zeros(2, dtype=torch.bool))


# --------------------------------------------------------------------------- the punishment

def test_the_punishment_by_hand_and_trls_to_the_bit():
    from trl.rewards import get_soft_overlong_punishment
    lengths = torch.arange(0, 11)
    ours = soft_overlong_punishment(lengths, 10, 4)
    assert ours.tolist() == [0.0] * 7 + [-0.25, -0.5, -0.75, -1.0]
    theirs = get_soft_overlong_punishment(10, 4)([[1] * int(n) for n in lengths])
    assert ours.tolist() == theirs
    assert soft_overlong_punishment(torch.tensor([12]), 10, 4).item() == -1.0   # past the limit: TRL's -1 too


@pytest.mark.parametrize("overrides, message", [
    ({"overlong_cache": 16}, "config key 'overlong_cache' must be an int in [0, max_completion_length = 16)"),
    ({"overlong_cache": -1}, "config key 'overlong_cache' must be an int in [0, max_completion_length = 16)"),
    ({"overlong_cache": 9, "max_completion_length": 9}, "must be an int in [0, max_completion_length = 9) (the stretch"),
])
def test_a_cache_outside_the_limit_is_refused(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        TrainConfig(**overrides)


# --------------------------------------------------------------------------- in the trainer

def one_step(tmp_path, name, monkeypatch=None, **overrides):
    """One step of the committed starting policy at a 9-token limit, which cuts the EOS of a
    three-digit answer: some completions truncated, most not."""
    seen = []
    if monkeypatch is not None:
        original = update.micro_batch_loss

        def recording(settings, model, part, totals, entropy_mask=None):
            seen.append((part, totals))
            return original(settings, model, part, totals, entropy_mask)
        monkeypatch.setattr(update, "micro_batch_loss", recording)
    config = small_config(tmp_path, output_dir=str(tmp_path / name), steps=1, eval_every=100, checkpoint_every=0,
                          num_generations=8, **{"max_completion_length": 9, **overrides})
    return trainer.train(config, log=lambda _: None), seen


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_the_trainer_leaves_the_truncated_completions_out(tmp_path, monkeypatch, loss_type):
    """The excluded rows are the completions without an EOS; dapo's token count drops their tokens."""
    result, seen = one_step(tmp_path, "filter", monkeypatch, mask_truncated_completions=True, loss_type=loss_type,
                            micro_batch_size=8)
    eos = load_policy(policy_source("start"))[1].eos_token_id
    parts = [part for part, _ in seen]
    truncated = torch.cat([part.truncated for part in parts])
    has_eos = torch.cat([((part.input_ids[:, -part.completion_mask.shape[-1]:] == eos)
                          & part.completion_mask.bool()).any(-1) for part in parts])
    assert torch.equal(truncated, ~has_eos)
    assert 0 < int(truncated.sum()) < len(truncated)
    assert result.history[0]["truncated"] == pytest.approx(truncated.double().mean().item())
    loss_tokens = sum(int(part.loss_mask.sum()) for part in parts)
    assert loss_tokens == sum(int(part.completion_mask[~part.truncated].sum()) for part in parts)
    totals = seen[0][1]
    if loss_type == "dapo":
        assert totals.num_items == loss_tokens
    assert totals.num_completions == 32   # grpo's n: every completion
    plain, _ = one_step(tmp_path, "plain", loss_type=loss_type, micro_batch_size=8)
    assert any(not torch.equal(a, b) for a, b in zip(_weights(plain.policy).values(), _weights(result.policy).values()))
    assert plain.history[0]["reward/mean"] == result.history[0]["reward/mean"]   # rewards and advantages unchanged


def test_a_rollout_with_nothing_finished_takes_no_step(tmp_path):
    result, _ = one_step(tmp_path, "none", mask_truncated_completions=True, max_completion_length=4)
    assert result.history[0]["truncated"] == 1.0
    assert result.history[0]["optimizer_steps"] == 0.0 and result.history[0]["skipped_update"] == 1.0
    start, _ = load_policy(policy_source("start"))
    assert all(torch.equal(a, b) for a, b in zip(_weights(start).values(), _weights(result.policy).values()))


def test_the_punishment_is_one_more_reward_term(tmp_path):
    plain, _ = one_step(tmp_path, "plain")
    soft, _ = one_step(tmp_path, "soft", overlong_cache=3)
    first, punished = plain.history[0], soft.history[0]
    assert "reward/overlong" not in first
    assert -1.0 <= punished["reward/overlong"] < 0.0
    # The first rollout is the same: the reward moved by the term's mean, and only by it.
    assert punished["reward/accuracy"] == first["reward/accuracy"]
    assert punished["reward/mean"] == pytest.approx(first["reward/mean"] + punished["reward/overlong"], abs=1e-12)
    assert any(not torch.equal(a, b) for a, b in zip(_weights(plain.policy).values(), _weights(soft.policy).values()))


def test_the_trl_bridge_carries_both():
    config = TrainConfig(advantage_std="sample", mask_truncated_completions=True, overlong_cache=4)
    assert trl_bridge.grpo_config(config, "unused").mask_truncated_completions is True
    functions, weights = trl_bridge.reward_functions(config)
    assert weights[-1] == 1.0
    ids = [[5] * n for n in (3, 12, 14, 16)]
    assert functions[-1](["x"] * 4, completion_ids=ids) == soft_overlong_punishment(
        torch.tensor([3, 12, 14, 16]), 16, 4).tolist() == [0.0, 0.0, -0.5, -1.0]
    assert len(trl_bridge.reward_functions(TrainConfig())[0]) == len(functions) - 1


# --------------------------------------------------------------------------- benchmarks/overlong.py

RESULTS = ROOT / "benchmarks" / "results" / "overlong.json"
sys.path.insert(0, str(ROOT / "benchmarks"))
import overlong as benchmark  # noqa: E402


def test_the_results_file_holds_every_variant_and_seed():
    for run_ in grid_checks.every_variant_and_seed(RESULTS, benchmark, eval_every=25):
        overlong = run_["steps"]["reward/overlong"]
        assert (set(overlong) == {None}) == (not run_["variant"].startswith("soft"))
        if run_["variant"].endswith("-13"):   # DAPO's slack: the limit truncates rarely
            assert benchmark.VARIANTS[run_["variant"]]["max_completion_length"] == 13
            assert max(run_["steps"]["truncated"][-25:]) < 0.05
        else:
            assert run_["steps"]["truncated"][0] > 0.1   # the limit truncates often
    assert grid_checks.results(RESULTS)["settings"]["max_completion_length"] == 9


@grid_checks.PINNED
def test_the_results_file_is_what_the_trainer_computes():
    """Re-train filter, seed 0, and soft-13, seed 0, for 4 steps under the pin."""
    grid_checks.reproduces("overlong.py", RESULTS, "filter:0", 4)
    grid_checks.reproduces("overlong.py", RESULTS, "soft-13:0", 4)


def test_a_changed_truncation_share_is_caught():
    grid_checks.catches_a_change(RESULTS, benchmark, "filter", 0, 4, "truncated", lambda value: value + 1 / 128)


def test_the_training_doc_quotes_the_results_file():
    grid_checks.training_doc_quotes_final_accuracies(RESULTS, benchmark)
