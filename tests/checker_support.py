"""Checking a checker's report for leaks (shared by the tests of the exercises' checkers):
a report may name the case, the element and how the answer is wrong, never the right value."""

from __future__ import annotations

import contextlib
import importlib
from typing import Iterable, Iterator

import numpy as np

from grpo_edu.exercises import checking

CHAPTERS = [f"grpo_edu.exercises.ch{n:02d}" for n in range(14)]


@contextlib.contextmanager
def expected_values() -> Iterator[list[np.ndarray]]:
    """Every `expected` that checking.compare (and so run_cases) sees inside the block, as
    arrays: the right values of the cases a checker ran."""
    seen: list[np.ndarray] = []
    original = checking.compare

    def spy(expected, got, atol):
        seen.append(np.asarray(expected, dtype=np.float64))
        return original(expected, got, atol)

    patched = [(checking, original)]
    checking.compare = spy
    for name in CHAPTERS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:   # a chapter without exercises has no checker module
            if error.name != name:
                raise
            continue
        if getattr(module, "compare", None) is original:
            module.compare = spy
            patched.append((module, original))
    try:
        yield seen
    finally:
        for module, function in patched:
            module.compare = function


def renderings(value: float) -> set[str]:
    """How a report could print a number: at 4 to 6 decimals, or to 4 to 6 significant digits."""
    size = abs(float(value))
    return {f"{size:.4f}", f"{size:.5f}", f"{size:.6f}", f"{size:.4g}", f"{size:.5g}", f"{size:.6g}"}


def telling(values: Iterable[float]) -> list[float]:
    """The values whose printing would give an answer away: not 0, not a round number that
    a case's description shows anyway (0.5, 1.25, an integer)."""
    return sorted({float(v) for v in values if np.isfinite(v) and abs(v) > 1e-3 and abs(round(v, 2) - v) > 1e-6})


def assert_rejected_without_answer(result, right_values: Iterable[float] = (), words: Iterable[str] = ()) -> str:
    """`result` fails, and its report prints none of `right_values` (at any usual precision)
    and none of `words` (the right labels). Returns the report."""
    report = str(result)
    assert not result, f"a wrong answer passed:\n{report}"
    assert "expected" not in report.lower(), f"the report says what it expected:\n{report}"
    for value in telling(right_values):
        for text in renderings(value):
            assert text not in report, f"the report prints the right value {value!r} as {text!r}:\n{report}"
    for word in words:
        assert word not in report, f"the report names the right answer {word!r}:\n{report}"
    return report


def all_values(arrays: Iterable[np.ndarray]) -> list[float]:
    return [float(v) for array in arrays for v in np.ravel(array)]
