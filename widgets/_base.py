"""What every explorer shares: a figure that renders to a PNG widget, HTML tables whose
cells carry their exact values, and the Explorer class (controls -> compute -> show).

An explorer computes a plain, frozen `state` from its controls with grpo_edu's own
functions, then shows it. Tests set control values and read `state` (or the table
HTML, as a browser would); the benchmark times a value change to the new PNG.
"""

from __future__ import annotations

import html
import io
import time
from contextlib import contextmanager

import ipywidgets as widgets
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image


class Plot:
    """A matplotlib Figure drawn off-screen (Agg) into an ipywidgets Image.

    Not pyplot: the figure never leaks into the notebook's inline output. Redrawing is
    blitted: the axes, ticks and labels are drawn once into a cached background, and an
    update draws only the artists that move over it (a full draw costs 3 to 5 times as
    much, most of it text). A change of `layout` (axis limits, number of bars) redraws
    everything once and caches the new background.
    """

    def __init__(self, width: float, height: float, ncols: int = 1, dpi: int = 90):
        self.figure = Figure(figsize=(width, height), dpi=dpi)
        self.canvas = FigureCanvasAgg(self.figure)
        axes = self.figure.subplots(1, ncols, squeeze=False)[0]
        self.axes = list(axes)
        self.image = widgets.Image(format="png", layout=widgets.Layout(
            width=f"{round(width * dpi)}px", height=f"{round(height * dpi)}px"))
        self._background = None
        self._layout = None
        self.full_draws = 0

    def invalidate(self) -> None:
        """Forget the cached background (the static part of the figure changed)."""
        self._background = None

    def render(self, animated=(), layout=None) -> None:
        """Draw the figure (`animated`: the artists that change) and publish it as PNG."""
        animated = list(animated)
        if self._background is None or layout != self._layout:
            for artist in animated:
                artist.set_animated(True)
            self.canvas.draw()                    # everything except the animated artists
            self._background = self.canvas.copy_from_bbox(self.figure.bbox)
            self._layout = layout
            self.full_draws += 1
        else:
            self.canvas.restore_region(self._background)
        for artist in animated:
            artist.set_animated(True)
            self.figure.draw_artist(artist)
        size = self.canvas.get_width_height()
        png = io.BytesIO()
        # The figure is opaque: RGB encodes faster than RGBA; level 1 is fast, and at
        # this size barely larger than the default level.
        rgba = Image.frombuffer("RGBA", size, self.canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
        rgba.convert("RGB").save(png, format="png", compress_level=1)
        self.image.value = png.getvalue()


def decade_limits(low: float, high: float, pad: float = 1.0) -> tuple[float, float]:
    """Log-axis limits on whole decades around [low, high] (they change rarely, so the
    blitted background can be reused while a slider moves)."""
    return 10.0 ** (np.floor(np.log10(low)) - pad + 1) / 2, 10.0 ** (np.ceil(np.log10(high)) + pad - 1) * 2


def sticky_limits(current, low: float, high: float, propose, slack: float):
    """Keep the `current` (bottom, top) axis limits while [low, high] fits inside them with
    at most a factor `slack` to spare at either end; else `propose(low, high)`. Fewer limit
    changes mean fewer full redraws while a slider is dragged."""
    if current is not None:
        bottom, top = current
        if bottom <= low and high <= top and _within(bottom, low, slack) and _within(top, high, slack):
            return current
    return propose(low, high)


def _within(limit: float, value: float, slack: float) -> bool:
    if limit > 0 and value > 0:
        return limit / value <= slack and value / limit <= slack
    return abs(limit) <= slack * max(abs(value), 1e-12)


def nice_limit(value: float) -> float:
    """The smallest of 1, 2, 5 x 10^k that is >= value (value > 0)."""
    exponent = np.floor(np.log10(value))
    for step in (1.0, 2.0, 5.0, 10.0):
        if step * 10.0 ** exponent >= value * (1 - 1e-12):
            return float(step * 10.0 ** exponent)
    return float(10.0 ** (exponent + 1))


def snap(value: float) -> float:
    """A float slider's value without the browser's rounding noise.

    The front end computes slider values in JavaScript and sends back, say,
    0.8999999999999999 for 0.9. Rounded to 9 decimals (far below any slider step),
    four rewards set to 0.9 compare equal, and an advantage set to 0 is 0.
    """
    return round(float(value), 9) + 0.0


def fmt(value: float, digits: int = 4) -> str:
    """A signed number at fixed precision, never '-0.0000'."""
    return f"{round(float(value), digits) + 0.0:+.{digits}f}"


def cell(value: float, css: str = "", digits: int = 4, **data) -> str:
    """A table cell that shows `value` rounded and carries it exactly in data-value."""
    attributes = "".join(f' data-{k.replace("_", "-")}="{html.escape(str(v))}"'
                         for k, v in data.items())
    return (f'<td class="{css}" data-value="{float(value)!r}"{attributes} style="{PAD}">'
            f"{fmt(value, digits)}</td>")


PAD = "padding: 1px 8px"


def table(css: str, header: list[str], rows: list[list[str]]) -> str:
    """An HTML table; `rows` hold ready <td> strings or plain text."""
    head = "".join(f'<th style="{PAD}">{html.escape(h)}</th>' for h in header)
    body = "".join("<tr>" + "".join(c if c.startswith("<td") else f'<td style="{PAD}">{html.escape(c)}</td>'
                                    for c in row) + "</tr>" for row in rows)
    return (f'<table class="grpo-table {css}" style="border-collapse: collapse; '
            f'font-family: monospace; text-align: right">'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def notes_html(css: str, notes: list[str]) -> str:
    items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return f'<ul class="{css}" style="margin: 0.3em 0">{items}</ul>' if notes else ""


class Explorer:
    """Base class: subclasses build `controls`, `compute()` a state, and `show()` it."""

    css = "grpo-explorer"

    def __init__(self):
        self._held = 0
        self.updates = 0
        self.last_update_seconds: float | None = None    # controls -> new table and PNG
        self.last_compute_seconds: float | None = None   # of which grpo_edu's computation
        self.state = None

    # -- wiring
    def _observe(self, *controls: widgets.Widget) -> None:
        for control in controls:
            control.observe(self._on_change, names="value")

    def _on_change(self, change=None) -> None:
        if not self._held:
            self.update()

    @contextmanager
    def hold(self):
        """Change several controls, then update once."""
        self._held += 1
        try:
            yield self
        finally:
            self._held -= 1
        if not self._held:
            self.update()

    def update(self) -> None:
        start = time.perf_counter()
        self.state = self.compute()
        computed = time.perf_counter()
        self.show(self.state)
        self.updates += 1
        self.last_compute_seconds = computed - start
        self.last_update_seconds = time.perf_counter() - start

    def compute(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def show(self, state) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- display
    def _assemble(self, *children: widgets.Widget) -> widgets.VBox:
        box = widgets.VBox(list(children))
        box.add_class("grpo-explorer")
        box.add_class(self.css)
        return box

    def _repr_mimebundle_(self, include=None, exclude=None, **kwargs):
        # The widget view for a live kernel; a short, stable text/plain for everything
        # else (nbval compares it; the default repr of a VBox lists every child's state).
        bundle = self.widget._repr_mimebundle_(include=include, exclude=exclude, **kwargs)
        bundle["text/plain"] = repr(self)
        return bundle

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.describe()}; live in a running kernel>"

    def describe(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def report(self) -> str:  # pragma: no cover - abstract
        """The state's key numbers as plain text (for a print() in the chapter)."""
        raise NotImplementedError
