"""Asynchronous GRPO on the trainer's side: rollouts that lag (rollout_lag) and rollouts sampled in
the background (rollout_overlap), and what a checkpoint keeps of them.

A production trainer samples while it trains: the engine rolls out the next prompts with the
weights it last received while the trainer updates, so the rollout an update trains on was
sampled by the policy of k updates earlier. Here the sampler runs k rollouts ahead of the
update (`Lagged`): before update t it has sampled the rollouts of updates t .. t + k, each with
the policy of its time, and update t trains on the oldest. Each rollout is scored when it is
sampled, and its pi_old is the policy that sampled it (its log-probs taken then: the trainer's
forward, or with old_logprobs = "sampler" the sampler's own), so the ratio and the clip see the
staleness. The first k updates train on rollouts of the starting policy (staleness 0, 1, ...,
k - 1), every later one on a rollout exactly k updates old; the last k updates sample nothing,
so a run samples `steps` rollouts, the same prompts in the same order as the synchronous run.

With rollout_overlap (`Overlapped`) the newest of those rollouts is sampled by a thread while
the main thread runs the update:

    main thread    | sync | update t ............. | join | log, evaluate, checkpoint |
    sampler thread        | sample + score rollout t + k |

The sampler (`BackgroundSampler`) has weights of its own, synced from the policy between
rollouts (in the main thread, before the thread starts, while nothing writes them) and never
during one: with the fused and hf engines a copy of the policy that it samples from; with an
engine that keeps its own weights (vLLM, an SGLang server) the engine's (its sync_weights runs
then, and the thread's rollout does not sync again), and a copy only to compute pi_old with
(old_logprobs = "recomputed"; "proximal" and "sampler" need none). It draws the same random
numbers in the same order (the update draws none), so a run with overlap is the run without it,
bit for bit (tests/test_overlap.py); only the time/* metrics differ. A colocated vLLM, or an
SGLang server, must not sleep (it samples while the trainer holds its memory).

Under torchrun (DDP or FSDP2) every rank runs its own sampler thread; its copy holds whole
weights (under FSDP2 gathered from the shards at the sync, in the main thread, where every
rank is). The rollout's own collectives (the rewards gathered for the batch-level advantages)
run in a side process group (grpo_edu.runtime.distributed.side_world): the update's
all-reduces and all-gathers keep the default group to themselves, so neither thread can
overtake the other's collectives on one rank but not another's. pi_old is computed by the
unwrapped copy, no collective at all. What it buys depends on free cores: on a GPU the sampler
and the trainer are different engines' work; on a 2-core CPU both compete for the same two
cores (benchmarks/overlap.py measures it; chapter 12 shows the figures).

    Lagged, Overlapped    the sources (grpo_edu.training.rollouts.RolloutSource)
    rollout_source        the source a config names, over a sampler
    BackgroundSampler     the thread, its copy of the weights and its engine
    to_record,            a rollout sampled ahead as plain tensors, numbers and strings (a
    from_record           checkpoint's trainer_state.pt, read with weights_only=True) and back
"""

from __future__ import annotations

import threading
import time
from dataclasses import fields
from typing import Callable

import torch

from grpo_edu.config import TrainConfig
from grpo_edu.runtime.distributed import World, side_world
from grpo_edu.sampling.engines import ENGINES
from grpo_edu.training.batch import RolloutBatch
from grpo_edu.training.checkpoint import CheckpointError
from grpo_edu.training.placement import Models, build_models, make_engine, make_reference
from grpo_edu.training.plan import Plan
from grpo_edu.training.rollouts import InFlight, RolloutSource, Sampler, Synchronous


# --------------------------------------------------------------------------- the sources

