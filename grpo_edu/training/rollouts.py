"""Steps 1-4 of a training step, as stages: where each update's scored rollout comes from.

A rollout goes through the same stages whatever the run:

    draw      the step's B prompts (every rank the same list)                  sample_prompts
    roll out  G completions of each of this rank's prompts, with the          roll_out
              sampler's log-probs (a multi-turn run: episodes, one policy
              turn at a time; grpo_edu.training.episodes)
    score     rewards gathered (B, G), advantages, the mini-batch plan and     scoring.score
              this rank's RolloutBatch
    refill    dynamic_sampling_rounds: all-equal groups replaced by the        dynamic_sampling.refill
              differing groups of fresh prompts
    pi_old    rollout_lag: the log-probs of the policy that sampled, taken     update.policy_logprobs
              now, before later updates move it

`sample_rollout` runs them for the next rollout. A source decides when: the loop asks it for
the rollout of each update (`next(run)`) and tells it when the update is done (`after_update(run)`).

    Synchronous  samples each update's rollout just before the update (rollout_lag = 0)
    Lagged       keeps the rollouts of the next k updates sampled ahead, each by the policy of
                 its time (rollout_lag = k; asynchronous GRPO, grpo_edu.training.lagging)
    Overlapped   Lagged, its newest rollout sampled in a thread while the update runs
                 (rollout_overlap; grpo_edu.training.overlap)

The three give the same rollouts for the same k: bit for bit, only time/* differs.

Each engine draws its own random numbers for a rollout (`engine.seeded`), for all B prompts on
every rank alike, so every rank's RNG stays in step.
"""

from __future__ import annotations

import functools
import time
from dataclasses import replace
from typing import Protocol

import torch

from grpo_edu.runtime.distributed import World
from grpo_edu.sampling.rollout import Rollout, SamplingParams
from grpo_edu.training import dynamic_sampling
from grpo_edu.config import TrainConfig
from grpo_edu.training.episodes import roll_out_episodes
from grpo_edu.training.lagging import InFlight
from grpo_edu.training.overlap import BackgroundSampler
from grpo_edu.runtime.precision import autocast
from grpo_edu.training.scoring import score
from grpo_edu.training.update import policy_logprobs


# --------------------------------------------------------------------------- the stages

def sample_prompts(config: TrainConfig, state, pool: list[dict]) -> list[dict]:
    """The step's B prompts, drawn with state.prompt_rng: the same list on every rank (each
    takes its World.shard)."""
    return [pool[state.prompt_rng.randrange(len(pool))] for _ in range(config.rollout.prompts_per_step)]


@torch.no_grad()
def roll_out(config: TrainConfig, samples: list[dict], tokenizer, engine, world: World = World(),
             share: slice | None = None) -> Rollout:
    """G completions of each of this rank's prompts, with the sampler's log-probs.

    `samples` is the step's whole prompt list; this rank samples `share` of it (default
    world.shard). The engine draws the random numbers for all B x G completions on every
    rank alike (`engine.seeded`), so every rank's RNG stays in step.
    """
    B, G, L = len(samples), config.rollout.num_generations, config.rollout.max_completion_length
    share = world.shard(B) if share is None else share
    mine = samples[share]
    prompts = tokenizer([s["prompt"] for s in mine], return_tensors="pt", padding=True,
                        add_special_tokens=False).to(world.device)
    sampling = SamplingParams(G, L, config.rollout.temperature)
    engine.sync_weights()   # vLLM: the trainer's current weights (fused, hf: the policy itself)
    seeded = engine.seeded(B * G, L, world, turns=config.rollout.max_turns if config.rollout.environment else None)

    def generate(turn: int, prompt_ids, prompt_mask, sampling: SamplingParams, rows) -> Rollout:
        with autocast(config.run.precision, world.device):   # rows: this rank's; seeded takes the step's
            return seeded(turn, prompt_ids, prompt_mask, sampling, torch.as_tensor(rows) + share.start * G)
    if config.rollout.environment:   # multi-turn episodes, one policy turn at a time (grpo_edu.training.episodes)
        return roll_out_episodes(generate, mine, prompts["input_ids"], prompts["attention_mask"], sampling,
                                 tokenizer, config.rollout.environment, config.rollout.max_turns)
    return generate(0, prompts["input_ids"], prompts["attention_mask"], sampling, torch.arange(len(mine) * G))


def draw_rollout(run, engine, world: World) -> tuple[list[dict], Rollout]:
    """Draw and roll out: the next B prompts, and this rank's rollout of its share of them
    (run.roll_out: roll_out, or what the failure lab puts in its place)."""
    samples = sample_prompts(run.config, run.state, run.train_pool)
    return samples, run.roll_out(run.config, samples, run.tokenizer, engine, world)


