"""Rollouts that lag (config key rollout_lag, grpo_edu.training.asynchronous): the update trains on the rollout the
policy of k updates earlier sampled, with that policy as pi_old; k = 0 is the synchronous loop."""

import json

import pytest
import torch

from grpo_edu.training import asynchronous, checkpoint, trainer
from grpo_edu.config import TrainConfig
from test_trainer import _weights, count_digits, small_config, tiny


def run(tmp_path, directory, **overrides):
    resume = overrides.pop("resume", None)
    stop_after = overrides.pop("stop_after", None)
    torch.manual_seed(123)
    policy, tokenizer = tiny()
    settings = {"learning_rate": 1e-2, "steps": 6, "checkpoint_every": 1, "eval_every": 3, **overrides}
    config = small_config(tmp_path, output_dir=str(tmp_path / directory), **settings)
    return trainer.train(config, policy=policy, tokenizer=tokenizer, log=lambda _: None, resume=resume,
                         stop_after=stop_after, reward_functions={"digits": (count_digits, 1.0)})


def without_time(history):
    return [{k: v for k, v in m.items() if not k.startswith("time/") and k != "staleness"} for m in history]


@pytest.mark.parametrize("key, value, message", [
    ("rollout_lag", -1, "config key 'rollout_lag' must be >= 0 \\(0 = synchronous\\), got -1"),
])
def test_bad_lag_is_named(key, value, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**{key: value})


@pytest.mark.parametrize("other", [{"num_iterations": 2}, {"num_mini_batches": 2}])
def test_a_lag_needs_one_optimizer_step_per_rollout_naming_both_keys(other):
    with pytest.raises(ValueError) as error:
        TrainConfig(rollout_lag=2, **other)
    message = str(error.value)
    assert "'rollout_lag' (2)" in message and f"{next(iter(other))} = 2" in message and "\n" not in message


def test_lag_0_is_the_synchronous_loop_and_its_checkpoints_hold_nothing_in_flight(tmp_path):
    result = run(tmp_path, "sync")
    assert all("staleness" not in m for m in result.history)
    saved = torch.load(tmp_path / "sync" / "checkpoints" / "step-000006" / "trainer_state.pt",
                       weights_only=True)
    assert "in_flight" not in saved and set(saved) == checkpoint.STATE_KEYS


@pytest.mark.parametrize("lag", [1, 3])
def test_the_staleness_rises_to_the_lag_and_stays(tmp_path, lag):
    result = run(tmp_path, f"lag{lag}", rollout_lag=lag)
    assert [m["staleness"] for m in result.history] == [float(min(t, lag)) for t in range(6)]


def test_with_a_frozen_policy_a_lagged_run_trains_on_the_synchronous_run_s_data(tmp_path):
    """learning_rate 0: the policy never moves, so the lag changes nothing but when each rollout
    is sampled: the same prompts, completions, rewards, ratios and losses, step for step."""
    sync = run(tmp_path, "sync", learning_rate=0.0)
    lagged = run(tmp_path, "lagged", learning_rate=0.0, rollout_lag=2)
    assert without_time(lagged.history) == without_time(sync.history)


def test_pi_old_is_the_policy_that_sampled(tmp_path):
    """The first update trains on the starting policy's rollout: ratio exactly 1. Later ones train
    on rollouts 1 or 2 updates old: the ratio moves (the clip sees the staleness), while the
    sampler gap (pi_old against the sampler's own log-probs) stays at float rounding: pi_old is
    the sampling policy, not the current one (which would give a ratio of exactly 1)."""
    sync = run(tmp_path, "sync")
    lagged = run(tmp_path, "lagged", rollout_lag=2)
    first = lagged.history[0]
    assert first["ratio/min"] == first["ratio/max"] == 1.0
    assert all(m["ratio/min"] == m["ratio/max"] == 1.0 for m in sync.history)
    for m in lagged.history[1:]:
        assert m["ratio/min"] < 1.0 or m["ratio/max"] > 1.0
        assert m["sampler_gap/mean_abs"] < 1e-5
    assert not all(torch.equal(a, b) for a, b in zip(_weights(sync.policy).values(), _weights(lagged.policy).values()))


def test_a_lagged_run_resumes_bitwise_with_its_rollouts_in_flight(tmp_path):
    full = run(tmp_path, "full", rollout_lag=2)
    interrupted = run(tmp_path, "resumed", rollout_lag=2, stop_after=3)
    saved = torch.load(tmp_path / "resumed" / "checkpoints" / "step-000003" / "trainer_state.pt", weights_only=True)
    assert saved["step"] + len(saved["in_flight"][0]) == 5 and len(saved["in_flight"]) == 1 and len(saved["in_flight"][0]) == 2
    assert [r["sampled_at"] for r in saved["in_flight"][0]] == [1, 2]
    assert interrupted.summary["steps"] == 3
    resumed = run(tmp_path, "resumed", rollout_lag=2, resume=tmp_path / "resumed")
    for (name, a), b in zip(_weights(full.policy).items(), _weights(resumed.policy).values()):
        assert torch.equal(a, b), f"{name} differs after resume"
    lines = [json.loads(line) for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert without_time(lines) == without_time(full.history)
    assert [m["staleness"] for m in lines] == [m["staleness"] for m in full.history]


def test_an_in_flight_record_round_trips(tmp_path):
    run(tmp_path, "r", rollout_lag=1, stop_after=2)
    saved = torch.load(tmp_path / "r" / "checkpoints" / "step-000002" / "trainer_state.pt", weights_only=True)
    record = saved["in_flight"][0][0]
    flight = asynchronous.from_record(record)
    again = asynchronous.to_record(flight)
    assert again["samples"] == record["samples"] and again["sampled_at"] == record["sampled_at"] == 1
    for key, value in record["batch"].items():
        assert (value is None and again["batch"][key] is None) or torch.equal(value, again["batch"][key])
    assert flight.batch.old_logp is not None   # pi_old travels with the rollout


def test_resuming_a_lagged_run_on_another_number_of_processes_is_refused(tmp_path):
    class TwoRanks:
        size, rank, device = 2, 0, "cpu"
    source = asynchronous.Lagged(sampler=None, lag=1, steps=4)
    with pytest.raises(checkpoint.CheckpointError, match="written by 1 processes; resume on 1, got 2"):
        source.restore([[]], TwoRanks())
