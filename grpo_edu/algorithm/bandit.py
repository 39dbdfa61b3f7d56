"""A policy small enough to enumerate: one token out of K, a softmax over K logits, a fixed
reward per token. Chapter 0 computes the policy gradient on it exactly, and the exact mean
and variance of each estimator of it, by summing over every possible group of G samples.

    pi_k = softmax(theta)_k          J(theta) = sum_k pi_k r_k
    grad J = pi * (r - J)            (d J / d theta_k = pi_k (r_k - J))

An estimator from one group of G samples a_1..a_G ~ pi, with advantages A_i from an
advantage function (grpo_edu.algorithm.baselines) of the group's rewards:

    g_hat = (1 / G) sum_i A_i grad log pi(a_i),    grad log pi(a) = onehot(a) - pi

`moments` enumerates the K^G groups with their probabilities and returns g_hat's exact
mean (compare it with grad J: the bias) and its variance (the trace of its covariance:
the mean squared distance from its mean).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch


@dataclass(frozen=True)
class Bandit:
    logits: np.ndarray    # theta, (K,)
    rewards: np.ndarray   # r, (K,): the reward of each token

    def __post_init__(self):
        logits, rewards = np.asarray(self.logits, dtype=np.float64), np.asarray(self.rewards, dtype=np.float64)
        if logits.ndim != 1 or logits.shape != rewards.shape or len(logits) < 2:
            raise ValueError(f"logits, rewards: expected two (K,) arrays with K >= 2, got shapes "
                             f"{logits.shape} and {rewards.shape}")
        object.__setattr__(self, "logits", logits)
        object.__setattr__(self, "rewards", rewards)

    @property
    def probs(self) -> np.ndarray:
        z = np.exp(self.logits - self.logits.max())
        return z / z.sum()

    @property
    def value(self) -> float:
        """J = the expected reward of one sample."""
        return float(self.probs @ self.rewards)

    def gradient(self) -> np.ndarray:
        """The exact policy gradient: grad J = pi * (r - J)."""
        return self.probs * (self.rewards - self.value)

    def score(self, actions: np.ndarray) -> np.ndarray:
        """grad log pi(a) = onehot(a) - pi for each action: (..., K)."""
        return np.eye(len(self.probs))[actions] - self.probs


@dataclass(frozen=True)
class Moments:
    mean: np.ndarray      # E[g_hat], (K,)
    variance: float       # E ||g_hat - E[g_hat]||^2
    groups: int           # the K^G groups summed over


def all_groups(bandit: Bandit, G: int) -> tuple[np.ndarray, np.ndarray]:
    """Every group of G samples: actions (K^G, G) and each group's probability (K^G,)."""
    K = len(bandit.probs)
    if G < 1 or K ** G > 5_000_000:
        raise ValueError(f"G: expected 1 <= G with K^G groups at most 5,000,000, got G = {G} (K = {K})")
    actions = np.array(list(itertools.product(range(K), repeat=G)), dtype=np.int64).reshape(-1, G)
    return actions, bandit.probs[actions].prod(axis=1)


def estimates(bandit: Bandit, actions: np.ndarray, advantage_fn: Callable | None) -> np.ndarray:
    """g_hat for each group of actions (N, G): (N, K). advantage_fn maps rewards (N, G) (a torch
    tensor, float64) to advantages (N, G); None is no baseline (A = r)."""
    rewards = bandit.rewards[actions]
    if advantage_fn is None:
        advantages = rewards
    else:
        advantages = advantage_fn(torch.from_numpy(rewards)).double().numpy()
    return (advantages[..., None] * bandit.score(actions)).mean(axis=1)


def moments(bandit: Bandit, G: int, advantage_fn: Callable | None = None) -> Moments:
    """The exact mean and variance of g_hat over every group of G samples."""
    actions, probability = all_groups(bandit, G)
    g = estimates(bandit, actions, advantage_fn)
    mean = probability @ g
    variance = float(probability @ ((g - mean) ** 2).sum(axis=1))
    return Moments(mean, variance, len(actions))


def sampled_moments(bandit: Bandit, G: int, advantage_fn: Callable | None = None, *, groups: int = 100_000,
                    seed: int = 0) -> Moments:
    """The same two numbers estimated from `groups` sampled groups (what a training run sees)."""
    rng = np.random.default_rng(seed)
    actions = rng.choice(len(bandit.probs), size=(groups, G), p=bandit.probs)
    g = estimates(bandit, actions, advantage_fn)
    mean = g.mean(axis=0)
    return Moments(mean, float(((g - mean) ** 2).sum(axis=1).mean()), groups)
