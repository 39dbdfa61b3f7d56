"""The book as a static website: `grpo-edu book html [OUT_DIR]`.

Every page comes from book.toml and the committed notebooks, outputs as committed:
nothing is re-executed, so the site shows exactly the numbers nbval checks. Markdown
goes through markdown-it (CommonMark, tables, `$...$` maths), code through Pygments,
and the maths is typeset in the reader's browser by KaTeX, which ships with the site
(`_static/katex`, MIT licence): the pages make no request outside their own folder, so
the site works from a folder (file://) as well as from a web server.

The explorers stay alive without a kernel. In a notebook they are ipywidgets whose
arithmetic runs in Python; on the site each one is rebuilt by `_static/explorers.js`,
which repeats that arithmetic in the browser (a handful of formulas: a group mean and
std, a clip, three KL estimators, the loss's per-token weights). Running the Python
itself in the browser (Pyodide) would ship tens of megabytes and seconds of start-up
for those formulas. The Python explorers stay the reference: tests/test_html_explorers.py
compares the browser's numbers with `grpo_edu.book.explorer_specs.python_state` over
hundreds of slider settings, and tests/test_site.py drags a slider of each explorer on
the built site. A page starts each explorer where the notebook's widget was saved; the
build refuses a notebook whose widget was saved in another state than its defaults.
"""

from __future__ import annotations

import functools
import html
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from grpo_edu.book import Book, Chapter, kernel_env

STATIC = Path(__file__).resolve().parent / "static"
MARKER = ".grpo-edu-site"          # marks a folder this command built (safe to replace)
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
EXPLORER_REPR = re.compile(r"^<(\w+Explorer): .*; live in a running kernel>$")
TAG_NOTES = {
    "gpu": "runs where a CUDA GPU is available; elsewhere the book reports it as skipped",
    "platform-numerics": "a training run: its last digits depend on the CPU's floating-point kernels",
}


class SiteError(ValueError):
    """The site cannot be built as asked (a bad OUT_DIR, an explorer saved mid-drag)."""


@dataclass(frozen=True)
class Page:
    path: str              # relative to the site's folder
    title: str
    html_bytes: int        # the page itself
    figure_bytes: int      # the PNGs it shows (files of their own)
    figures: int
    explorers: int


def page_name(chapter: Chapter) -> str:
    return f"{chapter.name}.html"


# ---------------------------------------------------------------------------- markdown

def _markdown():
    from markdown_it import MarkdownIt
    from mdit_py_plugins.anchors import anchors_plugin
    from mdit_py_plugins.dollarmath import dollarmath_plugin

    # html: the chapters fold hints and solutions in <details>; they are our own text.
    return (MarkdownIt("commonmark", {"html": True}).enable("table")
            .use(dollarmath_plugin, double_inline=True)
            .use(anchors_plugin, min_level=2, max_level=3))


def _code(source: str) -> str:
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer

    return highlight(source, PythonLexer(), HtmlFormatter(cssclass="highlight"))


def _pygments_css() -> str:
    from pygments.formatters import HtmlFormatter

    return HtmlFormatter(style="friendly").get_style_defs(".highlight")


# ---------------------------------------------------------------------------- outputs

