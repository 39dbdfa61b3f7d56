"""Every word is taught before it is used, on every path.

- every glossary entry (docs/glossary.md) names the chapter where the book first uses its term:
  "where the book first explains it: chapter M", with "(named first in chapter N)" where a
  chapter names it before the one that explains it. The term (or, for an acronym, its
  expansion) appears in that first chapter's markdown and in no earlier chapter's;
- every notation symbol (docs/notation.md) appears in its row's "first in chapter" and in no
  earlier chapter. A symbol in $...$ is looked for in the chapters' maths (inline and display),
  written as LaTeX; the few the prose also writes in plain text (the table says which: B, S,
  k1 ...) are looked for in plain text too (PLAIN below); a symbol written without $ (the lag k)
  is looked for in plain text only;
- every reader path of book.toml holds, before each of its chapters, every chapter that chapter
  needs, and still does with its optional chapters left out; each path's reading time in the
  README is the sum of its chapters' (book.chapter_table), and the one-sitting path fits an hour.

A chapter's markdown is its notebook's markdown cells (headings, tables, inline code and folded
notes included: a word a reader meets there is used there), with link targets and fenced code
blocks left out (a loop's `k` in pseudocode is not the lag).
Matching is by whole word: a term with a capital letter matches case for case, one without in
any case; a term of several words or a hyphenated one also matches in the plural (zero-std
groups, mini-batches), a plain word only as written (so that "a slider that lags" is not the
lag, nor "it ranks" a rank); a line may break between a term's words. A plain symbol matches
any standalone use of its letter: the test cannot tell the lag k from pass@k's k, so the table
states where the letter itself first appears.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from grpo_edu import book as bookmod
from grpo_edu.book import prose

ROOT = Path(__file__).resolve().parents[1]

_ENTRY = re.compile(r"^[-*]\s+\*\*(?P<term>[^*]+)\*\*(?:\s*\((?P<expansion>[^)]+)\))?:(?P<body>.*)$", re.M)
_EXPLAINED = re.compile(r"where the book first explains it: chapters? (\d+)")
_NAMED = re.compile(r"\(named first in chapter (\d+)\)")
_MATH = re.compile(r"\$\$(.+?)\$\$|\$([^$\n]+)\$", re.S)
_LINK_TARGET = re.compile(r"\]\([^)]*\)")
_FENCED = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.S | re.M)

# Symbols the chapters also write in plain text, as the notation table says ("the prose writes
# B"; chapter 3's "P prompt columns"; chapter 1's k1 and k3; the mask only in words or as `completion_mask`;
# a token of a completion in words). Keys are notation.md's symbols, normalised as _latex does.
PLAIN = {
    "B": [r"B"], "S": [r"S"], "P": [r"P"], "T": [r"T"], "V": [r"V"],
    "k_1": [r"k1"], "k_2": [r"k2"], "k_3": [r"k3"],
    "m_i,t": [r"completion[ _]mask"],
    "o_i,t": [r"token \$t\$ of (?:response|completion) \$i\$"],
}


# ----------------------------------------------------------------- reading the pages

def glossary_entries(text: str) -> list[dict]:
    """Each entry: its names (an entry may define several: "k1, k2, k3"), its acronym's
    expansion, the chapter that first explains it and the one that first uses it."""
    entries = []
    for match in _ENTRY.finditer(text):
        body = match.group("body")
        explained = _EXPLAINED.search(body)
        named = _NAMED.search(body)
        entries.append({
            "term": match.group("term"),
            "names": [name.strip() for name in match.group("term").split(",")],
            "expansion": match.group("expansion"),
            "explained": int(explained.group(1)) if explained else None,
            "first": int(named.group(1)) if named else (int(explained.group(1)) if explained else None),
        })
    return entries


def notation_rows(text: str) -> list[dict]:
    """Each row of the symbol table: its symbols as LaTeX (in $...$) and as plain text (written
    without $), and its "first in chapter"."""
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or len(cells) != 4 or not cells[3].isdigit():
            continue
        latex = [_latex(symbol) for symbol in re.findall(r"\$([^$]+)\$", cells[0])]
        plain = [] if latex else [cells[0]]
        rows.append({"symbol": cells[0], "latex": latex, "plain": plain, "first": int(cells[3])})
    return rows


def _latex(text: str) -> str:
    """LaTeX with the spellings of one symbol made one: no spaces, braces or thin spaces;
    \\Vert as \\|, \\lvert/\\rvert as |, \\mathrm and \\operatorname dropped."""
    text = re.sub(r"\\[,;!]", "", text)
    for old, new in ((r"\Vert", r"\|"), (r"\lvert", "|"), (r"\rvert", "|"), (r"\mathrm", ""),
                     (r"\operatorname", "")):
        text = text.replace(old, new)
    return re.sub(r"[\s{}]", "", text)


def term_pattern(term: str) -> re.Pattern:
    """A whole-word match of a glossary term (a phrase's plural included); case for case where
    the term has a capital letter (an acronym, a name), any case otherwise."""
    flags = 0 if any(ch.isupper() for ch in term) else re.I
    plural = "(?:s|es)?" if re.search(r"[ -]", term) else ""
    words = r"\s+".join(re.escape(word) for word in term.split())     # a line may break between words
    return re.compile(rf"(?<![\w]){words}{plural}(?![\w])", flags)


def uses_term(markdown: str, entry: dict) -> bool:
    names = entry["names"] + ([entry["expansion"]] if entry["expansion"] else [])
    return any(term_pattern(name).search(markdown) for name in names)


def uses_symbol(markdown: str, row: dict) -> bool:
    maths = [_latex(a or b) for a, b in _MATH.findall(markdown)]
    for symbol in row["latex"]:
        # not the tail of a longer name (\bar r is not r), nor the head of one with more
        # subscripts or letters after it (o_i is not o_{i,t}, \tau is not \taurus)
        found = re.compile(rf"(?<![A-Za-z\\]){re.escape(symbol)}(?![A-Za-z0-9_,])")
        if any(found.search(m) for m in maths):
            return True
    # PLAIN's forms are patterns; a symbol the table writes without $ is taken literally
    plain = [re.escape(s) for s in row["plain"]] + [f for symbol in row["latex"] for f in PLAIN.get(symbol, [])]
    for form in plain:
        # a plain symbol is a token of its own: not part of a word, a hyphenated name (top-k),
        # pass@k or a LaTeX command
        if re.search(r"(?<![\w@\\{-])" + form + r"(?![\w@}-])", markdown):
            return True
    return False


def chapter_markdown(book) -> dict[int, str]:
    markdown = {c.number: prose.markdown_of(json.loads((book.root / c.path).read_text())["cells"])
                for c in book.chapters}
    return {number: _FENCED.sub("\n", _LINK_TARGET.sub("]", text)) for number, text in markdown.items()}


def first_use_problems(chapters: dict[int, str], first: int, uses) -> list[str]:
    """What is wrong with `first` as the chapter that first uses something (empty: nothing)."""
    using = [n for n, markdown in chapters.items() if uses(markdown)]
    problems = []
    if first not in chapters:
        problems.append(f"chapter {first} is not in the book")
    elif first not in using:
        problems.append(f"not in chapter {first}")
    earlier = [n for n in using if n < first]
    if earlier:
        problems.append(f"already in chapter{'s' if len(earlier) > 1 else ''} {', '.join(map(str, earlier))}")
    if problems and using:
        problems.append(f"first used in chapter {using[0]}")
    return problems


def path_problems(book) -> list[str]:
    """Each reader path, whole and with its optional chapters left out, against `needs`."""
    problems = []
    for path in book.paths:
        for leaving_out in ((), path.optional) if path.optional else ((),):
            read = set()
            for number in path.chapters:
                if number in leaving_out:
                    continue
                missing = [n for n in book.chapter(number).needs if n not in read]
                if missing:
                    without = f" without {', '.join(map(str, leaving_out))}" if leaving_out else ""
                    problems.append(f"path {path.name}{without}: chapter {number} needs {missing} before it")
                read.add(number)
    return problems


# ----------------------------------------------------------------- the book

BOOK = bookmod.load_book(ROOT)
CHAPTERS = chapter_markdown(BOOK)
GLOSSARY = glossary_entries((ROOT / "docs" / "glossary.md").read_text())
NOTATION = notation_rows((ROOT / "docs" / "notation.md").read_text())


def test_the_pages_are_read_whole():
    """Every glossary entry states a chapter, and every row of the notation table is read."""
    lines = [line for line in (ROOT / "docs" / "glossary.md").read_text().splitlines() if line.startswith("- **")]
    assert len(GLOSSARY) == len(lines) and all(e["first"] is not None for e in GLOSSARY), (
        [e["term"] for e in GLOSSARY if e["first"] is None])
    table = [line for line in (ROOT / "docs" / "notation.md").read_text().splitlines()
             if line.startswith("| ") and not line.startswith("| symbol")]
    assert len(NOTATION) == len(table)
    assert set(PLAIN) <= {symbol for row in NOTATION for symbol in row["latex"]}, "PLAIN names a symbol not in the table"


@pytest.mark.parametrize("entry", GLOSSARY, ids=lambda e: e["term"])
def test_glossary_term_is_first_used_where_the_glossary_says(entry):
    problems = first_use_problems(CHAPTERS, entry["first"], lambda markdown: uses_term(markdown, entry))
    assert not problems, f"glossary {entry['term']!r}, first in chapter {entry['first']}: {'; '.join(problems)}"
    if entry["explained"] != entry["first"]:
        assert uses_term(CHAPTERS[entry["explained"]], entry), f"{entry['term']!r} is not in chapter {entry['explained']}"


@pytest.mark.parametrize("row", NOTATION, ids=lambda r: r["symbol"])
def test_notation_symbol_is_first_used_where_the_table_says(row):
    problems = first_use_problems(CHAPTERS, row["first"], lambda markdown: uses_symbol(markdown, row))
    assert not problems, f"notation {row['symbol']}, first in chapter {row['first']}: {'; '.join(problems)}"


def test_the_glossary_has_the_words_issue_53_found_untaught():
    terms = {name for entry in GLOSSARY for name in entry["names"]}
    assert {"rank", "world size", "micro-batch", "R1-Zero", "TR-DPO", "PEFT", "QLoRA", "IcePop", "RMSNorm"} <= terms


def test_every_path_holds_what_its_chapters_need():
    assert not path_problems(BOOK), path_problems(BOOK)


def test_each_paths_reading_time_is_computed_and_stated():
    table = bookmod.chapter_table(BOOK)
    for path in BOOK.paths:
        total = sum(BOOK.reading_minutes(BOOK.chapter(n)) for n in path.chapters)
        line = next(line for line in table.splitlines() if line.startswith(f"- **{path.name}**"))
        assert f", about {total} min" in line, line
        if path.optional:
            shorter = sum(BOOK.reading_minutes(BOOK.chapter(n)) for n in path.chapters if n not in path.optional)
            assert f"; {shorter} min without chapter" in line, line
    assert table in (ROOT / "README.md").read_text(), "README.md's table is stale: grpo-edu book list --markdown"


def test_the_one_sitting_path_fits_an_hour():
    hour = [path for path in BOOK.paths if "hour" in path.name]
    assert hour, "book.toml has no path for one sitting"
    assert all(BOOK.path_minutes(path) <= 60 for path in hour), [(p.name, BOOK.path_minutes(p)) for p in hour]


# ----------------------------------------------------------------- the checks, on made-up cases

def test_the_checks_catch_a_word_used_before_its_chapter():
    chapters = {0: "A group of G answers.", 1: "The **KL** term, Kullback-Leibler.", 2: "KL again."}
    kl = {"names": ["KL"], "expansion": "Kullback-Leibler"}
    assert first_use_problems(chapters, 1, lambda md: uses_term(md, kl)) == []
    assert first_use_problems(chapters, 2, lambda md: uses_term(md, kl)) == [
        "already in chapter 1", "first used in chapter 1"]
    rank = {"names": ["rank"], "expansion": None}
    assert uses_term("each rank", rank) and not uses_term("lora_rank, it ranks, ranked", rank)
    assert uses_term("two zero-std groups", {"names": ["zero-std group"], "expansion": None})
    assert uses_term("a frozen reference\npolicy", {"names": ["reference policy"], "expansion": None})
    assert first_use_problems(chapters, 0, lambda md: uses_term(md, rank)) == ["not in chapter 0"]
    entries = glossary_entries("- **KL** (Kullback-Leibler): x; where the book first explains it: chapter 1.\n"
                               "- **LoRA**: y; where the book first explains it: chapter 11 (named first in chapter 6).")
    assert [(e["term"], e["expansion"], e["explained"], e["first"]) for e in entries] == [
        ("KL", "Kullback-Leibler", 1, 1), ("LoRA", None, 11, 6)]


def test_the_checks_read_symbols_in_latex_and_in_plain_text():
    rows = notation_rows("| symbol | meaning | shape | first |\n|---|---|---|---|\n"
                         "| $o_i$ | a completion | x | 1 |\n| $\\tau$ | a threshold | x | 8 |\n"
                         "| $B$ | prompts | x | 0 |\n| k | the lag | x | 12 |\n")
    o, tau, b, k = rows
    assert uses_symbol("the response $o_{i}$", o) and not uses_symbol("token $o_{i,t}$", o)
    assert uses_symbol("$$\\tau = 1$$", tau) and not uses_symbol("$\\tau_x$ or tau", tau)
    assert uses_symbol("(B, G) tensors", b) and not uses_symbol("a B-tree", b)
    assert uses_symbol("a lag of k = 2", k) and not uses_symbol("top-k and pass@k", k)
    assert uses_symbol("$\\mathrm{KL}(\\pi \\,\\|\\, \\pi_\\text{ref})$",
                       {"latex": [_latex(r"\mathrm{KL}(\pi \Vert \pi_\text{ref})")], "plain": []})


def test_the_checks_catch_a_path_that_skips_a_need(tmp_path):
    book = bookmod.Book(ROOT, "t", "d", BOOK.chapters, BOOK.parts,
                        (bookmod.ReaderPath("Broken", "x", (1, 3)),
                         bookmod.ReaderPath("Skips", "y", (0, 1, 3, 5, 6), optional=(5,))))
    assert path_problems(book) == ["path Broken: chapter 1 needs [0] before it",
                                   "path Skips without 5: chapter 6 needs [5] before it"]
