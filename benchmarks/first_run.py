"""The reader's first run: how many seconds of training until held-out greedy accuracy first
reaches 0.90, and where the run ends, for candidate settings of configs/cpu-tiny.toml, paired
over seeds.

    python benchmarks/first_run.py [--settings today lr5e-4 ...] [--seeds 0 1 2 3 4] [--steps 1500]
                                   [--eval-every 25] [--threads 2] [--out FILE]

Each setting (SETTINGS) is a list of overrides of configs/cpu-tiny.toml; "today" is none. Every run
trains --steps steps, unpinned (the machine's own kernels, as `make train` runs), evaluating on
the default run's held-out problems (eval_size 256) every --eval-every steps, more often than
the default's 100 so that the first crossing is seen within 25 steps.

What is timed. The training's own wall-clock: each step from the start of its rollout to the
end of its metrics line, summed, so the extra evaluations this benchmark asks for do not count.
A reader's run also spends its own evaluations (eval_every 100); `eval_seconds` says what one
costs. `seconds_to_90` is the training seconds up to the end of the first evaluated step at or
above 0.90 (None if the run never got there); `steps_to_90` that step.

The runs of a setting go one after the other, and the settings rotate from seed to seed
(seed index 0: A B C, 1: B C A, ...), so that a drift of a shared machine favours none.

Writes FILE (default benchmarks/results/first_run.json, the runs that chose make train's setting,
MAKE_TRAIN; first_run_sweep.json is the wider sweep before them, written with --out): every run's
evaluations (step, training seconds, accuracy), its seconds and steps to 0.90, its final accuracy and per-problem greedy
outcomes, and the verdicts (grpo_edu.algorithm.statistics.compare_variants) of each setting
against "today" on the final accuracy, and on how much sooner it reached 0.90 in steps and in
seconds (VALUES).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

OUT = Path(__file__).parent / "results" / "first_run.json"
TARGET = 0.90
SETTINGS: dict[str, list[str]] = {
    "today": [],
    "lr5e-4": ["learning_rate=5e-4"],
    "lr7e-4": ["learning_rate=7e-4"],
    "B8": ["prompts_per_step=8"],   # half the prompts per step: steps about twice as fast
    "lr2e-4": ["learning_rate=2e-4"],
    "beta0": ["beta=0.0"],          # no KL term, no reference forward (TRL 1.16's default, DAPO)
    "lr2e-4-beta0": ["learning_rate=2e-4", "beta=0.0"],
    "lr2.5e-4-beta0": ["learning_rate=2.5e-4", "beta=0.0"],   # make train's (MAKE_TRAIN)
}
# The setting `make train` runs, as its own file (configs/cpu-first-run.toml, which states this file's figures).
MAKE_TRAIN = "lr2.5e-4-beta0"
MAKE_TRAIN_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "cpu-first-run.toml"


def run_one(setting: str, seed: int, args) -> dict:
    """One run of `setting` on `seed`: its evaluations with the training seconds before each."""
    from variant_grid import greedy_outcomes

    from grpo_edu.training import trainer
    from grpo_edu.config import DEFAULT_CONFIG, TrainConfig

    evaluations: list[list[float]] = []
    clock = {"seconds": 0.0, "step_started": None}
    record, evaluate = trainer.record, trainer.evaluate_held_out

    def timed_evaluate(run, samples=0):
        paused = time.perf_counter()
        metrics = evaluate(run, samples)
        clock["eval"] = time.perf_counter() - paused
        return metrics

    def timed_record(run, metrics, accuracy):
        record(run, metrics, accuracy)
        now = time.perf_counter()
        clock["seconds"] += now - clock["step_started"] - clock.pop("eval", 0.0)
        if "eval/greedy_accuracy" in metrics:
            evaluations.append([metrics["step"], round(clock["seconds"], 4), metrics["eval/greedy_accuracy"]])
        clock["step_started"] = now

    with tempfile.TemporaryDirectory() as directory:
        config = TrainConfig.from_toml(DEFAULT_CONFIG, [*SETTINGS[setting], f"seed={seed}", f"steps={args.steps}",
                                                        f"eval_every={args.eval_every}", f"threads={args.threads}",
                                                        "checkpoint_every=0", "progress=false",
                                                        f"output_dir='{directory}/run'"])
        trainer.record, trainer.evaluate_held_out = timed_record, timed_evaluate
        try:
            run = trainer.set_up(config, log=lambda message: None)
            started = time.perf_counter()
            first_eval = evaluate(run)   # what one of the reader's evaluations costs
            eval_seconds = time.perf_counter() - started
            assert first_eval["eval/greedy_accuracy"] == run.start_accuracy
            clock.pop("eval", None)   # set_up's evaluation of the starting policy is not a step's
            clock["step_started"] = time.perf_counter()
            result = trainer.loop(run)
        finally:
            trainer.record, trainer.evaluate_held_out = record, evaluate
        outcomes = greedy_outcomes(result, config)
    crossing = next((e for e in evaluations if e[2] >= TARGET), None)
    return {"setting": setting, "seed": seed, "overrides": SETTINGS[setting],
            "start_accuracy": run.start_accuracy, "final_accuracy": result.summary["final_accuracy"],
            "steps_to_90": crossing[0] if crossing else None, "seconds_to_90": crossing[1] if crossing else None,
            "training_seconds": round(clock["seconds"], 4), "eval_seconds": round(eval_seconds, 4),
            "evaluations": evaluations, "greedy_correct": outcomes}


def per_setting(payload: dict, joiner: str, digits: int):
    """Each setting of the file with its seeds' seconds to 0.90, steps to 0.90 and final accuracies, each
    joined by `joiner`, and the mean final accuracy (to `digits`)."""
    for setting in payload["settings"]:
        runs = sorted((r for r in payload["runs"] if r["setting"] == setting), key=lambda r: r["seed"])
        finals = [r["final_accuracy"] for r in runs]
        yield (setting,
               joiner.join("never" if r["seconds_to_90"] is None else f"{r['seconds_to_90']:.1f}" for r in runs),
               joiner.join(str(r["steps_to_90"]) for r in runs),
               f"{joiner.join(f'{a:.{digits}f}' for a in finals)} ({statistics.mean(finals):.{digits}f})")


def summary_lines(payload: dict) -> list[str]:
    lines = [f"{'setting':<16} {'seconds to 0.90 per seed':<44} {'steps to 0.90':<32} final accuracy (mean)"]
    for setting, seconds, steps, finals in per_setting(payload, " ", 4):
        lines.append(f"{setting:<16} {seconds:<44} {steps:<32} {finals}")
    lines.append("")
    for name, verdict in payload["verdicts"].items():
        lines.append(f"{name}: {verdict['words']}")
    return lines


def markdown_rows(payload: dict) -> list[str]:
    """docs/training.md's table of the file: per setting, each seed's training seconds and steps to 0.90,
    and its final accuracies (a test keeps the doc's rows equal to these)."""
    return [f"| `{setting}` | {' '.join(payload['overrides'][setting]) or '(cpu-tiny.toml)'} | {seconds} | {steps} | "
            f"{finals} |" for setting, seconds, steps, finals in per_setting(payload, " / ", 3)]


# The verdicts' values: (name in the file, what it reads of a run). Time to 0.90 is compared as its
# negative, so that "A beats B" means A got there sooner; a run that never got there counts as
# its last evaluated step and its whole training seconds (a lower bound of its cost).
VALUES = (
    ("final accuracy", lambda run: run["final_accuracy"]),
    ("sooner to 0.90 (minus steps)", lambda run: -(run["steps_to_90"] if run["steps_to_90"] is not None
                                                  else run["evaluations"][-1][0])),
    ("sooner to 0.90 (minus training seconds)", lambda run: -(run["seconds_to_90"] if run["seconds_to_90"] is not None
                                                              else run["training_seconds"])),
)


def verdicts(runs: list[dict], settings: list[str]) -> dict:
    """Each setting against today, paired over the seeds both ran (two or more): the final accuracy
    (with each seed's per-problem comparison), and how much sooner it reached 0.90, in steps and
    in seconds."""
    from grpo_edu.algorithm.statistics import compare_variants

    seeds = {s: {r["seed"] for r in runs if r["setting"] == s} for s in settings}
    pairs = [(s, "today") for s in settings if s != "today" and len(seeds[s] & seeds["today"]) >= 2]
    out = {}
    for name, value in VALUES:
        for pair, verdict in compare_variants(runs, pairs, key="setting", value=value).items():
            if name != "final accuracy":
                verdict.pop("per_seed", None)
            out[f"{name}: {pair}"] = verdict
    return out


def write(out: Path, payload: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, separators=(",", ":")) + "\n")


