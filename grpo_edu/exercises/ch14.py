"""Checkers for chapter 14, "A GPU runbook"."""

from __future__ import annotations

import copy
import numbers
from pathlib import Path
from typing import Callable

import torch

from grpo_edu.exercises.ch11 import ALL_SEVEN, TINY, adapter_parameters, base_model
from grpo_edu.exercises.checking import CheckResult, compare
from grpo_edu.policy.models import policy_source
from grpo_edu.runtime.distributed import World
from grpo_edu.training.checkpoint import KEEP
from grpo_edu.config import TrainConfig
from grpo_edu.training.plan import Plan, plan_mini_batches
from grpo_edu.training.plan import optimizer_steps_per_rollout


def _number(value):
    """A 0-dimensional tensor or array as its number; anything else as it is."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    return value


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_dict(got, keys, what: str) -> tuple[dict | None, list[str]]:
    """The reader's dict with its numbers, or None and what is wrong with its form."""
    if not isinstance(got, dict):
        return None, [f"returned {type(got).__name__}, not a dict of {', '.join(keys)}"]
    problems = []
    missing = [key for key in keys if got.get(key) is None]
    if missing:
        problems.append(f"no number for {', '.join(missing)}")
    unknown = sorted(str(key) for key in set(got) - set(keys))
    if unknown:
        problems.append(f"unknown keys {unknown} ({what})")
    return {key: _number(got[key]) for key in keys if key not in missing}, problems


# --------------------------------------------------------------------------- 13.1

DISK_PARTS = ("sampler_init", "checkpoints", "model")

# (model, config keys): none of them a row of the chapter's table (full fine-tuning with beta > 0,
# a colocated vLLM engine, a hub id, KEEP checkpoints).
DISK_CASES = [
    ("Qwen2.5-0.5B", dict(model="Qwen/Qwen2.5-0.5B-Instruct", engine="vllm", beta=0.0, steps=1000,
                          checkpoint_every=100)),
    ("Qwen2.5-1.5B", dict(model="Qwen/Qwen2.5-1.5B-Instruct", engine="vllm", lora_rank=16, lora_alpha=32.0,
                          steps=500, checkpoint_every=100)),
    ("Qwen2.5-7B", dict(model="Qwen/Qwen2.5-7B-Instruct", engine="hf", lora_rank=8, lora_alpha=16.0,
                        lora_target_modules=["q_proj", "v_proj"], steps=300, checkpoint_every=500)),
    (TINY, dict(model="start", engine="vllm", beta=0.04, steps=150, checkpoint_every=50)),
    ("Qwen2.5-1.5B", dict(model="Qwen/Qwen2.5-1.5B-Instruct", engine="vllm", vllm_mode="server", beta=0.04,
                          steps=200, checkpoint_every=0)),
    ("Qwen2.5-7B", dict(model="Qwen/Qwen2.5-7B-Instruct", engine="vllm", lora_rank=64, lora_alpha=128.0,
                        steps=450, checkpoint_every=200)),
]


def starts_from_folder(config: TrainConfig) -> bool:
    """config.run.model is a folder on disk: a committed policy's name ('start') or a path. Anything
    else is a hub id (grpo_edu.policy.models.load_policy's rule)."""
    return Path(policy_source(config.run.model)).expanduser().exists() or str(config.run.model).startswith((".", "/", "~"))


def writes_sampler_init(config: TrainConfig) -> bool:
    """vllm_engine.sampler_model_path's rule: a colocated vLLM engine is built from config.run.model's
    folder when that is one; from a hub id it needs the policy saved once into sampler_init/.
    A vLLM server loads its model itself, and the fused and hf engines sample with the policy."""
    return config.run.engine == "vllm" and config.vllm.vllm_mode == "colocate" and not starts_from_folder(config)


