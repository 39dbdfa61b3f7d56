"""Checkers for chapter 7, "When GRPO goes wrong"."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from grpo_edu.exercises.checking import CheckResult, check_labels, compare

# --------------------------------------------------------------------------- 7.1

# The names a diagnosis may use: "healthy", or the failure mode.
FAILURES = ("healthy", "all-equal groups", "split groups", "length bias", "kl coefficient",
            "temperature mismatch", "off by one", "pi_old refreshed", "learning rate", "aliased reference")
# What a run with each failure shows (chapter 7 measures each). A wrong name is answered with its
# sign, which the run does not show: why the reading does not fit, never the right name.
SIGNS = {
    "all-equal groups": "zero_std_groups near 1 while the rewards stay flat",
    "split groups": "advantage/tie_spread above 0 (equal rewards in one group with unequal advantages)",
    "length bias": "completion_length/mean climbing steadily while the reward does not ask for length",
    "kl coefficient": "a KL to the reference far above 1 nat per token (or, beta too large, a reward held back "
                      "with the KL pinned near 0)",
    "temperature mismatch": "sampler_gap/mean_abs of a few hundredths of a nat from step 1, and a ratio far "
                            "from 1 before any update",
    "off by one": "sampler_gap/mean_abs above 0.5 nats per token from step 1",
    "pi_old refreshed": "several optimizer steps per rollout, yet ratio/min = ratio/max = 1 exactly",
    "learning rate": "a KL of several nats and every group all wrong within a few steps",
    "aliased reference": "a KL of exactly 0 after step 1 while grad_norm > 0",
}
# The lab runs behind the mysteries (benchmarks/failure_lab.py --mystery writes their metrics and
# configs, at seed 1), with the failure each shows and the metric that gives it away.
MYSTERY_RUNS = {
    "healthy": ("healthy", "every metric as in the chapter's healthy run"),
    "temperature": ("temperature mismatch", "sampler_gap/mean_abs ~0.06 from step 1 and a ratio far from 1 before "
                                            "any update"),
    "alias": ("aliased reference", "kl exactly 0 at every step while grad_norm > 0"),
    "old_refreshed": ("pi_old refreshed", "4 optimizer steps per rollout, yet ratio/min = ratio/max = 1 exactly"),
}
# What the mystery files keep of each step.
KEYS = ("step", "reward/mean", "reward/accuracy", "zero_std_groups", "completion_length/mean", "entropy", "kl",
        "sampler_gap/mean_abs", "ratio/min", "ratio/max", "clip_ratio/region", "optimizer_steps", "grad_norm",
        "advantage/tie_spread")
DATA = Path(__file__).parent / "data" / "ch07_mystery.json"


def _data() -> dict:
    return json.loads(DATA.read_text())


def mystery_runs() -> dict[str, list[dict]]:
    """{"run A": [metrics of step 1, ...], ...}: four runs, each healthy or broken by one knob."""
    return _data()["metrics"]


def mystery_configs() -> dict[str, dict]:
    """{"run A": config, ...}: each mystery run's config.json, what `grpo-edu doctor` reads beside
    the metrics (grpo_edu.doctor.diagnose.diagnose(history, config)). A bug injected through Faults is
    not in it, as no bug is in a real run's config."""
    return _data()["configs"]


def _answer_key() -> dict[str, str]:
    import random
    names = list(MYSTERY_RUNS)
    random.Random(7).shuffle(names)
    return {f"run {letter}": name for letter, name in zip("ABCD", names)}


def check_mystery_runs(diagnoses: dict[str, str]) -> CheckResult:
    """Exercise 7.1: name each of mystery_runs() with one of FAILURES."""
    key = {run: MYSTERY_RUNS[name][0] for run, name in _answer_key().items()}
    return check_labels("exercise 7.1 name the failure", diagnoses, key, FAILURES, SIGNS, names_where="ch07.FAILURES")


# --------------------------------------------------------------------------- 7.2

def _reference_tie_spread(rewards: torch.Tensor, advantages: torch.Tensor) -> float:
    worst = 0.0
    for r, a in zip(rewards.tolist(), advantages.tolist()):
        for i in range(len(r)):
            for j in range(len(r)):
                if r[i] == r[j]:
                    worst = max(worst, abs(a[i] - a[j]))
    return worst


def _split(rewards: torch.Tensor) -> torch.Tensor:
    from grpo_edu.algorithm.advantages import group_advantages
    B, G = rewards.shape
    return group_advantages(rewards.reshape(2 * B, G // 2)).reshape(B, G)


def tie_spread_cases() -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    from grpo_edu.algorithm.advantages import group_advantages
    generator = torch.Generator().manual_seed(7)
    chapter = torch.tensor([[1.5, 1.5, 1.5, 0.5, 0.5, 0.5, 0.5, 0.5]], dtype=torch.float64)
    dealt = torch.tensor([[1.5, 0.5, 0.5, 0.5, 1.5, 1.5, 0.5, 0.5]], dtype=torch.float64)   # right in both halves
    random_rewards = torch.randint(0, 3, (6, 8), generator=generator).double() / 2
    distinct = torch.arange(8, dtype=torch.float64)[None].repeat(2, 1)
    return [
        ("the chapter's group, whole", chapter, group_advantages(chapter)),
        ("the chapter's group, split with right answers in both halves", dealt, _split(dealt)),
        ("6 random groups of 8, whole", random_rewards, group_advantages(random_rewards)),
        ("the same groups, split in halves", random_rewards, _split(random_rewards)),
        ("all rewards distinct (no ties)", distinct, _split(distinct)),
    ]


def check_tie_spread(fn) -> CheckResult:
    """Exercise 7.2: fn(rewards (B, G), advantages (B, G)) -> the largest |A_i - A_j| over pairs of
    completions of one group with equal rewards (a float; 0 when no such pair differs)."""
    result = CheckResult("exercise 7.2 the tie spread")
    for name, rewards, advantages in tie_spread_cases():
        expected = _reference_tie_spread(rewards, advantages)
        try:
            got = float(fn(rewards.clone(), advantages.clone()))
        except Exception as error:  # noqa: BLE001 - the reader's code: report, do not crash
            result.record_raised(name, error)
            continue
        problem = compare(expected, got, 1e-9)
        result.record(name, [problem] if problem else [])
    return result
