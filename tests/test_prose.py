"""The book's style rules, measured on every chapter (docs/contributing.md, "Style guide"), and
the measuring itself on hand-made cases: sentences, their length, reading time, acronyms at
first use, the chapter frame, the map."""

import json
import re
from pathlib import Path

import pytest

from grpo_edu import book as bookmod
from grpo_edu.book import prose

ROOT = Path(__file__).resolve().parents[1]
BOOK = bookmod.load_book(ROOT)
MAX_LONG_SHARE = 0.05


def _glossary():
    return prose.glossary((ROOT / "docs" / "glossary.md").read_text())


def _cells(chapter):
    return json.loads((ROOT / chapter.path).read_text())["cells"]


def _markdown(chapter):
    return prose.markdown_of(_cells(chapter))


# ----------------------------------------------------------------- the measures, by hand

def test_sentences_split_at_full_stops_not_at_abbreviations_or_decimals():
    text = ("GRPO samples a group, e.g. four responses. Each gets a reward of 0.5 or 1.0. "
            "Shao et al. introduced it!\n\n- a list item is a sentence\n- so is this one")
    assert prose.sentences(text) == [
        "GRPO samples a group, e.g. four responses.", "Each gets a reward of 0.5 or 1.0.",
        "Shao et al. introduced it!", "a list item is a sentence", "so is this one"]


def test_headings_code_maths_tables_and_folded_notes_are_not_teaching_prose():
    text = ("# A heading of many words\n\nOne sentence with $x^2$ and `code`.\n\n"
            "$$\na = b\n$$\n\n| a | b |\n|---|---|\n\n```python\nx = 1. Y = 2.\n```\n\n"
            "<details><summary>How we know</summary>\n\nA test checks it. Another.\n\n</details>")
    assert prose.sentences(text) == ["One sentence with X and C."]
    assert prose.prose_words(text) == 6


def test_long_share_counts_sentences_over_forty_words():
    short, long_ = "Short one. " * 3, "Long " + " ".join(["word"] * 40) + "."
    assert prose.long_share(short) == 0
    assert prose.long_share(short + long_) == pytest.approx(1 / 4)
    assert prose.long_share(" ".join(["word"] * 40) + ".") == 0      # 40 is not over 40


def test_reading_minutes_adds_prose_and_code():
    cells = [{"cell_type": "markdown", "source": " ".join(["word"] * 400) + "."},
             {"cell_type": "code", "source": "a = 1\n\nb = 2\n" * 10, "outputs": []}]
    # 400 words at 200 a minute and 20 code lines at 20 a minute: 2 + 1
    assert prose.reading_minutes(cells) == 3
    assert prose.reading_minutes([{"cell_type": "markdown", "source": "Hi."}]) == 1


def test_glossary_reads_acronym_entries():
    text = ("- **KL** (Kullback-Leibler): a divergence.\n- **advantage**: how much better.\n"
            "- **GRPO** (Group Relative Policy Optimization): this book.")
    assert prose.glossary(text) == {"KL": "Kullback-Leibler", "GRPO": "Group Relative Policy Optimization"}


def test_an_acronym_must_be_spelled_out_at_or_before_its_first_use():
    acronyms = {"KL": "Kullback-Leibler", "PPO": "Proximal Policy Optimization"}
    assert prose.unexplained_acronyms("The Kullback-Leibler (KL) divergence. Then KL again.", acronyms) == []
    assert prose.unexplained_acronyms("The KL term. The Kullback-Leibler divergence.", acronyms) == [
        "KL: The KL term."]
    assert prose.unexplained_acronyms("Proximal policy  optimization (PPO) clips.", acronyms) == []
    assert prose.unexplained_acronyms("Code: `KL`.\n\n## The KL heading\n\nNo acronym.", acronyms) == []


# ----------------------------------------------------------------- every chapter

@pytest.mark.parametrize("chapter", BOOK.chapters, ids=lambda c: c.name)
def test_chapter_opens_with_what_you_learn_what_you_need_and_the_reading_time(chapter):
    cells = _cells(chapter)
    opening = next(c for c in cells if c["cell_type"] == "markdown")
    first = "".join(opening["source"]) if isinstance(opening["source"], list) else opening["source"]
    assert first.startswith(f"# Chapter {chapter.number}. {chapter.title}"), first[:80]
    for needle in ("**You will learn**", "**You need first**", "(../docs/glossary.md)", "(../docs/notation.md)"):
        assert needle in first, f"{chapter.name}: the opening has no {needle}"
    learn = first.split("**You will learn**", 1)[1].split("**You need first**", 1)[0]
    assert 3 <= len(re.findall(r"^> - ", learn, re.M)) <= 5, f"{chapter.name}: 3-5 'you will learn' points"
    minutes = BOOK.reading_minutes(chapter)
    assert f"**Reading time**: about {minutes} minutes" in first, f"{chapter.name}: reading time is {minutes} min"
    assert f"**Compute**: at most {chapter.budget_seconds} s" in first
    needs_line = first.split("**You need first**", 1)[1].split("\n>\n", 1)[0]
    named = sorted({int(n) for n in re.findall(r"chapters? (\d+)(?:,? and (\d+))?", needs_line) for n in n if n})
    assert named == sorted(chapter.needs), f"{chapter.name}: 'You need first' names {named}, book.toml {chapter.needs}"


