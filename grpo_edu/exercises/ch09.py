"""Checkers for chapter 9, "What GRPO teaches a model"."""

from __future__ import annotations

from typing import Callable

from grpo_edu.environment.digitsum import read_format
from grpo_edu.exercises.checking import CheckResult, run_cases

# --------------------------------------------------------------------------- 9.1

# Completions in the markup, each with what makes it tricky; read_format says what each is.
FORMAT_CASES = [
    ("a direct answer", "<think></think>\\boxed{6}"),
    ("a worked chain", "<think>a33b81c56d17e96</think>\\boxed{6}"),
    ("a worked chain cut short (still worked: wrong, not another format)", "<think>a33b81</think>\\boxed{6}"),
    ("a check", "<think>a33b81c57!c56d17e96</think>\\boxed{6}"),
    ("a check of a right value", "<think>a33b81c56!c56</think>\\boxed{6}"),
    ("a '!' in the answer, not in the reasoning", "<think>a33</think>\\boxed{!}"),
    ("the digits without their running values", "<think>a3b8c5</think>\\boxed{6}"),
    ("a space between two steps", "<think>a33 b81</think>\\boxed{6}"),
    ("the answer written in the reasoning", "<think>6</think>\\boxed{6}"),
    ("text after the boxed answer", "<think></think>\\boxed{6}}"),
    ("no boxed answer", "<think></think>6"),
    ("a second reasoning block", "<think>a33</think><think></think>\\boxed{6}"),
    ("cut at the length limit", "<think>a33b81c56"),
    ("a '!' inside a step", "<think>a3!3</think>\\boxed{6}"),
]


def check_read_format(fn: Callable[[str], str]) -> CheckResult:
    """Exercise 9.1: fn(completion) -> 'direct', 'worked', 'check' or 'other'."""
    cases = [(f"{description}: {text!r}", lambda t=text: fn(t), read_format(text))
             for description, text in FORMAT_CASES]

    def describe(expected, got):
        return None if got == expected else f"got {got!r}"
    return run_cases("exercise 9.1 what a completion does", cases, describe=describe)


# --------------------------------------------------------------------------- 9.2

DIRECT_TOKENS = 6     # <think> </think> \boxed{ digit } <eos>: every markup tag is one token
STEP_TOKENS = 3       # a step: its letter, its digit, the running value
CHECK_TOKENS = 4      # a check adds the wrong step and its "!"


def expected_length(direct: float, worked: float, check: float, depths: tuple[int, int]) -> float:
    """The mean completion length (tokens, EOS included) of a policy that answers in each format
    with these shares, on problems whose depth is uniform over depths (inclusive), a check
    writing one check: direct 6 tokens, worked 6 + 3n, with a check 6 + 3n + 4."""
    low, high = depths
    mean_depth = (low + high) / 2
    return DIRECT_TOKENS + (worked + check) * STEP_TOKENS * mean_depth + check * CHECK_TOKENS


LENGTH_CASES = [
    ("only direct answers, depths 3 to 12", (1.0, 0.0, 0.0, (3, 12))),
    ("only worked chains, depths 3 to 12", (0.0, 1.0, 0.0, (3, 12))),
    ("the base's shares, depths 3 to 12", (0.5, 0.4, 0.1, (3, 12))),
    ("a trained policy's shares, depths 3 to 12", (0.01, 0.9, 0.09, (3, 12))),
    ("only checks, depth 5 alone", (0.0, 0.0, 1.0, (5, 5))),
    ("half direct, half worked, depths 1 to 2", (0.5, 0.5, 0.0, (1, 2))),
]


def check_expected_length(fn: Callable) -> CheckResult:
    """Exercise 9.2: fn(direct, worked, check, depths) -> the expected mean length in tokens."""
    cases = [(f"{description}: shares {args[:3]}, depths {args[3]}", lambda a=args: float(fn(*a)),
              expected_length(*args)) for description, args in LENGTH_CASES]
    return run_cases("exercise 9.2 the length a format costs", cases, atol=1e-9)
