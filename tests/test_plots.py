"""curves.png: the panels plot_run draws, what it says of a metric the run did not log, and
what takes the place of a panel that is flat in the run."""

import json

import pytest

from grpo_edu.book.plots import HEALTH_PANELS, QUIET_RUN_PANELS, plot_run

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")


def write_run(tmp_path, beta_zero=False, flat=False):
    """30 steps of metrics; flat: a clip fraction of 0 and a sampler gap of rounding at every
    step, as a run on the CPU with one optimizer step per rollout logs them."""
    lines = []
    for step in range(1, 31):
        m = {"step": step, "reward/mean": step / 30, "reward/accuracy": step / 40, "reward/std": 0.3,
             "completion_length/mean": 9.0, "completion_length/max": 12.0, "entropy": 0.4 - step / 100,
             "clip_ratio/region": 0.0 if flat else step / 300, "grad_norm": 0.5 + step,
             "sampler_gap/mean_abs": 2e-7 if flat else 1e-3 * step, "zero_std_groups": 0.5 - step / 100,
             "learning_rate": 3e-4 * (1 - step / 30), "optimizer_steps": 1 if flat else 2}
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
    assert norm_axis.get_yscale() == "log" and not figure.texts   # nothing flat, nothing left out
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_a_metric_the_run_did_not_log_is_named_not_drawn(tmp_path):
    figure = plot_run(write_run(tmp_path, beta_zero=True))
    kl_axis = figure.axes[4]
    assert not kl_axis.lines and kl_axis.texts[0].get_text() == "not logged\n(kl)"


def test_a_panel_flat_in_the_run_gives_its_place_and_says_why(tmp_path):
    figure = plot_run(write_run(tmp_path, flat=True))
    titles = [axis.get_title() for axis in figure.axes]
    gap_title, clip_title = QUIET_RUN_PANELS[0][0], QUIET_RUN_PANELS[1][0]
    assert titles[3] == gap_title and titles[6] == clip_title
    assert "clip fraction" not in titles and not any(t.startswith("sampler/trainer gap") for t in titles)
    assert list(figure.axes[3].lines[0].get_ydata()) == [0.5 - step / 100 for step in range(1, 31)]
    note = figure.texts[0].get_text()
    assert note.startswith("flat in this run, not drawn: ")
    assert "sampler/trainer gap: at most 2.0e-07, float32 rounding" in note
    assert "clip fraction: 0 at every step (one optimizer step per rollout" in note
