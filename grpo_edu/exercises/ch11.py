"""Checkers for chapter 11, "Graduating to a GPU"."""

from __future__ import annotations

import copy
import numbers
from typing import Callable

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from grpo_edu.exercises.checking import CheckResult, compare
from grpo_edu.policy import lora
from grpo_edu.policy.models import STARTING_POLICY, load_policy
from grpo_edu.config import TrainConfig

F64 = torch.float64


# --------------------------------------------------------------------------- 10.1

# Qwen2.5's published dimensions, as chapter 11 builds them on the meta device.
QWEN_ARCHITECTURES = {
    "Qwen2.5-0.5B": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True),
    "Qwen2.5-1.5B": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True),
    "Qwen2.5-7B": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False),
}
TINY = "the tiny policy"
ALL_SEVEN = TrainConfig().lora.lora_target_modules

# (model, GPUs, config keys): none of them a row of the chapter's tables.
STATE_CASES = [
    ("Qwen2.5-0.5B", 2, dict(beta=0.04)),
    ("Qwen2.5-1.5B", 1, dict(beta=0.0)),
    ("Qwen2.5-7B", 4, dict(beta=0.001)),
    (TINY, 1, dict(lora_rank=8, lora_alpha=32.0)),
    ("Qwen2.5-7B", 1, dict(lora_rank=8, lora_alpha=16.0, lora_target_modules=["q_proj", "v_proj"])),
    ("Qwen2.5-1.5B", 2, dict(lora_rank=64, lora_alpha=128.0, beta=0.0)),
]


def base_model(name: str) -> torch.nn.Module:
    """A plain model (no adapters) on the meta device: the parameters' shapes, no memory."""
    config = LlamaConfig.from_pretrained(STARTING_POLICY) if name == TINY else Qwen2Config(**QWEN_ARCHITECTURES[name])
    with torch.device("meta"):
        return (LlamaForCausalLM if name == TINY else Qwen2ForCausalLM)(config)


def qwen_sizes() -> dict[str, dict[str, int]]:
    """Each Qwen2.5 shape of QWEN_ARCHITECTURES, built on the meta device: its parameters (a tied
    embedding once) and its KV cache's bytes per token (K and V, every layer and KV head, bf16)."""
    sizes = {}
    for name, dims in QWEN_ARCHITECTURES.items():
        head_dim = dims["hidden_size"] // dims["num_attention_heads"]
        sizes[name] = dict(parameters=_parameters(base_model(name)),
                           kv_bytes_per_token=2 * dims["num_hidden_layers"] * dims["num_key_value_heads"] * head_dim * 2)
    return sizes


def _parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())   # a tied embedding counts once


def adapter_parameters(model: torch.nn.Module, config: TrainConfig) -> int:
    """The parameters of the adapters lora.add_adapters gives `model` (counted on a copy, on the
    meta device: no memory)."""
    with torch.device("meta"):
        adapted = lora.add_adapters(copy.deepcopy(model).to("meta"), config)
    return sum(p.numel() for name, p in adapted.named_parameters() if lora.is_adapter(name))


def state_bytes(model: torch.nn.Module, config: TrainConfig, gpus: int, adapters: int | None = None) -> float:
    """Chapter 11's accounting: the bytes one GPU's trainer holds of the weights, their gradients,
    AdamW's two moments and the reference, all float32, 1/gpus of each under FSDP2.

    Full fine-tuning: 16 bytes a parameter, and the reference's 4 when beta > 0. LoRA
    (config.lora.lora_rank > 0): the frozen base's weights (4 bytes a parameter), 16 a parameter of
    the adapters, no reference (the base with the adapters off). No activations, no vLLM.
    `adapters`: the adapter parameters, when already counted (adapter_parameters)."""
    P = _parameters(model)
    if config.lora.lora_rank:
        A = adapter_parameters(model, config) if adapters is None else adapters
        return (4 * P + 16 * A) / gpus
    return (16 * P + (4 * P if config.loss.beta > 0 else 0)) / gpus


def _lora_counts(model: torch.nn.Module, config: TrainConfig) -> dict[str, int]:
    """Adapter counts a reader gets by mistake: on every projection, or with one matrix only."""
    r, linear = config.lora.lora_rank, [(name.rsplit(".", 1)[-1], module) for name, module in model.named_modules()
                                   if isinstance(module, torch.nn.Linear) and ".layers." in f".{name}"]
    targeted = [module for short, module in linear if short in config.lora.lora_target_modules]
    return {"every": sum(r * (m.in_features + m.out_features) for _, m in linear),
            "A only": sum(r * m.in_features for m in targeted), "B only": sum(r * m.out_features for m in targeted)}


