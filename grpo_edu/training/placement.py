"""Where the models live and what samples from them: the trainer's set-up (grpo_edu.training.trainer).

    Models              the policy (maybe sharded), the frozen reference, a whole-weight copy
                        for sampling and evaluation, and the log-prob modules the loss calls
    build_models        place them on the world's device, wrapped for DDP or FSDP2
    make_reference      a frozen copy of the policy (check_not_aliased: never the policy itself)
    make_engine         the rollout engine config key engine names (grpo_edu.sampling.engines)
    sequence_logprobs   the completion tokens' log-probs, by the engine's forward
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import torch

from grpo_edu.config import TrainConfig
from grpo_edu.policy import lora
from grpo_edu.runtime import distributed
from grpo_edu.runtime.distributed import World
from grpo_edu.runtime.precision import autocast
from grpo_edu.sampling.engines import ENGINES


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
                         "(grpo_edu.training.placement.make_reference(policy))")
    policy_storage = {p.untyped_storage().data_ptr() for p in policy.parameters()}
    for name, parameter in reference.named_parameters():
        if parameter.untyped_storage().data_ptr() in policy_storage:
            raise ValueError(f"reference parameter {name!r} shares memory with the policy; "
                             f"pass a separate copy (grpo_edu.training.placement.make_reference(policy))")


def check_engine_settings(config: TrainConfig, device: torch.device) -> None:
    """What the engine needs of the machine, now that the device is known (its registered check:
    the fused path is the CPU tier's float32 fast path, refused by name elsewhere)."""
    engine = ENGINES[config.run.engine]
    if engine.check is not None:
        engine.check(config, device)


def sequence_logprobs(config: TrainConfig, model, input_ids, attention_mask, completion_mask, entropy=False):
    """log pi(token) of the completion tokens of prompt-major rows: (n, P + S) -> (n, S); with
    `entropy`, the entropies of the distributions they were drawn from instead (detached), by the
    engine's registered forward.

    Rows hold whole groups when micro_batch_size is a multiple of G (every micro-batch then does):
    a forward that can (the fused one) computes each prompt once for its G completions.
    """
    G = config.rollout.num_generations
    group = G if config.optimisation.micro_batch_size % G == 0 and input_ids.shape[0] % G == 0 else 1
    forward = ENGINES[config.run.engine].logprobs()
    return forward(model, input_ids, attention_mask, completion_mask, temperature=config.rollout.temperature,
                   group_size=group, entropy=entropy)


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

    def sync_reference(self, alpha: float = 1.0) -> None:
        """The reference moves toward the current policy (config keys ref_sync_steps, ref_mixup_alpha):
        alpha = 1, a copy of it; else ref = alpha x policy + (1 - alpha) x ref per parameter, in
        place (Polyak averaging, TRL's SyncRefModelCallback to the bit; under FSDP2 each rank
        averages its own shards, so the reference stays sharded). Buffers are not averaged."""
        if self.reference is None:
            return
        if alpha == 1.0:
            self.reference.load_state_dict(self.policy.state_dict())
            return
        with torch.no_grad():
            for reference, policy in zip(self.reference.parameters(), self.policy.parameters(), strict=True):
                reference.mul_(1.0 - alpha).add_(policy, alpha=alpha)


def logprob_function(config: TrainConfig, world: World):
    """The log-prob modules' function: (model, input_ids, attention_mask, completion_mask,
    entropy=False) -> (n, S), by the engine's forward (sequence_logprobs) at config.rollout.temperature,
    under autocast where config.run.precision says so."""
    def logprob_fn(model, input_ids, attention_mask, completion_mask, entropy=False):
        with autocast(config.run.precision, world.device):
            return sequence_logprobs(config, model, input_ids, attention_mask, completion_mask, entropy)
    return logprob_fn


def build_models(config: TrainConfig, world: World, policy: torch.nn.Module,
                 reference: torch.nn.Module | None = None) -> Models:
    """Place the policy and the reference (beta > 0; default a copy of the policy; a policy with
    LoRA adapters: itself with the adapters off, grpo_edu.policy.lora) on the world's device and wrap
    them for `config.run.parallelism`. A reference that shares storage with the policy is refused
    (its KL would stay 0)."""
    policy.to(world.device)
    adapters = lora.has_adapters(policy)   # LoRA: the reference is the policy with its adapters off
    if adapters and reference is not None:
        raise ValueError("reference: the policy has LoRA adapters, so its reference is the base model (the "
                         "adapters switched off); pass none")
    if config.loss.beta == 0.0 or adapters:
        reference = None
    elif reference is None:
        reference = make_reference(policy)
    else:
        check_not_aliased(policy, reference)
        reference.to(world.device)
    policy.train()
    sharded = world.distributed and config.run.parallelism == "fsdp2"
    engine = ENGINES[config.run.engine]
    lazy = sharded and engine.own_weights   # the sampler has its own copy: this one only evaluates
    if lazy:
        with torch.device("meta"):
            full_policy = type(policy)(policy.config)
            if adapters:   # the same layers as the policy's, for Models.whole() to copy into
                lora.add_adapters(full_policy, config)
            full_policy.eval().requires_grad_(False)
        full_policy.generation_config = policy.generation_config
    else:
        full_policy = make_reference(policy) if sharded else policy   # a plain copy, never trained
    logprob_fn = logprob_function(config, world)
    per_layer = engine.layer_forward   # the fused path runs no layer's own forward
    train_logprobs = distributed.wrap(policy, logprob_fn, world, config.run.parallelism, trainable=True,
                                      per_layer=per_layer)
    if adapters and config.loss.beta:
        reference_logprobs = lora.ReferenceLogprobs(train_logprobs, policy)
    else:
        reference_logprobs = None if reference is None else distributed.wrap(
            reference, logprob_fn, world, config.run.parallelism, trainable=False, per_layer=per_layer)
    return Models(policy, reference, full_policy, train_logprobs, reference_logprobs, lazy=lazy)


def make_engine(config: TrainConfig, models: Models, tokenizer, world: World = World()):
    """The rollout engine config key engine names, made by its registered factory
    (grpo_edu.sampling.engines). fused and hf sample with the trainer's whole-weight policy
    itself; vllm and sglang hold their own copy, loaded from the trained (maybe sharded) policy
    before every rollout (grpo_edu.sampling.vllm_engine, grpo_edu.sampling.sglang_engine)."""
    return ENGINES[config.run.engine].make(config, models, tokenizer, world)