def checkpoints_written(config: TrainConfig) -> int:
    """The checkpoints a finished run writes (trainer.loop): one every checkpoint_every steps, and
    one at the last step (0 = only there)."""
    every = config.logging.checkpoint_every
    return len({config.optimisation.steps} | (set(range(every, config.optimisation.steps + 1, every)) if every else set()))


def checkpoints_kept(config: TrainConfig) -> int:
    """Of those, the run directory keeps the newest KEEP (checkpoint._prune)."""
    return min(KEEP, checkpoints_written(config))


def checkpoint_bytes(model: torch.nn.Module, config: TrainConfig, adapters: int | None = None) -> int:
    """One checkpoint's tensors (checkpoint.save_checkpoint): the policy's trained weights (with
    LoRA its adapters only: the base is config.run.model, loaded again), the reference's weights
    (full fine-tuning with beta > 0) and AdamW's two moments of each trained parameter; all
    float32. `adapters`: the adapter parameters, when already counted (ch11.adapter_parameters)."""
    P = sum(p.numel() for p in model.parameters())
    if config.lora.lora_rank:
        trained = adapter_parameters(model, config) if adapters is None else adapters
        reference = 0
    else:
        trained, reference = P, (P if config.loss.beta > 0 else 0)
    return 4 * trained + 4 * reference + 8 * trained


def run_disk_bytes(model: torch.nn.Module, config: TrainConfig, adapters: int | None = None) -> dict[str, int]:
    """The tensors' bytes a finished run leaves in its run directory, by folder: sampler_init/
    (the float32 policy, where writes_sampler_init), checkpoints/ (checkpoints_kept of
    checkpoint_bytes) and model/ (the float32 policy, LoRA's adapters merged). Leaves out the
    configs, tokenizer files, RNG states, metrics and file headers (a few MB at most), and the
    download cache."""
    P = sum(p.numel() for p in model.parameters())   # a tied embedding counts once
    return {"sampler_init": 4 * P if writes_sampler_init(config) else 0,
            "checkpoints": checkpoints_kept(config) * checkpoint_bytes(model, config, adapters),
            "model": 4 * P}


