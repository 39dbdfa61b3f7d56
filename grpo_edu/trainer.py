"""The GRPO training loop, as plain code that reads top to bottom.

One step, on each of N ranks (one process: N = 1; see grpo_edu.distributed):

    1. draw the step's B prompts (every rank the same list) and take this    sample_prompts
       rank's B / N of them, whole
    2. roll out G completions each, with the sampler's log-probs             roll_out
    3. score every completion; gather the rewards (B, G) from all ranks      score
    4. group-relative advantages and the mini-batch plan, from all B         Plan
       prompts (the same on every rank); this rank's RolloutBatch
    5. log-probs of the frozen reference (for the KL term) and, when the     add_logprobs
       rollout feeds more than one optimizer step, of pi_old
    6. num_iterations passes over the rollout, in num_mini_batches           optimise
       mini-batches, each an optimizer step: micro-batch forward/backward
       with gradient accumulation (and, across ranks, DDP's or FSDP2's
       gradient reduction), global grad-norm clip, AdamW, LR schedule
    7. log metrics; evaluate, re-sync the reference, checkpoint when due    (rank 0 writes)

The step's data is one `grpo_edu.batch.RolloutBatch` per rank (B / N prompts,
(B / N, G, S)): the type chapters 3 and 4 teach. Its mini-batches are `select`s
of whole groups; its micro-batches are rows of `flat()`. The loss of every part
is computed with the whole mini-batch's counts (`LossTotals`), so the parts,
over micro-batches and ranks, add up to the 1-process loss exactly.

A training step (`steps`, `warmup_steps`, `eval_every`, `checkpoint_every` and
`ref_sync_steps` count them) is one rollout, and gives exactly
K = num_iterations x num_mini_batches optimizer steps; the learning-rate
schedule runs over all steps x K of them.

pi_old, the policy the clipped ratio compares with, is the policy that sampled,
fixed for the whole rollout. With config.old_logprobs = "recomputed" (default)
it is the trainer's own forward before the rollout's first update, computed
only when K > 1: for K = 1 the one update's own detached log-probs are that same
forward (ratio 1, no extra pass). With "sampler" it is the rollout engine's
log-probs, for every K.

Metrics the loop adds to grpo_loss's (see step_metrics and optimise): the loss
metrics are the step's last optimizer step's, reduced over micro-batches and
ranks (sums, token- or completion-weighted means, min of minima, max of maxima);
`learning_rate` is the one its first optimizer step used; `optimizer_steps` how
many were taken (K, less one per empty mini-batch); `sampler_gap/mean_abs` and
`sampler_gap/max_ratio` compare the trainer's log-probs before the update with
the sampler's, on the rows trained on (groups dropped by filter_zero_std_groups
are not included).

The pieces are arguments: `train(config, advantage_fn=my_advantages)` trains
with a reader's own advantage function, `reward_functions=` with their rewards.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import math
import random
import re
import statistics
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import torch

from grpo_edu import checkpoint, distributed, fused_llama, rewards, tasks, user_functions
from grpo_edu.advantages import group_advantages, zero_std_groups
from grpo_edu.batch import RolloutBatch
from grpo_edu.config import TrainConfig
from grpo_edu.diagnose import LiveDoctor, diagnose
from grpo_edu.distributed import World
from grpo_edu.evaluation import greedy_scores, sampled_metrics, sampled_scores, wilson_interval
from grpo_edu.faults import NONE as NO_FAULTS, Faults
from grpo_edu.logprobs import completion_logprobs
from grpo_edu.loss import grpo_loss
from grpo_edu.models import STARTING_POLICY, load_policy
from grpo_edu.rollout import HFEngine, Rollout, SamplingParams
from grpo_edu.runlog import MetricsLog

TRAIN_POOL = 10_000  # distinct training problems the prompts are drawn from (with replacement)
# A step's wall-clock, in three parts: sampling; rewards, advantages, reference and pi_old log-probs; the update.
TIME_SPLIT = ("rollout", "scoring", "update")

AdvantageFn = Callable[[torch.Tensor], torch.Tensor]          # rewards (B, G) -> advantages (B, G)
RewardFn = Callable[..., Sequence[float]]                      # TRL's signature


@dataclass
class TrainState:
    step: int = 0
    prompt_rng: random.Random = field(default_factory=random.Random)


# --------------------------------------------------------------------------- set-up

def reward_functions_from_config(weights: dict[str, float], unboxed_answers: bool = False
                                 ) -> dict[str, tuple[RewardFn, float]]:
    """{name: weight} -> {name: (function, weight)}: grpo_edu.rewards' functions by name, and
    the reader's own by import path ("module:function", grpo_edu.user_functions).
    unboxed_answers: the accuracy reward also reads "The answer is 18." (config key)."""
    known = dict(rewards.REWARD_FUNCTIONS)
    if unboxed_answers:
        known["accuracy"] = functools.partial(rewards.accuracy_reward, unboxed=True)
    unknown = sorted(name for name in weights if name not in known and not user_functions.is_import_path(name))
    if unknown:
        raise ValueError(f"config key 'rewards' names unknown reward functions {unknown}; known: {sorted(known)}, "
                         f"or 'module:function' for your own")
    return {name: (known[name] if name in known else user_functions.resolve(name, "rewards"), float(weight))
            for name, weight in weights.items()}


def functions_from_config(config: TrainConfig) -> tuple[AdvantageFn, dict[str, tuple[RewardFn, float]]]:
    """The run's advantage and reward functions, as the config names them, each checked on a
    probe batch (a one-line error naming a function that fails)."""
    if config.advantage_fn:
        advantage_fn = user_functions.resolve(config.advantage_fn, "advantage_fn")
        user_functions.check_advantage_fn(advantage_fn, config.advantage_fn, config.prompts_per_step,
                                          config.num_generations)
    else:
        advantage_fn = lambda r: group_advantages(r, scale=config.advantage_scale, std=config.advantage_std)
    reward_functions = reward_functions_from_config(config.rewards, config.unboxed_answers)
    samples = (tasks.make_dataset(config.task, n=3, split="train", seed=0) if config.task != "gsm8k" else
               [tasks.gsm8k_sample("How many legs do 3 cats have?", "3 * 4 = 12\n#### 12")])
    for name, (function, _) in reward_functions.items():
        if user_functions.is_import_path(name):
            user_functions.check_reward_fn(function, name, samples)
    return advantage_fn, reward_functions


def task_pools(config: TrainConfig, tokenizer) -> tuple[list[dict], list[dict]]:
    """The problems prompts are drawn from, and the held-out problems (the first eval_size of
    the test split), with their prompts as the policy reads them (config.chat_template)."""
    if config.task == "gsm8k":
        train_pool = tasks.load_gsm8k("train", config.dataset)
        held_out = tasks.load_gsm8k("test", config.dataset)[:config.eval_size]
    else:
        train_pool = tasks.make_dataset(config.task, n=TRAIN_POOL, split="train", seed=0)
        held_out = tasks.make_dataset(config.task, n=config.eval_size, split="test", seed=0)
    if config.chat_template:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("config key 'chat_template' is true, but the tokenizer has no chat template "
                             "(not an instruct model?); set chat_template = false")

        def as_chat(sample: dict) -> dict:
            text = tokenizer.apply_chat_template([{"role": "user", "content": sample["prompt"]}],
                                                 add_generation_prompt=True, tokenize=False)
            return {**sample, "prompt": text}
        train_pool, held_out = [as_chat(s) for s in train_pool], [as_chat(s) for s in held_out]
    return train_pool, held_out


def make_reference(policy: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of the policy: separate tensors, no gradients, eval mode."""
    reference = copy.deepcopy(policy).eval()
    reference.requires_grad_(False)
    check_not_aliased(policy, reference)
    return reference


