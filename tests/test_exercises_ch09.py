"""The chapter-9 checkers accept the worked solutions, name what a wrong answer got wrong, and
check against what the library does."""

import pytest

from grpo_edu.environment.digitsum import digitsum_sample, read_format
from grpo_edu.exercises import ch09


# ----------------------------------------------------------------- 9.1

def test_read_format_solution_passes_and_every_case_is_a_format():
    result = ch09.check_read_format(read_format)
    assert result and result.passed == len(ch09.FORMAT_CASES)
    assert {read_format(text) for _, text in ch09.FORMAT_CASES} == {"direct", "worked", "check", "other"}


def test_read_format_that_ignores_the_bang_fails_on_the_checks():
    def no_checks(text):
        got = read_format(text)
        return "worked" if got == "check" else got
    result = ch09.check_read_format(no_checks)
    assert not result and "a check" in str(result)


# ----------------------------------------------------------------- 9.2

def test_expected_length_solution_passes():
    def solution(direct, worked, check, depths):
        mean_depth = (depths[0] + depths[1]) / 2
        return 6 + 3 * mean_depth * (worked + check) + 4 * check
    result = ch09.check_expected_length(solution)
    assert result and result.passed == len(ch09.LENGTH_CASES)


def test_expected_length_is_the_token_count_of_the_library_s_completions():
    """6 tokens direct, 6 + 3n worked, with the tokenizer of the bases (one token a character or tag)."""
    from grpo_edu.policy.models import load_policy, policy_source
    _, tokenizer = load_policy(policy_source("digitsum-start"))
    for n in (3, 7, 12):
        sample = digitsum_sample([(3 * i + 1) % 10 for i in range(n)])
        for text, depths, shares in ((sample["direct_solution"], (n, n), (1, 0, 0)),
                                     (sample["solution"], (n, n), (0, 1, 0))):
            tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 1   # its end
            assert tokens == ch09.expected_length(*shares, depths)


def test_expected_length_that_forgets_the_check_fails():
    result = ch09.check_expected_length(lambda d, w, c, depths: 6 + 3 * (depths[0] + depths[1]) / 2 * w)
    assert not result and "check" in str(result)


@pytest.mark.parametrize("shares", [(0.5, 0.4, 0.1), (0.0, 1.0, 0.0)])
def test_expected_length_grows_with_the_worked_share(shares):
    assert ch09.expected_length(*shares, (3, 12)) > ch09.expected_length(1.0, 0.0, 0.0, (3, 12))
