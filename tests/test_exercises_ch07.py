"""The chapter-7 checkers."""

import pytest

from grpo_edu.training import metrics
from grpo_edu.config import TrainConfig
from grpo_edu.exercises import ch07


def test_the_answer_key_passes_and_a_wrong_name_is_explained():
    key = ch07._answer_key()
    right = {run: ch07.MYSTERY_RUNS[name][0] for run, name in key.items()}
    assert ch07.check_mystery_runs(right)
    run, name = next(iter(key.items()))
    wrong = dict(right, **{run: "length bias"})
    assert ch07.check_mystery_runs(wrong).failures == [
        f"{run}: not 'length bias': that would show {ch07.SIGNS['length bias']}, and {run} does not"]
    assert "no diagnoses yet" in ch07.check_mystery_runs({}).failures[0]
    assert "['bug'] are not among the names" in ch07.check_mystery_runs({"run A": "bug"}).failures[0]
    assert set(ch07.SIGNS) == set(ch07.FAILURES) - {"healthy"}


def test_the_mystery_runs_show_what_the_key_says():
    """The data is what benchmarks/failure_lab.py --mystery wrote from real lab runs: each run's
    giveaway holds in it, and the doctor, given the config.json the exercise ships, names the
    same failure (the step 'check your reading against the doctor's' works as the chapter says)."""
    from grpo_edu.doctor.diagnose import diagnose
    from grpo_edu.lab import RUNS
    runs, configs, key = ch07.mystery_runs(), ch07.mystery_configs(), ch07._answer_key()
    assert sorted(runs) == sorted(configs) == sorted(key)
    for run, name in key.items():
        history, config = runs[run], configs[run]
        # as failure_lab wrote it: the run's config (keys added since read at their defaults, as a resume reads them)
        assert TrainConfig.from_dict(config) == RUNS[name].config(f"runs/mystery-{run[-1]}", seed=1)
        assert name not in config["output_dir"]
        assert len(history) == RUNS[name].steps
        assert RUNS[name].diagnosed_as_expected({f.detector for f in diagnose(history, config)}), run
    by_name = {name: runs[run] for run, name in key.items()}
    assert all(m["kl"] == 0 and m["grad_norm"] > 0 for m in by_name["alias"][1:])
    assert all(m["ratio/min"] == 1 == m["ratio/max"] and m["optimizer_steps"] == 4 for m in by_name["old_refreshed"])
    assert by_name["temperature"][0]["sampler_gap/mean_abs"] > 0.03 > by_name["healthy"][0]["sampler_gap/mean_abs"]


def test_the_trainers_tie_spread_passes_and_wrong_ones_fail():
    assert ch07.check_tie_spread(metrics.tie_spread)
    over_all_pairs = ch07.check_tie_spread(lambda r, a: float((a[:, :, None] - a[:, None, :]).abs().max()))
    assert over_all_pairs.failures[0] == "the chapter's group, whole: is too large"
    first_group_only = ch07.check_tie_spread(lambda r, a: metrics.tie_spread(r[:1], a[:1]))
    assert any("split in halves" in f for f in first_group_only.failures)
    assert all("raised ZeroDivisionError" in f for f in ch07.check_tie_spread(lambda r, a: 1 / 0).failures)


def test_the_split_case_by_hand():
    """[1.5, 0.5, 0.5, 0.5 | 1.5, 1.5, 0.5, 0.5]: the right answer gets sqrt(3) in the first half
    (mean 0.75, std sqrt(3)/4) and 1 in the second (mean 1, std 0.5): a spread of sqrt(3) - 1."""
    name, rewards, advantages = ch07.tie_spread_cases()[1]
    assert metrics.tie_spread(rewards, advantages) == pytest.approx(3 ** 0.5 - 1, abs=1e-7)
