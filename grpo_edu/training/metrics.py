"""What a training step logs, and the run's summary (grpo_edu.training.trainer step 7).

    METRIC_REDUCTION  how each of grpo_loss's metrics combines over micro-batches and ranks
    MetricSums        one optimizer step's loss metrics, accumulated, then reduced over ranks
    sampler_gap       the trainer's log-probs of the sampled tokens against the sampler's
    tie_spread        equal rewards in a group must get equal advantages: the largest gap
    step_metrics      one step's metrics over all B prompts (the plan holds them gathered)
    run_summary       summary.json: accuracies with intervals, the rollouts at both ends, speed,
                      the time split

Every metric is documented where it is computed; chapter 6 explains each one and what a
healthy value looks like.
"""

from __future__ import annotations

import math
import statistics

import torch

from grpo_edu.algorithm.advantages import zero_std_groups
from grpo_edu.algorithm.surrogates import SURROGATES
from grpo_edu.environment.registry import TASKS
from grpo_edu.training.batch import RolloutBatch
from grpo_edu.runtime.distributed import World
from grpo_edu.training.evaluation import wilson_interval
from grpo_edu.training.plan import Plan

# A step's wall-clock, in three parts: sampling; rewards, advantages, reference and pi_old log-probs; the update.
TIME_SPLIT = ("rollout", "scoring", "update")

# How each of grpo_loss's metrics combines over micro-batches and ranks. "unit" is a token
# mean at the token level and a completion mean at the sequence level (GSPO), as in TRL. A
# surrogate's own metrics (the clip's clip_ratio/*, the cap's ratio/capped) come with its
# registration (grpo_edu.algorithm.surrogates): metric_reduction() adds them.
METRIC_REDUCTION = {
    "loss": "sum", "policy_loss": "sum", "approx_kl": "token", "kl": "token",
    "ratio/mean": "unit", "ratio/min": "min", "ratio/max": "max",
    "tis/mean": "token", "tis/truncated": "token", "is/masked": "token",
    "is_ratio/mean": "token", "is_ratio/min": "min", "is_ratio/max": "max",
}


def metric_reduction() -> dict[str, str]:
    """METRIC_REDUCTION and every registered surrogate's own metrics."""
    table = dict(METRIC_REDUCTION)
    for entry in SURROGATES.values():
        table.update(entry.reductions)
    return table


class MetricSums:
    """Accumulates grpo_loss's metrics of one optimizer step's micro-batches on this rank,
    then reduces them over ranks the way metric_reduction() says."""

    def __init__(self, sequence_level: bool):
        self.sequence_level = sequence_level
        self.reduction = metric_reduction()
        self.sums: dict[str, float] = {key: 0.0 for key, how in self.reduction.items()
                                       if how in ("sum", "token", "unit")}
        self.weights = {"token": 0.0, "unit": 0.0}
        self.seen: set[str] = set()
        self.extremes = {key: (math.inf if how == "min" else -math.inf)
                         for key, how in self.reduction.items() if how in ("min", "max")}

    def add(self, metrics: dict[str, float], tokens: float, completions: float) -> None:
        unit = completions if self.sequence_level else tokens
        for key, how in self.reduction.items():
            if key not in metrics:
                continue
            if how == "sum":
                self.sums[key] += metrics[key]
            elif how == "token":
                self.sums[key] += metrics[key] * tokens
            elif how == "unit":
                self.sums[key] += metrics[key] * unit
            elif how == "min":
                self.extremes[key] = min(self.extremes[key], metrics[key])
            else:
                self.extremes[key] = max(self.extremes[key], metrics[key])
        self.weights["token"] += tokens
        self.weights["unit"] += unit
        self.seen |= set(metrics)

    def reduce(self, world: World) -> dict[str, float]:
        keys = list(self.sums)
        sums = world.reduce(torch.tensor([self.sums[k] for k in keys] + [self.weights["token"], self.weights["unit"]],
                                         dtype=torch.float64))
        lows = [k for k, how in self.reduction.items() if how == "min"]
        highs = [k for k, how in self.reduction.items() if how == "max"]
        low = world.reduce(torch.tensor([self.extremes[k] for k in lows], dtype=torch.float64), "min")
        high = world.reduce(torch.tensor([self.extremes[k] for k in highs], dtype=torch.float64), "max")
        tokens, units = float(sums[-2]), float(sums[-1])
        seen = set(world.gather_objects(sorted(self.seen)))
        out = {}
        for i, key in enumerate(keys):
            if key not in seen:
                continue
            how = self.reduction[key]
            out[key] = float(sums[i]) if how == "sum" else float(sums[i]) / (tokens if how == "token" else units)
        out.update({k: float(v) for k, v in zip(lows, low) if k in seen})
        out.update({k: float(v) for k, v in zip(highs, high) if k in seen})
        return out


