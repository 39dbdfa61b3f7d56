"""The chapter-6 checkers."""

import torch

from grpo_edu.algorithm.advantages import group_advantages
from grpo_edu.exercises import ch06


def test_library_advantages_pass():
    result = ch06.check_advantage_function(group_advantages)
    assert result and result.passed == len(ch06.ADVANTAGE_CASES)


def test_rank_advantages_pass():
    def rank(rewards):
        ranks = torch.stack([(row[None, :] < row[:, None]).sum(1) + 0.5 * ((row[None, :] == row[:, None]).sum(1) - 1)
                             for row in rewards]).double()
        return group_advantages(ranks)
    assert ch06.check_advantage_function(rank)


def test_each_broken_property_is_named():
    flat = ch06.check_advantage_function(lambda r: r - r.mean())  # batch mean, not group mean
    assert any("group means should be 0" in f for f in flat.failures)
    nan = ch06.check_advantage_function(lambda r: (r - r.mean(1, keepdim=True)) / r.std(1, keepdim=True))
    assert any("all-equal group" in f and "non-finite" in f for f in nan.failures)
    reversed_order = ch06.check_advantage_function(lambda r: -group_advantages(r))
    assert any("a higher reward got a lower advantage" in f for f in reversed_order.failures)
    wrong_shape = ch06.check_advantage_function(lambda r: r.reshape(-1))
    assert all("expected a tensor of shape" in f for f in wrong_shape.failures)
    raises = ch06.check_advantage_function(lambda r: 1 / 0)
    assert all("raised ZeroDivisionError" in f for f in raises.failures)


def test_diagnoses():
    assert ch06.check_diagnoses(dict(ch06.DIAGNOSES))
    wrong = dict(ch06.DIAGNOSES, **{"run C": "healthy"})
    assert ch06.check_diagnoses(wrong).failures == [
        "run C: not healthy: at least one of its metrics is outside a healthy run's range"]
    wrong = dict(ch06.DIAGNOSES, **{"run A": "runaway kl"})
    assert ch06.check_diagnoses(wrong).failures == [
        f"run A: not 'runaway kl': that would show {ch06.SIGNS['runaway kl']}, and run A does not"]
    assert "no diagnoses yet" in ch06.check_diagnoses({}).failures[0]
