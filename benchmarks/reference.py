"""The reference the KL anchors to, four ways, on the CPU tier's default run (configs/cpu-tiny.toml,
150 steps, seeds 0 1 2; everything else the default config, beta 0.04):

    frozen   the starting policy throughout (ref_sync_steps = 0)
    copy     replaced by the policy every 25 rollouts (R1's every 400 optimizer steps)
    polyak   moved toward it every 25 rollouts, ref = 0.6 x policy + 0.4 x ref (TRL's default alpha)
    ema      moved a little every rollout, ref = 0.05 x policy + 0.95 x ref

    .venv/bin/python benchmarks/reference.py [--variants ...] [--seeds 0 1 2] [--steps 150] [--out FILE]
    .venv/bin/python benchmarks/reference.py --check FILE [--steps 4] [--runs ema:0 ...]

Writes FILE (default benchmarks/results/reference.json) after every run: per run its held-out
greedy accuracy at every evaluation (256 problems, every 25 steps) and, per step, the KL, the
training accuracy and the gradient norm. Run it under the book's pinned kernels
(grpo_edu.runtime.numerics): chapter 8 reads the file. --check re-trains the named runs (variant:seed)
for their first --steps steps and compares every kept number with FILE's, exactly
(tests/test_reference_sync.py runs it, pinned, for ema:0, which averages at every step).
"""

from __future__ import annotations

from pathlib import Path

import variant_grid

OUT = Path(__file__).parent / "results" / "reference.json"
SETTINGS = {"eval_every": 25, "eval_size": 256, "checkpoint_every": 0, "progress": False}
VARIANTS = {
    "frozen": {"ref_sync_steps": 0},
    "copy": {"ref_sync_steps": 25},
    "polyak": {"ref_sync_steps": 25, "ref_mixup_alpha": 0.6},
    "ema": {"ref_sync_steps": 1, "ref_mixup_alpha": 0.05},
}
KEPT = ("kl", "reward/accuracy", "grad_norm", "entropy")
GRID = variant_grid.DefaultRunGrid(
    __doc__, OUT, VARIANTS, KEPT, SETTINGS, example="ema:0",
    pairs=(("copy", "frozen"), ("polyak", "frozen"), ("ema", "frozen")),
    describe=lambda run: (f"accuracy {run['start_accuracy']:.3f} -> {run['final_accuracy']:.3f}, "
                          f"last KL {run['steps']['kl'][-1]:.4f} in {run['seconds']:.0f} s"))
config_for, run, parse_runs, differences = GRID.config_for, GRID.run, GRID.parse_runs, GRID.differences


if __name__ == "__main__":
    GRID.main()
