"""The machinery every checker shares: run cases, compare, report.

A checker's feedback names what is wrong (which case, which element, and how: its
shape, its sign, too large or too small, off by a constant factor or shift, NaN)
and never prints the expected value: a reader learns where to look, and cannot
copy the answer out of the report.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import torch


@dataclass
class CheckResult:
    """What a checker found. Truthy when every case passed.

    Shown in a notebook it is short: the count and the first failing case (text), with the
    other failures folded one click away (HTML); an exercise not attempted yet (every case
    raised NotImplementedError) is one line naming the function to write. `str(result)` and
    `print(result)` give the whole report, every failing case."""

    exercise: str
    passed: int = 0
    failures: list[str] = field(default_factory=list)
    # The name of the reader's function when every case so far raised NotImplementedError.
    unwritten: str | None = None
    _raised_not_implemented: int = 0

    def __bool__(self) -> bool:
        return not self.failures

    def record(self, case: str, problems: list[str]) -> None:
        """One case: passed when it found no problems, else a failure naming them all."""
        if problems:
            self.failures.append(f"{case}: " + "; ".join(problems))
        else:
            self.passed += 1

    def record_raised(self, case: str, error: BaseException) -> None:
        """One case whose call raised `error`: a failure that shows the exception."""
        self.failures.append(f"{case}: raised {type(error).__name__}: {error}")
        if isinstance(error, NotImplementedError):
            self._raised_not_implemented += 1
            self.unwritten = self.unwritten or _raising_function(error)

    @property
    def not_attempted(self) -> bool:
        """Every case raised NotImplementedError: the reader's stub is still in place."""
        return bool(self.failures) and self._raised_not_implemented == len(self.failures) and not self.passed

    @property
    def _one_line(self) -> bool:
        """Nothing to fold: every case passed, the stub is untouched, or the check is one case."""
        return not self.failures or self.not_attempted or (len(self.failures) == 1 and not self.passed)

    def _head(self) -> str:
        total = self.passed + len(self.failures)
        if not self.failures:
            return f"{self.exercise}: all {total} cases passed"
        if len(self.failures) == 1 and not self.passed and not self.not_attempted:
            return f"{self.exercise}: {self.failures[0]}"     # one check, such as "no answers yet"
        if self.not_attempted:
            what = f"write `{self.unwritten}`" if self.unwritten else "write your answer"
            return f"{self.exercise}: not attempted yet: {what}, then run this cell"
        return f"{self.exercise}: {len(self.failures)} of {total} cases failed"

    def __str__(self) -> str:
        """The whole report: every failing case."""
        if self._one_line:
            return self._head()
        return "\n".join([self._head()] + [f"  - {failure}" for failure in self.failures])

    def __repr__(self) -> str:
        """The short report: the count and the first failing case."""
        if self._one_line:
            return self._head()
        lines = [self._head() + ("; the first:" if len(self.failures) > 1 else ":"), f"  - {self.failures[0]}"]
        if len(self.failures) > 1:
            lines.append(f"  ({len(self.failures) - 1} more: print() the result to see every one)")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """The short report, with the other failing cases folded one click away."""
        head = html.escape(self._head())
        if self._one_line:
            return f"<pre>{head}</pre>"
        first = html.escape(self.failures[0])
        if len(self.failures) == 1:
            return f"<pre>{head}:\n  - {first}</pre>"
        rest = "\n".join(f"  - {html.escape(failure)}" for failure in self.failures[1:])
        return (f"<pre>{head}; the first:\n  - {first}</pre>"
                f"<details><summary>the other {len(self.failures) - 1}</summary><pre>{rest}</pre></details>")


def _raising_function(error: BaseException) -> str | None:
    """The name of the function that raised `error` (the innermost frame of its traceback)."""
    trace = error.__traceback__
    while trace is not None and trace.tb_next is not None:
        trace = trace.tb_next
    return trace.tb_frame.f_code.co_name if trace is not None else None


def run_cases(exercise: str, cases: Iterable[tuple[str, Callable[[], Any], Any]],
              atol: float = 1e-6, describe: Callable[[Any, Any], str | None] | None = None) -> CheckResult:
    """Run each (description, call, expected) case; compare with `atol` (or with
    `describe(expected, got)`, which returns None when they agree, else what is wrong).

    A case that raises is a failure that shows the exception, not a crash.
    """
    result = CheckResult(exercise)
    for description, call, expected in cases:
        try:
            got = call()
        except Exception as error:  # the reader's code: report, don't crash the notebook
            result.record_raised(description, error)
            continue
        problem = compare(expected, got, atol) if describe is None else describe(expected, got)
        if problem:
            result.failures.append(f"{description}: {problem}")
        else:
            result.passed += 1
    return result


