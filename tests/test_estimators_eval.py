"""Evaluation's estimators against brute force: pass@k against every k-subset of the samples,
the Wilson interval against its defining equation, the bootstrap's reproducibility; and the
run's summary.json carries its held-out accuracies' intervals."""

import itertools
import json
import math
from statistics import NormalDist

import pytest
from hypothesis import given, strategies as st

from grpo_edu.evaluation import bootstrap_interval, pass_at_k, wilson_interval


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
    from grpo_edu import trainer
    from test_trainer import small_config
    summary = trainer.train(small_config(tmp_path, steps=1, checkpoint_every=0), log=lambda _: None).summary
    n = summary["eval_problems"]
    for key in ("start", "final"):
        accuracy = summary[f"{key}_accuracy"]
        assert summary[f"{key}_accuracy_interval_95"] == list(wilson_interval(round(accuracy * n), n))
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["final_accuracy_interval_95"] == summary["final_accuracy_interval_95"]
