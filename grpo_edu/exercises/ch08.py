"""Checkers for chapter 8, "DAPO's toolbox, measured"."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from grpo_edu.algorithm import entropy_mask
from grpo_edu.exercises.checking import CheckResult, as_bools, as_numbers, run_cases
from grpo_edu.environment.rewards import soft_overlong_punishment

F64 = torch.float64


# --------------------------------------------------------------------------- 8.1

# (description, lengths |o_i|, max_completion_length L, overlong_cache c)
OVERLONG_CASES = [
    ("the chapter's setting, L = 9, c = 2", [5, 6, 7, 8, 9], 9, 2),
    ("DAPO's slack scaled to this task, L = 13, c = 3", [7, 9, 10, 11, 12, 13], 13, 3),
    ("DAPO's own, L = 20480, c = 4096", [1000, 16383, 16384, 16385, 18432, 20479, 20480], 20480, 4096),
    ("the narrowest cache, c = 1", [3, 4, 5], 5, 1),
    ("a length past the limit (an episode's later turns)", [10, 12, 14], 12, 4),
]


def check_overlong_punishment(fn: Callable) -> CheckResult:
    """Exercise 8.1: fn(lengths (N,) int tensor, max_completion_length, cache) -> (N,) the soft
    overlong punishment of each completion: 0 up to L - c tokens, falling linearly to -1 at L,
    and -1 past it."""
    cases = [(f"{description}: lengths {lengths}",
              lambda n=lengths, L=L, c=c: as_numbers(fn(torch.tensor(n), L, c)),
              soft_overlong_punishment(torch.tensor(lengths), L, c).numpy())
             for description, lengths, L, c in OVERLONG_CASES]
    return run_cases("exercise 8.1 the soft overlong punishment", cases, atol=1e-12)


# --------------------------------------------------------------------------- 8.2

def entropy_cases() -> list[tuple[str, torch.Tensor, torch.Tensor, float]]:
    """(description, entropies (N, S) float32 as the trainer computes them, mask (N, S) bool, q): padding that holds large numbers (a
    quantile over it is wrong), q = 1 (every real token), ties at the threshold (kept), and a
    quantile between two tokens (torch.quantile's linear interpolation)."""
    generator = torch.Generator().manual_seed(8)
    lengths = torch.tensor([3, 7, 5, 2])
    mask = torch.arange(7) < lengths[:, None]
    entropies = torch.rand(4, 7, generator=generator) * 2                    # float32, as the trainer's
    padded = torch.where(mask, entropies, torch.full_like(entropies, 9.0))    # padding is not 0 here
    ties = torch.tensor([[0.5, 0.5, 0.5, 0.1], [0.5, 0.9, 0.0, 0.0]])
    ties_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    return [
        ("4 completions, q = 0.2, padding holding 9.0", padded, mask, 0.2),
        ("the same, q = 0.5", padded, mask, 0.5),
        ("the same, q = 1 (every real token trains)", padded, mask, 1.0),
        ("ties at the threshold, q = 0.5", ties, ties_mask, 0.5),
        ("one completion of 6 tokens, q = 0.3", torch.tensor([[0.05, 1.2, 0.3, 0.8, 0.02, 0.6]]),
         torch.ones(1, 6, dtype=torch.bool), 0.3),
    ]


def check_entropy_mask(fn: Callable) -> CheckResult:
    """Exercise 8.2: fn(entropies (N, S), mask (N, S) bool, q) -> (tau, keep): the threshold, the
    (1 - q)-quantile of the real tokens' entropies (torch.quantile's linear interpolation), and
    the (N, S) bool mask of the real tokens whose entropy is at least tau."""
    cases = []
    for description, entropies, mask, q in entropy_cases():
        tau = entropy_mask.threshold([entropies], [mask], q)
        keep = entropy_mask.high_entropy_mask(entropies, mask, tau)
        answer: dict = {}

        def call(part, h=entropies, m=mask, q=q, memo=answer):
            if "value" not in memo:
                memo["value"] = fn(h.clone(), m.clone(), q)
            got = memo["value"]
            if not isinstance(got, (tuple, list)) or len(got) != 2:
                raise TypeError(f"expected a pair (tau, keep), got {type(got).__name__}")
            return float(got[0]) if part == 0 else as_bools(got[1])

        cases.append((f"{description}: tau", lambda call=call: call(0), tau))
        cases.append((f"{description}: keep", lambda call=call: call(1), keep.numpy()))
    return run_cases("exercise 8.2 the tokens that train", cases, atol=1e-6)
