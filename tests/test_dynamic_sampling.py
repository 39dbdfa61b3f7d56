"""DAPO's dynamic sampling (config key dynamic_sampling_rounds): the all-equal groups of a rollout
replaced by the differing groups of fresh prompts, up to a limit of rounds, and at the limit the
slots left to all-equal groups, which are not trained on. Rollouts joined row by row; the batch
the trainer trains on, by a reward that makes chosen prompts all-equal; nothing changes when no
group is all-equal; resumed bitwise; refused by the TRL bridge. 2 processes equal 1:
tests/test_distributed.py's grpo runs."""

from pathlib import Path

import pytest
import torch

from grpo_edu.commands import trl_bridge
from grpo_edu.training import dynamic_sampling, trainer, update
from grpo_edu.config import TrainConfig
from grpo_edu.sampling.rollout import Rollout
from test_trainer import _weights, small_config, tiny


def rollout(P, S, rows, value, G=2, episodic=False):
    return Rollout(prompt_ids=torch.full((rows, P), value), prompt_mask=torch.ones(rows, P, dtype=torch.long),
                   completion_ids=torch.full((rows, S), value + 1), completion_mask=torch.ones(rows, S, dtype=torch.long),
                   sampler_logp=torch.full((rows, S), -0.5), finished=torch.ones(rows, dtype=torch.bool),
                   num_generations=G, env_mask=torch.zeros(rows, S, dtype=torch.long) if episodic else None,
                   episode={"turns": torch.full((rows,), float(value))} if episodic else None)


def test_rollouts_of_different_widths_join_padded_as_the_engines_pad():
    a, b = rollout(3, 4, 2, 10), rollout(5, 2, 4, 20)
    joined = dynamic_sampling.concat_rollouts([a, b], pad_token_id=0)
    assert joined.prompt_ids.shape == (6, 5) and joined.completion_ids.shape == (6, 4)
    assert joined.prompt_ids[0].tolist() == [0, 0, 10, 10, 10] and joined.prompt_mask[0].tolist() == [0, 0, 1, 1, 1]
    assert joined.completion_ids[2].tolist() == [21, 21, 0, 0] and joined.completion_mask[2].tolist() == [1, 1, 0, 0]
    assert joined.sampler_logp[2].tolist() == [-0.5, -0.5, 0.0, 0.0]
    rows = dynamic_sampling.take_rows(joined, torch.tensor([4, 5, 0, 1]))
    assert rows.prompt_ids[:, -1].tolist() == [20, 20, 10, 10]
    episodic = dynamic_sampling.concat_rollouts([rollout(3, 4, 2, 1, episodic=True), rollout(3, 6, 2, 2, episodic=True)], 0)
    assert episodic.env_mask.shape == (4, 6) and episodic.episode["turns"].tolist() == [1.0, 1.0, 2.0, 2.0]
    with pytest.raises(ValueError, match="every part must be multi-turn"):
        dynamic_sampling.concat_rollouts([rollout(3, 4, 2, 1, episodic=True), rollout(3, 4, 2, 1)], 0)


def parity_reward(completions, answer, **kwargs):
    """All-equal (1.0) for the prompts whose answer is even; the completion's length otherwise."""
    return [1.0 if int(a) % 2 == 0 else float(len(c)) for c, a in zip(completions, answer)]


def run(tmp_path, name, reward=parity_reward, monkeypatch=None, **overrides):
    seen = []
    if monkeypatch is not None:
        original = update.optimise

        def recording(config, settings, models, optimizer, scheduler, batch, plan, world):
            seen.append((batch, plan))
            return original(config, settings, models, optimizer, scheduler, batch, plan, world)
        monkeypatch.setattr(trainer, "optimise", recording)
    torch.manual_seed(0)
    policy, tokenizer = tiny(seed=0)
    config = small_config(tmp_path, output_dir=str(tmp_path / name), **{"steps": 2, "eval_every": 100,
                                                                        "checkpoint_every": 0, **overrides})
    result = trainer.train(config, policy=policy, tokenizer=tokenizer, log=lambda _: None,
                           reward_functions={"parity": (reward, 1.0)})
    return result, seen


def test_the_all_equal_groups_are_replaced_by_fresh_differing_ones(tmp_path, monkeypatch):
    result, seen = run(tmp_path, "refill", monkeypatch=monkeypatch, dynamic_sampling_rounds=4)
    for step, (batch, plan) in zip(result.history, seen):
        assert step["dynamic_sampling/short"] == 0.0
        assert step["dynamic_sampling/rounds"] > 1.0 and step["dynamic_sampling/first_zero_std"] > 0
        assert step["zero_std_groups"] == 0.0
        assert len(torch.cat(plan.mini_batches)) == 4   # every slot trains
        assert plan.sampling == {key.split("/")[1]: value for key, value in step.items()
                                 if key.startswith("dynamic_sampling/")}
        # The batch's groups are the odd-answer prompts', whose rewards are the completions' lengths.
        texts = result.tokenizer.batch_decode(batch.completion_ids.reshape(16, -1), skip_special_tokens=True)
        assert plan.rewards.reshape(-1).tolist() == [float(len(text)) for text in texts]


