"""Steps 5 and 6 of a training step (grpo_edu.training.trainer): the log-probs the loss compares with,
then the update.

    add_logprobs        the reference's log-probs (beta > 0) and pi_old's (when the rollout
                        feeds more than one optimizer step) into the RolloutBatch
    micro_batch_loss    one micro-batch's part of the mini-batch's loss
    optimise            num_iterations passes x num_mini_batches optimizer steps: gradient
                        accumulation, the global grad-norm clip, AdamW, the LR schedule
    make_optimizer      AdamW and the learning-rate schedule (learning_rate_factor)
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, replace
from typing import Callable

import torch

from grpo_edu.algorithm import entropy_mask
from grpo_edu.runtime import distributed
from grpo_edu.algorithm import schedules
from grpo_edu.training.batch import MicroBatch, RolloutBatch
from grpo_edu.config import TrainConfig
from grpo_edu.runtime.distributed import World
from grpo_edu.algorithm.loss import GRPOLossOutput, LossSettings, grpo_loss
from grpo_edu.training.metrics import MetricSums, sampler_gap
from grpo_edu.training.placement import Models
from grpo_edu.training.plan import LossTotals, Padding, Plan, micro_batches, optimizer_steps_per_rollout


# The update stage's signature (optimise's): the failure lab may put another in its place.
Optimise = Callable[..., dict]


# --------------------------------------------------------------------------- the schedule

def learning_rate_factor(config: TrainConfig) -> Callable[[int], float]:
    """The multiplier of the peak learning rate at optimizer step `step` (0-based): the schedule
    (grpo_edu.algorithm.schedules) spans the run, config.optimisation.steps x K optimizer steps, the first
    config.optimisation.warmup_steps x K of them warming up linearly (training steps count rollouts;
    K = optimizer_steps_per_rollout)."""
    K = optimizer_steps_per_rollout(config)
    return schedules.learning_rate_factor(config.optimisation.lr_schedule, config.optimisation.steps * K, config.optimisation.warmup_steps * K)


def make_optimizer(config: TrainConfig, parameters) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over those of `parameters` that train (float32 master weights and state; with LoRA the
    adapters only) and its learning-rate schedule."""
    parameters = [p for p in parameters if p.requires_grad]
    # fused: one kernel for all parameters (the same algorithm; 0.35 ms a step instead of 1.2 on the CPU tier)
    optimizer = torch.optim.AdamW(parameters, lr=config.optimisation.learning_rate, betas=tuple(config.optimisation.adam_betas),
                                  weight_decay=config.optimisation.weight_decay, fused=True)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, learning_rate_factor(config))


