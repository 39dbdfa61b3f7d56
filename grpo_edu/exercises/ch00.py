"""Checkers for chapter 0, "From REINFORCE to GRPO"."""

from __future__ import annotations

import numpy as np
import torch

from grpo_edu.algorithm import baselines
from grpo_edu.algorithm.bandit import Bandit, moments
from grpo_edu.exercises.checking import CheckResult, compare

# --------------------------------------------------------------------------- 0.1


def rloo_cases() -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [
        ("one group of 4, one right answer", torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)),
        ("an all-equal group", torch.tensor([[0.5, 0.5, 0.5, 0.5]], dtype=torch.float64)),
        ("G = 2", torch.tensor([[1.5, 0.5]], dtype=torch.float64)),
        ("8 random groups of 6", torch.rand(8, 6, generator=generator, dtype=torch.float64)),
        ("float32 rewards, 3 groups of 8", torch.randint(0, 3, (3, 8), generator=generator).float() / 2),
    ]


def check_rloo(fn) -> CheckResult:
    """Exercise 0.1: fn(rewards (B, G)) -> the leave-one-out advantages (B, G)."""
    result = CheckResult("exercise 0.1 RLOO")
    for name, rewards in rloo_cases():
        expected = baselines.rloo(rewards)
        try:
            got = fn(rewards.clone())
        except Exception as error:  # noqa: BLE001 - the reader's code: report, do not crash
            result.record_raised(name, error)
            continue
        if not isinstance(got, torch.Tensor) or got.shape != rewards.shape:
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            result.record(name, [f"must return a tensor of shape {tuple(rewards.shape)}, got {shape}"])
            continue
        tolerance = 1e-6 if rewards.dtype == torch.float32 else 1e-12
        problem = compare(expected.double().numpy(), got.detach().double().numpy(), tolerance)
        result.record(name, [problem] if problem else [])
    return result


# --------------------------------------------------------------------------- 0.2

def exact_mean_cases() -> list[tuple[str, Bandit, int, object]]:
    two = Bandit([0.0, 1.0], [1.0, 0.0])
    chapter = Bandit([0.0, 0.5, 1.0, -0.5], [1.0, 0.0, 0.0, 0.5])
    return [
        ("2 tokens, G = 1, no baseline", two, 1, None),
        ("2 tokens, G = 3, RLOO", two, 3, baselines.rloo),
        ("the chapter's bandit, G = 4, no baseline", chapter, 4, None),
        ("the chapter's bandit, G = 4, group mean", chapter, 4, baselines.group_mean),
        ("the chapter's bandit, G = 3, GRPO", chapter, 3, baselines.grpo),
    ]


def check_exact_mean(fn) -> CheckResult:
    """Exercise 0.2: fn(probs (K,), rewards (K,), G, advantage_fn) -> E[g_hat] (K,), where
    advantage_fn maps a (N, G) float64 tensor of rewards to advantages, or is None (A = r)."""
    result = CheckResult("exercise 0.2 the estimator's exact mean")
    for name, bandit, G, advantage_fn in exact_mean_cases():
        expected = moments(bandit, G, advantage_fn).mean
        try:
            got = np.asarray(fn(bandit.probs.copy(), bandit.rewards.copy(), G, advantage_fn), dtype=np.float64)
        except Exception as error:  # noqa: BLE001
            result.record_raised(name, error)
            continue
        problem = compare(expected, got, 1e-10)
        result.record(name, [problem] if problem else [])
    return result