def test_at_the_limit_the_slots_left_keep_all_equal_groups_and_do_not_train(tmp_path):
    result, _ = run(tmp_path, "limit", reward=lambda completions, **kw: [1.0] * len(completions),
                    dynamic_sampling_rounds=2, steps=1)
    step = result.history[0]
    assert step["dynamic_sampling/rounds"] == 3.0 and step["dynamic_sampling/short"] == 1.0
    assert step["dynamic_sampling/first_zero_std"] == 1.0
    assert step["optimizer_steps"] == 0.0 and step["skipped_update"] == 1.0


def test_with_no_all_equal_group_nothing_changes(tmp_path):
    length = lambda completions, **kw: [float(len(c)) + 0.01 * i for i, c in enumerate(completions)]  # noqa: E731
    plain, _ = run(tmp_path, "plain", reward=length)
    dynamic, _ = run(tmp_path, "dynamic", reward=length, dynamic_sampling_rounds=3)
    assert all(torch.equal(a, b) for a, b in zip(_weights(plain.policy).values(), _weights(dynamic.policy).values()))
    assert [m["dynamic_sampling/rounds"] for m in dynamic.history] == [1.0, 1.0]
    keep = [k for k in plain.history[0] if not k.startswith("time/")]
    assert [{k: m[k] for k in keep} for m in plain.history] == [{k: m[k] for k in keep} for m in dynamic.history]


