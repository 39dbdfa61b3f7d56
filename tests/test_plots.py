"""curves.png: the panels plot_run draws, and what it says of a metric the run did not log."""

import json

import pytest

from grpo_edu.book.plots import HEALTH_PANELS, plot_run

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")


def write_run(tmp_path, beta_zero=False):
    lines = []
    for step in range(1, 31):
        m = {"step": step, "reward/mean": step / 30, "reward/accuracy": step / 40, "reward/std": 0.3,
             "completion_length/mean": 9.0, "completion_length/max": 12.0, "entropy": 0.4 - step / 100,
             "clip_ratio/region": 0.0, "grad_norm": 0.5 + step, "sampler_gap/mean_abs": 2e-7}
        if not beta_zero:
            m["kl"] = step / 1000
        if step % 10 == 0:
            m["eval/greedy_accuracy"] = 0.4 + step / 100
        lines.append(json.dumps(m))
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_curves_have_the_health_panels(tmp_path):
    figure = plot_run(write_run(tmp_path), tmp_path / "curves.png", start_accuracy=0.4)
    titles = [axis.get_title() for axis in figure.axes]
    assert titles[4:] == [title for title, _, _ in HEALTH_PANELS]
    assert titles[:4] == ["reward (moving mean of 20 steps)", "held-out greedy accuracy",
                          "completion length (tokens)", "sampler/trainer gap (mean |log-prob diff|)"]
    kl_axis, norm_axis = figure.axes[4], figure.axes[7]
    assert list(kl_axis.lines[0].get_ydata()) == [step / 1000 for step in range(1, 31)]
    assert norm_axis.get_yscale() == "log"
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_a_metric_the_run_did_not_log_is_named_not_drawn(tmp_path):
    figure = plot_run(write_run(tmp_path, beta_zero=True))
    kl_axis = figure.axes[4]
    assert not kl_axis.lines and kl_axis.texts[0].get_text() == "not logged\n(kl)"