def check_not_aliased(policy: torch.nn.Module, reference: torch.nn.Module) -> None:
    """The reference must not share storage with the policy (its KL would stay 0)."""
    if reference is policy:
        raise ValueError("reference model is the policy object itself; pass a separate copy "
                         "(grpo_edu.trainer.make_reference(policy))")
    policy_storage = {p.untyped_storage().data_ptr() for p in policy.parameters()}
    for name, parameter in reference.named_parameters():
        if parameter.untyped_storage().data_ptr() in policy_storage:
            raise ValueError(f"reference parameter {name!r} shares memory with the policy; "
                             f"pass a separate copy (grpo_edu.trainer.make_reference(policy))")


def optimizer_steps_per_rollout(config: TrainConfig) -> int:
    """K: each training step (one rollout) gives this many optimizer steps."""
    return config.num_iterations * config.num_mini_batches


def learning_rate_factor(config: TrainConfig) -> Callable[[int], float]:
    """The multiplier of the peak learning rate at optimizer step `step` (0-based).

    The schedule spans the run: config.steps x K optimizer steps, the first
    config.warmup_steps x K of them warming up linearly (training steps count
    rollouts; K = optimizer_steps_per_rollout).
    """
    K = optimizer_steps_per_rollout(config)
    total, warmup = config.steps * K, config.warmup_steps * K

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        if config.lr_schedule == "linear":
            return max(0.0, 1.0 - progress)
        if config.lr_schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return 1.0
    return factor


def compute_dtype(config: TrainConfig, device: torch.device) -> torch.dtype:
    """The forward passes' precision: config.precision, "auto" being bf16 on CUDA, float32 on
    the CPU. Master weights and AdamW's state stay float32 either way (see config.precision)."""
    if config.precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return torch.bfloat16 if config.precision == "bf16" else torch.float32


def autocast(config: TrainConfig, device: torch.device):
    """bf16 autocast for the forward passes when compute_dtype says so, else nothing."""
    if compute_dtype(config, device) == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def check_engine_settings(config: TrainConfig, device: torch.device) -> None:
    """The fused path is the CPU tier's float32 fast path: refused by name elsewhere."""
    if config.engine != "fused":
        return
    if device.type != "cpu":
        raise ValueError(f"config key 'engine' is 'fused', but the fused forward and sampler are the CPU "
                         f"tier's fast path and run on the CPU only (device is {device}); set "
                         f"engine = 'hf' (transformers' forward and generate) or 'vllm' on {device.type}")
    if compute_dtype(config, device) != torch.float32:
        raise ValueError("config key 'engine' is 'fused' with precision = 'bf16': the fused path computes "
                         "in float32 only; set engine = 'hf' or 'vllm' for bf16 autocast")


def make_engine(config: TrainConfig, models: "Models", tokenizer, world: World = World()):
    """The rollout engine config.engine names. fused and hf sample with the trainer's whole-weight
    policy itself; vllm holds its own copy, loaded from the trained (maybe sharded) policy
    before every rollout (grpo_edu.vllm_engine)."""
    if config.engine == "fused":
        return fused_llama.FusedEngine(models.full_policy, tokenizer)
    if config.engine == "hf":
        return HFEngine(models.full_policy, tokenizer)
    from grpo_edu import vllm_engine
    if config.vllm_mode == "server":
        return vllm_engine.VLLMServerEngine(config.vllm_server_url, models.policy, tokenizer, world)
    dtype = "bfloat16" if compute_dtype(config, world.device) == torch.bfloat16 else "float32"
    with models.whole() as whole:
        path = vllm_engine.sampler_model_path(whole, tokenizer, config.output_dir, world)
    return vllm_engine.VLLMEngine(path, models.policy, tokenizer, world, seed=config.seed, dtype=dtype,
                                  gpu_memory_utilization=config.vllm_gpu_memory_utilization,
                                  sleep_mode=config.vllm_sleep_mode)


def sequence_logprobs(config: TrainConfig, model, input_ids, attention_mask, completion_mask):
    """log pi(token) of the completion tokens of prompt-major rows: (n, P + S) -> (n, S).

    The fused forward computes each prompt once for its G completions when the rows
    hold whole groups (every micro-batch does when micro_batch_size is a multiple of G).
    """
    if config.engine != "fused":
        return completion_logprobs(model, input_ids, attention_mask, completion_mask,
                                   temperature=config.temperature)
    G = config.num_generations
    group = G if config.micro_batch_size % G == 0 and input_ids.shape[0] % G == 0 else 1
    return fused_llama.completion_logprobs(model, input_ids, attention_mask, completion_mask,
                                           temperature=config.temperature, group_size=group)


@dataclass
class Models:
    """What a rank trains with. `policy` holds the trained parameters (under FSDP2 its
    shards); `train_logprobs` / `reference_logprobs` are the (wrapped) log-prob modules the
    loss calls; `full_policy` holds whole weights for sampling and evaluation (the policy
    itself, except under FSDP2: a plain copy synced after every update). With a vLLM engine
    under FSDP2 nothing samples from it, so it is `lazy`: on the meta device (no memory)
    except inside `whole()`, which materialises it from the shards for an evaluation."""

    policy: torch.nn.Module
    reference: torch.nn.Module | None
    full_policy: torch.nn.Module
    train_logprobs: torch.nn.Module
    reference_logprobs: torch.nn.Module | None
    lazy: bool = False

    @property
    def sharded(self) -> bool:
        return self.full_policy is not self.policy

    @contextlib.contextmanager
    def whole(self, keep: bool = False):
        """The policy with whole, current weights. Lazy: gathered from the shards into the
        copy (a collective: every rank enters), released again on leaving unless `keep`."""
        if not self.lazy:
            yield self.full_policy
            return
        device = next(self.policy.parameters()).device
        self.full_policy.to_empty(device=device)
        if hasattr(self.full_policy, "tie_weights"):   # tied embeddings share one tensor again
            self.full_policy.tie_weights()
        distributed.copy_full_weights(self.policy, self.full_policy)
        with torch.no_grad():   # buffers (the rotary tables) are not sharded: copied as they are
            buffers = dict(self.full_policy.named_buffers())
            for name, buffer in self.policy.named_buffers():
                buffers[name].copy_(buffer)
        try:
            yield self.full_policy
        finally:
            if not keep:
                self.full_policy.to("meta")