def test_episodes_refill_too(tmp_path, monkeypatch):
    """Multi-turn rollouts join with their environment masks and episode statistics: the batch
    trained on holds only differing groups, the environment's tokens still unscored."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent.parent))
    result, seen = run(tmp_path, "episodes", monkeypatch=monkeypatch, dynamic_sampling_rounds=4,
                       environment="tests.episode_envs:Echo", max_turns=3, max_completion_length=10)
    for step, (batch, plan) in zip(result.history, seen):
        assert step["dynamic_sampling/rounds"] > 1 and step["zero_std_groups"] == 0.0
        assert batch.env_mask is not None and not (batch.env_mask.bool() & batch.completion_mask.bool()).any()
        assert set(plan.episode) >= {"turns", "env_tokens"} and "episode/turns" in step


def test_refilling_trains_more_groups_than_dropping(tmp_path):
    dropped, _ = run(tmp_path, "drop", filter_zero_std_groups=True)
    refilled, _ = run(tmp_path, "refill", dynamic_sampling_rounds=4)
    assert all(m["zero_std_groups"] > 0 for m in dropped.history)
    assert all(m["zero_std_groups"] == 0 for m in refilled.history)
    assert any(not torch.equal(a, b) for a, b in zip(_weights(dropped.policy).values(),
                                                     _weights(refilled.policy).values()))


def test_a_dynamic_sampling_run_resumes_bitwise(tmp_path):
    full, _ = run(tmp_path, "full", dynamic_sampling_rounds=4, steps=4, checkpoint_every=1)
    torch.manual_seed(0)
    policy, tokenizer = tiny(seed=0)
    config = small_config(tmp_path, output_dir=str(tmp_path / "resumed"), steps=4, eval_every=100,
                          checkpoint_every=1, dynamic_sampling_rounds=4)
    common = dict(log=lambda _: None, reward_functions={"parity": (parity_reward, 1.0)})
    trainer.train(config, policy=policy, tokenizer=tokenizer, stop_after=2, **common)
    torch.manual_seed(0)
    policy, tokenizer = tiny(seed=0)
    resumed = trainer.train(config, policy=policy, tokenizer=tokenizer, resume=tmp_path / "resumed", **common)
    assert all(torch.equal(a, b) for a, b in zip(_weights(full.policy).values(), _weights(resumed.policy).values()))


def test_negative_rounds_and_the_trl_bridge_refuse():
    with pytest.raises(ValueError, match=r"config key 'dynamic_sampling_rounds' must be >= 0 \(0 = off\), got -1"):
        TrainConfig(dynamic_sampling_rounds=-1)
    with pytest.raises(ValueError, match="config key 'dynamic_sampling_rounds' cannot be carried over to TRL: "
                                         "dynamic_sampling_rounds = 2: TRL's GRPOTrainer trains every group"):
        trl_bridge.grpo_config(TrainConfig(advantage_std="sample", dynamic_sampling_rounds=2), "unused")


# --------------------------------------------------------------------------- benchmarks/dynamic_sampling.py

import sys  # noqa: E402

import grid_checks  # noqa: E402

RESULTS = grid_checks.ROOT / "benchmarks" / "results" / "dynamic_sampling.json"
sys.path.insert(0, str(grid_checks.ROOT / "benchmarks"))
import dynamic_sampling as benchmark  # noqa: E402


def test_the_results_file_holds_every_variant_and_seed():
    for run_ in grid_checks.every_variant_and_seed(RESULTS, benchmark, eval_every=10):
        rounds = run_["steps"]["dynamic_sampling/rounds"]
        if run_["variant"].startswith("refill"):
            assert all(1 <= r <= 5 for r in rounds) and max(rounds) > 1
            # a full batch has no all-equal group; at the limit, the share left is what stays all-equal
            assert all(abs(z - s) < 1e-9 for z, s in zip(run_["steps"]["zero_std_groups"],
                                                          run_["steps"]["dynamic_sampling/short"]))
        else:
            assert set(rounds) == {None}
    assert grid_checks.results(RESULTS)["settings"]["task"] == "countdown"


def test_the_committed_trained_policy_scores_what_its_card_says():
    """grpo_edu/assets/tiny-arithmetic-trained, evaluated again on the default run's 256 held-out
    problems as the trainer evaluates: the greedy accuracy its model card states."""
    from grpo_edu.policy.models import TRAINED_POLICY, load_policy
    from grpo_edu.training.evaluation import greedy_scores
    from grpo_edu.environment import tasks
    from grpo_edu.config import DEFAULT_CONFIG
    config = TrainConfig.from_toml(DEFAULT_CONFIG)
    model, tokenizer = load_policy(TRAINED_POLICY)
    held_out = tasks.task_pools(config, tokenizer)[1]
    scores = greedy_scores(model, tokenizer, held_out, max_new_tokens=config.rollout.max_completion_length)
    accuracy = sum(a for a, _ in scores) / len(scores)
    card = (TRAINED_POLICY / "README.md").read_text()
    assert len(held_out) == 256 and f"{accuracy:.4f} after" in card and accuracy > 0.99
    assert "/tmp" not in card


def test_the_solved_regime_starts_where_many_groups_are_all_right():
    """The -solved variants train `make train`'s committed policy on arithmetic: more than a third
    of refill-solved's first rollouts' groups are all-equal (all right, nearly always), refill fills
    every slot, and sampled accuracy (pass@1) is measured at every evaluation (greedy has almost
    no room left)."""
    from grpo_edu.policy.models import TRAINED_POLICY, policy_source
    assert policy_source("trained") == TRAINED_POLICY and (TRAINED_POLICY / "model.safetensors").is_file()
    runs = [r for r in grid_checks.results(RESULTS)["runs"] if r["variant"].endswith("-solved")]
    assert len(runs) == 9 and all(r["start_accuracy"] > 0.9 for r in runs)
    for run_ in runs:
        assert sum(s is not None for s in run_["steps"]["eval/pass_at_1"]) == len(run_["eval"])
    first = [x for r in runs if r["variant"] == "refill-solved" for x in r["steps"]["dynamic_sampling/first_zero_std"]]
    assert sum(first) / len(first) > 1 / 3
    assert all(z == 0 for r in runs if r["variant"] == "refill-solved" for z in r["steps"]["zero_std_groups"])
    import tomllib
    package_data = tomllib.loads((grid_checks.ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "assets/tiny-arithmetic-trained/*" in package_data["grpo_edu"]


@grid_checks.PINNED
def test_the_results_file_is_what_the_trainer_computes():
    """Re-train refill, seed 0, for 3 steps under the pin."""
    grid_checks.reproduces("dynamic_sampling.py", RESULTS, "refill:0", 3)


def test_a_changed_round_count_is_caught_and_timings_are_not_compared():
    grid_checks.catches_a_change(RESULTS, benchmark, "refill", 0, 3, "dynamic_sampling/rounds", lambda value: value + 1)
    stored = next(r for r in grid_checks.results(RESULTS)["runs"] if (r["variant"], r["seed"]) == ("refill", 0))
    timed = {"steps": {**{k: v[:3] for k, v in stored["steps"].items()}, "time/rollout": [0.0] * 3}, "eval": []}
    assert benchmark.differences(timed, stored, 3) == []


def test_the_training_doc_quotes_the_results_file():
    """The groups that carry a gradient per step, dropped and refilled, and the rollouts refilling took."""
    stored = grid_checks.results(RESULTS)
    readme = " ".join(grid_checks.TRAINING_DOC.read_text().split())
    B = benchmark.config_for("keep", 0, 1, "unused").rollout.prompts_per_step
    for variant in ("drop", "refill", "keep-solved", "drop-solved", "refill-solved"):
        groups = [benchmark.differing_groups_per_step(r, B) for r in stored["runs"] if r["variant"] == variant]
        figure = f"{sum(groups) / len(groups):.1f} ({min(groups):.1f}-{max(groups):.1f})"
        assert figure in readme, (variant, figure)
    for variant in ("refill", "refill-solved"):
        rounds = [sum(r["steps"]["dynamic_sampling/rounds"]) / stored["steps"] for r in stored["runs"]
                  if r["variant"] == variant]
        assert f"{sum(rounds) / len(rounds):.1f} rollouts per step" in readme, variant
    assert all(r["final_accuracy"] == 0.0 for r in stored["runs"] if r["variant"] in benchmark.HOW)
    assert "held-out accuracy stays 0" in readme
