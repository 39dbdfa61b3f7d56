"""LoRA against full fine-tuning on the CPU tier's default run (configs/cpu-tiny.toml, 150 steps,
seeds 0 1 2; everything else the default config):

    full        every weight trains (lora_rank 0), learning rate 3e-4 (the default)
    lora        adapters of rank 8 (alpha 32: scale 4) on every linear layer of both decoder
                layers, 34,816 trained parameters of 376,192; learning rate 3e-3
    lora-3e-4   the same adapters at full fine-tuning's learning rate

    .venv/bin/python benchmarks/lora.py [--variants ...] [--seeds 0 1 2] [--steps 150] [--out FILE]
    .venv/bin/python benchmarks/lora.py --check FILE [--steps 4] [--runs lora:0 ...]

Writes FILE (default benchmarks/results/lora.json) after every run: per run its held-out greedy
accuracy at every evaluation (256 problems, every 25 steps) and, per step, the training
accuracy, the KL to the reference (with LoRA: the base model, the adapters off) and the gradient
norm. Run it under the book's pinned kernels (grpo_edu.runtime.numerics): chapter 11 reads the file.
--check re-trains the named runs (variant:seed) for their first --steps steps and compares every
kept number with FILE's, exactly (tests/test_lora.py runs it, pinned, for lora:0).
"""

from __future__ import annotations

from pathlib import Path

import variant_grid

OUT = Path(__file__).parent / "results" / "lora.json"
SETTINGS = {"eval_every": 25, "eval_size": 256, "checkpoint_every": 0, "progress": False}
VARIANTS = {
    "full": {},
    "lora": {"lora_rank": 8, "lora_alpha": 32.0, "learning_rate": 3e-3},
    "lora-3e-4": {"lora_rank": 8, "lora_alpha": 32.0},
}
KEPT = ("reward/accuracy", "kl", "grad_norm")
GRID = variant_grid.DefaultRunGrid(
    __doc__, OUT, VARIANTS, KEPT, SETTINGS, example="lora:0",
    pairs=(("full", "lora"), ("full", "lora-3e-4"), ("lora", "lora-3e-4")),
    describe=lambda run: (f"accuracy {run['start_accuracy']:.3f} -> {run['final_accuracy']:.3f}, "
                          f"last KL {run['steps']['kl'][-1]:.4f} in {run['seconds']:.0f} s"))
config_for, run, parse_runs, differences = GRID.config_for, GRID.run, GRID.parse_runs, GRID.differences


if __name__ == "__main__":
    GRID.main()
