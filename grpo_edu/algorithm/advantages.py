"""Group-relative advantages: rewards (B, G) -> advantages (B, G).

B prompts, G completions per prompt. Each completion is scored against the other
completions of its own prompt, so no value network is needed:

    A_bg = (r_bg - mean_g r_b) / (std + eps)

`scale` chooses the std: "group" (each prompt's own, DeepSeekMath), "batch" (one
std over all B x G rewards, the mean still per group: Lite PPO / TRL's
scale_rewards="batch") or "none" (no division: Dr. GRPO, which argues the group
std over-weights prompts that are almost always right or almost always wrong).
`std` chooses the estimator: "population" divides by G (chapter 1's reference),
"sample" by G - 1 (torch.std's default, as in TRL).

A group whose rewards are all equal carries no learning signal; its advantages
are exactly zero (not 1e-9 left over from floating-point rounding of the mean).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from grpo_edu.runtime.registry import registrar

STD_KINDS = ("population", "sample")

# The scales, registered (config key advantage_scale): centred rewards (B, G) -> advantages (B, G).
Scale = Callable[[torch.Tensor, torch.Tensor, int, float], torch.Tensor]
SCALES: dict[str, Scale] = {}

scaling = registrar(SCALES)   # @scaling("name") registers scale(rewards, centred, correction, eps), advantage scale `name`


@scaling("group")
def by_group_std(rewards: torch.Tensor, centred: torch.Tensor, correction: int, eps: float) -> torch.Tensor:
    """Each prompt's own std (DeepSeekMath's GRPO)."""
    return centred / (rewards.std(dim=1, correction=correction, keepdim=True) + eps)


@scaling("batch")
def by_batch_std(rewards: torch.Tensor, centred: torch.Tensor, correction: int, eps: float) -> torch.Tensor:
    """One std over all B x G rewards, the mean still per group (Lite PPO; TRL's scale_rewards="batch")."""
    return centred / (rewards.std(correction=correction) + eps)


@scaling("none")
def centred_only(rewards: torch.Tensor, centred: torch.Tensor, correction: int, eps: float) -> torch.Tensor:
    """No division: the group mean subtracted only (Dr. GRPO)."""
    return centred


def _as_reward_tensor(rewards) -> tuple[torch.Tensor, bool]:
    """rewards as a floating tensor, and whether the caller gave NumPy."""
    if isinstance(rewards, torch.Tensor):
        tensor, from_numpy = rewards, False
    elif isinstance(rewards, np.ndarray):
        tensor, from_numpy = torch.from_numpy(rewards), True
    else:
        raise TypeError(f"rewards must be a torch.Tensor or numpy.ndarray of shape (B, G), "
                        f"got {type(rewards).__name__}")
    if tensor.is_complex() or not (tensor.is_floating_point() or tensor.dtype in (
            torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)):
        raise TypeError(f"rewards must hold real numbers, got dtype {tensor.dtype}")
    if not tensor.is_floating_point():  # 0/1 correctness rewards are common
        tensor = tensor.to(torch.float64 if from_numpy else torch.get_default_dtype())
    return tensor, from_numpy


def check_rewards(rewards: torch.Tensor, name: str = "rewards") -> None:
    """Raise a ValueError that says what is wrong with a (B, G) reward tensor."""
    if rewards.ndim == 1:
        raise ValueError(
            f"{name} must have shape (B, G) = (prompts, completions per prompt), got the flat shape "
            f"{tuple(rewards.shape)}; if it holds each prompt's G completions one after another, "
            f"pass {name}.reshape(-1, G)")
    if rewards.ndim != 2:
        raise ValueError(f"{name} must have shape (B, G), got shape {tuple(rewards.shape)}")
    if rewards.shape[0] < 1:
        raise ValueError(f"{name} must hold at least one prompt, got shape {tuple(rewards.shape)}")
    if rewards.shape[1] < 2:
        raise ValueError(f"{name} needs G >= 2 completions per prompt to form a group, "
                         f"got shape {tuple(rewards.shape)} (G = {rewards.shape[1]})")
    bad = ~torch.isfinite(rewards)
    if bad.any():
        b, g = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name} must be finite, got {rewards[b, g].item()} at prompt {b}, completion {g}")


def _check_std_and_eps(std: str, eps) -> None:
    if std not in STD_KINDS:
        raise ValueError(f"std must be one of {STD_KINDS}, got {std!r}")
    if not (isinstance(eps, (int, float)) and eps >= 0):
        raise ValueError(f"eps must be a number >= 0, got {eps!r}")


def zero_std_groups(rewards) -> torch.Tensor | np.ndarray:
    """(B, G) -> (B,) bool: True where all G rewards of a prompt are equal.

    Such a group has zero advantages everywhere, so it contributes no policy
    gradient (only the KL term, if any). filter_zero_std_groups drops them (DAPO's
    dynamic sampling samples replacements for them).
    """
    tensor, from_numpy = _as_reward_tensor(rewards)
    check_rewards(tensor)
    flat = (tensor == tensor[:, :1]).all(dim=1)
    return flat.numpy() if from_numpy else flat


