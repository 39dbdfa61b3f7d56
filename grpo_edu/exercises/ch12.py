"""Checkers for chapter 12, "Rollouts that lag"."""

from __future__ import annotations

from typing import Callable

import torch

from grpo_edu.exercises.checking import CheckResult, compare
from grpo_edu.algorithm.offpolicy import Correction, correction_weights

F64 = torch.float64


# --------------------------------------------------------------------------- 11.1

def sequence_weight_cases(seed: int = 0) -> list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor, tuple]]:
    """(name, old_logp (N, S), sampler_logp (N, S), mask (N, S) bool, band): responses of
    different lengths, right-padded, whose padding holds garbage; seeded."""
    g = torch.Generator().manual_seed(1000 + seed)

    def batch(N, S, spread, lengths=None):
        old = -3 * torch.rand(N, S, generator=g, dtype=F64)
        sampler = old + spread * torch.randn(N, S, generator=g, dtype=F64)
        if lengths is None:
            lengths = torch.randint(1, S + 1, (N,), generator=g)
        mask = torch.arange(S)[None, :] < torch.as_tensor(lengths)[:, None]
        garbage = -50 * torch.rand(N, S, generator=g, dtype=F64)
        return old.where(mask, garbage), sampler.where(mask, garbage.flip(0)), mask

    def drift(shifts, S):
        """Responses of S tokens whose every token's log-ratio is the same shift: each token a
        little off, the product far off."""
        old = -torch.rand(len(shifts), S, generator=g, dtype=F64) - 0.5
        return old, old - torch.tensor(shifts, dtype=F64)[:, None], torch.ones(len(shifts), S, dtype=torch.bool)

    return [
        ("8 responses of 1-12 tokens, a small mismatch", *batch(8, 12, 0.2), (0.8, 1.25)),
        ("8 responses of 1-12 tokens, a large mismatch", *batch(8, 12, 0.8), (0.5, 2.0)),
        ("4 responses of 24 tokens, each token off by a constant", *drift([0.02, 0.05, -0.05, 0.3], 24),
         (0.8, 1.25)),
        ("6 responses, lengths 1, 2, 3, 8, 16, 16, with padding", *batch(6, 16, 0.4, [1, 2, 3, 8, 16, 16]),
         (0.7, 1.4)),
        ("2 responses of 200 tokens, each token a little stale", *drift([-0.02, 0.01], 200), (0.8, 1.25)),
    ]


