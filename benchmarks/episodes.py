"""What a multi-turn episode costs against a single-turn completion on this CPU: the default
task trained with the committed starting policy, single-turn and as episodes with an
environment that answers at the digit 1 (tests/episode_envs.py:Echo; the policy writes a 1 in
most completions), max_turns 3, the same token limit; the machine's own kernels (a speed
measurement, not the book's pin).

    .venv/bin/python benchmarks/episodes.py [--steps 20] [--threads 2] [--out FILE]

Prints, per setting, the median seconds of each phase of a step (rollout, scoring, update)
and, for the episodes, their mean policy turns and environment tokens. Writes FILE (default
benchmarks/results/episodes.json): the settings, the machine, the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(__file__).parent / "results" / "episodes.json"
ECHO = str(ROOT / "tests" / "episode_envs.py") + ":Echo"
SETTINGS = ["eval_every=100000", "eval_size=16", "checkpoint_every=0", "progress=false", "max_completion_length=24"]
CASES = {"single-turn": [], "episodes": [f"environment={json.dumps(ECHO)}", "max_turns=3"]}


def one_run(steps: int, threads: int, extra: list[str]) -> dict:
    from grpo_edu.config import DEFAULT_CONFIG, TrainConfig
    from grpo_edu.training.trainer import train

    with tempfile.TemporaryDirectory() as out:
        config = TrainConfig.from_toml(DEFAULT_CONFIG, SETTINGS + extra + [
            f"steps={steps}", f"threads={threads}", f"output_dir={json.dumps(out)}"])
        history = train(config, log=lambda line: None).history
    measured = history[2:] if len(history) > 4 else history   # the first steps warm the caches
    figures = {"phase_median_seconds": {phase: statistics.median(m[f"time/{phase}"] for m in measured)
                                        for phase in ("rollout", "scoring", "update")},
               "policy_tokens_per_completion": statistics.mean(m["completion_length/mean"] for m in history)}
    if "episode/turns" in history[0]:
        figures["turns_per_episode"] = statistics.mean(m["episode/turns"] for m in history)
        figures["environment_tokens_per_episode"] = statistics.mean(m["episode/env_tokens"] for m in history)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    figures = {name: one_run(args.steps, args.threads, extra) for name, extra in CASES.items()}
    for name, f in figures.items():
        phases = "   ".join(f"{p} {t:.3f} s" for p, t in f["phase_median_seconds"].items())
        turns = (f"   {f['turns_per_episode']:.2f} turns, {f['environment_tokens_per_episode']:.2f} environment "
                 f"tokens per episode" if "turns_per_episode" in f else "")
        print(f"{name:<12} {phases}   {f['policy_tokens_per_completion']:.2f} policy tokens{turns}")
    single, multi = (figures[name]["phase_median_seconds"]["rollout"] for name in ("single-turn", "episodes"))
    print(f"an episode's rollout costs x{multi / single:.2f} a single-turn one's")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "settings": {"steps": args.steps, "threads": args.threads, "overrides": SETTINGS, "cases": CASES},
        "machine": {"cpu_count": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version()},
        "figures": figures}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
