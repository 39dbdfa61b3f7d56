"""The static site in a real browser (headless Chromium, as tests/test_browser.py).

Builds the site with `grpo-edu book html`, then, once from the folder (file://) and once
served over HTTP on localhost: opens the contents page, follows every link on it, and on
every chapter checks that each formula is typeset by KaTeX, each figure is decoded, the
console stays free of errors and no request leaves the site. On chapter 2 it drags one
slider of each explorer with the mouse, compares every number the page shows with grpo_edu's
own computation for the settings the page reports (tests/explorer_compare.py), and measures
how long the explorer took to answer. GRPO_EDU_SITE_TIMINGS=<file> appends those timings as JSON lines.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from browser_support import CHROMIUM_FLAGS, chromium_or_skip
from explorer_compare import assert_matches_python

from grpo_edu import book as bookmod
from grpo_edu.commands import cli
from grpo_edu.book import html as site

pytestmark = [pytest.mark.browser, pytest.mark.slow]

STEP_MS = 60_000
# One slider per explorer: (explorer css, the control's class, pixels to drag; + is right).
DRAGS = (("advantage", "grpo-reward-p0-r1", 60),
         ("clipping", "grpo-control-advantage", -120),
         ("kl", "grpo-ref-logit-x0", 70),
         ("length_bias", "grpo-control-longest", -50))
CSS = {"advantage": "grpo-advantage-explorer", "clipping": "grpo-clipping-explorer",
       "kl": "grpo-kl-explorer", "length_bias": "grpo-length-bias-explorer"}


@pytest.fixture(scope="module")
def chromium():
    return chromium_or_skip()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("site") / "html"
    assert cli.main(["book", "html", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def served(built):
    """The built folder over HTTP on a free localhost port."""
    handler = functools.partial(_QuietHandler, directory=str(built))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _drag(page, explorer, control: str, pixels: int) -> dict:
    """Drag the range input of `control` by `pixels` with the mouse. Returns the explorer's
    settings and numbers after the drag, and per input event the milliseconds from the event
    to the end of its handlers (the explorer's update) and to the next animation frame."""
    root = page.locator(f".{CSS[explorer]}")
    slider = root.locator(f"input[type=range].{control}, .{control} input[type=range]").first
    slider.scroll_into_view_if_needed()
    before = page.evaluate("e => ({config: e.grpoExplorer.config(), updates: e.grpoExplorer.updates})",
                           root.element_handle())
    # A listener on window runs after the explorer's own (the event bubbles up to it).
    page.evaluate("""() => { window.latencies = [];
        window.addEventListener('input', event => {
            const handled = performance.now() - event.timeStamp;
            requestAnimationFrame(() => window.latencies.push([handled, performance.now() - event.timeStamp]));
        }); }""")
    box = slider.bounding_box()
    value, low, high = (float(slider.evaluate(f"e => e.{k}")) for k in ("value", "min", "max"))
    fraction = (value - low) / (high - low)
    # The thumb sits at the value's fraction of the track, less the thumb's own size. A
    # vertical slider (the rewards) grows upwards: drag it up by `pixels`.
    if box["height"] > box["width"]:
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] - 8 - (box["height"] - 16) * fraction
        dx, dy = 0, -pixels
    else:
        x, y = box["x"] + 8 + (box["width"] - 16) * fraction, box["y"] + box["height"] / 2
        dx, dy = pixels, 0
    page.mouse.move(x, y)
    page.mouse.down()
    for step in range(1, 11):
        page.mouse.move(x + dx * step / 10, y + dy * step / 10)
    page.mouse.up()
    page.evaluate("() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))")
    after = page.evaluate(
        """e => ({config: e.grpoExplorer.config(), state: e.grpoExplorer.state, updates: e.grpoExplorer.updates,
                  table: e.querySelector('.grpo-table-box').innerHTML,
                  notes: e.querySelector('.grpo-notes-box').innerHTML, latencies: window.latencies})""",
        root.element_handle())
    return {"before": before, "after": after, "updates": after["updates"] - before["updates"]}


