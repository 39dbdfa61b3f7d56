"""The map of the book, drawn from book.toml: one column per part, one box per chapter, an
arrow from each chapter to the chapters that need it, and under them the reader paths with
their reading times (computed from the chapters, as the README's table states them). `grpo-edu book map` writes it as SVG
(docs/images/map.svg, which the README and the website show); the drawing is deterministic
(text kept as text, no date, a fixed id salt), so tests/test_prose.py can hold the committed
file to the manifest."""

from __future__ import annotations

import io
import textwrap

from grpo_edu.book import Book, path_line

BOX_W, BOX_H, GAP_X, GAP_Y = 2.5, 0.8, 0.9, 0.35
LINE = 0.32   # the height of one line of the paths' legend


def _positions(book: Book) -> dict[int, tuple[float, float]]:
    parts = list(book.parts) or [""]
    rows: dict[str, int] = {}
    where = {}
    for chapter in book.chapters:
        column = parts.index(chapter.part) if chapter.part in parts else 0
        row = rows.get(chapter.part, 0)
        rows[chapter.part] = row + 1
        where[chapter.number] = (column * (BOX_W + GAP_X), -row * (BOX_H + GAP_Y))
    return where


def draw_map(book: Book) -> str:
    """The map as an SVG document."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    where = _positions(book)
    parts = list(book.parts) or [""]
    rows = max(sum(c.part == p for c in book.chapters) for p in parts)
    width = len(parts) * (BOX_W + GAP_X) - GAP_X
    legend = [f"{p.name}: {path_line(book, p)}" for p in book.paths]
    legend_top = -rows * (BOX_H + GAP_Y) + BOX_H / 2 - 0.1
    height = rows * (BOX_H + GAP_Y) + 0.5 + (LINE * (len(legend) + 1) if legend else 0)
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": "grpo-edu-map",
                         "font.family": "sans-serif", "font.size": 9}):
        figure, axes = plt.subplots(figsize=(width * 1.1, height * 1.1))
        axes.set_xlim(-0.7, width + 0.1)
        axes.set_ylim(-height + 0.4, 1.1 + BOX_H / 2)
        axes.axis("off")
        for column, part in enumerate(parts):
            axes.text(column * (BOX_W + GAP_X) + BOX_W / 2, 0.85 + BOX_H / 2, part,
                      ha="center", va="bottom", fontsize=11, fontweight="bold")
        for chapter in book.chapters:
            x, y = where[chapter.number]
            axes.add_patch(FancyBboxPatch((x, y - BOX_H / 2), BOX_W, BOX_H, boxstyle="round,pad=0.02",
                                          facecolor="#eef3fb", edgecolor="#4a6fa5"))
            label = "\n".join(textwrap.wrap(f"{chapter.number}. {chapter.title}", 26))
            axes.text(x + BOX_W / 2, y, label, ha="center", va="center")
        if legend:
            axes.text(0, legend_top, "Ways through the book", ha="left", va="top", fontsize=10, fontweight="bold")
            for line, text in enumerate(legend, start=1):
                axes.text(0, legend_top - line * LINE, text, ha="left", va="top")
        for chapter in book.chapters:
            x, y = where[chapter.number]
            for need in chapter.needs:
                nx, ny = where[need]
                columns = round((x - nx) / (BOX_W + GAP_X))
                if columns == 0:   # same column: an arc along the left edges
                    rows = round((ny - y) / (BOX_H + GAP_Y))
                    start, end, bend = (x, ny), (x, y), 0.25 + 0.1 * rows
                elif columns == 1:
                    start, end, bend = (nx + BOX_W, ny), (x, y), 0.0
                else:              # over the columns between: an arc above them
                    start, end, bend = (nx + BOX_W / 2, ny + BOX_H / 2), (x + BOX_W / 2, y + BOX_H / 2), -0.12
                axes.annotate("", xy=end, xytext=start,
                              arrowprops=dict(arrowstyle="->", color="#7a7a7a", lw=0.9,
                                              connectionstyle=f"arc3,rad={bend}"))
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
        plt.close(figure)
    return buffer.getvalue()
