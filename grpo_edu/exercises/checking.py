"""The machinery every checker shares: run cases, compare, report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np


@dataclass
class CheckResult:
    """What a checker found. Truthy when every case passed; prints as a report."""

    exercise: str
    passed: int = 0
    failures: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return not self.failures

    def record(self, case: str, problems: list[str]) -> None:
        """One case: passed when it found no problems, else a failure naming them all."""
        if problems:
            self.failures.append(f"{case}: " + "; ".join(problems))
        else:
            self.passed += 1

    def __repr__(self) -> str:
        total = self.passed + len(self.failures)
        if not self.failures:
            return f"{self.exercise}: all {total} cases passed"
        lines = [f"{self.exercise}: {len(self.failures)} of {total} cases failed"]
        lines += [f"  - {failure}" for failure in self.failures]
        return "\n".join(lines)

    __str__ = __repr__


def _fmt(value: Any) -> str:
    if isinstance(value, np.ndarray) or isinstance(value, (list, tuple)):
        array = np.asarray(value)
        if array.dtype.kind in "fc":
            return np.array2string(array, precision=4, separator=", ", suppress_small=True)
        return np.array2string(array, separator=", ")
    if isinstance(value, float):
        return f"{value:.6g}"
    return repr(value)


def run_cases(exercise: str, cases: Iterable[tuple[str, Callable[[], Any], Any]],
              atol: float = 1e-6) -> CheckResult:
    """Run each (description, call, expected) case; compare with `atol`.

    A case that raises is a failure that shows the exception, not a crash.
    """
    result = CheckResult(exercise)
    for description, call, expected in cases:
        try:
            got = call()
        except Exception as error:  # the reader's code: report, don't crash the notebook
            result.failures.append(f"{description}: raised {type(error).__name__}: {error}")
            continue
        problem = compare(expected, got, atol)
        if problem:
            result.failures.append(f"{description}: {problem}")
        else:
            result.passed += 1
    return result


def compare(expected: Any, got: Any, atol: float) -> str | None:
    """None if equal within atol, else a sentence saying how they differ."""
    if isinstance(expected, (bool, np.bool_)) or (
            isinstance(expected, np.ndarray) and expected.dtype == bool):
        got_array = np.asarray(got)
        if got_array.shape != np.shape(expected) or not np.array_equal(got_array.astype(bool), expected):
            return f"expected {_fmt(expected)}, got {_fmt(got)}"
        return None
    try:
        got_array = np.asarray(got, dtype=np.float64)
    except (TypeError, ValueError):
        return f"expected numbers like {_fmt(expected)}, got {got!r}"
    expected_array = np.asarray(expected, dtype=np.float64)
    if got_array.shape != expected_array.shape:
        return f"expected shape {expected_array.shape}, got shape {got_array.shape} ({_fmt(got)})"
    if np.isnan(got_array).any() and not np.isnan(expected_array).any():
        return f"expected {_fmt(expected)}, got NaN in {_fmt(got)}"
    if not np.allclose(got_array, expected_array, atol=atol, rtol=0):
        worst = int(np.argmax(np.abs(got_array - expected_array)))
        where = f" (largest difference at index {worst})" if expected_array.ndim else ""
        return f"expected {_fmt(expected)}, got {_fmt(got)}{where}"
    return None
