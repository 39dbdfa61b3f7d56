"""grpo_edu's accuracy reward against math-verify (what TRL's accuracy_reward uses), over a
committed corpus of GSM8K-style answer styles (tests/data/answer_styles.json, written by
tests/data/make_answer_styles.py): ours gives the committed verdict on every row, always; where
math-verify is installed (the test extra pins it), math-verify gives its committed verdict too,
and every row where the two differ is a difference listed below, with its reason."""

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from grpo_edu.environment.rewards import accuracy_reward

sys.path.insert(0, str(Path(__file__).parent / "data"))   # make_answer_styles: math-verify as TRL calls it
CORPUS = json.loads((Path(__file__).parent / "data" / "answer_styles.json").read_text())
ROWS = CORPUS["rows"]

# Where the two differ on purpose (style -> why), as TRL 1.16 calls math-verify.
KNOWN_DIFFERENCES = {
    "answer line": "ours reads an 'Answer: 18' line (the format reward's second form); TRL's call extracts LaTeX only",
    "boxed trailing period": "ours drops a final period inside the box, \\boxed{18.}; math-verify reads no number",
    "boxed unit word": "R1's rule asks for the number: ours gives 0 to \\boxed{18 apples}; math-verify drops units",
    "thousands thin space": "ours reads 1\\,000 as 1000; math-verify reads 1\\,000\\,000 as a product",
    "two boxes, last right": "ours takes the last \\boxed{} as the final answer; TRL's call takes the first match",
    "boxed text": "math-verify gives 0 for \\text{0.75} and \\text{3.5} against 0.75 and 3.5 (integers match)",
    "boxed textbf": "as 'boxed text'",
}


def test_the_corpus_covers_the_styles():
    styles = Counter(row["style"] for row in ROWS)
    assert len(ROWS) >= 200 and len(styles) >= 25
    assert {"boxed dollar", "boxed text", "boxed percent", "power of ten", "thousands comma", "latex fraction",
            "unboxed sentence", "two boxes, last wrong", "unclosed box"} <= set(styles)


@pytest.mark.parametrize("row", ROWS, ids=lambda row: f"{row['gold']}-{row['style']}")
def test_ours_gives_the_committed_verdict(row):
    assert accuracy_reward([row["completion"]], answer=[row["gold"]]) == [row["ours"]]


def test_math_verify_agrees_except_where_listed():
    pytest.importorskip("math_verify", reason="math-verify is not installed (pip install -e '.[test]')")
    from importlib.metadata import version

    from make_answer_styles import math_verify_reward
    assert version("math-verify") == CORPUS["math_verify_version"]
    differences = Counter()
    for row in ROWS:
        theirs = math_verify_reward(row["completion"], row["gold"])
        assert theirs == row["math_verify"], f"math-verify changed its verdict on {row['completion']!r}"
        if theirs != row["ours"]:
            assert row["style"] in KNOWN_DIFFERENCES, f"unexplained difference: {row}"
            differences[row["style"]] += 1
    agree = len(ROWS) - sum(differences.values())
    assert agree == 176 and len(ROWS) == 223, (agree, len(ROWS), dict(differences))
