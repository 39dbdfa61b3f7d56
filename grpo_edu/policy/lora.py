"""LoRA: the policy trains low-rank adapters on chosen linear layers; its base stays frozen.

Config keys lora_rank (r; 0 = full fine-tuning), lora_alpha and lora_target_modules. Each
targeted linear layer y = x W^T becomes y = x W^T + (alpha / r) x A^T B^T, with A (r, in)
and B (out, r) the only trained parameters (peft's LoRA layers, injected in place: the
policy keeps its class, so transformers' forward and generate, DDP and FSDP2 see the same
model with two more small matrices per layer). B starts at 0, so the starting policy is the
base model exactly.

    add_adapters(policy, config)   peft's LoRA layers into the policy, in place, seeded
    adapter_layers(model)          its LoRA layers
    effective_weight(linear)       W + (alpha / r) B A, differentiable (the fused forward's weights)
    adapters_off(model)            a context in which it is its base model: the reference
    ReferenceLogprobs              the reference's log-prob module: the policy's, adapters off
    named_merged_weights(model)    (name, whole tensor) with the adapters merged, under the base
                                   model's names (what vLLM loads before every rollout)
    merged_copy(model)             a plain model with the adapters merged (run_dir/model/)
    is_adapter(name)               a parameter name is an adapter's (what a checkpoint holds)

The reference. With beta > 0 the KL term needs pi_ref, the starting policy. With LoRA that is
the base model: the policy with its adapters switched off. So there is no second copy of the
weights (full fine-tuning keeps one: 4 bytes a parameter); its log-probs are the policy's own
forward inside `adapters_off` (TRL does the same with peft's disable_adapter). The reference
cannot be re-synced to the policy (ref_sync_steps), as in TRL.

Dropout on the adapters' input (peft's lora_dropout) is not offered: it would make every
forward random, pi_old's recomputed log-probs would no longer be the sampler's policy, and the
fused forward (one merged weight per layer) could not reproduce it.
"""

from __future__ import annotations

import contextlib
import copy

import torch

ADAPTER_NAME = "default"   # peft's name for a model's one adapter


# --------------------------------------------------------------------------- the adapters

def is_lora_layer(module: torch.nn.Module) -> bool:
    """A peft LoRA layer (without importing peft: a model without adapters never needs it)."""
    return hasattr(module, "base_layer") and hasattr(module, "lora_A") and hasattr(module, "scaling")


def adapter_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    return {name: module for name, module in model.named_modules() if is_lora_layer(module)}


def has_adapters(model: torch.nn.Module) -> bool:
    return any(is_lora_layer(module) for module in model.modules())


def is_adapter(name: str) -> bool:
    """A parameter name is a LoRA matrix's (the part of the policy that trains)."""
    return ".lora_A." in name or ".lora_B." in name


def _linear_names(model: torch.nn.Module) -> set[str]:
    """The last name component of every linear layer inside the decoder layers."""
    from grpo_edu.runtime.distributed import decoder_layers
    return {name.rsplit(".", 1)[-1] for layer in decoder_layers(model)
            for name, module in layer.named_modules() if isinstance(module, torch.nn.Linear)}


def add_adapters(policy: torch.nn.Module, config) -> torch.nn.Module:
    """Inject LoRA layers (rank config.lora.lora_rank, scale lora_alpha / lora_rank) into every linear
    layer of the decoder layers named in config.lora.lora_target_modules, in place; freeze everything
    else. A is initialised as peft does (Kaiming-uniform) from config.run.seed, without touching
    the global RNG; B is 0. Returns the policy (the same object)."""
    if has_adapters(policy):
        raise ValueError(f"config key 'lora_rank' ({config.lora.lora_rank}): the policy already has LoRA layers; pass "
                         f"the base model (or merge its adapters first)")
    available = _linear_names(policy)
    missing = [t for t in config.lora.lora_target_modules if t not in available]
    if missing:
        raise ValueError(f"config key 'lora_target_modules': {missing[0]!r} names no linear layer of "
                         f"{type(policy).__name__}'s decoder layers (they have {sorted(available)})")
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError:
        raise ValueError(f"config key 'lora_rank' ({config.lora.lora_rank}) trains peft's LoRA adapters, and peft is not "
                         f"installed: pip install -e '.[lora]' (or pip install peft)") from None
    lora_config = LoraConfig(r=config.lora.lora_rank, lora_alpha=config.lora.lora_alpha, lora_dropout=0.0, bias="none",
                             target_modules=list(config.lora.lora_target_modules))
    devices = [torch.device("cuda", torch.cuda.current_device())] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(config.run.seed)
        inject_adapter_in_model(lora_config, policy, adapter_name=ADAPTER_NAME)
    for name, parameter in policy.named_parameters():
        parameter.requires_grad_(is_adapter(name))
    return policy