class _Chapter:
    """Renders one chapter's cells; collects its figures and explorers."""

    def __init__(self, chapter: Chapter, out: Path, markdown, explorers):
        self.chapter, self.out, self.markdown = chapter, out, markdown
        self.explorer_data = explorers      # () -> explorer_data()
        self.figures: list[Path] = []
        self.explorers: list[str] = []

    def cells(self, notebook) -> str:
        parts = []
        for index, cell in enumerate(notebook.cells):
            if cell.cell_type == "markdown":
                parts.append(f'<div class="cell markdown">{site_links(self.markdown.render(cell.source))}</div>')
            elif cell.cell_type == "code":
                parts.append(self.code_cell(index, cell))
        return "\n".join(parts)

    def code_cell(self, index: int, cell) -> str:
        notes = "".join(f'<div class="cell-tag">{html.escape(TAG_NOTES[tag])}</div>'
                        for tag in cell.metadata.get("tags", []) if tag in TAG_NOTES)
        outputs = "".join(self.output(index, output) for output in cell.outputs)
        return (f'<div class="cell code">{notes}<div class="input">{_code(cell.source)}</div>'
                f'{outputs}</div>')

    def output(self, index: int, output) -> str:
        kind = output.output_type
        if kind == "stream":
            return f'<pre class="output {output.name}">{html.escape(ANSI.sub("", output.text))}</pre>'
        if kind == "error":
            trace = ANSI.sub("", "\n".join(output.traceback))
            return f'<pre class="output error">{html.escape(trace)}</pre>'
        data = output.get("data", {})
        if WIDGET_VIEW in data:
            return self.widget(data.get("text/plain", ""))
        if "image/png" in data:
            return self.figure(index, data["image/png"])
        if "text/html" in data:
            return f'<div class="output html">{data["text/html"]}</div>'
        if "text/plain" in data:
            return f'<pre class="output">{html.escape(ANSI.sub("", data["text/plain"]))}</pre>'
        raise SiteError(f"chapter {self.chapter.number} cell {index}: no renderer for output "
                        f"types {sorted(data)}")

    def figure(self, index: int, png_base64: str) -> str:
        import base64

        name = f"figures/{self.chapter.name}-{len(self.figures) + 1}.png"
        path = self.out / name
        path.write_bytes(base64.b64decode(png_base64))
        self.figures.append(path)
        label = f"Figure {len(self.figures)} of chapter {self.chapter.number} (cell {index + 1})"
        return f'<figure class="output"><img src="{name}" alt="{html.escape(label)}"></figure>'

    def widget(self, text: str) -> str:
        match = EXPLORER_REPR.match(text)
        explorer = self.explorer_data().get(match.group(1)) if match else None
        if explorer is None:
            # Any other widget is frozen on a static page: show what the notebook printed.
            return (f'<pre class="output">{html.escape(text)}</pre><p class="widget-note">'
                    "(a widget: live in a running kernel)</p>")
        if explorer["default"] != text:
            raise SiteError(f"chapter {self.chapter.number}: its {match.group(1)} was saved as {text!r}, "
                            f"but the site starts it at its defaults, {explorer['default']!r}; "
                            "rebuild the chapter")
        self.explorers.append(explorer["kind"])
        spec = json.dumps(explorer["spec"], separators=(",", ":")).replace("</", "<\\/")
        return (f'<div class="grpo-live" data-explorer="{explorer["kind"]}">'
                f'<script type="application/json" class="grpo-explorer-spec">{spec}</script>'
                f'<noscript><pre class="output">{html.escape(text)}</pre></noscript></div>')


_EXPLORER_DATA = """
import json, sys
from grpo_edu.book import explorer_specs as e
json.dump({name: {"kind": kind, "spec": e.spec(kind), "default": e.describe(kind)}
           for name, kind in e.KINDS.items()}, sys.stdout)
"""


