"""Checkers for chapter 4, "Loss variants and length bias"."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from grpo_edu.algorithm.advantages import zero_std_groups
from grpo_edu.exercises.checking import CheckResult, as_bools, as_numbers, run_cases
from grpo_edu.algorithm.aggregation import aggregation_weights
from grpo_edu.algorithm.loss import grpo_loss

F64 = torch.float64


def _mask(lengths) -> torch.Tensor:
    lengths = torch.as_tensor(lengths)
    return torch.arange(int(lengths.max())) < lengths[:, None]


# --------------------------------------------------------------------------- 4.1

TOKEN_WEIGHT_CASES = [
    ("equal lengths", [5, 5, 5, 5], 8),
    ("short and long", [2, 40], 64),
    ("chapter 4's prompt 0", [6, 40, 8, 60], 64),
    ("one completion at the limit", [16, 1, 3], 16),
]


def check_token_weights(fn: Callable) -> CheckResult:
    """Exercise 4.1: fn(lengths (N,), loss_type, max_completion_length) -> (N,) weight of
    one token of each completion, for loss_type "grpo", "bnpo" and "dr_grpo"."""
    cases = []
    for loss_type in ("grpo", "bnpo", "dr_grpo"):
        for description, lengths, max_length in TOKEN_WEIGHT_CASES:
            expected = aggregation_weights(_mask(lengths), loss_type, max_completion_length=max_length)[:, 0]
            cases.append((f"{loss_type}, {description}: lengths {lengths}, max_completion_length {max_length}",
                          lambda n=lengths, t=loss_type, m=max_length: as_numbers(fn(torch.tensor(n), t, m)),
                          expected.numpy()))
    return run_cases("exercise 4.1 token weights", cases, atol=1e-12)


# --------------------------------------------------------------------------- 4.2

def _informative_cases():
    # Three equal rewards of 0.7: the mean rounds, so r - mean is 1.1e-16, not 0.
    return [
        ("binary rewards", torch.tensor([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])),
        ("equal rewards whose r - mean rounds to 1e-16, not 0",
         torch.tensor([[0.7, 0.7, 0.7], [0.1, 0.2, 0.3]], dtype=F64)),
        ("a small but real difference (a partial-credit reward)",
         torch.tensor([[1.0, 1.0, 1.0, 1.0005], [0.5, 0.5, 0.5, 0.5]], dtype=F64)),
        ("every group saturated", torch.tensor([[2.0, 2.0], [0.0, 0.0], [-1.0, -1.0]])),
        ("a single prompt", torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]])),
    ]


def check_informative_groups(fn: Callable) -> CheckResult:
    """Exercise 4.2: fn(rewards (B, G)) -> (B,) bool, True for the groups that carry signal
    (rewards not all equal): the zero-std filter (filter_zero_std_groups) keeps exactly those."""
    cases = []
    for description, rewards in _informative_cases():
        expected = ~zero_std_groups(rewards).numpy()
        cases.append((f"{description}: rewards {rewards.tolist()}",
                      lambda r=rewards: as_bools(fn(r.clone())), expected))
    return run_cases("exercise 4.2 the zero-std filter", cases)


# --------------------------------------------------------------------------- 4.3

def _sequence_cases():
    gen = torch.Generator().manual_seed(4)
    lengths = torch.tensor([5, 1, 3, 5])
    mask = _mask(lengths)
    logp = -2 * torch.rand(4, 5, generator=gen, dtype=F64)
    old = (logp + 0.2 * torch.randn(4, 5, generator=gen, dtype=F64)).clamp(max=0)
    garbage_old = old.masked_fill(~mask, -50.0)   # what padding holds must not matter
    return [
        ("no padding", logp, old, torch.ones_like(mask)),
        ("different lengths", logp, old, mask),
        ("padding holding -50 in old_logp", logp, garbage_old, mask),
        ("first step (logp == old_logp)", logp, logp.clone(), mask),
    ]


def check_sequence_ratio(fn: Callable) -> CheckResult:
    """Exercise 4.3: fn(logp (N, S), old_logp (N, S), mask (N, S) bool) -> (N,) GSPO ratio
    exp(mean over each completion's tokens of logp - old_logp)."""
    cases = []
    for description, logp, old, mask in _sequence_cases():
        expected = grpo_loss(logp, old, torch.zeros(logp.shape[0], dtype=F64), mask,
                             importance_sampling_level="sequence").ratio[:, 0]
        cases.append((description, lambda l=logp, o=old, m=mask: as_numbers(fn(l.clone(), o.clone(), m.clone())),
                      expected.numpy()))
    return run_cases("exercise 4.3 the GSPO ratio", cases, atol=1e-12)
