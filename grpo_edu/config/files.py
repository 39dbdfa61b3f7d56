"""Config files that say what they change, read on top of a base, each key's source kept.

    # configs/cpu-first-run.toml
    base = "cpu-tiny.toml"     # the file this one changes (a path from this file's folder), or "defaults"

    [loss]
    beta = 0.0                 # why it differs, in a comment, as nanoGPT's config files do

A file is read on top of its base, the base on top of its own, down to the defaults
(TrainConfig's); `--set key=value` comes last. A file without `base` is read on top of the
defaults: a full file, as every file was before sections, still reads as it did. Its tables
group keys for reading: a key is found by its name whichever table holds it, so a file written
before the sections ([task], [optimisation], ...) still reads, and a key given twice in one file
is an error. A file's [rewards] table replaces its base's whole; `--set rewards.NAME=w` changes
one weight.

    resolve_values(path, ...)  the values, each key's source, the files read (base first):
                               TrainConfig.resolve and from_toml make the config of them
    run_values(run_dir, ...)   the values a run directory was started with (config.json)
    show(resolved)             the resolved config as a TOML file, each key's source beside it
                               (`grpo-edu config show FILE`)
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from grpo_edu.config.keys import all_sections, coerce, key_index, key_type
from grpo_edu.config.rules import import_modules
from grpo_edu.config.sections import Run
from grpo_edu.runtime.settings import default_of

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

DEFAULTS = "defaults"   # the base of a file that changes TrainConfig's defaults alone
DEFAULT = "default"     # the source of a key no file and no --set gave
SET = "--set"           # the source of a key given on the command line


@dataclasses.dataclass
class Resolved:
    """A config as files and --set made it (TrainConfig.resolve)."""

    config: "TrainConfig"  # noqa: F821 (grpo_edu.config.train_config, which imports this module)
    sources: dict[str, str]     # key -> "default", the file that set it last, or "--set"
    files: list[Path]           # the files read, the first base first


def read_file(path: Path) -> tuple[dict, str | None]:
    """A config file's {key: value} (its tables' keys found by name) and its base (None: none
    named). One line names a bad file, key or value."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    base = data.pop("base", None)
    if base is not None and (not isinstance(base, str) or not base):
        raise ValueError(f"{path}: 'base' must be a file name (a path from this file's folder) or "
                         f"{DEFAULTS!r}, got {base!r}")
    index, values = key_index(), {}

    def put(key, value):
        if key in values:
            raise ValueError(f"{path}: config key {key!r} given twice")
        values[key] = value

    for name, value in data.items():
        if name in index and not (isinstance(value, dict) and key_type(name) is not dict):
            put(name, value)                      # a key (rewards: a table that is a key's value)
        elif isinstance(value, dict):             # a section, or a table of a file written before them
            for key, inner in value.items():
                put(key, inner)
        else:
            put(name, value)                      # unknown: TrainConfig names it
    return values, base


def _chain(path: Path) -> list[tuple[Path, dict]]:
    """The files from the first base to `path`, each with its values."""
    chain, seen = [], []
    while True:
        resolved = path.resolve()
        if resolved in seen:
            loop = " -> ".join(str(p) for p in [*seen, resolved])
            raise ValueError(f"{path}: 'base' files form a loop: {loop}")
        seen.append(resolved)
        if not path.is_file():
            raise ValueError(f"{chain[0][0] if chain else path}: base {str(path)!r} is not a file")
        values, base = read_file(path)
        chain.insert(0, (path, values))
        if base is None or base == DEFAULTS:
            return chain
        path = Path(os.path.normpath(path.parent / base))


def parse_override(text: str) -> tuple[str, object]:
    """'beta=0.0' -> ('beta', 0.0): the value is read as TOML (strings may be bare)."""
    if "=" not in text:
        raise ValueError(f"--set expects key=value, got {text!r}")
    key, raw = (part.strip() for part in text.split("=", 1))
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare string: --set task=countdown
    return key, value


def _override_key(key: str) -> str:
    """'beta' or 'loss.beta' -> 'beta' (a section named must be the key's); 'rewards.NAME' as it is."""
    if "." not in key or key.startswith("rewards."):
        return key
    title, name = key.split(".", 1)
    index = key_index()
    if title not in all_sections():
        raise ValueError(f"--set {key}: {title!r} is not a config section (sections: {', '.join(all_sections())})")
    if index.get(name) != title:
        where = f"it is in section {index[name]!r}" if name in index else "there is no such key"
        raise ValueError(f"--set {key}: section {title!r} has no key {name!r} ({where})")
    return name


def resolve_values(path=None, overrides: list[str] | None = None) -> tuple[dict, dict[str, str], list[Path]]:
    """The values of the file's base chain and the file (if any), then `key=value` overrides, over
    the defaults; each key's source; the files read, base first."""
    values: dict = {}
    sources = {key: DEFAULT for key in key_index()}
    files: list[Path] = []
    if path is not None:
        for file, file_values in _chain(Path(path)):
            import_modules(file_values.get("imports", ()), f"{file}: config key 'imports'")
            values.update(file_values)
            sources.update({key: str(file) for key in file_values})
            files.append(file)
    for override in overrides or []:
        key, value = parse_override(override)
        key = _override_key(key)
        if key.startswith("rewards."):
            values["rewards"] = dict(values.get("rewards", default_of(Run, "rewards")))
            values["rewards"][key.split(".", 1)[1]] = coerce("rewards.*", value, float)
            sources["rewards"] = SET
        else:
            values[key] = value
            sources[key] = SET
        if key == "imports":
            import_modules(value)
    return values, sources, files


def run_values(run_dir, overrides: list[str] | None = None) -> dict:
    """The values a run directory was started with (its config.json, upgraded), plus overrides."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"--resume {run_dir}: no config.json there (not a grpo-edu run directory)")
    values = upgrade(json.loads(path.read_text()))
    for override in overrides or []:
        key, value = parse_override(override)
        values[_override_key(key)] = value
    values["output_dir"] = str(run_dir)
    return values


def upgrade(saved: dict) -> dict:
    """A run directory's config.json as written before a key was replaced (so that an older run
    resumes): fused_llama = true/false is engine = "fused"/"hf"; ratio_cap > 0 without a
    surrogate key was the capped surrogate."""
    saved = dict(saved)
    if "fused_llama" in saved:
        saved["engine"] = "fused" if saved.pop("fused_llama") else "hf"
    if saved.get("ratio_cap") and "surrogate" not in saved:
        saved["surrogate"] = "capped"
        saved.pop("epsilon", None)          # unused by the capped surrogate then; now refused beside it
        saved.pop("epsilon_high", None)
    return saved


# --------------------------------------------------------------------------- show

def toml_value(value) -> str:
    """A value as TOML writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


def show(resolved: Resolved, *, overrides: list[str] | None = None) -> str:
    """The resolved config as a TOML file a run could start from, every key with its source in a
    comment: "default", the file that set it, or "--set"."""
    chain = " <- ".join([DEFAULTS, *(str(f) for f in resolved.files), *(f"--set {o}" for o in overrides or [])])
    lines = [f"# resolved: {chain}", "# every key, with where its value comes from"]
    for title, section in resolved.config.sections().items():
        lines.append("" if title == "run" else f"\n[{title}]")
        rows = [(f"{key} = {toml_value(getattr(section, key))}", resolved.sources[key]) for key in section.keys()]
        width = max(len(row) for row, _ in rows)
        lines += [f"{row:<{width}}  # {source}" for row, source in rows]
    return "\n".join(lines).replace("\n\n\n", "\n\n") + "\n"