def explorer_data() -> dict:
    """Per explorer class (AdvantageExplorer, ...): its kind, spec and default repr, computed
    as the chapters are: in a process of its own with the book's pinned floating-point
    kernels where the machine has them (the clipping explorer ships ratios that went through
    torch's exp). The site is then the same bytes on every such machine."""
    result = subprocess.run([sys.executable, "-c", _EXPLORER_DATA], env=kernel_env(),
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise SiteError(f"computing the explorers' specs failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout)


# ---------------------------------------------------------------------------- pages

def _page(title: str, body: str, nav: str = "", explorers: bool = False) -> str:
    styles = ["katex/katex.min.css", "pygments.css", "book.css", *(["explorers.css"] if explorers else [])]
    scripts = ["katex/katex.min.js", "book.js", *(["explorers.js"] if explorers else [])]
    links = "".join(f'<link rel="stylesheet" href="_static/{s}">' for s in styles)
    tags = "".join(f'<script src="_static/{s}"></script>' for s in scripts)
    return ("<!DOCTYPE html>\n"
            f'<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<link rel="icon" type="image/svg+xml" href="_static/favicon.svg">'
            f"<title>{html.escape(title)}</title>{links}{tags}</head>\n"
            f'<body>{nav}<main class="book">{body}</main>{nav}</body></html>\n')


HEADING = re.compile(r'<h2 id="([^"]+)">(.*?)</h2>', flags=re.S)


def _with_sections(body: str) -> str:
    """The chapter with a list of its sections under its title (the h2 headings)."""
    sections = HEADING.findall(body)
    if not sections or "</h1>" not in body:
        return body
    items = "".join(f'<li><a href="#{anchor}">{title}</a></li>' for anchor, title in sections)
    listing = f'<nav class="sections" aria-label="sections"><ul>{items}</ul></nav>'
    return body.replace("</h1>", "</h1>" + listing, 1)


def _nav(book: Book, index: int) -> str:
    chapters = book.chapters
    links = ['<a class="contents" href="index.html">Contents</a>']
    if index > 0:
        prev = chapters[index - 1]
        links.insert(0, f'<a rel="prev" href="{page_name(prev)}">&larr; {prev.number}. '
                        f"{html.escape(prev.title)}</a>")
    if index + 1 < len(chapters):
        after = chapters[index + 1]
        links.append(f'<a rel="next" href="{page_name(after)}">{after.number}. '
                     f"{html.escape(after.title)} &rarr;</a>")
    return f'<nav class="book-nav">{"".join(links)}</nav>'


_LINK = re.compile(r'(href|src)="(?:\.\./)?(?:(docs|chapters)/)?([\w./-]+?)\.(md|ipynb)(#[^"]*)?"')
_IMAGE = re.compile(r'src="(?:\.\./)?(?:docs/)?images/')


def site_links(text: str) -> str:
    """Links between the repository's files as links between the site's pages: a chapter's
    notebook is its page, docs/NAME.md is NAME.html, the README is the contents page."""
    def page(match: re.Match) -> str:
        attribute, folder, name, suffix, anchor = match.groups()
        if name.startswith(("http", "/")) or "/" in name:
            return match.group(0)
        target = "index" if (suffix, name) == ("md", "README") else name
        return f'{attribute}="{target}.html{anchor or ""}"'
    return _IMAGE.sub('src="images/', _LINK.sub(page, text))


def _contents(book: Book) -> str:
    rows, part = [], None
    for c in book.chapters:
        if c.part and c.part != part:
            part = c.part
            rows.append(f'<tr class="part"><td></td><td colspan="5">{html.escape(part)}</td></tr>')
        needs = ", ".join(str(n) for n in c.needs) or "-"
        rows.append(
            f'<tr><td class="number">{c.number}</td><td><a href="{page_name(c)}">{html.escape(c.title)}</a>'
            f'<div class="summary">{html.escape(c.summary)}</div></td><td>{needs}</td>'
            f'<td class="number">{book.reading_minutes(c)}&nbsp;min</td>'
            f'<td class="number">{c.budget_seconds}&nbsp;s</td>'
            f'<td><a class="download" href="notebooks/{c.path.name}" download>.ipynb</a></td></tr>')
    paths = "".join(f"<li><b>{html.escape(p.name)}</b> ({html.escape(p.who)}): "
                    + " &rarr; ".join(f'<a href="{page_name(book.chapter(n))}">{n}</a>' for n in p.chapters)
                    + f", about {book.path_minutes(p)} min"
                    + (f" ({book.path_minutes(p, p.optional)} min without chapter"
                       f"{'s' if len(p.optional) > 1 else ''} {', '.join(str(n) for n in p.optional)})"
                       if p.optional else "")
                    + "</li>" for p in book.paths)
    return (f"<h1>{html.escape(book.title)}</h1><p>{html.escape(book.description)}</p>"
            "<p>Every number on these pages is a committed output of a chapter that CI re-executes "
            "and compares. The explorers run in this page; to run the chapters "
            "themselves, download a notebook or clone the repository and run <code>make book</code>. "
            'Words: the <a href="glossary.html">glossary</a>; symbols: the '
            '<a href="notation.html">notation</a>.</p>'
            + (f'<h2>Ways through the book</h2><ul class="paths">{paths}</ul>' if paths else "")
            + '<p><img class="map" src="images/map.svg" alt="the chapters by part; an arrow from each chapter '
              'to the chapters that need it"></p>'
            "<table class=\"contents\"><thead><tr><th>#</th><th>chapter</th><th>needs</th><th>reading</th>"
            "<th>runs within</th><th>notebook</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def _doc_pages(book: Book, out: Path, markdown) -> list[Page]:
    """docs/*.md as pages of the site (the glossary, the notation, the references), images too."""
    docs = book.root / "docs"
    if (docs / "images").is_dir():
        shutil.copytree(docs / "images", out / "images")
    pages = []
    for source in sorted(docs.glob("*.md")):
        body = site_links(markdown.render(source.read_text()))
        heading = re.search(r"<h1[^>]*>(.*?)</h1>", body, flags=re.S)
        title = f"{re.sub('<[^>]+>', '', heading.group(1)) if heading else source.stem} - {book.title}"
        nav = '<nav class="book-nav"><a class="contents" href="index.html">Contents</a></nav>'
        text = _page(title, body, nav)
        (out / f"{source.stem}.html").write_text(text)
        pages.append(Page(f"{source.stem}.html", title, len(text.encode()), 0, 0, 0))
    return pages


def _prepare(out: Path) -> None:
    """An empty folder, or one this command built before (its contents are replaced)."""
    if out.exists():
        if not out.is_dir():
            raise SiteError(f"OUT_DIR: expected a folder, got the file {out}")
        if any(out.iterdir()) and not (out / MARKER).is_file():
            raise SiteError(f"OUT_DIR: expected an empty folder or an earlier build of the site, "
                            f"got {out}, which holds other files")
        shutil.rmtree(out)
    (out / "figures").mkdir(parents=True)
    (out / "notebooks").mkdir()
    (out / MARKER).write_text("built by `grpo-edu book html`; the whole folder is replaced on rebuild\n")


def build_site(book: Book, out: Path | str) -> list[Page]:
    """Write the site into `out`; return its pages, contents first."""
    out = Path(out)
    _prepare(out)
    static = out / "_static"
    shutil.copytree(STATIC, static)
    (static / "pygments.css").write_text(_pygments_css())
    markdown = _markdown()
    explorers = functools.cache(explorer_data)      # once, and only if a chapter has one

    pages = []
    index_html = _page(book.title, _contents(book))
    (out / "index.html").write_text(index_html)
    pages.append(Page("index.html", book.title, len(index_html.encode()), 0, 0, 0))
    pages += _doc_pages(book, out, markdown)
    for position, chapter in enumerate(book.chapters):
        notebook = nbformat.read(book.root / chapter.path, as_version=4)
        (out / "notebooks" / chapter.path.name).write_text(downloadable(book.root / chapter.path))
        renderer = _Chapter(chapter, out, markdown, explorers)
        body = _with_sections(renderer.cells(notebook))
        title = f"{chapter.number}. {chapter.title} - {book.title}"
        text = _page(title, body, _nav(book, position), explorers=bool(renderer.explorers))
        (out / page_name(chapter)).write_text(text)
        pages.append(Page(page_name(chapter), title, len(text.encode()),
                          sum(p.stat().st_size for p in renderer.figures), len(renderer.figures),
                          len(renderer.explorers)))
    return pages


INSTALL = ("**To run this notebook outside the book's repository**, install the book's package first, "
           "in a terminal or in a cell: `pip install \"grpo-edu[book]\"` (from a checkout of the repository: "
           "`pip wheel --no-deps .`, then `pip install \"grpo_edu-{version}-py3-none-any.whl[book]\"`). "
           "The chapter reads its configs and results from the package and writes its runs under `runs/` "
           "in the folder it runs in.")


def downloadable(path: Path) -> str:
    """The committed notebook as the website offers it: the install line as its first cell,
    every other cell (outputs included) as committed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version("grpo-edu")
    except PackageNotFoundError:
        release = "0.1.0"
    notebook = nbformat.read(path, as_version=4)
    cell = nbformat.v4.new_markdown_cell(INSTALL.format(version=release))
    cell["id"] = "install"
    notebook.cells.insert(0, cell)
    return nbformat.writes(notebook) + "\n"


def site_bytes(out: Path | str) -> int:
    """Everything in the built folder, assets included."""
    return sum(p.stat().st_size for p in Path(out).rglob("*") if p.is_file())
