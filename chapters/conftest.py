"""nbval runs each chapter in a fresh kernel with the settings `grpo-edu book run` uses
(grpo_edu.book.KERNEL_ENV) and, on x86-64 with AVX2, the pinned floating-point kernels
(grpo_edu.runtime.numerics): that is what makes every committed output reproducible on any such
machine. Chapters of a tier this machine lacks are skipped with the reason, and so are
cells tagged `gpu` where there is no CUDA GPU (their committed output says so); where
there is one, they run and must not raise, but their output (a GPU's step times and
memory) is not compared.

Where the pin is unavailable (Apple silicon, ARM Linux), or with `--book-unpinned`, the
kernels are the machine's own: cells tagged `platform-numerics` (a training run's digits)
are executed but not compared, and the run ends with a report naming them. Every other
cell, the claims cells that check what the prose says about those runs included, is
compared exactly.
"""

import os
from pathlib import Path

import pytest

from grpo_edu import book
from grpo_edu.runtime import numerics
from grpo_edu.book import notebooks

os.environ.update(book.KERNEL_ENV)


def pytest_addoption(parser):
    parser.addoption("--book-unpinned", action="store_true",
                     help="run chapters with this machine's own floating-point kernels, as where the "
                          "pin is unavailable: cells tagged platform-numerics are executed, not compared")


def _unpinned_reason(config) -> str | None:
    if config.getoption("--book-unpinned"):
        return "--book-unpinned"
    return numerics.unpinnable_reason()


def pytest_configure(config):
    config._platform_cells = []   # (nodeid, matched the committed output or not)
    config._gpu_cells = []        # likewise, for the cells tagged gpu run on a GPU


def pytest_collection_modifyitems(config, items):
    tiers = book.available_tiers()
    # Outside the repository (tests/test_anywhere.py runs the chapters from the installed wheel)
    # there is no book.toml: no chapter's tier is known, and each runs (every tier is "cpu").
    in_repository = (book.ROOT / "book.toml").is_file()
    manifest = {c.path.name: c for c in book.load_book().chapters} if in_repository else {}
    unpinned = _unpinned_reason(config)
    for item in items:
        if item.fspath.ext != ".ipynb":
            continue
        chapter = manifest.get(Path(str(item.fspath)).name)
        tags = getattr(item, "cell", {}).get("metadata", {}).get("tags", [])
        if chapter is not None and tiers[chapter.tier]:
            item.add_marker(pytest.mark.skip(reason=f"tier {chapter.tier!r}: {tiers[chapter.tier]}"))
        elif notebooks.GPU_TAG in tags:   # in any notebook, listed in book.toml or not
            if tiers["gpu"]:
                item.add_marker(pytest.mark.skip(reason=f"a cell tagged {notebooks.GPU_TAG!r}: needs a CUDA GPU "
                                                        f"({tiers['gpu']})"))
            else:   # its output is the hardware's (timings, memory): run, and must not raise
                _record_instead_of_compare(item, config._gpu_cells)
        elif chapter is not None and unpinned and numerics.PLATFORM_TAG in tags:
            _record_instead_of_compare(item, config._platform_cells)


def _record_instead_of_compare(item, record):
    """Run the cell; note whether its output matched the committed one; never fail on digits."""
    compare = item.compare_outputs

    def recording_compare(test, ref, skip_compare=None):
        first_line = item.cell.source.strip().splitlines()[0] if item.cell.source.strip() else ""
        record.append((f"{item.nodeid} ({first_line[:60]})", compare(test, ref, skip_compare)))
        return True

    item.compare_outputs = recording_compare


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    # A notebook's kernel starts in the setup of its first cell and reads the kernel
    # environment once: the pin is set for that moment only, so the rest of the test
    # session (and the processes it starts) keeps the machine's own kernels.
    saved = dict(os.environ)
    if not _unpinned_reason(item.config) and item.fspath.ext == ".ipynb":
        os.environ.update(numerics.PINNED_ENV)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def pytest_terminal_summary(terminalreporter, config):
    write = terminalreporter.write_line
    if config._gpu_cells:
        terminalreporter.section("cells tagged gpu")
        write(f"These {len(config._gpu_cells)} cells ran on this machine's GPU without raising; their output "
              f"(step times, memory) is the hardware's, so it was not compared with the committed one:")
        for nodeid, matched in config._gpu_cells:
            write(f"  {nodeid}: {'same as committed' if matched else 'differs from committed'}")
    cells = config._platform_cells
    if not cells:
        return
    reason = _unpinned_reason(config)
    terminalreporter.section("platform-dependent cells")
    write(f"The pinned floating-point kernels are not in use ({reason}). These {len(cells)} cells print "
          f"numbers that depend on the machine's kernels; they ran, and the claims cells after them "
          f"checked what the prose says, but their digits were not compared:")
    for nodeid, matched in cells:
        write(f"  {nodeid}: {'same as committed' if matched else 'differs from committed (expected here)'}")
    write("Exact everywhere else: every other cell was compared digit for digit.")