def build_models(config: TrainConfig, world: World, policy: torch.nn.Module,
                 reference: torch.nn.Module | None = None, *, allow_alias: bool = False) -> Models:
    """Place the policy and the reference (beta > 0; default a copy of the policy) on the
    world's device and wrap them for `config.parallelism`. A reference that shares storage
    with the policy is refused (its KL would stay 0), unless `allow_alias` (the failure lab's
    injected fault, grpo_edu.faults)."""
    policy.to(world.device)
    if config.beta == 0.0:
        reference = None
    elif reference is None:
        reference = make_reference(policy)
    else:
        if not allow_alias:
            check_not_aliased(policy, reference)
        reference.to(world.device)
    policy.train()
    sharded = world.distributed and config.parallelism == "fsdp2"
    lazy = sharded and config.engine == "vllm"   # vLLM samples from its own copy: this one only evaluates
    if lazy:
        with torch.device("meta"):
            full_policy = type(policy)(policy.config).eval().requires_grad_(False)
        full_policy.generation_config = policy.generation_config
    else:
        full_policy = make_reference(policy) if sharded else policy   # a plain copy, never trained

    def logprob_fn(model, input_ids, attention_mask, completion_mask):
        with autocast(config, world.device):
            return sequence_logprobs(config, model, input_ids, attention_mask, completion_mask)
    per_layer = config.engine != "fused"   # the fused path runs no layer's own forward
    train_logprobs = distributed.wrap(policy, logprob_fn, world, config.parallelism, trainable=True,
                                      per_layer=per_layer)
    reference_logprobs = None if reference is None else distributed.wrap(
        reference, logprob_fn, world, config.parallelism, trainable=False, per_layer=per_layer)
    return Models(policy, reference, full_policy, train_logprobs, reference_logprobs, lazy=lazy)


# --------------------------------------------------------------------------- steps 1-2

def sample_prompts(config: TrainConfig, state: TrainState, pool: list[dict]) -> list[dict]:
    """The step's B prompts: the same list on every rank (each takes its World.shard)."""
    return [pool[state.prompt_rng.randrange(len(pool))] for _ in range(config.prompts_per_step)]


@torch.no_grad()
def roll_out(config: TrainConfig, samples: list[dict], tokenizer, engine, world: World = World(),
             share: slice | None = None) -> Rollout:
    """Step 2: G completions of each of this rank's prompts, with the sampler's log-probs.

    `samples` is the step's whole prompt list; this rank samples `share` of it (default
    world.shard). The random numbers are drawn for all B prompts on every rank alike, so
    every rank's RNG stays in step: the fused engine takes its rows of one uniforms table
    (the rollout does not depend on the number of ranks); vLLM seeds completion i of the
    batch with one number drawn for the batch plus i (nor does it, up to vLLM's kernels);
    transformers' generate draws its own, seeded from that number plus the rank (each
    rank's samples are reproducible, but depend on how the prompts are split).
    """
    B, G, L = len(samples), config.num_generations, config.max_completion_length
    share = world.shard(B) if share is None else share
    mine = samples[share]
    prompts = tokenizer([s["prompt"] for s in mine], return_tensors="pt", padding=True,
                        add_special_tokens=False).to(world.device)
    sampling = SamplingParams(G, L, config.temperature)
    engine.sync_weights()   # vLLM: the trainer's current weights (fused, hf: the policy itself)
    with autocast(config, world.device):
        if isinstance(engine, fused_llama.FusedEngine):
            uniforms = torch.rand(B * G, L)[share.start * G:share.stop * G].to(world.device)
            return engine.generate(prompts["input_ids"], prompts["attention_mask"], sampling, uniforms=uniforms)
        seed = int(torch.randint(0, 2**62, (1,)))
        if not isinstance(engine, HFEngine):   # vLLM: completion i of the batch samples with seed + i
            seeds = [seed + (share.start + b) * G for b in range(len(mine))]
            return engine.generate(prompts["input_ids"], prompts["attention_mask"], sampling, seeds=seeds)
        devices = [world.device] if world.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed + world.rank)
            return engine.generate(prompts["input_ids"], prompts["attention_mask"], sampling)


# --------------------------------------------------------------------------- steps 3-5

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

    def local_groups(self, k: int) -> torch.Tensor:
        """(B / N,) bool: which of this rank's prompts mini-batch k holds."""
        keep = torch.zeros(self.owned.stop - self.owned.start, dtype=torch.bool)
        chosen = self.mini_batches[k]
        mine = chosen[(chosen >= self.owned.start) & (chosen < self.owned.stop)] - self.owned.start
        keep[mine] = True
        return keep

    def rows_on_rank(self, k: int, rank: int) -> int:
        """Completions of mini-batch k that rank `rank` holds (any rank's, known to all)."""
        width = self.owned.stop - self.owned.start
        chosen = self.mini_batches[k]
        return int(((chosen >= rank * width) & (chosen < (rank + 1) * width)).sum()) * self.group_size

    def totals(self, config: TrainConfig, k: int) -> LossTotals:
        chosen = self.mini_batches[k]
        if config.loss_type == "dapo":
            # dapo, as TRL 1.16: every token of the rollout weighs the same in every optimizer step,
            # 1 / (rollout tokens / num_mini_batches), whichever mini-batch holds it. TRL divides by
            # num_items_in_batch (the generation batch's tokens) x gradient_accumulation_steps /
            # steps_per_generation, i.e. by the tokens per optimizer step; not by the mini-batch's own
            # count, which would weigh the tokens of a short mini-batch more. Filtered groups do not
            # count: they are not trained on.
            trained = torch.cat(self.mini_batches)
            items = int(self.lengths[trained].sum()) / config.num_mini_batches
        else:
            items = float(self.lengths[chosen].sum())
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
    if config.filter_zero_std_groups:   # dynamic sampling: groups that agree teach nothing
        groups = groups[~zero_std_groups(rewards)]
    return [groups[k::config.num_mini_batches] for k in range(config.num_mini_batches)]


