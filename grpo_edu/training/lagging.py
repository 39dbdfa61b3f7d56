"""Rollouts that lag (config.off_policy.rollout_lag = k): asynchronous GRPO's data, on the trainer's side.

A production trainer samples while it trains: the engine rolls out the next prompts with the
weights it last received while the trainer updates, so the rollout an update trains on was
sampled by the policy of k updates earlier. Here the sampler runs k rollouts ahead of the
update (grpo_edu.training.rollouts.Lagged): before update t it has sampled the rollouts of updates
t .. t + k, each with the policy of its time, and update t trains on the oldest. Each rollout
is scored when it is sampled, and its pi_old is the policy that sampled it (its log-probs
taken then: the trainer's forward, or with old_logprobs = "sampler" the sampler's own), so
the ratio and the clip see the staleness. The first k updates
train on rollouts of the starting policy (staleness 0, 1, ..., k - 1), every later one on a
rollout exactly k updates old; the last k updates sample nothing, so a run samples `steps`
rollouts, the same prompts in the same order as the synchronous run.

    InFlight        a rollout sampled ahead: its prompts, batch (pi_old included), plan, and
                    the update it was sampled before
    to_record,      an InFlight as plain tensors, numbers and strings (a checkpoint's
    from_record     trainer_state.pt, read with weights_only=True) and back
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from grpo_edu.training.batch import RolloutBatch
from grpo_edu.training.scoring import Plan


@dataclass
class InFlight:
    """A rollout sampled ahead of the update that trains on it."""

    samples: list[dict]            # the step's B prompts (every rank's list)
    batch: RolloutBatch            # this rank's batch; old_logp set when sampled ahead (rollout_lag > 0)
    plan: Plan
    sampled_at: int                # the update (0-based) it was sampled before: the policy that sampled it
    seconds: dict[str, float]      # the time its rollout and its scoring took


def to_record(flight: InFlight) -> dict:
    """`flight` as a checkpoint stores it: tensors (on the CPU), numbers, strings, lists, dicts."""
    plan = flight.plan
    return {
        "samples": flight.samples,
        "batch": {f.name: None if getattr(flight.batch, f.name) is None else getattr(flight.batch, f.name).cpu()
                  for f in fields(flight.batch)},
        "plan": {"rewards": plan.rewards.cpu(), "components": {k: v.cpu() for k, v in plan.components.items()},
                 "advantages": plan.advantages.cpu(), "lengths": plan.lengths.cpu(), "finished": plan.finished.cpu(),
                 "mini_batches": [m.cpu() for m in plan.mini_batches], "owned": (plan.owned.start, plan.owned.stop),
                 "group_size": plan.group_size, "episode": {k: v.cpu() for k, v in plan.episode.items()},
                 "sampling": dict(plan.sampling), "process": {k: v.cpu() for k, v in plan.process.items()}},
        "sampled_at": flight.sampled_at,
        "seconds": dict(flight.seconds),
    }


def from_record(record: dict, device: torch.device | str = "cpu") -> InFlight:
    """The InFlight that to_record stored, its batch on `device`."""
    batch = RolloutBatch(**{k: None if v is None else v.to(device) for k, v in record["batch"].items()})
    p = record["plan"]
    plan = Plan(rewards=p["rewards"], components=dict(p["components"]), advantages=p["advantages"],
                lengths=p["lengths"], finished=p["finished"], mini_batches=list(p["mini_batches"]),
                owned=slice(*p["owned"]), group_size=p["group_size"], episode=dict(p.get("episode", {})),
                sampling=dict(p.get("sampling", {})), process=dict(p.get("process", {})))
    return InFlight(list(record["samples"]), batch, plan, int(record["sampled_at"]), dict(record["seconds"]))