def delta_weight(layer: torch.nn.Module, gather=lambda tensor: tensor) -> torch.Tensor:
    """(alpha / r) B A, the adapter's change to the layer's weight (out, in), differentiable;
    `gather` makes sharded matrices whole first (named_merged_weights)."""
    B, A = gather(layer.lora_B[ADAPTER_NAME].weight), gather(layer.lora_A[ADAPTER_NAME].weight)
    return (B @ A) * layer.scaling[ADAPTER_NAME]


def effective_weight(linear: torch.nn.Module) -> torch.Tensor:
    """The weight a linear layer applies now: a plain layer's own; a LoRA layer's base weight
    plus its adapter's delta (nothing while the adapters are off)."""
    if not is_lora_layer(linear):
        return linear.weight
    base = linear.base_layer.weight
    if linear.disable_adapters or linear.merged:
        return base
    return base + delta_weight(linear).to(base.dtype)


@contextlib.contextmanager
def adapters_off(model: torch.nn.Module):
    """Inside, `model` computes as its base model (every LoRA layer skips its adapter). The flag
    is peft's own (what its forward reads); requires_grad is left as it is, unlike peft's
    enable_adapters(False), so that DDP's and FSDP2's view of what trains never changes."""
    with _switched_off(list(adapter_layers(model).values())):
        yield model


@contextlib.contextmanager
def _switched_off(layers: list[torch.nn.Module]):
    before = [layer._disable_adapters for layer in layers]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer, flag in zip(layers, before):
            layer._disable_adapters = flag


class ReferenceLogprobs(torch.nn.Module):
    """The reference's log-prob module under LoRA: the policy's own (`logprobs`, maybe wrapped
    for DDP or FSDP2; DDP's wrapper is bypassed: the reference trains nothing) with the
    adapters switched off. Called without gradients (update.add_logprobs)."""

    def __init__(self, logprobs: torch.nn.Module, policy: torch.nn.Module):
        super().__init__()
        from torch.nn.parallel import DistributedDataParallel
        inner = logprobs.module if isinstance(logprobs, DistributedDataParallel) else logprobs   # FSDP2: itself
        # A plain tuple, not a submodule: the reference registers no parameters of its own. The
        # LoRA layers are found once, not at every forward.
        self._target = (inner, list(adapter_layers(policy).values()))

    def forward(self, input_ids, attention_mask, completion_mask, entropy=False):
        inner, layers = self._target
        with torch.no_grad(), _switched_off(layers):
            return inner(input_ids, attention_mask, completion_mask, entropy)

    def reshard(self) -> None:
        """FSDP2: the root's parameters back to shards after the no-grad forward."""
        inner = self._target[0]
        if hasattr(inner, "reshard"):
            inner.reshard()


# --------------------------------------------------------------------------- merged weights

def named_merged_weights(model: torch.nn.Module, gather=lambda tensor: tensor):
    """(name, tensor) for every parameter of the base model, one at a time, with each LoRA
    layer's adapter merged into its weight: W + (alpha / r) B A under the name W has without
    adapters ('...q_proj.weight'); the adapters' own matrices are not given. `gather` makes a
    sharded tensor whole (distributed.full_tensor: a collective, every rank iterates alike)."""
    layers = adapter_layers(model)
    for name, parameter in model.named_parameters():   # tied weights come once
        if is_adapter(name):
            continue
        tensor = gather(parameter.detach())
        owner = name.removesuffix(".base_layer.weight")
        if owner != name and owner in layers:
            tensor = tensor + delta_weight(layers[owner], lambda t: gather(t.detach())).to(tensor.dtype)
            name = owner + ".weight"
        elif ".base_layer." in name:
            name = name.replace(".base_layer.", ".")
        yield name, tensor


@torch.no_grad()
def merged_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` (plain, whole weights) with every adapter merged into its layer's
    weight and the LoRA layers replaced by their base layers: the architecture the model had
    before add_adapters, computing what the LoRA model computes. `model` itself is unchanged."""
    merged = copy.deepcopy(model)
    for name, layer in adapter_layers(merged).items():
        layer.base_layer.weight.add_(delta_weight(layer).to(layer.base_layer.weight.dtype))
        parent, _, child = name.rpartition(".")
        setattr(merged.get_submodule(parent), child, layer.base_layer)
    merged.requires_grad_(False)
    return merged
