"""A rollout source over a typed Sampler, built and tested without a run: what the stages need is
one dataclass beside the sources, the failure lab's seams are its typed fields, and the lagged
source samples the synchronous one's prompts in the same order, each rollout stamped with the
policy that sampled it."""

import dataclasses
import random
import typing

import torch

from grpo_edu.config import TrainConfig
from grpo_edu.environment import tasks
from grpo_edu.policy.models import STARTING_POLICY, load_policy
from grpo_edu.runtime.distributed import World
from grpo_edu.training import trainer
from grpo_edu.training.asynchronous import Lagged, rollout_source
from grpo_edu.training.placement import build_models, make_engine
from grpo_edu.training.rollouts import RollOut, Sampler, Synchronous, roll_out
from grpo_edu.training.user_functions import AdvantageFn, functions_from_config


def sampler_for(config: TrainConfig) -> Sampler:
    torch.manual_seed(config.run.seed)
    policy, tokenizer = load_policy(STARTING_POLICY)
    models = build_models(config, World(), policy)
    advantage_fn, rewards = functions_from_config(config)
    pool = tasks.make_dataset("arithmetic", n=200, split="train", seed=0)
    return Sampler(config, tokenizer, make_engine(config, models, tokenizer), models, World(), pool,
                   random.Random(config.run.seed), rewards, advantage_fn)


CONFIG = dict(steps=3, prompts_per_step=4, num_generations=4, max_completion_length=8, beta=0.0)


def test_a_synchronous_source_samples_one_scored_rollout_per_update():
    sampler = sampler_for(TrainConfig(**CONFIG))
    source = rollout_source(sampler.config, sampler)
    assert isinstance(source, Synchronous)
    flight = source.next(0)
    B, G = 4, 4
    assert flight.sampled_at == 0 and len(flight.samples) == B
    assert flight.batch.completion_mask.shape[:2] == (B, G) and flight.plan.rewards.shape == (B, G)
    assert source.metrics(flight, 1, started=0.0) == {} and source.records(World()) is None


def test_a_lagged_source_samples_the_same_prompts_ahead_and_says_how_stale_each_is():
    synchronous = Synchronous(sampler_for(TrainConfig(**CONFIG)))
    lagged = Lagged(sampler_for(TrainConfig(**CONFIG, rollout_lag=1)), lag=1, steps=3)
    assert isinstance(rollout_source(lagged.sampler.config, lagged.sampler), Lagged)
    prompts, stale = [], []
    for step in range(3):
        flight = lagged.next(step)
        prompts.append([s["prompt"] for s in flight.samples])
        stale.append(lagged.metrics(flight, step + 1, started=0.0)["staleness"])
        assert len(lagged.in_flight) == (1 if step < 2 else 0)   # the last update samples nothing ahead
    assert stale == [0.0, 1.0, 1.0]
    assert prompts == [[s["prompt"] for s in synchronous.next(step).samples] for step in range(3)]


def test_a_lagged_sources_records_restore_it():
    sampler = sampler_for(TrainConfig(**CONFIG, rollout_lag=2))
    source = Lagged(sampler, lag=2, steps=3)
    source.next(0)
    records = source.records(World())
    assert len(records) == 1 and len(records[0]) == 2   # one rank, two rollouts ahead
    again = Lagged(sampler, lag=2, steps=3)
    again.restore(records, World())
    for mine, theirs in zip(again.in_flight, source.in_flight, strict=True):
        assert mine.sampled_at == theirs.sampled_at and mine.samples == theirs.samples
        assert torch.equal(mine.batch.input_ids, theirs.batch.input_ids)
        assert torch.equal(mine.plan.advantages, theirs.plan.advantages)


def test_the_seams_are_typed_fields_of_the_sampler_not_of_the_run():
    hints = typing.get_type_hints(Sampler)
    assert hints["roll_out"] == RollOut and hints["advantage_fn"] == AdvantageFn
    assert Sampler.__dataclass_fields__["roll_out"].default_factory() is roll_out
    run_fields = {f.name for f in dataclasses.fields(trainer.Run)}
    assert "sampler" in run_fields and not run_fields & {"roll_out", "advantage_fn", "reward_functions", "train_pool"}
    assert "in_flight" not in {f.name for f in dataclasses.fields(trainer.TrainState)}
