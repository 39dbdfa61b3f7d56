"""The README's picture, drawn from a committed results file:

    .venv/bin/python docs/figures.py

writes docs/images/accuracy.png, the held-out greedy accuracy of `make train`'s own run
(configs/cpu-first-run.toml, 1,500 steps) on seeds 0 to 4, and prints the caption the README
carries under it. The runs are benchmarks/results/first_run.json's setting "lr2.5e-4-beta0"
(benchmarks/first_run.py's MAKE_TRAIN: cpu-tiny.toml at learning rate 2.5e-4 and beta 0, which
is cpu-first-run.toml), evaluated every 25 steps on the 256 held-out problems; step 0 is the
starting policy's accuracy. tests/test_readme.py checks that README.md carries caption() word
for word.

Deterministic: the same file gives the same picture (no timestamp or software version is
written into the PNG).
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "first_run.json"
IMAGE = ROOT / "docs" / "images" / "accuracy.png"
MAKE_TRAIN = "lr2.5e-4-beta0"   # benchmarks/first_run.py's MAKE_TRAIN: the setting of configs/cpu-first-run.toml
TARGET = 0.9


def _and(items: list[str]) -> str:
    return ", ".join(items[:-1]) + f" and {items[-1]}"


def make_train_runs(results: dict | None = None) -> list[dict]:
    """`make train`'s runs of the results file, by seed."""
    results = results if results is not None else json.loads(RESULTS.read_text())
    return sorted((r for r in results["runs"] if r["setting"] == MAKE_TRAIN), key=lambda r: r["seed"])


def caption(results: dict | None = None) -> str:
    """The README's caption: every figure read from the results file."""
    results = results if results is not None else json.loads(RESULTS.read_text())
    runs = make_train_runs(results)
    starts = {f"{r['start_accuracy']:.3f}" for r in runs}
    assert len(starts) == 1, "the seeds share one starting policy"
    problems = {len(r["greedy_correct"]) for r in runs}
    assert len(problems) == 1
    seconds = sorted(r["seconds_to_90"] for r in runs)
    seeds = _and([str(r["seed"]) for r in runs])
    finals = _and([f"{r['final_accuracy']:.3f}" for r in runs])
    return (f"Held-out greedy accuracy of `make train`'s run (`configs/cpu-first-run.toml`, "
            f"{results['steps']:,} steps) on {problems.pop()} problems, seeds {seeds}, "
            f"evaluated every {results['eval_every']} steps. Before training {starts.pop()}; after, {finals}. "
            f"Every seed passed {TARGET:.2f} after {seconds[0]:.1f} to {seconds[-1]:.1f} s of training "
            f"with {results['threads']} CPU threads (`benchmarks/results/first_run.json`, drawn by `docs/figures.py`).")


def draw(path: Path = IMAGE) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from grpo_edu.config import TrainConfig

    results = json.loads(RESULTS.read_text())
    plt.rcParams.update({"font.size": 9})
    figure, axes = plt.subplots(figsize=(7, 3.5), dpi=100)
    colors = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd")
    for run, color in zip(make_train_runs(results), colors):
        steps = [0] + [step for step, _, _ in run["evaluations"]]
        accuracy = [run["start_accuracy"]] + [value for _, _, value in run["evaluations"]]
        axes.plot(steps, accuracy, color=color, lw=1.2, label=f"seed {run['seed']}")
    axes.axhline(TARGET, color="#7a7a7a", lw=0.8, ls=":")
    config = TrainConfig.from_toml(ROOT / "configs" / "cpu-first-run.toml")
    axes.set_xlabel(f"training step ({config.rollout.prompts_per_step} prompts x "
                    f"{config.rollout.num_generations} completions each)")
    axes.set_ylabel("held-out greedy accuracy")
    axes.set_ylim(0, 1.02)
    axes.set_xlim(0, results["steps"])
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right", ncol=2)
    axes.set_title("make train: GRPO on two-digit arithmetic, one CPU run per seed")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(figure)
    return path


if __name__ == "__main__":
    print(f"wrote {draw().relative_to(ROOT)}")
    print(caption())
