"""What LoRA costs and saves on the CPU tier: the default run (configs/cpu-tiny.toml), 40 steps,
seed 0, this machine's own kernels, trained whole and with adapters (rank 8 and 32, every
projection). Prints, per setting, the median seconds of the rollout (the fused sampler merges
W + (alpha / r) B A once per rollout), of the update (the fused forward merges per micro-batch; the
reference's forward is the policy's with the adapters off) and of the whole step, and the bytes the
trainer holds (grpo_edu.runtime.distributed.memory_bytes: weights, gradients, AdamW; and the reference):

    .venv/bin/python benchmarks/lora_cost.py [--steps 40]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from grpo_edu.config import DEFAULT_CONFIG, TrainConfig
from grpo_edu.training.metrics import step_seconds
from grpo_edu.training.trainer import train

SETTINGS = {
    "whole model": {},
    "LoRA r = 8": {"lora_rank": 8, "learning_rate": 3e-3},
    "LoRA r = 32": {"lora_rank": 32, "learning_rate": 3e-3},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    base = TrainConfig.from_toml(DEFAULT_CONFIG).to_dict()
    print(f"{'setting':<14}{'rollout (s)':>12}{'update (s)':>12}{'step (s)':>10}{'held (bytes)':>14}"
          f"{'reference (bytes)':>19}")
    for name, overrides in SETTINGS.items():
        with tempfile.TemporaryDirectory() as directory:
            config = TrainConfig.from_dict({**base, "steps": args.steps, "eval_every": 10 * args.steps,
                                            "eval_size": 16, "checkpoint_every": 0, "progress": False,
                                            "output_dir": directory, **overrides})
            result = train(config, log=lambda line: None)
        history = result.history
        rollout = statistics.median(m["time/rollout"] for m in history)
        update = statistics.median(m["time/update"] for m in history)
        step = statistics.median(step_seconds(m) for m in history)
        held = result.summary["memory_bytes_per_rank"][0]
        reference = 0 if config.lora.lora_rank else held["parameters"]   # full fine-tuning: a float32 copy
        print(f"{name:<14}{rollout:>12.4f}{update:>12.4f}{step:>10.4f}{sum(held.values()):>14,}{reference:>19,}",
              flush=True)


if __name__ == "__main__":
    main()
