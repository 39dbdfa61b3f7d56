"""Steps 3 and 4 of a training step (grpo_edu.training.trainer): score the rollout, turn the rewards
into group advantages, and plan the update's mini-batches (grpo_edu.training.plan).

    score          rewards (B, G) of every completion, gathered from all ranks; the advantages
                   and the Plan from all of them; this rank's RolloutBatch
    reward_terms   this rank's reward terms by name, and their weighted sum
    observe        what the task observes in each completion (its completion_metrics), by name
    gather_rows    this rank's per-completion rows -> (B, G) over every rank's prompts
"""

from __future__ import annotations

import torch

from grpo_edu.config import TrainConfig
from grpo_edu.environment.process import step_rewards
from grpo_edu.environment.registry import TASKS
from grpo_edu.environment.rewards import soft_overlong_punishment
from grpo_edu.runtime.distributed import World
from grpo_edu.sampling.rollout import Rollout
from grpo_edu.training.batch import RolloutBatch
from grpo_edu.training.plan import Plan, plan_mini_batches
from grpo_edu.training.user_functions import AdvantageFn, RewardFn


def reward_terms(config: TrainConfig, texts: list[str], columns: dict, rollout: Rollout,
                 reward_functions: dict[str, tuple[RewardFn, float]]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """This rank's reward terms by name, each (n,) float64, and the reward, their weighted sum.

    The terms: each reward function (with its weight), then those the config adds with weight 1:
    "overlong", DAPO's soft overlong punishment (overlong_cache), and "environment", what a
    multi-turn episode's environment awarded (config.rollout.environment)."""
    n = len(texts)
    terms, reward = {}, torch.zeros(n, dtype=torch.float64)
    for name, (function, weight) in reward_functions.items():
        values = torch.tensor([float(v) for v in function(texts, **columns)], dtype=torch.float64)
        if values.shape != (n,) or not torch.isfinite(values).all():
            raise ValueError(f"reward function {name!r} must return {n} finite floats, got {values.tolist()}")
        terms[name] = values
        reward += weight * values
    added = {}
    if config.loss.overlong_cache:
        added["overlong"] = soft_overlong_punishment(rollout.completion_mask.sum(-1).cpu(),
                                                     config.rollout.max_completion_length, config.loss.overlong_cache)
    if rollout.episode is not None:
        added["environment"] = rollout.episode["env_reward"]
    for name, values in added.items():
        if name in terms:
            raise ValueError(f"reward_functions: the name {name!r} is the reward term the config adds "
                             f"({'overlong_cache' if name == 'overlong' else 'environment'}); rename the function")
        terms[name] = values
        reward += values
    return terms, reward


def observe(config: TrainConfig, texts: list[str], samples: list[dict], G: int) -> dict[str, torch.Tensor]:
    """What the run's task observes in each completion (its registered completion_metrics:
    digitsum's format and checks), {name: (n,) float64}; empty for a task without them."""
    task = TASKS[config.run.task]
    if task.completion_metrics is None:
        return {}
    rows = [sample for sample in samples for _ in range(G)]
    values = task.completion_metrics(texts, rows)
    for name, column in values.items():
        if len(column) != len(texts):
            raise ValueError(f"task {task.name!r}: completion_metrics gave {len(column)} values of {name!r} for "
                             f"{len(texts)} completions")
    return {name: torch.tensor(column, dtype=torch.float64) for name, column in values.items()}


def gather_rows(rows: dict, b: int, G: int, world: World) -> dict:
    """{name: (b * G,) tensor} of this rank -> {name: (B, G) float64} over every rank's prompts
    (one gather for all of them)."""
    stacked = torch.stack([value.to(torch.float64) for value in rows.values()])      # (rows, b * G)
    gathered = world.gather(stacked.view(-1, b, G).transpose(0, 1)).transpose(0, 1)  # (rows, B, G)
    return dict(zip(rows, gathered))


@torch.no_grad()
def score(config: TrainConfig, samples: list[dict], rollout: Rollout, tokenizer,
          reward_functions: dict[str, tuple[RewardFn, float]], advantage_fn: AdvantageFn,
          world: World = World()) -> tuple[RolloutBatch, Plan]:
    """Steps 3 and 4: this rank's rewards, gathered to all B prompts; advantages and the
    mini-batch plan from all of them; this rank's RolloutBatch (without reference or pi_old
    log-probs: add_logprobs). `samples` is the step's whole prompt list."""
    B, G = len(samples), config.rollout.num_generations
    owned = world.shard(B)
    mine = samples[owned]
    b = len(mine)
    # Each completion is scored with its prompt's dataset columns (TRL's convention).
    texts = tokenizer.batch_decode(rollout.completion_ids, skip_special_tokens=True)
    columns = {key: [s.get(key) for s in mine for _ in range(G)] for key in mine[0] if key != "prompt"}
    terms, reward = reward_terms(config, texts, columns, rollout, reward_functions)
    # Steps a rule checks (task "chain"): counted for the log; with supervision = "process", every token's
    # advantage from the rewards of the steps (grpo_edu.environment.process), computed here: a group is whole on its rank.
    token_advantages, process = step_rewards(config, texts, columns, tokenizer, rollout, reward)
    observed = observe(config, texts, mine, G)
    episode = {k: v for k, v in (rollout.episode or {}).items() if k != "env_reward"}   # gathered for the log
    # Every rank's rows gathered to all B prompts at once, each by name: (b * G,) -> (B, G).
    gathered = gather_rows({"reward": reward, **{("term", k): v for k, v in terms.items()},
                            **{("episode", k): v for k, v in episode.items()},
                            **{("process", k): v for k, v in process.items()},
                            **{("observed", k): v for k, v in observed.items()},
                            "length": rollout.completion_mask.sum(-1).cpu().double(),   # the policy's tokens
                            "finished": rollout.finished.cpu().double()}, b, G, world)
    reward_matrix = gathered["reward"]
    gathered_process = {name: gathered["process", name] for name in process}
    # Process supervision: the plan keeps each completion's first-token advantage (the sum of its steps').
    advantages = gathered_process.pop("advantage") if token_advantages is not None else advantage_fn(reward_matrix)
    if not isinstance(advantages, torch.Tensor) or advantages.shape != (B, G):
        raise ValueError(f"advantage_fn must map rewards (B, G) = ({B}, {G}) to a tensor of the same "
                         f"shape, got {getattr(advantages, 'shape', type(advantages))}")
    if not torch.isfinite(advantages).all():
        raise ValueError(f"advantage_fn returned non-finite advantages for rewards {reward_matrix.tolist()}")
    advantages = advantages.to(torch.float32)
    plan = Plan(rewards=reward_matrix, components={name: gathered["term", name] for name in terms},
                advantages=advantages, lengths=gathered["length"].long(), finished=gathered["finished"].bool(),
                mini_batches=plan_mini_batches(config, reward_matrix), owned=owned, group_size=G,
                episode={name: gathered["episode", name] for name in episode}, process=gathered_process,
                observed={name: gathered["observed", name] for name in observed})

    P, S = rollout.prompt_ids.shape[1], rollout.completion_ids.shape[1]
    sampled_on = rollout.completion_ids.device
    # attended: every token the completion columns hold (an episode's: the environment's too)
    written = rollout.completion_mask if rollout.env_mask is None else rollout.completion_mask | rollout.env_mask
    batch = RolloutBatch(
        input_ids=torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1).view(b, G, P + S),
        attention_mask=torch.cat([rollout.prompt_mask, written.long()], dim=1).view(b, G, P + S),
        completion_mask=rollout.completion_mask.view(b, G, S), old_logp=None,
        rewards=reward_matrix[owned].to(sampled_on),
        advantages=(advantages[owned] if token_advantages is None else token_advantages.float()).to(sampled_on),
        sampler_logp=rollout.sampler_logp.view(b, G, S),
        env_mask=None if rollout.env_mask is None else rollout.env_mask.view(b, G, S),
        truncated=(~rollout.finished).cpu().view(b, G) if config.loss.mask_truncated_completions else None)
    # The step's data lives where the policy does (the sampler may be elsewhere: another
    # device, another process); the plan's bookkeeping stays on the CPU.
    return batch.to(world.device), plan
