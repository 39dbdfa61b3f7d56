"""Checkers for chapter 3, "The masked (B, G, S) step"."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from grpo_edu.exercises.checking import CheckResult, compare, run_cases
from grpo_edu.algorithm.logprobs import token_logprobs
from grpo_edu.algorithm.loss import grpo_loss

F64 = torch.float64


def _numbers(value) -> np.ndarray:
    """A reader's result as a NumPy array, whatever it is (tensor with grad, float, ...)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(F64).numpy()
    return np.asarray(value, dtype=np.float64)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- 3.1

# (description, N, T, V, S)
ALIGNMENT_CASES = [
    ("4 rows of 9 columns, V = 11, S = 5", 4, 9, 11, 5),
    ("one completion token (S = 1)", 3, 6, 7, 1),
    ("a one-token prompt (S = T - 1)", 2, 7, 5, 6),
    ("one row, V = 50", 1, 12, 50, 4),
]


def check_completion_logprobs(fn: Callable) -> CheckResult:
    """Exercise 3.1: fn(logits (N, T, V), input_ids (N, T), S) -> (N, S) log-probs of
    the last S tokens of each row, scored by the logits one column to their left."""
    result = CheckResult("exercise 3.1 align logits with tokens")
    for seed, (description, N, T, V, S) in enumerate(ALIGNMENT_CASES):
        logits = 2 * torch.randn(N, T, V, generator=_generator(seed), dtype=F64)
        ids = torch.randint(0, V, (N, T), generator=_generator(100 + seed))
        expected = token_logprobs(logits[:, T - S - 1:-1], ids[:, T - S:]).numpy()
        unshifted = token_logprobs(logits[:, T - S:], ids[:, T - S:]).numpy()
        try:
            got = _numbers(fn(logits.clone(), ids.clone(), S))
        except Exception as error:  # the reader's code: report, don't crash the notebook
            result.record_raised(description, error)
            continue
        problem = compare(expected, got, atol=1e-8)
        if problem is None:
            result.passed += 1
        elif got.shape == unshifted.shape and np.allclose(got, unshifted, atol=1e-8):
            result.failures.append(
                f"{description}: off by one column: you scored token j with the logits at column j, "
                f"which predict token j + 1")
        else:
            result.failures.append(f"{description}: {problem}")
    return result


# --------------------------------------------------------------------------- 3.2

def _masked_loss_cases():
    """(description, logp, old_logp, advantages, mask), all (N, S) / (N,) float64."""
    gen = _generator(7)
    N, S = 4, 6
    lengths = torch.tensor([6, 2, 4, 1])
    mask = torch.arange(S) < lengths[:, None]
    logp = -3 * torch.rand(N, S, generator=gen, dtype=F64)
    old = (logp + 0.3 * torch.randn(N, S, generator=gen, dtype=F64)).clamp(max=0)
    advantages = torch.tensor([1.2, -0.4, 0.7, -1.5], dtype=F64)
    full = torch.ones(N, S, dtype=torch.bool)
    nan_padding = logp.masked_fill(~mask, float("nan"))
    huge_padding = old.masked_fill(~mask, -1e4)   # exp(logp - old) overflows to inf there
    return [
        ("no padding", logp, old, advantages, full),
        ("padding holding ordinary numbers", logp, old, advantages, mask),
        ("padding holding NaN in logp (a sampler's 'no value')", nan_padding, old, advantages, mask),
        ("padding holding -1e4 in old_logp, so the ratio there is inf", logp, huge_padding, advantages, mask),
        ("first step: logp == old_logp", logp, logp.clone(), advantages, mask),
        ("one token per completion", logp[:, :1], old[:, :1], advantages, full[:, :1]),
    ]


def check_masked_grpo_loss(fn: Callable, epsilon: float = 0.2) -> CheckResult:
    """Exercise 3.2: fn(logp (N, S), old_logp (N, S), advantages (N,), mask (N, S) bool,
    epsilon) -> the grpo loss without KL: token mean per completion, then mean."""
    cases = []
    for description, logp, old, advantages, mask in _masked_loss_cases():
        expected = grpo_loss(logp, old, advantages, mask, epsilon=epsilon).loss.item()
        cases.append((description,
                      lambda l=logp, o=old, a=advantages, m=mask: float(_numbers(fn(l.clone(), o.clone(), a, m, epsilon))),
                      expected))
    return run_cases("exercise 3.2 the masked loss", cases, atol=1e-9)


# --------------------------------------------------------------------------- 3.3

def first_step_gradient(advantages: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    """d loss / d logp at rho = 1, grpo, no KL, by autograd through grpo_loss: (N, S)."""
    logp = torch.full(mask.shape, -1.0, dtype=F64, requires_grad=True)
    loss = grpo_loss(logp, logp.detach().clone(), advantages.to(F64), mask).loss
    (grad,) = torch.autograd.grad(loss, logp)
    return grad.numpy()


def check_first_step_gradient(fn: Callable) -> CheckResult:
    """Exercise 3.3: fn(advantages (N,), mask (N, S) bool) -> (N, S) d loss / d logp at
    the first step (ratio 1), loss_type "grpo", no KL; 0 on padding."""
    half = 1.5 ** 0.5  # population-std advantages of rewards (2, 1, 0)
    inputs = [
        ("chapter 3's batch", [half, 0.0, -half, 0.0, half, -half], [14, 5, 5, 5, 13, 2]),
        ("equal lengths", [1.0, -1.0, 0.5, -0.5], [3, 3, 3, 3]),
        ("one long, one short", [1.0, -1.0], [1, 8]),
        ("a zero-advantage group", [0.0, 0.0, 0.0], [2, 4, 1]),
    ]
    cases = []
    for description, advantage_list, length_list in inputs:
        advantages = torch.tensor(advantage_list, dtype=F64)
        lengths = torch.tensor(length_list)
        mask = torch.arange(int(lengths.max())) < lengths[:, None]
        shown = ", ".join(f"{a:+.4f}" for a in advantage_list)
        cases.append((f"{description}: advantages [{shown}], lengths {length_list}",
                      lambda a=advantages, m=mask: _numbers(fn(a.clone(), m.clone())),
                      first_step_gradient(advantages, mask)))
    return run_cases("exercise 3.3 the first-step gradient", cases, atol=1e-9)
