"""What the variant benchmarks share (tools.py, reference.py, entropy.py, overlong.py,
dynamic_sampling.py): a grid of named variants x seeds, each run kept per step in a results file,
and --check, which re-trains named runs for their first steps and compares every kept number
with the file's, exactly. DefaultRunGrid: a grid whose variants are config keys over the CPU
tier's default run (all but tools.py), or over another config file (process.py: cpu-chain.toml).

A DefaultRunGrid run also keeps its final policy's greedy outcome on each held-out problem
(greedy_correct, 0/1 in the held-out order), and the file keeps the verdicts of the pairs its
chapter compares (grpo_edu.algorithm.statistics.compare_variants: paired over seeds, and over
the same problems within each seed). --verdicts FILE recomputes them from FILE's runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable


def parse_runs(values: list[str] | None, variants, seeds, known) -> list[tuple[str, int]]:
    """--runs values ("variant:seed") -> [(variant, seed)]; none given: every variant x seed."""
    if not values:
        return [(variant, seed) for variant in variants for seed in seeds]
    runs = []
    for value in values:
        parts = value.split(":")
        if len(parts) != 2 or parts[0] not in known or not parts[1].isdigit():
            raise SystemExit(f"--runs: expected variant:seed with a variant of {list(known)}, got {value!r}")
        runs.append((parts[0], int(parts[1])))
    return runs


def differences(got: dict, want: dict, n: int, kept) -> list[str]:
    """What differs between a run re-trained for its first n steps and the file's run."""
    diffs = [f"{key} differs in steps 1-{n}" for key in kept if got["steps"][key] != want["steps"][key][:n]]
    if got["eval"] != [e for e in want["eval"] if e[0] <= n]:
        diffs.append(f"evaluations {got['eval']} against {[e for e in want['eval'] if e[0] <= n]}")
    return diffs


def check(args, known, kept, run: Callable[..., dict]) -> None:
    """Re-train args.runs (all of the file's when none) for args.steps steps; exit 1 on a difference."""
    stored = json.loads(Path(args.check).read_text())
    by_key = {(r["variant"], r["seed"]): r for r in stored["runs"]}
    failures = 0
    for variant, seed in parse_runs(args.runs, list(stored["variants"]), stored["seeds"], known):
        diffs = differences(run(variant, seed, stored["steps"], stop_after=args.steps), by_key[(variant, seed)],
                            args.steps, kept)
        failures += bool(diffs)
        print(f"{variant}:{seed} first {args.steps} steps: " + ("equal to the file" if not diffs else "; ".join(diffs)),
              flush=True)
    if failures:
        raise SystemExit(f"{failures} run(s) differ from {args.check}")


