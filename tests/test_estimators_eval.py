"""Evaluation's estimators against brute force: pass@k against every k-subset of the samples,
the Wilson interval against its defining equation, the bootstrap's reproducibility; and the
run's summary.json carries its held-out accuracies' intervals."""

import itertools
import json
import math
from statistics import NormalDist

import pytest
from hypothesis import given, strategies as st

from grpo_edu.training.evaluation import bootstrap_interval, pass_at_k, wilson_interval


@given(st.integers(1, 12).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_is_the_share_of_k_subsets_with_a_right_sample(nck):
    n, c, k = nck
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    brute = sum(any(samples[i] for i in subset) for subset in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)


def test_pass_at_k_edges_and_errors():
    assert pass_at_k(8, 0, 8) == 0.0 and pass_at_k(8, 1, 8) == 1.0 and pass_at_k(8, 4, 1) == pytest.approx(0.5, abs=1e-15)
    with pytest.raises(ValueError, match="pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n=4, c=5, k=1"):
        pass_at_k(4, 5, 1)


@given(st.integers(1, 500).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_wilson_bounds_solve_the_score_equation(nx):
    """The Wilson interval is the set of p with |x/n - p| <= z sqrt(p (1 - p) / n): its ends
    (inside (0, 1)) solve it with equality."""
    n, x = nx
    low, high = wilson_interval(x, n)
    z = NormalDist().inv_cdf(0.975)
    assert 0 <= low <= x / n <= high <= 1
    for p in (low, high):
        if 0 < p < 1:
            assert abs(x / n - p) == pytest.approx(z * math.sqrt(p * (1 - p) / n), abs=1e-9)


def test_wilson_hand_computed_case_and_errors():
    low, high = wilson_interval(5, 10)
    assert (round(low, 4), round(high, 4)) == (0.2366, 0.7634)
    with pytest.raises(ValueError, match="got 11 of 10"):
        wilson_interval(11, 10)


def test_bootstrap_is_reproducible_and_brackets_the_mean():
    values = [1.0, 0.0, 0.5, 1.0, 0.25, 0.75, 0.0, 1.0]
    assert bootstrap_interval(values) == bootstrap_interval(values)
    low, high = bootstrap_interval(values)
    assert low < sum(values) / len(values) < high
    assert bootstrap_interval([0.5] * 10) == (0.5, 0.5)


def test_the_summary_carries_the_accuracy_intervals(tmp_path):
    from grpo_edu.training import trainer
    from test_trainer import small_config
    summary = trainer.train(small_config(tmp_path, steps=1, checkpoint_every=0), log=lambda _: None).summary
    n = summary["eval_problems"]
    for key in ("start", "final"):
        accuracy = summary[f"{key}_accuracy"]
        assert summary[f"{key}_accuracy_interval_95"] == list(wilson_interval(round(accuracy * n), n))
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["final_accuracy_interval_95"] == summary["final_accuracy_interval_95"]


def test_sampled_scores_count_right_samples_and_the_majority():
    """A stand-in generate: three answers per problem; maj@3 follows the most frequent one."""
    from grpo_edu.training import evaluation
    from grpo_edu.training.evaluation import sampled_metrics, sampled_scores
    groups = [["\\boxed{7}", "\\boxed{7.0}", "\\boxed{8}"],      # 2 right; the majority (7 = 7.0) is right
              ["\\boxed{9}", "\\boxed{9}", "\\boxed{7}"],        # 1 right; the majority (9) is wrong
              ["no answer", "", "\\boxed{1}"]]                   # 0 right
    original = evaluation.generate_completions
    evaluation.generate_completions = lambda *args, **kwargs: groups
    try:
        scores = sampled_scores(None, None, [{"prompt": "p", "answer": "7"}] * 3, k=3)
    finally:
        evaluation.generate_completions = original
    assert scores == [(2, True), (1, False), (0, False)]
    metrics = sampled_metrics(scores, 3)
    assert metrics["pass_at_1"] == pytest.approx(1 / 3) and metrics["pass_at_3"] == pytest.approx(2 / 3)
    assert metrics["maj_at_3"] == pytest.approx(1 / 3)
    assert metrics["maj_at_3_interval_95"] == list(wilson_interval(1, 3))


def test_eval_samples_logs_sampled_metrics_at_each_evaluation(tmp_path):
    from grpo_edu.training import trainer
    from test_trainer import small_config
    result = trainer.train(small_config(tmp_path, steps=2, eval_every=1, checkpoint_every=0, eval_samples=4),
                           log=lambda _: None)
    for metrics in result.history:
        assert {"eval/pass_at_1", "eval/pass_at_4", "eval/maj_at_4", "eval/pass_at_4_interval_95"} <= set(metrics)
        assert 0 <= metrics["eval/pass_at_1"] <= metrics["eval/pass_at_4"] <= 1
    assert set(result.summary["final_sampled"]) >= {"pass_at_1", "pass_at_4", "maj_at_4"}
    plain = trainer.train(small_config(tmp_path / "plain", steps=1, checkpoint_every=0), log=lambda _: None)
    assert "eval/pass_at_1" not in plain.history[0] and plain.summary["final_sampled"] == {}


def test_the_training_doc_tables_intervals_are_wilsons():
    """docs/training.md's table of the first run (the start, then each seed's final): every 'accuracy [low, high]'
    cell is the 95% Wilson interval of that accuracy over the 256 held-out problems."""
    import re
    from pathlib import Path
    readme = (Path(__file__).parents[1] / "docs" / "training.md").read_text()
    cells = re.findall(r"(\d\.\d{3}) \[(\d\.\d{3}), (\d\.\d{3})\]", readme)
    assert len(cells) >= 4
    for accuracy, low, high in cells:
        expected = wilson_interval(round(float(accuracy) * 256), 256)
        assert (low, high) == (f"{expected[0]:.3f}", f"{expected[1]:.3f}"), (accuracy, low, high)
