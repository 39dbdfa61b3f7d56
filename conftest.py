"""How `make test` spreads the suite over the machine's cores (pytest-xdist, `-n 2 --dist
loadgroup`): each test module, and each chapter, is one group that runs whole on one worker,
in order (a chapter's cells share one kernel; a module's fixtures are built once). Tests that
share no files run side by side; the chapters write their runs under ../runs, and the only
other test that runs them (the unpinned-kernels check) does so in a tree of its own.
Without -n, these marks do nothing."""

from pathlib import Path

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Each item's group is its file; the chapters go first, longest budget first (book.toml),
    so that the longest groups do not start last and leave one worker idle at the end."""
    from grpo_edu import book

    budgets = {c.path.name: c.budget_seconds for c in book.load_book().chapters}
    files = list(dict.fromkeys(item.nodeid.split("::")[0] for item in items))
    order = {name: i for i, name in enumerate(sorted(files, key=lambda f: -budgets.get(Path(f).name, 0)))}
    items.sort(key=lambda item: order[item.nodeid.split("::")[0]])   # stable: a file keeps its order
    for item in items:
        item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
