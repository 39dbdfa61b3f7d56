"""The policy term of the loss: which ratio, and which surrogate of it, registered by name.

The ratio compares the policy with pi_old, the policy that sampled (config key
importance_sampling_level):

    token     rho_t = exp(logp_t - old_logp_t)                  PPO's, GRPO's (one per token)
    sequence  rho_i = exp(mean_t (logp_t - old_logp_t))         GSPO's: one per response, its
                                                                  length-normalised log-ratio
                                                                  (Zheng et al., 2025, "Group
                                                                  Sequence Policy Optimization")

The surrogate turns the ratio and the advantage A into the per-token policy loss (config key
surrogate):

    clip      -min(rho A, clip(rho, 1 - epsilon, 1 + epsilon_high) A)   PPO's clip (Schulman et
              al., 2017); epsilon_high > epsilon is DAPO's clip-higher
    capped    -sg(min(rho, c)) A log pi_t, c = ratio_cap, sg a constant: no clip (CISPO, the
              MiniMax-M1 report, 2025). Its gradient is -min(rho, c) A grad log pi: at rho = 1
              the clipped surrogate's, and a token far off-policy keeps a capped gradient where
              the clip would give it none

A surrogate is registered whole: its per-token loss, the metrics that describe it (the clip's
clip_ratio/*, the cap's ratio/capped), the check of its settings, and the name TRL 1.16 gives
it (grpo_edu.commands.trl_bridge). A new one is one decorated function and its test; the
config key surrogate names it.

    RATIO_LEVELS   name -> log_ratio(log_ratio (N, S), mask (N, S), lengths (N, 1)) -> (N, S) or (N, 1)
    SURROGATES     name -> Surrogate(loss, metrics, check, trl_loss_type)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from grpo_edu.runtime.registry import registrar

LogRatio = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
RATIO_LEVELS: dict[str, LogRatio] = {}

ratio_level = registrar(RATIO_LEVELS)   # @ratio_level("name") registers a ratio level (config key importance_sampling_level)


@ratio_level("token")
def token_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """One ratio per token: (N, S) -> (N, S)."""
    return log_ratio


@ratio_level("sequence")
def sequence_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """GSPO: one ratio per response, the mean of its tokens' log-ratios: (N, S) -> (N, 1)."""
    return (log_ratio * mask).sum(-1, keepdim=True) / lengths.clamp(min=1)


IMPORTANCE_SAMPLING_LEVELS = tuple(RATIO_LEVELS)


def check_ratio_level(level, name: str = "importance_sampling_level") -> None:
    if level not in RATIO_LEVELS:
        raise ValueError(f"{name} must be one of {tuple(RATIO_LEVELS)}, got {level!r}")


# --------------------------------------------------------------------------- surrogates

@dataclass(frozen=True)
class Surrogate:
    """A registered surrogate, whole.

    loss(ratio, A, logp, settings) -> the per-token policy loss (N, S), before the mask
    metrics(ratio, A, unit_mean, settings) -> its own metrics (unit_mean: the mean over tokens,
        or over completions at the sequence level)
    reductions: each of those metrics -> how it combines over micro-batches and ranks ("unit":
        weighted by tokens, or by completions at the sequence level; "token", "sum", "min", "max";
        grpo_edu.training.metrics)
    check(settings) -> None, or one line naming the setting that does not fit it
    trl_loss_type: TRL 1.16's loss_type for it when TRL names the surrogate that way ("cispo",
        which also fixes the aggregation), else None (TRL's loss_type names the aggregation)
    """

    loss: Callable[..., torch.Tensor]
    metrics: Callable[..., dict[str, float]]
    reductions: dict[str, str]
    check: Callable[..., None]
    trl_loss_type: str | None = None


SURROGATES: dict[str, Surrogate] = {}


def surrogate(name: str, *, metrics: Callable, reductions: dict[str, str], check: Callable,
              trl_loss_type: str | None = None):
    """@surrogate("name", metrics=..., reductions=..., check=...) registers a surrogate's loss with the
    rest of it."""
    def register(loss: Callable) -> Callable:
        SURROGATES[name] = Surrogate(loss, metrics, dict(reductions), check, trl_loss_type)
        return loss
    return register


def check_surrogate(name, key: str = "surrogate") -> None:
    if name not in SURROGATES:
        raise ValueError(f"{key} must be one of {tuple(SURROGATES)}, got {name!r}")


def clip_metrics(ratio, A, unit_mean, settings) -> dict[str, float]:
    """clip_ratio/low: rho < 1 - epsilon with A < 0; /high: rho > 1 + epsilon_high with A > 0;
    /region: either (the tokens that get no policy gradient)."""
    low = (ratio < 1.0 - settings.epsilon) & (A < 0)
    high = (ratio > 1.0 + settings.high) & (A > 0)
    return {"clip_ratio/low": unit_mean(low), "clip_ratio/high": unit_mean(high),
            "clip_ratio/region": unit_mean(low | high)}


def check_clip(settings) -> None:
    if settings.ratio_cap:
        raise ValueError(f"ratio_cap = {settings.ratio_cap} is the capped surrogate's largest weight, but surrogate "
                         f"= 'clip' has no cap: set surrogate = 'capped', or ratio_cap = 0")


@surrogate("clip", metrics=clip_metrics, check=check_clip,
           reductions={"clip_ratio/low": "unit", "clip_ratio/high": "unit", "clip_ratio/region": "unit"})
def clipped(ratio: torch.Tensor, A: torch.Tensor, logp: torch.Tensor, settings) -> torch.Tensor:
    """-min(rho A, clip(rho, 1 - epsilon, 1 + epsilon_high) A). Where the clipped term is
    smaller it wins the min, and it is constant in theta: those tokens get no policy gradient
    (the trust region)."""
    clipped_ratio = torch.clamp(ratio, 1.0 - settings.epsilon, 1.0 + settings.high)
    return -torch.minimum(ratio * A, clipped_ratio * A)


def capped_metrics(ratio, A, unit_mean, settings) -> dict[str, float]:
    """ratio/capped: the share of ratios above the cap (no clip: the clip_ratio metrics would
    describe a trust region that is not there)."""
    return {"ratio/capped": unit_mean(ratio > settings.ratio_cap)}


def check_ratio_cap(ratio_cap, name: str = "ratio_cap") -> None:
    """The capped surrogate's largest weight: a finite number > 1 (0 where it is not used)."""
    if isinstance(ratio_cap, bool) or not isinstance(ratio_cap, (int, float)) or not (
            ratio_cap == 0 or (ratio_cap > 1 and math.isfinite(ratio_cap))):
        raise ValueError(f"{name} must be 0 (unused: the clipped surrogate) or a finite number > 1 (the capped "
                         f"surrogate's largest weight), got {ratio_cap!r}")


def check_capped(settings) -> None:
    if not settings.ratio_cap:
        raise ValueError("surrogate = 'capped' needs ratio_cap, its largest weight: a finite number > 1, got 0")


@surrogate("capped", metrics=capped_metrics, check=check_capped, reductions={"ratio/capped": "unit"},
           trl_loss_type="cispo")
def capped(ratio: torch.Tensor, A: torch.Tensor, logp: torch.Tensor, settings) -> torch.Tensor:
    """-sg(min(rho, ratio_cap)) A log pi: the weight is a constant, the gradient flows through
    log pi only."""
    return -torch.clamp(ratio, max=settings.ratio_cap).detach() * A * logp
