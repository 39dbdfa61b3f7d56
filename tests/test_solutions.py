"""The exercises' folded solutions: each one, run as a reader would paste it, passes its checker.

A chapter's exercise is a markdown paragraph that starts `**N.M Title.**`; its hint and its
solution follow in `<details>` blocks, the solution's code in a python fence whose last line
calls the checker (an open question, one without a checker, has a written Answer instead).
Each solution runs in a fresh namespace holding only the chapter's checker module (`chNN`),
as the chapter's exercise cell has imported it.
"""

import ast
import re
from pathlib import Path

import pytest

from grpo_edu import book
from grpo_edu.book import notebooks

ROOT = Path(__file__).resolve().parent.parent
BOOK = book.load_book(ROOT)

_EXERCISE = re.compile(r"^\*\*(\d+\.\d+) ", re.M)
_DETAILS = re.compile(r"<details><summary>(Hint|Solution|Answer)</summary>(.*?)</details>", re.S)
_FENCE = re.compile(r"```python\n(.*?)```", re.S)


def markdown(chapter) -> str:
    """The chapter's markdown cells, read from its py:percent source as `book run` reads it."""
    cells = notebooks.read_source(ROOT / chapter.source).cells
    return "\n".join(cell.source for cell in cells if cell.cell_type == "markdown")


def exercises(chapter) -> dict[str, dict[str, str]]:
    """{"0.1": {"Hint": text, "Solution": text}, ...} in the order the chapter has them."""
    text = markdown(chapter)
    starts = [(m.group(1), m.start()) for m in _EXERCISE.finditer(text)]
    found = {}
    for (number, start), (_, end) in zip(starts, starts[1:] + [(None, len(text))]):
        found[number] = {kind: body for kind, body in _DETAILS.findall(text[start:end])}
    return found


SOLUTIONS = [(chapter, number, parts["Solution"]) for chapter in BOOK.chapters
             for number, parts in exercises(chapter).items() if "Solution" in parts]


@pytest.mark.parametrize("chapter, number, solution", SOLUTIONS,
                         ids=[f"{number}" for _, number, _ in SOLUTIONS])
def test_every_solution_passes_its_checker(chapter, number, solution):
    fences = _FENCE.findall(solution)
    assert len(fences) == 1, f"exercise {number}: expected one python block in its solution, got {len(fences)}"
    tree = ast.parse(fences[0])
    last = tree.body.pop()
    assert isinstance(last, ast.Expr), f"exercise {number}: the solution must end with the checker's call"
    module = __import__(f"grpo_edu.exercises.ch{chapter.number:02d}", fromlist=["_"])
    namespace = {f"ch{chapter.number:02d}": module}
    exec(compile(tree, f"<solution {number}>", "exec"), namespace)
    result = eval(compile(ast.Expression(last.value), f"<solution {number}>", "eval"), namespace)
    assert result and result.passed > 0, f"exercise {number}: its solution fails its checker:\n{result}"


@pytest.mark.parametrize("chapter", BOOK.chapters, ids=[c.name for c in BOOK.chapters])
def test_every_exercise_has_a_hint_and_a_solution(chapter):
    found = exercises(chapter)
    missing = [f"{number} {kind}" for number, parts in found.items() for kind in ("Hint", "Solution")
               if kind not in parts and not (kind == "Solution" and "Answer" in parts)]
    assert not missing, f"{chapter.name}: exercises without {missing}"


def test_the_exercises_are_found():
    """Guard against a vacuous check: the parser finds the exercises the chapters number."""
    counts = {c.number: len(exercises(c)) for c in BOOK.chapters}
    assert counts == {0: 2, 1: 4, 2: 4, 3: 3, 4: 3, 5: 3, 6: 2, 7: 2, 8: 2, 9: 2, 10: 3, 11: 2, 12: 2, 13: 2, 14: 2}
    assert len(SOLUTIONS) == 37   # 38 exercises, one an open question (1.4) with a written answer


def test_a_wrong_solution_is_caught():
    """Guard against a vacuous harness: the chapter-0 solution with its bug put back fails."""
    chapter = next(c for c in BOOK.chapters if c.number == 0)
    solution = exercises(chapter)["0.1"]["Solution"]
    broken = solution.replace("/ (G - 1)", "/ G")
    assert broken != solution
    with pytest.raises(AssertionError, match="its solution fails its checker"):
        test_every_solution_passes_its_checker(chapter, "0.1", broken)
