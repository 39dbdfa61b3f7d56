"""Entropy masking (config key top_entropy_quantile): only the tokens at which the policy was
most uncertain train its policy term.

Wang et al. ("Beyond the 80/20 Rule", 2025) found that the tokens of a reasoning trace where
the policy's next-token entropy is high, a minority ("forks": which step next, which number),
carry the learning: RLVR restricted to the top 20% of tokens by entropy matched or beat the
full update. With top_entropy_quantile = q the trainer computes, before each optimizer step,
the exact entropy H_t = -sum_v pi(v) log pi(v) of every completion token's distribution
(grpo_edu.algorithm.logprobs.token_entropies, at the sampling temperature), takes the threshold

    tau = quantile(H over the step's real tokens, all ranks, 1 - q)      (torch.quantile, linear)

and zeroes the policy term of every token with H_t < tau. The KL term and the loss's
normaliser are left as they were: a masked token still counts in |o_i| and num_items, as in
TRL 1.16 (its get_high_entropy_mask; tests/test_trl_parity.py).

One difference from TRL, on purpose: TRL takes the quantile over one micro-batch (gathered
across processes), so its mask changes with per_device_train_batch_size and gradient
accumulation; here it is the optimizer step's whole mini-batch, so micro_batch_size and the
number of processes change nothing (tests/test_entropy_mask.py). With one micro-batch per
optimizer step the two are the same.

    threshold           tau over every part of the step on every rank
    high_entropy_mask   entropies, mask, tau -> the tokens that train
    entropy_metrics     entropy/mean, /min, /max over completions (each its token mean), and
                        with q < 1 entropy/threshold and entropy/kept
"""

from __future__ import annotations

import torch

from grpo_edu.runtime.distributed import World


def check_quantile(top_quantile, name: str = "top_entropy_quantile") -> float:
    if isinstance(top_quantile, bool) or not isinstance(top_quantile, (int, float)) or not 0 < top_quantile <= 1:
        raise ValueError(f"{name} must be a number in (0, 1] (the share of tokens, by entropy, whose "
                         f"policy term trains; 1 = all), got {top_quantile!r}")
    return float(top_quantile)


def threshold(entropies: list[torch.Tensor], masks: list[torch.Tensor], top_quantile: float,
              world: World = World()) -> float:
    """tau: the (1 - q)-quantile of the entropies of the real tokens of every part (micro-batches)
    on every rank. Tokens at or above it train. No real token anywhere: +inf (none train)."""
    check_quantile(top_quantile)
    local = torch.cat([h[m.bool()].float().reshape(-1) for h, m in zip(entropies, masks, strict=True)]
                      or [torch.zeros(0)])
    values = torch.cat([part.cpu() for part in world.gather_objects([local])])
    if values.numel() == 0:
        return float("inf")
    return float(torch.quantile(values, 1.0 - top_quantile))


def high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, tau: float) -> torch.Tensor:
    """The real tokens (mask) whose entropy is at least tau: bool, the shape of `entropies`."""
    if entropies.shape != mask.shape:
        raise ValueError(f"entropies must have the completion mask's shape {tuple(mask.shape)}, "
                         f"got {tuple(entropies.shape)}")
    return ((entropies * mask) >= tau) & mask.bool()


def entropy_metrics(entropies: list[torch.Tensor], masks: list[torch.Tensor], kept: list[torch.Tensor] | None,
                    tau: float, world: World = World()) -> dict[str, float]:
    """The step's entropy metrics over every part on every rank (ms-swift's names):
    entropy/mean, /min, /max of the completions' mean token entropies; with the parts' masks of
    kept tokens (high_entropy_mask; None when every token trains) entropy/threshold (tau) and
    entropy/kept (the share of real tokens whose policy term trains)."""
    per_completion, kept_tokens, tokens = [], 0.0, 0.0
    for i, (h, m) in enumerate(zip(entropies, masks, strict=True)):
        m = m.bool()
        if m.shape[0]:
            per_completion.append(((h * m).sum(-1) / m.sum(-1).clamp(min=1)).double().cpu())
        kept_tokens += float(kept[i].sum()) if kept is not None else 0.0
        tokens += float(m.sum())
    means = torch.cat([part for part in world.gather_objects(per_completion)] or [torch.zeros(0, dtype=torch.float64)])
    if means.numel() == 0:
        return {}
    metrics = {"entropy/mean": means.mean().item(), "entropy/min": means.min().item(),
               "entropy/max": means.max().item()}
    if kept is not None:
        counts = world.reduce(torch.tensor([kept_tokens, tokens], dtype=torch.float64))
        metrics.update({"entropy/threshold": tau, "entropy/kept": float(counts[0] / counts[1])})
    return metrics


def check_entropy_mask(entropy_mask: torch.Tensor, shape) -> torch.Tensor:
    if entropy_mask.shape != shape or entropy_mask.dtype != torch.bool:
        raise ValueError(f"entropy_mask must be a bool tensor of logp's shape {tuple(shape)}, got "
                         f"{entropy_mask.dtype} of shape {tuple(entropy_mask.shape)}")
    return entropy_mask
