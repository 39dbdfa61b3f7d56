"""`grpo-edu book html`: the static site, checked without a browser (tests/test_site.py
opens it in Chromium). Built once per module from the committed notebooks."""

from __future__ import annotations

import html as htmllib
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

from grpo_edu import book as bookmod
from grpo_edu.commands import cli
from grpo_edu.book import html as site

ROOT = Path(__file__).resolve().parent.parent


class _Links(HTMLParser):
    """Every URL a page refers to: (tag, attribute, value)."""

    def __init__(self):
        super().__init__()
        self.urls: list[tuple[str, str, str]] = []
        self.classes: list[str] = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("href", "src") and value is not None:
                self.urls.append((tag, name, value))
            if name == "class" and value:
                self.classes.append(value)


def _parse(path: Path) -> _Links:
    parser = _Links()
    parser.feed(path.read_text())
    return parser


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("site") / "html"
    assert cli.main(["book", "html", str(out)]) == 0
    return out


def test_every_chapter_of_the_manifest_has_a_page_linked_from_the_contents(built):
    book = bookmod.load_book()
    contents = _parse(built / "index.html")
    pages = [value for tag, _, value in contents.urls if tag == "a" and value.endswith(".html")]
    chapter_pages = [site.page_name(c) for c in book.chapters]
    assert [p for p in dict.fromkeys(reversed(pages)) if p in chapter_pages][::-1] == chapter_pages  # the table's order
    assert {"glossary.html", "notation.html"} <= set(pages)
    for page in set(pages) - set(chapter_pages):     # the docs pages it links are built
        assert (built / page).is_file(), page
    downloads = [value for tag, _, value in contents.urls if value.startswith("notebooks/")]
    assert downloads == [f"notebooks/{c.path.name}" for c in book.chapters]
    for chapter in book.chapters:    # the download is the committed notebook, the install line first
        download = nbformat.read(built / "notebooks" / chapter.path.name, as_version=4)
        committed = nbformat.read(ROOT / chapter.path, as_version=4)
        assert download.cells[1:] == committed.cells and 'pip install \"grpo-edu[book]\"' in download.cells[0].source
    for chapter in book.chapters:
        text = (built / site.page_name(chapter)).read_text()
        assert f"<title>{htmllib.escape(f'{chapter.number}. {chapter.title}')}" in text


def test_a_new_chapter_in_the_manifest_gets_its_page(tmp_path):
    """The build reads book.toml: a chapter added there appears without touching the builder."""
    root = tmp_path / "book"
    shutil.copytree(ROOT / "chapters", root / "chapters", ignore=shutil.ignore_patterns("conftest.py"))
    first = root / "chapters" / "01_grpo_by_hand"
    last = bookmod.load_book(ROOT).chapters[-1]
    encore = f"{last.number + 1:02d}_encore"
    for suffix in (".ipynb", ".py"):
        shutil.copyfile(first.with_suffix(suffix), root / "chapters" / f"{encore}{suffix}")
    manifest = (ROOT / "book.toml").read_text() + (
        f'\n[[chapters]]\npath = "chapters/{encore}.ipynb"\ntitle = "Encore"\n'
        f'summary = "chapter 1 once more"\npart = "{last.part}"\nneeds = [1]\ntier = "cpu"\nbudget_seconds = 60\n')
    (root / "book.toml").write_text(manifest)
    pages = site.build_site(bookmod.load_book(root), tmp_path / "out")
    assert pages[-1].path == f"{encore}.html"
    assert f'href="{encore}.html"' in (tmp_path / "out" / "index.html").read_text()
    assert f'rel="next" href="{encore}.html"' in (tmp_path / "out" / site.page_name(last)).read_text()


