"""benchmarks/pinned_hash.py: the same pinned run gives the same hash; another setting another."""

import re
import subprocess
import sys
from pathlib import Path

import grid_checks
from grpo_edu.runtime import numerics
from hang_guard import HANG_SECONDS

ROOT = Path(__file__).resolve().parents[1]


def digest(*argv):
    done = subprocess.run([sys.executable, "benchmarks/pinned_hash.py", "--steps", "2", *argv], cwd=ROOT,
                          env=numerics.pinned_env(), capture_output=True, text=True, timeout=HANG_SECONDS)
    assert done.returncode == 0, done.stderr[-2000:]
    return re.search(r"weights sha256 ([0-9a-f]{64})", done.stdout).group(1)


@grid_checks.PINNED
def test_a_pinned_run_hashes_the_same_twice_and_a_changed_setting_differently():
    first = digest()
    assert digest() == first
    assert digest("--set", "learning_rate=1e-3") != first
