"""Chapter 5's checkers pass right answers, and name the case and the values when an
answer is wrong; its hackable rewards are as hackable as the chapter says."""

import re

import numpy as np
import pytest

from grpo_edu.environment import rewards
from grpo_edu.exercises import ch05
from grpo_edu.policy.models import char_tokenizer
from grpo_edu.environment.tasks import ExpressionError, evaluate_expression, expression_numbers

PLAIN_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]*)")


def strict_format_solution(completions, **kwargs):
    scores = []
    for completion in completions:
        text = rewards.completion_text(completion)
        head, tail = "<think>", "}"
        ok = False
        if text.startswith(head) and text.endswith(tail):
            body = text[len(head):-1]
            reasoning, sep, answer = body.partition("</think>\\boxed{")
            ok = bool(sep) and PLAIN_INTEGER.fullmatch(reasoning) and PLAIN_INTEGER.fullmatch(answer)
        scores.append(1.0 if ok else 0.0)
    return scores


def test_strict_format_checker_passes_a_right_answer():
    result = ch05.check_strict_format(strict_format_solution)
    assert result, result


def test_strict_format_checker_names_the_failing_cases():
    def match_not_fullmatch(completions, **kwargs):
        pattern = re.compile(r"<think>-?\d+</think>\\boxed\{-?\d+\}")
        return [1.0 if pattern.match(rewards.completion_text(c)) else 0.0 for c in completions]

    result = ch05.check_strict_format(match_not_fullmatch)
    report = str(result)
    assert not result
    assert "a leading zero: '<think>12</think>\\\\boxed{0132}': accepted (1.0) a completion the rule rejects" in report
    assert "unicode digits" in report and "a trailing newline" in report
    assert "a well-formed completion" not in report


def test_strict_format_checker_reports_exceptions_and_bad_return_types():
    def crashes(completions, **kwargs):
        return [float(rewards.completion_text(c)[7]) for c in completions]

    report = str(ch05.check_strict_format(crashes))
    assert "empty string: '': raised IndexError" in report
    report = str(ch05.check_strict_format(lambda completions, **kwargs: 1.0))
    assert "must return a list with one float per completion, got 1.0" in report


def countdown_solution(completions, numbers, target, **kwargs):
    scores = []
    for completion, pool, goal in zip(completions, numbers, target):
        expression = rewards.last_boxed(rewards.completion_text(completion))
        try:
            right = (expression is not None and evaluate_expression(expression) == goal
                     and sorted(expression_numbers(expression)) == sorted(pool))
        except ExpressionError:
            right = False
        scores.append(1.0 if right else 0.0)
    return scores


def test_countdown_checker_passes_a_right_answer_and_catches_a_lenient_one():
    assert ch05.check_countdown_reward(countdown_solution)

    def ignores_the_numbers(completions, numbers, target, **kwargs):
        scores = []
        for completion, goal in zip(completions, target):
            expression = rewards.last_boxed(rewards.completion_text(completion))
            try:
                scores.append(float(expression is not None and evaluate_expression(expression) == goal))
            except ExpressionError:
                scores.append(0.0)
        return scores

    report = str(ch05.check_countdown_reward(ignores_the_numbers))
    assert "a number used twice" in report and "a number not given" in report
    assert "accepted (1.0) a completion the rule rejects" in report
    assert "each number once, right value" not in report


@pytest.fixture(scope="module")
def reward_model():
    """A reward model with known weights: digits pay, length costs a little."""
    weights = np.zeros(len(ch05.FEATURES) + 1)
    weights[ch05.FEATURES.index("9")] = 0.1
    weights[-1] = -0.01
    return ch05.CharacterRewardModel(weights=weights, bias=0.2)


def test_reward_model_scores_and_fit_recovers_a_linear_rule():
    texts = ["<think>9</think>\\boxed{99}", "<think>1</think>\\boxed{1}", "", "9" * 10, "-5", "}}"]
    exact = ch05.CharacterRewardModel(weights=np.arange(len(ch05.FEATURES) + 1) / 10.0, bias=0.5)
    labels = exact(texts * 5)
    fitted = ch05.CharacterRewardModel.fit(texts * 5 + ["0123456789-", "<think></think>\\boxed{}"],
                                           labels + exact(["0123456789-", "<think></think>\\boxed{}"]),
                                           ridge=1e-9)
    assert np.allclose(fitted(texts), exact(texts), atol=1e-5)
    assert set(fitted.named_weights()) == {*ch05.FEATURES, "length"}


def test_ranking_accuracy():
    assert ch05.ranking_accuracy([3, 2, 1, 0], [1, 1, 0, 0]) == 1.0
    assert ch05.ranking_accuracy([0, 1, 2, 3], [1, 1, 0, 0]) == 0.0
    assert ch05.ranking_accuracy([1, 1], [1, 0]) == 0.5
    with pytest.raises(ValueError, match="both correct"):
        ch05.ranking_accuracy([1, 2], [1, 1])


def test_reward_model_hack_checker(reward_model):
    tokenizer = char_tokenizer()
    problem = {"prompt": "10+10=", "answer": "20"}
    hack = "<think>9</think>\\boxed{99999999999}"
    assert ch05.check_reward_model_hack(hack, reward_model, problem, 0.5, tokenizer)
    report = str(ch05.check_reward_model_hack("9" * 40, reward_model, problem, 0.5, tokenizer))
    assert "at most 16 tokens (it has 40)" in report and "format_reward accepts it" in report
    report = str(ch05.check_reward_model_hack("<think>0</think>\\boxed{20}", reward_model, problem, 0.5,
                                              tokenizer))
    assert "it is wrong for 10+10= (answer 20)" in report and "above every correct" in report


def test_lenient_rule_pays_a_completion_that_answers_nothing():
    everything = " ".join(str(n) for n in range(-89, 199))
    answers = ["-89", "0", "7", "198", "132"]
    assert ch05.lenient_accuracy_reward([everything] * 5, answer=answers) == [1.0] * 5
    assert rewards.accuracy_reward([everything] * 5, answer=answers) == [0.0] * 5
