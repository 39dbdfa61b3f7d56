"""benchmarks/reasoning.py and its results file (benchmarks/results/reasoning.json), which chapter 9
reads: the grid it holds, the verdicts recomputed from its runs, and that it is what the trainer
computes (one run re-trained, pinned)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hang_guard import HANG_SECONDS
import grid_checks

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "reasoning.json"
sys.path.insert(0, str(ROOT / "benchmarks"))
import reasoning  # noqa: E402

needs_pin = grid_checks.PINNED


def test_the_results_file_holds_the_grid_the_bases_and_what_was_tried():
    results = json.loads(RESULTS.read_text())
    assert {(r["arm"], r["seed"]) for r in results["runs"]} == {(arm, seed) for arm in reasoning.ARMS
                                                                 for seed in (0, 1, 2)}
    assert set(results["bases"]) == set(reasoning.BASES)
    assert results["tried"] == reasoning.TRIED and len(results["tried"]) >= 10
    depths = [str(d) for d in reasoning.DEPTHS]
    for base in results["bases"].values():
        assert list(base["precondition"]) == depths and list(base["probe"]["by_depth"]) == depths
        assert base["pass"]["n"] == reasoning.PASS_N and len(base["pass"]["correct"]) == len(base["pass"]["depths"])
    for run in results["runs"]:
        assert all(len(values) == results["steps"] for values in run["steps"].values()), run["arm"]
        assert [p["step"] for p in run["probes"]] == list(range(50, results["steps"] + 1, 50))
        assert run["final_accuracy"] == run["eval"][-1][1]
        assert len(run["probes"][-1]["greedy_correct"]) == len(depths) * reasoning.PROBE_PER_DEPTH
        assert ("pass" in run) == (run["arm"] in reasoning.PASS_ARMS)
        if "pass" in run:
            assert len(run["pass"]["correct"]) == len(results["bases"][run["base"]]["pass"]["correct"])


def test_the_verdicts_are_recomputed_from_the_runs():
    results = json.loads(RESULTS.read_text())
    assert reasoning.verdicts(results) == results["verdicts"]
    for name in ("grpo: length, last - first 10 steps", "length growth, grpo - dr_grpo",
                 "grpo: pass@256, trained - base", "no_top_worked: depth 12 sampled accuracy, end - start"):
        assert results["verdicts"][name]["seeds"] == [0, 1, 2], name


def test_each_arm_is_the_config_it_says():
    configs = {arm: reasoning.config_for(arm, 0, 10, "unused") for arm in reasoning.ARMS}
    assert {arm: c.run.model for arm, c in configs.items()} == {
        "grpo": "digitsum-start", "dr_grpo": "digitsum-start", "no_check": "digitsum-no-check",
        "no_top_worked": "digitsum-no-top-worked"}
    assert configs["dr_grpo"].loss.loss_type == "dr_grpo"
    assert {c.loss.loss_type for arm, c in configs.items() if arm != "dr_grpo"} == {"grpo"}
    for c in configs.values():
        assert c.run.task == "digitsum" and c.run.rewards == {"accuracy": 1.0} and c.loss.beta == 0.0


def test_bad_runs_and_bases_are_named():
    def fails(*argv):
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "reasoning.py"), *argv], cwd=ROOT,
                              capture_output=True, text=True, timeout=HANG_SECONDS)
        return done.returncode != 0 and done.stderr.strip().splitlines()[-1]
    assert fails("--runs", "ppo:0") == "--runs: expected arm:seed with an arm of " + str(list(reasoning.ARMS)) + \
        ", got 'ppo'"
    assert fails("--bases", "digitsum-start", "mine").startswith("--bases: expected names of")


def check(path, run="grpo:0", steps=4):
    return grid_checks.run_check("reasoning.py", path, run, steps)


@needs_pin
@pytest.mark.slow
def test_the_results_file_is_what_the_trainer_computes(tmp_path):
    """Re-train grpo, seed 0, for 4 steps under the pin: every kept number of those steps equals the
    file's. A changed file is caught."""
    done = check(RESULTS)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "grpo:0 first 4 steps: equal to the file" in done.stdout
    results = json.loads(RESULTS.read_text())
    run = next(r for r in results["runs"] if (r["arm"], r["seed"]) == ("grpo", 0))
    run["steps"]["completion_length/mean"][2] *= 1.0001
    changed = tmp_path / "reasoning.json"
    changed.write_text(json.dumps(results))
    done = check(changed)
    assert done.returncode != 0 and "completion_length/mean differ" in done.stdout