def sampler_gap(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor,
                completion_mask: torch.Tensor, world: World = World()) -> dict[str, float]:
    """How far the trainer's log-probs of the sampled tokens are from the sampler's: (n, ...) x 3 -> floats.

      sampler_gap/mean_abs   mean over completion tokens of |log pi_trainer - log pi_sampler|
      sampler_gap/max_ratio  the largest exp(|log pi_trainer - log pi_sampler|): the worst
                             token's importance weight, either way round (1 = no gap)

    Both engines compute the trainer's maths, so in float32 at the same temperature the gap
    is rounding (the CPU tier: mean ~2e-7, max_ratio ~1.00001); a sampler with other
    kernels or precision (vLLM, bf16), or at another temperature, shows here.
    """
    mask = completion_mask.bool()
    gap = (trainer_logp.double() - sampler_logp.double()).abs()[mask]
    local = torch.tensor([float(gap.sum()), float(gap.numel())], dtype=torch.float64)
    total = world.reduce(local)
    largest = world.reduce(torch.tensor([float(gap.max()) if gap.numel() else 0.0], dtype=torch.float64), "max")
    return {"sampler_gap/mean_abs": float(total[0] / total[1]), "sampler_gap/max_ratio": math.exp(float(largest[0]))}


def tie_spread(rewards: torch.Tensor, advantages: torch.Tensor) -> float:
    """The largest gap between the advantages of two completions of one group that have the
    same reward: (B, G) x 2 -> float. 0 for any advantage function of the group's rewards
    (equal rewards, equal advantages); > 0 when a group's baseline was computed in pieces."""
    same = rewards[:, :, None] == rewards[:, None, :]
    gaps = (advantages[:, :, None].double() - advantages[:, None, :].double()).abs()
    return float(gaps[same].max()) if same.any() else 0.0


def step_metrics(plan: Plan, batch: RolloutBatch, update: dict[str, float], seconds: dict[str, float],
                 world: World = World()) -> dict:
    """The step's metrics over all B prompts (the plan holds them gathered)."""
    lengths = plan.lengths.double()
    trained = torch.cat(plan.mini_batches)
    sampler = batch.sampler_logp * batch.completion_mask
    entropy = world.reduce(torch.tensor([float(-sampler.sum()), float(batch.completion_mask.sum())],
                                        dtype=torch.float64))
    metrics = {
        "reward/mean": plan.rewards.mean().item(), "reward/std": plan.rewards.std().item(),
        **{f"reward/{name}": values.mean().item() for name, values in plan.components.items()},
        "zero_std_groups": zero_std_groups(plan.rewards).float().mean().item(),
        "completion_length/mean": lengths.mean().item(), "completion_length/std": lengths.std(correction=0).item(),
        "completion_length/min": lengths.min().item(), "completion_length/max": lengths.max().item(),
        "truncated": 1.0 - plan.finished.double().mean().item(),
        **{f"episode/{name}": values.mean().item() for name, values in plan.episode.items()},
        **{f"dynamic_sampling/{name}": value for name, value in plan.sampling.items()},
        **{name: values.mean().item() for name, values in plan.observed.items()},   # the task's own (format/...)
        # Mean over completion tokens of -log pi(token): a Monte-Carlo estimate of the sampling
        # policy's entropy per token (exact in expectation).
        "entropy": float(entropy[0] / entropy[1]),
        **update,
        **{f"time/{k}": v for k, v in seconds.items()},
    }
    if len(trained):
        metrics["advantage/std"] = plan.advantages[trained].double().std(correction=0).item()
    if plan.process:   # a task whose steps a rule checks (grpo_edu.environment.process): written steps, the share right
        written = plan.process["steps"].sum().item()
        metrics.update({"process/steps": plan.process["steps"].mean().item(),
                        "process/step_accuracy": plan.process["steps_right"].sum().item() / max(written, 1.0)})
    if batch.advantages.ndim == 2:   # per-token (process) advantages: equal rewards need not give equal ones
        metrics["advantage/tie_spread"] = tie_spread(plan.rewards, plan.advantages)
    return metrics


