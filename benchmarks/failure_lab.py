"""The failure lab (chapter 7) beyond the chapter's budget: its runs on more seeds, and the
length-bias experiment the chapter only cites.

    .venv/bin/python benchmarks/failure_lab.py [--seeds 0 1 2] [--runs NAME ...]
    .venv/bin/python benchmarks/failure_lab.py --length [--steps 200]
    .venv/bin/python benchmarks/failure_lab.py --mystery grpo_edu/exercises/data/ch07_mystery.json [--configs-only]

The first form trains each lab run (grpo_edu/lab/__init__.py) for each seed and prints what the doctor
finds against what the run expects: how robust each detector's threshold is beyond the
chapter's seed. The second trains grpo and dr_grpo with max_completion_length = 48 and
temperature = 1.5 (padding the reasoning is free there) and prints the mean completion length
over the first and last 10 steps, and the doctor's length_drift finding, for each. The third
writes exercise 7.1's mystery runs: lab runs at seed 1 (not the chapter's seed 0), their
metrics (the keys grpo_edu.exercises.ch07.KEYS) and their config.json (what the doctor reads;
an injected fault is not in it), under letters in a fixed shuffled order.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from grpo_edu import lab
from grpo_edu.config import TrainConfig
from grpo_edu.doctor.diagnose import diagnose
from grpo_edu.training.trainer import train


def lab_runs(seeds: list[int], names: list[str]) -> None:
    for seed in seeds:
        for name in names:
            with tempfile.TemporaryDirectory() as root:
                started = time.perf_counter()
                result = lab.run(name, root, seed=seed)
            found = {f.detector for f in diagnose(result.history, result.summary["config"])}
            spec = lab.RUNS[name]
            verdict = ("as expected" if spec.diagnosed_as_expected(found) else
                       f"EXPECTED {sorted(spec.expected)} (may also: {sorted(spec.also)})")
            print(f"seed {seed}  {name:<17} {time.perf_counter() - started:5.1f} s  accuracy "
                  f"{result.summary['start_accuracy']:.3f} -> {result.summary['final_accuracy']:.3f}  "
                  f"found {sorted(found)}  {verdict}", flush=True)


def length_experiment(steps: int) -> None:
    base = lab.RUNS["healthy"].config("unused").to_dict()
    for loss_type in ("grpo", "dr_grpo"):
        with tempfile.TemporaryDirectory() as root:
            config = TrainConfig.from_dict({**base, "steps": steps, "max_completion_length": 48,
                                            "temperature": 1.5, "loss_type": loss_type, "output_dir": root})
            result = train(config, log=lambda line: None)
        early, late = lab.early_late(result.history, "completion_length/mean")
        drift = [f for f in diagnose(result.history, config.to_dict()) if f.detector == "length_drift"]
        print(f"{loss_type:<8} {steps} steps: mean completion length {early:.2f} (first 10 steps) -> {late:.2f} "
              f"(last 10); accuracy {result.summary['start_accuracy']:.3f} -> {result.summary['final_accuracy']:.3f}; "
              f"length_drift: {'found' if drift else 'not found'}", flush=True)


def mystery(path: str, configs_only: bool = False) -> None:
    """Exercise 7.1's data: each mystery run's metrics and config.json. configs_only: keep the
    file's metrics and write the configs again (after a config key is added: the runs'
    metrics do not change, their config.json gains the key)."""
    import json

    from grpo_edu.exercises import ch07
    runs, configs = {}, {}
    if configs_only:
        with open(path) as f:
            runs = json.load(f)["metrics"]
    with tempfile.TemporaryDirectory() as root:
        for run, name in ch07._answer_key().items():   # the checker's letters for the runs
            if not configs_only:
                result = lab.run(name, root, seed=1)
                runs[run] = [{k: round(m[k], 6) for k in ch07.KEYS if k in m} for m in result.history]
                print(f"{run}: {name}, {len(result.history)} steps", flush=True)
            # the run's config.json, what the doctor reads beside the metrics; its output_dir
            # named by the letter (the lab's directory would name the failure)
            configs[run] = lab.RUNS[name].config(f"runs/mystery-{run[-1]}", seed=1).to_dict()
    with open(path, "w") as f:
        json.dump({"metrics": runs, "configs": configs}, f, separators=(",", ":"))
        f.write("\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--runs", nargs="+", default=list(lab.RUNS), choices=list(lab.RUNS))
    parser.add_argument("--length", action="store_true", help="the length-bias experiment instead")
    parser.add_argument("--steps", type=int, default=200, help="--length: training steps per run")
    parser.add_argument("--mystery", metavar="PATH", help="write exercise 7.1's mystery runs to PATH instead")
    parser.add_argument("--configs-only", action="store_true",
                        help="with --mystery: keep PATH's metrics, write the runs' configs again")
    args = parser.parse_args()
    if args.mystery:
        mystery(args.mystery, args.configs_only)
    elif args.length:
        length_experiment(args.steps)
    else:
        lab_runs(args.seeds, args.runs)


if __name__ == "__main__":
    main()
