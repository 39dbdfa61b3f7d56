"""The README's picture, drawn from a committed results file:

    .venv/bin/python docs/figures.py

writes docs/images/accuracy.png, the held-out greedy accuracy of the default config
(configs/cpu-tiny.toml) run for 150 steps on seeds 0, 1 and 2, and prints the caption the
README carries under it. The runs are benchmarks/results/lag.json's synchronous ones
(rollout_lag = 0: the default trainer, evaluated every 25 steps on 256 held-out problems);
step 0 is the starting policy's accuracy. tests/test_readme.py checks that README.md carries
caption() word for word.

Deterministic: the same file gives the same picture (no timestamp or software version is
written into the PNG).
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "lag.json"
IMAGE = ROOT / "docs" / "images" / "accuracy.png"


def default_runs(results: dict | None = None) -> list[dict]:
    """The synchronous runs (rollout_lag = 0) of the results file, by seed."""
    results = results if results is not None else json.loads(RESULTS.read_text())
    return sorted((r for r in results["runs"] if r["lag"] == 0), key=lambda r: r["seed"])


def caption(results: dict | None = None) -> str:
    """The README's one-line caption: every figure read from the results file."""
    results = results if results is not None else json.loads(RESULTS.read_text())
    runs = default_runs(results)
    starts = {f"{r['start_accuracy']:.3f}" for r in runs}
    assert len(starts) == 1, "the seeds share one starting policy"
    finals = ", ".join(f"{r['final_accuracy']:.3f}" for r in runs[:-1]) + f" and {runs[-1]['final_accuracy']:.3f}"
    seeds = ", ".join(str(r["seed"]) for r in runs[:-1]) + f" and {runs[-1]['seed']}"
    seconds = sorted(r["seconds"] for r in runs)
    return (f"Held-out greedy accuracy on {results['settings']['eval_size']} problems, "
            f"the book's default config (`configs/cpu-tiny.toml`) cut to {results['steps']} steps, seeds {seeds}. "
            f"Before training {starts.pop()}; after, {finals}; "
            f"{seconds[0]:.1f} to {seconds[-1]:.1f} s per run on a CPU, evaluations included "
            f"(`benchmarks/results/lag.json`, drawn by `docs/figures.py`).")


def draw(path: Path = IMAGE) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from grpo_edu.config import TrainConfig

    results = json.loads(RESULTS.read_text())
    plt.rcParams.update({"font.size": 9})
    figure, axes = plt.subplots(figsize=(7, 3.5), dpi=100)
    for run, color in zip(default_runs(results), ("#1f77b4", "#ff7f0e", "#2ca02c")):
        steps = [0] + [step for step, _ in run["eval"]]
        accuracy = [run["start_accuracy"]] + [value for _, value in run["eval"]]
        axes.plot(steps, accuracy, marker="o", markersize=3, color=color, label=f"seed {run['seed']}")
    config = TrainConfig.from_toml(ROOT / "configs" / results["config"])
    axes.set_xlabel(f"training step ({config.rollout.prompts_per_step} prompts x {config.rollout.num_generations} completions each)")
    axes.set_ylabel("held-out greedy accuracy")
    axes.set_ylim(0, 1)
    axes.set_xlim(0, results["steps"])
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right")
    axes.set_title("GRPO on two-digit arithmetic, one CPU run per seed")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(figure)
    return path


if __name__ == "__main__":
    print(f"wrote {draw().relative_to(ROOT)}")
    print(caption())
