"""The reference's updates (config keys ref_sync_steps, ref_mixup_alpha): frozen, a hard copy of
the policy every K steps, or Polyak averaging toward it, ref = alpha x policy + (1 - alpha) x ref
(TRL's ref_model_mixup_alpha). Hand-computed, equal to TRL's callback to the bit, its effect on
the KL the trainer computes, resumed bitwise, and refused where it would do nothing. (Under
FSDP2 the average runs on each rank's shards: tests/test_distributed.py's grpo runs use it.)"""

import json

import pytest
import torch

from grpo_edu.commands import trl_bridge
from grpo_edu.training import checkpoint, placement, trainer
from grpo_edu.config import TrainConfig
from grpo_edu.runtime.distributed import World
from test_trainer import _weights, count_digits, small_config, tiny


def models_with_a_moved_policy():
    """Models whose policy has moved away from its reference (a few random steps)."""
    policy, _ = tiny(seed=0)
    models = placement.build_models(TrainConfig(beta=0.04, threads=1), World(), policy)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(5)
        for parameter in models.policy.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    return models


@pytest.mark.parametrize("alpha", [0.6, 0.05])
def test_a_polyak_sync_is_alpha_of_the_policy_and_the_rest_of_the_reference(alpha):
    models = models_with_a_moved_policy()
    before = _weights(models.reference)
    policy = _weights(models.policy)
    buffers = {name: b.clone() for name, b in models.reference.named_buffers()}
    models.sync_reference(alpha)
    after = _weights(models.reference)
    for name in before:
        by_hand = alpha * policy[name].double() + (1 - alpha) * before[name].double()
        assert torch.allclose(after[name].double(), by_hand, rtol=0, atol=1e-6), name
        assert not torch.equal(after[name], before[name]) and not torch.equal(after[name], policy[name]), name
    for name, buffer in models.reference.named_buffers():
        assert torch.equal(buffer, buffers[name]), name   # buffers are not averaged
    # Twice: (1 - alpha)^2 of the old reference is left.
    models.sync_reference(alpha)
    name = next(iter(before))
    by_hand = policy[name].double() + (1 - alpha) ** 2 * (before[name].double() - policy[name].double())
    assert torch.allclose(models.reference.state_dict()[name].double(), by_hand, rtol=0, atol=1e-6)


def test_alpha_one_is_the_hard_copy():
    models = models_with_a_moved_policy()
    models.sync_reference(1.0)
    assert all(torch.equal(a, b) for a, b in zip(_weights(models.reference).values(), _weights(models.policy).values()))


def test_the_polyak_sync_is_trls_to_the_bit():
    from trl.trainer.callbacks import SyncRefModelCallback
    ours, theirs = models_with_a_moved_policy(), models_with_a_moved_policy()
    for alpha in (0.6, 0.05, 0.999):
        ours.sync_reference(alpha)
        SyncRefModelCallback._sync_target_model(theirs.policy, theirs.reference, alpha)
        for (name, a), b in zip(_weights(ours.reference).items(), _weights(theirs.reference).values()):
            assert torch.equal(a, b), (alpha, name)
    config = TrainConfig(beta=0.04, ref_sync_steps=3, ref_mixup_alpha=0.6, num_mini_batches=2, advantage_std="sample")
    arguments = trl_bridge.grpo_config(config, "unused")
    assert arguments.sync_ref_model and arguments.ref_model_mixup_alpha == 0.6
    assert arguments.ref_model_sync_steps == 6   # 3 rollouts of 2 optimizer steps


def run(tmp_path, directory, **overrides):
    torch.manual_seed(123)
    policy, tokenizer = tiny()
    config = small_config(tmp_path, output_dir=str(tmp_path / directory), learning_rate=1e-2,
                          **{"ref_sync_steps": 2, **overrides})
    return trainer.train(config, policy=policy, tokenizer=tokenizer, log=lambda _: None,
                         reward_functions={"digits": (count_digits, 1.0)})


