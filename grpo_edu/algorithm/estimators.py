"""Per-token pieces of the GRPO objective, as functions of plain numbers.

The explorers of chapter 2 plot these against one input at a time. None of them
re-derives the maths: each asks grpo_edu.algorithm.loss (the loss the trainer runs) and reads
the answer off, by autograd where a gradient is wanted.

    clipped_objective(ratio, A)      min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)
                                     and its derivative in rho, token by token
    categorical_kl(logits, ref)      the exact KL(pi || pi_ref) of two categoricals, the
                                     number the k1 / k2 / k3 estimators (kl.kl_estimate)
                                     estimate from samples
    response_token_weights(lengths)  how much one token of each response counts in the
                                     loss under each loss_type (the length bias)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from grpo_edu.algorithm.aggregation import aggregation_weights
from grpo_edu.algorithm.loss import grpo_loss
from grpo_edu.algorithm.reference import log_softmax

# grpo_loss takes log-probabilities (<= 0). A ratio rho is fed as
# logp = log(rho) - OFFSET, old_logp = -OFFSET, so rho up to e^OFFSET is representable.
OFFSET = 8.0


@dataclass(frozen=True)
class ClippedObjective:
    """The clipped surrogate of N tokens with ratios rho and advantages A, all (N,)."""

    ratio: np.ndarray          # rho = pi / pi_old
    advantage: np.ndarray      # A
    objective: np.ndarray      # min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)
    gradient: np.ndarray       # d objective / d rho: A where rho A wins the min, else 0

    @property
    def clipped(self) -> np.ndarray:
        """bool (N,): the token gets no policy gradient although A != 0."""
        return (self.gradient == 0) & (self.advantage != 0)

    @property
    def clipped_low(self) -> np.ndarray:
        """bool (N,): clipped with A < 0 (rho fell below 1 - eps_low)."""
        return self.clipped & (self.advantage < 0)

    @property
    def clipped_high(self) -> np.ndarray:
        """bool (N,): clipped with A > 0 (rho rose above 1 + eps_high)."""
        return self.clipped & (self.advantage > 0)


def clipped_objective(ratio, advantage, *, epsilon: float = 0.2,
                      epsilon_high: float | None = None) -> ClippedObjective:
    """PPO's clipped surrogate per token and its derivative in rho, from grpo_loss.

    ratio: (N,) rho = pi / pi_old, 0 < rho < e^8; advantage: a scalar or (N,).
    epsilon / epsilon_high: the clip range [1 - epsilon, 1 + epsilon_high];
    epsilon_high defaults to epsilon (DAPO's clip-higher sets it larger).

    Each token is one response of length 1, so grpo_loss's per-token loss is exactly
    -objective, and autograd through it gives d objective / d log rho = rho dobj/drho.

    The min makes the bound pessimistic: a token is clipped (zero gradient) only where
    moving further would *improve* the objective past the trust region: rho > 1 +
    eps_high when A > 0, rho < 1 - eps_low when A < 0. Where the move made things worse
    (A > 0 and rho < 1 - eps_low) rho A stays the minimum and the gradient A pulls the
    token back. A = 0 gives zero objective and zero gradient everywhere.
    """
    ratio = np.asarray(ratio, dtype=np.float64).reshape(-1)
    if not np.all((ratio > 0) & (ratio < np.exp(OFFSET))):
        raise ValueError(f"ratio must lie in (0, e^{OFFSET:g}) (it is pi / pi_old), got "
                         f"[{ratio.min()}, {ratio.max()}]")
    advantage = np.broadcast_to(np.asarray(advantage, dtype=np.float64), ratio.shape).copy()
    logp = torch.tensor(np.log(ratio) - OFFSET, dtype=torch.float64).reshape(-1, 1)
    logp.requires_grad_(True)
    result = grpo_loss(logp, torch.full_like(logp, -OFFSET).detach(), torch.from_numpy(advantage),
                       torch.ones_like(logp, dtype=torch.bool), epsilon=epsilon,
                       epsilon_high=epsilon_high, loss_type="grpo")
    per_token = result.per_token_loss.reshape(-1)
    (d_loss_d_logp,) = torch.autograd.grad(per_token.sum(), logp)
    gradient = -d_loss_d_logp.reshape(-1).numpy() / ratio     # d obj / d rho = (d obj / d log rho) / rho
    return ClippedObjective(ratio=ratio, advantage=advantage,
                            objective=-per_token.detach().numpy(), gradient=gradient + 0.0)


def categorical_kl(logits, ref_logits) -> float:
    """Exact KL(pi || pi_ref) = sum_x pi(x) (log pi(x) - log pi_ref(x)) of pi = softmax(logits)
    and pi_ref = softmax(ref_logits): (V,), (V,) -> float."""
    logp, ref_logp = log_softmax(np.asarray(logits)), log_softmax(np.asarray(ref_logits))
    if logp.shape != ref_logp.shape or logp.ndim != 1:
        raise ValueError(f"logits and ref_logits must both have shape (V,), got {logp.shape} "
                         f"and {ref_logp.shape}")
    return float(np.sum(np.exp(logp) * (logp - ref_logp)))


def response_token_weights(lengths, loss_type: str, *, max_completion_length: int | None = None,
                           num_items: float | None = None) -> np.ndarray:
    """The loss weight of one token of each response: lengths (N,) -> (N,).

    d loss / d (a token's per-token loss) under `loss_type`, read from
    aggregation.aggregation_weights on the completion mask of responses of these lengths
    (every token of a response gets the same weight). max_completion_length defaults
    to the longest response; num_items (dapo) to the responses' token count.
    """
    lengths = np.asarray(lengths).reshape(-1)
    if lengths.size < 1 or not np.all(lengths >= 1) or not np.all(lengths == np.round(lengths)):
        raise ValueError(f"lengths must be whole numbers >= 1, got {lengths.tolist()}")
    lengths = lengths.astype(np.int64)
    longest = int(lengths.max())
    mask = torch.arange(longest)[None, :] < torch.from_numpy(lengths)[:, None]     # (N, S)
    if max_completion_length is None:
        max_completion_length = longest
    weights = aggregation_weights(mask, loss_type, max_completion_length=int(max_completion_length),
                                  num_items=num_items)
    return weights[:, 0].numpy()
