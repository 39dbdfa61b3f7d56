"""Estimators of KL(pi || pi_ref) from one sampled token, registered by name (config key
kl_estimator).

With d = log pi_ref(o_t) - log pi(o_t) at a token o_t sampled from pi (Schulman, 2020,
"Approximating KL divergence"):

    k1 = -d                 unbiased, can be negative
    k2 = d^2 / 2            biased, low variance
    k3 = exp(d) - d - 1     unbiased, always >= 0 (DeepSeekMath's choice)

    KL_ESTIMATES   name -> estimate(d) -> per-token KL estimate
    kl_estimate    per-token estimate from the two log-probs
"""

from __future__ import annotations

from typing import Callable

import torch
from grpo_edu.runtime.registry import registrar

Estimate = Callable[[torch.Tensor], torch.Tensor]
KL_ESTIMATES: dict[str, Estimate] = {}

estimator = registrar(KL_ESTIMATES)   # @estimator("name") registers `estimate(d)`, KL estimator `name`


@estimator("k1")
def k1(d: torch.Tensor) -> torch.Tensor:
    return -d


@estimator("k2")
def k2(d: torch.Tensor) -> torch.Tensor:
    return 0.5 * d * d


@estimator("k3")
def k3(d: torch.Tensor) -> torch.Tensor:
    return torch.exp(d) - d - 1.0


KL_ESTIMATORS = tuple(KL_ESTIMATES)


def check_kl_estimator(estimator: str) -> None:
    if estimator not in KL_ESTIMATES:
        raise ValueError(f"kl_estimator must be one of {tuple(KL_ESTIMATES)}, got {estimator!r}")


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) at tokens sampled from pi: (...), (...) -> (...)."""
    check_kl_estimator(estimator)
    return KL_ESTIMATES[estimator](ref_logp - logp)
