"""The doctor's false-alarm check on whole runs: `grpo-edu train` (configs/cpu-tiny.toml, 1,500
steps; or --config, such as make train's configs/cpu-first-run.toml) for 3 seeds, diagnosed, and
their metrics kept for the tests.

    .venv/bin/python benchmarks/healthy_runs.py [--config FILE] [--seeds 0 1 2] [--out tests/data/healthy_runs]

Prints, per seed, the run's final accuracy, what the doctor finds (nothing, for a healthy run)
and what the live doctor warned during training, then a row of docs/training.md's table of the
run: the first evaluated step at or above 0.90, the final accuracy with its 95% Wilson interval,
the minutes, the median steps per second and the median milliseconds of each part of a step.
Writes OUT/seed{N}.jsonl.gz (every step's metrics, the keys the doctor reads, floats as logged)
and OUT/config.json: tests/test_diagnose.py runs the doctor on them. The committed runs:
tests/data/healthy_runs under the book's pinned kernels (`env $(python -m grpo_edu.runtime.numerics)
...`, about 6 minutes a seed on a 2-core CPU); tests/data/healthy_runs_first_run (--config
configs/cpu-first-run.toml) under the machine's own, as `make train` runs (about 1.2 minutes a seed).
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
import time
from pathlib import Path

from grpo_edu.config import TrainConfig
from grpo_edu.doctor.diagnose import diagnose, report
from grpo_edu.training.metrics import TIME_SPLIT
from grpo_edu.training.trainer import train

# What the detectors read (grpo_edu/training/diagnose.py), and the step number.
KEPT = ("step", "reward/mean", "reward/accuracy", "zero_std_groups", "completion_length/mean", "kl",
        "sampler_gap/mean_abs", "ratio/min", "ratio/max", "optimizer_steps", "loss", "grad_norm",
        "advantage/tie_spread", "skipped_update", "eval/greedy_accuracy", "truncated")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="TOML config (default: configs/cpu-tiny.toml)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="tests/data/healthy_runs")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in args.seeds:
        warnings: list[str] = []
        with tempfile.TemporaryDirectory() as directory:
            config = TrainConfig.from_toml(args.config, [f"seed={seed}", f"output_dir={directory}/run", "progress=false"])
            started = time.perf_counter()
            result = train(config, log=lambda line: warnings.append(line) if line.startswith("warning") else None)
            minutes = (time.perf_counter() - started) / 60
        findings = diagnose(result.history, config.to_dict())
        print(f"seed {seed}: {len(result.history)} steps in {minutes:.1f} min, held-out accuracy "
              f"{result.summary['start_accuracy']:.3f} -> {result.summary['final_accuracy']:.3f}; doctor: "
              f"{report(findings, len(result.history))}; live warnings: {len(warnings)}")
        for line in warnings:
            print(f"  {line}")
        summary = result.summary
        first = next((step for step, accuracy in summary["eval_curve"] if accuracy >= 0.90), None)
        low, high = summary["final_accuracy_interval_95"]
        split = " / ".join(f"{1000 * summary['time_split_median'][key]:.0f}" for key in TIME_SPLIT)
        rows.append(f"| {seed} | {first} | {summary['final_accuracy']:.3f} [{low:.3f}, {high:.3f}] | {minutes:.1f} | "
                    f"{summary['median_steps_per_second']:.1f} | {split} |")
        kept = [{k: m[k] for k in KEPT if k in m} for m in result.history]
        with gzip.open(out / f"seed{seed}.jsonl.gz", "wt") as f:
            f.writelines(json.dumps(m) + "\n" for m in kept)
        config_dict = config.to_dict()
        config_dict.pop("seed")
        config_dict.pop("output_dir")
        (out / "config.json").write_text(json.dumps(config_dict, indent=2) + "\n")
    print(f"| seed | first step >= 0.90 | final [95% interval] | minutes | steps/s (median) | "
          f"ms per step: {' / '.join(TIME_SPLIT)} |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
