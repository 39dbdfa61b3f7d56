"""Chapter 2's advantage explorer, working in a real browser.

Starts JupyterLab on localhost, opens a copy of chapter 2 (outputs stripped) in
headless Chromium (Debian's `chromium`, driven by playwright), runs every cell in
the live kernel, drags a reward slider with the mouse, and checks that the table
the kernel sends back holds exactly the advantages grpo_edu computes for the new
rewards. Everything it starts (server, kernel, browser) is stopped at the end.

Chromium: /usr/bin/chromium (`make browser` installs it with apt-get; override with
GRPO_EDU_CHROMIUM). GRPO_EDU_SCREENSHOTS=<folder> saves each explorer as rendered. Without it the test is skipped with the reason, except in CI
(CI or GRPO_EDU_REQUIRE_BROWSER set), where it fails: CI must run it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import numpy as np
import pytest

from browser_support import CHROMIUM_FLAGS, chromium_or_skip

from grpo_edu import book
from grpo_edu.algorithm.advantages import group_advantages

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
CHAPTER = ROOT / "chapters" / "02_interactive.ipynb"
SERVER_START_SECONDS = 90
STEP_MS = 90_000          # the longest any one browser step may take


@pytest.fixture(scope="module")
def chromium_path() -> str:
    return chromium_or_skip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains `text` (our private runtime folder)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if text.encode() in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


@pytest.fixture(scope="module")
def lab(tmp_path_factory, chromium_path):
    """A JupyterLab server on a free localhost port, serving a stripped copy of chapter 2
    from a private folder; private config, data, runtime and settings folders."""
    home = tmp_path_factory.mktemp("lab")
    notebook = nbformat.read(CHAPTER, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    notebook.metadata.pop("widgets", None)
    nbformat.write(notebook, home / CHAPTER.name)
    settings = home / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    # Offline: no news and update checks (they would only time out).
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    runtime = home / "runtime"
    env = {**book.kernel_env(), "JUPYTER_CONFIG_DIR": str(home / "config"),
           "JUPYTER_RUNTIME_DIR": str(runtime), "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"), "IPYTHONDIR": str(home / "ipython")}
    port, token = _free_port(), secrets.token_hex(16)
    log = open(home / "server.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
         "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={home}",
         "--LabApp.expose_app_in_browser=True", "--LabServerApp.news_url=None"],
        cwd=home, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_SECONDS
        while True:
            if server.poll() is not None:
                pytest.fail(f"JupyterLab exited with {server.returncode}:\n{(home / 'server.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not answer within {SERVER_START_SECONDS} s:\n"
                                f"{(home / 'server.log').read_text()[-3000:]}")
                time.sleep(0.25)
        yield {"url": url, "token": token, "home": home}
    finally:
        # The kernels run in sessions of their own: ask the server to stop them, then
        # stop the server, then make sure nothing started here is left running.
        try:
            request = urllib.request.Request(f"{url}/api/kernels?token={token}")
            with urllib.request.urlopen(request, timeout=5) as response:
                kernels = json.load(response)
            for kernel in kernels:
                urllib.request.urlopen(urllib.request.Request(
                    f"{url}/api/kernels/{kernel['id']}?token={token}", method="DELETE"), timeout=10)
        except OSError:
            pass
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(timeout=10)
        for pid in _processes_mentioning(str(runtime)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()
        shutil.rmtree(runtime, ignore_errors=True)


def _table_values(page, css: str) -> np.ndarray:
    """The exact values (data-value) of the advantage table's cells of class css, (B, G)."""
    cells = page.eval_on_selector_all(
        f".grpo-advantage-explorer td.{css}",
        "cells => cells.map(c => [+c.dataset.prompt, +c.dataset.response, +c.dataset.value])")
    B, G = max(c[0] for c in cells) + 1, max(c[1] for c in cells) + 1
    values = np.full((B, G), np.nan)
    for b, g, value in cells:
        values[int(b), int(g)] = value
    return values


