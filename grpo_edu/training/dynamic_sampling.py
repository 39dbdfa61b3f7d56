"""DAPO's dynamic sampling (config key dynamic_sampling_rounds): a rollout's groups whose rewards
are all equal carry no gradient (their advantages are all 0), so they are replaced by groups of
fresh prompts until the batch is full of groups whose rewards differ.

    round 0      the step's B prompts, G completions each, scored as always
    round 1..k   while fewer than B groups differ: B fresh prompts (the same prompt stream), rolled
                 out and scored; their differing groups join the batch, in order
    the batch    the first B differing groups, round 0's first; at the limit of k extra rounds
                 the slots left are filled with round 0's all-equal groups, which the plan drops
                 from training as filter_zero_std_groups does (so the batch trains on fewer than
                 B groups that step: logged as dynamic_sampling/short)

The batch is then scored once more, as one rollout: its advantages are each group's own (a
group's baseline never mixes rounds). Logged per step: dynamic_sampling/rounds (rollouts
sampled, 1 = none extra), /first_zero_std (the share of round 0's groups that were all equal:
what the filter alone would have dropped) and /short (the share of the B slots left to all-equal
groups at the limit). Every rank samples every round (its share, as always); the groups are
chosen from the gathered rewards, the same on every rank, and the chosen rollouts gathered so
that each rank takes its share of the merged batch: N processes train what one does.

verl's DAPO recipe raises an error at its limit (max_num_gen_batches); here the step trains on
what it has, and says so.
"""

from __future__ import annotations

import time
from dataclasses import fields, replace
from typing import Callable

import torch

from grpo_edu.algorithm.advantages import zero_std_groups
from grpo_edu.training.batch import RolloutBatch
from grpo_edu.config import TrainConfig
from grpo_edu.runtime.distributed import World
from grpo_edu.sampling.rollout import Rollout
from grpo_edu.training.plan import Plan

# draw() -> (samples, rollout): the next B prompts and this rank's rollout of its share of them
Draw = Callable[[], tuple[list[dict], Rollout]]
# score(samples, rollout) -> (batch, plan): grpo_edu.training.scoring.score with the run's functions
Score = Callable[[list[dict], Rollout], tuple[RolloutBatch, Plan]]


def refill(config: TrainConfig, samples: list[dict], rollout: Rollout, batch: RolloutBatch, plan: Plan,
           draw: Draw, score: Score, pad_token_id: int, world: World = World()
           ) -> tuple[RolloutBatch, Plan, float]:
    """Round 0 (samples, rollout, and its batch and plan) topped up with the differing groups of up
    to config.advantages.dynamic_sampling_rounds more rounds: the step's batch and plan (module docstring),
    and the seconds the extra rollouts took (the trainer counts them as rollout time)."""
    B = len(samples)
    first_flat = zero_std_groups(plan.rewards)
    chosen = [(0, b) for b in (~first_flat).nonzero()[:, 0].tolist()]
    rounds, drawing = [(samples, rollout)], 0.0
    while len(chosen) < B and len(rounds) <= config.advantages.dynamic_sampling_rounds:
        started = time.perf_counter()
        more, more_rollout = draw()
        drawing += time.perf_counter() - started
        _, more_plan = score(more, more_rollout)
        chosen += [(len(rounds), b) for b in (~zero_std_groups(more_plan.rewards)).nonzero()[:, 0].tolist()]
        rounds.append((more, more_rollout))
    short = max(0, B - len(chosen))
    chosen = chosen[:B] + [(0, b) for b in first_flat.nonzero()[:, 0].tolist()][:short]
    stats = {"rounds": float(len(rounds)), "first_zero_std": first_flat.double().mean().item(), "short": short / B}
    if chosen == [(0, b) for b in range(B)]:   # round 0 as it was: nothing to merge
        return batch, replace(plan, sampling=stats), drawing
    whole = [gather_rollout(r, pad_token_id, world) for _, r in rounds]
    G = rollout.num_generations
    rows = torch.cat([torch.arange(b * G, (b + 1) * G) + offset(whole, r) for r, b in chosen])
    merged = take_rows(concat_rollouts(whole, pad_token_id), rows)
    share = world.shard(B)
    mine = _to(take_rows(merged, torch.arange(share.start * G, share.stop * G)), rollout.completion_ids.device)
    batch, plan = score([rounds[r][0][b] for r, b in chosen], mine)
    return batch, replace(plan, sampling=stats), drawing


