"""The config's rules: the checks of one key that no other module implements, and the rules across
keys and sections, one table (RULES). grpo_edu.config.sections attaches the first to its keys;
TrainConfig runs all of them; each refusal is one line naming the keys."""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Callable

from grpo_edu.algorithm import offpolicy
from grpo_edu.algorithm.surrogates import SURROGATES
from grpo_edu.environment.registry import TASKS, step_verified_tasks
from grpo_edu.environment.rewards import check_overlong_cache
from grpo_edu.runtime.settings import default_of, named
from grpo_edu.sampling.engines import ENGINES, on_this_machine


# --------------------------------------------------------------------------- checks of one key

def import_modules(modules, name: str = "config key 'imports'") -> None:
    """Import each module (config key imports): what it registers (tasks, engines, loss variants)
    is then known to the config. One line names a module that does not import."""
    for module in modules:
        if not isinstance(module, str) or not module:
            raise ValueError(f"{name} must be a list of module names such as 'my_tasks', got {modules!r}")
        if os.getcwd() not in sys.path:   # the console script does not put the working directory there
            sys.path.insert(0, os.getcwd())
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ValueError(f"{name}: cannot import {module!r} ({error}); run from the folder that holds it or add "
                             f"that folder to PYTHONPATH") from error
        except Exception as error:   # the reader's module failed while importing
            raise ValueError(f"{name}: importing {module!r} raised {type(error).__name__}: {error}") from error


def some_reward(rewards, name):
    if not rewards:
        raise ValueError(f"{name} must name at least one reward function")


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


def _changed(config, key: str) -> bool:
    """The key differs from its default."""
    section = config.section_of(key)
    return getattr(section, key) != default_of(type(section), key)


def _default(config, key: str):
    return default_of(type(config.section_of(key)), key)


def _lora_setting_without_lora(key: str) -> Rule:
    """A LoRA setting with lora_rank = 0 would silently do nothing."""
    return Rule((key, "lora_rank"), lambda c: not c.lora.lora_rank and _changed(c, key),
                lambda c: f"config key {key!r} ({getattr(c.lora, key)!r}) configures LoRA adapters, but lora_rank = 0 "
                          f"trains the whole model: set lora_rank >= 1, or {key} = {_default(c, key)!r}")


def _clip_setting_without_clip(key: str) -> Rule:
    """A clip setting with the capped surrogate would silently do nothing."""
    return Rule((key, "surrogate"), lambda c: c.loss.surrogate != "clip" and _changed(c, key),
                lambda c: f"config key {key!r} ({getattr(c.loss, key)!r}) sets the clip range, but surrogate = "
                          f"{c.loss.surrogate!r} has no clip: set surrogate = 'clip', or {key} = {_default(c, key)!r}")


def _not_with_process_supervision(key: str, bad: Callable[..., bool], why: str) -> Rule:
    return Rule(("supervision", key), lambda c: c.advantages.supervision == "process" and bad(c),
                lambda c: f"config keys 'supervision' ('process') and {key!r} ({c.value(key)!r}) do not "
                          f"combine: {why}")


def _surrogate_refuses(config) -> str | None:
    """Why the loss section does not fit its surrogate (grpo_edu.algorithm.surrogates: its check), or None."""
    try:
        SURROGATES[config.loss.surrogate].check(config.loss)
    except ValueError as error:
        return str(error)
    return None


def _inactive_settings(config, kind: str) -> list[tuple[str, str, str]]:
    """(key, kind, its owner) for each key of a registered engine's (kind 'engine') or task's ('task')
    section set to other than its default while config key engine (task) names another: it would
    configure nothing."""
    active = config.run.engine if kind == "engine" else config.run.task
    return [(key, kind, title) for title, section in config.registered.items()
            if (title in ENGINES) == (kind == "engine") and title != active
            for key in section.keys() if _changed(config, key)]


def _overlong_cache_refuses(config) -> str | None:
    try:
        check_overlong_cache(config.loss.overlong_cache, config.rollout.max_completion_length,
                             "config key 'overlong_cache'", allow_off=True)
    except ValueError as error:
        return str(error)
    return None


