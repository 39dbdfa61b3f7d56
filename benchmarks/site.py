"""The static site's figures: each page's size and load time, and how fast each live explorer
answers its sliders, in headless Chromium.

    python benchmarks/site.py [--positions 25] [--http]

Builds the site (`grpo-edu book html`) into a temporary folder and opens it from the folder
(file://; --http serves it on localhost instead). Per page: the HTML and its figures in KiB,
the time to the load event, and the time KaTeX took to typeset its maths. On chapter 2, every
range input of every explorer is swept through `--positions` values; each value is set as a
drag sets it (an `input` event) just after a frame begins, and timed: the event to the end of
the explorer's update (compute, table, notes, SVG); "next frame" counts the updates that were
on screen at the very next frame (none dropped). Target: an update well inside one 60 Hz frame
(16.7 ms); the Python explorers in a kernel take 10 to 100 ms (benchmarks/widgets.py), before
the websocket's round trip.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import tempfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from grpo_edu import book as bookmod
from grpo_edu.book import html as site

CHROMIUM = os.environ.get("GRPO_EDU_CHROMIUM", "/usr/bin/chromium")
FRAME_MS = 1000 / 60
FLAGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"]

# Sweeps every range input of an explorer; resolves to {control: [[handled ms, frame ms], ...]}.
SWEEP = """async ([root, positions]) => {
    const frame = () => new Promise(done => requestAnimationFrame(done));
    const name = input => [...input.classList, ...input.parentElement.classList].find(c => c.startsWith('grpo-'));
    const results = {};
    // By name, looked up afresh each time: changing G rebuilds the reward sliders.
    for (const control of [...root.querySelectorAll('input[type=range]')].map(name)) {
        const find = () => [...root.querySelectorAll('input[type=range]')].find(i => name(i) === control);
        const start = find().value;
        const times = [];
        for (let k = 0; k <= positions; k++) {
            const input = find(), low = +input.min, high = +input.max;
            for (const value of [low + (high - low) * k / positions, start]) {
                const target = find();
                await frame();
                const t0 = performance.now();
                target.value = value;
                target.dispatchEvent(new Event('input', {bubbles: true}));
                const handled = performance.now() - t0;
                await frame();
                times.push([handled, performance.now() - t0]);
            }
        }
        results[control] = times;
    }
    return results;
}"""


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--positions", type=int, default=25, help="values per slider (default 25)")
    parser.add_argument("--http", action="store_true", help="serve the site on localhost instead of file://")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    out = Path(tempfile.mkdtemp()) / "html"
    pages = site.build_site(bookmod.load_book(), out)
    server = None
    if args.http:
        server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(out)))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{server.server_address[1]}/"
    else:
        base = out.as_uri() + "/"
    print(f"{platform.processor() or platform.machine()}, Chromium {CHROMIUM}, {base.split(':')[0]}")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        print(f"\n{'page':<32} {'html':>8} {'figures':>8} {'load':>8} {'maths':>12}")
        for entry in pages:
            page.goto(base + entry.path)
            page.wait_for_function("() => document.documentElement.dataset.mathsTypeset !== undefined")
            load = page.evaluate("() => { const n = performance.getEntriesByType('navigation')[0];"
                                 " return n.loadEventEnd - n.startTime; }")
            maths = page.evaluate("() => [+document.documentElement.dataset.mathsTypeset,"
                                  " +document.documentElement.dataset.mathsMs]")
            figures = f"{entry.figure_bytes / 1024:.0f} KiB" if entry.figures else "-"
            print(f"{entry.path:<32} {entry.html_bytes / 1024:>4.0f} KiB {figures:>8} {load:>5.0f} ms "
                  f"{maths[0]:>4} in {maths[1]:>3.0f} ms")
        print(f"site folder: {site.site_bytes(out) / 2**20:.1f} MiB (KaTeX and the notebooks included)")

        page.goto(base + "02_interactive.html")
        page.wait_for_function("() => document.querySelectorAll('.grpo-explorer').length === 4")
        print(f"\n{'explorer':<26} {'control':<26} {'n':>4} {'update median':>14} {'p95':>7} {'max':>7}"
              f" {'next frame':>11}")
        for root in page.query_selector_all(".grpo-explorer"):
            css = next(c for c in root.get_attribute("class").split() if c.endswith("-explorer")
                       and c != "grpo-explorer")
            for control, times in page.evaluate(SWEEP, [root, args.positions]).items():
                handled = [h for h, _ in times]
                # Set just after a frame began: on screen at the next one unless the update
                # overran it (the next frame's callback comes within ~1.5 frame periods).
                on_time = sum(f < FRAME_MS * 1.5 for _, f in times)
                print(f"{css:<26} {control:<26} {len(times):>4} {statistics.median(handled):>11.2f} ms "
                      f"{_percentile(handled, 0.95):>7.2f} {max(handled):>7.2f} {on_time:>5} of {len(times)}")
        browser.close()
    if server is not None:
        server.shutdown()


if __name__ == "__main__":
    main()
