"""Settings: the keys of a config section, each documented once beside the rules about it alone.

A config section is a dataclass whose every field is a `setting`: its one-line doc (also its
`grpo-edu train --help` text), its default, and its own rules, checked when the section is made:

    choices=     the names it may take: a registry (a dict, so a name registered later counts)
                 or a tuple of the module that implements them
    at_least=    a bound, >= (or a pair: the bound and why)
    above=       a bound, > (or a pair)
    check=       a function check(value, name) of the module that implements the key, raising
                 one line that names it

and what becomes of it in TRL 1.16's GRPOConfig (grpo_edu.commands.trl_bridge):

    trl=         the GRPOConfig argument of the same meaning it is carried to
    trl_only=    (value, why): the one value TRL reproduces, and why another cannot be carried
    trl_note=    what becomes of it otherwise (carried in another form, or no effect)

grpo_edu.config composes the sections into a TrainConfig. Sections live beside what they
configure where that is a registered variant (an engine's settings beside its registration),
else in grpo_edu.config.sections.
"""

from __future__ import annotations

import dataclasses
from typing import Callable


def setting(doc: str, default, *, choices=None, at_least=None, above=None, check: Callable | None = None,
            trl: str | None = None, trl_only: tuple | None = None, trl_note: str | None = None):
    """A config key: a dataclass field carrying its doc, default and rules (module docstring)."""
    rules = {"doc": doc, "choices": choices, "at_least": at_least, "above": above, "check": check,
             "trl": trl, "trl_only": trl_only, "trl_note": trl_note}
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=rules)
    return dataclasses.field(default=default, metadata=rules)


def named(key: str) -> str:
    return f"config key {key!r}"


def check_setting(key: str, value, rules) -> None:
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


class Section:
    """A config section: a dataclass of settings that checks each of its keys when it is made.
    Subclasses are @dataclass; `title` is its TOML table ('' for the file's top level)."""

    title = ""

    def __post_init__(self):
        for key in dataclasses.fields(self):
            check_setting(key.name, getattr(self, key.name), key.metadata)

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))


def default_of(section_class: type, key: str):
    """A key's default value in its section."""
    spec = {f.name: f for f in dataclasses.fields(section_class)}[key]
    return spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default
