"""The policy term of the loss: which ratio, and which surrogate of it, registered by name.

The ratio compares the policy with pi_old, the policy that sampled (config key
importance_sampling_level):

    token     rho_t = exp(logp_t - old_logp_t)                  PPO's, GRPO's (one per token)
    sequence  rho_i = exp(mean_t (logp_t - old_logp_t))         GSPO's: one per response, its
                                                                  length-normalised log-ratio
                                                                  (Zheng et al., 2025)

The surrogate turns the ratio and the advantage A into the per-token policy loss:

    clip      -min(rho A, clip(rho, 1 - epsilon, 1 + epsilon_high) A)   PPO's clip (Schulman et
              al., 2017); epsilon_high > epsilon is DAPO's clip-higher
    capped    -sg(min(rho, c)) A log pi_t, c = ratio_cap, sg a constant: no clip (CISPO,
              MiniMax-M1, 2025; prime-rl's loss family). Its gradient is -min(rho, c) A
              grad log pi: at rho = 1 the clipped surrogate's, and a token far off-policy
              keeps a capped gradient where the clip would give it none

    RATIO_LEVELS   name -> log_ratio(log_ratio (N, S), mask (N, S), lengths (N, 1)) -> (N, S) or (N, 1)
    SURROGATES     name -> policy(ratio, A, logp, settings) -> per-token policy loss, before the mask
"""

from __future__ import annotations

from typing import Callable

import torch
from grpo_edu.runtime.registry import registrar

LogRatio = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
Surrogate = Callable[..., torch.Tensor]
RATIO_LEVELS: dict[str, LogRatio] = {}
SURROGATES: dict[str, Surrogate] = {}

ratio_level = registrar(RATIO_LEVELS)   # @ratio_level("name") registers a ratio level (config key importance_sampling_level)

surrogate = registrar(SURROGATES)   # @surrogate("name") registers a surrogate (LossSettings.surrogate names the one a run uses)


@ratio_level("token")
def token_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """One ratio per token: (N, S) -> (N, S)."""
    return log_ratio


@ratio_level("sequence")
def sequence_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """GSPO: one ratio per response, the mean of its tokens' log-ratios: (N, S) -> (N, 1)."""
    return (log_ratio * mask).sum(-1, keepdim=True) / lengths.clamp(min=1)


IMPORTANCE_SAMPLING_LEVELS = tuple(RATIO_LEVELS)


@surrogate("clip")
def clipped(ratio: torch.Tensor, A: torch.Tensor, logp: torch.Tensor, settings) -> torch.Tensor:
    """-min(rho A, clip(rho, 1 - epsilon, 1 + epsilon_high) A). Where the clipped term is
    smaller it wins the min, and it is constant in theta: those tokens get no policy gradient
    (the trust region)."""
    clipped_ratio = torch.clamp(ratio, 1.0 - settings.epsilon, 1.0 + settings.high)
    return -torch.minimum(ratio * A, clipped_ratio * A)


@surrogate("capped")
def capped(ratio: torch.Tensor, A: torch.Tensor, logp: torch.Tensor, settings) -> torch.Tensor:
    """-sg(min(rho, ratio_cap)) A log pi: the weight is a constant, the gradient flows through
    log pi only."""
    return -torch.clamp(ratio, max=settings.ratio_cap).detach() * A * logp
