"""benchmarks/vs_trl.py runs end to end (2 steps a trainer): docs/training.md's figures against TRL
come from it, and a refactor once left it with a name it no longer imported."""

import subprocess
import sys
from pathlib import Path

from hang_guard import HANG_SECONDS

ROOT = Path(__file__).resolve().parent.parent


def test_the_benchmark_against_trl_runs_and_prints_its_table():
    result = subprocess.run([sys.executable, "benchmarks/vs_trl.py", "--steps", "2", "--seeds", "0", "--eval-size", "4",
                             "--threads", "1"], cwd=ROOT, capture_output=True, text=True, timeout=HANG_SECONDS)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split()[0] for line in result.stdout.splitlines() if line.endswith(")") and "x " in line]
    assert {"grpo_edu", "TRL"} <= set(rows), result.stdout
