"""From REINFORCE to GRPO: the advantage estimators chapter 0 derives and compares.

Each maps rewards (B, G) (B prompts, G completions of each) to advantages (B, G), the
signature of the trainer's `advantage_fn`, so each trains as it is:

    advantage_fn = "grpo_edu.algorithm.baselines:rloo"

    reinforce        A = r                          no baseline
    batch_mean       A = r - mean over the batch    one baseline for every prompt
    rloo             A = r_i - mean_{j != i} r_j    leave-one-out: the group without i
    group_mean       A = r - mean over the group    Dr. GRPO's advantage (no std)
    grpo             A = (r - mean) / std           the group's population std (/ G), DeepSeekMath
    grpo_sample_std  A = (r - mean) / std           the group's sample std (/ (G - 1)), TRL

The last three are grpo_edu.algorithm.advantages.group_advantages with its options; the first
three are written out here. Only `reinforce` and `rloo` (and, over the batch,
`batch_mean` as B grows) keep the policy gradient unbiased: a baseline that uses the
completion's own reward scales the gradient by (G - 1) / G (`group_mean`), and a
division by the group's std reweights prompts. Chapter 0 computes each bias exactly.
"""

from __future__ import annotations

import torch

from grpo_edu.algorithm.advantages import check_rewards, group_advantages


def _checked(rewards) -> torch.Tensor:
    if not isinstance(rewards, torch.Tensor):
        raise TypeError(f"rewards: expected a torch.Tensor of shape (B, G), got {type(rewards).__name__}")
    rewards = rewards if rewards.is_floating_point() else rewards.to(torch.get_default_dtype())
    check_rewards(rewards)
    return rewards


def reinforce(rewards: torch.Tensor) -> torch.Tensor:
    """No baseline: each completion's advantage is its reward."""
    return _checked(rewards).clone()


def batch_mean(rewards: torch.Tensor) -> torch.Tensor:
    """One baseline for the whole batch: the mean of all B x G rewards."""
    rewards = _checked(rewards)
    return rewards - rewards.mean()


def rloo(rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out: each completion against the mean of the other G - 1 of its group,
    which is G / (G - 1) times its distance from the group's mean."""
    rewards = _checked(rewards)
    G = rewards.shape[1]
    others = (rewards.sum(dim=1, keepdim=True) - rewards) / (G - 1)
    return rewards - others


def group_mean(rewards: torch.Tensor) -> torch.Tensor:
    """The group's mean as the baseline, no std: Dr. GRPO's advantage."""
    return group_advantages(_checked(rewards), scale="none")


def grpo(rewards: torch.Tensor) -> torch.Tensor:
    """GRPO's advantage: the group's mean and population std (divide by G)."""
    return group_advantages(_checked(rewards))


def grpo_sample_std(rewards: torch.Tensor) -> torch.Tensor:
    """GRPO's advantage with the group's sample std (divide by G - 1), as TRL computes it."""
    return group_advantages(_checked(rewards), std="sample")


# name -> (function, what it is), in the order chapter 0 introduces them
ESTIMATORS = {
    "reinforce": (reinforce, "REINFORCE, no baseline"),
    "batch_mean": (batch_mean, "batch-mean baseline"),
    "rloo": (rloo, "RLOO (leave-one-out)"),
    "group_mean": (group_mean, "group mean, no std (Dr. GRPO)"),
    "grpo": (grpo, "GRPO, population std"),
    "grpo_sample_std": (grpo_sample_std, "GRPO, sample std"),
}


def spec(name: str) -> str:
    """The config value that trains with estimator `name`: "grpo_edu.algorithm.baselines:<name>"."""
    if name not in ESTIMATORS:
        raise ValueError(f"name: expected one of {list(ESTIMATORS)}, got {name!r}")
    return f"grpo_edu.algorithm.baselines:{name}"
