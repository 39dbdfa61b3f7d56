"""Chapter 8's checkers: their right values are hand-computable, and the chapter's first
attempts fail them the way the chapter says."""

import torch

from grpo_edu.exercises import ch08
from grpo_edu.environment.rewards import soft_overlong_punishment


def test_the_punishment_the_checker_holds_is_the_hand_computed_one():
    # L = 9, c = 2: free up to 7 tokens, -0.5 at 8, -1 at the limit
    assert soft_overlong_punishment(torch.tensor([5, 6, 7, 8, 9]), 9, 2).tolist() == [0.0, 0.0, 0.0, -0.5, -1.0]
    # past the limit it stays -1
    assert soft_overlong_punishment(torch.tensor([10, 12, 14]), 12, 4).tolist() == [-0.5, -1.0, -1.0]


def test_the_chapters_first_attempt_fails_only_past_the_limit():
    def first_attempt(lengths, L, c):
        return (-(lengths.to(torch.float64) - (L - c)) / c).clamp(max=0.0)
    result = ch08.check_overlong_punishment(first_attempt)
    assert not result and result.passed == len(ch08.OVERLONG_CASES) - 1
    assert "past the limit" in result.failures[0]


def test_the_entropy_threshold_is_a_quantile_of_the_real_tokens_only():
    entropies = torch.tensor([[0.1, 0.2, 0.3, 9.0], [0.4, 0.5, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)

    def right(h, m, q):
        tau = torch.quantile(h[m], 1 - q).item()
        return tau, (h >= tau) & m
    tau, keep = right(entropies, mask, 0.5)
    assert abs(tau - 0.3) < 1e-7                                   # the median of 0.1 ... 0.5
    assert keep.tolist() == [[False, False, True, False], [True, True, False, False]]
    result = ch08.check_entropy_mask(right)
    assert result and result.passed == 2 * len(ch08.entropy_cases())


def test_the_entropy_checker_needs_a_pair():
    result = ch08.check_entropy_mask(lambda h, m, q: (h >= 0.5) & m)
    assert not result and all("expected a pair (tau, keep)" in failure for failure in result.failures)
