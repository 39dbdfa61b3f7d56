"""The config's keys by name: which section holds each, its field (doc and rules) and its type.

    SECTIONS        the sections every config has, by attribute (= TOML table; the run is the
                    file's top level)
    registered_sections  each registered engine's and task's own section ([vllm], [digitsum]),
                    titled by its name
    all_sections    the two, in that order
    key_index       every key -> the title of its section (a key in two sections: an error)
    key_field       a key's dataclass field: its doc and rules (field.metadata)
    key_type        a key's type
    coerce          a value checked against a key's type (int widened to float), one line naming it
"""

from __future__ import annotations

import dataclasses
import types
import typing

from grpo_edu.config.sections import (Advantages, Data, Logging, Lora, Loss, OffPolicy, Optimisation, Rollout,
                                      Run)
from grpo_edu.environment.registry import TASKS
from grpo_edu.runtime.settings import Section
from grpo_edu.sampling.engines import ENGINES

# The sections every config has, by attribute (= TOML table; the run is the file's top level).
SECTIONS: dict[str, type[Section]] = {"run": Run, "data": Data, "rollout": Rollout, "optimisation": Optimisation,
                                      "off_policy": OffPolicy, "lora": Lora, "loss": Loss, "advantages": Advantages,
                                      "logging": Logging}


def registered_sections() -> dict[str, type[Section]]:
    """The sections of the registered engines, then tasks, that have settings, by title (each the
    engine's or the task's name: a section configures only the engine or task of its name)."""
    out: dict[str, type[Section]] = {}
    for kind, registry in (("engine", ENGINES), ("task", TASKS)):
        for name, entry in registry.items():
            if entry.settings is None:
                continue
            title = entry.settings.title
            if title in out or title in SECTIONS:
                raise ValueError(f"{kind} {name!r}: its settings section [{title}] has the title of another "
                                 f"section; give it the {kind}'s own name")
            out[title] = entry.settings
    return out


def all_sections() -> dict[str, type[Section]]:
    return {**SECTIONS, **registered_sections()}


def key_index() -> dict[str, str]:
    """Every key -> the title of its section ('run' for the top level); a key in two sections is
    an error naming both."""
    index: dict[str, str] = {}
    for title, section in all_sections().items():
        for key in section.keys():
            if key in index:
                raise ValueError(f"config key {key!r} is in two sections, [{index[key]}] and [{title}]: a key's name "
                                 f"must be unique (a registered engine's settings may not reuse a key)")
            index[key] = title
    return index


def key_field(key: str) -> dataclasses.Field:
    """The dataclass field of a key (its doc and rules: field.metadata)."""
    section = all_sections()[key_index()[key]]
    return {f.name: f for f in dataclasses.fields(section)}[key]


def key_type(key: str):
    section = all_sections()[key_index()[key]]
    return typing.get_type_hints(section)[key]


def coerce(key: str, value, expected):
    """Check (and widen int -> float) a value against the key's type; one line naming the key."""
    origin = typing.get_origin(expected)
    if origin in (typing.Union, types.UnionType):
        expected = tuple(t for t in typing.get_args(expected) if t is not type(None))[0]
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is bool and not isinstance(value, bool):
        raise ValueError(f"config key {key!r} must be true or false, got {value!r}")
    if expected is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"config key {key!r} must be an integer, got {value!r}")
    if expected in (dict, list) and not isinstance(value, expected):
        raise ValueError(f"config key {key!r} must be a {expected.__name__}, got {value!r}")
    if expected is dict:
        return {str(k): coerce(f"{key}.{k}", v, float) for k, v in value.items()}
    if expected in (float, str) and not isinstance(value, expected):
        raise ValueError(f"config key {key!r} must be a {expected.__name__}, got {value!r}")
    return value