def group_advantages(rewards, *, scale: str = "group", std: str = "population",
                     eps: float = 1e-8):
    """Group-relative advantages: rewards (B, G) -> advantages (B, G), same type.

    rewards: (B, G) torch.Tensor or numpy.ndarray, row b = the G completions of prompt b.
    scale: "group" | "batch" | "none" (see the module docstring).
    std: "population" (divide by G, or by B*G for scale="batch") | "sample" (by G - 1).
    eps: added to the std, so a near-constant group does not divide by ~0.
    Returns a torch.Tensor (same dtype and device) for a tensor, a numpy.ndarray for
    an array. Differentiable w.r.t. tensor rewards (nothing here needs it, but
    nothing breaks either).
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {tuple(SCALES)}, got {scale!r}")
    _check_std_and_eps(std, eps)
    tensor, from_numpy = _as_reward_tensor(rewards)
    check_rewards(tensor)

    correction = 0 if std == "population" else 1
    centred = tensor - tensor.mean(dim=1, keepdim=True)
    advantages = SCALES[scale](tensor, centred, correction, eps)
    # An all-equal group: the mean can differ from the rewards in the last bit
    # (0.1 + 0.1 + 0.1 != 0.3), which eps would blow up to ~1e-9, and with
    # eps = 0 it is 0 / 0. It carries no signal: make it exactly 0.
    flat = (tensor == tensor[:, :1]).all(dim=1, keepdim=True)
    advantages = torch.where(flat, torch.zeros_like(advantages), advantages)
    return advantages.numpy() if from_numpy else advantages


PROCESS_SCALES = ("group", "none")


def process_advantages(step_rewards: torch.Tensor, step_ends: torch.Tensor, step_mask: torch.Tensor,
                       length: int, *, scale: str = "group", std: str = "population",
                       eps: float = 1e-8) -> torch.Tensor:
    """Process-supervised advantages (DeepSeekMath 4.1.3; grpo_edu.environment.process): step rewards
    (B, G, K) -> per-token advantages (B, G, length).

    step_rewards: (B, G, K) the reward of each step of each completion; step_ends: (B, G, K)
    the index of each step's last token (< length); step_mask: (B, G, K) bool, True where
    completion (b, g) has a k-th step (completions may have different step counts, or none).
    Every step reward of group b is normalised by the mean and std (`std` as group_advantages'
    estimator; `scale` "none": centred only) of all the group's step rewards, and token t's
    advantage is the sum of the normalised rewards of its completion's steps ending at or
    after t. A group whose step rewards are all equal (or that has at most one) gets exactly 0,
    as group_advantages' all-equal groups. Two steps ending at one token both count there.
    """
    if scale not in PROCESS_SCALES:
        raise ValueError(f"scale must be one of {PROCESS_SCALES} for process advantages, got {scale!r}")
    _check_std_and_eps(std, eps)
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length (the completion columns) must be a positive int, got {length!r}")
    for name, value in (("step_rewards", step_rewards), ("step_ends", step_ends), ("step_mask", step_mask)):
        if not isinstance(value, torch.Tensor) or value.ndim != 3:
            raise ValueError(f"{name} must be a (B, G, K) tensor, got "
                             f"{tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__}")
    if not step_ends.shape == step_mask.shape == step_rewards.shape:
        raise ValueError(f"step_rewards, step_ends and step_mask must have one shape (B, G, K), got "
                         f"{tuple(step_rewards.shape)}, {tuple(step_ends.shape)}, {tuple(step_mask.shape)}")
    if step_rewards.shape[1] < 2:
        raise ValueError(f"step_rewards needs G >= 2 completions per prompt, got shape {tuple(step_rewards.shape)}")
    if step_mask.dtype != torch.bool or step_ends.is_floating_point() or not step_rewards.is_floating_point():
        raise TypeError(f"step_mask must be bool, step_ends integer and step_rewards floating-point, got "
                        f"{step_mask.dtype}, {step_ends.dtype}, {step_rewards.dtype}")
    if (step_mask & ~torch.isfinite(step_rewards)).any():
        raise ValueError("step_rewards must be finite on every step step_mask marks")
    outside = step_mask & ((step_ends < 0) | (step_ends >= length))
    if outside.any():
        raise ValueError(f"step_ends must lie in [0, length = {length}) on every step, got "
                         f"{int(step_ends[outside][0])} at {tuple(int(i) for i in outside.nonzero()[0])}")

    B = step_rewards.shape[0]
    rewards = torch.where(step_mask, step_rewards, torch.zeros_like(step_rewards)).reshape(B, -1)
    mask = step_mask.reshape(B, -1)
    count = mask.sum(-1, keepdim=True)
    mean = rewards.sum(-1, keepdim=True) / count.clamp(min=1)
    centred = torch.where(mask, rewards - mean, torch.zeros_like(rewards))
    if scale == "group":
        correction = 0 if std == "population" else 1
        spread = ((centred ** 2).sum(-1, keepdim=True) / (count - correction).clamp(min=1)).sqrt()
        centred = centred / (spread + eps)
    # All equal (one step, or none, included): no signal, exactly 0 (not rounding left over).
    highest = torch.where(mask, rewards, torch.full_like(rewards, -torch.inf)).amax(-1, keepdim=True)
    lowest = torch.where(mask, rewards, torch.full_like(rewards, torch.inf)).amin(-1, keepdim=True)
    normalised = torch.where(highest > lowest, centred, torch.zeros_like(centred)).reshape(step_rewards.shape)
    at_ends = torch.zeros(*step_rewards.shape[:2], length, dtype=step_rewards.dtype, device=step_rewards.device)
    at_ends.scatter_add_(2, torch.where(step_mask, step_ends, torch.zeros_like(step_ends)), normalised)
    # A_t = the sum over steps ending at or after t: a cumulative sum from the right.
    return at_ends.flip(-1).cumsum(-1).flip(-1)
