"""Where a chapter reads and writes, in the repository or anywhere else.

A chapter runs in two places. In the repository (`make book`, `make test`) it reads the
repository's files: configs/, benchmarks/results/, the vLLM stand-in in tests/. Anywhere else
(a notebook downloaded from the website, opened in a hosted Jupyter, copied into a folder of
its own) only the package is there, installed from a wheel: `pip install "grpo-edu[book]"`.
The files a chapter reads ship inside that package (pyproject.toml maps them in, under
grpo_edu/book/files/), and the runs a chapter trains go under runs/ in the folder it runs in.

    enter()        a chapter's first call: work from the book's home, the repository's root
                   or, outside it, the folder the notebook runs in
    path(name)     a file by its path in the repository ("configs/cpu-tiny.toml"), from the
                   repository or from the package, whichever holds the book
    shown(text)    text with those two places' folders taken out, so that what a chapter
                   prints is the same wherever it runs

tests/test_anywhere.py builds the wheel, installs it apart from the repository, runs every
chapter in a folder of its own and compares each output with the committed one.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGED = Path(__file__).resolve().parent / "files"


def book_root(folder: Path | None = None) -> Path | None:
    """The checkout of the book that `folder` (the working folder by default) is in: the folder
    itself or its parent, if it holds book.toml and chapters/. None outside the repository."""
    folder = Path.cwd() if folder is None else Path(folder)
    for candidate in (folder, folder.parent):
        if (candidate / "book.toml").is_file() and (candidate / "chapters").is_dir():
            return candidate
    return None


def in_repository() -> bool:
    return book_root() is not None


def enter() -> Path:
    """Work from the book's home from now on; returns it. A notebook runs in its own folder:
    chapters/ in the repository (the home is its parent), or any folder outside it."""
    home = book_root() or Path.cwd()
    os.chdir(home)
    return home


def path(name: str) -> Path:
    """The book's file `name` (a path in the repository, such as "benchmarks/results/lag.json")."""
    root = book_root()
    if root is not None:
        return root / name
    found = PACKAGED / name
    if not found.exists():
        raise FileNotFoundError(f"{name}: not in the installed package ({PACKAGED}); the chapters read "
                                f"only the files pyproject.toml ships under grpo_edu/book/files")
    return found


def shown(text: str) -> str:
    """`text` with the book's folders (the checkout, the package's files) taken out of its paths."""
    for folder in (PACKAGED, book_root()):
        if folder is not None:
            text = text.replace(f"{folder.resolve()}{os.sep}", "")
    return text