def step_seconds(metrics: dict) -> float:
    """A step's time: its phases' sum, or with rollout_overlap (whose rollout ran beside an
    update) its wall-clock, time/step."""
    return metrics.get("time/step", sum(metrics[f"time/{key}"] for key in TIME_SPLIT))


ROLLOUT_WINDOW = 10   # steps at each end of a run that its summary's rollout figures average


def observed_names(task: str) -> tuple[str, ...]:
    """The names of what a task observes in each completion (its registered completion_metrics,
    called with no completions, names them all); () for a task without them."""
    function = TASKS[task].completion_metrics if task in TASKS else None
    return tuple(function([], [])) if function is not None else ()


def rollout_ends(history: list[dict], task: str) -> dict:
    """The rollouts at the two ends of a run: the mean over its first and its last ROLLOUT_WINDOW
    steps (fewer in a shorter run) of the reward, the completion length (mean and spread) and
    what the task observes (observed_names: digitsum's format/worked, ...)."""
    keys = ("reward/mean", "completion_length/mean", "completion_length/std", *observed_names(task))
    window = min(ROLLOUT_WINDOW, len(history))
    if not window:
        return {}
    return {"window": window, **{end: {key: statistics.fmean(m[key] for m in part) for key in keys}
                                  for end, part in (("first", history[:window]), ("last", history[-window:]))}}


def run_summary(config: dict, history: list[dict], start_accuracy: float, seconds: float,
                finished: bool, eval_problems: int) -> dict:
    """summary.json: the run's held-out accuracies (with 95% Wilson intervals over the
    eval_problems problems), its evaluation curve, its rollouts at both ends (rollout_ends: the
    length, and what the task observes), its speed and the config (as a dict)."""
    evals = [(m["step"], m["eval/greedy_accuracy"]) for m in history if "eval/greedy_accuracy" in m]
    step_times = [step_seconds(m) for m in history]
    final_accuracy = evals[-1][1] if evals else start_accuracy

    def interval(accuracy: float) -> list[float]:
        """95% Wilson interval of a held-out accuracy over eval_problems problems."""
        return list(wilson_interval(round(accuracy * eval_problems), eval_problems))
    return {
        "start_accuracy": start_accuracy,
        "final_accuracy": final_accuracy,
        "eval_problems": eval_problems,
        "start_accuracy_interval_95": interval(start_accuracy),
        "final_accuracy_interval_95": interval(final_accuracy),
        # The last evaluation's sampled metrics (config.logging.eval_samples), with their intervals.
        "final_sampled": next(({k.removeprefix("eval/"): v for k, v in m.items()
                                if k.startswith("eval/") and k != "eval/greedy_accuracy"}
                               for m in reversed(history) if "eval/greedy_accuracy" in m), {}),
        "best_accuracy": max([a for _, a in evals], default=start_accuracy),
        "steps": history[-1]["step"] if history else 0,
        "finished": finished,
        "seconds": seconds,
        "median_steps_per_second": 1.0 / statistics.median(step_times) if step_times else 0.0,
        "time_split_median": {
            key: statistics.median(m[f"time/{key}"] for m in history) if history else 0.0
            for key in TIME_SPLIT},
        "eval_curve": evals,
        "rollouts": rollout_ends(history, config["task"]),
        "config": config,
    }