def _state_mistakes(model: torch.nn.Module, config: TrainConfig, gpus: int, adapters: int) -> list[tuple[float, str]]:
    """(bytes, what went wrong): the answers of known mistakes in this case (`adapters`: the
    right count of adapter parameters)."""
    P, N, A = _parameters(model), gpus, adapters
    twice = P + (model.get_input_embeddings().weight.numel() if model.config.tie_word_embeddings else 0)
    tied_twice = ("counts the tied embedding twice (the input and output embeddings are one tensor; "
                  "model.parameters() gives it once)")
    if config.lora.lora_rank:
        right = (4 * P + 16 * A) / N
        wrong_counts = _lora_counts(model, config)
        mistakes = [
            ((4 * twice + 16 * A) / N, tied_twice),
            (16 * P / N, "full fine-tuning's training state: with lora_rank > 0 only the adapters train"),
            (20 * P / N, "full fine-tuning's training state and reference: with lora_rank > 0 only the adapters "
                         "train"),
            ((8 * P + 16 * A) / N, "a reference copy: with LoRA the reference is the base with its adapters off"),
            (16 * (P + A) / N, "gradients and AdamW moments for the frozen base: only the adapters have them"),
            ((20 * P + 16 * A) / N, "the base's training state and a reference: only the adapters train, and the "
                                    "reference is the base with its adapters off"),
            ((4 * P + 4 * A) / N, "the adapters' weights alone: each adapter parameter also has a gradient and "
                                  "two AdamW moments"),
            ((2 * P + 16 * A) / N, "the base in bf16 (2 bytes a parameter): the trainer holds it in float32"),
            ((4 * P + 16 * wrong_counts["every"]) / N, "adapters on every projection: only on those "
                                                       "lora_target_modules names"),
            ((4 * P + 16 * wrong_counts["A only"]) / N, "counts each adapter's A (r, in) but not its B (out, r)"),
            ((4 * P + 16 * wrong_counts["B only"]) / N, "counts each adapter's B (out, r) but not its A (r, in)"),
        ]
    else:
        reference = 4 * P if config.loss.beta > 0 else 0
        right = (16 * P + reference) / N
        mistakes = [
            ((16 * twice + (4 * twice if reference else 0)) / N, tied_twice),
            (16 * P / N, "no reference: with beta > 0 the trainer keeps a frozen float32 copy of the policy"),
            (20 * P / N, "a reference with beta = 0: the trainer builds none"),
            ((12 * P + reference) / N, "one AdamW moment short: AdamW keeps two, 4 bytes each"),
            ((8 * P + reference) / N, "no AdamW moments: AdamW keeps two per parameter, 4 bytes each"),
            ((4 * P + reference) / N, "the weights alone: training also holds their gradients and AdamW's two "
                                      "moments"),
            ((8 * P + (2 * P if reference else 0)) / N, "2 bytes a parameter (bf16): the trainer's weights, "
                                                        "gradients, moments and reference are float32"),
        ]
    if N > 1:
        mistakes.insert(0, (right * N, "a whole copy on every GPU: under FSDP2 each GPU holds 1/N of every tensor"))
    return [(value, words) for value, words in mistakes if abs(value - right) > 1]


def _describe(name: str, config: TrainConfig, gpus: int) -> str:
    where = f"{gpus} GPU{'s' * (gpus > 1)}" + (" (FSDP2)" if gpus > 1 else "")
    if not config.lora.lora_rank:
        return f"{name}, full fine-tuning, beta {config.loss.beta}, {where}"
    modules = ("all seven projections" if list(config.lora.lora_target_modules) == list(ALL_SEVEN)
               else " and ".join(config.lora.lora_target_modules))
    return (f"{name}, LoRA r = {config.lora.lora_rank} (alpha {config.lora.lora_alpha:g}) on {modules}, beta {config.loss.beta}, "
            f"{where}")


def check_state_bytes(fn: Callable[[torch.nn.Module, TrainConfig, int], float]) -> CheckResult:
    """Exercise 11.1: fn(model, config, gpus) -> the bytes one GPU's trainer holds of the weights,
    gradients, AdamW's moments and the reference (state_bytes: float32, 1/gpus of each under FSDP2),
    for `model` (a plain model on the meta device) trained with config.lora.lora_rank, lora_alpha,
    lora_target_modules and beta on `gpus` GPUs. Within one byte."""
    result = CheckResult("exercise 11.1 what one GPU holds")
    for name, gpus, keys in STATE_CASES:
        config, model = TrainConfig(**keys), base_model(name)
        case = _describe(name, config, gpus)
        adapters = adapter_parameters(model, config) if config.lora.lora_rank else 0
        expected = state_bytes(model, config, gpus, adapters)
        try:
            got = fn(copy.deepcopy(model), config, gpus)
        except Exception as error:  # the reader's code: report, don't crash
            result.record_raised(case, error)
            continue
        if hasattr(got, "item") and getattr(got, "ndim", 1) == 0:
            got = got.item()   # a 0-dimensional tensor or array: its number
        problem = compare(expected, got, 1.0)
        if problem and isinstance(got, numbers.Real) and not isinstance(got, bool):
            problem = next((words for value, words in _state_mistakes(model, config, gpus, adapters)
                            if abs(got - value) <= 1), problem)
        result.record(case, [problem] if problem else [])
    return result


