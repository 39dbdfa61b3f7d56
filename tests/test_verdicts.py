"""The variant benchmarks' results files keep the verdicts of the comparisons their chapters
make (benchmarks/variant_grid.py, grpo_edu.algorithm.statistics.compare_variants): each file's
verdicts are what its runs give, every pair its chapter compares is there, and a run keeps its
per-problem outcomes where it was written with them."""

from __future__ import annotations

import importlib
import json
import sys

import pytest

import grid_checks

sys.path.insert(0, str(grid_checks.ROOT / "benchmarks"))

BENCHMARKS = ["reference", "entropy", "overlong", "process", "lora", "dynamic_sampling"]


def _grid(name):
    return importlib.import_module(name).GRID


@pytest.mark.parametrize("name", BENCHMARKS)
def test_a_results_files_verdicts_are_its_runs_verdicts(name):
    grid = _grid(name)
    stored = json.loads(grid.out.read_text())
    assert stored["verdicts"] == grid.verdicts(stored["runs"])
    want = {f"{a} - {b}" + (f", {named[0]}" if named else "") for a, b, *named in grid.pairs}
    assert set(stored["verdicts"]) == want and want
    for key, entry in stored["verdicts"].items():
        assert entry["seeds"] == [0, 1, 2] and entry["low"] <= entry["difference"] <= entry["high"], key
        assert ("beats" in entry["words"]) == (entry["low"] > 0 or entry["high"] < 0), key


@pytest.mark.parametrize("name", BENCHMARKS)
def test_kept_outcomes_are_the_final_accuracy(name):
    stored = json.loads(_grid(name).out.read_text())
    for run in stored["runs"]:
        if "greedy_correct" in run:
            outcomes = run["greedy_correct"]
            assert set(outcomes) <= {0, 1} and sum(outcomes) / len(outcomes) == run["final_accuracy"]


def test_a_grid_run_keeps_its_outcomes_and_the_file_its_verdicts(tmp_path, monkeypatch):
    """Two variants of a 2-step run, 2 seeds each: every run keeps one outcome per held-out
    problem, their mean is its final accuracy, and the verdicts compare them within each seed."""
    import variant_grid

    out = tmp_path / "grid.json"
    grid = variant_grid.DefaultRunGrid(
        "a test grid", out, {"a": {}, "b": {"learning_rate": 3e-3}}, ("kl",),
        {"eval_every": 2, "eval_size": 24, "checkpoint_every": 0, "progress": False, "prompts_per_step": 4},
        describe=lambda run: "", example="a:0", pairs=(("b", "a"),))
    monkeypatch.setattr(sys, "argv", ["grid", "--steps", "2", "--seeds", "0", "1", "--out", str(out)])
    grid.main()
    stored = json.loads(out.read_text())
    assert len(stored["runs"]) == 4
    for run in stored["runs"]:
        assert len(run["greedy_correct"]) == 24 and sum(run["greedy_correct"]) / 24 == run["final_accuracy"]
    entry = stored["verdicts"]["b - a"]
    assert entry["seeds"] == [0, 1] and set(entry["per_seed"]) == {"0", "1"}
    # --verdicts recomputes the same from the file
    stored["verdicts"] = {}
    out.write_text(json.dumps(stored))
    monkeypatch.setattr(sys, "argv", ["grid", "--verdicts", str(out)])
    grid.main()
    assert json.loads(out.read_text())["verdicts"]["b - a"] == entry


@pytest.mark.parametrize("name, results", [("lag", "lag.json"), ("estimators", "estimators.json")])
def test_the_lag_and_estimator_files_keep_their_chapters_verdicts(name, results):
    benchmark = importlib.import_module(name)
    stored = json.loads((grid_checks.ROOT / "benchmarks" / "results" / results).read_text())
    assert stored["verdicts"] == benchmark.verdicts(stored["runs"])
    assert set(stored["verdicts"]) == {f"{a} - {b}" for a, b in benchmark.PAIRS}
    for run in stored["runs"]:
        if "greedy_correct" in run:
            assert sum(run["greedy_correct"]) / len(run["greedy_correct"]) == run["final_accuracy"]


def test_the_held_out_lag_file_has_no_pair_to_compare():
    import lag
    stored = json.loads((grid_checks.ROOT / "benchmarks" / "results" / "lag_held_out.json").read_text())
    assert stored["verdicts"] == lag.verdicts(stored["runs"]) == {}
