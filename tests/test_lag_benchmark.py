"""benchmarks/lag.py and its results file (benchmarks/results/lag.json), which chapter 12 reads:
the grid it holds, and that it is what the trainer computes (one run re-trained, pinned)."""

import json
import sys
from pathlib import Path

import pytest

import grid_checks

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "lag.json"
sys.path.insert(0, str(ROOT / "benchmarks"))
import lag  # noqa: E402

needs_pin = grid_checks.PINNED


def test_the_results_file_holds_the_grid():
    results = json.loads(RESULTS.read_text())
    keys = {(r["correction"], r["lag"], r["seed"]) for r in results["runs"]}
    grid = set(lag.parse_runs(None, list(lag.CORRECTIONS), list(lag.LAGS), [0, 1, 2]))
    pushed = set(lag.parse_runs(lag.PUSHED, None, None, None))
    assert keys == grid | pushed, f"missing {sorted(grid | pushed - keys)}, not asked for {sorted(keys - grid - pushed)}"
    assert results["corrections"] == lag.CORRECTIONS and results["seeds"] == [0, 1, 2]
    for run in results["runs"]:
        assert [step for step, _ in run["eval"]] == list(range(25, results["steps"] + 1, 25))
        assert run["final_accuracy"] == run["eval"][-1][1]
        assert all(len(values) == results["steps"] for values in run["steps"].values())
        assert run["steps"]["staleness"] == ([float(min(t, run["lag"])) for t in range(results["steps"])]
                                             if run["lag"] else [None] * results["steps"])


def test_each_correction_is_the_config_it_says():
    configs = {name: lag.config_for(name, 4, 0, 10, "unused") for name in lag.CORRECTIONS}
    assert configs["none"].off_policy.old_logprobs == "proximal" and not configs["none"].off_policy.tis_cap
    assert configs["none"].off_policy.is_mask == "none" and configs["clip"].off_policy.old_logprobs == "recomputed"
    assert configs["tis"].off_policy.tis_cap == 2.0 and configs["token_mask"].off_policy.is_mask == "token"
    assert configs["sequence_mask"].off_policy.is_mask == "sequence" and configs["sequence_mask"].off_policy.is_mask_band == [0.8, 1.25]
    assert all(c.off_policy.rollout_lag == 4 and c.optimisation.steps == 10 for c in configs.values())


def test_bad_runs_are_named():
    with pytest.raises(SystemExit, match="--runs: expected correction:lag:seed"):
        lag.parse_runs(["clip:4"], None, None, None)


def check(path, run="tis:4:0", steps=8):
    return grid_checks.run_check("lag.py", path, run, steps)


@needs_pin
@pytest.mark.slow
def test_the_results_file_is_what_the_trainer_computes(tmp_path):
    """Re-train tis, k = 4, seed 0, for 8 steps under the pin: every kept number of those steps
    equals the file's (the staleness reaching 4, the weights it truncated). A changed file is caught."""
    done = check(RESULTS)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "tis:4:0 first 8 steps: equal to the file" in done.stdout
    results = json.loads(RESULTS.read_text())
    run = next(r for r in results["runs"] if (r["correction"], r["lag"], r["seed"]) == ("tis", 4, 0))
    run["steps"]["is_ratio/max"][5] *= 1.0001
    changed = tmp_path / "lag.json"
    changed.write_text(json.dumps(results))
    done = check(changed)
    assert done.returncode != 0 and "is_ratio/max differs in steps 1-8" in done.stdout


