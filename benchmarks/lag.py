"""Chapter 12's measurement: rollouts that lag by k updates (config key rollout_lag), with each
correction for the staleness, on the default task, 3 seeds; everything else the default config.

    .venv/bin/python benchmarks/lag.py [--lags 0 1 2 4 8 16] [--corrections none clip ...]
                                       [--seeds 0 1 2] [--steps 150] [--runs ...] [--out FILE]
    .venv/bin/python benchmarks/lag.py --check FILE [--steps 10] [--runs clip:4:0 ...]

The corrections (CORRECTIONS): "none" trains on the stale rollout as if the current policy had
sampled it (pi_old = the policy at the update, old_logprobs = "proximal": ratio 1, no weight);
"clip" takes pi_old = the policy that sampled (old_logprobs = "recomputed"), so the clipped
ratio sees the staleness; "tis", "token_mask" and "sequence_mask" keep the proximal pi_old and
weigh each token by r = pi_now / pi_sampler (grpo_edu.algorithm.offpolicy): truncated at 2, masked
outside [0.5, 2] per token, or per response by r's geometric mean outside [0.8, 1.25]. At
k = 0 there is no staleness to correct: "none" and "clip" are the same run bit for bit
(tests/test_offpolicy.py), and the weights of the other three differ from 1 only by the
sampler's rounding (the CPU tier's sampler gap, ~1e-7), so the grid trains k = 0 once, as
"clip" (--runs adds any other run).

The first form writes FILE (default benchmarks/results/lag.json): the settings, and per run
its held-out greedy accuracy at every evaluation (256 problems, every 25 steps), its final
policy's greedy outcome on each problem (greedy_correct) and the metrics that show the staleness
at every step; and the verdicts of the comparisons chapter 12 makes (PAIRS: paired over seeds,
and within each seed over the same problems; --verdicts FILE recomputes them from FILE's runs). Run it under the book's pinned kernels
(grpo_edu.runtime.numerics), as `grpo-edu book run` runs chapters: chapter 12 reads the file.

The second re-trains the named runs (correction:lag:seed; all when not given) for the first
--steps steps and compares every kept number with FILE's, exactly (tests/test_lag_benchmark.py
runs it, pinned, for one run).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import variant_grid
from grpo_edu.config import DEFAULT_CONFIG, TrainConfig
from grpo_edu.training.trainer import train

OUT = Path(__file__).parent / "results" / "lag.json"
SETTINGS = {"eval_every": 25, "eval_size": 256, "checkpoint_every": 0, "progress": False}
LAGS = (0, 1, 2, 4, 8, 16)
CORRECTIONS = {
    "none": {"old_logprobs": "proximal"},
    "clip": {"old_logprobs": "recomputed"},
    "tis": {"old_logprobs": "proximal", "tis_cap": 2.0},
    "token_mask": {"old_logprobs": "proximal", "is_mask": "token", "is_mask_band": [0.5, 2.0]},
    "sequence_mask": {"old_logprobs": "proximal", "is_mask": "sequence", "is_mask_band": [0.8, 1.25]},
}
# Beyond the grid, seed 0 only: k pushed until training breaks (chapter 12, section 4), written with
#   benchmarks/lag.py --runs none:32:0 none:64:0 clip:32:0 clip:64:0 tis:64:0
PUSHED = ["none:32:0", "none:64:0", "clip:32:0", "clip:64:0", "tis:64:0"]
# What the file keeps of each step (absent from a step: None).
KEPT = ("reward/accuracy", "kl", "grad_norm", "entropy", "staleness", "ratio/min", "ratio/max",
        "clip_ratio/region", "sampler_gap/mean_abs", "sampler_gap/max_ratio", "is_ratio/min", "is_ratio/max",
        "tis/truncated", "is/masked", "zero_std_groups", "completion_length/mean", "truncated")


# The comparisons chapter 12 makes, a - b, each run named correction:lag: no correction against the
# synchronous run, each correction against none at the same lag, and TIS against the clip at k = 16.
PAIRS = ([(f"none:{k}", "clip:0") for k in LAGS[1:]]
         + [(f"{c}:{k}", f"none:{k}") for k in LAGS[1:] for c in CORRECTIONS if c != "none"]
         + [("tis:16", "clip:16")])


def verdicts(runs: list[dict]) -> dict:
    """PAIRS' verdicts from `runs` (grpo_edu.algorithm.statistics.compare_variants), of the pairs
    both of whose runs are there for 2 seeds or more."""
    from grpo_edu.algorithm.statistics import compare_variants
    named = [{**r, "variant": f"{r['correction']}:{r['lag']}"} for r in runs]
    seeds = {}
    for r in named:
        seeds.setdefault(r["variant"], set()).add(r["seed"])
    pairs = [(a, b) for a, b in PAIRS if len(seeds.get(a, set()) & seeds.get(b, set())) >= 2]
    return compare_variants(named, pairs)


def config_for(correction: str, lag: int, seed: int, steps: int, output_dir: str) -> TrainConfig:
    base = TrainConfig.from_toml(DEFAULT_CONFIG).to_dict()
    return TrainConfig.from_dict({**base, **SETTINGS, "steps": steps, "seed": seed, "output_dir": output_dir,
                                  "rollout_lag": lag, **CORRECTIONS[correction]})


def run(correction: str, lag: int, seed: int, steps: int, stop_after: int | None = None) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        config = config_for(correction, lag, seed, steps, directory)
        started = time.perf_counter()
        result = train(config, log=lambda line: None, stop_after=stop_after)
        seconds = time.perf_counter() - started
    history = result.history
    outcomes = {} if stop_after is not None else {"greedy_correct": variant_grid.greedy_outcomes(result, config)}
    return {
        "correction": correction, "lag": lag, "seed": seed, "seconds": round(seconds, 1),
        "start_accuracy": result.summary["start_accuracy"],
        "final_accuracy": result.summary.get("final_accuracy"),
        "final_accuracy_interval_95": result.summary.get("final_accuracy_interval_95"),
        # seconds per step in each phase (median): not compared by --check, timings are not reproducible
        "time_split": {phase: _median([m[f"time/{phase}"] for m in history if f"time/{phase}" in m])
                       for phase in ("rollout", "scoring", "update")},
        "eval": [[m["step"], m["eval/greedy_accuracy"]] for m in history if "eval/greedy_accuracy" in m],
        "steps": {key: [m.get(key) for m in history] for key in KEPT},
        **outcomes,
    }


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 5) if values else None


def parse_runs(values: list[str] | None, corrections, lags, seeds) -> list[tuple[str, int, int]]:
    if not values:
        return [(c, k, s) for k in lags for c in corrections for s in seeds if k > 0 or c == "clip"]
    runs = []
    for value in values:
        parts = value.split(":")
        if len(parts) != 3 or parts[0] not in CORRECTIONS or not parts[1].isdigit() or not parts[2].isdigit():
            raise SystemExit(f"--runs: expected correction:lag:seed with a correction of {list(CORRECTIONS)}, "
                             f"got {value!r}")
        runs.append((parts[0], int(parts[1]), int(parts[2])))
    return runs


def write(args) -> None:
    out = Path(args.out)
    runs = []
    if args.runs and out.exists():   # adding runs to a file: keep the others
        stored = json.loads(out.read_text())
        if stored["steps"] != args.steps:
            raise SystemExit(f"--runs: {out} holds {stored['steps']}-step runs, not {args.steps}")
        wanted = set(parse_runs(args.runs, None, None, None))
        runs = [r for r in stored["runs"] if (r["correction"], r["lag"], r["seed"]) not in wanted]
    for correction, lag, seed in parse_runs(args.runs, args.corrections, args.lags, args.seeds):
        runs.append(run(correction, lag, seed, args.steps))
        last = runs[-1]
        print(f"{correction:<14} k={lag:<3} seed {seed}: accuracy {last['start_accuracy']:.3f} -> "
              f"{last['final_accuracy']:.3f} in {last['seconds']:.0f} s", flush=True)
        payload = {"steps": args.steps, "seeds": args.seeds, "lags": args.lags, "corrections": CORRECTIONS,
                   "settings": SETTINGS, "config": str(DEFAULT_CONFIG.name), "machine": platform.machine(),
                   "runs": runs, "verdicts": verdicts(runs)}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(payload, separators=(",", ":")) + "\n")   # after every run: a stop loses one
    print(f"wrote {out}")


def check(args) -> None:
    stored = json.loads(Path(args.check).read_text())
    by_key = {(r["correction"], r["lag"], r["seed"]): r for r in stored["runs"]}
    failures = 0
    for correction, lag, seed in parse_runs(args.runs, stored["corrections"], stored["lags"], stored["seeds"]):
        want = by_key[(correction, lag, seed)]
        n = args.steps
        got = run(correction, lag, seed, stored["steps"], stop_after=n)
        diffs = [f"eval {a} != {b}" for a, b in zip(got["eval"], want["eval"]) if a != b]
        if len(got["eval"]) != len([e for e in want["eval"] if e[0] <= n]):
            diffs.append(f"evaluations {got['eval']} against {[e for e in want['eval'] if e[0] <= n]}")
        for key in KEPT:
            if got["steps"][key] != want["steps"][key][:n]:
                diffs.append(f"{key} differs in steps 1-{n}")
        failures += bool(diffs)
        print(f"{correction}:{lag}:{seed} first {n} steps: " + ("equal to the file" if not diffs else "; ".join(diffs)),
              flush=True)
    if failures:
        raise SystemExit(f"{failures} run(s) differ from {args.check}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lags", type=int, nargs="+", default=list(LAGS))
    parser.add_argument("--corrections", nargs="+", default=list(CORRECTIONS), choices=list(CORRECTIONS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="steps per run (150), or with --check the "
                                                                "steps re-trained (10)")
    parser.add_argument("--runs", nargs="+", help="correction:lag:seed, e.g. clip:4:0 (default: the whole grid)")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--check", metavar="FILE", help="re-train and compare with FILE instead of writing")
    parser.add_argument("--verdicts", metavar="FILE", help="recompute FILE's verdicts from its runs (no training)")
    args = parser.parse_args()
    if args.verdicts:
        variant_grid.rewrite_verdicts(Path(args.verdicts), verdicts)
    elif args.check:
        args.steps = args.steps or 10
        check(args)
    else:
        args.steps = args.steps or 150
        write(args)


if __name__ == "__main__":
    main()
