"""The failure lab's injected faults (grpo_edu.lab.faults): each does what it says, on the real
trainer, and none can be switched on from a config; the production checks stay on."""

import dataclasses
import inspect

import pytest
import torch

from grpo_edu.training import metrics, placement, trainer, update
from grpo_edu.algorithm.advantages import group_advantages
from grpo_edu.config import TrainConfig
from grpo_edu.runtime.distributed import World
from grpo_edu.lab.faults import NONE, Faults
from grpo_edu.algorithm.logprobs import completion_logprobs
from grpo_edu.policy.models import STARTING_POLICY, load_policy


def lab_config(tmp_path, **overrides):
    """The CPU tier's policy and task, a few small steps."""
    values = dict(prompts_per_step=4, num_generations=8, steps=6, eval_every=100, eval_size=8,
                  checkpoint_every=0, progress=False, output_dir=str(tmp_path / "run"))
    values.update(overrides)
    return TrainConfig(**values)


def run(config, faults=None):
    return (faults or NONE).train(config, log=lambda line: None)


@pytest.mark.parametrize("kwargs, message", [
    (dict(trainer_temperature=0), "Faults.trainer_temperature: expected None or a number > 0, got 0"),
    (dict(split_groups=0), "Faults.split_groups: expected an int >= 1, got 0"),
    (dict(split_groups=1.5), "Faults.split_groups: expected an int >= 1, got 1.5"),
])
def test_bad_faults_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        Faults(**kwargs)


@pytest.mark.parametrize("faults, overrides, message", [
    (Faults(split_groups=3), {}, r"Faults.split_groups: expected a divisor of num_generations \(8\), got 3"),
    (Faults(alias_reference=True), {"beta": 0.0}, "expected a run with a reference"),
    (Faults(refresh_old_logprobs=True), {}, r"expected num_iterations > 1"),
])
def test_a_fault_that_would_inject_nothing_is_refused(tmp_path, faults, overrides, message):
    with pytest.raises(ValueError, match=message):
        run(lab_config(tmp_path, **overrides), faults)


def test_a_fault_is_never_a_config_key_nor_a_trainer_argument(tmp_path):
    assert "faults" not in {f.name for f in dataclasses.fields(TrainConfig)}
    with pytest.raises(ValueError, match="unknown config key 'faults'"):
        TrainConfig.from_toml(None, ["faults=1"])
    for function in (trainer.train, trainer.set_up, trainer.loop, placement.build_models, update.optimise):
        assert not {"faults", "allow_alias"} & set(inspect.signature(function).parameters), function.__name__
    assert NONE.active() == {} and Faults(off_by_one=True).active() == {"off_by_one": True}


def test_apply_refuses_a_fault_the_config_makes_meaningless_and_injects_nothing_when_none(tmp_path):
    run_ = trainer.set_up(lab_config(tmp_path, beta=0.0), log=lambda line: None)
    before = (run_.sampler.roll_out, run_.optimise, run_.sampler.advantage_fn, run_.models.reference_logprobs)
    with pytest.raises(ValueError, match="Faults.alias_reference: expected a run with a reference"):
        Faults(alias_reference=True).apply(run_)
    NONE.apply(run_)
    assert (run_.sampler.roll_out, run_.optimise, run_.sampler.advantage_fn,
            run_.models.reference_logprobs) == before
    assert run_.notes == {}


def test_a_faulty_run_says_so_in_its_log_and_summary(tmp_path):
    lines = []
    result = Faults(split_groups=2).train(lab_config(tmp_path, steps=1), log=lines.append)
    assert "FAULTS INJECTED (the failure lab): {'split_groups': 2}" in lines
    assert result.summary["faults"] == {"split_groups": 2}
    assert "faults" not in run(lab_config(tmp_path / "clean", steps=1)).summary


def test_an_aliased_reference_is_refused_and_only_the_lab_injects_one(tmp_path):
    policy, _ = load_policy(STARTING_POLICY)
    config = lab_config(tmp_path)
    with pytest.raises(ValueError, match=r"reference model is the policy object itself"):
        placement.build_models(config, World(), policy, policy)
    twin = placement.make_reference(policy)
    twin.model.embed_tokens.weight = policy.model.embed_tokens.weight   # one shared tensor is enough
    with pytest.raises(ValueError, match="reference parameter 'model.embed_tokens.weight' shares memory"):
        placement.build_models(config, World(), policy, twin)
    assert "allow_alias" not in inspect.signature(placement.build_models).parameters   # no way around the check
    run = trainer.set_up(config, log=lambda line: None)
    Faults(alias_reference=True).apply(run)
    assert run.models.reference is run.models.policy and run.models.reference_logprobs.model is run.models.policy