def test_the_doctor_reads_the_uncorrected_lag_and_nothing_else_in_the_grid():
    """On every run of the file (its kept keys, as metrics.jsonl holds them): stale_rollouts fires
    exactly on the uncorrected runs from k = 2 (where every seed ends below every synchronous one),
    the k = 64 run that learns nothing included, and no detector fires on any other run: the
    existing ones miss the lag."""
    from grpo_edu.doctor.diagnose import diagnose
    results = json.loads(RESULTS.read_text())
    synchronous = [r["final_accuracy"] for r in results["runs"] if r["lag"] == 0]
    for run in results["runs"]:
        history = [{"step": i + 1, **{k: v[i] for k, v in run["steps"].items() if v[i] is not None}}
                   for i in range(results["steps"])]
        config = lag.config_for(run["correction"], run["lag"], run["seed"], results["steps"], "unused").to_dict()
        found = [f.detector for f in diagnose(history, config)]
        uncorrected_stale = run["correction"] == "none" and run["lag"] >= 2
        assert found == (["stale_rollouts"] if uncorrected_stale else []), (run["correction"], run["lag"], found)
        if uncorrected_stale:
            assert run["final_accuracy"] < min(synchronous)
    broken = next(r for r in results["runs"] if (r["correction"], r["lag"]) == ("none", 64))
    assert broken["final_accuracy"] - broken["start_accuracy"] < 0.05   # 150 updates, nothing learned


HELD_OUT = ROOT / "benchmarks" / "results" / "lag_held_out.json"


def test_held_out_seeds_test_the_stale_threshold_it_was_not_tuned_on():
    """lag_held_out.json: seeds 3-5, uncorrected, k = 1 and 2 (lag.py --seeds 3 4 5 --lags 1 2
    --corrections none), none of them in the grid the threshold was read off. stale_rollouts
    flags every k = 2 run and no k = 1 run, and nothing else fires."""
    from grpo_edu.doctor.diagnose import diagnose
    held_out = json.loads(HELD_OUT.read_text())
    grid_seeds = json.loads(RESULTS.read_text())["seeds"]
    assert {(r["correction"], r["lag"], r["seed"]) for r in held_out["runs"]} == {
        ("none", k, s) for k in (1, 2) for s in (3, 4, 5)}
    assert not set(held_out["seeds"]) & set(grid_seeds) and held_out["corrections"] == lag.CORRECTIONS
    assert held_out["steps"] == json.loads(RESULTS.read_text())["steps"]
    for run in held_out["runs"]:
        history = [{"step": i + 1, **{k: v[i] for k, v in run["steps"].items() if v[i] is not None}}
                   for i in range(held_out["steps"])]
        config = lag.config_for(run["correction"], run["lag"], run["seed"], held_out["steps"], "unused").to_dict()
        assert [f.detector for f in diagnose(history, config)] == (["stale_rollouts"] if run["lag"] == 2 else [])
    doc = " ".join((ROOT / "docs" / "training.md").read_text().split())
    assert "`benchmarks/results/lag_held_out.json`) fall on the same sides of it: no K = 1 run flagged, every K = 2 run flagged" in doc


@needs_pin
def test_a_held_out_run_is_what_the_trainer_computes():
    done = check(HELD_OUT, run="none:2:3", steps=4)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "none:2:3 first 4 steps: equal to the file" in done.stdout


def test_the_training_doc_table_is_the_file_s_means():
    results = json.loads(RESULTS.read_text())
    readme = (ROOT / "docs" / "training.md").read_text()
    table = readme[readme.index("| K | none | clip | tis | token mask | sequence mask |"):]
    rows = []
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    names = list(lag.CORRECTIONS)
    assert [int(row.split("|")[1]) for row in rows] == [k for k in results["lags"] if k]
    for row in rows:
        cells = [c.strip() for c in row.split("|")[1:-1]]
        k = int(cells[0])
        for name, cell in zip(names, cells[1:]):
            finals = [r["final_accuracy"] for r in results["runs"] if (r["correction"], r["lag"]) == (name, k)]
            assert cell == f"{sum(finals) / len(finals):.3f}", (k, name)
    synchronous = [r["final_accuracy"] for r in results["runs"] if r["lag"] == 0]
    assert f"(synchronous: {sum(synchronous) / len(synchronous):.3f})" in readme