def test_every_link_and_resource_is_inside_the_site(built):
    """No page loads anything from outside its folder: no CDN, no web font, no absolute path. A
    link a reader follows to a paper (an <a> to https://) is a citation, not a resource."""
    checked = 0
    for page in sorted(built.glob("*.html")):
        text = page.read_text()
        for tag, attribute, url in _parse(page).urls:
            if tag == "a" and attribute == "href" and url.startswith("https://"):
                continue
            assert not re.match(r"^[a-z][a-z0-9+.-]*:|^//|^/", url), f"{page.name}: {tag} {attribute}={url}"
            path, _, anchor = url.partition("#")
            target = built / path if path else page
            assert target.is_file(), f"{page.name}: {tag} {attribute}={url} does not exist"
            if anchor:
                assert f'id="{anchor}"' in target.read_text(), f"{page.name}: no #{anchor} in {target.name}"
            checked += 1
        if page.name[:2].isdigit():       # each chapter lists its sections under its title
            assert text.count('<nav class="sections"') == 1 and 'href="#' in text
    for css in built.rglob("*.css"):       # the fonts KaTeX's stylesheet names are there, woff2 first
        for url in re.findall(r"url\(([^)]+)\)", css.read_text()):
            assert not re.match(r"^['\"]?([a-z]+:|//|/)", url), f"{css}: url({url})"
    assert checked > 50


def test_katex_fonts_in_woff2_are_shipped(built):
    css = (built / "_static" / "katex" / "katex.min.css").read_text()
    fonts = set(re.findall(r"url\((fonts/[^)]+\.woff2)\)", css))
    assert len(fonts) >= 15
    for font in fonts:
        assert (built / "_static" / "katex" / font).is_file(), font


def _outputs(notebook):
    for cell in notebook.cells:
        if cell.cell_type == "code":
            yield from cell.outputs


def test_every_output_of_every_chapter_is_on_its_page(built):
    """Printed text verbatim (escaped), one image file per PNG, one live explorer per explorer."""
    book = bookmod.load_book()
    for chapter in book.chapters:
        notebook = nbformat.read(ROOT / chapter.path, as_version=4)
        text = (built / site.page_name(chapter)).read_text()
        pngs = explorers = 0
        for output in _outputs(notebook):
            if output.output_type == "stream":
                assert htmllib.escape(output.text) in text, f"{chapter.name}: missing printed output"
            data = output.get("data", {})
            if site.WIDGET_VIEW in data:
                explorers += 1
            elif "image/png" in data:
                pngs += 1
            elif "text/html" in data:    # our own HTML (a claims cell, a checker's report): as it is
                assert data["text/html"] in text, f"{chapter.name}: missing HTML result"
            elif "text/plain" in data:
                assert htmllib.escape(data["text/plain"]) in text, f"{chapter.name}: missing result"
        assert text.count('<figure class="output"><img') == pngs
        assert len(list(built.glob(f"figures/{chapter.name}-*.png"))) == pngs
        assert text.count('class="grpo-live"') == explorers


def test_maths_is_marked_for_katex_and_not_mangled_by_markdown(built):
    text = (built / "01_grpo_by_hand.html").read_text()
    formulas = re.findall(r'<(span|div) class="math (inline|block)">(.*?)</\1>', text, flags=re.S)
    assert len(formulas) > 40
    sources = {htmllib.unescape(source) for _, _, source in formulas}
    assert r"\pi_{\theta_\text{old}}" in sources        # underscores survive (no <em>)
    assert any(tag == "div" for tag, _, _ in formulas)   # displayed equations


def test_exercises_keep_their_hints_and_solutions_folded(built):
    """Every <details> of every chapter is on its page, closed, its code still a code block."""
    total = 0
    for chapter in bookmod.load_book().chapters:
        notebook = nbformat.read(ROOT / chapter.path, as_version=4)
        source = "".join(c.source for c in notebook.cells if c.cell_type == "markdown")
        text = (built / site.page_name(chapter)).read_text()
        for summary in ("Hint", "Solution", "Answer"):
            tag = f"<details><summary>{summary}</summary>"
            assert text.count(tag) == source.count(tag), f"{chapter.name}: {summary}"
            total += source.count(tag)
        assert "<details open" not in text
    assert total >= 50
    solution = (built / "02_interactive.html").read_text().split("<details><summary>Solution</summary>")[1]
    assert '<code class="language-python">' in solution.split("</details>")[0]


