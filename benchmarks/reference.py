"""The reference the KL anchors to, four ways, on the CPU tier's default run (configs/cpu-tiny.toml,
150 steps, seeds 0 1 2; everything else the default config, beta 0.04):

    frozen   the starting policy throughout (ref_sync_steps = 0)
    copy     replaced by the policy every 25 rollouts (R1's every 400 optimizer steps)
    polyak   moved toward it every 25 rollouts, ref = 0.6 x policy + 0.4 x ref (TRL's default alpha)
    ema      moved a little every rollout, ref = 0.05 x policy + 0.95 x ref

    .venv/bin/python benchmarks/reference.py [--variants ...] [--seeds 0 1 2] [--steps 150] [--out FILE]
    .venv/bin/python benchmarks/reference.py --check FILE [--steps 4] [--runs ema:0 ...]

Writes FILE (default benchmarks/results/reference.json) after every run: per run its held-out
greedy accuracy at every evaluation (256 problems, every 25 steps) and, per step, the KL, the
training accuracy and the gradient norm. Run it under the book's pinned kernels
(grpo_edu.numerics): chapter 4 reads the file. --check re-trains the named runs (variant:seed)
for their first --steps steps and compares every kept number with FILE's, exactly
(tests/test_reference_sync.py runs it, pinned, for ema:0, which averages at every step).
"""

from __future__ import annotations

import json
import platform
import tempfile
import time
from pathlib import Path

import variant_grid

from grpo_edu.config import DEFAULT_CONFIG, TrainConfig
from grpo_edu.trainer import train

OUT = Path(__file__).parent / "results" / "reference.json"
SETTINGS = {"eval_every": 25, "eval_size": 256, "checkpoint_every": 0, "progress": False}
VARIANTS = {
    "frozen": {"ref_sync_steps": 0},
    "copy": {"ref_sync_steps": 25},
    "polyak": {"ref_sync_steps": 25, "ref_mixup_alpha": 0.6},
    "ema": {"ref_sync_steps": 1, "ref_mixup_alpha": 0.05},
}
KEPT = ("kl", "reward/accuracy", "grad_norm", "entropy")


def config_for(variant: str, seed: int, steps: int, output_dir: str) -> TrainConfig:
    base = TrainConfig.from_toml(DEFAULT_CONFIG).to_dict()
    return TrainConfig.from_dict({**base, **SETTINGS, "steps": steps, "seed": seed, "output_dir": output_dir,
                                  **VARIANTS[variant]})


def run(variant: str, seed: int, steps: int, stop_after: int | None = None) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        started = time.perf_counter()
        result = train(config_for(variant, seed, steps, directory), log=lambda line: None, stop_after=stop_after)
        seconds = time.perf_counter() - started
    history = result.history
    return {"variant": variant, "seed": seed, "seconds": round(seconds, 1),
            "start_accuracy": result.summary["start_accuracy"], "final_accuracy": result.summary.get("final_accuracy"),
            "eval": [[m["step"], m["eval/greedy_accuracy"]] for m in history if "eval/greedy_accuracy" in m],
            "steps": {key: [m.get(key) for m in history] for key in KEPT}}


def parse_runs(values: list[str] | None, variants, seeds) -> list[tuple[str, int]]:
    return variant_grid.parse_runs(values, variants, seeds, VARIANTS)


def differences(got: dict, want: dict, n: int) -> list[str]:
    return variant_grid.differences(got, want, n, KEPT)


def write(args) -> None:
    out, runs = Path(args.out), []
    for variant, seed in parse_runs(args.runs, args.variants, args.seeds):
        runs.append(run(variant, seed, args.steps))
        last = runs[-1]
        print(f"{variant:<7} seed {seed}: accuracy {last['start_accuracy']:.3f} -> {last['final_accuracy']:.3f}, "
              f"last KL {last['steps']['kl'][-1]:.4f} in {last['seconds']:.0f} s", flush=True)
        payload = {"steps": args.steps, "seeds": args.seeds, "variants": VARIANTS, "settings": SETTINGS,
                   "config": DEFAULT_CONFIG.name, "machine": platform.machine(), "runs": runs}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(payload, separators=(",", ":")) + "\n")   # after every run: a stop loses one
    print(f"wrote {out}")


def main() -> None:
    args = variant_grid.arguments(__doc__, VARIANTS, OUT, steps=150, check_steps=4, example="ema:0")
    if args.check:
        variant_grid.check(args, VARIANTS, KEPT, run)
    else:
        write(args)


if __name__ == "__main__":
    main()
