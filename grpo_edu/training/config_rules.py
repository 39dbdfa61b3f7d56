"""The config's rules: how one key is checked, the checks of one key that no other module
implements, and the rules across keys, one table (RULES). grpo_edu.training.config attaches the
first two to its keys and runs all of them on every TrainConfig; each refusal is one line
naming the keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from grpo_edu.algorithm import offpolicy
from grpo_edu.environment import process
from grpo_edu.sampling import sglang_engine


def named(key: str) -> str:
    return f"config key {key!r}"


def check_key(key: str, value, rules) -> None:
    """The rules of one key (its field's metadata), one line per refusal."""
    if rules.get("choices") is not None and value not in rules["choices"]:
        raise ValueError(f"{named(key)} must be one of {tuple(rules['choices'])}, got {value!r}")
    for rule, holds, symbol in (("at_least", lambda v, b: v >= b, ">="), ("above", lambda v, b: v > b, ">")):
        if rules.get(rule) is None:
            continue
        bound, why = rules[rule] if isinstance(rules[rule], tuple) else (rules[rule], "")
        if not holds(value, bound):
            raise ValueError(f"{named(key)} must be {symbol} {bound}{f' ({why})' if why else ''}, got {value}")
    if rules.get("check") is not None:
        rules["check"](value, named(key))


# Checks of one key that no other module implements (config.py attaches each to its key).

def some_reward(rewards, name):
    if not rewards:
        raise ValueError(f"{name} must name at least one reward function")


def fraction_open(value, name):
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {value}")


def fraction_half_open(value, name):
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{name} must be in (0, 1] (1 = a hard copy), got {value}")


def pair(value, name):
    if len(value) != 2:
        raise ValueError(f"{name} must be [beta1, beta2], got {value}")


def import_path(value, name):
    if value and not (value.count(":") == 1 and all(value.split(":"))):
        raise ValueError(f"{name} must be 'module:Class' (or '' for single-turn completions), got {value!r}")


def layer_names(targets, name):
    if (not targets or not all(isinstance(t, str) and t and "." not in t for t in targets)
            or len(set(targets)) != len(targets)):
        raise ValueError(f"{name} must be a list of distinct linear layer names such as 'q_proj' (no dots), "
                         f"got {targets!r}")


# --------------------------------------------------------------------------- rules across keys

@dataclass(frozen=True)
class Rule:
    """A rule across keys: the keys it reads, when a config breaks it, and the one line that says so."""

    keys: tuple[str, ...]
    broken: Callable[..., bool]
    message: Callable[..., str]


def default(config, key: str):
    """The key's default value."""
    spec = type(config).__dataclass_fields__[key]
    return spec.default_factory() if callable(spec.default_factory) else spec.default


def _lora_setting_without_lora(key: str) -> Rule:
    """A LoRA setting with lora_rank = 0 would silently do nothing."""
    return Rule((key, "lora_rank"), lambda c: not c.lora_rank and getattr(c, key) != default(c, key),
                lambda c: f"config key {key!r} ({getattr(c, key)!r}) configures LoRA adapters, but lora_rank = 0 "
                          f"trains the whole model: set lora_rank >= 1, or {key} = {default(c, key)!r}")


def _not_with_process_supervision(key: str, bad: Callable[..., bool], why: str) -> Rule:
    return Rule(("supervision", key), lambda c: c.supervision == "process" and bad(c),
                lambda c: f"config keys 'supervision' ('process') and {key!r} ({getattr(c, key)!r}) do not "
                          f"combine: {why}")


RULES = (
    # rollout and evaluation
    Rule(("eval_samples", "environment"), lambda c: bool(c.environment and c.eval_samples),
         lambda c: f"config keys 'eval_samples' ({c.eval_samples}) and 'environment' ({c.environment!r}): sampled "
                   f"evaluation (pass@k) runs single-turn completions; with an environment the held-out greedy "
                   f"episodes are evaluated, set eval_samples = 0"),
    Rule(("num_mini_batches", "prompts_per_step"), lambda c: c.prompts_per_step % c.num_mini_batches != 0,
         lambda c: f"config key 'num_mini_batches' ({c.num_mini_batches}) must divide prompts_per_step "
                   f"({c.prompts_per_step}): mini-batches hold whole groups"),
    Rule(("overlong_cache", "max_completion_length"), lambda c: not 0 <= c.overlong_cache < c.max_completion_length,
         lambda c: f"config key 'overlong_cache' must be in [0, max_completion_length = {c.max_completion_length}) "
                   f"(the stretch before the limit where the punishment falls from 0 to -1; 0 = off), got "
                   f"{c.overlong_cache}"),
    # rollouts that lag
    Rule(("rollout_lag", "num_iterations", "num_mini_batches"),
         lambda c: bool(c.rollout_lag) and c.num_iterations * c.num_mini_batches != 1,
         lambda c: f"config key 'rollout_lag' ({c.rollout_lag}) needs one optimizer step per rollout, so that the "
                   f"lag counts optimizer steps: num_iterations = num_mini_batches = 1, got num_iterations = "
                   f"{c.num_iterations}, num_mini_batches = {c.num_mini_batches}"),
    Rule(("rollout_overlap", "rollout_lag"), lambda c: c.rollout_overlap and not c.rollout_lag,
         lambda c: "config key 'rollout_overlap' is true with rollout_lag = 0: a rollout sampled while the trainer "
                   "updates comes from the policy before that update, so it needs rollout_lag >= 1"),
    Rule(("rollout_overlap", "vllm_sleep_mode"),
         lambda c: c.rollout_overlap and c.engine == "vllm" and c.vllm_mode == "colocate" and c.vllm_sleep_mode,
         lambda c: "config key 'rollout_overlap' is true with vllm_sleep_mode = true: a colocated vLLM that samples "
                   "while the trainer updates must stay awake; set vllm_sleep_mode = false"),
    Rule(("rollout_overlap", "sglang_sleep"),
         lambda c: c.rollout_overlap and c.engine == "sglang" and c.sglang_sleep,
         lambda c: "config key 'rollout_overlap' is true with sglang_sleep = true: an SGLang server that samples while "
                   "the trainer updates must keep its memory; set sglang_sleep = false"),
    # the SGLang server (grpo_edu.sampling.sglang_engine)
    Rule(("sglang_sleep", "environment"), lambda c: c.engine == "sglang" and c.sglang_sleep and bool(c.environment),
         lambda c: f"config keys 'sglang_sleep' (true) and 'environment' ({c.environment!r}) do not combine: the server "
                   f"releases its memory after each request, and an episode asks once per turn; set sglang_sleep = "
                   f"false"),
    Rule(("sglang_weight_sync", "sglang_url"),
         lambda c: c.sglang_weight_sync == "tensor" and not sglang_engine.on_this_machine(c.sglang_url),
         lambda c: f"config key 'sglang_weight_sync' is 'tensor' but sglang_url ({c.sglang_url!r}) is not on this "
                   f"machine: tensors travel as CUDA IPC handles or shared memory, which reach only a server here "
                   f"(127.0.0.1); set sglang_weight_sync = 'disk'"),
    # the sampler's corrections (grpo_edu.algorithm.offpolicy)
    Rule(("tis_cap", "is_mask"), lambda c: bool(c.tis_cap) and c.is_mask != "none",
         lambda c: offpolicy.two_corrections(c.tis_cap, c.is_mask, named)),
    Rule(("tis_cap", "old_logprobs"), lambda c: bool(c.tis_cap) and c.old_logprobs == "sampler",
         lambda c: "config key 'tis_cap' needs old_logprobs = 'recomputed' or 'proximal': with old_logprobs = "
                   "'sampler' pi_old is the sampler and every weight would be 1 (the clipped ratio already "
                   "carries the mismatch)"),
    Rule(("is_mask", "old_logprobs"), lambda c: c.is_mask != "none" and c.old_logprobs == "sampler",
         lambda c: f"config key 'is_mask' ({c.is_mask!r}) needs old_logprobs = 'recomputed' or 'proximal': with "
                   f"old_logprobs = 'sampler' pi_old is the sampler and every ratio is 1"),
    # advantages and the reference
    Rule(("advantage_fn", "advantage_scale", "advantage_std"),
         lambda c: bool(c.advantage_fn) and (c.advantage_scale, c.advantage_std) != ("group", "population"),
         lambda c: f"config key 'advantage_scale' / 'advantage_std' ({c.advantage_scale!r}, {c.advantage_std!r}) "
                   f"set with advantage_fn = {c.advantage_fn!r}: they configure the built-in function, which "
                   f"advantage_fn replaces; leave them at their defaults"),
    Rule(("ref_mixup_alpha", "ref_sync_steps", "beta"),
         lambda c: c.ref_mixup_alpha != 1.0 and not (c.ref_sync_steps and c.beta),
         lambda c: f"config key 'ref_mixup_alpha' ({c.ref_mixup_alpha}) moves the reference at each sync, but "
                   f"there is none: ref_sync_steps = {c.ref_sync_steps}, beta = {c.beta} (set ref_sync_steps >= 1 "
                   f"and beta > 0, or ref_mixup_alpha = 1)"),
    # LoRA (grpo_edu.policy.lora)
    _lora_setting_without_lora("lora_alpha"),
    _lora_setting_without_lora("lora_target_modules"),
    Rule(("lora_rank", "ref_sync_steps"), lambda c: bool(c.lora_rank and c.ref_sync_steps),
         lambda c: f"config keys 'lora_rank' ({c.lora_rank}) and 'ref_sync_steps' ({c.ref_sync_steps}): with LoRA "
                   f"the reference is the base model (the adapters off), which never trains: there is no copy to "
                   f"re-sync (TRL refuses sync_ref_model with PEFT too); set ref_sync_steps = 0"),
    # process supervision (grpo_edu.environment.process)
    Rule(("supervision", "task"), lambda c: c.supervision == "process" and c.task not in process.STEP_VERIFIERS,
         lambda c: f"config key 'supervision' = 'process' needs a task whose steps a rule checks "
                   f"{tuple(process.STEP_VERIFIERS)}, got task = {c.task!r}"),
    _not_with_process_supervision("advantage_fn", lambda c: c.advantage_fn != "",
                                  "your function maps rewards (B, G) to advantages (B, G); process advantages are "
                                  "per token, from every step's reward"),
    _not_with_process_supervision("advantage_scale", lambda c: c.advantage_scale == "batch",
                                  "process advantages are normalised per group ('group') or only centred ('none')"),
    _not_with_process_supervision("importance_sampling_level", lambda c: c.importance_sampling_level == "sequence",
                                  "a sequence-level ratio weighs a whole completion, which has no one advantage"),
    _not_with_process_supervision("filter_zero_std_groups", lambda c: c.filter_zero_std_groups,
                                  "a group whose outcome rewards are equal can still differ in its steps, and it "
                                  "would be dropped"),
    _not_with_process_supervision("dynamic_sampling_rounds", lambda c: c.dynamic_sampling_rounds != 0,
                                  "it replaces the groups whose outcome rewards are equal, which can still differ "
                                  "in their steps"),
    _not_with_process_supervision("environment", lambda c: c.environment != "",
                                  "the steps are scored on a single-turn completion's text"),
)
