"""Rollouts sampled in the background (config.off_policy.rollout_overlap): the overlap that rollout_lag
makes possible.

With rollout_lag = k >= 1 the rollout of update t + k is sampled by the policy of update t
(grpo_edu.training.lagging). Without overlap the trainer samples it, then updates; with it, a thread
samples it while the main thread runs update t:

    main thread    | sync | update t ............. | join | log, evaluate, checkpoint |
    sampler thread        | sample + score rollout t + k |

The sampler has weights of its own, synced from the policy between rollouts (in the main
thread, before the thread starts, while nothing writes them) and never during one: with the
fused and hf engines a copy of the policy that it samples from; with vLLM (or an SGLang
server) the engine's own weights (its sync_weights runs then, and the thread's rollout does
not sync again), and a copy only to compute pi_old with (old_logprobs = "recomputed";
"proximal" and "sampler" need none). It draws the same random numbers in the same order (the update
draws none), so a run with overlap is the run without it, bit for bit (tests/test_overlap.py);
only the time/* metrics differ. A colocated vLLM, or an SGLang server, must not sleep (it samples
while the trainer holds its memory).

Under torchrun (DDP or FSDP2) every rank runs its own sampler thread; its copy holds whole
weights (under FSDP2 gathered from the shards at the sync, in the main thread, where every
rank is: 4 bytes per parameter on every rank, which vLLM with "proximal" does without). The
rollout's own collectives (the rewards gathered for the batch-level advantages) run in a side
process group (grpo_edu.runtime.distributed.side_world): the update's all-reduces and all-gathers
keep the default group to themselves, so neither thread can overtake the other's
collectives on one rank but not another's. pi_old is computed by the unwrapped copy, no
collective at all.

What it buys depends on free cores: on a GPU the sampler and the trainer are different
engines' work; on a 2-core CPU both compete for the same two cores (benchmarks/overlap.py
measures it; chapter 11 shows the figures).
"""

from __future__ import annotations

import threading
from typing import Callable

import torch

from grpo_edu.config import TrainConfig
from grpo_edu.runtime.distributed import World, side_world
from grpo_edu.training.lagging import InFlight
from grpo_edu.sampling.engines import ENGINES
from grpo_edu.training.placement import Models, build_models, make_engine, make_reference

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
