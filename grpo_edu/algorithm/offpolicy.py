"""Corrections for tokens a sampler drew with log-probs other than pi_old's.

The sampler's log-probs mu (the rollout's sampler_logp) differ from pi_old's for two reasons:
its numerics (vLLM's kernels, bf16: chapter 11) and its age (rollout_lag = k with
old_logprobs = "proximal": the sampler had the weights of k updates ago, pi_old is the policy
now: chapter 12). With r_t = pi_old(o_t) / mu(o_t) per token, each correction is a constant
weight w_t on the token's policy term (the KL term is not weighed, as in TRL 1.16):

    tis_cap = c             w = min(r, c)                        TRL's "token_truncate"
    is_mask = "token"       w = r if low <= r <= high, else 0    TRL's "token_mask" (IcePop)
    is_mask = "sequence"    w = 1 if low <= g <= high, else 0    for every token of the response,
                            g = exp(mean_t log r_t) its geometric-mean ratio (TRL's
                            "sequence_mask" takes the product instead and weighs by it: a
                            different loss, so the TRL bridge refuses it)

(low, high) = is_mask_band. A masked token still counts in the loss type's normaliser, as in
TRL: it adds 0 to the sum, and the other tokens keep their weight.

    Correction            the three settings, from the config keys of the same names
    CORRECTIONS           name -> weights(r, log_r, mask, correction) -> w (N, S): "tis",
                          "token_mask", "sequence_mask" (Correction.kind names the one in use)
    correction_weights    w (N, S) and its metrics
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from grpo_edu.runtime.registry import registrar

IS_MASKS = ("none", "token", "sequence")
# config key old_logprobs, where pi_old comes from: the trainer's forward before the update, the
# sampler's own log-probs, or the policy at the update (with a lagging sampler: its proximal policy)
PI_OLD_SOURCES = ("recomputed", "sampler", "proximal")
Weights = Callable[..., torch.Tensor]
CORRECTIONS: dict[str, Weights] = {}

correction = registrar(CORRECTIONS)   # @correction("name") registers a correction's weights(r, log_r, mask, correction) -> w (N, S)


@dataclass(frozen=True)
class Correction:
    """How the loss corrects for the sampler: at most one of tis_cap (> 0) and is_mask (not "none")."""

    tis_cap: float = 0.0
    is_mask: str = "none"
    is_mask_band: tuple[float, float] = (0.5, 2.0)

    def __post_init__(self):
        check(self.tis_cap, self.is_mask, self.is_mask_band)

    @property
    def active(self) -> bool:
        return bool(self.tis_cap) or self.is_mask != "none"

    @property
    def kind(self) -> str | None:
        """The registered correction these settings name (CORRECTIONS), or None: no correction."""
        if self.tis_cap:
            return "tis"
        return None if self.is_mask == "none" else f"{self.is_mask}_mask"


def check(tis_cap, is_mask, band) -> None:
    """One-line errors for a correction's settings."""
    check_tis_cap(tis_cap)
    check_is_mask(is_mask)
    check_band(band)
    check_one_correction(tis_cap, is_mask)


# Each check names its setting `name`: the argument, or the config key ("config key 'tis_cap'").

def check_tis_cap(tis_cap, name: str = "tis_cap") -> None:
    if isinstance(tis_cap, bool) or not isinstance(tis_cap, (int, float)) or (tis_cap != 0 and not tis_cap >= 1):
        raise ValueError(f"{name} must be 0 (off) or >= 1 (the largest importance weight; a cap below "
                         f"1 would shrink every on-policy token's weight), got {tis_cap!r}")


def check_is_mask(is_mask, name: str = "is_mask") -> None:
    if is_mask not in IS_MASKS:
        raise ValueError(f"{name} must be one of {IS_MASKS}, got {is_mask!r}")


def check_band(band, name: str = "is_mask_band") -> None:
    if (not isinstance(band, (tuple, list)) or len(band) != 2
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in band)
            or not 0 <= band[0] < 1 < band[1] or not math.isfinite(band[1])):
        raise ValueError(f"{name} must be [low, high] with 0 <= low < 1 < high (finite), got {band!r}")


def check_one_correction(tis_cap, is_mask) -> None:
    if tis_cap and is_mask != "none":
        raise ValueError(two_corrections(tis_cap, is_mask))


def two_corrections(tis_cap, is_mask, name=lambda key: key) -> str:
    return (f"{name('tis_cap')} ({tis_cap}) and {name('is_mask')} ({is_mask!r}) are two corrections of the same "
            f"weight: set one (tis_cap = 0 or is_mask = 'none')")


def correction_weights(old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
                       correction: Correction) -> tuple[torch.Tensor, dict[str, float]]:
    """w (N, S), 1 on padding, and its metrics over the real tokens of `mask` (N, S) bool:

      is_ratio/mean, /min, /max   r = pi_old / mu over real tokens: the mismatch's spread
      tis/mean, tis/truncated     (tis_cap) the mean of w, and the share of tokens the cap truncated
      is/masked                   (is_mask) the share of real tokens whose weight the mask set to 0

    old_logp and sampler_logp are constants (no gradient flows through w)."""
    log_r = (old_logp.detach() - sampler_logp).masked_fill(~mask, 0.0)   # 0 on padding: r = 1 there
    r = torch.exp(log_r)
    kind = correction.kind
    w = torch.ones_like(r) if kind is None else CORRECTIONS[kind](r, log_r, mask, correction)
    w = torch.where(mask, w, torch.ones_like(w))
    with torch.no_grad():
        real = r[mask]
        metrics = {"is_ratio/mean": real.mean().item(), "is_ratio/min": real.min().item(),
                   "is_ratio/max": real.max().item()}
        if correction.tis_cap:
            metrics["tis/mean"] = w[mask].mean().item()
            metrics["tis/truncated"] = (real > correction.tis_cap).to(r.dtype).mean().item()
        if correction.is_mask != "none":
            metrics["is/masked"] = (w[mask] == 0).to(r.dtype).mean().item()
    return w, metrics


@correction("tis")
def truncated(r: torch.Tensor, log_r: torch.Tensor, mask: torch.Tensor, settings: Correction) -> torch.Tensor:
    """Truncated importance sampling: w = min(r, tis_cap)."""
    return torch.clamp(r, max=settings.tis_cap)


@correction("token_mask")
def token_mask(r: torch.Tensor, log_r: torch.Tensor, mask: torch.Tensor, settings: Correction) -> torch.Tensor:
    """IcePop's token mask: w = r inside is_mask_band, else 0."""
    low, high = settings.is_mask_band
    return r * ((r >= low) & (r <= high))


@correction("sequence_mask")
def sequence_mask(r: torch.Tensor, log_r: torch.Tensor, mask: torch.Tensor, settings: Correction) -> torch.Tensor:
    """Every token of a response weighs 1 when its geometric-mean ratio g is inside is_mask_band, else 0."""
    low, high = settings.is_mask_band
    g = torch.exp(log_r.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1))   # (N, 1)
    return ((g >= low) & (g <= high)).to(r.dtype).expand_as(r)


def check_sampler(correction: Correction, sampler_logp, logp) -> None:
    if correction.active and sampler_logp is None:
        what = "tis_cap > 0" if correction.tis_cap else f"is_mask = {correction.is_mask!r}"
        raise ValueError(f"{what} needs sampler_logp (the sampler's log-probs of the sampled tokens), got None")
    if sampler_logp is not None and sampler_logp.shape != logp.shape:
        raise ValueError(f"sampler_logp must have logp's shape {tuple(logp.shape)}, got {tuple(sampler_logp.shape)}")