class Lagged:
    """rollout_lag = k: before update t the rollouts of updates t .. t + k are sampled (each by
    the policy of its time), kept in `in_flight`, oldest first (a checkpoint stores them); update
    t trains on the oldest. The last k updates sample nothing."""

    def __init__(self, sampler: Sampler, lag: int, steps: int):
        self.sampler, self.lag, self.steps = sampler, lag, steps
        self.in_flight: list[InFlight] = []   # sampled, not yet trained on, oldest first

    def _sample_ahead(self, step: int, ahead: int) -> None:
        while len(self.in_flight) <= ahead and step + len(self.in_flight) < self.steps:
            self.in_flight.append(self.sampler.sample(step))   # by the policy of update `step`

    def next(self, step: int) -> InFlight:
        self._sample_ahead(step, self.lag)
        return self.in_flight.pop(0)

    def after_update(self) -> None:
        """Nothing is sampled beside the update."""

    def metrics(self, flight: InFlight, step: int, started: float) -> dict[str, float]:
        return {"staleness": float(step - 1 - flight.sampled_at)}   # updates between sampler and this

    def records(self, world: World) -> list | None:
        """Every rank's rollouts sampled ahead (the same count on every rank), as records: a collective."""
        if not self.in_flight:
            return None
        return world.gather_objects([[to_record(flight) for flight in self.in_flight]])

    def restore(self, records: list | None, world: World) -> None:
        """This rank's rollouts sampled ahead, as a checkpoint's records hold them. They are each
        rank's share of the prompts, so a lagged run resumes on the number of processes that wrote them."""
        if records is None:
            self.in_flight = []
            return
        if len(records) != world.size:
            raise CheckpointError(f"resume: the checkpoint's rollouts sampled ahead (rollout_lag) were written by "
                                  f"{len(records)} processes; resume on {len(records)}, got {world.size}")
        self.in_flight = [from_record(record, world.device) for record in records[world.rank]]


class Overlapped(Lagged):
    """rollout_overlap: Lagged, the newest of the k rollouts (the one Lagged would sample next,
    by the same policy) sampled by a BackgroundSampler's thread while the update runs."""

    def __init__(self, sampler: Sampler, lag: int, steps: int, background: "BackgroundSampler"):
        super().__init__(sampler, lag, steps)
        self.background = background

    def next(self, step: int) -> InFlight:
        self._sample_ahead(step, self.lag - 1)
        flight = self.in_flight.pop(0)
        if step + 1 + len(self.in_flight) < self.steps:   # by the policy of update `step`, in the thread
            self.background.start(self.sampler.models, lambda engine, models, world: self.sampler.sample(
                step, engine, models, world))
        return flight

    def after_update(self) -> None:
        if (sampled := self.background.join()) is not None:
            self.in_flight.append(sampled)

    def metrics(self, flight: InFlight, step: int, started: float) -> dict[str, float]:
        # the rollout's time overlapped the update: the step's own wall-clock
        return {**super().metrics(flight, step, started), "time/step": time.perf_counter() - started}


def rollout_source(config: TrainConfig, sampler: Sampler) -> RolloutSource:
    """The source the config names: Overlapped with a background sampler (rollout_overlap), else
    Lagged for rollout_lag > 0, else Synchronous. A background sampler is built here (under
    torchrun every rank builds one, at the same point of set_up)."""
    lag, steps = config.off_policy.rollout_lag, config.optimisation.steps
    if config.off_policy.rollout_overlap:
        background = BackgroundSampler(config, sampler.world, sampler.models, sampler.tokenizer, sampler.engine)
        return Overlapped(sampler, lag, steps, background)
    return Lagged(sampler, lag, steps) if lag else Synchronous(sampler)


# --------------------------------------------------------------------------- in a checkpoint

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
                 "sampling": dict(plan.sampling), "process": {k: v.cpu() for k, v in plan.process.items()},
                 "observed": {k: v.cpu() for k, v in plan.observed.items()}},
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
                sampling=dict(p.get("sampling", {})), process=dict(p.get("process", {})),
                observed=dict(p.get("observed", {})))
    return InFlight(list(record["samples"]), batch, plan, int(record["sampled_at"]), dict(record["seconds"]))


# --------------------------------------------------------------------------- the background sampler

ALIGNMENT = 64   # bytes: the CPU kernels' widest vector load (AVX-512), and torch's allocator's alignment