def skip_optimizer_step(scheduler) -> None:
    """An empty mini-batch: no update, but the learning rate moves on as if one were taken,
    so that it stays on its schedule (K scheduler steps per rollout, always)."""
    with warnings.catch_warnings():
        # torch warns when a scheduler steps before the optimizer ever has; here that is meant.
        warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()` before"))
        scheduler.step()


# --------------------------------------------------------------------------- micro-batches

def _logprobs_of(model, part: MicroBatch | Padding) -> torch.Tensor | None:
    """The model's log-probs of a micro-batch's rows; None for Padding, whose forward runs
    and is dropped."""
    if isinstance(part, Padding):
        part.forward(model)
        return None
    return model(part.input_ids, part.attention_mask, part.completion_mask)


# --------------------------------------------------------------------------- step 5

@torch.no_grad()
def add_logprobs(config: TrainConfig, models: Models, batch: RolloutBatch, plan: Plan,
                 world: World = World()) -> RolloutBatch:
    """Step 5: the batch with ref_logp (beta > 0) and old_logp (pi_old) filled in.

    pi_old: the sampler's log-probs (old_logprobs = "sampler"); else, when a rollout gives
    K > 1 optimizer steps, the policy's log-probs of the trained rows, in the micro-batches
    the update will use, so the first mini-batch's ratio is exactly 1 (the same forward,
    bitwise); else None: the update's own detached forward (K = 1).
    """
    # pi_old is the policy that sampled, for every optimizer step of this rollout:
    # refreshed per pass or per mini-batch, the ratio would restart at 1 there, and
    # with one mini-batch per pass the clip would never act. With one optimizer step
    # the policy has not moved before its forward, so that forward's detached
    # log-probs serve (ratio 1, as TRL), at no extra cost.
    old_logp = batch.old_logp   # set already for a rollout sampled ahead (rollout_lag)
    if old_logp is None and config.off_policy.old_logprobs == "sampler":
        old_logp = batch.sampler_logp
    elif old_logp is None and optimizer_steps_per_rollout(config) > 1:
        old_logp = policy_logprobs(config, models, batch, plan, world)
    ref_logp = None
    if models.reference_logprobs is not None:
        flat = batch.flat()
        ref_logp = torch.cat([
            models.reference_logprobs(flat["input_ids"][rows], flat["attention_mask"][rows],
                                      flat["completion_mask"][rows])
            for rows in torch.arange(batch.num_completions).split(config.optimisation.micro_batch_size)
        ]).view(batch.completion_mask.shape)
        if hasattr(models.reference_logprobs, "reshard"):
            # FSDP2 keeps a root module's parameters gathered after its forward (for the
            # backward that usually follows); the reference has none: back to 1/N shards.
            models.reference_logprobs.reshard()
    return replace(batch, old_logp=old_logp, ref_logp=ref_logp)


@torch.no_grad()
def policy_logprobs(config: TrainConfig, models: Models, batch: RolloutBatch, plan: Plan,
                    world: World = World()) -> torch.Tensor:
    """The current policy's log-probs of the trained rows, (b, G, S), computed in the
    micro-batches the update will use (so the first mini-batch's ratio is exactly 1);
    rows in no mini-batch stay 0 and are never read."""
    old_logp = torch.zeros_like(batch.sampler_logp)
    for k in range(config.optimisation.num_mini_batches):
        parts = micro_batches(plan, batch, k, config.optimisation.micro_batch_size, world)
        pieces = [_logprobs_of(models.train_logprobs, part) for part in parts]
        real = [piece for piece in pieces if piece is not None]
        if real:
            groups = plan.local_groups(k).nonzero()[:, 0].to(old_logp.device)
            old_logp.index_copy_(0, groups, torch.cat(real).view(-1, batch.group_size, batch.completion_length))
    return old_logp


# --------------------------------------------------------------------------- step 6

def micro_batch_loss(settings: LossSettings, model, part: MicroBatch, totals: LossTotals,
                     entropy_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, GRPOLossOutput, torch.Tensor]:
    """The loss of a micro-batch's rows as its part of the mini-batch's loss (divided by
    the whole mini-batch's counts, so the parts add up to it exactly); entropy_mask: the
    tokens whose policy term trains (top_entropy_quantile < 1, `entropy_pass`).

    Returns (loss, out, logp): the scalar part, grpo_loss's output and the rows' log-probs (detached).
    """
    logp = model(part.input_ids, part.attention_mask, part.completion_mask)        # (n, S)
    old = part.old_logp if part.old_logp is not None else logp.detach()             # (n, S)
    out = grpo_loss(logp, old, part.advantages, part.completion_mask, settings, ref_logp=part.ref_logp,
                    sampler_logp=part.sampler_logp, num_items=totals.num_items,
                    num_completions=totals.num_completions, entropy_mask=entropy_mask, excluded=part.truncated)
    return out.loss, out, logp.detach()


@torch.no_grad()
def entropy_pass(config: TrainConfig, model, parts: list[MicroBatch | Padding],
                 world: World = World()) -> tuple[list[torch.Tensor | None], dict[str, float]]:
    """Before an optimizer step (top_entropy_quantile < 1 or log_entropy): the policy's exact
    entropy at every token of the step's micro-batches, one forward each (Padding's too, for
    the ranks' collectives), and from them each part's entropy mask (None: every token trains)
    and the step's entropy metrics (grpo_edu.algorithm.entropy_mask). The threshold is the whole step's,
    on every rank: micro_batch_size and the number of processes do not change it."""
    real = [(i, part) for i, part in enumerate(parts) if not isinstance(part, Padding)]
    for part in parts:
        if isinstance(part, Padding):
            part.forward(model)
    entropies = [model(part.input_ids, part.attention_mask, part.completion_mask, entropy=True) for _, part in real]
    masks = [part.loss_mask for _, part in real]
    q = config.loss.top_entropy_quantile
    tau = entropy_mask.threshold(entropies, masks, q, world) if q < 1 else 0.0
    kept = [entropy_mask.high_entropy_mask(h, m, tau) for h, m in zip(entropies, masks)] if q < 1 else None
    chosen: list[torch.Tensor | None] = [None] * len(parts)
    for (i, _), mask in zip(real, kept or []):
        chosen[i] = mask
    return chosen, entropy_mask.entropy_metrics(entropies, masks, kept, tau, world)


def optimise(config: TrainConfig, settings: LossSettings, models: Models, optimizer, scheduler, batch: RolloutBatch,
             plan: Plan, world: World = World()) -> dict[str, float]:
    """num_iterations passes over the rollout; each pass is one optimizer step per mini-batch
    of the plan: K = num_iterations x num_mini_batches optimizer steps per rollout. `settings`:
    the loss's (LossSettings.of(config), built once by the trainer's set_up).

    Each rank backpropagates world.size x its part of the mini-batch's loss: DDP and FSDP2
    average gradients over ranks, so the gradient every rank steps with is the sum of the
    parts, the 1-process gradient.

    Returns the last optimizer step's loss metrics (grpo_loss's, reduced over micro-batches
    and ranks, plus grad_norm) and
      learning_rate       the learning rate of this rollout's first optimizer step
      optimizer_steps     the optimizer steps taken: K, less those of empty mini-batches
                          (which still step the schedule)
      sampler_gap/...     the trainer's log-probs before the update against the sampler's
                          (see sampler_gap); absent when no row is trained on
      skipped_update      1.0 when no optimizer step was taken
    """
    learning_rate = optimizer.param_groups[0]["lr"]   # what the first step below uses
    model = models.train_logprobs
    optimisation, loss = config.optimisation, config.loss
    metrics: dict[str, float] = {}
    steps_taken, first_forward = 0, []
    # Each mini-batch's micro-batches and loss denominators, the same in every pass; None: no
    # token to train (no group, or with mask_truncated_completions every completion truncated).
    truncating = loss.mask_truncated_completions
    planned = [(micro_batches(plan, batch, k, optimisation.micro_batch_size, world),
                plan.totals(k, loss.loss_type, truncating))
               if len(groups) and (not truncating or plan.finished[groups].any()) else None
               for k, groups in enumerate(plan.mini_batches)]
    for iteration in range(optimisation.num_iterations):
        for k in range(optimisation.num_mini_batches):
            if planned[k] is None:
                skip_optimizer_step(scheduler)
                continue
            parts, totals = planned[k]
            masks, entropy = (entropy_pass(config, model, parts, world) if loss.top_entropy_quantile < 1
                              or config.logging.log_entropy else ([None] * len(parts), {}))
            optimizer.zero_grad(set_to_none=True)
            sums = MetricSums(loss.importance_sampling_level == "sequence")
            for i, part in enumerate(parts):
                with distributed.no_sync(model, sync=i == len(parts) - 1):
                    if isinstance(part, Padding):   # this rank holds fewer rows: a zero-weight part
                        (part.forward(model).sum() * 0.0).backward()
                        continue
                    part_loss, out, logp = micro_batch_loss(settings, model, part, totals, masks[i])
                    (part_loss * world.size).backward()
                if steps_taken == 0:   # the policy has not moved yet: it is the one that sampled
                    first_forward.append((part, logp))
                sums.add(out.metrics, tokens=float(part.loss_mask.sum()),
                         completions=float(part.num_completions))
            # max_grad_norm 0: measure the norm (inf never clips) without clipping.
            norm = torch.nn.utils.clip_grad_norm_(models.policy.parameters(), optimisation.max_grad_norm or math.inf)
            optimizer.step()
            scheduler.step()
            steps_taken += 1
            if iteration == optimisation.num_iterations - 1 and all(later is None for later in planned[k + 1:]):
                metrics = {**sums.reduce(world), **entropy}
                metrics["grad_norm"] = float(distributed.full_tensor(norm))
    if models.sharded and not models.lazy:
        distributed.copy_full_weights(models.policy, models.full_policy)   # the sampler's weights
    if steps_taken == 0:
        metrics["skipped_update"] = 1.0
    metrics["learning_rate"] = learning_rate
    metrics["optimizer_steps"] = float(steps_taken)
    if steps_taken:
        metrics.update(_gap_before_update(config, batch, plan, first_forward, world))
    return metrics


def _gap_before_update(config: TrainConfig, batch: RolloutBatch, plan: Plan,
                       first_forward: list[tuple[MicroBatch, torch.Tensor]], world: World) -> dict[str, float]:
    """The sampler gap over the log-probs the trainer had before the rollout's first update:
    the recomputed pi_old (every trained row) when there is one, else the first optimizer
    step's own forward (its mini-batch's rows; with one step per rollout, every trained row).
    Either way, groups dropped by filter_zero_std_groups are not included."""
    if config.off_policy.old_logprobs != "sampler" and batch.old_logp is not None:
        keep = plan.trained_groups()
        if not keep.any():
            return sampler_gap(batch.sampler_logp[:0], batch.sampler_logp[:0], batch.completion_mask[:0], world)
        trained = batch.select(keep)
        trainer_logp, sampler_logp, mask = trained.old_logp, trained.sampler_logp, trained.completion_mask
    else:
        empty = batch.rows(slice(0, 0))
        parts = [part for part, _ in first_forward] or [empty]
        sampler_logp = torch.cat([part.sampler_logp for part in parts])
        trainer_logp = torch.cat([logp for _, logp in first_forward]) if first_forward else empty.sampler_logp
        mask = torch.cat([part.completion_mask for part in parts])
    return sampler_gap(trainer_logp, sampler_logp, mask, world)
