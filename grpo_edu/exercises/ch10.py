"""Checkers for chapter 10, "Rollouts that lag"."""

from __future__ import annotations

from typing import Callable

import torch

from grpo_edu.exercises.checking import CheckResult, compare
from grpo_edu.algorithm.offpolicy import Correction, correction_weights

F64 = torch.float64


# --------------------------------------------------------------------------- 10.1

def sequence_mask_cases(seed: int = 0) -> list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor, tuple]]:
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

    # Long responses whose every token is a little off in the same direction: each token in any
    # per-token band, the product far out of it, the geometric mean a little out.
    drift_old = -torch.rand(3, 24, generator=g, dtype=F64) - 0.5
    drift_sampler = drift_old - torch.tensor([0.05, 0.3, -0.3], dtype=F64)[:, None]
    return [
        ("8 responses of 1-12 tokens, a small mismatch", *batch(8, 12, 0.2), (0.8, 1.25)),
        ("8 responses of 1-12 tokens, a large mismatch", *batch(8, 12, 0.8), (0.5, 2.0)),
        ("3 responses of 24 tokens, each token off by a constant", drift_old, drift_sampler,
         torch.ones(3, 24, dtype=torch.bool), (0.8, 1.25)),
        ("6 responses, lengths 1, 2, 3, 8, 16, 16, with padding", *batch(6, 16, 0.4, [1, 2, 3, 8, 16, 16]),
         (0.7, 1.4)),
    ]


def check_sequence_mask(fn: Callable, seed: int = 0) -> CheckResult:
    """Exercise 10.1: fn(old_logp (N, S), sampler_logp (N, S), mask (N, S) bool, band (low, high))
    -> w (N, S): 1 for every token of a response whose geometric-mean ratio
    exp(mean over its real tokens of (old_logp - sampler_logp)) lies in [low, high], 0 for every
    token of one that leaves it; padding may hold anything (it is not compared)."""
    result = CheckResult("exercise 10.1 the sequence mask")
    for name, old, sampler, mask, band in sequence_mask_cases(seed):
        expected, _ = correction_weights(old, sampler, mask, Correction(is_mask="sequence", is_mask_band=band))
        try:
            got = fn(old.clone(), sampler.clone(), mask.clone(), band)
            got = torch.as_tensor(got, dtype=F64)
        except Exception as error:  # noqa: BLE001 - the reader's code: report, do not crash
            result.record(name, [f"raised {type(error).__name__}: {error}"])
            continue
        if got.shape != expected.shape:
            result.record(name, [f"returned shape {tuple(got.shape)}; the case needs shape {tuple(expected.shape)}"])
            continue
        problems = []
        kept = expected[:, 0] == 1
        real_got = got.where(mask, torch.zeros_like(got))
        real_expected = expected.where(mask, torch.zeros_like(expected))
        uneven = [i for i in range(len(got)) if len(set(got[i][mask[i]].tolist())) > 1]
        if uneven:
            problems.append(f"the tokens of response {uneven[0]} do not all get the same weight (a sequence "
                            f"mask keeps or drops a response whole)")
        else:
            wrong_keep = [i for i in range(len(got)) if kept[i] and real_got[i][mask[i]][0] != 1]
            wrong_drop = [i for i in range(len(got)) if not kept[i] and real_got[i][mask[i]][0] != 0]
            if wrong_keep or wrong_drop:
                words = []
                if wrong_drop:
                    words.append(f"{len(wrong_drop)} response(s) kept that leave the band")
                if wrong_keep:
                    words.append(f"{len(wrong_keep)} response(s) dropped or reweighed that lie in it")
                problems.append(", ".join(words))
            else:
                problem = compare(real_expected.numpy(), real_got.numpy(), 1e-12)
                if problem:
                    problems.append(problem)
        result.record(name, problems)
    return result