def _median(values):
    values = sorted(values)
    return values[len(values) // 2]


def _check_page(page, url: str, base: str, errors: list, requests: list) -> dict:
    errors.clear()
    requests.clear()
    page.goto(url)
    page.wait_for_load_state("load")
    page.wait_for_function("() => document.documentElement.dataset.mathsTypeset !== undefined")
    page.evaluate("document.fonts.ready.then(() => true)")
    found = page.evaluate(
        """() => ({maths: document.querySelectorAll('.math').length,
                   typeset: +document.documentElement.dataset.mathsTypeset,
                   katex: document.querySelectorAll('.math > .katex, .math .katex-display').length,
                   failed: document.querySelectorAll('.math-error, .katex-error').length,
                   images: [...document.querySelectorAll('img')].map(i => [i.getAttribute('src'),
                            i.complete && i.naturalWidth > 0]),
                   fonts: [...document.fonts].filter(f => f.status === 'error').map(f => f.family)})""")
    name = url.rsplit("/", 1)[-1]
    assert found["typeset"] == found["maths"] == found["katex"], f"{name}: {found}"
    assert found["failed"] == 0, f"{name}: {found['failed']} formulas failed"
    assert all(ok for _, ok in found["images"]), f"{name}: images not decoded {found['images']}"
    assert not found["fonts"], f"{name}: fonts failed to load: {found['fonts']}"
    assert not errors, f"{name}: console errors {errors}"
    outside = [r for r in requests if not r.startswith(base)]
    assert not outside, f"{name}: requests outside the site: {outside}"
    return found


@pytest.mark.parametrize("how", ["file", "http"])
def test_the_site_reads_and_its_explorers_answer(chromium, built, served, how, request):
    from playwright.sync_api import sync_playwright

    base = built.as_uri() + "/" if how == "file" else served + "/"
    book = bookmod.load_book()
    visited, timings = {}, []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True,
                                             args=CHROMIUM_FLAGS, timeout=STEP_MS)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.set_default_timeout(STEP_MS)
        errors, requests = [], []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("console", lambda message: message.type == "error" and errors.append(message.text))
        page.on("request", lambda r: requests.append(r.url))
        try:
            _check_page(page, base + "index.html", base, errors, requests)
            links = page.eval_on_selector_all("main a[href]", "links => links.map(a => a.getAttribute('href'))")
            chapter_pages = [site.page_name(c) for c in book.chapters]
            assert [l for l in links if l in chapter_pages][-len(chapter_pages):] == chapter_pages  # the table
            assert {"glossary.html", "notation.html"} <= set(links)
            for link in dict.fromkeys(links):
                if link.endswith(".ipynb"):       # a download: the file is there, a notebook
                    assert json.loads((built / link).read_text())["nbformat"] == 4
                    continue
                page.goto(base + "index.html")
                page.click(f"main a[href='{link}']")
                page.wait_for_url(base + link)
                visited[link] = _check_page(page, base + link, base, errors, requests)
                for rel in ("prev", "next"):       # the chapter's own navigation resolves
                    for href in page.eval_on_selector_all(f"a[rel={rel}]", "a => a.map(x => x.getAttribute('href'))"):
                        assert (built / href).is_file()

            page.goto(base + "02_interactive.html")
            page.wait_for_function("() => document.querySelectorAll('.grpo-explorer').length === 4")
            for kind, control, pixels in DRAGS:
                moved = _drag(page, kind, control, pixels)
                assert moved["after"]["config"] != moved["before"]["config"], f"{kind}: the drag moved nothing"
                assert_matches_python(kind, moved["after"])     # table, notes and state
                latencies = moved["after"]["latencies"]
                assert moved["updates"] >= 2 and len(latencies) >= 2, f"{kind}: {moved['updates']} updates"
                timings.append({"how": how, "explorer": kind, "control": control, "updates": moved["updates"],
                                "update_ms_median": _median([h for h, _ in latencies]),
                                "update_ms_max": max(h for h, _ in latencies),
                                "frame_ms_median": _median([f for _, f in latencies])})
            assert not errors, f"chapter 2 after dragging: console errors {errors}"
            outside = [r for r in requests if not r.startswith(base)]
            assert not outside, f"requests outside the site: {outside}"
        finally:
            browser.close()

    assert set(chapter_pages) <= set(visited) and {"glossary.html", "notation.html"} <= set(visited)
    assert sum(v["maths"] for v in visited.values()) > 200
    if os.environ.get("GRPO_EDU_SITE_TIMINGS"):
        with open(os.environ["GRPO_EDU_SITE_TIMINGS"], "a") as f:
            for row in timings:
                f.write(json.dumps(row) + "\n")
    for row in timings:
        print(f"site ({how}): {row['explorer']:<12} {row['control']:<24} {row['updates']:>2} updates; input "
              f"event -> explorer updated: median {row['update_ms_median']:.1f} ms, max "
              f"{row['update_ms_max']:.1f} ms; -> next frame: median {row['frame_ms_median']:.1f} ms")