def arguments(doc: str, known, out: Path, steps: int, check_steps: int, example: str) -> argparse.Namespace:
    """The command line both scripts take; --steps defaults to `steps`, or `check_steps` with --check."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=list(known), choices=list(known))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help=f"steps per run ({steps}), or with --check the "
                                                                f"steps re-trained ({check_steps})")
    parser.add_argument("--runs", nargs="+", help=f"variant:seed, e.g. {example} (default: every variant and seed)")
    parser.add_argument("--out", default=str(out))
    parser.add_argument("--check", metavar="FILE", help="re-train and compare with FILE instead of writing")
    parser.add_argument("--verdicts", metavar="FILE", help="recompute FILE's verdicts from its runs (no training)")
    args = parser.parse_args()
    args.steps = args.steps or (check_steps if args.check else steps)
    return args


class DefaultRunGrid:
    """Variants of the CPU tier's default run (configs/cpu-tiny.toml plus `settings`), each a few
    config keys: what benchmarks/reference.py and benchmarks/entropy.py are. `describe(run)` is
    the line printed after each run."""

    def __init__(self, doc: str, out: Path, variants: dict, kept: tuple, settings: dict, describe, example: str,
                 compared: tuple | None = None, base: Path | None = None, pairs: tuple = (),
                 values: dict[str, Callable[[dict], float]] | None = None):
        self.doc, self.out, self.variants, self.kept, self.settings = doc, out, variants, kept, settings
        self.describe, self.example, self.base = describe, example, base   # base: a config file (cpu-tiny's)
        self.compared = kept if compared is None else compared   # what --check compares (not the timings)
        # the comparisons the chapter makes: (a, b) on the final held-out accuracy, or (a, b, name) on
        # values[name] (run -> number), each a - b paired over seeds
        self.pairs = pairs
        self.values = {"final_accuracy": lambda run: run["final_accuracy"], **(values or {})}

    def config_for(self, variant: str, seed: int, steps: int, output_dir: str):
        from grpo_edu.config import DEFAULT_CONFIG, TrainConfig
        base = TrainConfig.from_toml(self.base or DEFAULT_CONFIG).to_dict()
        return TrainConfig.from_dict({**base, **self.settings, "steps": steps, "seed": seed, "output_dir": output_dir,
                                      **self.variants[variant]})

    def run(self, variant: str, seed: int, steps: int, stop_after: int | None = None) -> dict:
        import tempfile
        import time

        from grpo_edu.training.trainer import train
        with tempfile.TemporaryDirectory() as directory:
            config = self.config_for(variant, seed, steps, directory)
            started = time.perf_counter()
            result = train(config, log=lambda line: None, stop_after=stop_after)
            seconds = time.perf_counter() - started
        history = result.history
        kept = {"variant": variant, "seed": seed, "seconds": round(seconds, 1),
                "start_accuracy": result.summary["start_accuracy"],
                "final_accuracy": result.summary.get("final_accuracy"),
                "eval": [[m["step"], m["eval/greedy_accuracy"]] for m in history if "eval/greedy_accuracy" in m],
                "steps": {key: [m.get(key) for m in history] for key in self.kept}}
        if stop_after is None:
            kept["greedy_correct"] = greedy_outcomes(result, config)
        return kept

    def verdicts(self, runs: list[dict]) -> dict:
        """The pairs' verdicts from `runs` (of the pairs whose variants both ran on 2 seeds or more),
        keyed "a - b" (final held-out accuracy) or "a - b, name"."""
        from grpo_edu.algorithm.statistics import compare_variants
        seeds = {v: {r["seed"] for r in runs if r["variant"] == v} for v in self.variants}
        out = {}
        for a, b, *named in self.pairs:
            name = named[0] if named else "final_accuracy"
            if len(seeds[a] & seeds[b]) >= 2:
                [(key, entry)] = compare_variants(runs, [(a, b)], value=self.values[name]).items()
                out[key if name == "final_accuracy" else f"{key}, {name}"] = entry
        return out

    def parse_runs(self, values, variants, seeds) -> list[tuple[str, int]]:
        return parse_runs(values, variants, seeds, self.variants)

    def differences(self, got: dict, want: dict, n: int) -> list[str]:
        return differences(got, want, n, self.compared)

    def write(self, args) -> None:
        import platform

        from grpo_edu.config import DEFAULT_CONFIG
        out, runs = Path(args.out), []
        for variant, seed in self.parse_runs(args.runs, args.variants, args.seeds):
            runs.append(self.run(variant, seed, args.steps))
            print(f"{variant:<7} seed {seed}: " + self.describe(runs[-1]), flush=True)
            payload = {"steps": args.steps, "seeds": args.seeds, "variants": self.variants, "settings": self.settings,
                       "config": (self.base or DEFAULT_CONFIG).name, "machine": platform.machine(), "runs": runs,
                       "verdicts": self.verdicts(runs)}
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(payload, separators=(",", ":")) + "\n")   # after every run: a stop loses one
        print(f"wrote {out}")

    def main(self, steps: int = 150, check_steps: int = 4) -> None:
        args = arguments(self.doc, self.variants, self.out, steps=steps, check_steps=check_steps, example=self.example)
        if args.check:
            check(args, self.variants, self.compared, self.run)
        elif args.verdicts:
            rewrite_verdicts(Path(args.verdicts), self.verdicts)
        else:
            self.write(args)


def rewrite_verdicts(path: Path, verdicts: Callable[[list[dict]], dict]) -> None:
    """--verdicts FILE: FILE's verdicts recomputed from its runs by `verdicts`, nothing re-trained."""
    payload = json.loads(path.read_text())
    payload["verdicts"] = verdicts(payload["runs"])
    path.write_text(json.dumps(payload, separators=(",", ":")) + "\n")
    print(f"wrote {len(payload['verdicts'])} verdicts to {path}")


def greedy_outcomes(result, config) -> list[int]:
    """The final policy's greedy outcome (1 right, 0 wrong) on each of the run's held-out problems,
    in order: what its final evaluation averaged (checked: their mean is the run's final accuracy)."""
    from grpo_edu.environment import tasks
    from grpo_edu.training.evaluation import greedy_scores

    _, held_out = tasks.task_pools(config, result.tokenizer)
    result.policy.eval()
    outcomes = [int(accuracy) for accuracy, _ in greedy_scores(result.policy, result.tokenizer, held_out,
                                                                max_new_tokens=config.rollout.max_completion_length)]
    result.policy.train()
    final = result.summary.get("final_accuracy")
    if final is not None and sum(outcomes) / len(outcomes) != final:
        raise RuntimeError(f"the per-problem outcomes give accuracy {sum(outcomes) / len(outcomes)}, the run's "
                           f"final evaluation {final}: they must be the same evaluation")
    return outcomes