# --------------------------------------------------------------------------- compare

def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _index(flat: int, shape: tuple) -> str:
    """A flat index as the reader would write it: 2, or (1, 3)."""
    if len(shape) <= 1:
        return str(flat)
    return "(" + ", ".join(str(int(i)) for i in np.unravel_index(flat, shape)) + ")"


def _places(flat_indices: np.ndarray, shape: tuple, limit: int = 3) -> str:
    shown = ", ".join(_index(int(i), shape) for i in flat_indices[:limit])
    more = f" and {len(flat_indices) - limit} more" if len(flat_indices) > limit else ""
    return f"element {shown}" if len(flat_indices) == 1 else f"elements {shown}{more}"


def _how_wrong(expected: float, got: float, atol: float) -> str:
    """One element, in words: the sign, the direction, never the expected value."""
    if abs(got) <= atol:
        return "is 0 where it should not be"
    if abs(expected) > atol and math.copysign(1, got) != math.copysign(1, expected):
        return "has the wrong sign"
    return "is too large" if got > expected else "is too small"


def _factor(ratio: float) -> str:
    return f"{ratio:.2g}" if abs(ratio) < 1e4 else f"{ratio:.0e}"


def compare(expected: Any, got: Any, atol: float) -> str | None:
    """None if `got` equals `expected` within atol, else a sentence saying how it is wrong:
    its type, its shape, NaN or inf, the sign, a constant factor or shift, or which elements
    are too large or too small. The sentence never contains the expected value."""
    if hasattr(got, "detach"):   # a torch tensor, perhaps one that requires grad
        got = got.detach().cpu()
    if isinstance(expected, (bool, np.bool_)) or (
            isinstance(expected, np.ndarray) and expected.dtype == bool):
        return _compare_bools(np.asarray(expected), got)
    try:
        got_array = np.asarray(got, dtype=np.float64)
    except (TypeError, ValueError, RuntimeError):
        return f"returned {_short(got)}, which is not numbers"
    expected_array = np.asarray(expected, dtype=np.float64)
    if got_array.shape != expected_array.shape:
        if expected_array.ndim == 0:
            return f"returned shape {got_array.shape}; the case needs one number"
        return f"returned shape {got_array.shape}; the case needs shape {expected_array.shape}"
    same_nan = np.isnan(got_array) & np.isnan(expected_array)
    broken = ~np.isfinite(got_array) & ~same_nan & (got_array != expected_array)
    if broken.any():
        kinds = " or ".join(sorted({"NaN" if np.isnan(v) else "inf" for v in got_array[broken]}))
        if expected_array.ndim == 0:
            return f"is {kinds}, where the right value is a finite number"
        return (f"{kinds} at {_places(np.flatnonzero(broken), got_array.shape)}, "
                f"where the right values are finite numbers")
    close = same_nan | np.isclose(got_array, expected_array, atol=atol, rtol=0)
    if close.all():
        return None
    if expected_array.ndim == 0:
        return _compare_scalar(float(expected_array), float(got_array), atol)
    return _compare_arrays(expected_array, got_array, atol, close)


def _compare_bools(expected: np.ndarray, got: Any) -> str | None:
    got_array = np.asarray(got)
    if got_array.shape != expected.shape:
        if expected.ndim == 0:
            return f"returned shape {got_array.shape}; the case needs one True or False"
        return f"returned shape {got_array.shape}; the case needs shape {expected.shape}"
    try:
        wrong = np.flatnonzero(got_array.astype(bool).ravel() != expected.ravel())
    except (TypeError, ValueError):
        return f"returned {_short(got)}, which is not True/False values"
    if not wrong.size:
        return None
    if expected.ndim == 0:
        return "does not hold" if bool(expected) else "holds, and should not"
    return f"wrong at {_places(wrong, expected.shape)} ({len(wrong)} of {expected.size})"


def _compare_scalar(expected: float, got: float, atol: float) -> str:
    if abs(expected) > atol and abs(got) > atol:
        ratio = got / expected
        if ratio < 0:
            return ("has the wrong sign (it is minus the right value)" if math.isclose(ratio, -1, rel_tol=1e-6)
                    else "has the wrong sign")
        if not math.isclose(ratio, 1, rel_tol=1e-3):
            return f"is {'too large' if got > expected else 'too small'}: about {_factor(ratio)} times the right value"
        return f"is {'too large' if got > expected else 'too small'}, by less than 0.1% (a rounding, eps or tolerance slip?)"
    return _how_wrong(expected, got, atol)


