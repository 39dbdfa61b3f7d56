"""Checkers for chapter 1, "GRPO by hand"."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from grpo_edu.algorithm import reference
from grpo_edu.exercises.checking import CheckResult, run_cases

ADVANTAGE_CASES = [
    ("chapter 1's rewards", [0.9, 0.3, -0.1, 0.7]),
    ("two responses", [1.0, 0.0]),
    ("one right out of eight", [0, 0, 0, 1, 0, 0, 0, 0]),
    ("all equal (no signal, must be zeros, not NaN)", [0.5, 0.5, 0.5, 0.5]),
    ("large and shifted", [1000.0, 1002.0, 1001.0, 999.0]),
    ("negative rewards", [-3.0, -1.0, -2.0]),
]


def check_group_advantages(fn: Callable, eps: float = 1e-8) -> CheckResult:
    """Exercise 1.1: fn(rewards, std) -> advantages (G,), with A = (r - mean) / (std + eps)
    and std "population" (divide by G) or "sample" (divide by G - 1)."""
    cases = []
    for std in ("population", "sample"):
        for name, rewards in ADVANTAGE_CASES:
            expected = reference.group_advantages(rewards, std=std, eps=eps)
            cases.append((f"{name}, std={std!r}, rewards={rewards}",
                          lambda r=rewards, s=std: fn(np.array(r, dtype=np.float64), s), expected))
    return run_cases("exercise 1.1 group advantages", cases, atol=1e-6)


# (ratio, advantage) pairs; epsilon = 0.2, so the trust region is [0.8, 1.2].
CLIP_QUIZ = [(1.30, 1.0), (1.30, -1.0), (0.70, 1.0), (0.70, -1.0), (1.10, 1.0), (0.90, -1.0),
             (1.20, 2.0), (0.50, -0.5)]


def clip_quiz_answers(epsilon: float = 0.2) -> np.ndarray:
    """For each CLIP_QUIZ pair: does the clipped branch win (so the token gets no gradient)?"""
    ratio = np.array([r for r, _ in CLIP_QUIZ])
    advantage = np.array([a for _, a in CLIP_QUIZ])
    return np.clip(ratio, 1 - epsilon, 1 + epsilon) * advantage < ratio * advantage


def check_clip_predictions(predictions: Sequence[bool]) -> CheckResult:
    """Exercise 1.2: for each (ratio, A) in CLIP_QUIZ with epsilon = 0.2, predict True if
    the token is clipped (min picks the clipped term strictly), else False.

    A prediction is one bit, so naming a wrong one would give its answer away: the report
    counts the wrong predictions in each half of the quiz (A > 0 and A < 0) instead."""
    result = CheckResult("exercise 1.2 which tokens clip")
    if len(predictions) != len(CLIP_QUIZ):
        result.failures.append(f"expected {len(CLIP_QUIZ)} predictions (one per CLIP_QUIZ pair), "
                               f"got {len(predictions)}")
        return result
    answers = clip_quiz_answers()
    for sign, label in ((1, "the pairs with A > 0"), (-1, "the pairs with A < 0")):
        chosen = [i for i, (_, a) in enumerate(CLIP_QUIZ) if np.sign(a) == sign]
        wrong = sum(bool(predictions[i]) != bool(answers[i]) for i in chosen)
        result.record(label, [] if not wrong else
                      [f"{wrong} of these {len(chosen)} predictions {'is' if wrong == 1 else 'are'} wrong"])
    return result


def check_k3(fn: Callable) -> CheckResult:
    """Exercise 1.3: fn(log_ref, log_new) -> per-token k3 estimate of KL(pi || pi_ref)."""
    rng = np.random.default_rng(0)
    inputs = [
        ("chapter 1's first token", np.array([-0.60]), np.array([-0.5434])),
        ("identical policies (must be exactly 0)", np.array([-0.3, -2.0]), np.array([-0.3, -2.0])),
        ("policy far more confident than the reference", np.array([-5.0]), np.array([-0.01])),
        ("random tokens", -rng.exponential(size=6), -rng.exponential(size=6)),
    ]
    cases = [(f"{name}: log_ref={np.round(ref, 4).tolist()}, log_new={np.round(new, 4).tolist()}",
              lambda ref=ref, new=new: fn(ref, new), reference.k3(ref, new))
             for name, ref, new in inputs]
    return run_cases("exercise 1.3 the k3 estimator", cases, atol=1e-9)