def sample_rollout(run, engine, models, world: World | None = None) -> InFlight:
    """Every stage for the next rollout: prompts, completions from `engine`, rewards and
    advantages, the refill, and (rollout_lag > 0) its pi_old from `models`, the policy that
    sampled it. world: the run's, or the background sampler's (its collectives in a group of
    their own)."""
    config, world = run.config, run.world if world is None else world
    t0 = time.perf_counter()
    samples, rollout = draw_rollout(run, engine, world)
    t1 = time.perf_counter()
    scoring = functools.partial(score, config, tokenizer=run.tokenizer, reward_functions=run.reward_functions,
                                advantage_fn=run.advantage_fn, world=world)
    batch, plan = scoring(samples, rollout)
    more = 0.0   # the refill's extra rollouts: counted as rollout time
    if config.advantages.dynamic_sampling_rounds:
        batch, plan, more = dynamic_sampling.refill(config, samples, rollout, batch, plan, lambda: draw_rollout(
            run, engine, world), scoring, run.tokenizer.pad_token_id, world)
    if config.off_policy.rollout_lag and config.off_policy.old_logprobs == "recomputed":   # the policy that sampled, now
        batch = replace(batch, old_logp=policy_logprobs(config, models, batch, plan, world))
    return InFlight(samples, batch, plan, sampled_at=run.state.step,
                    seconds={"rollout": t1 - t0 + more, "scoring": time.perf_counter() - t1 - more})


# --------------------------------------------------------------------------- the sources

class RolloutSource(Protocol):
    """Where the loop's rollouts come from. A source holds no reference to the run (the loop
    hands it the run at each call), so a finished run is freed at once, process groups and all."""

    def next(self, run) -> InFlight:
        """The scored rollout the next update trains on."""

    def after_update(self, run) -> None:
        """The update is done (the policy has moved)."""

    def metrics(self, run, flight: InFlight, started: float) -> dict[str, float]:
        """What the step logs about its rollout's source (started: the step's start, perf_counter)."""


class Synchronous:
    """Each update's rollout sampled just before it, by the current policy."""

    def next(self, run) -> InFlight:
        return sample_rollout(run, run.engine, run.models)

    def after_update(self, run) -> None:
        """Nothing is sampled beside the update."""

    def metrics(self, run, flight: InFlight, started: float) -> dict[str, float]:
        return {}


class Lagged(Synchronous):
    """rollout_lag = k: before update t the rollouts of updates t .. t + k are sampled (each by
    the policy of its time), kept in run.state.in_flight, oldest first (a checkpoint stores
    them); update t trains on the oldest. The last k updates sample nothing."""

    def _sample_ahead(self, run, ahead: int) -> None:
        state = run.state
        while len(state.in_flight) <= ahead and state.step + len(state.in_flight) < run.config.optimisation.steps:
            state.in_flight.append(sample_rollout(run, run.engine, run.models))

    def next(self, run) -> InFlight:
        self._sample_ahead(run, run.config.off_policy.rollout_lag)
        return run.state.in_flight.pop(0)

    def metrics(self, run, flight: InFlight, started: float) -> dict[str, float]:
        return {"staleness": float(run.state.step - 1 - flight.sampled_at)}   # updates between sampler and this


class Overlapped(Lagged):
    """rollout_overlap: Lagged, the newest of the k rollouts (the one Lagged would sample next,
    by the same policy) sampled by a BackgroundSampler's thread while the update runs."""

    def __init__(self, background: BackgroundSampler):
        self.background = background

    def next(self, run) -> InFlight:
        state = run.state
        self._sample_ahead(run, run.config.off_policy.rollout_lag - 1)
        flight = state.in_flight.pop(0)
        if state.step + 1 + len(state.in_flight) < run.config.optimisation.steps:
            self.background.start(run.models, lambda engine, models, world: sample_rollout(run, engine, models, world))
        return flight

    def after_update(self, run) -> None:
        if (sampled := self.background.join()) is not None:
            run.state.in_flight.append(sampled)

    def metrics(self, run, flight: InFlight, started: float) -> dict[str, float]:
        # the rollout's time overlapped the update: the step's own wall-clock
        return {**super().metrics(run, flight, started), "time/step": time.perf_counter() - started}


def source(config: TrainConfig, background: BackgroundSampler | None = None) -> RolloutSource:
    """The source the config names: Overlapped with a background sampler (rollout_overlap),
    else Lagged for rollout_lag > 0, else Synchronous."""
    if background is not None:
        return Overlapped(background)
    return Lagged() if config.off_policy.rollout_lag else Synchronous()