def _disk_mistakes(part: str, model, config: TrainConfig, adapters: int) -> list[tuple[float, str]]:
    """(bytes, what went wrong): the answers of known mistakes for one folder of one case."""
    P = sum(p.numel() for p in model.parameters())
    tied = model.get_input_embeddings().weight.numel() if model.config.tie_word_embeddings else 0
    tied_twice = ("counts the tied embedding twice (the input and output embeddings are one tensor; "
                  "model.parameters() gives it once)")
    if part == "sampler_init":
        if writes_sampler_init(config):
            return [(0, "missing: a colocated vLLM engine that starts from a hub id is built from the policy saved "
                        "once into sampler_init/"),
                    (2 * P, "bf16: sampler_init/ holds the trainer's float32 policy, 4 bytes a parameter"),
                    (4 * (P + tied), tied_twice)]
        if config.run.engine != "vllm":
            why = f"engine = {config.run.engine!r} samples with the policy itself: only a vLLM engine needs sampler_init/"
        elif config.vllm.vllm_mode != "colocate":
            why = "a vLLM server loads its model itself: the trainer writes no sampler_init/"
        else:
            why = "config.run.model is a folder on disk: vLLM starts from it, and no sampler_init/ is written"
        return [(value, why) for value in (4 * P, 2 * P, 4 * (P + tied))]
    if part == "model":
        mistakes = [(2 * P, "bf16: model/ holds the float32 policy, 4 bytes a parameter"),
                    (4 * (P + tied), tied_twice),
                    (16 * P, "model/ holds the weights alone, not AdamW's moments"),
                    (20 * P, "model/ holds the weights alone, not a checkpoint's reference and moments")]
        if config.lora.lora_rank:
            mistakes += [(4 * adapters, "the adapters alone: model/ is the whole model, each adapter merged into "
                                        "its layer"),
                         (4 * (P + adapters), "the adapters beside the base: model/ merges each into its layer's "
                                              "weight, so it holds the base's parameters only")]
        return mistakes
    # checkpoints: a wrong count, a wrong checkpoint, or both
    right_count, written = checkpoints_kept(config), checkpoints_written(config)
    counts = [(right_count, "")]
    if written > KEEP:
        counts.append((written, f"counts every checkpoint the run writes; it keeps only the newest {KEEP}"))
    if right_count != KEEP:
        counts.append((KEEP, f"counts {KEEP} checkpoints; this run writes fewer (one every checkpoint_every steps "
                             f"and one at the last step)"))
    if right_count > 1:
        counts.append((1, f"counts one checkpoint; the run keeps the newest {KEEP}"))
    trained = adapters if config.lora.lora_rank else P
    reference = P if (config.loss.beta > 0 and not config.lora.lora_rank) else 0
    right = 12 * trained + 4 * reference
    each = [(right, "")]
    if config.lora.lora_rank:
        each += [(12 * P, "the whole policy: with LoRA a checkpoint holds the adapters only (the base is "
                          "config.run.model, loaded again), and AdamW's moments of the adapters"),
                 (16 * P, "the whole policy and a reference: with LoRA a checkpoint holds the adapters and their "
                          "AdamW moments only"),
                 (12 * adapters + 4 * P, "a reference: with LoRA the reference is the base with its adapters off, "
                                         "and is not saved"),
                 (4 * P + 12 * adapters, "the frozen base too: it is config.run.model, loaded again on resume")]
        each += [(16 * adapters, "gradients: a checkpoint holds the adapters' weights and AdamW's two moments, no "
                                 "gradients")]
    else:
        if reference:
            each.append((12 * P, "no reference: with beta > 0 a checkpoint holds the reference's weights too"))
        else:
            each.append((16 * P, "a reference with beta = 0: the trainer builds none, so none is saved"))
        each += [(16 * trained + 4 * reference, "gradients: a checkpoint holds weights and AdamW's two moments, "
                                                "no gradients"),
                 (8 * trained + 4 * reference, "one AdamW moment short: AdamW keeps two, 4 bytes each"),
                 (4 * trained + 4 * reference, "no AdamW moments: a checkpoint holds both, to resume bit for bit"),
                 (6 * trained + 2 * reference, "2 bytes a parameter (bf16): a checkpoint's tensors are float32"),
                 (12 * (P + tied) + (4 * (P + tied) if reference else 0), tied_twice)]
    mistakes = []
    for count, count_words in counts:
        for size, size_words in each:
            words = "; ".join(w for w in (count_words, size_words) if w)
            if words:
                mistakes.append((count * size, words))
    return mistakes


def _describe_run(name: str, config: TrainConfig) -> str:
    if config.lora.lora_rank:
        modules = ("all seven projections" if list(config.lora.lora_target_modules) == list(ALL_SEVEN)
                   else " and ".join(config.lora.lora_target_modules))
        how = f"LoRA r = {config.lora.lora_rank} on {modules}"
    else:
        how = f"full fine-tuning, beta {config.loss.beta}"
    engine = f"engine {config.run.engine!r}" + (f" ({config.vllm.vllm_mode})" if config.run.engine == "vllm" else "")
    return (f"{name} from {config.run.model!r}, {how}, {engine}, {config.optimisation.steps} steps, "
            f"checkpoint_every {config.logging.checkpoint_every}")


