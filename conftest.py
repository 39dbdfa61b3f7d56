"""How `make test` spreads the suite over the machine's cores (pytest-xdist, `-n 2 --dist
loadfile`): each test file, and each chapter, runs whole on one worker, in order (a chapter's
cells share one kernel; a module's fixtures are built once). Files share no outputs: the
chapters write their runs under ../runs, and the only other test that runs chapters (the
unpinned-kernels check) does so in a tree of its own. Without -n the order below still holds.
"""

from pathlib import Path

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Longest first, so that no long file starts last and leaves the other worker idle: the
    chapters by budget (book.toml), then the test files by how many of their tests are marked
    slow (more than a few seconds each), then the rest. xdist hands out files in this order."""
    from grpo_edu import book

    budgets = {c.path.name: c.budget_seconds for c in book.load_book().chapters}
    slow: dict[str, int] = {}
    for item in items:
        file = item.nodeid.split("::")[0]
        slow[file] = slow.get(file, 0) + (item.get_closest_marker("slow") is not None)
    order = {file: i for i, file in enumerate(sorted(slow, key=lambda f: (-budgets.get(Path(f).name, 0), -slow[f])))}
    items.sort(key=lambda item: order[item.nodeid.split("::")[0]])   # stable: a file keeps its order
