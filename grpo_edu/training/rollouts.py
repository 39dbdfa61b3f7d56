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

A `Sampler` holds what the stages need (the config, the tokenizer, the engine, the problems,
the prompt RNG, the reward and advantage functions, and the roll-out stage itself: the failure
lab's seams are its typed fields), and `Sampler.sample(step)` runs them for the next rollout. A
source decides when: the loop asks it for the rollout of each update (`next(step)`) and tells it
when the update is done (`after_update()`).

    Synchronous  samples each update's rollout just before the update (rollout_lag = 0)
    Lagged       keeps the rollouts of the next k updates sampled ahead, each by the policy of
    Overlapped   its time, the newest in a thread beside the update (grpo_edu.training.asynchronous)

The three give the same rollouts for the same k: bit for bit, only time/* differs. A sampler,
and a source over it, can be built without a run (tests/test_trainer.py builds one).

Each engine draws its own random numbers for a rollout (`engine.seeded`), for all B prompts on
every rank alike, so every rank's RNG stays in step.
"""

from __future__ import annotations

import functools
import random
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Protocol

import torch

from grpo_edu.config import TrainConfig
from grpo_edu.runtime.distributed import World
from grpo_edu.runtime.precision import autocast
from grpo_edu.sampling.rollout import Rollout, RolloutEngine, SamplingParams
from grpo_edu.training import dynamic_sampling
from grpo_edu.training.batch import RolloutBatch
from grpo_edu.training.episodes import roll_out_episodes
from grpo_edu.training.placement import Models
from grpo_edu.training.plan import Plan
from grpo_edu.training.scoring import score
from grpo_edu.training.update import policy_logprobs
from grpo_edu.training.user_functions import AdvantageFn, RewardFn


@dataclass
class InFlight:
    """A scored rollout, ready for the update that trains on it (with rollout_lag: sampled ahead)."""

    samples: list[dict]            # the step's B prompts (every rank's list)
    batch: RolloutBatch            # this rank's batch; old_logp set when sampled ahead (rollout_lag > 0)
    plan: Plan
    sampled_at: int                # the update (0-based) it was sampled before: the policy that sampled it
    seconds: dict[str, float]      # the time its rollout and its scoring took


# --------------------------------------------------------------------------- the stages

def sample_prompts(prompts_per_step: int, prompt_rng: random.Random, pool: list[dict]) -> list[dict]:
    """The step's B prompts, drawn with prompt_rng: the same list on every rank (each takes its
    World.shard)."""
    return [pool[prompt_rng.randrange(len(pool))] for _ in range(prompts_per_step)]


@torch.no_grad()
def roll_out(config: TrainConfig, samples: list[dict], tokenizer, engine, world: World = World(),
             share: slice | None = None) -> Rollout:
    """G completions of each of this rank's prompts, with the sampler's log-probs.

    `samples` is the step's whole prompt list; this rank samples `share` of it (default
    world.shard). The engine draws the random numbers for all B x G completions on every
    rank alike (`engine.seeded`), so every rank's RNG stays in step.
    """
    rollout = config.rollout
    B, G, L = len(samples), rollout.num_generations, rollout.max_completion_length
    share = world.shard(B) if share is None else share
    mine = samples[share]
    prompts = tokenizer([s["prompt"] for s in mine], return_tensors="pt", padding=True,
                        add_special_tokens=False).to(world.device)
    sampling = SamplingParams(G, L, rollout.temperature)
    engine.sync_weights()   # vLLM: the trainer's current weights (fused, hf: the policy itself)
    seeded = engine.seeded(B * G, L, world, turns=rollout.max_turns if rollout.environment else None)

    def generate(turn: int, prompt_ids, prompt_mask, sampling: SamplingParams, rows) -> Rollout:
        with autocast(config.run.precision, world.device):   # rows: this rank's; seeded takes the step's
            return seeded(turn, prompt_ids, prompt_mask, sampling, torch.as_tensor(rows) + share.start * G)
    if rollout.environment:   # multi-turn episodes, one policy turn at a time (grpo_edu.training.episodes)
        return roll_out_episodes(generate, mine, prompts["input_ids"], prompts["attention_mask"], sampling,
                                 tokenizer, rollout.environment, rollout.max_turns)
    return generate(0, prompts["input_ids"], prompts["attention_mask"], sampling, torch.arange(len(mine) * G))


# roll_out's signature: the stage the failure lab may wrap (grpo_edu.lab.faults)
RollOut = Callable[..., Rollout]


@dataclass
class Sampler:
    """What the stages need to sample and score a rollout, and the stages themselves.

    roll_out and advantage_fn are the run's seams: the failure lab replaces them (grpo_edu.lab.faults).
    `models` computes pi_old under rollout_lag (the policy that sampled, at the time it sampled)."""

    config: TrainConfig
    tokenizer: object
    engine: RolloutEngine
    models: Models
    world: World
    train_pool: list[dict]
    prompt_rng: random.Random
    reward_functions: dict[str, tuple[RewardFn, float]]
    advantage_fn: AdvantageFn
    roll_out: RollOut = field(default_factory=lambda: roll_out)   # the module's, when the sampler is made

    def draw(self, engine: RolloutEngine, world: World) -> tuple[list[dict], Rollout]:
        """Draw and roll out: the next B prompts, and this rank's rollout of its share of them."""
        samples = sample_prompts(self.config.rollout.prompts_per_step, self.prompt_rng, self.train_pool)
        return samples, self.roll_out(self.config, samples, self.tokenizer, engine, world)

    def sample(self, step: int, engine: RolloutEngine | None = None, models: Models | None = None,
               world: World | None = None) -> InFlight:
        """Every stage for the rollout of update `step` (0-based): prompts, completions from
        `engine`, rewards and advantages, the refill, and (rollout_lag > 0) its pi_old from
        `models`, the policy that sampled it. engine, models, world: the sampler's own, or a
        background sampler's (its copy of the weights, its collectives in a group of their own)."""
        config = self.config
        engine = self.engine if engine is None else engine
        models = self.models if models is None else models
        world = self.world if world is None else world
        t0 = time.perf_counter()
        samples, rollout = self.draw(engine, world)
        t1 = time.perf_counter()
        scoring = functools.partial(score, config, tokenizer=self.tokenizer, reward_functions=self.reward_functions,
                                    advantage_fn=self.advantage_fn, world=world)
        batch, plan = scoring(samples, rollout)
        more = 0.0   # the refill's extra rollouts: counted as rollout time
        if config.advantages.dynamic_sampling_rounds:
            batch, plan, more = dynamic_sampling.refill(config, samples, rollout, batch, plan,
                                                        lambda: self.draw(engine, world), scoring,
                                                        self.tokenizer.pad_token_id, world)
        off_policy = config.off_policy
        if off_policy.rollout_lag and off_policy.old_logprobs == "recomputed":   # the policy that sampled, now
            batch = replace(batch, old_logp=policy_logprobs(config, models, batch, plan, world))
        return InFlight(samples, batch, plan, sampled_at=step,
                        seconds={"rollout": t1 - t0 + more, "scoring": time.perf_counter() - t1 - more})


# --------------------------------------------------------------------------- the sources

class RolloutSource(Protocol):
    """Where the loop's rollouts come from: a source over a Sampler."""

    def next(self, step: int) -> InFlight:
        """The scored rollout update `step` (0-based) trains on."""

    def after_update(self) -> None:
        """The update is done (the policy has moved)."""

    def metrics(self, flight: InFlight, step: int, started: float) -> dict[str, float]:
        """What update `step` (1-based, done) logs about its rollout's source (started: the step's
        start, perf_counter)."""

    def records(self, world: World) -> list | None:
        """What a checkpoint keeps of the source (the rollouts sampled ahead, every rank's), or None."""

    def restore(self, records: list | None, world: World) -> None:
        """The source as a checkpoint's records left it."""


class Synchronous:
    """Each update's rollout sampled just before it, by the current policy."""

    def __init__(self, sampler: Sampler):
        self.sampler = sampler

    def next(self, step: int) -> InFlight:
        return self.sampler.sample(step)

    def after_update(self) -> None:
        """Nothing is sampled beside the update."""

    def metrics(self, flight: InFlight, step: int, started: float) -> dict[str, float]:
        return {}

    def records(self, world: World) -> list | None:
        return None

    def restore(self, records: list | None, world: World) -> None:
        """Nothing sampled ahead to restore."""
