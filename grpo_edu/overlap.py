"""Rollouts sampled in the background (config.rollout_overlap): the overlap that rollout_lag
makes possible.

With rollout_lag = k >= 1 the rollout of update t + k is sampled by the policy of update t
(grpo_edu.lagging). Without overlap the trainer samples it, then updates; with it, a thread
samples it while the main thread runs update t:

    main thread    | sync | update t ............. | join | log, evaluate, checkpoint |
    sampler thread        | sample + score rollout t + k |

The sampler has weights of its own, synced from the policy between rollouts (in the main
thread, before the thread starts, while nothing writes them) and never during one: with the
fused and hf engines a copy of the policy that it samples from; with vLLM the engine's own
weights (its sync_weights runs then, and the thread's rollout does not sync again), beside the
copy that computes pi_old. It draws the same random numbers in the same order (the update
draws none), so a run with overlap is the run without it, bit for bit (tests/test_overlap.py);
only the time/* metrics differ. One process; a colocated vLLM must not sleep (it samples
while the trainer holds its memory).

What it buys depends on free cores: on a GPU the sampler and the trainer are different
engines' work; on a 2-core CPU both compete for the same two cores (benchmarks/overlap.py
measures it; chapter 10 shows the figures).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Callable

import torch

from grpo_edu.config import TrainConfig
from grpo_edu.distributed import World
from grpo_edu.lagging import InFlight
from grpo_edu.placement import Models, build_models, make_engine, make_reference


class BackgroundSampler:
    """The sampler's copy of the policy, its engine, and at most one rollout in flight."""

    def __init__(self, config: TrainConfig, world: World, policy: torch.nn.Module, tokenizer, engine=None):
        """engine: the run's engine; a vLLM engine is shared (its weights are the sampler's),
        the fused and hf engines get one of their own over the copy."""
        if world.distributed:
            raise ValueError(f"config key 'rollout_overlap' is true under {world.size} processes: background "
                             f"sampling is built for one process (its thread would run collectives beside the "
                             f"update's); set rollout_overlap = false")
        self.policy = make_reference(policy)   # separate tensors: the update never writes them
        # as the policy's: transformers' attention picks its kernel by whether the weights need a
        # gradient, and pi_old must be the policy's forward to the last bit (no optimizer holds these)
        self.policy.requires_grad_(any(p.requires_grad for p in policy.parameters()))
        # Models over the copy, for its pi_old (old_logprobs = "recomputed"): no reference needed.
        self.models: Models = build_models(replace(config, beta=0.0), world, self.policy)
        self._vllm = engine if config.engine == "vllm" else None
        self.engine = _Presynced(engine) if self._vllm is not None else make_engine(config, self.models, tokenizer, world)
        self._thread: threading.Thread | None = None
        self._result: InFlight | None = None
        self._error: BaseException | None = None

    def start(self, policy: torch.nn.Module, sample: Callable[[object, Models], InFlight]) -> None:
        """Sync the copy from `policy` (now, between rollouts), then run sample(engine, models)
        in the background."""
        if self._thread is not None:
            raise RuntimeError("BackgroundSampler.start: the previous rollout was not joined")
        with torch.no_grad():
            for mine, theirs in zip(self.policy.state_dict().values(), policy.state_dict().values()):
                mine.copy_(theirs)
        if self._vllm is not None:
            self._vllm.sync_weights()   # the policy's weights into vLLM, now

        def work():
            try:
                self._result = sample(self.engine, self.models)
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
