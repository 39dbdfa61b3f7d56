"""The argument checks of grpo_edu.algorithm.loss.grpo_loss: each bad input gets one line naming the
argument, what was expected and what was given. The allowed names are the registries' (loss
types: aggregation.AGGREGATIONS; ratio levels: surrogates.RATIO_LEVELS; KL: kl.KL_ESTIMATES)."""

from __future__ import annotations

import math
from typing import Callable

import torch

from grpo_edu.algorithm.aggregation import check_loss_type
from grpo_edu.algorithm.kl import check_kl_estimator
from grpo_edu.algorithm.offpolicy import Correction
from grpo_edu.algorithm.surrogates import RATIO_LEVELS


def check_sampler(correction: Correction, sampler_logp, logp) -> None:
    if correction.active and sampler_logp is None:
        what = "tis_cap > 0" if correction.tis_cap else f"is_mask = {correction.is_mask!r}"
        raise ValueError(f"{what} needs sampler_logp (the sampler's log-probs of the sampled tokens), got None")
    if sampler_logp is not None and sampler_logp.shape != logp.shape:
        raise ValueError(f"sampler_logp must have logp's shape {tuple(logp.shape)}, got {tuple(sampler_logp.shape)}")


def check_entropy_mask(entropy_mask: torch.Tensor, shape) -> torch.Tensor:
    if entropy_mask.shape != shape or entropy_mask.dtype != torch.bool:
        raise ValueError(f"entropy_mask must be a bool tensor of logp's shape {tuple(shape)}, got "
                         f"{entropy_mask.dtype} of shape {tuple(entropy_mask.shape)}")
    return entropy_mask


def check_excluded(excluded: torch.Tensor, shape) -> torch.Tensor:
    if not isinstance(excluded, torch.Tensor) or excluded.shape != shape or excluded.dtype != torch.bool:
        got = f"{excluded.dtype} of shape {tuple(excluded.shape)}" if isinstance(excluded, torch.Tensor) else \
            type(excluded).__name__
        raise ValueError(f"excluded must be a bool tensor of the advantages' shape {tuple(shape)}, got {got}")
    return excluded


def check_ratio_cap(ratio_cap, name: str = "ratio_cap") -> None:
    if isinstance(ratio_cap, bool) or not isinstance(ratio_cap, (int, float)) or not (
            ratio_cap == 0 or (ratio_cap > 1 and math.isfinite(ratio_cap))):
        raise ValueError(f"{name} must be 0 (the clipped surrogate) or a finite number > 1 (the capped "
                         f"surrogate's largest weight), got {ratio_cap!r}")


def check_options(loss_type, level, kl_estimator, epsilon, epsilon_high, beta) -> None:
    check_loss_type(loss_type)
    if level not in RATIO_LEVELS:
        raise ValueError(f"importance_sampling_level must be one of {tuple(RATIO_LEVELS)}, got {level!r}")
    check_kl_estimator(kl_estimator)
    if not (isinstance(epsilon, (int, float)) and 0 <= epsilon < 1):
        raise ValueError(f"epsilon must be a number in [0, 1), got {epsilon!r}")
    if epsilon_high is not None and not (isinstance(epsilon_high, (int, float)) and epsilon_high >= 0):
        raise ValueError(f"epsilon_high must be a number >= 0 or None, got {epsilon_high!r}")
    if not (isinstance(beta, (int, float)) and beta >= 0):
        raise ValueError(f"beta must be a number >= 0, got {beta!r}")


