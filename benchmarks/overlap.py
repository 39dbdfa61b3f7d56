"""What sampling in the background (config key rollout_overlap) buys on this machine: the
default task with rollout_lag = 1, trained with the sampler beside the update and without,
under OpenMP's default (spinning) wait policy and with OMP_WAIT_POLICY=PASSIVE, each in a
fresh process; the machine's own kernels (a speed measurement, not the book's pin).

    .venv/bin/python benchmarks/overlap.py [--steps 60] [--threads 2] [--repeats 2] [--out FILE]

Prints, per setting, the median wall-clock seconds per training step (the loop's own steps:
rollout, scoring, update; no evaluation), the median time of each phase, and the final
weights' digest (with and without overlap they must be the same run: the digests agree).
Writes FILE (default benchmarks/results/overlap.json): the settings, the machine, the figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).parent / "results" / "overlap.json"
SETTINGS = ["rollout_lag=1", "eval_every=100000", "eval_size=16", "checkpoint_every=0", "progress=false"]
CASES = {   # name: (rollout_overlap, OMP_WAIT_POLICY or None for OpenMP's default)
    "sequential": (False, None),
    "overlap": (True, None),
    "sequential, passive": (False, "PASSIVE"),
    "overlap, passive": (True, "PASSIVE"),
}


def one_run(steps: int, threads: int, overlap: bool) -> dict:
    """Train in this process (the child): per-step wall times, phase times, the weights' digest."""
    import time

    from grpo_edu.config import DEFAULT_CONFIG, TrainConfig
    from grpo_edu.training.trainer import train

    with tempfile.TemporaryDirectory() as out:
        config = TrainConfig.from_toml(DEFAULT_CONFIG, SETTINGS + [
            f"steps={steps}", f"threads={threads}", f"rollout_overlap={str(overlap).lower()}", f"output_dir='{out}'"])
        stamps = []
        result = train(config, log=lambda line: stamps.append(time.perf_counter()))
    digest = hashlib.sha256()
    for tensor in result.policy.state_dict().values():
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    history = result.history
    return {"median_steps_per_second": result.summary["median_steps_per_second"],
            "phase_median_seconds": {phase: statistics.median(m[f"time/{phase}"] for m in history[2:])
                                     for phase in ("rollout", "scoring", "update")},
            "weights": digest.hexdigest()[:16]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="runs per case, interleaved; the median is kept")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--child", choices=["on", "off"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_run(args.steps, args.threads, args.child == "on")))
        return
    runs = {name: [] for name in CASES}
    for _ in range(args.repeats):
        for name, (overlap, wait) in CASES.items():
            env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
            if wait:
                env["OMP_WAIT_POLICY"] = wait
            done = subprocess.run([sys.executable, __file__, "--child", "on" if overlap else "off",
                                   "--steps", str(args.steps), "--threads", str(args.threads)],
                                  env=env, capture_output=True, text=True, check=True)
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"  {name}: {runs[name][-1]['median_steps_per_second']:.2f} steps/s", flush=True)
    figures = {}
    for name, results in runs.items():
        rate = statistics.median(r["median_steps_per_second"] for r in results)
        figures[name] = {"seconds_per_step": 1 / rate,
                         "phase_median_seconds": {p: statistics.median(r["phase_median_seconds"][p] for r in results)
                                                  for p in ("rollout", "scoring", "update")},
                         "weights": sorted({r["weights"] for r in results})}
    print(f"\nrollout_lag = 1, {args.steps} steps, threads = {args.threads}, {os.cpu_count()} cores, "
          f"median of {args.repeats} runs each")
    print(f"{'case':<22}{'s/step':>8}{'rollout':>9}{'scoring':>9}{'update':>9}  weights")
    for name, f in figures.items():
        p = f["phase_median_seconds"]
        print(f"{name:<22}{f['seconds_per_step']:>8.3f}{p['rollout']:>9.3f}{p['scoring']:>9.3f}{p['update']:>9.3f}"
              f"  {', '.join(f['weights'])}")
    args.out.write_text(json.dumps({"settings": {"steps": args.steps, "threads": args.threads,
                                                 "repeats": args.repeats, "config": SETTINGS},
                                    "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                                                "processor": platform.processor()},
                                    "figures": figures}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