# --------------------------------------------------------------------------- 10.2

# (description, LoRA keys): adapters on the tiny policy, square and rectangular layers.
MERGE_CASES = [
    ("r = 8, alpha = 32 on q_proj and v_proj",
     dict(lora_rank=8, lora_alpha=32.0, lora_target_modules=["q_proj", "v_proj"])),
    ("r = 4, alpha = 8 on gate_proj, up_proj and down_proj",
     dict(lora_rank=4, lora_alpha=8.0, lora_target_modules=["gate_proj", "up_proj", "down_proj"])),
    ("r = 16, alpha = 8 on all seven projections", dict(lora_rank=16, lora_alpha=8.0)),
    ("r = 1, alpha = 4 on o_proj and down_proj", dict(lora_rank=1, lora_alpha=4.0,
                                                      lora_target_modules=["o_proj", "down_proj"])),
]


def trained_lora_policy(keys: dict, seed: int = 0) -> torch.nn.Module:
    """The tiny policy (float64) with adapters whose B is no longer 0, as after some training."""
    policy = lora.add_adapters(load_policy(STARTING_POLICY)[0].to(F64), TrainConfig(seed=seed, **keys))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in lora.adapter_layers(policy).values():
            B = layer.lora_B[lora.ADAPTER_NAME].weight
            B.copy_(0.05 * torch.randn(B.shape, generator=generator, dtype=F64))
    return policy


def _merge_mistake(got: torch.Tensor, W, A, B, alpha: float, r: int) -> str | None:
    """What went wrong, where the reader's weight is a known wrong merge."""
    delta = B @ A
    candidates = [(W + delta, "no scale: the adapter adds (alpha / r) B A"),
                  (W + alpha * delta, "scaled by alpha: the scale is alpha / r"),
                  (W + r / alpha * delta, "scaled by r / alpha: the scale is alpha / r"),
                  (alpha / r * delta, "the adapter's change alone: the merged weight is W plus it"),
                  (W - alpha / r * delta, "subtracts the adapter's change: the merged weight is W plus it"),
                  (W, "W alone: the adapter's change is missing")]
    if W.shape[0] == W.shape[1]:   # a square layer: a transposed change has W's shape
        candidates.append((W + alpha / r * (A.T @ B.T), "transposed: the change is B A, (out, r) times (r, in), "
                                                        "shaped (out, in) like W"))
    right = W + alpha / r * delta
    for value, words in candidates:
        if value.shape == got.shape and not torch.allclose(value, right, rtol=0, atol=1e-9) \
                and torch.allclose(got.to(F64), value, rtol=0, atol=1e-9):
            return words
    return None


def check_merged_weight(fn: Callable) -> CheckResult:
    """Exercise 11.2: fn(W (out, in), A (r, in), B (out, r), alpha, r) -> the layer's weight with its
    adapter merged, what vLLM loads: compared with lora.named_merged_weights for every adapted
    layer of the tiny policy, for each of MERGE_CASES (B random, as after training; float64)."""
    result = CheckResult("exercise 11.2 the weights vLLM receives")
    for description, keys in MERGE_CASES:
        policy = trained_lora_policy(keys)
        merged = dict(lora.named_merged_weights(policy))
        alpha, r = keys["lora_alpha"], keys["lora_rank"]
        wrong, total = [], 0
        for name, layer in lora.adapter_layers(policy).items():
            total += 1
            W = layer.base_layer.weight.detach()
            A, B = (layer.lora_A[lora.ADAPTER_NAME].weight.detach(), layer.lora_B[lora.ADAPTER_NAME].weight.detach())
            expected = merged[f"{name}.weight"]
            try:
                got = fn(W.clone(), A.clone(), B.clone(), alpha, r)
            except Exception as error:  # the reader's code: report, don't crash
                wrong.append((name, f"raised {type(error).__name__}: {error}"))
                continue
            problem = compare(expected.numpy(), got, 1e-9)
            if problem:
                if isinstance(got, torch.Tensor):
                    problem = _merge_mistake(got.detach(), W, A, B, alpha, r) or problem
                wrong.append((name, problem))
        if not wrong:
            result.record(description, [])
            continue
        name, problem = wrong[0]
        others = f" (and {len(wrong) - 1} more of its {total} adapted layers)" if len(wrong) > 1 else ""
        result.record(description, [f"{name.removeprefix('model.')}{others}: {problem}"])
    return result
