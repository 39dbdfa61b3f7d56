"""The plan of a rollout's update: which groups each optimizer step trains on, what each part's
loss divides by, and how a mini-batch splits into micro-batches on each rank.

    Plan                 what every rank knows about the whole rollout (the same on all): its
                         rewards, advantages, lengths and the mini-batches as prompt indices
    plan_mini_batches    the prompts of each mini-batch, whole groups, dealt out in turn
    LossTotals           the counts a mini-batch's loss divides by, over all ranks
    optimizer_steps_per_rollout  K = num_iterations x num_mini_batches
    micro_batches        a mini-batch's rows on this rank, as MicroBatch slices of the batch
                         (Padding where another rank holds more)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from grpo_edu.algorithm.advantages import zero_std_groups
from grpo_edu.algorithm.aggregation import AGGREGATIONS
from grpo_edu.config import TrainConfig
from grpo_edu.runtime.distributed import World
from grpo_edu.training.batch import MicroBatch, RolloutBatch


@dataclass(frozen=True)
class LossTotals:
    """The whole mini-batch's counts, over all ranks, that each part's loss divides by."""

    num_completions: int       # grpo, dr_grpo
    num_items: float           # bnpo: the mini-batch's tokens; dapo: rollout tokens / num_mini_batches


@dataclass(frozen=True)
class Plan:
    """What every rank knows about the whole rollout (gathered, so the same on all):
    its rewards, advantages and completion lengths (B, G), and the mini-batches as
    global prompt indices. `owned` is this rank's prompts."""

    rewards: torch.Tensor               # (B, G) float64, the weighted sum
    components: dict[str, torch.Tensor]  # name -> (B, G), each reward function
    advantages: torch.Tensor            # (B, G) float32
    lengths: torch.Tensor               # (B, G) real completion tokens
    finished: torch.Tensor              # (B, G) ended with EOS
    mini_batches: list[torch.Tensor]    # num_mini_batches tensors of global prompt indices
    owned: slice                        # this rank's prompts
    group_size: int
    # Multi-turn episodes: name -> (B, G) float64 (turns, env_tokens, cut_answers, turn_limit);
    # empty for single-turn completions
    episode: dict[str, torch.Tensor] = field(default_factory=dict)
    # dynamic_sampling_rounds: rounds, first_zero_std, short (grpo_edu.training.dynamic_sampling); else empty
    sampling: dict[str, float] = field(default_factory=dict)
    # A task whose steps a rule checks (grpo_edu.environment.process): steps, steps_right -> (B, G) float64; else empty.
    # With supervision = "process" the advantages above are each completion's first-token advantage (the
    # batch holds them per token).
    process: dict[str, torch.Tensor] = field(default_factory=dict)
    # What the task observes in each completion (its registered completion_metrics: digitsum's
    # format shares and checks): name -> (B, G) float64; empty for a task without them.
    observed: dict[str, torch.Tensor] = field(default_factory=dict)

    def local_groups(self, k: int) -> torch.Tensor:
        """(B / N,) bool: which of this rank's prompts mini-batch k holds."""
        keep = torch.zeros(self.owned.stop - self.owned.start, dtype=torch.bool)
        chosen = self.mini_batches[k]
        mine = chosen[(chosen >= self.owned.start) & (chosen < self.owned.stop)] - self.owned.start
        keep[mine] = True
        return keep

    def trained_groups(self) -> torch.Tensor:
        """(B / N,) bool: which of this rank's prompts any mini-batch holds."""
        keep = torch.zeros(self.owned.stop - self.owned.start, dtype=torch.bool)
        for k in range(len(self.mini_batches)):
            keep |= self.local_groups(k)
        return keep

    def rows_on_rank(self, k: int, rank: int) -> int:
        """Completions of mini-batch k that rank `rank` holds (any rank's, known to all)."""
        width = self.owned.stop - self.owned.start
        chosen = self.mini_batches[k]
        return int(((chosen >= rank * width) & (chosen < (rank + 1) * width)).sum()) * self.group_size

    def totals(self, k: int, loss_type: str, mask_truncated: bool = False) -> LossTotals:
        """Mini-batch k's LossTotals, for the config's loss_type: its token count is the registered
        aggregation's (grpo_edu.algorithm.aggregation; dapo's is an optimizer step's share of the
        rollout's tokens). mask_truncated: the truncated completions' tokens do not count (overlong
        filtering)."""
        chosen = self.mini_batches[k]
        lengths = self.lengths * self.finished if mask_truncated else self.lengths
        items = AGGREGATIONS[loss_type].num_items(lengths, chosen, self.mini_batches)
        return LossTotals(num_completions=len(chosen) * self.group_size, num_items=items)


def plan_mini_batches(config: TrainConfig, rewards: torch.Tensor) -> list[torch.Tensor]:
    """The prompts of each of a rollout's num_mini_batches mini-batches: rewards (B, G) ->
    num_mini_batches tensors of prompt indices, whole groups.

    The groups (those left after filter_zero_std_groups) are dealt out in turn, as
    evenly as possible, larger first: 7 groups in 2 mini-batches give [0, 2, 4, 6] +
    [1, 3, 5]. Dealt, not cut into runs: each rank owns a run of prompts, so every
    mini-batch then holds about as many groups of every rank, and all ranks work in
    every optimizer step. With fewer groups than mini-batches the last ones are empty
    (the update skips them).
    """
    groups = torch.arange(rewards.shape[0])
    if config.advantages.filter_zero_std_groups or config.advantages.dynamic_sampling_rounds:   # all-equal groups teach nothing: dropped
        groups = groups[~zero_std_groups(rewards)]
    return [groups[k::config.optimisation.num_mini_batches] for k in range(config.optimisation.num_mini_batches)]



# --------------------------------------------------------------------------- the schedule

def optimizer_steps_per_rollout(config: TrainConfig) -> int:
    """K: each training step (one rollout) gives this many optimizer steps."""
    return config.optimisation.num_iterations * config.optimisation.num_mini_batches



# --------------------------------------------------------------------------- micro-batches

@dataclass(frozen=True)
class Padding:
    """A padding micro-batch: this rank holds fewer rows of the mini-batch than another, so it
    runs a forward (and a backward, weighted 0) of one row of `batch`, to take part in the
    ranks' collectives (FSDP2's gathers; in a backward, the gradient reduction). It adds nothing."""

    batch: RolloutBatch

    def forward(self, model) -> torch.Tensor:
        row = self.batch.rows(slice(0, 1))
        return model(row.input_ids, row.attention_mask, row.completion_mask)


def micro_batches(plan: Plan, batch: RolloutBatch, k: int, micro_batch_size: int,
                  world: World = World()) -> list[MicroBatch | Padding]:
    """Mini-batch k's micro-batches on this rank: its groups' rows, micro_batch_size at a time,
    then Padding up to the count of the rank that has the most: every rank runs as many
    forwards (FSDP2 gathers parameters in each) and backwards, so the collectives line up."""
    keep = plan.local_groups(k)
    parts: list[MicroBatch | Padding] = []
    if keep.any():
        chosen = batch.select(keep)
        parts = [chosen.rows(slice(start, start + micro_batch_size))
                 for start in range(0, chosen.num_completions, micro_batch_size)]
    most = max(-(-plan.rows_on_rank(k, r) // micro_batch_size) for r in range(world.size))
    return parts + [Padding(batch)] * (most - len(parts))
