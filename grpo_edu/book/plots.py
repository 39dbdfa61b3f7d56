"""Training curves from a run directory's metrics.jsonl (matplotlib, imported lazily
so the core library never needs it)."""

from __future__ import annotations

from pathlib import Path

from grpo_edu.runtime.runlog import MetricsLog


def load_metrics(run_dir: str | Path) -> list[dict]:
    return MetricsLog(run_dir).read()


# The second row of curves.png: the metrics that show a run going wrong (chapter 7), each
# with the key it plots and whether its axis is logarithmic.
HEALTH_PANELS = (
    ("KL to the reference (per token)", "kl", False),
    ("entropy (nats per token)", "entropy", False),
    ("clip fraction", "clip_ratio/region", False),
    ("gradient norm (before clipping)", "grad_norm", True),
)

# What takes the place of a panel that is flat in a run (plot_run): the share of prompts whose
# G rewards are all equal, which give no gradient, and the learning rate the step took.
QUIET_RUN_PANELS = (
    ("groups with all-equal rewards (share)", "zero_std_groups", False),
    ("learning rate", "learning_rate", False),
)


def plot_run(run_dir: str | Path, path: str | Path | None = None, start_accuracy: float | None = None):
    """Two rows of panels against the step: reward, held-out accuracy, completion length,
    sampler/trainer gap; KL, entropy, clip fraction, gradient norm. Metrics a run did not log
    (no KL with beta = 0) leave their panel empty, saying so. A panel that is flat in this run
    (a clip fraction 0 at every step, a sampler gap of float32 rounding) gives its place to one
    a reader should look at (QUIET_RUN_PANELS), and a line under the figure says what was left
    out and why.

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
    figure, grid = plt.subplots(2, 4, figsize=(16, 6.4))
    axes = grid[0]
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
    panels = [("sampler/trainer gap (mean |log-prob diff|)", "sampler_gap/mean_abs", True), *HEALTH_PANELS]
    spare = [panel for panel in QUIET_RUN_PANELS if any(panel[1] in m for m in history)]
    left_out = []
    for i, (title, key, _) in enumerate(panels):
        values = [m[key] for m in history if key in m]
        if not (values and spare):
            continue
        if key == "clip_ratio/region" and not any(values):
            one_step = all(m.get("optimizer_steps", 1) == 1 for m in history)
            why = "0 at every step" + (" (one optimizer step per rollout: every ratio is 1)" if one_step else "")
        elif key == "sampler_gap/mean_abs" and max(values) < 1e-5:
            why = f"at most {max(values):.1e}, float32 rounding (the sampler computes the trainer's maths)"
        else:
            continue
        panels[i] = spare.pop(0)
        left_out.append(f"{title.split(' (')[0]}: {why}")
    for axis, (title, key, log) in zip([axes[3], *grid[1]], panels):
        _series(axis, history, key, title, log, smooth=key != "learning_rate")   # a schedule has no noise
    for axis in grid.flat:
        axis.set_xlabel("training step")
    if left_out:
        figure.text(0.5, 0.01, "flat in this run, not drawn: " + "; ".join(left_out), ha="center", fontsize=9)
    figure.tight_layout(rect=(0, 0.04 if left_out else 0, 1, 1))
    if path is not None:
        figure.savefig(path, dpi=100)
    return figure


def _series(axis, history: list[dict], key: str, title: str, log: bool, smooth: bool = True) -> None:
    """One metric against the step (raw, and its moving mean), or a note that the run has none."""
    points = [(m["step"], m[key]) for m in history if key in m]
    axis.set_title(title)
    if not points:
        axis.text(0.5, 0.5, f"not logged\n({key})", ha="center", va="center", transform=axis.transAxes)
        return
    steps, values = zip(*points)
    if log and all(v > 0 for v in values):
        axis.set_yscale("log")
    if not smooth:
        _ = axis.plot(steps, values, linewidth=1.5)
        return
    _ = axis.plot(steps, values, alpha=0.3, linewidth=0.8)
    _ = axis.plot(steps, _smooth(list(values)), linewidth=1.5)


def _smooth(values: list[float], window: int = 20) -> list[float]:
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_compare(results: dict, panels: list[tuple[str, str, bool]], smooth: int = 5):
    """Runs side by side: one panel per (key, title, log axis), one line per run (a moving mean
    of `smooth` steps). results: {name: RunResult or a list of metrics dicts}. Returns the Figure."""
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2), squeeze=False)
    for axis, (key, title, log) in zip(axes[0], panels):
        axis.set_title(title)
        axis.set_xlabel("training step")
        for name, result in results.items():
            history = getattr(result, "history", result)
            points = [(m["step"], m[key]) for m in history if key in m]
            if points:
                steps, values = zip(*points)
                _ = axis.plot(steps, _smooth(list(values), smooth), label=name)
        if log and axis.lines and all(min(line.get_ydata()) > 0 for line in axis.lines):
            axis.set_yscale("log")
    axes[0][0].legend(fontsize=8)
    figure.tight_layout()
    return figure