@pytest.mark.parametrize("chapter", BOOK.chapters, ids=lambda c: c.name)
def test_chapter_closes_with_what_you_learned_and_questions_with_folded_answers(chapter):
    markdown = _markdown(chapter)
    headings = re.findall(r"^## (.+)$", markdown, re.M)
    assert "What you learned" in headings and "Check yourself" in headings, chapter.name
    assert headings.index("Check yourself") == headings.index("What you learned") + 1
    after = headings[headings.index("Check yourself") + 1:]
    assert after in ([], ["Exercises"]), f"{chapter.name}: only the exercises come after the closing, not {after}"
    learned = markdown.split("## What you learned", 1)[1].split("## Check yourself", 1)[0]
    assert 3 <= len(re.findall(r"^- ", learned, re.M)) <= 6, f"{chapter.name}: 3-6 points learned"
    check = markdown.split("## Check yourself", 1)[1].split("\n## ", 1)[0]
    questions = re.split(r"^\d+\. ", check, flags=re.M)[1:]
    assert 3 <= len(questions) <= 5, f"{chapter.name}: {len(questions)} questions (3-5)"
    for number, question in enumerate(questions, 1):
        assert question.count("<details><summary>Answer</summary>") == 1 and "</details>" in question, (
            f"{chapter.name}: question {number} has no folded answer")


@pytest.mark.parametrize("chapter", BOOK.chapters, ids=lambda c: c.name)
def test_chapter_sentences_stay_short(chapter):
    markdown = _markdown(chapter)
    share = prose.long_share(markdown)
    assert share <= MAX_LONG_SHARE, (f"{chapter.name}: {share:.1%} of sentences over {prose.LONG_SENTENCE} "
                                     f"words:\n" + "\n".join(prose.long_sentences(markdown)))


@pytest.mark.parametrize("chapter", BOOK.chapters, ids=lambda c: c.name)
def test_chapter_spells_out_every_acronym_at_its_first_use(chapter):
    assert prose.unexplained_acronyms(_markdown(chapter), _glossary()) == []


# A textbook section with a title but no author, book or link: a reader cannot look it up, so
# no chapter cites it. Its mistakes are taught as the book's own "A common mistake" notes.
UNFINDABLE_SOURCES = ("textbook section", "Implementing GRPO from Scratch", "popular textbook")


@pytest.mark.parametrize("chapter", BOOK.chapters, ids=lambda c: c.name)
def test_no_chapter_cites_a_source_a_reader_cannot_find(chapter):
    text = " ".join(_markdown(chapter).split()).lower()
    cited = [phrase for phrase in UNFINDABLE_SOURCES if phrase.lower() in text]
    assert not cited, f"{chapter.name} cites {cited}: teach its mistakes as common mistakes instead"


def test_glossary_has_the_acronyms_the_book_uses():
    assert {"GRPO", "PPO", "KL", "RL", "TRL", "DAPO", "GSPO", "EOS", "KV", "TIS", "LoRA"} <= set(_glossary())


def test_the_committed_map_is_drawn_from_the_manifest():
    from grpo_edu.book.map import draw_map

    assert (ROOT / "docs" / "images" / "map.svg").read_text() == draw_map(BOOK), (
        "docs/images/map.svg is out of date: run grpo-edu book map")


def test_comparisons_are_not_tags_and_quoted_lists_are_items():
    assert prose.sentences("When A < 0 the ratio falls. When A > 0 it rises.") == [
        "When A < 0 the ratio falls.", "When A > 0 it rises."]
    assert prose.sentences("> **You will learn**\n> - one thing\n> - another\n>\n> **Then** more.") == [
        "**You will learn**", "one thing", "another", "**Then** more."]


# Status and provenance (which machine ran what, what never ran, an issue's number) live in
# docs/gpu.md's "What has run where" and docs/training.md, never in a chapter's recap.
STATUS_WORDS = re.compile(r"\b(lent|never ran|not yet run|ha(s|ve)( not)? run|H100|H200|issue \d+|this machine|"
                          r"kernels? table|status)\b", re.I)


@pytest.mark.parametrize("chapter", BOOK.chapters, ids=lambda c: c.name)
def test_no_recap_holds_a_status_line(chapter):
    learned = _markdown(chapter).split("## What you learned", 1)[1].split("## Check yourself", 1)[0]
    found = [line for line in learned.splitlines() if STATUS_WORDS.search(line)]
    assert not found, f"{chapter.name}: the recap holds status, which belongs in docs/: {found}"