def sequence_weights(old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
                     band: tuple[float, float]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference of exercise 12.1 (read the exercise, not this): the geometric mean and the
    product of each response's ratios, and the sequence mask's decision, grpo_edu.algorithm.offpolicy's."""
    log_r = (old_logp - sampler_logp).masked_fill(~mask, 0.0)
    w, _ = correction_weights(old_logp, sampler_logp, mask, Correction(is_mask="sequence", is_mask_band=band))
    keep = (w * mask).sum(-1) > 0
    return torch.exp(log_r.sum(-1) / mask.sum(-1)), torch.exp(log_r.sum(-1)), keep


def check_sequence_weights(fn: Callable, seed: int = 0) -> CheckResult:
    """Exercise 12.1: fn(old_logp (N, S), sampler_logp (N, S), mask (N, S) bool, band (low, high))
    -> (geometric (N,), product (N,), keep (N,) bool): each response's geometric-mean ratio and
    product of ratios over its real tokens, and whether the sequence mask keeps it."""
    result = CheckResult("exercise 12.1 a response's weight, two ways")
    for name, old, sampler, mask, band in sequence_weight_cases(seed):
        geometric, product, keep = sequence_weights(old, sampler, mask, band)
        try:
            got = fn(old.clone(), sampler.clone(), mask.clone(), band)
            if not isinstance(got, (tuple, list)) or len(got) != 3:
                result.record(name, [f"returned {type(got).__name__}; return three things: "
                                     f"(geometric, product, keep)"])
                continue
            got = [torch.as_tensor(x).detach().cpu() for x in got]
        except Exception as error:  # noqa: BLE001 - the reader's code: report, do not crash
            result.record_raised(name, error)
            continue
        problems = []
        got_geometric, got_product, got_keep = got[0].to(F64), got[1].to(F64), got[2]
        if problem := compare(geometric.numpy(), got_geometric.numpy(), 1e-9):
            if got_geometric.shape == product.shape and torch.allclose(got_geometric, product, rtol=1e-9, atol=1e-12):
                problems.append("geometric is each response's product (the sum of the log-ratios, not divided by "
                                "its length)")
            else:
                problems.append(f"geometric: {problem}")
        if problem := compare(product.numpy(), got_product.numpy(), 1e-9):
            problems.append(f"product: {problem}")
        if got_keep.dtype.is_floating_point and not torch.isin(got_keep, torch.tensor([0.0, 1.0],
                                                                                   dtype=got_keep.dtype)).all():
            problems.append("keep holds weights, not True/False: the sequence mask keeps or drops a response whole")
        elif problem := compare(keep.numpy(), got_keep.numpy(), 0):
            by_product = (product >= band[0]) & (product <= band[1])
            if got_keep.shape == keep.shape and torch.equal(got_keep.to(torch.bool), by_product):
                problems.append("keep decides by the product's place in the band, not the geometric mean's")
            else:
                problems.append(f"keep: {problem}")
        result.record(name, problems)
    return result


# --------------------------------------------------------------------------- 11.2

def run_seconds(phase: dict[str, float], steps: int, lag: int, overlap: bool) -> float:
    """The reference of exercise 12.2 (read the exercise, not this): a run's wall time from its
    phases, as grpo_edu.training.rollouts' Lagged and Overlapped order them."""
    sample = phase["rollout"] + phase["scoring"]
    if not overlap:
        return steps * (sample + phase["update"])
    alone = min(lag, steps)   # sampled before the first update; then as many updates at the end
    return alone * sample + (steps - alone) * max(sample, phase["update"]) + alone * phase["update"]


RUN_SECONDS_CASES = [
    ("sampling the longer lane, lag 1, 10 steps, overlapped", {"rollout": 0.6, "scoring": 0.1, "update": 0.3},
     10, 1, True),
    ("updating the longer lane, lag 1, 10 steps, overlapped", {"rollout": 0.2, "scoring": 0.05, "update": 0.5},
     10, 1, True),
    ("rollout < update < rollout + scoring, lag 1, 20 steps, overlapped",
     {"rollout": 0.3, "scoring": 0.2, "update": 0.4}, 20, 1, True),
    ("lag 4, 50 steps, overlapped", {"rollout": 0.25, "scoring": 0.05, "update": 0.35}, 50, 4, True),
    ("lag 4, 50 steps, not overlapped", {"rollout": 0.25, "scoring": 0.05, "update": 0.35}, 50, 4, False),
    ("a run shorter than its lag: lag 8, 5 steps, overlapped", {"rollout": 0.4, "scoring": 0.1, "update": 0.3},
     5, 8, True),
    ("phases of section 1's sizes, lag 2, 150 steps, overlapped",
     {"rollout": 0.057, "scoring": 0.049, "update": 0.126}, 150, 2, True),
]


def _run_seconds_mistakes(phase: dict[str, float], steps: int, lag: int, overlap: bool) -> dict[str, float]:
    """Plausible wrong answers, each with what it gets wrong (never a value)."""
    r, s, u = phase["rollout"], phase["scoring"], phase["update"]
    if not overlap:
        return {}
    alone = min(lag, steps)
    return {
        "every step counted as overlapped: look again at the run's first and last steps": steps * max(r + s, u),
        "scoring counted in the trainer's lane: the sampler's thread scores what it samples":
            alone * (r + s) + (steps - alone) * max(r, s + u) + alone * u,
        "scoring added after each overlapped step: the sampler's thread scores what it samples":
            alone * (r + s) + (steps - alone) * (max(r, u) + s) + alone * u,
        "one rollout sampled alone before the first update, whatever the lag":
            (r + s) + (steps - 1) * max(r + s, u) + u,
    }


def check_run_seconds(fn: Callable) -> CheckResult:
    """Exercise 12.2: fn(phase {"rollout", "scoring", "update"}: seconds, steps, lag, overlap) -> the
    run's seconds, compared on phase times and runs the checker chooses."""
    result = CheckResult("exercise 12.2 a run's wall time")
    for name, phase, steps, lag, overlap in RUN_SECONDS_CASES:
        expected = run_seconds(phase, steps, lag, overlap)
        try:
            got = fn(dict(phase), steps, lag, overlap)
            value = float(got)
        except Exception as error:  # noqa: BLE001 - the reader's code: report, do not crash
            result.record_raised(name, error)
            continue
        problem = compare(expected, value, 1e-9)
        if problem:
            named = [why for why, wrong in _run_seconds_mistakes(phase, steps, lag, overlap).items()
                     if abs(wrong - expected) > 1e-9 and abs(wrong - value) <= 1e-9]
            problem = named[0] if named else problem
        result.record(name, [problem] if problem else [])
    return result