def check_run_disk(fn: Callable[[torch.nn.Module, TrainConfig], dict]) -> CheckResult:
    """Exercise 14.1: fn(model, config) -> {"sampler_init": bytes, "checkpoints": bytes, "model":
    bytes}, the tensors' bytes a finished run leaves in each folder of its run directory
    (run_disk_bytes), for `model` (a plain model on the meta device) trained as `config` says.
    Within one byte per folder."""
    result = CheckResult("exercise 14.1 what a run leaves on disk")
    for name, keys in DISK_CASES:
        config, model = TrainConfig(**keys), base_model(name)
        case = _describe_run(name, config)
        adapters = adapter_parameters(model, config) if config.lora.lora_rank else 0
        expected = run_disk_bytes(model, config, adapters)
        try:
            got = fn(copy.deepcopy(model), config)
        except Exception as error:  # the reader's code: report, don't crash
            result.record_raised(case, error)
            continue
        values, problems = _check_dict(got, DISK_PARTS, "one number per folder")
        for part, value in (values or {}).items():
            problem = compare(expected[part], value, 1.0)
            if problem and _is_number(value):
                problem = next((words for wrong, words in _disk_mistakes(part, model, config, adapters)
                                if abs(value - wrong) <= 1 and abs(wrong - expected[part]) > 1), problem)
            if problem:
                problems.append(f"{part}: {problem}")
        result.record(case, problems)
    return result


# --------------------------------------------------------------------------- 13.2

ROLLOUT_KEYS = {
    "prompts_per_engine": "the prompts one GPU's engine samples per rollout",
    "completions_per_engine": "the completions one GPU's engine samples per rollout",
    "completion_tokens_per_engine": "the most completion tokens one engine samples per rollout (every completion "
                                    "at max_completion_length)",
    "optimizer_steps_per_rollout": "the optimizer steps one rollout feeds, while the engines sleep",
    "micro_batches_per_optimizer_step": "the forward-and-backward passes each GPU runs in one optimizer step",
}

# (description, config keys, GPUs): none of them a row of the chapter's table. In each, every GPU
# holds as many prompts of every mini-batch.
ROLLOUT_CASES = [
    ("h100-8x's batch on 4 GPUs", dict(prompts_per_step=512, num_generations=8, max_completion_length=16,
                                      num_mini_batches=1, micro_batch_size=128), 4),
    ("qwen2.5-0.5b-gsm8k-8x's batch on 2 GPUs", dict(prompts_per_step=256, num_generations=8,
                                                    max_completion_length=512, num_mini_batches=2,
                                                    micro_batch_size=16), 2),
    ("qwen2.5-0.5b-countdown-1x's batch on 1 GPU", dict(prompts_per_step=32, num_generations=8,
                                                       max_completion_length=512, num_mini_batches=2,
                                                       micro_batch_size=16), 1),
    ("gpu-1x's batch, two passes over each rollout, on 2 GPUs", dict(prompts_per_step=64, num_generations=8,
                                                                    max_completion_length=16, num_iterations=2,
                                                                    num_mini_batches=4, micro_batch_size=128), 2),
    ("DeepSeek-R1's shape (16 mini-batches of 32 prompts x 16) on 16 GPUs",
     dict(prompts_per_step=512, num_generations=16, max_completion_length=1024, num_mini_batches=16,
          micro_batch_size=8), 16),
    ("B = 96, G = 12 in 3 mini-batches, micro-batches of 10, on 4 GPUs",
     dict(prompts_per_step=96, num_generations=12, max_completion_length=256, num_mini_batches=3,
          micro_batch_size=10), 4),
]


