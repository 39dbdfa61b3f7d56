"""The book's prose, measured: sentences, their length, reading time, acronyms at first use.

Teaching prose is a chapter's markdown with what is not read as sentences taken out:
headings, fenced code, display maths, tables, HTML tags, link targets, and folded notes
(`<details>` ... `</details>`: the "how we know" provenance and the self-check answers,
read on demand). Inline maths and inline code count as one word each.

    sentences(markdown)      the teaching prose's sentences
    long_share(markdown)     the share of them over LONG_SENTENCE words
    reading_minutes(cells)   words at WORDS_PER_MINUTE plus code lines at CODE_LINES_PER_MINUTE
    glossary(text)           {acronym: expansion} from docs/glossary.md
    unexplained_acronyms     acronyms whose first use in a chapter comes before their expansion

The style guide (docs/contributing.md) states the rules these measure; tests/test_prose.py
holds every chapter to them.
"""

from __future__ import annotations

import math
import re

LONG_SENTENCE = 40          # words: a sentence longer than this is "long"
WORDS_PER_MINUTE = 200      # technical prose, read to understand
CODE_LINES_PER_MINUTE = 20  # code read, not skimmed

_FOLDED = re.compile(r"<details>.*?</details>", re.S)
_FENCED = re.compile(r"```.*?```", re.S)
_DISPLAY_MATH = re.compile(r"\$\$.*?\$\$", re.S)
_INLINE_MATH = re.compile(r"\$[^$\n]+\$")
_INLINE_CODE = re.compile(r"`[^`\n]+`")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_TAG = re.compile(r"</?[A-Za-z][^>\n]*>")
# Abbreviations whose full stop does not end a sentence.
_ABBREVIATIONS = re.compile(r"\b(?:e\.g|i\.e|et al|eq|Eq|Fig|fig|vs|cf|approx|No|Sec|resp)\.", re.S)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[*_]*[A-Z0-9$])")


def teaching_text(markdown: str) -> list[str]:
    """The markdown's teaching prose, as blocks (paragraphs and list items)."""
    text = _FOLDED.sub("\n\n", markdown)
    text = _FENCED.sub("\n\n", text)
    text = _DISPLAY_MATH.sub("\n\n", text)
    text = _INLINE_MATH.sub("X", text)
    text = _INLINE_CODE.sub("C", text)
    text = _LINK.sub(r"\1", text)
    text = _TAG.sub(" ", text)
    blocks, current = [], []
    for line in text.splitlines():
        stripped = re.sub(r"^(?:>\s?)+", "", line.strip()).strip()    # a blockquote's text is prose
        item = re.match(r"^(?:[-*+]|\d+\.)\s+", stripped)
        if not stripped or stripped.startswith("#") or stripped.startswith("|") or item:
            if current:
                blocks.append(" ".join(current))
            current = []
            if item:
                current = [stripped[item.end():]]
            continue
        current.append(stripped)
    if current:
        blocks.append(" ".join(current))
    return [block for block in blocks if block.strip()]


def sentences(markdown: str) -> list[str]:
    """The teaching prose's sentences (a list item or a paragraph ends one too)."""
    found = []
    for block in teaching_text(markdown):
        protected = _ABBREVIATIONS.sub(lambda m: m.group(0).replace(".", "\x00"), block)
        for sentence in _SENTENCE_END.split(protected):
            sentence = sentence.replace("\x00", ".").strip()
            if words(sentence):
                found.append(sentence)
    return found


def words(text: str) -> list[str]:
    return re.findall(r"[\w'’+-]+", text)


def long_sentences(markdown: str) -> list[str]:
    return [s for s in sentences(markdown) if len(words(s)) > LONG_SENTENCE]


def long_share(markdown: str) -> float:
    """The share of the teaching prose's sentences longer than LONG_SENTENCE words."""
    all_ = sentences(markdown)
    return len(long_sentences(markdown)) / len(all_) if all_ else 0.0


def prose_words(markdown: str) -> int:
    return sum(len(words(block)) for block in teaching_text(markdown))


def reading_minutes(cells: list[dict]) -> int:
    """A chapter's reading time in whole minutes: its teaching prose at WORDS_PER_MINUTE and
    its code's non-blank lines at CODE_LINES_PER_MINUTE (outputs and folded notes not counted)."""
    markdown = "\n\n".join(_source(c) for c in cells if c["cell_type"] == "markdown")
    code_lines = sum(1 for c in cells if c["cell_type"] == "code"
                     for line in _source(c).splitlines() if line.strip())
    return max(1, math.ceil(prose_words(markdown) / WORDS_PER_MINUTE + code_lines / CODE_LINES_PER_MINUTE))


def markdown_of(cells: list[dict]) -> str:
    return "\n\n".join(_source(c) for c in cells if c["cell_type"] == "markdown")


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


# --------------------------------------------------------------------------- acronyms

_GLOSSARY_ENTRY = re.compile(r"^\s*[-*]\s+\*\*([A-Za-z0-9][A-Za-z0-9-]*)\*\*\s*\(([^)]+)\)", re.M)


def glossary(text: str) -> dict[str, str]:
    """{acronym: its expansion} from the glossary's entries written `- **KL** (Kullback-Leibler
    divergence): ...`; an entry whose parenthesis is not an expansion is written without one."""
    return {acronym: expansion.strip() for acronym, expansion in _GLOSSARY_ENTRY.findall(text)}


def _normalised(text: str) -> str:
    return re.sub(r"[\s\-–—]+", " ", text).lower()


def unexplained_acronyms(markdown: str, acronyms: dict[str, str]) -> list[str]:
    """The acronyms whose first use in the teaching prose precedes (and is not in the same
    sentence as) their expansion, each as 'ACRONYM: the sentence'."""
    found = []
    text = sentences(markdown)
    for acronym, expansion in acronyms.items():
        pattern = re.compile(rf"(?<![\w-]){re.escape(acronym)}(?![\w])")
        wanted = _normalised(expansion)
        seen_expansion = False
        for sentence in text:
            if wanted in _normalised(sentence):
                seen_expansion = True
            if pattern.search(sentence):
                if not seen_expansion:
                    found.append(f"{acronym}: {sentence[:100]}")
                break
    return found
