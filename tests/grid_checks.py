"""What the tests of the variant benchmarks (benchmarks/variant_grid.py's grids: reference.py,
entropy.py, overlong.py, dynamic_sampling.py) check of each results file: that a run re-trained
under the pinned kernels reproduces it, that a changed number would be caught, that docs/training.md
quotes its final accuracies, and the grid it must hold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_edu.runtime import numerics
from hang_guard import HANG_SECONDS

ROOT = Path(__file__).resolve().parents[1]
TRAINING_DOC = ROOT / "docs" / "training.md"   # the training reference, which quotes the benchmarks
PINNED = pytest.mark.skipif(numerics.unpinnable_reason() is not None,
                            reason=f"no pinned kernels here: {numerics.unpinnable_reason()}")


def results(path: Path) -> dict:
    return json.loads(path.read_text())


def every_variant_and_seed(path: Path, benchmark, eval_every: int) -> list[dict]:
    """The file's runs: each variant x seeds 0 1 2 once, with the benchmark's variants, evaluated
    every eval_every steps to the last."""
    stored = results(path)
    assert {(r["variant"], r["seed"]) for r in stored["runs"]} == set(
        benchmark.parse_runs(None, list(benchmark.VARIANTS), [0, 1, 2]))
    assert stored["variants"] == benchmark.VARIANTS
    for run in stored["runs"]:
        assert [step for step, _ in run["eval"]] == list(range(eval_every, stored["steps"] + 1, eval_every))
        assert run["final_accuracy"] == run["eval"][-1][1]
    return stored["runs"]


def run_check(script: str, path: Path, run: str, steps: int) -> subprocess.CompletedProcess:
    """benchmarks/<script> --check `path` --runs `run` --steps `steps`, under the pinned kernels."""
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--check", str(path),
                           "--runs", run, "--steps", str(steps)], env=numerics.pinned_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=HANG_SECONDS)


def reproduces(script: str, path: Path, run: str, steps: int) -> None:
    """benchmarks/<script> --check re-trains `run` (variant:seed) for `steps` steps under the pin:
    every kept number equal to the file's."""
    done = run_check(script, path, run, steps)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert f"{run} first {steps} steps: equal to the file" in done.stdout


def catches_a_change(path: Path, benchmark, variant: str, seed: int, steps: int, key: str, change) -> None:
    """The first `steps` steps of a stored run compare equal to it, and with `change` applied to
    `key` at step 2, differ by that key only."""
    want = next(r for r in results(path)["runs"] if (r["variant"], r["seed"]) == (variant, seed))
    got = json.loads(json.dumps({"steps": {k: values[:steps] for k, values in want["steps"].items()}, "eval": []}))
    assert benchmark.differences(got, want, steps) == []
    got["steps"][key][1] = change(got["steps"][key][1])
    assert benchmark.differences(got, want, steps) == [f"{key} differs in steps 1-{steps}"]


def training_doc_quotes_final_accuracies(path: Path, benchmark) -> None:
    """docs/training.md holds each variant's final held-out accuracy as mean (min-max) over the seeds."""
    readme = " ".join(TRAINING_DOC.read_text().split())
    for variant in benchmark.VARIANTS:
        final = [r["final_accuracy"] for r in results(path)["runs"] if r["variant"] == variant]
        figure = f"{sum(final) / len(final):.3f} ({min(final):.3f}-{max(final):.3f})"
        assert figure in readme, (variant, figure)
