"""Outcome against process supervision on the chain task (configs/cpu-chain.toml: three two-digit
numbers summed one written step at a time, the committed policy grpo_edu/assets/tiny-chain-start,
150 steps, seeds 0 1 2; everything else the CPU tier's default run):

    outcome   one reward per completion (its accuracy, the config's only reward): every token of a
              completion gets its reward's group advantage
    process   the same outcome reward at each completion's last token, and a reward at the end of
              every written step (1 right on its own, 0 wrong; grpo_edu.environment.process), normalised over
              all the group's step rewards; token t's advantage is the sum over the steps ending at
              or after t

    .venv/bin/python benchmarks/process.py [--variants ...] [--seeds 0 1 2] [--steps 150] [--out FILE]
    .venv/bin/python benchmarks/process.py --check FILE [--steps 4] [--runs process:0 ...]

Writes FILE (default benchmarks/results/process.json) after every run: per run its held-out greedy
accuracy at every evaluation (256 problems, every 25 steps) and, per step, the training accuracy,
the share of written steps that are right (logged under either supervision), the KL to the
reference and the gradient norm. Run it under the book's pinned kernels (grpo_edu.runtime.numerics):
chapter 5 reads the file. --check re-trains the named runs (variant:seed) for their first --steps
steps and compares every kept number with FILE's, exactly (tests/test_process.py runs it, pinned,
for process:0).
"""

from __future__ import annotations

from pathlib import Path

import variant_grid

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(__file__).parent / "results" / "process.json"
SETTINGS = {"eval_every": 25, "eval_size": 256, "checkpoint_every": 0, "progress": False}
VARIANTS = {"outcome": {"supervision": "outcome"}, "process": {"supervision": "process"}}
KEPT = ("reward/accuracy", "process/step_accuracy", "kl", "grad_norm")
GRID = variant_grid.DefaultRunGrid(
    __doc__, OUT, VARIANTS, KEPT, SETTINGS, example="process:0", pairs=(("process", "outcome"),), base=ROOT / "configs" / "cpu-chain.toml",
    describe=lambda run: (f"accuracy {run['start_accuracy']:.3f} -> {run['final_accuracy']:.3f}, step accuracy "
                          f"{run['steps']['process/step_accuracy'][0]:.3f} -> "
                          f"{run['steps']['process/step_accuracy'][-1]:.3f} in {run['seconds']:.0f} s"))
config_for, run, parse_runs, differences = GRID.config_for, GRID.run, GRID.parse_runs, GRID.differences


if __name__ == "__main__":
    GRID.main()
