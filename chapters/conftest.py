"""nbval runs each chapter in a fresh kernel that inherits this environment: the
same settings `grpo-edu book run` executes chapters with (grpo_edu.book.KERNEL_ENV).
Chapters of a tier this machine lacks are skipped with the reason."""

import os
from pathlib import Path

import pytest

from grpo_edu import book

os.environ.update(book.KERNEL_ENV)


def pytest_collection_modifyitems(config, items):
    tiers = book.available_tiers()
    manifest = {c.path.name: c for c in book.load_book().chapters}
    for item in items:
        chapter = manifest.get(Path(str(item.fspath)).name)
        if chapter is not None and tiers[chapter.tier]:
            item.add_marker(pytest.mark.skip(reason=f"tier {chapter.tier!r}: {tiers[chapter.tier]}"))