def test_dragging_a_reward_slider_updates_the_advantages(chromium_path, lab):
    from playwright.sync_api import sync_playwright

    started = time.monotonic()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path, headless=True,
                                             args=CHROMIUM_FLAGS, timeout=STEP_MS)
        page = None
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(STEP_MS)
            errors = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(f"{lab['url']}/lab/tree/{CHAPTER.name}?token={lab['token']}")
            page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell "
                                   "&& document.querySelector('.jp-Notebook .jp-Cell')")
            # Wait for the kernel, then run every cell as a reader would (Run > Run All Cells).
            page.wait_for_function(
                "() => { const w = window.jupyterapp.shell.currentWidget;"
                " return w && w.sessionContext && w.sessionContext.session"
                " && w.sessionContext.session.kernel"
                " && w.sessionContext.session.kernel.status === 'idle'; }")
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")

            slider = page.locator(".grpo-advantage-explorer .grpo-reward-p0-r1")
            handle = slider.locator(".noUi-handle")
            handle.wait_for(state="visible")
            page.locator(".grpo-advantage-explorer td.advantage").first.wait_for()
            handle.scroll_into_view_if_needed()
            before_rewards = _table_values(page, "reward")
            before = _table_values(page, "advantage")
            np.testing.assert_allclose(before, group_advantages(before_rewards), rtol=0, atol=1e-12)

            # Drag r2 of prompt 1 upwards with the mouse (a vertical slider: up = larger).
            box = handle.bounding_box()
            x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
            page.mouse.move(x, y)
            page.mouse.down()
            for step in range(1, 9):
                page.mouse.move(x, y - 3 * step)
            page.mouse.up()
            released = time.monotonic()

            # While the mouse moves, the slider sends intermediate values; wait until the
            # kernel's table shows the value the slider came to rest at.
            page.wait_for_function(
                """([old, selector]) => {
                    const readout = document.querySelector(selector + ' .widget-readout');
                    const c = document.querySelector('.grpo-advantage-explorer '
                        + 'td.reward[data-prompt="0"][data-response="1"]');
                    if (!readout || !c) return false;
                    const shown = +c.dataset.value;
                    return shown !== old && Math.abs(shown - parseFloat(readout.textContent)) < 1e-9;
                }""", arg=[float(before_rewards[0, 1]), ".grpo-advantage-explorer .grpo-reward-p0-r1"])
            round_trip = time.monotonic() - released
            readout = float(slider.locator(".widget-readout").inner_text())
            rewards = _table_values(page, "reward")
            advantages = _table_values(page, "advantage")
        except Exception:
            if page is not None:
                shot = lab["home"] / "failure.png"
                page.screenshot(path=str(shot))
                print(f"browser test failed; screenshot of the page: {shot}")
            raise
        else:
            if os.environ.get("GRPO_EDU_SCREENSHOTS"):  # a folder: each explorer as a reader sees it
                folder = Path(os.environ["GRPO_EDU_SCREENSHOTS"])
                folder.mkdir(parents=True, exist_ok=True)
                for css in ("advantage", "clipping", "kl", "length-bias"):
                    explorer = page.locator(f".grpo-{css}-explorer")
                    explorer.scroll_into_view_if_needed()
                    explorer.screenshot(path=str(folder / f"{css}.png"))
        finally:
            browser.close()
    seconds = time.monotonic() - started

    assert rewards[0, 1] > before_rewards[0, 1], "dragging up must raise the reward"
    assert rewards[0, 1] == pytest.approx(readout, abs=1e-9), "the table must show the slider's value"
    unchanged = np.ones_like(rewards, dtype=bool)
    unchanged[0, 1] = False
    np.testing.assert_array_equal(rewards[unchanged], before_rewards[unchanged])
    np.testing.assert_allclose(advantages, group_advantages(rewards), rtol=0, atol=1e-12)
    assert not np.allclose(advantages[0], before[0]), "prompt 1's advantages must change"
    np.testing.assert_array_equal(advantages[1], before[1])   # group scaling: prompt 2 untouched
    assert not errors, f"JavaScript errors in the page: {errors}"
    print(f"browser test: {seconds:.1f} s in Chromium (server start not included); reward r2 "
          f"{before_rewards[0, 1]:.2f} -> {rewards[0, 1]:.2f}, advantages "
          f"{np.round(advantages[0], 4).tolist()}; mouse release -> final table {round_trip * 1e3:.0f} ms")