def rollout_numbers(config: TrainConfig, gpus: int) -> dict[str, int]:
    """The worked answers of exercise 14.2: what one rollout of `config` is on `gpus` GPUs, one
    vLLM engine each (ROLLOUT_KEYS), from the library's own rules: each GPU's share of the
    prompts (World.shard), K = optimizer_steps_per_rollout, and the micro-batches
    update.micro_batches runs (the mini-batches plan_mini_batches deals out, every group with
    signal; each GPU runs as many as the GPU with the most rows, in the busiest optimizer step)."""
    B, G = config.rollout.prompts_per_step, config.rollout.num_generations
    share = World(rank=0, size=gpus).shard(B)
    prompts = share.stop - share.start
    rewards = torch.arange(G, dtype=torch.float64).repeat(B, 1)   # no all-equal group: every group trains
    lengths = torch.full((B, G), config.rollout.max_completion_length)
    plan = Plan(rewards=rewards, components={}, advantages=rewards.float(), lengths=lengths,
                finished=torch.ones(B, G, dtype=torch.bool), mini_batches=plan_mini_batches(config, rewards),
                owned=share, group_size=G)
    most = max(-(-plan.rows_on_rank(k, rank) // config.optimisation.micro_batch_size)
               for k in range(config.optimisation.num_mini_batches) for rank in range(gpus))
    return {"prompts_per_engine": prompts, "completions_per_engine": prompts * G,
            "completion_tokens_per_engine": prompts * G * config.rollout.max_completion_length,
            "optimizer_steps_per_rollout": optimizer_steps_per_rollout(config),
            "micro_batches_per_optimizer_step": most}


def _rollout_mistake(key: str, got: float, config: TrainConfig, gpus: int) -> str | None:
    """What went wrong, where the reader's number is a known mistake's."""
    B, G, L, N = config.rollout.prompts_per_step, config.rollout.num_generations, config.rollout.max_completion_length, gpus
    M, I, size = config.optimisation.num_mini_batches, config.optimisation.num_iterations, config.optimisation.micro_batch_size
    per_gpu = B // N * G
    candidates = {
        "prompts_per_engine": [(B, "the whole step's prompts: each GPU's engine samples its share")],
        "completions_per_engine": [(B // N, "counts prompts, not their G completions each"),
                                   (B * G, "the whole step's completions: each GPU's engine samples its share")],
        "completion_tokens_per_engine": [(per_gpu, "counts completions, not their tokens"),
                                         (B * G * L, "the whole step's tokens: each GPU's engine samples its share"),
                                         (B // N * L, "counts one completion per prompt, not G")],
        "optimizer_steps_per_rollout": [(value, "every pass over the rollout (num_iterations) takes num_mini_batches "
                                                "steps") for value in (I, M, I + M)],
        "micro_batches_per_optimizer_step": [
            (-(-B * G // M // size), "a whole mini-batch's micro-batches: each GPU holds its share of the "
                                     "mini-batch"),
            (-(-per_gpu // size), "the micro-batches of the GPU's whole rollout: one optimizer step takes one "
                                  "mini-batch"),
            (per_gpu // M // size, "rounded down: a last, smaller micro-batch runs too"),
            (-(-per_gpu // M // size) * I, "counts every pass: one optimizer step takes one mini-batch, once")],
    }[key]
    right = rollout_numbers(config, gpus)[key]
    return next((words for value, words in candidates if got == value and value != right), None)


def check_rollout_numbers(fn: Callable[[TrainConfig, int], dict]) -> CheckResult:
    """Exercise 14.2: fn(config, gpus) -> {key: number} for each key of ROLLOUT_KEYS
    (rollout_numbers), for each of ROLLOUT_CASES. A wrong number is named, with what went wrong
    where the mistake is a known one, never with the right number."""
    result = CheckResult("exercise 14.2 a rollout on N GPUs")
    for description, keys, gpus in ROLLOUT_CASES:
        config = TrainConfig(**keys)
        expected = rollout_numbers(config, gpus)
        try:
            got = fn(config, gpus)
        except Exception as error:  # the reader's code: report, don't crash
            result.record_raised(description, error)
            continue
        values, problems = _check_dict(got, list(ROLLOUT_KEYS), "see ch14.ROLLOUT_KEYS")
        for key, value in (values or {}).items():
            problem = compare(expected[key], value, 0.0)
            if problem and _is_number(value):
                problem = _rollout_mistake(key, value, config, gpus) or problem
            if problem:
                problems.append(f"{key}: {problem}")
        result.record(description, problems)
    return result