def results(args, runs: list[dict]) -> dict:
    """The results file's contents, for the runs so far."""
    return {"written_by": "benchmarks/first_run.py", "steps": args.steps, "eval_every": args.eval_every,
            "threads": args.threads, "seeds": args.seeds, "target": TARGET, "settings": args.settings,
            "overrides": {s: SETTINGS[s] for s in args.settings}, "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "ATEN_CPU_CAPABILITY": os.environ.get("ATEN_CPU_CAPABILITY", ""), "machine": platform.machine(),
            "runs": runs, "verdicts": verdicts(runs, args.settings)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--merge", default=None, metavar="FILE", help="keep the runs of an earlier results file "
                        "(same --steps, --eval-every and --threads) and run only the settings it lacks")
    args = parser.parse_args(argv)
    earlier = []
    if args.merge:
        old = json.loads(Path(args.merge).read_text())
        for key in ("steps", "eval_every", "threads"):
            if old[key] != getattr(args, key):
                parser.error(f"--merge: expected a file with {key} = {getattr(args, key)}, got {old[key]}")
        earlier = [r for r in old["runs"] if r["seed"] in args.seeds]
        args.settings = [*old["settings"], *(s for s in args.settings if s not in old["settings"])]
    if "today" not in args.settings:
        parser.error(f"--settings: expected 'today' among them (every verdict is against it), got {args.settings}")
    for name in ("steps", "eval_every", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected a positive number, got {getattr(args, name)}")
    runs = list(earlier)
    done = {(r["setting"], r["seed"]) for r in earlier}
    out = Path(args.out)
    for index, seed in enumerate(args.seeds):
        order = args.settings[index % len(args.settings):] + args.settings[:index % len(args.settings)]
        for setting in order:
            if (setting, seed) in done:
                continue
            run = run_one(setting, seed, args)
            runs.append(run)
            print(f"seed {seed} {setting}: 0.90 at step {run['steps_to_90']} after {run['seconds_to_90']} s of "
                  f"training; final {run['final_accuracy']:.4f} ({run['training_seconds']:.1f} s)", flush=True)
            write(out, results(args, runs))   # after every run: a stop loses one
    payload = results(args, runs)
    write(out, payload)
    print("\n".join(summary_lines(payload)))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