RULES = (
    # the task and its engine
    *(Rule((kind,), lambda c, kind=kind: bool(_inactive_settings(c, kind)),
           lambda c, kind=kind: "config key {0!r} configures the {1} {2!r}, not {1} = {3!r}, so it would do nothing: "
                                "set {1} to {2!r}, or leave it at its default".format(*_inactive_settings(c, kind)[0],
                                                                                      c.value(kind)))
      for kind in ("engine", "task")),
    # rollout and evaluation
    Rule(("eval_samples", "environment"), lambda c: bool(c.rollout.environment and c.logging.eval_samples),
         lambda c: f"config keys 'eval_samples' ({c.logging.eval_samples}) and 'environment' "
                   f"({c.rollout.environment!r}): sampled evaluation (pass@k) runs single-turn completions; with an "
                   f"environment the held-out greedy episodes are evaluated, set eval_samples = 0"),
    Rule(("num_mini_batches", "prompts_per_step"),
         lambda c: c.rollout.prompts_per_step % c.optimisation.num_mini_batches != 0,
         lambda c: f"config key 'num_mini_batches' ({c.optimisation.num_mini_batches}) must divide prompts_per_step "
                   f"({c.rollout.prompts_per_step}): mini-batches hold whole groups"),
    Rule(("overlong_cache", "max_completion_length"), lambda c: _overlong_cache_refuses(c) is not None,
         lambda c: _overlong_cache_refuses(c)),
    # the surrogate (grpo_edu.algorithm.surrogates)
    Rule(("surrogate", "ratio_cap"), lambda c: _surrogate_refuses(c) is not None,
         lambda c: f"config keys 'surrogate' ({c.loss.surrogate!r}) and 'ratio_cap' ({c.loss.ratio_cap}): "
                   f"{_surrogate_refuses(c)}"),
    _clip_setting_without_clip("epsilon"),
    _clip_setting_without_clip("epsilon_high"),
    # rollouts that lag
    Rule(("rollout_lag", "num_iterations", "num_mini_batches"),
         lambda c: bool(c.off_policy.rollout_lag) and c.optimisation.num_iterations * c.optimisation.num_mini_batches != 1,
         lambda c: f"config key 'rollout_lag' ({c.off_policy.rollout_lag}) needs one optimizer step per rollout, so "
                   f"that the lag counts optimizer steps: num_iterations = num_mini_batches = 1, got num_iterations = "
                   f"{c.optimisation.num_iterations}, num_mini_batches = {c.optimisation.num_mini_batches}"),
    Rule(("rollout_overlap", "rollout_lag"), lambda c: c.off_policy.rollout_overlap and not c.off_policy.rollout_lag,
         lambda c: "config key 'rollout_overlap' is true with rollout_lag = 0: a rollout sampled while the trainer "
                   "updates comes from the policy before that update, so it needs rollout_lag >= 1"),
    Rule(("rollout_overlap", "vllm_sleep_mode"),
         lambda c: c.off_policy.rollout_overlap and c.run.engine == "vllm" and c.vllm.vllm_mode == "colocate"
         and c.vllm.vllm_sleep_mode,
         lambda c: "config key 'rollout_overlap' is true with vllm_sleep_mode = true: a colocated vLLM that samples "
                   "while the trainer updates must stay awake; set vllm_sleep_mode = false"),
    Rule(("rollout_overlap", "sglang_sleep"),
         lambda c: c.off_policy.rollout_overlap and c.run.engine == "sglang" and c.sglang.sglang_sleep,
         lambda c: "config key 'rollout_overlap' is true with sglang_sleep = true: an SGLang server that samples while "
                   "the trainer updates must keep its memory; set sglang_sleep = false"),
    # the SGLang server (grpo_edu.sampling.sglang_engine)
    Rule(("sglang_sleep", "environment"),
         lambda c: c.run.engine == "sglang" and c.sglang.sglang_sleep and bool(c.rollout.environment),
         lambda c: f"config keys 'sglang_sleep' (true) and 'environment' ({c.rollout.environment!r}) do not combine: "
                   f"the server releases its memory after each request, and an episode asks once per turn; set "
                   f"sglang_sleep = false"),
    Rule(("sglang_weight_sync", "sglang_url"),
         lambda c: c.sglang.sglang_weight_sync == "tensor" and not on_this_machine(c.sglang.sglang_url),
         lambda c: f"config key 'sglang_weight_sync' is 'tensor' but sglang_url ({c.sglang.sglang_url!r}) is not on "
                   f"this machine: tensors travel as CUDA IPC handles or shared memory, which reach only a server here "
                   f"(127.0.0.1); set sglang_weight_sync = 'disk'"),
    # the sampler's corrections (grpo_edu.algorithm.offpolicy)
    Rule(("tis_cap", "is_mask"), lambda c: bool(c.off_policy.tis_cap) and c.off_policy.is_mask != "none",
         lambda c: offpolicy.two_corrections(c.off_policy.tis_cap, c.off_policy.is_mask, named)),
    Rule(("tis_cap", "old_logprobs"), lambda c: bool(c.off_policy.tis_cap) and c.off_policy.old_logprobs == "sampler",
         lambda c: "config key 'tis_cap' needs old_logprobs = 'recomputed' or 'proximal': with old_logprobs = "
                   "'sampler' pi_old is the sampler and every weight would be 1 (the clipped ratio already "
                   "carries the mismatch)"),
    Rule(("is_mask", "old_logprobs"), lambda c: c.off_policy.is_mask != "none" and c.off_policy.old_logprobs == "sampler",
         lambda c: f"config key 'is_mask' ({c.off_policy.is_mask!r}) needs old_logprobs = 'recomputed' or "
                   f"'proximal': with old_logprobs = 'sampler' pi_old is the sampler and every ratio is 1"),
    # advantages and the reference
    Rule(("advantage_fn", "advantage_scale", "advantage_std"),
         lambda c: bool(c.advantages.advantage_fn) and (c.advantages.advantage_scale, c.advantages.advantage_std)
         != ("group", "population"),
         lambda c: f"config key 'advantage_scale' / 'advantage_std' ({c.advantages.advantage_scale!r}, "
                   f"{c.advantages.advantage_std!r}) set with advantage_fn = {c.advantages.advantage_fn!r}: they "
                   f"configure the built-in function, which advantage_fn replaces; leave them at their defaults"),
    Rule(("ref_mixup_alpha", "ref_sync_steps", "beta"),
         lambda c: c.loss.ref_mixup_alpha != 1.0 and not (c.loss.ref_sync_steps and c.loss.beta),
         lambda c: f"config key 'ref_mixup_alpha' ({c.loss.ref_mixup_alpha}) moves the reference at each sync, but "
                   f"there is none: ref_sync_steps = {c.loss.ref_sync_steps}, beta = {c.loss.beta} (set ref_sync_steps "
                   f">= 1 and beta > 0, or ref_mixup_alpha = 1)"),
    # LoRA (grpo_edu.policy.lora)
    _lora_setting_without_lora("lora_alpha"),
    _lora_setting_without_lora("lora_target_modules"),
    Rule(("lora_rank", "ref_sync_steps"), lambda c: bool(c.lora.lora_rank and c.loss.ref_sync_steps),
         lambda c: f"config keys 'lora_rank' ({c.lora.lora_rank}) and 'ref_sync_steps' ({c.loss.ref_sync_steps}): "
                   f"with LoRA the reference is the base model (the adapters off), which never trains: there is no "
                   f"copy to re-sync (TRL refuses sync_ref_model with PEFT too); set ref_sync_steps = 0"),
    # process supervision (grpo_edu.environment.process)
    Rule(("supervision", "task"),
         lambda c: c.advantages.supervision == "process" and TASKS[c.run.task].step_verifier is None,
         lambda c: f"config key 'supervision' = 'process' needs a task whose steps a rule checks "
                   f"{step_verified_tasks()}, got task = {c.run.task!r}"),
    _not_with_process_supervision("advantage_fn", lambda c: c.advantages.advantage_fn != "",
                                  "your function maps rewards (B, G) to advantages (B, G); process advantages are "
                                  "per token, from every step's reward"),
    _not_with_process_supervision("advantage_scale", lambda c: c.advantages.advantage_scale == "batch",
                                  "process advantages are normalised per group ('group') or only centred ('none')"),
    _not_with_process_supervision("importance_sampling_level", lambda c: c.loss.importance_sampling_level == "sequence",
                                  "a sequence-level ratio weighs a whole completion, which has no one advantage"),
    _not_with_process_supervision("filter_zero_std_groups", lambda c: c.advantages.filter_zero_std_groups,
                                  "a group whose outcome rewards are equal can still differ in its steps, and it "
                                  "would be dropped"),
    _not_with_process_supervision("dynamic_sampling_rounds", lambda c: c.advantages.dynamic_sampling_rounds != 0,
                                  "it replaces the groups whose outcome rewards are equal, which can still differ "
                                  "in their steps"),
    _not_with_process_supervision("environment", lambda c: c.rollout.environment != "",
                                  "the steps are scored on a single-turn completion's text"),
)
