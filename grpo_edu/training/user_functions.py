"""The reader's own functions in real runs: config keys that name them by import path.

    advantage_fn = "my_solutions:group_advantages"      # rewards (B, G) -> advantages (B, G)

    [rewards]                                           # weights; a name with ":" is imported
    accuracy = 1.0
    "my_solutions:length_penalty" = 0.1                 # TRL's signature: (completions, **columns)

A name is "module:function", the module found as `import module` finds it, from the working
directory or PYTHONPATH (so `grpo-edu train` and `torchrun -m grpo_edu train` started in the
folder that holds my_solutions.py both find it), or "path/to/file.py:function". Every rank
imports it itself (the config is all a rank is given), and the trainer checks each one at
start-up on a probe batch, so that a wrong shape, a NaN or a crash is one line naming the
function and what it returned, before the first rollout rather than in the middle of a run.

`functions_from_config` gives the run's advantage and reward functions, as a config names
them: grpo_edu.environment.rewards' by name, the reader's by import path.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import math
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

import torch

from grpo_edu.environment import rewards, tasks
from grpo_edu.algorithm.advantages import group_advantages
from grpo_edu.config import TrainConfig

AdvantageFn = Callable[[torch.Tensor], torch.Tensor]          # rewards (B, G) -> advantages (B, G)
RewardFn = Callable[..., Sequence[float]]                      # TRL's signature


def is_import_path(name: str) -> bool:
    return ":" in name


def resolve(spec: str, key: str) -> Callable:
    """"module:function" or "file.py:function" -> the function (config key `key` in errors)."""
    module_name, _, attribute = spec.rpartition(":")
    if not module_name or not attribute:
        raise ValueError(f"config key {key!r}: expected 'module:function' or 'path/file.py:function', got {spec!r}")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).expanduser().resolve()
            if not path.is_file():
                raise ValueError(f"config key {key!r}: {spec!r} names the file {str(path)!r}, which does not exist")
            loader = importlib.util.spec_from_file_location(f"grpo_edu_user_{path.stem}", path)
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:   # the console script does not put the working directory there
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except ValueError:
        raise
    except ImportError as error:
        raise ValueError(f"config key {key!r}: cannot import {module_name!r} for {spec!r} ({error}); run from "
                         f"the folder that holds it or add that folder to PYTHONPATH") from error
    except Exception as error:   # the reader's module failed while importing
        raise ValueError(f"config key {key!r}: importing {module_name!r} raised {type(error).__name__}: "
                         f"{error}") from error
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ValueError(f"config key {key!r}: {module_name!r} has no function {attribute!r} "
                         f"(got {type(function).__name__})")
    return function


def probe_rewards(B: int, G: int) -> torch.Tensor:
    """A (B, G) reward matrix for the probe: 0/1 correctness with format bonuses, groups that
    disagree, and group 0 all equal (the case that divides by a zero std)."""
    values = torch.tensor([0.0, 1.0, 0.5, 1.5])
    rewards = values[(torch.arange(B * G) * 7 % 4)].view(B, G).double()
    rewards[0] = 1.0
    return rewards


def check_advantage_fn(function: Callable, spec: str, B: int, G: int) -> None:
    """The function maps the probe's rewards (B, G) to a finite (B, G) tensor."""
    rewards = probe_rewards(B, G)
    try:
        advantages = function(rewards.clone())
    except Exception as error:
        raise ValueError(f"config key 'advantage_fn': {spec} raised {type(error).__name__}: {error} on rewards "
                         f"(B, G) = ({B}, {G})") from error
    if not isinstance(advantages, torch.Tensor) or tuple(advantages.shape) != (B, G):
        got = tuple(advantages.shape) if isinstance(advantages, torch.Tensor) else type(advantages).__name__
        raise ValueError(f"config key 'advantage_fn': {spec} must map rewards (B, G) = ({B}, {G}) to a tensor "
                         f"of the same shape, got {got}")
    bad = ~torch.isfinite(advantages)
    if bad.any():
        b, g = (int(i) for i in bad.nonzero()[0])
        why = " (its rewards are all equal: a zero std)" if b == 0 else ""
        raise ValueError(f"config key 'advantage_fn': {spec} returned {advantages[b, g].item()} for prompt {b}"
                         f"{why}, completion {g}; advantages must be finite")


def check_reward_fn(function: Callable, name: str, samples: list[dict]) -> None:
    """The function scores probe completions of the task's own prompts (one right answer,
    one empty, one garbled) with TRL's signature: a finite float per completion."""
    if not any(p.kind is p.VAR_KEYWORD for p in inspect.signature(function).parameters.values()):
        raise ValueError(f"config key 'rewards': {name} must take (completions, **kwargs), TRL's signature (the "
                         f"dataset columns arrive as keyword arguments), got {inspect.signature(function)}")
    completions = [f"<think>{s['answer']}</think> \\boxed{{{s['answer']}}}" for s in samples[:1]] + ["", "#\\boxed{"]
    rows = [samples[i % len(samples)] for i in range(len(completions))]
    columns = {key: [row.get(key) for row in rows] for key in rows[0] if key != "prompt"}
    try:
        values = list(function(completions, **columns))
    except Exception as error:
        raise ValueError(f"config key 'rewards': {name} raised {type(error).__name__}: {error} on "
                         f"{len(completions)} probe completions") from error
    bad = [v for v in values if not isinstance(v, (int, float)) or not math.isfinite(v)]
    if len(values) != len(completions) or bad:
        raise ValueError(f"config key 'rewards': {name} must return one finite float per completion, got {values!r} "
                         f"for {len(completions)} completions")


# --------------------------------------------------------------------------- a run's functions

def reward_functions_from_config(weights: dict[str, float], unboxed_answers: bool = False
                                 ) -> dict[str, tuple[RewardFn, float]]:
    """{name: weight} -> {name: (function, weight)}: grpo_edu.environment.rewards' functions by name, and
    the reader's own by import path ("module:function").
    unboxed_answers: the accuracy reward also reads "The answer is 18." (config key)."""
    known = dict(rewards.REWARD_FUNCTIONS)
    if unboxed_answers:
        known["accuracy"] = functools.partial(rewards.accuracy_reward, unboxed=True)
    unknown = sorted(name for name in weights if name not in known and not is_import_path(name))
    if unknown:
        raise ValueError(f"config key 'rewards' names unknown reward functions {unknown}; known: {sorted(known)}, "
                         f"or 'module:function' for your own")
    return {name: (known[name] if name in known else resolve(name, "rewards"), float(weight))
            for name, weight in weights.items()}


def functions_from_config(config: TrainConfig) -> tuple[AdvantageFn, dict[str, tuple[RewardFn, float]]]:
    """The run's advantage and reward functions, as the config names them, each checked on a
    probe batch (a one-line error naming a function that fails)."""
    advantages, task = config.advantages, tasks.TASKS[config.run.task]
    if advantages.advantage_fn:
        advantage_fn = resolve(advantages.advantage_fn, "advantage_fn")
        check_advantage_fn(advantage_fn, advantages.advantage_fn, config.rollout.prompts_per_step,
                           config.rollout.num_generations)
    else:
        advantage_fn = lambda r: group_advantages(r, scale=advantages.advantage_scale, std=advantages.advantage_std)
    reward_functions = reward_functions_from_config(config.run.rewards, config.run.unboxed_answers)
    samples = (tasks.make_dataset(task.name, n=3, split="train", seed=0) if task.generated else [task.example])
    for name, (function, _) in reward_functions.items():
        if is_import_path(name):
            check_reward_fn(function, name, samples)
    return advantage_fn, reward_functions