@torch.no_grad()
def score(config: TrainConfig, samples: list[dict], rollout: Rollout, tokenizer,
          reward_functions: dict[str, tuple[RewardFn, float]], advantage_fn: AdvantageFn,
          world: World = World()) -> tuple[RolloutBatch, Plan]:
    """Steps 3 and 4: this rank's rewards, gathered to all B prompts; advantages and the
    mini-batch plan from all of them; this rank's RolloutBatch (without reference or pi_old
    log-probs: add_logprobs). `samples` is the step's whole prompt list."""
    B, G = len(samples), config.num_generations
    owned = world.shard(B)
    mine = samples[owned]
    b = len(mine)
    # Each completion is scored with its prompt's dataset columns (TRL's convention).
    texts = tokenizer.batch_decode(rollout.completion_ids, skip_special_tokens=True)
    columns = {key: [s.get(key) for s in mine for _ in range(G)] for key in mine[0] if key != "prompt"}
    local = torch.zeros(1 + len(reward_functions), b * G, dtype=torch.float64)
    for i, (name, (function, weight)) in enumerate(reward_functions.items(), 1):
        values = torch.tensor([float(v) for v in function(texts, **columns)], dtype=torch.float64)
        if values.shape != (b * G,) or not torch.isfinite(values).all():
            raise ValueError(f"reward function {name!r} must return {b * G} finite floats, got {values.tolist()}")
        local[i] = values
        local[0] += weight * values
    lengths = rollout.completion_mask.sum(-1).cpu()
    per_completion = torch.cat([local, lengths[None].double(), rollout.finished.cpu()[None].double()])
    gathered = world.gather(per_completion.view(-1, b, G).transpose(0, 1)).transpose(0, 1)  # (rows, B, G)
    reward_matrix = gathered[0]
    advantages = advantage_fn(reward_matrix)
    if not isinstance(advantages, torch.Tensor) or advantages.shape != (B, G):
        raise ValueError(f"advantage_fn must map rewards (B, G) = ({B}, {G}) to a tensor of the same "
                         f"shape, got {getattr(advantages, 'shape', type(advantages))}")
    if not torch.isfinite(advantages).all():
        raise ValueError(f"advantage_fn returned non-finite advantages for rewards {reward_matrix.tolist()}")
    advantages = advantages.to(torch.float32)
    plan = Plan(rewards=reward_matrix, components={name: gathered[i] for i, name in enumerate(reward_functions, 1)},
                advantages=advantages, lengths=gathered[-2].long(), finished=gathered[-1].bool(),
                mini_batches=plan_mini_batches(config, reward_matrix), owned=owned, group_size=G)

    P, S = rollout.prompt_ids.shape[1], rollout.completion_ids.shape[1]
    sampled_on = rollout.completion_ids.device
    batch = RolloutBatch(
        input_ids=torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1).view(b, G, P + S),
        attention_mask=torch.cat([rollout.prompt_mask, rollout.completion_mask.long()], dim=1).view(b, G, P + S),
        completion_mask=rollout.completion_mask.view(b, G, S), old_logp=None,
        rewards=reward_matrix[owned].to(sampled_on), advantages=advantages[owned].to(sampled_on),
        sampler_logp=rollout.sampler_logp.view(b, G, S))
    # The step's data lives where the policy does (the sampler may be elsewhere: another
    # device, another process); the plan's bookkeeping stays on the CPU.
    return batch.to(world.device), plan