class BackgroundSampler:
    """The sampler's copy of the policy (where it needs one), its engine, and at most one
    rollout in flight."""

    def __init__(self, config: TrainConfig, world: World, models: Models, tokenizer, engine=None):
        """models: the trainer's; engine: the run's engine. A vLLM engine is shared (its weights
        are the sampler's); the fused and hf engines get one of their own over the copy. Under
        torchrun every rank builds one here, at the same point of set_up (the side group)."""
        self.world = side_world(world)   # the thread's collectives: a group of their own
        self._vllm = engine if ENGINES[config.run.engine].own_weights else None   # vLLM or an SGLang server
        # A copy of the weights, for the engine to sample from (fused, hf) or for pi_old, the
        # sampling policy's forward (old_logprobs = "recomputed"). vLLM with pi_old taken at
        # the update or from vLLM needs none: under FSDP2 it would be whole weights per rank.
        self.policy: torch.nn.Module | None = None
        self.models: Models | None = None
        if self._vllm is None or config.off_policy.old_logprobs == "recomputed":
            with models.whole() as whole:   # the policy's whole weights (FSDP2: its plain copy)
                self.policy = _mirrored_copy(whole)   # separate tensors: the update never writes them
            # as the policy's: transformers' attention picks its kernel by whether the weights need a
            # gradient, and pi_old must be the policy's forward to the last bit (no optimizer holds these)
            self.policy.requires_grad_(any(p.requires_grad for p in models.policy.parameters()))
            # Models over the copy: no reference, and unwrapped (a world of one on this rank's
            # device): its forward runs no collective.
            self.models = build_models(config.replace(beta=0.0), World(device=world.device), self.policy)
        self.engine = (_Presynced(engine) if self._vllm is not None
                       else make_engine(config, self.models, tokenizer, self.world))
        self._thread: threading.Thread | None = None
        self._result: InFlight | None = None
        self._error: BaseException | None = None

    def start(self, models: Models, sample: Callable[[object, Models, World], InFlight]) -> None:
        """Sync the copy from the trainer's `models` (now, between rollouts; every rank),
        then run sample(engine, models, world) in the background, world being the side one."""
        if self._thread is not None:
            raise RuntimeError("BackgroundSampler.start: the previous rollout was not joined")
        if self.policy is not None:
            with torch.no_grad(), models.whole() as whole:
                for mine, theirs in zip(self.policy.state_dict().values(), whole.state_dict().values()):
                    mine.copy_(theirs)
        if self._vllm is not None:
            self._vllm.sync_weights()   # the policy's weights into vLLM, now

        def work():
            try:
                self._result = sample(self.engine, self.models, self.world)
            except BaseException as error:   # re-raised by join, in the main thread
                self._error = error
        self._result, self._error = None, None
        self._thread = threading.Thread(target=work, name="grpo-edu sampler", daemon=True)
        self._thread.start()

    def join(self) -> InFlight | None:
        """The rollout the thread sampled (None if none was started); its error, if it raised."""
        if self._thread is None:
            return None
        self._thread.join()
        self._thread = None
        if self._error is not None:
            raise self._error
        return self._result


class _Presynced:
    """A vLLM engine whose weights start() has synced: the thread's rollout samples with them
    (roll_out's own sync_weights call does nothing, so the thread never reads the policy)."""

    def __init__(self, engine):
        self.inner = engine

    def sync_weights(self) -> None:
        """Synced by BackgroundSampler.start, in the main thread, before this rollout began."""

    def generate(self, *args, **kwargs):
        return self.inner.generate(*args, **kwargs)

    def seeded(self, *args, **kwargs):
        """The engine's own seeding: its generate samples with the weights start() synced."""
        return self.inner.seeded(*args, **kwargs)


def _mirrored_copy(model: torch.nn.Module) -> torch.nn.Module:
    """make_reference(model), each parameter and buffer placed at its original's address modulo
    ALIGNMENT. The CPU's matrix kernels split a row into an unaligned head and aligned vectors,
    so the same numbers at another alignment can round differently in the last bit: the
    committed starting policy's tensors, read from its safetensors file, sit 56 bytes past a
    64-byte boundary, and a plain copy (64-aligned) sampled 2 of 30 test batches with some
    log-prob one float32 ulp apart. The sampler's copy computes what the policy computes."""
    copied = make_reference(model)
    originals = dict(model.named_parameters()) | dict(model.named_buffers())
    for name, tensor in list(copied.named_parameters()) + list(copied.named_buffers()):
        original = originals[name]
        if original.device.type != "cpu" or not original.is_contiguous():
            continue   # GPU allocations are 256-byte aligned either way; a view keeps the copy's layout
        size = original.element_size()
        spare = torch.empty(original.numel() + ALIGNMENT // size, dtype=original.dtype)
        start = ((original.data_ptr() - spare.data_ptr()) % ALIGNMENT) // size
        tensor.data = spare[start:start + original.numel()].view(original.shape).copy_(original)
    return copied
