"""Training curves from a run directory's metrics.jsonl (matplotlib, imported lazily
so the core library never needs it)."""

from __future__ import annotations

from pathlib import Path

from grpo_edu.runlog import MetricsLog


def load_metrics(run_dir: str | Path) -> list[dict]:
    return MetricsLog(run_dir).read()


def plot_run(run_dir: str | Path, path: str | Path | None = None, start_accuracy: float | None = None):
    """Reward, held-out accuracy and completion length against the step.

    Writes the figure to `path` (PNG) when given; returns the matplotlib Figure.
    """
    import matplotlib
    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    history = load_metrics(run_dir)
    if not history:
        raise ValueError(f"{run_dir}/metrics.jsonl has no steps to plot")
    steps = [m["step"] for m in history]
    figure, axes = plt.subplots(1, 3, figsize=(12, 3.2))
    reward_keys = [k for k in history[0] if k.startswith("reward/") and k != "reward/std"]
    for key in reward_keys:
        _ = axes[0].plot(steps, _smooth([m[key] for m in history]), label=key.split("/", 1)[1])
    axes[0].set_title("reward (moving mean of 20 steps)")
    axes[0].legend(fontsize=8)
    evals = [(m["step"], m["eval/greedy_accuracy"]) for m in history if "eval/greedy_accuracy" in m]
    if start_accuracy is not None:
        evals = [(0, start_accuracy)] + evals
    if evals:
        _ = axes[1].plot(*zip(*evals), marker="o")
    axes[1].set_ylim(0, 1)
    axes[1].set_title("held-out greedy accuracy")
    _ = axes[2].plot(steps, _smooth([m["completion_length/mean"] for m in history]), label="mean")
    _ = axes[2].plot(steps, _smooth([m["completion_length/max"] for m in history]), label="max")
    axes[2].set_title("completion length (tokens)")
    axes[2].legend(fontsize=8)
    for axis in axes:
        axis.set_xlabel("optimizer step")
    figure.tight_layout()
    if path is not None:
        figure.savefig(path, dpi=100)
    return figure


def _smooth(values: list[float], window: int = 20) -> list[float]:
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out