def test_the_reference_the_trainer_keeps_sets_the_kl(tmp_path):
    """KL at step 3, right after the sync at step 2 (one pass: measured before step 3's update):
    0 with the hard copy, between 0 and the frozen reference's with Polyak's average."""
    kl = {name: run(tmp_path, name, **overrides).history[2]["kl"]
          for name, overrides in {"frozen": {"ref_sync_steps": 0}, "copy": {},
                                  "polyak": {"ref_mixup_alpha": 0.5}}.items()}
    assert kl["copy"] == 0.0
    assert 0.0 < kl["polyak"] < kl["frozen"]


def test_a_polyak_run_resumes_bitwise(tmp_path):
    full = run(tmp_path, "full", ref_mixup_alpha=0.5)
    torch.manual_seed(123)
    policy, tokenizer = tiny()
    config = small_config(tmp_path, output_dir=str(tmp_path / "resumed"), learning_rate=1e-2, ref_sync_steps=2,
                          ref_mixup_alpha=0.5)
    common = dict(policy=policy, tokenizer=tokenizer, log=lambda _: None,
                  reward_functions={"digits": (count_digits, 1.0)})
    trainer.train(config, stop_after=3, **common)          # stopped after step 3: one sync done, one to come
    torch.manual_seed(123)
    policy, tokenizer = tiny()
    resumed = trainer.train(config, resume=tmp_path / "resumed", **{**common, "policy": policy,
                                                                       "tokenizer": tokenizer})
    for (name, a), b in zip(_weights(full.policy).items(), _weights(resumed.policy).values()):
        assert torch.equal(a, b), name
    saved = checkpoint.latest(tmp_path / "resumed")
    assert (saved / "reference.safetensors").is_file()
    assert [json.loads(line)["kl"] for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()] \
        == [m["kl"] for m in full.history]


@pytest.mark.parametrize("overrides, message", [
    ({"ref_mixup_alpha": 0.0, "ref_sync_steps": 2}, "config key 'ref_mixup_alpha' must be in (0, 1]"),
    ({"ref_mixup_alpha": 1.5, "ref_sync_steps": 2}, "config key 'ref_mixup_alpha' must be in (0, 1]"),
    ({"ref_mixup_alpha": 0.5}, "moves the reference at each sync, but there is none: ref_sync_steps = 0, "
                               "beta = 0.04"),
    ({"ref_mixup_alpha": 0.5, "ref_sync_steps": 2, "beta": 0.0}, "but there is none: ref_sync_steps = 2, beta = 0.0"),
])
def test_a_mixup_that_would_do_nothing_is_refused(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
        TrainConfig(**overrides)


# --------------------------------------------------------------------------- benchmarks/reference.py

import sys  # noqa: E402

import grid_checks  # noqa: E402

RESULTS = grid_checks.ROOT / "benchmarks" / "results" / "reference.json"
sys.path.insert(0, str(grid_checks.ROOT / "benchmarks"))
import reference as benchmark  # noqa: E402


def test_the_results_file_holds_every_variant_and_seed():
    for run_ in grid_checks.every_variant_and_seed(RESULTS, benchmark, eval_every=25):
        assert all(len(values) == 150 for values in run_["steps"].values())
        config = benchmark.config_for(run_["variant"], run_["seed"], 10, "unused")
        kl = run_["steps"]["kl"]
        if config.loss.ref_sync_steps and config.loss.ref_mixup_alpha == 1.0:   # right after a copy the KL is 0
            assert all(kl[step] == 0.0 for step in range(config.loss.ref_sync_steps, len(kl), config.loss.ref_sync_steps))
        else:
            assert all(value > 0 for value in kl[1:])


@grid_checks.PINNED
def test_the_results_file_is_what_the_trainer_computes():
    """Re-train ema, seed 0 (a Polyak sync after every rollout), for 4 steps under the pin."""
    grid_checks.reproduces("reference.py", RESULTS, "ema:0", 4)


def test_a_changed_kl_is_caught():
    grid_checks.catches_a_change(RESULTS, benchmark, "ema", 0, 4, "kl", lambda value: value * 1.0001)


def test_the_training_doc_quotes_the_results_file():
    grid_checks.training_doc_quotes_final_accuracies(RESULTS, benchmark)