def test_aliased_reference_kl_is_zero_and_the_run_is_beta_0s(tmp_path):
    """The seed says the policy never moves; measured, it moves exactly as with beta = 0 (k3's
    gradient is 0 where the reference equals the policy), with a KL of exactly 0 logged."""
    aliased = run(lab_config(tmp_path / "a"), Faults(alias_reference=True))
    free = run(lab_config(tmp_path / "b", beta=0.0))
    assert [m["kl"] for m in aliased.history] == [0.0] * 6
    assert all(m["grad_norm"] > 0 for m in aliased.history)
    for (name, a), b in zip(aliased.policy.state_dict().items(), free.policy.state_dict().values()):
        assert torch.equal(a, b), name


def test_trainer_temperature_shows_as_a_sampler_gap_and_ratio(tmp_path):
    config = lab_config(tmp_path, temperature=0.7, old_logprobs="sampler", steps=2)
    mismatched = run(config, Faults(trainer_temperature=1.0))
    matched = run(lab_config(tmp_path / "ok", temperature=0.7, old_logprobs="sampler", steps=2))
    assert matched.history[0]["sampler_gap/mean_abs"] < 1e-5
    assert mismatched.history[0]["sampler_gap/mean_abs"] > 0.03
    assert mismatched.history[0]["ratio/max"] > 2.0 > matched.history[0]["ratio/max"]


def test_off_by_one_scores_the_next_token():
    policy, tokenizer = load_policy(STARTING_POLICY)
    ids = tokenizer(["12+3=<think>5</think>\\boxed{15}<eos><pad>", "12+3=<think>5</think>\\boxed{15}<pad><pad>"],
                    return_tensors="pt", add_special_tokens=False)["input_ids"]
    P = 5
    mask = torch.zeros(2, ids.shape[1] - P, dtype=torch.long)
    mask[0, :8] = 1
    mask[1, :7] = 1   # a completion cut before EOS: its next column is padding too
    attention = torch.cat([torch.ones(2, P, dtype=torch.long), mask], 1)
    correct_fn = lambda model, i, a, m: completion_logprobs(model, i, a, m)   # noqa: E731
    with torch.no_grad():
        right = completion_logprobs(policy, ids, attention, mask)
        wrong = Faults(off_by_one=True).logprob_fn(correct_fn)(policy, ids, attention, mask)
        everything = completion_logprobs(policy, ids, torch.ones_like(attention), torch.ones_like(mask))
    for row, length in ((0, 8), (1, 7)):
        assert torch.equal(wrong[row, :length - 1], right[row, 1:length])   # the next token's log-prob
        assert torch.allclose(wrong[row, length - 1], everything[row, length], atol=1e-5)   # the padding's
        assert (wrong[row, length:] == 0).all()


def test_split_groups_normalises_each_part_and_breaks_ties():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    fn = lambda r: group_advantages(r)   # noqa: E731
    split = Faults(split_groups=2).split_advantages(fn, rewards)
    assert torch.allclose(split[:, :4], group_advantages(rewards[:, :4]), rtol=0, atol=1e-12)
    assert torch.allclose(split[:, 4:], group_advantages(rewards[:, 4:]), rtol=0, atol=1e-12)
    assert metrics.tie_spread(rewards, group_advantages(rewards)) == 0.0
    # reward 1: 1.732 in the first half (1 of 4 right), 0.577 in the second (3 of 4)
    assert metrics.tie_spread(rewards, split) == pytest.approx(3 ** 0.5 - 1 / 3 ** 0.5)


def test_refreshed_old_logprobs_keep_the_ratio_at_1(tmp_path):
    fixed = run(lab_config(tmp_path / "f", num_iterations=3, steps=3))
    refreshed = run(lab_config(tmp_path / "r", num_iterations=3, steps=3), Faults(refresh_old_logprobs=True))
    assert all(m["optimizer_steps"] == 3 for m in fixed.history + refreshed.history)
    assert all(m["ratio/min"] == 1.0 == m["ratio/max"] for m in refreshed.history)
    assert all(m["ratio/min"] < 1.0 < m["ratio/max"] for m in fixed.history)
