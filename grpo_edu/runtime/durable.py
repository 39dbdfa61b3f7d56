"""Files that survive a kill or a power cut: flushing to disk, and replacing a small file
atomically. Standard library only (runlog uses it without importing torch)."""

from __future__ import annotations

import os
from pathlib import Path


def fsync(path: Path) -> None:
    """Force a file's data, or a folder's entries (a rename), to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def replace(path: Path, text: str) -> None:
    """Replace a small file so that a kill or a power cut leaves the old or the new one."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    fsync(temporary)
    os.replace(temporary, path)
    fsync(path.parent)