def check_logprob_values(name: str, value: torch.Tensor, mask: torch.Tensor,
                         where: Callable[[torch.Tensor], str] | None = None) -> None:
    """Log-probabilities on the tokens of `mask` must be finite and <= 0 (a little slack for
    rounding near p = 1); a clearly positive one means probabilities or logits were passed.
    `where` names the first offending element (default: its index)."""
    where = where or first_bad
    bad = mask & ~torch.isfinite(value)
    if bad.any():
        raise ValueError(f"{name} must be finite on completion tokens, got "
                         f"{value[tuple(bad.nonzero()[0])].item()} at {where(bad)}")
    positive = mask & (value > 1e-4)
    if positive.any():
        raise ValueError(f"{name} must hold log-probabilities (<= 0), got "
                         f"{value[tuple(positive.nonzero()[0])].item():.4g} at {where(positive)}: "
                         f"were probabilities or logits passed?")


def first_bad(bad: torch.Tensor) -> str:
    return "position " + str(tuple(int(i) for i in bad.nonzero()[0]))


def check_inputs(logp, old_logp, advantages, completion_mask, ref_logp, beta) -> torch.Tensor:
    """Validate everything; return the completion mask as bool."""
    tensors = {"logp": logp, "old_logp": old_logp, "advantages": advantages,
               "completion_mask": completion_mask}
    if ref_logp is not None:
        tensors["ref_logp"] = ref_logp
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if logp.ndim not in (2, 3):
        raise ValueError(f"logp must have shape (B, G, S) or (N, S), got shape {tuple(logp.shape)}")
    if logp.shape[-1] < 1:
        raise ValueError(f"logp needs at least one completion column, got shape {tuple(logp.shape)}")
    for name in ("old_logp", "completion_mask", "ref_logp"):
        if name in tensors and tensors[name].shape != logp.shape:
            raise ValueError(f"{name} must have the shape of logp {tuple(logp.shape)}, "
                             f"got {tuple(tensors[name].shape)}")
    if advantages.shape not in (logp.shape[:-1], logp.shape):
        layout = "(B, G)" if logp.ndim == 3 else "(N,)"
        raise ValueError(f"advantages must have shape {layout} = {tuple(logp.shape[:-1])} (one per completion) "
                         f"or logp's shape {tuple(logp.shape)} (one per token: process supervision), got "
                         f"{tuple(advantages.shape)}")
    if logp.ndim == 3 and logp.shape[1] < 2:
        raise ValueError(f"logp of shape (B, G, S) needs G >= 2 completions per prompt, got G = {logp.shape[1]}")
    for name in ("logp", "old_logp", "advantages", "ref_logp"):
        if name in tensors and not tensors[name].is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {tensors[name].dtype}")
    for name in ("old_logp", "ref_logp", "advantages"):
        if name in tensors and tensors[name].requires_grad:
            raise ValueError(f"{name} requires grad, but it is a constant of the loss: pass "
                             f"{name}.detach() (with old_logp = logp undetached, the ratio is 1 "
                             f"for every theta and the policy gradient vanishes)")
    if beta != 0.0 and ref_logp is None:
        raise ValueError(f"beta = {beta} needs ref_logp (the reference policy's log-probs); "
                         f"pass ref_logp or set beta = 0")

    if completion_mask.dtype == torch.bool:
        mask = completion_mask
    elif completion_mask.is_complex() or not ((completion_mask == 0) | (completion_mask == 1)).all():
        raise ValueError("completion_mask must be bool or hold only 0 and 1, got values "
                         f"{torch.unique(completion_mask)[:5].tolist()}")
    else:
        mask = completion_mask != 0
    lengths = mask.sum(-1)
    if (lengths == 0).any():
        raise ValueError(f"every completion needs at least one token in completion_mask; completion at "
                         f"{first_bad(lengths == 0)} (of shape {tuple(lengths.shape)}) has none")

    with torch.no_grad():
        for name in ("logp", "old_logp", "ref_logp"):
            if name not in tensors:
                continue
            check_logprob_values(name, tensors[name].detach(), mask)
        bad = ~torch.isfinite(advantages)
        if bad.any():
            raise ValueError(f"advantages must be finite, got {advantages[tuple(bad.nonzero()[0])].item()} "
                             f"at {first_bad(bad)}")
    return mask
