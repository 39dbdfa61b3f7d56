"""A training run's config: its sections as types, their rules, and the files that set them.

    sections.py      the sections (TOML tables) as dataclasses, every key documented once beside
                     the rules about it alone
    rules.py         checks of one key no other module implements; RULES, the rules across keys
    keys.py          the keys by name: which section holds each, its field and type
    files.py         config files read on top of a base, each key's source kept; `config show`
    train_config.py  TrainConfig: the sections composed (and each registered engine's), checked

    from grpo_edu.config import TrainConfig
    config = TrainConfig.from_toml("configs/cpu-first-run.toml", ["steps=200"])
    config.loss.beta, config.value("beta")

Imports the subpackages below it (runtime, algorithm, policy, environment, sampling: their
registries name what a key may take); training and the commands import it.
"""

from grpo_edu.config.train_config import TrainConfig, help_text

# The CPU tier's config: in a source checkout the repository root's configs/; in a package
# installed from its wheel the copy shipped with the book's files (pyproject.toml maps configs/
# to grpo_edu/book/files/configs, grpo_edu.book.home reads them).
from pathlib import Path as _Path

_CHECKOUT_CONFIG = _Path(__file__).resolve().parents[2] / "configs" / "cpu-tiny.toml"
_SHIPPED_CONFIG = _Path(__file__).resolve().parents[1] / "book" / "files" / "configs" / "cpu-tiny.toml"
DEFAULT_CONFIG = _CHECKOUT_CONFIG if _CHECKOUT_CONFIG.is_file() else _SHIPPED_CONFIG

__all__ = ["DEFAULT_CONFIG", "TrainConfig", "help_text"]