def _compare_arrays(expected: np.ndarray, got: np.ndarray, atol: float, close: np.ndarray) -> str:
    wrong = np.flatnonzero(~close.ravel())
    count = f"{len(wrong)} of {expected.size} elements are wrong"
    finite = np.isfinite(expected)
    nonzero = finite & (np.abs(expected) > atol)
    if nonzero.any() and np.all(np.abs(got[finite & ~nonzero]) <= atol):
        ratios = got[nonzero] / expected[nonzero]
        if np.allclose(ratios, ratios.flat[0], rtol=1e-6, atol=0):
            ratio = float(ratios.flat[0])
            if math.isclose(ratio, -1, rel_tol=1e-6):
                return f"{count}: every one has the wrong sign (minus the right value)"
            if math.isclose(ratio, 0, abs_tol=1e-12):
                return f"{count}: every one is 0"
            return f"{count}, all off by the same factor: about {_factor(ratio)} times the right values"
    shift = got[finite] - expected[finite]
    if shift.size > 1 and np.allclose(shift, shift[0], rtol=0, atol=atol) and abs(shift[0]) > atol:
        return (f"{count}, all off by the same amount: every one is "
                f"{'too large' if shift[0] > 0 else 'too small'} by about {abs(shift[0]):.1g}")
    flat_expected, flat_got = expected.ravel(), got.ravel()
    shown = [f"element {_index(int(i), expected.shape)} {_how_wrong(flat_expected[i], flat_got[i], atol)}"
             for i in wrong[:3]]
    more = f", and {len(wrong) - 3} more" if len(wrong) > 3 else ""
    return f"{count}: " + ", ".join(shown) + more


def verdict(expected: float, got: Any) -> str | None:
    """For a reward that answers 1.0 (accept) or 0.0 (reject): None if `got` agrees, else
    whether it is too lenient or too strict on this case."""
    try:
        value = float(got)
    except (TypeError, ValueError):
        return f"returned {_short(got)}, not 1.0 or 0.0"
    if value not in (0.0, 1.0):
        return f"returned {value!r}, not 1.0 or 0.0"
    if value == expected:
        return None
    return ("accepted (1.0) a completion the rule rejects" if value == 1.0
            else "rejected (0.0) a completion the rule accepts")


# --------------------------------------------------------------------------- named labels

def check_labels(exercise: str, answers: Mapping[str, str], key: Mapping[str, str],
                 names: Iterable[str], signs: Mapping[str, str | None], healthy: str = "healthy",
                 names_where: str = "") -> CheckResult:
    """A diagnosis exercise: `answers` names each of `key`'s runs with one of `names`.

    A wrong name is reported with what a run of that name would show (`signs[name]`), never
    with the right name: the report says why the reader's reading does not fit the run.
    `names_where` (e.g. "ch07.FAILURES") is where the reader finds the names, said instead of
    listing them."""
    names = list(names)
    result = CheckResult(exercise)
    if not answers:
        runs = sorted(key)
        listed = f"the names in {names_where}" if names_where else ", ".join(repr(name) for name in names)
        result.failures.append(f"no diagnoses yet: name each of {', '.join(runs[:-1])} and {runs[-1]} with one of "
                               f"{listed}")
        return result
    unknown = sorted({str(v) for v in answers.values()} - set(names))
    if unknown:
        result.failures.append(f"{unknown} are not among the names; use one of "
                               + (f"the names in {names_where}" if names_where else ", ".join(map(repr, names))))
        return result
    for run, right in key.items():
        given = answers.get(run)
        if given is None:
            result.record(run, ["no diagnosis given"])
        elif given == right:
            result.record(run, [])
        elif given == healthy:
            result.record(run, [f"not {healthy}: at least one of its metrics is outside a healthy run's range"])
        else:
            sign = signs.get(given)
            result.record(run, [f"not {given!r}" + (f": that would show {sign}, and {run} does not" if sign else "")])
    return result


# --------------------------------------------------------------------------- a reader's tensors as arrays

def as_numbers(value) -> np.ndarray:
    """A reader's result (a tensor, an array or a list) as float64 numbers, ready to compare."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(torch.float64).cpu().numpy()
    return np.asarray(value, dtype=np.float64)


def as_bools(value) -> np.ndarray:
    """A reader's boolean result (a tensor, an array or a list) as an array, ready to compare."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)
