"""`grpo-edu doctor RUN_DIR`: GRPO's failure modes, recognised from a run's metrics.

Each detector reads the run's metrics.jsonl (one line per training step) and its
config.json, and reports a `Finding` (what failed, the evidence: steps, values and the
threshold crossed, and one line of advice) or nothing. Standard library only: a run is
diagnosed without torch.

The thresholds come from the failure lab (chapter 7), where each failure is caused on
purpose on the CPU tier and measured against the healthy default run; each constant below
says what separates the two there. The tests run every detector on the healthy run (3
seeds, no finding) and on each lab run (its own finding, no other).

The trainer runs the same detectors while it trains (`LiveDoctor`) and warns once per
finding, the step it first appears.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from grpo_edu.runtime.runlog import MetricsLog

# --- thresholds (the lab's measurements: its runs of the CPU tier, 20 to 100 steps, pinned kernels)
MIN_STEPS = 5            # no finding from fewer steps than this (after the first)
WINDOW = 10              # steps in the early and late windows that trends compare
# The KL to the reference is 0 at step 1 (nothing has moved yet) and > 1e-5 from step 2 in
# every healthy run; an aliased reference gives exactly 0.0 at every step.
KL_ZERO = 0.0
# All-equal groups: the healthy run has 23% of its groups all-equal over 100 steps; a
# countdown run of the arithmetic policy has all of them all-wrong. Flagged: half the groups
# or more, while most samples are wrong (groups that are all right are a solved task, not
# a failure).
ZERO_STD_SHARE = 0.5
LOW_ACCURACY = 0.5
# Equal rewards must get equal advantages within a group (any advantage function of the
# group's rewards gives them exactly equal ones); a group normalised in pieces does not.
TIE_SPREAD = 1e-4
# Completion length: the late window's median over the early window's.
LENGTH_GROWTH = 1.3
# Sampler/trainer gap, mean |log pi_trainer - log pi_sampler| per token over the first
# steps. Float32 on both sides: ~2e-7. A bf16 sampler (vLLM): ~1e-2. The trainer at T = 1
# against a sampler at T = 0.7: 6.5e-2. Scoring the next token (off by one): 1.9 nats.
GAP_MISMATCH = 0.03
GAP_MISALIGNED = 0.5
# Gradient norm: the late window's median over the early window's (healthy: ~1x; a learning
# rate of 1e-2 without clipping: see chapter 7), or any non-finite loss.
GRAD_GROWTH = 10.0
# KL to the reference, nats per token, late window (healthy 100 steps: 0.06-0.12).
KL_HIGH = 1.0
# Completions cut at max_completion_length without an end (the `truncated` metric): such a
# completion has no final answer, so both rule-based rewards give it 0, whatever its
# reasoning. Flagged: half of them or more (median over WINDOW consecutive steps), where
# most of a group's rewards score the limit rather than the answers. In the lab (highest
# 10-step median): the learning-rate runs, whose wrecked policy stops ending its completions,
# 0.99-1.0; the arithmetic policy on Countdown 0.04-0.30; the temperature run 0. A reported
# TRL run of Qwen2.5-0.5B-Instruct on GSM8K with a 256-token limit had ~57% truncated.
TRUNCATED_SHARE = 0.5
# Rollouts that lag (rollout_lag = k) without a correction (old_logprobs = "proximal", no
# tis_cap or is_mask): the sampler gap is then the staleness itself, mean |log pi_now -
# log pi_sampler| per token, read at the full lag, the first 10 consecutive steps whose median
# crosses (benchmarks/lag.py, 150-step runs of the default task; chapter 12 reads its results).
# Its highest 10-step median: 0.04-0.05 at k = 1 (final accuracy 0.69-0.73 against the
# synchronous runs' 0.73-0.77), 0.08-0.09 at k = 2 (0.63-0.70: every seed below every
# synchronous one), 0.13-0.16 at k = 4, 0.22-0.29 at k = 8 to 64 (0.43-0.62; k = 64 learns
# nothing). With the clip or a correction the same staleness costs far less (chapter 12), and
# nothing here reads it: the clipped share stays at or below 0.082 up to k = 64.
STALE_GAP = 0.06
# Multi-turn episodes (config key environment) whose environment tokens are scored as the policy's
# (Faults.env_tokens_in_loss): the sampler never drew those tokens (its log-prob there is 0),
# so the sampler gap holds -log pi of every environment token, diluted by the policy's tokens.
# With an environment answering at the digit 1 (tests/episode_envs.py): the committed policy
# (12 steps, 24-token episodes) healthy 1.6e-7 to 3.6e-7 nats per token, leaking 1.09 to 2.42;
# a random tiny policy (6 steps, 40-token episodes holding 0.56 to 1.8 answer tokens) leaking
# 0.086 to 0.18. The threshold is GAP_MISMATCH's: a bf16 sampler's healthy gap stays below it.
# In an episode run a gap past the threshold is read as this first (the finding's advice names
# the other causes), not as sampler_mismatch or misaligned_tokens.
ENV_GAP = GAP_MISMATCH


@dataclass(frozen=True)
class Finding:
    detector: str     # the detector's name (DETECTORS)
    failure: str      # the failure mode it points to
    evidence: str     # steps, values, thresholds
    advice: str       # one line

    def __str__(self) -> str:
        return f"{self.failure} [{self.detector}]\n  evidence: {self.evidence}\n  advice:   {self.advice}"


def series(history: list[dict], key: str) -> list[tuple[int, float]]:
    """(step, value) of every step that logged `key`."""
    return [(m["step"], float(m[key])) for m in history if key in m and m[key] is not None]


def window_median(values: list[tuple[int, float]], late: bool) -> tuple[float, int, int]:
    """The median of the first (or last) WINDOW values, with the first and last step it spans."""
    part = values[-WINDOW:] if late else values[:WINDOW]
    return statistics.median(v for _, v in part), part[0][0], part[-1][0]


def first_crossing(values: list[tuple[int, float]], threshold: float) -> tuple[float, list] | None:
    """The first WINDOW consecutive values whose median is >= threshold: (that median, the
    window's (step, value) pairs), or None. Unlike the late window, it sees a symptom that
    fades again before a run ends."""
    for end in range(WINDOW, len(values) + 1):
        part = values[end - WINDOW:end]
        level = statistics.median(v for _, v in part)
        if level >= threshold:
            return level, part
    return None


def reference_aliased(history, config):
    if not config.get("beta"):
        return None
    kl = [(s, v) for s, v in series(history, "kl") if s > 1]
    if len(kl) < MIN_STEPS or any(v != KL_ZERO for _, v in kl):
        return None
    moving = [v for s, v in series(history, "grad_norm") if v > 0]
    if not moving:   # no gradient at all: the policy did not move (all-equal groups), the KL stays 0
        return None
    return Finding("reference_aliased", "the reference is the policy (aliased): the KL term does nothing",
                   f"kl = 0 exactly at all {len(kl)} steps from {kl[0][0]} to {kl[-1][0]}, with beta = "
                   f"{config['beta']}, while the policy moves (grad_norm > 0 at {len(moving)} steps); a "
                   f"separate reference gives kl > 0 from step 2",
                   "build the reference as a separate frozen copy (grpo_edu.training.placement.make_reference) and keep "
                   "the start-up check that refuses shared storage")


def zero_std_groups(history, config):
    share = series(history, "zero_std_groups")
    if len(share) < MIN_STEPS:
        return None
    level, first, last = window_median(share, late=True)
    accuracy_key = "reward/accuracy" if any("reward/accuracy" in m for m in history) else "reward/mean"
    accuracy, _, _ = window_median(series(history, accuracy_key), late=True)
    if level < ZERO_STD_SHARE or accuracy >= LOW_ACCURACY:
        return None
    skipped = sum(1 for m in history[-WINDOW:] if m.get("skipped_update"))
    return Finding("zero_std_groups", "all-equal-reward groups dominate: most groups give no gradient",
                   f"median share of all-equal groups {level:.2f} over steps {first}-{last} (threshold "
                   f"{ZERO_STD_SHARE}), while the median {accuracy_key} is {accuracy:.3f}: the groups are "
                   f"all wrong; {skipped} of those steps skipped their update",
                   "give the prompts a chance (easier prompts, a curriculum, a higher temperature), and drop "
                   "the all-equal groups from the loss (filter_zero_std_groups = true)")


def split_groups(history, config):
    spread = series(history, "advantage/tie_spread")
    bad = [(s, v) for s, v in spread if v > TIE_SPREAD]
    if not bad:
        return None
    worst = max(bad, key=lambda sv: sv[1])
    return Finding("split_groups", "a group's advantages were computed in pieces (a group split across ranks)",
                   f"completions of one group with equal rewards got advantages up to {worst[1]:.3f} apart "
                   f"(step {worst[0]}; at {len(bad)} of {len(spread)} steps above {TIE_SPREAD})",
                   "keep each prompt's G completions on one rank and compute the group's baseline over all G "
                   "(grpo_edu.runtime.distributed.World.shard shards whole prompts)")


def length_drift(history, config):
    lengths = series(history, "completion_length/mean")
    if len(lengths) < 4 * WINDOW:
        return None
    early, a, b = window_median(lengths, late=False)
    late, c, d = window_median(lengths, late=True)
    if late < LENGTH_GROWTH * early:
        return None
    rewards = series(history, "reward/mean")
    early_reward, late_reward = window_median(rewards, False)[0], window_median(rewards, True)[0]
    loss_type = config.get("loss_type", "grpo")
    advice = ("switch to loss_type = 'dr_grpo' (a constant normaliser: no per-token bonus for length) or "
              "penalise length in the reward" if loss_type in ("grpo", "bnpo") else
              "the loss does not reward length here: look at the reward (does a longer answer score more?)")
    return Finding("length_drift", "completions grow longer (length bias)",
                   f"median completion length {early:.1f} tokens (steps {a}-{b}) -> {late:.1f} (steps {c}-{d}), "
                   f"x{late / early:.2f} (threshold x{LENGTH_GROWTH}); reward {early_reward:.3f} -> "
                   f"{late_reward:.3f}; loss_type = {loss_type!r}", advice)


def kl_runaway(history, config):
    kl = series(history, "kl")
    if len(kl) < 2 * WINDOW:
        return None
    late, c, d = window_median(kl, late=True)
    if late < KL_HIGH:
        return None
    return Finding("kl_runaway", "the policy has run far from the reference (KL coefficient too small)",
                   f"median KL {late:.3f} nats per token over steps {c}-{d} (threshold {KL_HIGH}), "
                   f"beta = {config.get('beta')}",
                   "raise beta (x2) and restart from a checkpoint before the climb; look at samples for "
                   "degeneration (repeats, gibberish that scores)")


def _early_gap(history, config=None) -> tuple[float, int, int] | None:
    """The early window's sampler gap. Under rollout_lag with old_logprobs = "proximal" the gap
    of a step also holds its staleness (pi_old is the policy at the update, the sampler an
    older one: stale_rollouts reads that), so only steps trained on a fresh rollout count."""
    gap = series(history, "sampler_gap/mean_abs")
    if (config or {}).get("rollout_lag") and config.get("old_logprobs") == "proximal":
        fresh = {m["step"] for m in history if not m.get("staleness")}
        gap = [(s, v) for s, v in gap if s in fresh]
    if len(gap) < MIN_STEPS:
        return None
    return window_median(gap, late=False)


def sampler_mismatch(history, config):
    early = _early_gap(history, config)
    if early is None or not GAP_MISMATCH <= early[0] < GAP_MISALIGNED or config.get("environment"):
        return None
    ratio = series(history, "ratio/max")
    note = ""
    if config.get("old_logprobs") == "sampler" and ratio:
        note = f"; the ratio pi/pi_old reaches {max(v for _, v in ratio[:WINDOW]):.2f} from the first steps"
    return Finding("sampler_mismatch", "the trainer's log-probs are not the sampler's (temperature, precision "
                   "or stale weights)",
                   f"mean |log pi_trainer - log pi_sampler| {early[0]:.3g} per token over steps {early[1]}-"
                   f"{early[2]} (threshold {GAP_MISMATCH}; float32 on both sides: ~2e-7){note}",
                   "compute the trainer's log-probs at the sampler's temperature, sync the weights before each "
                   "rollout; for a bf16 sampler (vLLM) correct with tis_cap")


def misaligned_tokens(history, config):
    early = _early_gap(history, config)
    if early is None or early[0] < GAP_MISALIGNED or config.get("environment"):
        return None
    return Finding("misaligned_tokens", "the trainer scores other tokens than the sampler drew (a mask or label "
                   "off by one)",
                   f"mean |log pi_trainer - log pi_sampler| {early[0]:.3g} nats per token over steps "
                   f"{early[1]}-{early[2]} (threshold {GAP_MISALIGNED}: more than any temperature or precision "
                   f"gap)",
                   "print one completion's tokens beside its mask and its log-probs: the token at column j is "
                   "predicted by the logits at column j - 1")


def environment_tokens_trained(history, config):
    early = _early_gap(history, config)
    if not config.get("environment") or early is None or early[0] < ENV_GAP:
        return None
    tokens = series(history, "episode/env_tokens")
    per_episode = window_median(tokens, late=False)[0] if tokens else float("nan")
    return Finding("environment_tokens_trained", "the environment's tokens are trained on as if the policy had "
                   "written them",
                   f"mean |log pi_trainer - log pi_sampler| {early[0]:.3g} nats per token over steps {early[1]}-"
                   f"{early[2]} (threshold {ENV_GAP}; a healthy episode run: ~2e-7) in episodes holding "
                   f"{per_episode:.3g} environment tokens each, which the sampler never draws",
                   "score the policy's tokens only: completion_mask without the environment's spans (env_mask), "
                   "which stay in attention_mask as context; if they are, the gap is the sampler's (temperature, "
                   "precision, stale weights) or a mask off by one")


def old_logprobs_refreshed(history, config):
    passes = (config.get("num_iterations") or 1) * (config.get("num_mini_batches") or 1)
    if passes < 2 or config.get("old_logprobs") == "sampler":
        return None
    rows = [m for m in history if "ratio/min" in m and m.get("optimizer_steps", 0) >= 2]
    if len(rows) < MIN_STEPS:
        return None
    at_one = [m for m in rows if m["ratio/min"] == 1.0 and m["ratio/max"] == 1.0]
    if len(at_one) < len(rows):
        return None
    return Finding("old_logprobs_refreshed", "pi_old is refreshed every pass: the clip never acts",
                   f"{passes} optimizer steps per rollout, yet the last step's ratio pi/pi_old is exactly 1 "
                   f"(min and max) at all {len(rows)} steps: pi_old was recomputed from the moved policy",
                   "keep pi_old the policy that sampled for every pass over a rollout (or take one optimizer "
                   "step per rollout)")


def truncated_completions(history, config):
    shares = series(history, "truncated")
    crossed = first_crossing(shares, TRUNCATED_SHARE)
    if crossed is None:
        return None
    level, part = crossed
    first, last = part[0][0], part[-1][0]
    lengths = [v for s, v in series(history, "completion_length/mean") if first <= s <= last]
    length = f", median length {statistics.median(lengths):.1f} tokens" if lengths else ""
    crossing = sum(1 for _, v in shares if v >= TRUNCATED_SHARE)
    return Finding("truncated_completions", "most completions hit max_completion_length (truncated: no answer)",
                   f"median share of completions cut at max_completion_length "
                   f"({config.get('max_completion_length')} tokens) {level:.2f} over steps {first}-{last} "
                   f"(threshold {TRUNCATED_SHARE}){length}; at or above the threshold at {crossing} of "
                   f"{len(shares)} steps",
                   "look at a few completions: reasoning that runs out of room needs a larger "
                   "max_completion_length (a truncated completion scores 0); repeats or gibberish mean the "
                   "policy has degenerated (see kl and the learning rate)")


def stale_rollouts(history, config):
    lag = config.get("rollout_lag") or 0
    stale = [m for m in history if m.get("staleness") == lag and lag]
    if len(stale) < WINDOW:
        return None
    corrected = bool(config.get("tis_cap")) or config.get("is_mask", "none") != "none"
    if config.get("old_logprobs") != "proximal" or corrected:
        return None
    key, threshold = "sampler_gap/mean_abs", STALE_GAP
    values = [(m["step"], float(m[key])) for m in stale if m.get(key) is not None]
    # The first crossing, not the late window: a decaying learning rate shrinks the staleness
    # again as a run ends.
    crossed = first_crossing(values, threshold)
    if crossed is None:
        return None
    level, part = crossed
    return Finding("stale_rollouts", f"rollouts {lag} updates stale, trained on as if the current policy had "
                   f"sampled them",
                   f"mean |log pi_now - log pi_sampler| per token {level:.3g}, median over steps "
                   f"{part[0][0]}-{part[-1][0]} (threshold {threshold}; rollout_lag = {lag}, old_logprobs = "
                   f"'proximal', no tis_cap or is_mask)",
                   "correct for the staleness (tis_cap, is_mask, or old_logprobs = 'recomputed' for the clip) "
                   "or lower rollout_lag")


def grad_explosion(history, config):
    losses = series(history, "loss")
    broken = [s for s, v in losses if not math.isfinite(v)]
    if broken:
        return Finding("grad_explosion", "the update diverged (non-finite loss)",
                       f"loss is not finite from step {broken[0]} ({len(broken)} steps)",
                       "lower the learning rate, clip the gradient norm (max_grad_norm = 1.0), bound the rewards")
    norms = series(history, "grad_norm")
    if len(norms) < 4 * WINDOW:
        return None
    early, a, b = window_median(norms, late=False)
    late, c, d = window_median(norms, late=True)
    if late < GRAD_GROWTH * early:
        return None
    clip = config.get("max_grad_norm")
    return Finding("grad_explosion", "the gradient norm explodes",
                   f"median grad_norm {early:.3g} (steps {a}-{b}) -> {late:.3g} (steps {c}-{d}), x{late / early:.0f} "
                   f"(threshold x{GRAD_GROWTH:g}); max_grad_norm = {clip}"
                   + (" (nothing clipped)" if not clip else ""),
                   "lower the learning rate, clip the gradient norm (max_grad_norm = 1.0), check the rewards' scale")


DETECTORS: dict[str, Callable[[list[dict], dict], Finding | None]] = {
    "reference_aliased": reference_aliased,
    "zero_std_groups": zero_std_groups,
    "split_groups": split_groups,
    "length_drift": length_drift,
    "kl_runaway": kl_runaway,
    "sampler_mismatch": sampler_mismatch,
    "misaligned_tokens": misaligned_tokens,
    "environment_tokens_trained": environment_tokens_trained,
    "old_logprobs_refreshed": old_logprobs_refreshed,
    "grad_explosion": grad_explosion,
    "truncated_completions": truncated_completions,
    "stale_rollouts": stale_rollouts,
}


def diagnose(history: list[dict], config: dict) -> list[Finding]:
    """Every detector's finding on a run's metrics (one dict per step) and config (a dict)."""
    return [finding for detect in DETECTORS.values() if (finding := detect(history, config)) is not None]


def diagnose_run(run_dir: str | Path) -> list[Finding]:
    """diagnose() on a run directory's metrics.jsonl and config.json."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"RUN_DIR: expected a run directory, got {str(run_dir)!r} (no such folder)")
    history = MetricsLog(run_dir).read()
    if not history:
        raise ValueError(f"RUN_DIR: expected a run directory with metrics.jsonl, got {str(run_dir)!r} "
                         f"({'an empty metrics.jsonl' if (run_dir / 'metrics.jsonl').is_file() else 'no metrics.jsonl'})")
    config_path = run_dir / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    return diagnose(history, config)


def report(findings: list[Finding], steps: int) -> str:
    if not findings:
        return f"no symptoms found in {steps} steps"
    return "\n".join(str(f) for f in findings)


class LiveDoctor:
    """The detectors run during training: `check(history)` returns the findings not reported
    before (each detector warns once)."""

    def __init__(self, config: dict, every: int = WINDOW):
        self.config, self.every, self.reported = config, every, set()

    def check(self, history: list[dict]) -> list[Finding]:
        if not history or history[-1]["step"] % self.every:
            return []
        new = [f for f in diagnose(history, self.config) if f.detector not in self.reported]
        self.reported |= {f.detector for f in new}
        return new
