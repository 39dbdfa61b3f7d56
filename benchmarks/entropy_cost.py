"""What entropy masking costs the update: the exact entropies need one more forward per optimizer
step (grpo_edu.training.update.entropy_pass, no backward). The default run (configs/cpu-tiny.toml), 40
steps, seed 0, this machine's own kernels; prints the median seconds of the update (time/update)
and of the whole step, per setting:

    .venv/bin/python benchmarks/entropy_cost.py [--steps 40]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from grpo_edu.config import DEFAULT_CONFIG, TrainConfig
from grpo_edu.training.metrics import step_seconds
from grpo_edu.training.trainer import train

SETTINGS = {
    "every token": {},
    "log_entropy": {"log_entropy": True},
    "q = 0.2": {"top_entropy_quantile": 0.2},
    "q = 0.2, 4 micro-batches": {"top_entropy_quantile": 0.2, "micro_batch_size": 32},
    "every token, 4 micro-batches": {"micro_batch_size": 32},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    base = TrainConfig.from_toml(DEFAULT_CONFIG).to_dict()
    print(f"{'setting':<30}{'update (s)':>12}{'step (s)':>10}")
    for name, overrides in SETTINGS.items():
        with tempfile.TemporaryDirectory() as directory:
            config = TrainConfig.from_dict({**base, "steps": args.steps, "eval_every": 10 * args.steps,
                                            "eval_size": 16, "checkpoint_every": 0, "progress": False,
                                            "output_dir": directory, **overrides})
            history = train(config, log=lambda line: None).history
        update = statistics.median(m["time/update"] for m in history)
        step = statistics.median(step_seconds(m) for m in history)
        print(f"{name:<30}{update:>12.4f}{step:>10.4f}", flush=True)


if __name__ == "__main__":
    main()
