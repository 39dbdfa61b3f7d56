"""Chapter 0's measured comparison: the advantage estimators of grpo_edu.algorithm.baselines, each trained
with the real trainer on the arithmetic task for 3 seeds, everything else the default config.

    .venv/bin/python benchmarks/estimators.py [--seeds 0 1 2] [--steps 300] [--out FILE]
    .venv/bin/python benchmarks/estimators.py --check FILE [--steps 20] [--runs rloo:0 ...]

The first form writes FILE (default benchmarks/results/estimators.json): the settings, and per
run its held-out greedy accuracy at every evaluation (256 problems, every 20 steps), its final
policy's greedy outcome on each problem (greedy_correct) and its reward and loss metrics at every
step; and the verdicts of the comparisons chapter 0 makes (PAIRS: each estimator against REINFORCE
and against GRPO's, paired over seeds and within each seed over the same problems; --verdicts FILE
recomputes them from FILE's runs). Run it under the book's pinned kernels
(grpo_edu.runtime.numerics), as `grpo-edu book run` runs chapters: chapter 0 reads the file.

The second re-trains the named runs (estimator:seed; all of them when not given) for the first
--steps steps and compares every logged number with FILE's, exactly: that the file is what
this code computes (tests/test_baselines.py runs it, pinned, for one run).
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import variant_grid
from grpo_edu.algorithm import baselines
from grpo_edu.config import DEFAULT_CONFIG, TrainConfig
from grpo_edu.training.trainer import train

OUT = Path(__file__).parent / "results" / "estimators.json"
SETTINGS = {"eval_every": 20, "eval_size": 256, "checkpoint_every": 0, "progress": False}
# What the file keeps of each step (and each evaluation's accuracy, at the steps that have one).
KEPT = ("reward/mean", "reward/accuracy", "zero_std_groups", "advantage/std", "loss", "grad_norm", "kl")


# The comparisons chapter 0 makes, a - b: every estimator with a baseline against REINFORCE, and
# against GRPO's group mean and std.
PAIRS = ([(name, "reinforce") for name in baselines.ESTIMATORS if name != "reinforce"]
         + [(name, "grpo") for name in baselines.ESTIMATORS if name not in ("reinforce", "grpo")])


def verdicts(runs: list[dict]) -> dict:
    """PAIRS' verdicts from `runs` (grpo_edu.algorithm.statistics.compare_variants)."""
    from grpo_edu.algorithm.statistics import compare_variants
    seeds = {}
    for r in runs:
        seeds.setdefault(r["estimator"], set()).add(r["seed"])
    pairs = [(a, b) for a, b in PAIRS if len(seeds.get(a, set()) & seeds.get(b, set())) >= 2]
    return compare_variants(runs, pairs, key="estimator")


def config_for(name: str, seed: int, steps: int, output_dir: str) -> TrainConfig:
    base = TrainConfig.from_toml(DEFAULT_CONFIG).to_dict()
    return TrainConfig.from_dict({**base, **SETTINGS, "steps": steps, "seed": seed, "output_dir": output_dir,
                                  "advantage_fn": baselines.spec(name)})


def run(name: str, seed: int, steps: int, stop_after: int | None = None) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        config = config_for(name, seed, steps, directory)
        started = time.perf_counter()
        result = train(config, log=lambda line: None, stop_after=stop_after)
        seconds = time.perf_counter() - started
    history = result.history
    outcomes = {} if stop_after is not None else {"greedy_correct": variant_grid.greedy_outcomes(result, config)}
    return {
        "estimator": name, "seed": seed, "seconds": round(seconds, 1),
        "start_accuracy": result.summary["start_accuracy"],
        "final_accuracy": result.summary.get("final_accuracy"),
        "eval": [[m["step"], m["eval/greedy_accuracy"]] for m in history if "eval/greedy_accuracy" in m],
        "steps": {key: [m.get(key) for m in history] for key in KEPT},
        **outcomes,
    }


def parse_runs(values: list[str] | None, seeds: list[int]) -> list[tuple[str, int]]:
    if not values:
        return [(name, seed) for name in baselines.ESTIMATORS for seed in seeds]
    runs = []
    for value in values:
        name, _, seed = value.partition(":")
        if name not in baselines.ESTIMATORS or not seed.isdigit():
            raise SystemExit(f"--runs: expected estimator:seed with an estimator of {list(baselines.ESTIMATORS)}, "
                             f"got {value!r}")
        runs.append((name, int(seed)))
    return runs


def write(args) -> None:
    runs = []
    for name, seed in parse_runs(args.runs, args.seeds):
        runs.append(run(name, seed, args.steps))
        last = runs[-1]
        print(f"{name:<16} seed {seed}: accuracy {last['start_accuracy']:.3f} -> {last['final_accuracy']:.3f} "
              f"in {last['seconds']:.0f} s", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"steps": args.steps, "seeds": args.seeds, "settings": SETTINGS, "config": str(DEFAULT_CONFIG.name),
               "machine": platform.machine(), "runs": runs, "verdicts": verdicts(runs)}
    out.write_text(json.dumps(payload, separators=(",", ":")) + "\n")
    print(f"wrote {out}")


def check(args) -> None:
    stored = json.loads(Path(args.check).read_text())
    by_key = {(r["estimator"], r["seed"]): r for r in stored["runs"]}
    failures = 0
    for name, seed in parse_runs(args.runs, stored["seeds"]):
        want = by_key[(name, seed)]
        got = run(name, seed, stored["steps"], stop_after=args.steps)
        n = args.steps
        diffs = [f"eval {a} != {b}" for a, b in zip(got["eval"], want["eval"]) if a != b]
        if len(got["eval"]) != len([e for e in want["eval"] if e[0] <= n]):
            diffs.append(f"evaluations {got['eval']} against {[e for e in want['eval'] if e[0] <= n]}")
        for key in KEPT:
            if got["steps"][key] != want["steps"][key][:n]:
                diffs.append(f"{key} differs in steps 1-{n}")
        failures += bool(diffs)
        print(f"{name}:{seed} first {n} steps: " + ("equal to the file" if not diffs else "; ".join(diffs)), flush=True)
    if failures:
        raise SystemExit(f"{failures} run(s) differ from {args.check}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="steps per run (300), or with --check the "
                                                                "steps re-trained (20)")
    parser.add_argument("--runs", nargs="+", help="estimator:seed, e.g. rloo:0 (default: every estimator and seed)")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--check", metavar="FILE", help="re-train and compare with FILE instead of writing")
    parser.add_argument("--verdicts", metavar="FILE", help="recompute FILE's verdicts from its runs (no training)")
    args = parser.parse_args()
    if args.verdicts:
        variant_grid.rewrite_verdicts(Path(args.verdicts), verdicts)
    elif args.check:
        args.steps = args.steps or 20
        check(args)
    else:
        args.steps = args.steps or 300
        write(args)


if __name__ == "__main__":
    main()