def test_each_explorer_page_carries_the_spec_its_script_needs(built):
    from grpo_edu.book import explorer_specs

    data = site.explorer_data()             # as the build computes it: pinned, in a process of its own
    text = (built / "02_interactive.html").read_text()
    blocks = re.findall(r'<div class="grpo-live" data-explorer="(\w+)"><script type="application/json" '
                        r'class="grpo-explorer-spec">(.*?)</script>', text, flags=re.S)
    assert [kind for kind, _ in blocks] == ["advantage", "clipping", "kl", "length_bias"]
    by_kind = {entry["kind"]: entry for entry in data.values()}
    for kind, spec in blocks:
        assert json.loads(spec) == by_kind[kind]["spec"]
        here = explorer_specs.spec(kind)       # this process's kernels: the same up to exp's last bit
        assert set(here) == set(by_kind[kind]["spec"])
        assert by_kind[kind]["default"] == explorer_specs.describe(kind)
    assert '<script src="_static/explorers.js">' in text
    for chapter in ("01_grpo_by_hand", "04_loss_variants"):     # the explorers where their ideas appear
        assert '<script src="_static/explorers.js">' in (built / f"{chapter}.html").read_text()
    assert "explorers.js" not in (built / "03_masked_step.html").read_text()


def test_an_explorer_saved_in_another_state_is_refused(tmp_path):
    """The page starts each explorer at its defaults; a notebook saved after a drag would
    show numbers the page does not, so the build stops and names the chapter."""
    root = tmp_path / "book"
    shutil.copytree(ROOT / "chapters", root / "chapters", ignore=shutil.ignore_patterns("conftest.py"))
    shutil.copyfile(ROOT / "book.toml", root / "book.toml")
    path = root / "chapters" / "02_interactive.ipynb"
    notebook = nbformat.read(path, as_version=4)
    for output in _outputs(notebook):
        plain = output.get("data", {}).get("text/plain", "")
        if plain.startswith("<AdvantageExplorer"):
            output["data"]["text/plain"] = plain.replace("G = 4", "G = 5")
    nbformat.write(notebook, path)
    with pytest.raises(site.SiteError, match=r"chapter 2: its AdvantageExplorer was saved as .*G = 5"):
        site.build_site(bookmod.load_book(root), tmp_path / "out")


def test_out_dir_is_replaced_only_when_it_is_an_earlier_build(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    assert cli.main(["book", "html", str(out)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("grpo-edu book: OUT_DIR: expected an empty folder or an earlier build")
    assert "\n" not in error and (out / "thesis.tex").read_text() == "precious"

    site_dir = tmp_path / "site"
    assert cli.main(["book", "html", str(site_dir)]) == 0
    (site_dir / "stale.html").write_text("old")
    assert cli.main(["book", "html", str(site_dir)]) == 0       # a rebuild replaces everything
    assert not (site_dir / "stale.html").exists()
    printed = capsys.readouterr().out
    assert "02_interactive.html" in printed and "open file://" in printed

    afile = tmp_path / "file"
    afile.write_text("")
    assert cli.main(["book", "html", str(afile)]) == 2
    assert "OUT_DIR: expected a folder, got the file" in capsys.readouterr().err


def test_two_builds_are_the_same_bytes(built, tmp_path):
    """Nothing in a page depends on the time, the folder or the order files are listed in
    (the explorers' specs are computed under the pinned kernels: the same on every machine)."""
    site.build_site(bookmod.load_book(), tmp_path / "again")
    first = {p.relative_to(built): p.read_bytes() for p in built.rglob("*") if p.is_file()}
    second = {p.relative_to(tmp_path / "again"): p.read_bytes()
              for p in (tmp_path / "again").rglob("*") if p.is_file()}
    assert first.keys() == second.keys()
    assert [name for name in first if first[name] != second[name]] == []
