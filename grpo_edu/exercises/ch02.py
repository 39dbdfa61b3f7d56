"""Checkers for chapter 2, "Advantages and clipping, interactively".

Each exercise asks for one quantity an explorer shows; the expected values come from
the same grpo_edu functions the explorers call.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from grpo_edu.algorithm import worked_example
from grpo_edu.algorithm.advantages import group_advantages
from grpo_edu.algorithm.estimators import clipped_objective, response_token_weights
from grpo_edu.exercises.checking import CheckResult, run_cases
from grpo_edu.algorithm.kl import KL_ESTIMATORS, kl_estimate
from grpo_edu.algorithm.reference import log_softmax

BATCH_CASES = [
    ("chapter 1's group and a nearly solved prompt", [list(worked_example.REWARDS), [1.0, 0.9, 1.0, 0.9]]),
    ("an all-equal group (must give zeros, not NaN)", [[0.9, 0.3, -0.1, 0.7], [0.5, 0.5, 0.5, 0.5]]),
    ("one right out of six, twice", [[0, 0, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]]),
    ("three prompts of two", [[1.0, 0.0], [0.2, 0.4], [-1.0, 3.0]]),
]


def check_batch_advantages(fn: Callable) -> CheckResult:
    """Exercise 2.1: fn(rewards (B, G) ndarray, scale) -> advantages (B, G), population std,
    eps = 1e-8, for scale "group" (each prompt's std), "batch" (one std over all B x G
    rewards, the mean still per prompt) and "none" (Dr. GRPO: no division)."""
    cases = []
    for scale in ("group", "batch", "none"):
        for name, rewards in BATCH_CASES:
            array = np.array(rewards, dtype=np.float64)
            cases.append((f"{name}, scale={scale!r}, rewards={rewards}",
                          lambda r=array, s=scale: fn(r.copy(), s),
                          group_advantages(array, scale=scale)))
    return run_cases("exercise 2.1 advantages with group, batch and no std scaling", cases,
                     atol=1e-6)


# (advantage, eps_low, eps_high) settings; each is checked on CLIP_RATIOS.
CLIP_SETTINGS = [
    ("A > 0, symmetric clip", 1.0, 0.2, 0.2),
    ("A < 0, symmetric clip", -0.5, 0.2, 0.2),
    ("A > 0, clip-higher (eps_high = 0.28)", 2.0, 0.2, 0.28),
    ("A < 0, clip-higher (eps_high = 0.28)", -1.5, 0.2, 0.28),
    ("A = 0 (gradient zero everywhere)", 0.0, 0.2, 0.2),
    ("eps = 0 (no trust region at all)", 1.0, 0.0, 0.0),
]
CLIP_RATIOS = np.array([0.5, 0.79, 0.95, 1.05, 1.19, 1.25, 1.5, 2.0])


def check_clip_gradient(fn: Callable) -> CheckResult:
    """Exercise 2.2: fn(ratio (N,), advantage, eps_low, eps_high) -> d objective / d rho (N,)
    of objective = min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)."""
    cases = []
    for name, advantage, low, high in CLIP_SETTINGS:
        expected = clipped_objective(CLIP_RATIOS, advantage, epsilon=low, epsilon_high=high).gradient
        cases.append((f"{name}: A={advantage:+.2f}, eps_low={low}, eps_high={high}, "
                      f"ratio={CLIP_RATIOS.tolist()}",
                      lambda a=advantage, lo=low, hi=high: fn(CLIP_RATIOS.copy(), a, lo, hi), expected))
    return run_cases("exercise 2.2 the gradient of the clipped objective", cases, atol=1e-9)


KL_CASES = [
    ("the explorer's default", worked_example.NEW_LOGITS[0][0], (0.5, 0.0, 0.5)),
    ("identical distributions (all zero)", (0.3, -1.0, 2.0), (0.3, -1.0, 2.0)),
    ("far apart", (3.0, 0.0, -3.0), (-3.0, 0.0, 3.0)),
    ("four tokens", (0.0, 1.0, 2.0, 3.0), (1.0, 1.0, 1.0, 1.0)),
]


def expected_estimates(logits, ref_logits) -> np.ndarray:
    """(E_pi[k1], E_pi[k2], E_pi[k3]) for pi = softmax(logits), pi_ref = softmax(ref_logits)."""
    logp = torch.from_numpy(log_softmax(np.asarray(logits, dtype=np.float64)))
    ref_logp = torch.from_numpy(log_softmax(np.asarray(ref_logits, dtype=np.float64)))
    probs = logp.exp()
    return np.array([float((probs * kl_estimate(logp, ref_logp, k)).sum()) for k in KL_ESTIMATORS])


def check_expected_estimates(fn: Callable) -> CheckResult:
    """Exercise 2.3: fn(logits (V,), ref_logits (V,)) -> [E[k1], E[k2], E[k3]], the exact means
    of the three estimators over x ~ pi = softmax(logits) (no sampling)."""
    cases = [(f"{name}: logits={list(logits)}, ref_logits={list(ref)}",
              lambda lo=logits, re=ref: fn(np.array(lo, dtype=np.float64), np.array(re, dtype=np.float64)),
              expected_estimates(logits, ref))
             for name, logits, ref in KL_CASES]
    return run_cases("exercise 2.3 the estimators' exact means", cases, atol=1e-8)


WEIGHT_CASES = [
    ("chapter 1's lengths", [3, 2, 2, 2], 4),
    ("short and long", [10, 1000], 1024),
    ("the length-bias explorer's default", [20, 54, 147, 400], 512),
    ("all the same length", [64, 64, 64], 128),
]


def check_response_weights(fn: Callable) -> CheckResult:
    """Exercise 2.4: fn(lengths (G,), loss_type, max_completion_length) -> (G,) how much each
    response counts in the loss in total: its length times the weight of one of its tokens
    (d loss / d that token's loss), for loss_type "grpo", "dr_grpo" and "dapo" (num_items =
    the group's token count)."""
    cases = []
    for loss_type in ("grpo", "dr_grpo", "dapo"):
        for name, lengths, longest in WEIGHT_CASES:
            expected = np.array(lengths) * response_token_weights(
                lengths, loss_type, max_completion_length=longest)
            cases.append((f"{name}, loss_type={loss_type!r}, lengths={lengths}, "
                          f"max_completion_length={longest}",
                          lambda n=lengths, t=loss_type, m=longest: fn(np.array(n), t, m), expected))
    return run_cases("exercise 2.4 what a response is worth (the length bias)", cases, atol=1e-9)
