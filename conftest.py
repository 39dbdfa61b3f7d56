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
    """The chapters first, longest budget first (book.toml), then the tests: xdist hands out
    files in this order, so the longest ones do not start last and leave a worker idle."""
    from grpo_edu import book

    budgets = {c.path.name: c.budget_seconds for c in book.load_book().chapters}
    files = list(dict.fromkeys(item.nodeid.split("::")[0] for item in items))
    order = {name: i for i, name in enumerate(sorted(files, key=lambda f: -budgets.get(Path(f).name, 0)))}
    items.sort(key=lambda item: order[item.nodeid.split("::")[0]])   # stable: a file keeps its order
