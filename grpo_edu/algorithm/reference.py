"""One GRPO update in pure NumPy, one response at a time: the test oracle.

Everything here is written for reading, not speed. A group is one prompt with G
sampled responses; response i has T_i tokens over a vocabulary of V entries. No
padding and no masks: each response is its own array, so nothing can leak
between responses. The PyTorch code of later chapters is tested against this.

The objective is DeepSeekMath's per-token form (Shao et al., 2024, eq. 3). The
DeepSeek-R1 paper (its eq. 1-3) writes the ratio and the KL per whole output,
pi(o_i | q) / pi_old(o_i | q), with no mean over tokens; chapter 1 compares the two.

    A_i      = (r_i - mean(r)) / (std(r) + eps)                     group advantage
    rho_i,t  = exp(log pi(o_i,t) - log pi_old(o_i,t))                ratio
    obj_i,t  = min(rho A_i, clip(rho, 1 - eps_low, 1 + eps_high) A_i)
    kl_i,t   = exp(ref - new) - (ref - new) - 1                      k3 estimator
    loss_i   = mean_t(-obj_i,t + beta kl_i,t)                        token mean
    loss     = mean_i(loss_i)                                        group mean
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

STD_KINDS = ("population", "sample")


def _as_finite_vector(values, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional (G,), got shape {array.shape}")
    bad = ~np.isfinite(array)
    if bad.any():
        index = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} must be finite, got {array[index]} at index {index}")
    return array


def _group_mean(rewards: np.ndarray) -> float:
    # Shifted by the first reward: exact for an all-equal group (so its advantages
    # are exactly zero), and more accurate for large rewards with a small spread.
    return float(rewards[0] + sum(r - rewards[0] for r in rewards) / len(rewards))


def group_std(rewards, std: str = "population") -> float:
    """Standard deviation of one group's rewards: (G,) -> float.

    std="population" divides by G (NumPy's default, the formula as usually written);
    std="sample" divides by G - 1 (Bessel's correction: torch.std and TRL).
    """
    if std not in STD_KINDS:
        raise ValueError(f"std must be one of {STD_KINDS}, got {std!r}")
    rewards = _as_finite_vector(rewards, "rewards")
    G = len(rewards)
    mean = _group_mean(rewards)
    squares = sum((r - mean) ** 2 for r in rewards)
    return float(np.sqrt(squares / (G if std == "population" else G - 1)))


def group_advantages(rewards, *, std: str = "population", scale_by_std: bool = True,
                     eps: float = 1e-8) -> np.ndarray:
    """Group-relative advantages of one prompt's responses: rewards (G,) -> (G,).

    A_i = (r_i - mean(r)) / (std(r) + eps), or r_i - mean(r) when
    scale_by_std=False (Dr. GRPO). An all-equal group gives exactly zeros.
    """
    rewards = _as_finite_vector(rewards, "rewards")
    if len(rewards) < 2:
        raise ValueError(f"rewards needs G >= 2 responses to form a group, got G = {len(rewards)}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    mean = _group_mean(rewards)
    centred = np.array([r - mean for r in rewards])
    if not scale_by_std:
        return centred
    return centred / (group_std(rewards, std) + eps)


def log_softmax(logits) -> np.ndarray:
    """Row-wise log-softmax, stable for large logits: (T, V) -> (T, V).

    Subtracting each row's maximum first keeps exp() from overflowing.
    """
    logits = np.asarray(logits, dtype=np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def k3(log_ref, log_new) -> np.ndarray:
    """Schulman's k3 estimator of KL(pi || pi_ref), per token: (T,), (T,) -> (T,).

    With d = log pi_ref - log pi: exp(d) - d - 1 >= 0. Unbiased for tokens drawn
    from pi itself (not from an older sampler); as a loss, its expected gradient is
    that of KL(pi_ref || pi), not of KL(pi || pi_ref) (chapter 1, step 5).
    """
    d = np.asarray(log_ref, dtype=np.float64) - np.asarray(log_new, dtype=np.float64)
    return np.exp(d) - d - 1.0


@dataclass
class ResponseTerms:
    """Every intermediate value of one response's part of the loss (T = its length)."""

    advantage: float            # A_i, shared by all T tokens
    log_probs: np.ndarray       # (T, V) log-softmax of the new logits
    new_logp: np.ndarray        # (T,)   log pi at the sampled tokens
    old_logp: np.ndarray        # (T,)
    ref_logp: np.ndarray        # (T,)
    ratio: np.ndarray           # (T,)   pi / pi_old
    surrogate: np.ndarray       # (T,)   rho * A
    clipped_surrogate: np.ndarray  # (T,) clip(rho) * A
    objective: np.ndarray       # (T,)   min of the two
    clipped: np.ndarray         # (T,)   bool: the clipped branch won (no gradient)
    kl: np.ndarray              # (T,)   k3 per token
    objective_mean: float       # mean_t objective
    kl_mean: float              # mean_t kl
    loss: float                 # -objective_mean + beta * kl_mean
    grad_logits: np.ndarray     # (T, V) d(group loss) / d(new logits)


@dataclass
class GRPOUpdate:
    """One group's GRPO loss with every intermediate value."""

    rewards: np.ndarray         # (G,)
    mean: float
    std: float                  # the std used (population or sample)
    advantages: np.ndarray      # (G,)
    responses: list[ResponseTerms] = field(default_factory=list)
    loss: float = 0.0           # mean over the G responses


def grpo_update(token_ids: Sequence[Sequence[int]], new_logits: Sequence, old_logp: Sequence,
                ref_logp: Sequence, rewards, *, epsilon: float = 0.2,
                epsilon_high: float | None = None, beta: float = 0.04, std: str = "population",
                scale_by_std: bool = True, eps: float = 1e-8) -> GRPOUpdate:
    """The GRPO loss of one group, response by response.

    token_ids[i]: (T_i,) sampled token ids of response i
    new_logits[i]: (T_i, V) logits of the policy being trained at those positions
    old_logp[i], ref_logp[i]: (T_i,) log-probs of the sampling and reference policies
    rewards: (G,) one scalar per response
    epsilon / epsilon_high: clip range [1 - epsilon, 1 + epsilon_high]; epsilon_high
        defaults to epsilon (the symmetric clip that DeepSeekMath and DeepSeek-R1 write)
    beta: weight of the k3 KL penalty (0.04 is DeepSeekMath's value and chapter 1's
        example's; DeepSeek-R1 used 0.001)
    std, scale_by_std, eps: as in group_advantages
    """
    G = len(token_ids)
    for name, value in (("new_logits", new_logits), ("old_logp", old_logp),
                        ("ref_logp", ref_logp), ("rewards", rewards)):
        if len(value) != G:
            raise ValueError(f"{name} must have one entry per response (G = {G} from token_ids), "
                             f"got {len(value)}")
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    if not (0 <= epsilon < 1 and epsilon_high >= 0):
        raise ValueError(f"need 0 <= epsilon < 1 and epsilon_high >= 0, got epsilon={epsilon}, "
                         f"epsilon_high={epsilon_high}")
    rewards = _as_finite_vector(rewards, "rewards")
    advantages = group_advantages(rewards, std=std, scale_by_std=scale_by_std, eps=eps)
    update = GRPOUpdate(rewards=rewards, mean=_group_mean(rewards),
                        std=group_std(rewards, std), advantages=advantages)

    for i in range(G):
        ids = np.asarray(token_ids[i], dtype=np.int64)
        logits = np.asarray(new_logits[i], dtype=np.float64)
        old = _as_finite_vector(old_logp[i], f"old_logp[{i}]")
        ref = _as_finite_vector(ref_logp[i], f"ref_logp[{i}]")
        T = len(ids)
        if T == 0:
            raise ValueError(f"token_ids[{i}] is empty: every response needs at least one token")
        if logits.ndim != 2 or logits.shape[0] != T:
            raise ValueError(f"new_logits[{i}] must have shape (T_i, V) = ({T}, V), got {logits.shape}")
        if len(old) != T or len(ref) != T:
            raise ValueError(f"old_logp[{i}] and ref_logp[{i}] must have T_i = {T} entries, "
                             f"got {len(old)} and {len(ref)}")
        if ids.min() < 0 or ids.max() >= logits.shape[1]:
            raise ValueError(f"token_ids[{i}] must lie in [0, V = {logits.shape[1]}), got {ids.tolist()}")

        A = float(advantages[i])
        log_probs = log_softmax(logits)
        new = log_probs[np.arange(T), ids]
        ratio = np.exp(new - old)
        surrogate = ratio * A
        clipped_surrogate = np.clip(ratio, 1.0 - epsilon, 1.0 + epsilon_high) * A
        objective = np.minimum(surrogate, clipped_surrogate)
        # The clipped branch is a constant in theta: where it is strictly smaller,
        # the token contributes no policy gradient.
        clipped = clipped_surrogate < surrogate
        kl = k3(ref, new)
        loss_i = float(-objective.mean() + beta * kl.mean())

        # d loss / d new_logp, then through log-softmax: d new_logp / d logits = onehot - softmax.
        d_new = (np.where(clipped, 0.0, -ratio * A) + beta * (1.0 - np.exp(ref - new))) / (T * G)
        onehot = np.zeros_like(logits)
        onehot[np.arange(T), ids] = 1.0
        grad_logits = d_new[:, None] * (onehot - np.exp(log_probs))

        update.responses.append(ResponseTerms(
            advantage=A, log_probs=log_probs, new_logp=new, old_logp=old, ref_logp=ref,
            ratio=ratio, surrogate=surrogate, clipped_surrogate=clipped_surrogate,
            objective=objective, clipped=clipped, kl=kl, objective_mean=float(objective.mean()),
            kl_mean=float(kl.mean()), loss=loss_i, grad_logits=grad_logits))

    update.loss = float(np.mean([r.loss for r in update.responses]))
    return update


def process_advantages(steps: Sequence[Sequence[tuple[int, float]]], lengths: Sequence[int], *,
                       std: str = "population", scale_by_std: bool = True, eps: float = 1e-8) -> list[np.ndarray]:
    """Process-supervised advantages of one group (DeepSeekMath 4.1.3), one token at a time.

    steps: G lists, steps[i] = [(end, reward), ...]: completion i's steps, each the index of
        its last token and its reward (a completion may have no step)
    lengths: G token counts. Returns G arrays: A_i,t, t < lengths[i], the sum over completion
    i's steps with end >= t of (reward - mean) / (std + eps), mean and std over every step
    reward of the group (all equal, or fewer than two: every advantage 0).
    """
    if len(steps) != len(lengths) or len(steps) < 2:
        raise ValueError(f"steps and lengths need one entry per completion, G >= 2, got {len(steps)} and {len(lengths)}")
    every = [reward for completion in steps for _, reward in completion]
    flat = len(set(every)) <= 1
    if not flat:
        mean = _group_mean(np.asarray(every, dtype=np.float64))
        spread = group_std(every, std) if scale_by_std else None
    advantages = []
    for completion, length in zip(steps, lengths):
        values = np.zeros(length)
        for t in range(length):
            for end, reward in completion:
                if not 0 <= end < length:
                    raise ValueError(f"a step ends at token {end}, outside the completion's {length} tokens")
                if end >= t and not flat:
                    values[t] += (reward - mean) / (spread + eps) if scale_by_std else reward - mean
        advantages.append(values)
    return advantages