def micro_batches(config: TrainConfig, plan: Plan, batch: RolloutBatch, k: int, world: World) -> list[dict | None]:
    """Mini-batch k's micro-batches on this rank, as rows of `flat()` (dicts of (n, ...)
    tensors, with "groups": the (b,) keep mask), padded with None to the count of the rank
    that has the most: every rank runs as many forwards (FSDP2 gathers parameters in each)
    and backwards, so the collectives line up."""
    keep = plan.local_groups(k)
    parts: list[dict | None] = []
    if keep.any():
        flat = batch.select(keep).flat()
        n = int(keep.sum()) * batch.group_size
        for start in range(0, n, config.micro_batch_size):
            rows = slice(start, start + config.micro_batch_size)
            parts.append({name: None if value is None else value[rows] for name, value in flat.items()})
    most = max(-(-plan.rows_on_rank(k, r) // config.micro_batch_size) for r in range(world.size))
    return parts + [None] * (most - len(parts))


def _padding_forward(model, batch: RolloutBatch) -> torch.Tensor:
    """A forward of one row, for a rank's padding micro-batch: it takes part in the ranks'
    collectives (FSDP2's gathers; in a backward, the gradient reduction) and adds nothing."""
    flat = batch.flat()
    return model(flat["input_ids"][:1], flat["attention_mask"][:1], flat["completion_mask"][:1])


def _logprobs_of(model, part: dict | None, batch: RolloutBatch) -> torch.Tensor | None:
    """The model's log-probs of a micro-batch's rows; None for a padding micro-batch, whose
    forward runs and is dropped."""
    if part is None:
        _padding_forward(model, batch)
        return None
    return model(part["input_ids"], part["attention_mask"], part["completion_mask"])


@torch.no_grad()
def add_logprobs(config: TrainConfig, models: Models, batch: RolloutBatch, plan: Plan,
                 world: World = World()) -> RolloutBatch:
    """Step 5: the batch with ref_logp (beta > 0) and old_logp (pi_old) filled in.

    pi_old: the sampler's log-probs (old_logprobs = "sampler"); else, when a rollout gives
    K > 1 optimizer steps, the policy's log-probs of the trained rows, in the micro-batches
    the update will use, so the first mini-batch's ratio is exactly 1 (the same forward,
    bitwise); else None: the update's own detached forward (K = 1).
    """
    # pi_old is the policy that sampled, for every optimizer step of this rollout:
    # refreshed per pass or per mini-batch, the ratio would restart at 1 there, and
    # with one mini-batch per pass the clip would never act. With one optimizer step
    # the policy has not moved before its forward, so that forward's detached
    # log-probs serve (ratio 1, as TRL), at no extra cost.
    old_logp = None
    if config.old_logprobs == "sampler":
        old_logp = batch.sampler_logp
    elif optimizer_steps_per_rollout(config) > 1:
        old_logp = policy_logprobs(config, models, batch, plan, world)
    ref_logp = None
    if models.reference_logprobs is not None:
        flat = batch.flat()
        ref_logp = torch.cat([
            models.reference_logprobs(flat["input_ids"][rows], flat["attention_mask"][rows],
                                      flat["completion_mask"][rows])
            for rows in torch.arange(batch.num_completions).split(config.micro_batch_size)
        ]).view(batch.completion_mask.shape)
        if hasattr(models.reference_logprobs, "reshard"):
            # FSDP2 keeps a root module's parameters gathered after its forward (for the
            # backward that usually follows); the reference has none: back to 1/N shards.
            models.reference_logprobs.reshard()
    return replace(batch, old_logp=old_logp, ref_logp=ref_logp)


@torch.no_grad()
def policy_logprobs(config: TrainConfig, models: Models, batch: RolloutBatch, plan: Plan,
                    world: World = World()) -> torch.Tensor:
    """The current policy's log-probs of the trained rows, (b, G, S), computed in the
    micro-batches the update will use (so the first mini-batch's ratio is exactly 1);
    rows in no mini-batch stay 0 and are never read."""
    old_logp = torch.zeros_like(batch.sampler_logp)
    for k in range(config.num_mini_batches):
        parts = micro_batches(config, plan, batch, k, world)
        pieces = [_logprobs_of(models.train_logprobs, part, batch) for part in parts]
        real = [piece for piece in pieces if piece is not None]
        if real:
            groups = plan.local_groups(k).nonzero()[:, 0].to(old_logp.device)
            old_logp.index_copy_(0, groups, torch.cat(real).view(-1, batch.group_size, batch.completion_length))
    return old_logp


# --------------------------------------------------------------------------- step 6

def micro_batch_loss(config: TrainConfig, model, part: dict, totals: LossTotals):
    """The loss of a micro-batch's rows as its part of the mini-batch's loss (divided by
    the whole mini-batch's counts, so the parts add up to it exactly).

    Returns (loss, out, logp): the scalar part, grpo_loss's output and the rows' log-probs (detached).
    """
    mask = part["completion_mask"]
    logp = model(part["input_ids"], part["attention_mask"], mask)
    old = part["old_logp"] if part["old_logp"] is not None else logp.detach()
    out = grpo_loss(logp, old, part["advantages"], mask, ref_logp=part["ref_logp"], beta=config.beta,
                    epsilon=config.epsilon, epsilon_high=config.epsilon_high, loss_type=config.loss_type,
                    max_completion_length=config.max_completion_length,
                    importance_sampling_level=config.importance_sampling_level,
                    kl_estimator=config.kl_estimator, num_items=totals.num_items,
                    num_completions=totals.num_completions,
                    sampler_logp=part["sampler_logp"], tis_cap=config.tis_cap)
    return out.loss, out, logp.detach()


# How each of grpo_loss's metrics combines over micro-batches and ranks. "unit" is a token
# mean at the token level and a completion mean at the sequence level (GSPO), as in TRL.
METRIC_REDUCTION = {
    "loss": "sum", "policy_loss": "sum", "approx_kl": "token", "kl": "token",
    "clip_ratio/low": "unit", "clip_ratio/high": "unit", "clip_ratio/region": "unit",
    "ratio/mean": "unit", "ratio/min": "min", "ratio/max": "max",
    "tis/mean": "token", "tis/truncated": "token",
}


class MetricSums:
    """Accumulates grpo_loss's metrics of one optimizer step's micro-batches on this rank,
    then reduces them over ranks the way METRIC_REDUCTION says."""

    def __init__(self, sequence_level: bool):
        self.sequence_level = sequence_level
        self.sums: dict[str, float] = {key: 0.0 for key, how in METRIC_REDUCTION.items()
                                       if how in ("sum", "token", "unit")}
        self.weights = {"token": 0.0, "unit": 0.0}
        self.seen: set[str] = set()
        self.extremes = {key: (math.inf if how == "min" else -math.inf)
                         for key, how in METRIC_REDUCTION.items() if how in ("min", "max")}

    def add(self, metrics: dict[str, float], tokens: float, completions: float) -> None:
        unit = completions if self.sequence_level else tokens
        for key, how in METRIC_REDUCTION.items():
            if key not in metrics:
                continue
            if how == "sum":
                self.sums[key] += metrics[key]
            elif how == "token":
                self.sums[key] += metrics[key] * tokens
            elif how == "unit":
                self.sums[key] += metrics[key] * unit
            elif how == "min":
                self.extremes[key] = min(self.extremes[key], metrics[key])
            else:
                self.extremes[key] = max(self.extremes[key], metrics[key])
        self.weights["token"] += tokens
        self.weights["unit"] += unit
        self.seen |= set(metrics)

    def reduce(self, world: World) -> dict[str, float]:
        keys = list(self.sums)
        sums = world.reduce(torch.tensor([self.sums[k] for k in keys] + [self.weights["token"], self.weights["unit"]],
                                         dtype=torch.float64))
        lows = [k for k, how in METRIC_REDUCTION.items() if how == "min"]
        highs = [k for k, how in METRIC_REDUCTION.items() if how == "max"]
        low = world.reduce(torch.tensor([self.extremes[k] for k in lows], dtype=torch.float64), "min")
        high = world.reduce(torch.tensor([self.extremes[k] for k in highs], dtype=torch.float64), "max")
        tokens, units = float(sums[-2]), float(sums[-1])
        seen = set(world.gather_objects(sorted(self.seen)))
        out = {}
        for i, key in enumerate(keys):
            if key not in seen:
                continue
            how = METRIC_REDUCTION[key]
            out[key] = float(sums[i]) if how == "sum" else float(sums[i]) / (tokens if how == "token" else units)
        out.update({k: float(v) for k, v in zip(lows, low) if k in seen})
        out.update({k: float(v) for k, v in zip(highs, high) if k in seen})
        return out


def skip_optimizer_step(scheduler) -> None:
    """An empty mini-batch: no update, but the learning rate moves on as if one were taken,
    so that it stays on its schedule (K scheduler steps per rollout, always)."""
    with warnings.catch_warnings():
        # torch warns when a scheduler steps before the optimizer ever has; here that is meant.
        warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()` before"))
        scheduler.step()


def optimise(config: TrainConfig, models: Models, optimizer, scheduler, batch: RolloutBatch, plan: Plan,
             world: World = World()) -> dict[str, float]:
    """num_iterations passes over the rollout; each pass is one optimizer step per mini-batch
    of the plan: K = num_iterations x num_mini_batches optimizer steps per rollout.

    Each rank backpropagates world.size x its part of the mini-batch's loss: DDP and FSDP2
    average gradients over ranks, so the gradient every rank steps with is the sum of the
    parts, the 1-process gradient.

    Returns the last optimizer step's loss metrics (grpo_loss's, reduced over micro-batches
    and ranks, plus grad_norm) and
      learning_rate       the learning rate of this rollout's first optimizer step
      optimizer_steps     the optimizer steps taken: K, less those of empty mini-batches
                          (which still step the schedule)
      sampler_gap/...     the trainer's log-probs before the update against the sampler's
                          (see sampler_gap); absent when no row is trained on
      skipped_update      1.0 when no optimizer step was taken
    """
    learning_rate = optimizer.param_groups[0]["lr"]   # what the first step below uses
    model = models.train_logprobs
    metrics: dict[str, float] = {}
    steps_taken, first_forward = 0, []
    # Each mini-batch's micro-batches and loss denominators, the same in every pass.
    planned = [(micro_batches(config, plan, batch, k, world), plan.totals(config, k)) if len(groups) else None
               for k, groups in enumerate(plan.mini_batches)]
    for iteration in range(config.num_iterations):
        for k in range(config.num_mini_batches):
            if planned[k] is None:
                skip_optimizer_step(scheduler)
                continue
            parts, totals = planned[k]
            optimizer.zero_grad(set_to_none=True)
            sums = MetricSums(config.importance_sampling_level == "sequence")
            for i, part in enumerate(parts):
                with distributed.no_sync(model, sync=i == len(parts) - 1):
                    if part is None:   # this rank holds fewer rows: a zero-weight part
                        (_padding_forward(model, batch).sum() * 0.0).backward()
                        continue
                    loss, out, logp = micro_batch_loss(config, model, part, totals)
                    (loss * world.size).backward()
                if steps_taken == 0:   # the policy has not moved yet: it is the one that sampled
                    first_forward.append((part, logp))
                sums.add(out.metrics, tokens=float(part["completion_mask"].sum()),
                         completions=float(part["completion_mask"].shape[0]))
            # max_grad_norm 0: measure the norm (inf never clips) without clipping.
            norm = torch.nn.utils.clip_grad_norm_(models.policy.parameters(), config.max_grad_norm or math.inf)
            optimizer.step()
            scheduler.step()
            steps_taken += 1
            if _last_nonempty(plan, iteration, k, config):
                metrics = sums.reduce(world)
                metrics["grad_norm"] = float(distributed.full_tensor(norm))
    if models.sharded and not models.lazy:
        distributed.copy_full_weights(models.policy, models.full_policy)   # the sampler's weights
    if steps_taken == 0:
        metrics["skipped_update"] = 1.0
    metrics["learning_rate"] = learning_rate
    metrics["optimizer_steps"] = float(steps_taken)
    if steps_taken:
        metrics.update(_gap_before_update(config, batch, plan, first_forward, world))
    return metrics


def _optimise_refreshing_old(config: TrainConfig, models: Models, optimizer, scheduler, batch: RolloutBatch,
                             plan: Plan, world: World) -> dict[str, float]:
    """The failure lab's refresh_old_logprobs fault: num_iterations passes, pi_old recomputed
    from the current policy at the start of each (one pass of optimise each), instead of
    fixed to the policy that sampled. Metrics as optimise's: the last step's, the first
    step's learning rate and sampler gap, the optimizer steps of all passes."""
    one_pass = replace(config, num_iterations=1)
    passes = []
    for _ in range(config.num_iterations):
        old_logp = policy_logprobs(one_pass, models, batch, plan, world)
        passes.append(optimise(one_pass, models, optimizer, scheduler, replace(batch, old_logp=old_logp),
                               plan, world))
    merged = dict(passes[-1])
    merged["learning_rate"] = passes[0]["learning_rate"]
    merged["optimizer_steps"] = sum(p["optimizer_steps"] for p in passes)
    merged.update({k: v for k, v in passes[0].items() if k.startswith("sampler_gap/")})
    return merged


def _last_nonempty(plan: Plan, iteration: int, k: int, config: TrainConfig) -> bool:
    """Whether (iteration, k) is the rollout's last optimizer step that is taken."""
    if iteration != config.num_iterations - 1:
        return False
    return all(len(plan.mini_batches[j]) == 0 for j in range(k + 1, config.num_mini_batches))


def _gap_before_update(config: TrainConfig, batch: RolloutBatch, plan: Plan, first_forward: list,
                       world: World) -> dict[str, float]:
    """The sampler gap over the log-probs the trainer had before the rollout's first update:
    the recomputed pi_old (every trained row) when there is one, else the first optimizer
    step's own forward (its mini-batch's rows; with one step per rollout, every trained row).
    Either way, groups dropped by filter_zero_std_groups are not included."""
    if config.old_logprobs == "recomputed" and batch.old_logp is not None:
        keep = torch.zeros(batch.num_prompts, dtype=torch.bool)
        for k in range(config.num_mini_batches):
            keep |= plan.local_groups(k)
        trained = batch.select(keep) if keep.any() else None
        if trained is None:
            return sampler_gap(batch.sampler_logp[:0], batch.sampler_logp[:0], batch.completion_mask[:0], world)
        trainer_logp, sampler_logp, mask = trained.old_logp, trained.sampler_logp, trained.completion_mask
    else:
        pieces = [(part["sampler_logp"], logp, part["completion_mask"]) for part, logp in first_forward]
        sampler_logp = torch.cat([p[0] for p in pieces]) if pieces else batch.sampler_logp[:0]
        trainer_logp = torch.cat([p[1] for p in pieces]) if pieces else batch.sampler_logp[:0]
        mask = torch.cat([p[2] for p in pieces]) if pieces else batch.completion_mask[:0]
    return sampler_gap(trainer_logp, sampler_logp, mask, world)


def sampler_gap(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor,
                completion_mask: torch.Tensor, world: World = World()) -> dict[str, float]:
    """How far the trainer's log-probs of the sampled tokens are from the sampler's: (n, ...) x 3 -> floats.

      sampler_gap/mean_abs   mean over completion tokens of |log pi_trainer - log pi_sampler|
      sampler_gap/max_ratio  the largest exp(|log pi_trainer - log pi_sampler|): the worst
                             token's importance weight, either way round (1 = no gap)

    Both engines compute the trainer's maths, so in float32 at the same temperature the gap
    is rounding (the CPU tier: mean ~2e-7, max_ratio ~1.00001); a sampler with other
    kernels or precision (vLLM, bf16), or at another temperature, shows here.
    """
    mask = completion_mask.bool()
    gap = (trainer_logp.double() - sampler_logp.double()).abs()[mask]
    local = torch.tensor([float(gap.sum()), float(gap.numel())], dtype=torch.float64)
    total = world.reduce(local)
    largest = world.reduce(torch.tensor([float(gap.max()) if gap.numel() else 0.0], dtype=torch.float64), "max")
    return {"sampler_gap/mean_abs": float(total[0] / total[1]), "sampler_gap/max_ratio": math.exp(float(largest[0]))}


# --------------------------------------------------------------------------- the loop

def step_metrics(plan: Plan, batch: RolloutBatch, update: dict[str, float], seconds: dict[str, float],
                 world: World = World()) -> dict:
    """The step's metrics over all B prompts (the plan holds them gathered)."""
    lengths = plan.lengths.double()
    trained = torch.cat(plan.mini_batches)
    sampler = batch.sampler_logp * batch.completion_mask
    entropy = world.reduce(torch.tensor([float(-sampler.sum()), float(batch.completion_mask.sum())],
                                        dtype=torch.float64))
    metrics = {
        "reward/mean": plan.rewards.mean().item(), "reward/std": plan.rewards.std().item(),
        **{f"reward/{name}": values.mean().item() for name, values in plan.components.items()},
        "zero_std_groups": zero_std_groups(plan.rewards).float().mean().item(),
        "completion_length/mean": lengths.mean().item(), "completion_length/min": lengths.min().item(),
        "completion_length/max": lengths.max().item(),
        "truncated": 1.0 - plan.finished.double().mean().item(),
        # Mean over completion tokens of -log pi(token): a Monte-Carlo estimate of the sampling
        # policy's entropy per token (exact in expectation).
        "entropy": float(entropy[0] / entropy[1]),
        **update,
        **{f"time/{k}": v for k, v in seconds.items()},
    }
    if len(trained):
        metrics["advantage/std"] = plan.advantages[trained].double().std(correction=0).item()
    metrics["advantage/tie_spread"] = tie_spread(plan.rewards, plan.advantages)
    return metrics


def tie_spread(rewards: torch.Tensor, advantages: torch.Tensor) -> float:
    """The largest gap between the advantages of two completions of one group that have the
    same reward: (B, G) x 2 -> float. 0 for any advantage function of the group's rewards
    (equal rewards, equal advantages); > 0 when a group's baseline was computed in pieces."""
    same = rewards[:, :, None] == rewards[:, None, :]
    gaps = (advantages[:, :, None].double() - advantages[:, None, :].double()).abs()
    return float(gaps[same].max()) if same.any() else 0.0


@dataclass
class RunResult:
    policy: torch.nn.Module
    tokenizer: object
    summary: dict
    history: list[dict]


def train(config: TrainConfig, *, advantage_fn: AdvantageFn | None = None,
          reward_functions: dict[str, tuple[RewardFn, float]] | None = None,
          policy=None, tokenizer=None, resume: str | Path | None = None, stop_after: int | None = None,
          log: Callable[[str], None] = print, faults: Faults | None = None) -> RunResult:
    """Train a policy with GRPO as `config` says; write the run to config.output_dir.

    Under torchrun every rank calls this with the same arguments (see grpo_edu.distributed);
    rank 0 writes the run directory and logs.

    advantage_fn: rewards (B, G) -> advantages (B, G); default the config's (its
        advantage_fn by import path, else group_advantages with advantage_scale / advantage_std).
    reward_functions: {name: (fn, weight)} with TRL's signature; default the
        config's `rewards` weights over grpo_edu.rewards.
    policy, tokenizer: a model to train instead of loading config.model.
    resume: a run directory whose latest checkpoint to continue from.
    stop_after: stop (checkpointed) after this many steps in total: a test's
        stand-in for an interrupted run.
    faults: deliberate bugs for the failure lab (grpo_edu.faults.Faults); never a config key.

    Returns the trained policy with whole weights (under FSDP2 a plain copy).
    """
    world = distributed.init_world(config.device)
    check_engine_settings(config, world.device)
    world.shard(config.prompts_per_step)   # prompts_per_step must divide among the ranks
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    say = log if world.is_main else (lambda message: None)
    if advantage_fn is not None and config.advantage_fn:
        raise ValueError(f"train(advantage_fn=...) and config key 'advantage_fn' ({config.advantage_fn!r}) both "
                         f"given; pass one")
    configured_advantage_fn, configured_rewards = functions_from_config(config)
    advantage_fn = configured_advantage_fn if advantage_fn is None else advantage_fn
    faults = NO_FAULTS if faults is None else faults
    if not isinstance(faults, Faults):
        raise ValueError(f"faults: expected a grpo_edu.faults.Faults, got {type(faults).__name__}")
    faults.check(config)
    if faults.active():
        say(f"FAULTS INJECTED (the failure lab): {faults.active()}")
    if faults.split_groups > 1:
        advantage_fn = functools.partial(faults.split_advantages, advantage_fn)
    reward_functions = configured_rewards if reward_functions is None else reward_functions
    if policy is None:
        policy, tokenizer = load_policy(STARTING_POLICY if config.model == "start" else config.model)
    state = TrainState(prompt_rng=random.Random(config.seed))
    output_dir = Path(config.output_dir)
    metrics_log = MetricsLog(output_dir)
    saved, reference = None, None
    if resume is not None:
        # Whole weights into the plain models, before they are placed and sharded.
        reference = make_reference(policy) if config.beta != 0.0 else None
        saved = checkpoint.load_weights(Path(resume), policy, reference, log=say)
    if faults.alias_reference:
        reference = policy
    # faults.trainer_temperature: the trainer's log-probs at another temperature than the sampler's
    logprob_config = config if faults.trainer_temperature is None else replace(
        config, temperature=faults.trainer_temperature)
    models = build_models(logprob_config, world, policy, reference, allow_alias=faults.alias_reference)
    if faults.active() and world.distributed:
        raise ValueError(f"faults: the failure lab injects faults in one process, got {world.size} processes")
    if faults.off_by_one:   # policy, pi_old and reference alike (one process: plain modules, never DDP's wrapper)
        for module in (models.train_logprobs, models.reference_logprobs):
            if module is not None:
                module.logprob_fn = faults.logprob_fn(module.logprob_fn)
    # fused: one kernel for all parameters (the same algorithm; 0.35 ms a step instead of 1.2 on the CPU tier)
    optimizer = torch.optim.AdamW(models.policy.parameters(), lr=config.learning_rate,
                                  betas=tuple(config.adam_betas), weight_decay=config.weight_decay, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, learning_rate_factor(config))
    engine = make_engine(config, models, tokenizer, world)
    train_pool, held_out = task_pools(config, tokenizer)
    history: list[dict] = []

    def held_out_accuracy() -> float:
        """Greedy accuracy on the held-out set, each rank scoring its share of the problems."""
        with models.whole() as model:
            model.eval()
            with autocast(config, world.device):
                scores = greedy_scores(model, tokenizer, held_out[world.split(len(held_out))],
                                       max_new_tokens=config.max_completion_length)
            model.train()
        correct = world.gather_objects([accuracy for accuracy, _ in scores])
        return sum(correct) / len(correct)

    def held_out_samples() -> dict:
        """config.eval_samples samples per held-out problem: pass@1, pass@k, maj@k, intervals."""
        with models.whole() as model:
            model.eval()
            with autocast(config, world.device):
                scores = sampled_scores(model, tokenizer, held_out[world.split(len(held_out))],
                                        k=config.eval_samples, max_new_tokens=config.max_completion_length)
            model.train()
        return {f"eval/{key}": value
                for key, value in sampled_metrics(world.gather_objects(scores), config.eval_samples).items()}

    if saved is not None:
        distributed.load_full_optimizer_state(optimizer, saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        checkpoint.restore_rng(saved, state)
        extra = json.loads(saved["extra"])
        start_accuracy, elapsed = extra["start_accuracy"], extra["seconds"]
        history = metrics_log.restore(up_to_step=state.step, log=say) if world.is_main else []
    else:
        start_accuracy, elapsed = held_out_accuracy(), 0.0
        with models.whole() as model:   # every rank enters: under FSDP2 a lazy copy is gathered
            if world.is_main:
                output_dir.mkdir(parents=True, exist_ok=True)
                metrics_log.start()
                (output_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=2) + "\n")
                before = _samples_table(model, tokenizer, held_out[:4], config.max_completion_length)
                (output_dir / "samples_before.txt").write_text(before)
        say(f"start: held-out greedy accuracy {start_accuracy:.4f}")
    world.barrier()

    progress = _progress_bar(config, state.step) if world.is_main else None
    live_doctor = LiveDoctor(config.to_dict())
    if saved is not None:   # a resumed run: what was reported before is not reported again
        live_doctor.reported |= {f.detector for f in diagnose(history, config.to_dict())}
    accuracy, started = start_accuracy, time.perf_counter()
    last = min(config.steps, stop_after) if stop_after is not None else config.steps
    while state.step < last:
        t0 = time.perf_counter()
        samples = sample_prompts(config, state, train_pool)
        rollout = roll_out(config, samples, tokenizer, engine, world)
        t1 = time.perf_counter()
        batch, plan = score(config, samples, rollout, tokenizer, reward_functions, advantage_fn, world)
        batch = add_logprobs(config, models, batch, plan, world)
        t2 = time.perf_counter()
        if faults.refresh_old_logprobs:
            update = _optimise_refreshing_old(config, models, optimizer, scheduler, batch, plan, world)
        else:
            update = optimise(config, models, optimizer, scheduler, batch, plan, world)
        t3 = time.perf_counter()
        state.step += 1
        seconds = {"rollout": t1 - t0, "scoring": t2 - t1, "update": t3 - t2}
        metrics = {"step": state.step, **step_metrics(plan, batch, update, seconds, world)}

        if config.ref_sync_steps and state.step % config.ref_sync_steps == 0 and models.reference is not None:
            models.reference.load_state_dict(models.policy.state_dict())
        if state.step % config.eval_every == 0 or state.step == config.steps:
            accuracy = held_out_accuracy()
            metrics["eval/greedy_accuracy"] = accuracy
            if config.eval_samples:
                metrics.update(held_out_samples())
        history.append(metrics)
        if world.is_main:
            metrics_log.append(metrics)
            for finding in live_doctor.check(history):   # each symptom once, the step it appears
                say(f"warning at step {state.step}: {finding.failure}: {finding.evidence}. "
                    f"Advice: {finding.advice} (grpo-edu doctor {output_dir})")
        if progress is not None:
            progress.set_postfix_str(f"reward {metrics['reward/mean']:.3f} held-out acc {accuracy:.3f}",
                                     refresh=False)
            progress.update(1)
        due = config.checkpoint_every and state.step % config.checkpoint_every == 0
        if due or state.step == last:
            total = elapsed + time.perf_counter() - started
            _save_checkpoint(output_dir, models, optimizer, scheduler, state, world,
                             {"start_accuracy": start_accuracy, "seconds": total}, metrics_log)
    if progress is not None:
        progress.close()

    seconds = elapsed + time.perf_counter() - started
    summary = _summary(config, history, start_accuracy, seconds, finished=state.step >= config.steps,
                       eval_problems=len(held_out))
    if faults.active():
        summary["faults"] = faults.active()
    summary["world_size"] = world.size
    summary["parallelism"] = config.parallelism if world.distributed else "none"
    # What each rank holds of the policy's parameters, gradients and AdamW state (FSDP2: ~1/N each).
    summary["memory_bytes_per_rank"] = world.gather_objects([distributed.memory_bytes(models.policy, optimizer)])
    with models.whole(keep=True) as model:   # the run's result: whole weights (every rank enters)
        if world.is_main:
            (output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
            if state.step >= config.steps:
                after = _samples_table(model, tokenizer, held_out[:4], config.max_completion_length)
                (output_dir / "samples_after.txt").write_text(after)
    world.barrier()
    return RunResult(model, tokenizer, summary, history)


def _save_checkpoint(output_dir: Path, models: Models, optimizer, scheduler, state: TrainState, world: World,
                     extra: dict, metrics_log: MetricsLog) -> None:
    """Whole weights and optimizer state (gathered under FSDP2, on every rank), written by rank 0:
    a checkpoint resumes on any number of ranks."""
    policy_weights = distributed.full_state_dict(models.policy)
    reference_weights = None if models.reference is None else distributed.full_state_dict(models.reference)
    optimizer_state = distributed.full_optimizer_state(optimizer)
    if world.is_main:
        metrics_log.sync()   # the metrics this checkpoint covers reach the disk before it does
        checkpoint.save(output_dir, policy_weights, reference_weights, optimizer_state, scheduler, state, extra)
    world.barrier()


def _summary(config: TrainConfig, history: list[dict], start_accuracy: float, seconds: float,
             finished: bool, eval_problems: int) -> dict:
    evals = [(m["step"], m["eval/greedy_accuracy"]) for m in history if "eval/greedy_accuracy" in m]
    step_times = [sum(m[f"time/{key}"] for key in TIME_SPLIT) for m in history]
    final_accuracy = evals[-1][1] if evals else start_accuracy

    def interval(accuracy: float) -> list[float]:
        """95% Wilson interval of a held-out accuracy over eval_problems problems."""
        return list(wilson_interval(round(accuracy * eval_problems), eval_problems))
    return {
        "start_accuracy": start_accuracy,
        "final_accuracy": final_accuracy,
        "eval_problems": eval_problems,
        "start_accuracy_interval_95": interval(start_accuracy),
        "final_accuracy_interval_95": interval(final_accuracy),
        # The last evaluation's sampled metrics (config.eval_samples), with their intervals.
        "final_sampled": next(({k.removeprefix("eval/"): v for k, v in m.items()
                                if k.startswith("eval/") and k != "eval/greedy_accuracy"}
                               for m in reversed(history) if "eval/greedy_accuracy" in m), {}),
        "best_accuracy": max([a for _, a in evals], default=start_accuracy),
        "steps": history[-1]["step"] if history else 0,
        "finished": finished,
        "seconds": seconds,
        "median_steps_per_second": 1.0 / statistics.median(step_times) if step_times else 0.0,
        "time_split_median": {
            key: statistics.median(m[f"time/{key}"] for m in history) if history else 0.0
            for key in TIME_SPLIT},
        "eval_curve": evals,
        "config": config.to_dict(),
    }


def _samples_table(policy, tokenizer, samples: list[dict], max_new_tokens: int) -> str:
    from grpo_edu.models import generate_completions

    policy.eval()
    completions = generate_completions(policy, tokenizer, [s["prompt"] for s in samples],
                                       max_new_tokens=max_new_tokens)
    policy.train()
    lines = []
    for sample, (completion,) in zip(samples, completions):
        correct = rewards.accuracy_reward([completion], answer=[sample["answer"]], task=[sample.get("task")],
                                          numbers=[sample.get("numbers")])[0]
        lines.append(f"{sample['prompt']}{completion}   ({'right' if correct else 'wrong'}, answer {sample['answer']})")
    return "\n".join(lines) + "\n"


def _progress_bar(config: TrainConfig, initial: int):
    if not config.progress:
        return None
    from tqdm.auto import tqdm
    # No rates in the bar: its text must not vary from run to run (the book checks outputs).
    return tqdm(total=config.steps, initial=initial, desc="GRPO",
                bar_format="{desc}: {n_fmt}/{total_fmt} steps |{bar:20}| {postfix}")
