"""The README is a front door, and it and the docs pages behind it point only at what exists.

- every relative link in README.md and docs/*.md resolves to a file of the repository, and a
  #anchor into a Markdown file to one of its headings (GitHub's slugs: lower case, punctuation
  dropped, spaces as hyphens, a repeated heading numbered -1, -2, ...);
- every command the README shows (in shell code blocks and inline code) exists: `make X` is a Makefile
  target, `grpo-edu SUB` (and `python -m grpo_edu SUB`) a subcommand of the CLI's parser,
  `grpo-edu book ACTION` one of its book actions, `python path/to/script.py` a file,
  `python -m module` an importable module, `--config path` a file. The docs pages are held to
  the same, except that a `--config` there may name a reader's own file (`my.toml`): only the
  paths under configs/ must exist;
- the README has at most 1,500 words: whitespace-separated tokens of the Markdown source, code
  blocks and the caption included, the chapter table excluded (the block that
  `grpo-edu book list --markdown` prints, and any other line that starts with "|");
- the README's picture is docs/figures.py's, with the caption that script computes from the
  committed results file.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path

import pytest

from grpo_edu import book as bookmod
from grpo_edu.commands.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAX_WORDS = 1500

_LINK = re.compile(r"!?\[(?:[^\]]|\][^(])*?\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[ \t]*$", re.S | re.M)
_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_EXTERNAL = re.compile(r"^([a-z][a-z0-9+.-]*:|//)", re.I)


def _ids(path: Path) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in path] if isinstance(path, list) else str(path.relative_to(ROOT))


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: Markdown's inline marks dropped, lower case, every
    character but letters, digits, '_', '-' and spaces dropped, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # a link: its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every heading's anchor in a Markdown file (headings inside fenced code are not headings)."""
    seen: dict[str, int] = {}
    found = set()
    for line in _FENCE.sub("", markdown).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = github_slug(match.group(1))
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def links(markdown: str) -> list[str]:
    """The targets of the Markdown links and images outside code."""
    prose = _INLINE_CODE.sub("", _FENCE.sub("", markdown))
    return [m.group(1) for m in _LINK.finditer(prose)]


def code_lines(markdown: str) -> list[str]:
    """Each line of shell code (fenced as bash, sh or shell), and each inline code span, with a
    trailing '# comment' cut. Other fences (a file tree, a program's output) are not commands."""
    lines = []
    for block in _FENCE.finditer(markdown):
        first, *body = block.group(0).split("\n")[:-1]
        if first.strip("`~ \t").lower() in ("bash", "sh", "shell"):
            lines += [line.split("  #")[0].strip() for line in body]
    prose = _FENCE.sub("", markdown)
    lines += [m.group(1).strip() for m in _INLINE_CODE.finditer(prose)]
    return [line for line in lines if line]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:     # argparse keeps its subparsers here, and nowhere public
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


COMMANDS = _subcommands(build_parser())
BOOK_ACTIONS = _subcommands(COMMANDS["book"])
MAKE_TARGETS = set(re.findall(r"^([A-Za-z][\w-]*):(?!=)", (ROOT / "Makefile").read_text(), re.M))


def command_problems(markdown: str, strict_config: bool) -> list[str]:
    """What the code of a page names that does not exist (empty: every command exists)."""
    problems = []
    for line in code_lines(markdown):
        for target in re.findall(r"(?:^|[\s;&|(])make\s+([a-z][\w-]*)", line):
            if target not in MAKE_TARGETS:
                problems.append(f"make {target}: no such Makefile target ({line!r})")
        for sub, rest in re.findall(r"(?:grpo-edu|-m grpo_edu)\s+([a-z][\w-]*)((?:\s+[\w-]+)?)", line):
            if sub not in COMMANDS:
                problems.append(f"grpo-edu {sub}: no such subcommand ({line!r})")
            elif sub == "book" and rest.strip() and rest.strip() not in BOOK_ACTIONS:
                problems.append(f"grpo-edu book {rest.strip()}: no such action ({line!r})")
        for script in re.findall(r"(?:^|\s)python3?\s+((?:[\w.-]+/)*[\w.-]+\.py)\b", line):
            if not (ROOT / script).is_file():
                problems.append(f"python {script}: no such file ({line!r})")
        for module in re.findall(r"(?:^|\s)python3?\s+-m\s+([\w.]+)", line):
            if importlib.util.find_spec(module) is None:
                problems.append(f"python -m {module}: no such module ({line!r})")
        for config in re.findall(r"--config\s+([\w./-]+)", line):
            if (strict_config or config.startswith("configs/")) and not (ROOT / config).is_file():
                problems.append(f"--config {config}: no such file ({line!r})")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=_ids)
def test_every_relative_link_resolves(page):
    text = page.read_text()
    broken = []
    for target in links(text):
        if _EXTERNAL.match(target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=_ids)
def test_every_command_shown_exists(page):
    assert not command_problems(page.read_text(), strict_config=page == README)


def test_the_readme_is_a_front_door():
    """At most MAX_WORDS words, the chapter table not counted (see the module's docstring)."""
    text = README.read_text()
    text = text.replace(bookmod.chapter_table(bookmod.load_book()), "")
    words = sum(len(line.split()) for line in text.splitlines() if not line.lstrip().startswith("|"))
    assert words <= MAX_WORDS, f"README.md has {words} words besides the chapter table (at most {MAX_WORDS})"


def test_every_docs_page_has_a_title_and_a_way_back():
    for page in PAGES[1:]:
        lines = page.read_text().splitlines()
        assert lines[0].startswith("# "), page.name
        assert "](../README.md)" in "\n".join(lines[:5]), f"{page.name}: no link back to the README"


def test_the_readme_picture_and_its_caption_come_from_the_results_file():
    spec = importlib.util.spec_from_file_location("docs_figures", ROOT / "docs" / "figures.py")
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    readme = README.read_text()
    assert f"]({figures.IMAGE.relative_to(ROOT)})" in readme
    assert figures.caption() in readme, "README.md's caption is not docs/figures.py's; paste:\n" + figures.caption()
    assert figures.IMAGE.stat().st_size < 60_000


def test_the_checks_catch_what_they_are_for():
    """A link to a missing file or heading, and a command that does not exist, are each found."""
    assert github_slug("Training: `grpo-edu train`") == "training-grpo-edu-train"
    assert github_slug("vLLM: the GPU tier's sampler") == "vllm-the-gpu-tiers-sampler"
    assert anchors("# A\n## B\n## B\n```\n## not a heading\n```\n") == {"a", "b", "b-1"}
    assert links("see [x](docs/x.md#y) and `[z](not/a/link)`") == ["docs/x.md#y"]
    shown = "```bash\nmake nothing\ngrpo-edu fly\ngrpo-edu book burn 1\npython no/such.py\n```\n" \
            "`grpo-edu train --config configs/none.toml`"
    assert len(command_problems(shown, strict_config=True)) == 5
    assert command_problems("`make test`, `grpo-edu book run 1`, `python -m grpo_edu train`", True) == []
