"""TrainConfig: a training run's config, its sections composed, every rule checked once.

    config = TrainConfig(beta=0.0, steps=200)          # any key by name, the rest defaults
    config.loss.beta, config.optimisation.steps        # each key lives in its section
    config.replace(learning_rate=1e-4)                 # a new config, checked again
    config.to_dict()                                   # {key: value}, flat (a run's config.json)

The sections are grpo_edu.config.sections' nine, in the order a TOML file reads them, and one
per registered engine or task that has settings (grpo_edu.sampling.engines: [vllm], [sglang];
grpo_edu.environment.digitsum: [digitsum]); each checks its own keys when it is made, then the
rules across keys run (grpo_edu.config.rules).
Key names are unique across sections, so a key is named without its section everywhere outside
the code: `--set beta=0`, config.json, error messages (`--set loss.beta=0` names it with its
section too). Reading a config file, with its base and the source of every key, is
grpo_edu.config.files.
"""

from __future__ import annotations

import dataclasses
import typing

from grpo_edu.config import files
from grpo_edu.config.keys import SECTIONS, all_sections, coerce, key_index, key_type, registered_sections
from grpo_edu.config.rules import RULES, import_modules
from grpo_edu.config.sections import Advantages, Data, Logging, Lora, Loss, OffPolicy, Optimisation, Rollout, Run
from grpo_edu.runtime.settings import Section

# Keys that were replaced: the error names the new key.
RENAMED = {
    "fused_llama": "config key 'fused_llama' was replaced by 'engine': fused_llama = true is engine = \"fused\", "
                   "false is engine = \"hf\" (and engine = \"vllm\" is new)",
}


@dataclasses.dataclass(init=False)
class TrainConfig:
    """A training run's config (module docstring): the sections, and the rules across them checked."""

    run: Run
    data: Data
    rollout: Rollout
    optimisation: Optimisation
    off_policy: OffPolicy
    lora: Lora
    loss: Loss
    advantages: Advantages
    logging: Logging
    registered: dict[str, Section]   # the registered engines' and tasks' own sections, by title

    def __init__(self, **given):
        """TrainConfig(beta=0.0, steps=200): keys by name, or whole sections (loss=Loss(...)); the
        rest defaults. Each key is coerced to its type and checked; then the rules across keys."""
        import_modules(given.get("imports", ()))   # before anything is checked: its registrations count
        index = key_index()
        sections = all_sections()
        by_section: dict[str, dict] = {title: {} for title in sections}
        whole: dict[str, Section] = {}
        for name, value in given.items():
            if name in sections:
                if not isinstance(value, sections[name]):
                    raise ValueError(f"config section {name!r} must be a {sections[name].__name__}, got "
                                     f"{type(value).__name__}")
                whole[name] = value
            elif name in RENAMED:
                raise ValueError(RENAMED[name])
            elif name in index:
                by_section[index[name]][name] = coerce(name, value, key_type(name))
            else:
                raise ValueError(f"unknown config key {name!r}; known keys: {', '.join(index)}")
        for title, keys in by_section.items():
            if title in whole and keys:
                raise ValueError(f"config section {title!r} given whole and keys of it by name ({', '.join(keys)}); "
                                 f"give one")
        built = {title: whole.get(title) or sections[title](**by_section[title]) for title in sections}
        for title in SECTIONS:
            setattr(self, title, built[title])
        self.registered = {title: built[title] for title in registered_sections()}
        self.validate()

    def __getattr__(self, name: str):
        # A registered engine's or task's section (config.vllm, config.digitsum); a key named without
        # its section, a hint.
        if name == "registered" or name.startswith("__"):
            raise AttributeError(name)
        if name in self.registered:
            return self.registered[name]
        title = key_index().get(name)
        if title is not None:
            raise AttributeError(f"TrainConfig has no attribute {name!r}: the key is in section "
                                 f"{title!r} (config.{title}.{name}; config.value({name!r}))")
        raise AttributeError(f"TrainConfig has no attribute {name!r}")

    def validate(self) -> None:
        """The rules across keys (grpo_edu.config.rules.RULES): one line per refusal. Each section
        checked its own keys when it was made."""
        for rule in RULES:
            if rule.broken(self):
                raise ValueError(rule.message(self))

    # ------------------------------------------------------------------ keys by name

    def sections(self) -> dict[str, Section]:
        """Every section, by title, in reading order."""
        return {**{title: getattr(self, title) for title in SECTIONS}, **self.registered}

    def section_of(self, key: str) -> Section:
        return self.sections()[key_index()[key]]

    def value(self, key: str):
        """A key's value, by its name alone."""
        if key not in key_index():
            raise ValueError(f"unknown config key {key!r}")
        return getattr(self.section_of(key), key)

    def to_dict(self) -> dict:
        """{key: value} over every section: the flat form of a run's config.json."""
        return {key: value for section in self.sections().values() for key, value in dataclasses.asdict(section).items()}

    def replace(self, **changes) -> "TrainConfig":
        """A new config with these keys changed, checked again."""
        return TrainConfig(**{**self.to_dict(), **changes})

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        """A config from {key: value} (flat, as config.json holds it)."""
        return cls(**values)

    @classmethod
    def resolve(cls, path=None, overrides: list[str] | None = None) -> files.Resolved:
        """Defaults, then the TOML file (and its bases, grpo_edu.config.files), then `key=value`
        overrides: the config, each key's source and the files read."""
        values, sources, read = files.resolve_values(path, overrides)
        return files.Resolved(cls.from_dict(values), sources, read)

    @classmethod
    def from_toml(cls, path=None, overrides: list[str] | None = None) -> "TrainConfig":
        """Defaults, then the TOML file (and its bases), then `key=value` overrides."""
        return cls.resolve(path, overrides).config

    @classmethod
    def load_run_config(cls, run_dir, overrides: list[str] | None = None) -> "TrainConfig":
        """The config a run directory was started with (its config.json), plus overrides."""
        return cls.from_dict(files.run_values(run_dir, overrides))

    @staticmethod
    def keys() -> dict[str, str]:
        """Every key -> its section's title ('run': the file's top level)."""
        return key_index()


def help_text() -> str:
    """Every key with its section, type, default and one-line doc (the --help epilog)."""
    lines = ["config keys (set in a TOML file or with --set key=value), by section:"]
    for title, section in all_sections().items():
        lines.append(f"  [{title}]" if title != "run" else "  (the file's top level)")
        hints = typing.get_type_hints(section)
        for f in dataclasses.fields(section):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            kind = getattr(hints[f.name], "__name__", str(hints[f.name]))
            lines.append(f"    {f.name} ({kind}, default {default!r}): {f.metadata['doc']}")
    return "\n".join(lines)
