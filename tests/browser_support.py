"""What the browser tests share: where Chromium is, how it is launched, and the rule
that a missing browser skips the test here but fails it in CI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = Path(os.environ.get("GRPO_EDU_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_FLAGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update",
                  "--no-first-run", "--disable-sync", "--disable-quic"]


def unavailable(reason: str):
    message = (f"BROWSER TEST NOT RUN: {reason}. Install it with `make browser` "
               f"(apt-get install chromium) or point GRPO_EDU_CHROMIUM at a Chromium binary.")
    if os.environ.get("CI") or os.environ.get("GRPO_EDU_REQUIRE_BROWSER"):
        pytest.fail(message + " (CI requires this test to run)")
    pytest.skip(message)


def chromium_or_skip() -> str:
    """The Chromium executable, once playwright is importable; else skip (fail in CI)."""
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        unavailable(f"no Chromium executable at {CHROMIUM}")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        unavailable("the playwright package is not installed (pip install -e '.[test]')")
    return str(CHROMIUM)
