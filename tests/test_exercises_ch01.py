"""The chapter-1 checkers accept right answers and name each wrong case."""

import numpy as np

from grpo_edu.algorithm import reference
from grpo_edu.exercises import ch01


def test_group_advantages_checker_accepts_a_correct_solution():
    result = ch01.check_group_advantages(lambda r, std: reference.group_advantages(r, std=std))
    assert result and result.passed == 12 and "all 12 cases passed" in repr(result)


def test_group_advantages_checker_names_the_failing_cases():
    result = ch01.check_group_advantages(lambda r, std: (r - r.mean()) / (r.std() + 1e-8))
    assert not result
    assert len(result.failures) == 5  # every sample-std case except the all-equal one
    assert all("std='sample'" in failure for failure in result.failures)
    assert result.failures[0] == ("chapter 1's rewards, std='sample', rewards=[0.9, 0.3, -0.1, 0.7]: 4 of 4 "
                                  "elements are wrong, all off by the same factor: about 1.2 times the right values")


def test_group_advantages_checker_reports_nan_and_exceptions():
    nan_result = ch01.check_group_advantages(lambda r, std: (r - r.mean()) / r.std(ddof=0 if std == "population" else 1))
    assert any("all equal" in f and "NaN" in f for f in nan_result.failures)
    raised = ch01.check_group_advantages(lambda r, std: 1 / 0)
    assert len(raised.failures) == 12 and "raised ZeroDivisionError" in raised.failures[0]


def test_clip_quiz():
    answers = ch01.clip_quiz_answers()
    # (1.3, +1) clips; (1.3, -1) does not; (0.7, +1) does not; (0.7, -1) clips; ...
    assert answers.tolist() == [True, False, False, True, False, False, False, True]
    assert ch01.check_clip_predictions(answers.tolist())
    wrong = answers.tolist()
    wrong[1] = True
    result = ch01.check_clip_predictions(wrong)
    assert result.failures == ["the pairs with A < 0: 1 of these 4 predictions is wrong"] and result.passed == 1
    assert "expected 8 predictions" in ch01.check_clip_predictions([]).failures[0]


def test_k3_checker():
    assert ch01.check_k3(reference.k3)
    k1 = ch01.check_k3(lambda ref, new: new - ref)
    assert not k1 and "identical policies" not in " ".join(k1.failures)
    assert np.isclose(reference.k3(-5.0, -0.01), np.exp(-4.99) + 4.99 - 1)
