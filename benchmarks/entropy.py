"""Entropy masking (top_entropy_quantile) on the CPU tier's default run (configs/cpu-tiny.toml,
150 steps, seeds 0 1 2; everything else the default config):

    all      every token trains its policy term (q = 1; log_entropy on, which changes nothing)
    top50    the half of each optimizer step's tokens with the highest entropy (q = 0.5)
    top20    the fifth with the highest entropy (q = 0.2: "Beyond the 80/20 Rule")
    all-beta0, top20-beta0   the same two without the KL term (beta = 0), as the paper ran DAPO:
             with beta = 0.04 the KL still pulls the masked tokens toward the reference

    .venv/bin/python benchmarks/entropy.py [--variants ...] [--seeds 0 1 2] [--steps 150] [--out FILE]
    .venv/bin/python benchmarks/entropy.py --check FILE [--steps 4] [--runs top20:0 ...]

Writes FILE (default benchmarks/results/entropy.json) after every run: per run its held-out
greedy accuracy at every evaluation (256 problems, every 25 steps) and, per step, the policy's
exact entropy (the mean over completions of their mean token entropy), the threshold, the share
of tokens that trained, the training accuracy, the KL and the gradient norm. Run it under the
book's pinned kernels (grpo_edu.runtime.numerics): chapter 8 reads the file. --check re-trains the
named runs (variant:seed) for their first --steps steps and compares every kept number with
FILE's, exactly (tests/test_entropy_mask.py runs it, pinned, for top20:0).
"""

from __future__ import annotations

from pathlib import Path

import variant_grid

OUT = Path(__file__).parent / "results" / "entropy.json"
SETTINGS = {"eval_every": 25, "eval_size": 256, "checkpoint_every": 0, "progress": False}
VARIANTS = {
    "all": {"top_entropy_quantile": 1.0, "log_entropy": True},
    "top50": {"top_entropy_quantile": 0.5},
    "top20": {"top_entropy_quantile": 0.2},
    "all-beta0": {"top_entropy_quantile": 1.0, "log_entropy": True, "beta": 0.0},
    "top20-beta0": {"top_entropy_quantile": 0.2, "beta": 0.0},
}
KEPT = ("entropy/mean", "entropy/threshold", "entropy/kept", "reward/accuracy", "kl", "grad_norm")
GRID = variant_grid.DefaultRunGrid(
    __doc__, OUT, VARIANTS, KEPT, SETTINGS, example="top20:0",
    pairs=(("top20", "all"), ("top50", "all"), ("top20-beta0", "all-beta0"), ("all-beta0", "all")),
    describe=lambda run: (f"accuracy {run['start_accuracy']:.3f} -> {run['final_accuracy']:.3f}, "
                          f"last entropy {run['steps']['entropy/mean'][-1]:.4f} in {run['seconds']:.0f} s"))
config_for, run, parse_runs, differences = GRID.config_for, GRID.run, GRID.parse_runs, GRID.differences


if __name__ == "__main__":
    GRID.main()
