"""Checkers for chapter 6, "A tiny reasoner learns"."""

from __future__ import annotations

from typing import Callable

import torch

from grpo_edu.exercises.checking import CheckResult, check_labels

ADVANTAGE_CASES = {
    "two groups": [[1.5, 0.0, 0.0, 1.5], [1.0, 0.0, 0.5, 2.5]],
    "one right out of eight": [[0, 0, 0, 1, 0, 0, 0, 0]],
    "an all-equal group beside a mixed one": [[0.5, 0.5, 0.5, 0.5], [0.0, 1.0, 0.0, 1.0]],
    "large rewards": [[1000.0, 1001.0, 1003.0, 1002.0]],
}


def check_advantage_function(fn: Callable[[torch.Tensor], torch.Tensor]) -> CheckResult:
    """Exercise 6.1: the properties any advantage function must have before the
    trainer uses it: (B, G) in, (B, G) finite out; zero mean per group; exactly 0 for
    a group whose rewards are all equal; unchanged when a constant is added to a
    group; a higher reward never gets a lower advantage within its group."""
    result = CheckResult("exercise 6.1 an advantage function")
    for name, rows in ADVANTAGE_CASES.items():
        rewards = torch.tensor(rows, dtype=torch.float64)
        try:
            advantages = fn(rewards.clone())
            shifted = fn(rewards + 7.0)
        except Exception as error:  # the reader's code: report, don't crash
            result.record_raised(name, error)
            continue
        if not isinstance(advantages, torch.Tensor) or advantages.shape != rewards.shape:
            result.failures.append(f"{name}: expected a tensor of shape {tuple(rewards.shape)}, got "
                                   f"{getattr(advantages, 'shape', type(advantages).__name__)}")
            continue
        advantages = advantages.double()
        problems = []
        if not torch.isfinite(advantages).all():
            problems.append(f"non-finite values {advantages.tolist()}")
        else:
            means = advantages.mean(dim=1)
            if means.abs().max() > 1e-6:
                problems.append(f"group means should be 0, got {[round(m, 6) for m in means.tolist()]}")
            flat = (rewards == rewards[:, :1]).all(dim=1)
            if flat.any() and (advantages[flat] != 0).any():
                problems.append(f"an all-equal group must get exactly 0, got {advantages[flat].tolist()}")
            if (shifted.double() - advantages).abs().max() > 1e-6:
                problems.append("adding 7 to every reward changed the advantages")
            for b in range(rewards.shape[0]):
                order = torch.argsort(rewards[b])
                if (advantages[b][order].diff() < -1e-9).any():
                    problems.append(f"group {b}: a higher reward got a lower advantage "
                                    f"(rewards {rewards[b].tolist()}, advantages {[round(a, 4) for a in advantages[b].tolist()]})")
        result.record(name, problems)
    return result


# Last-step metrics of four runs (made up for the exercise, each shaped like a real
# failure: see chapter 6's table of healthy values).
RUNS = {
    "run A": {"reward/accuracy": 0.81, "reward/format": 0.99, "zero_std_groups": 0.44, "kl": 0.021,
              "entropy": 0.35, "completion_length/mean": 10.2, "truncated": 0.0},
    "run B": {"reward/accuracy": 0.02, "reward/format": 0.11, "zero_std_groups": 0.9, "kl": 0.95,
              "entropy": 2.9, "completion_length/mean": 15.8, "truncated": 0.85},
    "run C": {"reward/accuracy": 0.0, "reward/format": 1.0, "zero_std_groups": 1.0, "kl": 0.0,
              "entropy": 0.41, "completion_length/mean": 10.0, "truncated": 0.0},
    "run D": {"reward/accuracy": 0.62, "reward/format": 0.97, "zero_std_groups": 0.3, "kl": 4.7,
              "entropy": 0.05, "completion_length/mean": 9.1, "truncated": 0.0},
}
DIAGNOSES = {"run A": "healthy", "run B": "format collapse", "run C": "no signal", "run D": "runaway kl"}
# What a run with each failure shows: the report quotes the sign of the name a reader gave
# that does not fit, never the right name.
SIGNS = {
    "format collapse": "a format reward near 0 and most completions truncated (the policy lost the output format)",
    "no signal": "zero_std_groups = 1: every group's rewards equal, so no advantages and no gradient",
    "runaway kl": "a KL to the reference far above 1 and an entropy near 0",
}


def check_diagnoses(diagnoses: dict[str, str]) -> CheckResult:
    """Exercise 6.2: name each run of RUNS 'healthy', 'format collapse', 'no signal' or 'runaway kl'."""
    return check_labels("exercise 6.2 read a run", diagnoses, DIAGNOSES, ["healthy", *SIGNS], SIGNS)