def offset(whole: list[Rollout], r: int) -> int:
    """The first row of round r in the rounds' concatenation."""
    return sum(part.completion_ids.shape[0] for part in whole[:r])


# --------------------------------------------------------------------------- rollouts as rows

_ROWS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "sampler_logp", "finished", "env_mask")


def take_rows(rollout: Rollout, rows: torch.Tensor) -> Rollout:
    """Rows `rows` (whole groups) of a rollout."""
    values = {name: getattr(rollout, name) for name in _ROWS}
    taken = {name: None if value is None else value[rows.to(value.device)] for name, value in values.items()}
    episode = None if rollout.episode is None else {k: v[rows] for k, v in rollout.episode.items()}
    return replace(rollout, **taken, episode=episode)


def _to(rollout: Rollout, device) -> Rollout:
    """The rollout with its per-row tensors on `device` (episode statistics stay on the CPU)."""
    return replace(rollout, **{name: getattr(rollout, name).to(device) for name in _ROWS
                               if getattr(rollout, name) is not None})


def _pad(tensor: torch.Tensor, width: int, value, left: bool) -> torch.Tensor:
    missing = width - tensor.shape[1]
    if missing == 0:
        return tensor
    fill = tensor.new_full((tensor.shape[0], missing), value)
    return torch.cat([fill, tensor] if left else [tensor, fill], dim=1)


def concat_rollouts(parts: list[Rollout], pad_token_id: int) -> Rollout:
    """One rollout of the parts' rows in order: prompts left-padded to the widest, completions
    right-padded (pad id, masks 0, log-probs 0). Multi-turn or not, as the parts are."""
    P = max(part.prompt_ids.shape[1] for part in parts)
    S = max(part.completion_ids.shape[1] for part in parts)
    episodic = parts[0].env_mask is not None
    if any((part.env_mask is not None) != episodic for part in parts):
        raise ValueError("concat_rollouts: every part must be multi-turn (env_mask) or none")
    joined = {
        "prompt_ids": torch.cat([_pad(p.prompt_ids, P, pad_token_id, True) for p in parts]),
        "prompt_mask": torch.cat([_pad(p.prompt_mask, P, 0, True) for p in parts]),
        "completion_ids": torch.cat([_pad(p.completion_ids, S, pad_token_id, False) for p in parts]),
        "completion_mask": torch.cat([_pad(p.completion_mask, S, 0, False) for p in parts]),
        "sampler_logp": torch.cat([_pad(p.sampler_logp, S, 0.0, False) for p in parts]),
        "finished": torch.cat([p.finished for p in parts]),
        "env_mask": torch.cat([_pad(p.env_mask, S, 0, False) for p in parts]) if episodic else None,
    }
    episode = None if parts[0].episode is None else {
        key: torch.cat([p.episode[key] for p in parts]) for key in parts[0].episode}
    return Rollout(**joined, num_generations=parts[0].num_generations, episode=episode)


def gather_rollout(rollout: Rollout, pad_token_id: int, world: World) -> Rollout:
    """Every rank's rollout of its share, joined in rank order: the whole B prompts' rollout (on
    the CPU when there is more than one rank; the rollout itself on one)."""
    if not world.distributed:
        return rollout
    cpu = replace(rollout, **{f.name: getattr(rollout, f.name).cpu() for f in fields(rollout)
                              if isinstance(getattr(rollout, f.name), torch.Tensor)})
    return concat_rollouts(world.gather_objects([cpu]), pad_token_id)
