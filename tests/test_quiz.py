"""grpo_edu.exercises.quiz: the numeric answers of the chapters' "Check yourself" questions.

For every registered question: the numbers quiz computes are the ones its folded answer prints
(so the checker is tied to the prose, which `grpo-edu book check` ties to the outputs); the
right answers, rounded as the folded answer rounds them, pass; a wrong answer fails with a
report that names how it is wrong and never prints the right value; bad input is a one-line
ValueError. Each chapter with a registered question says so at the start of its Check
yourself section."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from checker_support import assert_rejected_without_answer
from grpo_edu.exercises import quiz
from grpo_edu.exercises.checking import CheckResult

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = sorted(quiz.QUESTIONS)
IDS = [f"{chapter}.{number}" for chapter, number in QUESTIONS]


# --------------------------------------------------------------------------- the chapters' text

def chapter_source(chapter: int) -> str:
    (path,) = ROOT.glob(f"chapters/{chapter:02d}_*.py")
    return path.read_text()


def check_yourself(chapter: int) -> tuple[str, dict[int, str]]:
    """The section's opening text (before question 1) and each question's text, up to the next
    question, from the chapter's py:percent source: comment markers stripped, whitespace
    collapsed."""
    lines = chapter_source(chapter).splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "# ## Check yourself")
    section = []
    for line in lines[start + 1:]:
        if line.startswith("# %%") or line.startswith("# ## ") or not line.startswith("#"):
            break
        section.append(line[2:] if line.startswith("# ") else line[1:])
    parts = re.split(r"^(\d+)\. ", "\n".join(section), flags=re.MULTILINE)
    questions = {int(parts[i]): " ".join(parts[i + 1].split()) for i in range(1, len(parts), 2)}
    return " ".join(parts[0].split()), questions


def folded_answer(chapter: int, number: int) -> str:
    text = check_yourself(chapter)[1][number]
    match = re.search(r"<details><summary>Answer</summary>(.*?)</details>", text)
    assert match, f"chapter {chapter}, question {number} has no folded answer"
    return match.group(1)


def rounded(spec: quiz.Number, value: np.ndarray):
    """What a reader types: the number rounded to the decimals asked for, a list for a list."""
    typed = np.round(value, spec.decimals)
    return typed.tolist() if spec.count > 1 else float(typed)


def right_answers(key) -> dict:
    entry = quiz.QUESTIONS[key]
    expected = entry.expected()
    return {spec.name: rounded(spec, expected[spec.name]) for spec in entry.numbers}


# --------------------------------------------------------------------------- tied to the prose

@pytest.mark.parametrize("key", QUESTIONS, ids=IDS)
def test_the_folded_answer_prints_the_numbers_quiz_computes(key):
    entry = quiz.QUESTIONS[key]
    answer = folded_answer(*key)
    for spec in entry.numbers:
        written = spec.shown(entry.expected()[spec.name])
        assert written in answer, (f"chapter {key[0]}, question {key[1]}: quiz computes {spec.name} as "
                                   f"{written!r}, which its folded answer does not say:\n{answer}")


def test_every_registered_question_is_a_question_of_its_chapter():
    for chapter, number in QUESTIONS:
        assert number in check_yourself(chapter)[1], f"chapter {chapter} has no question {number}"


# --------------------------------------------------------------------------- right and wrong answers

@pytest.mark.parametrize("key", QUESTIONS, ids=IDS)
def test_the_right_answers_pass(key):
    result = quiz.check(*key, **right_answers(key))
    assert isinstance(result, CheckResult) and result, str(result)
    assert "right" in str(result)


def wrong(value: np.ndarray, spec: quiz.Number):
    """A wrong answer: half as large again, or 1 where the answer is 0."""
    value = np.where(np.abs(value) > spec.tolerance, 1.5 * value, 1.0)
    return value.tolist() if spec.count > 1 else float(value)


@pytest.mark.parametrize("key", QUESTIONS, ids=IDS)
def test_a_wrong_answer_fails_without_the_right_value(key):
    entry = quiz.QUESTIONS[key]
    expected = entry.expected()
    for spec in entry.numbers:
        answers = right_answers(key) | {spec.name: wrong(expected[spec.name], spec)}
        result = quiz.check(*key, **answers)
        report = assert_rejected_without_answer(result, np.ravel(expected[spec.name]))
        assert f"  - {spec.name}: " in report and report.count("\n  - ") == 1, report
        assert spec.precision in report, report
        for value in np.ravel(expected[spec.name]):
            for text in {f"{abs(value):.{spec.decimals}f}", f"{abs(value):.4f}"}:
                if len(text.replace(".", "").strip("0")) >= 2:        # "0", "1", "0.5": too short to tell
                    assert text not in report, f"the report prints the right value as {text!r}:\n{report}"


def test_within_half_a_unit_of_the_last_decimal_passes_and_beyond_fails():
    assert quiz.check(1, 1, population=-1.43207798 + 4.9e-5, sample=-1.24021592 - 4.9e-5)
    result = quiz.check(1, 1, population=-1.43207798 + 6e-5, sample=-1.2402)
    assert not result and "population" in str(result) and "give 4 decimals" in str(result)
    assert quiz.check(10, 2, times=2.74) and not quiz.check(10, 2, times=2.76)


def test_the_report_says_how_an_answer_is_wrong():
    report = str(quiz.check(1, 1, population=1.4321, sample=-1.2402))
    assert "population: has the wrong sign" in report
    report = str(quiz.check(2, 1, group=[1, -1, 1, -1], none=[0.05, -0.05, 0.05, -0.05],
                            batch=[-0.1348, 0.1348, -0.1348, 0.1348]))
    assert "batch: every one has the wrong sign" in report and "group" not in report
    report = str(quiz.check(4, 1, short_token=0.1250, long_token=0.00125, completion=0.125))   # forgot N
    assert "short_token: is about 10 times the right value" in report
    report = str(quiz.check(1, 1, population=-1.432, sample=-1.2402))                          # 3 decimals
    assert "by less than 0.1%" in report and "give 4 decimals" in report
    report = str(quiz.check(5, 1, advantages=[-2.0, 0.0, -2.0]))
    assert "1 of 3 is wrong: number 3 has the wrong sign" in report


def test_a_factor_that_would_give_a_short_answer_away_is_not_printed():
    for report in (str(quiz.check(2, 2, plus_one=9, minus_one=0)), str(quiz.check(10, 2, times=4.05)),
                   str(quiz.check(5, 1, advantages=[-2.31, 0.0, 2.31]))):
        assert "is too large" in report or "are wrong" in report, report
        assert "times the right" not in report and "1.8" not in report and "1.5" not in report, report


def test_a_torch_scalar_or_a_numpy_array_is_an_answer():
    import torch
    assert quiz.check(1, 1, population=torch.tensor(-1.4321), sample=np.float64(-1.2402))
    assert quiz.check(5, 1, advantages=np.array([-2.0, 0.0, 2.0]))


# --------------------------------------------------------------------------- bad input

def one_line_error(call, *words) -> str:
    with pytest.raises(ValueError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message, message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    return message


def test_a_missing_or_unknown_name_is_a_one_line_error_naming_it():
    one_line_error(lambda: quiz.check(1, 1, population=-1.4321), "missing sample", "takes population and sample",
                   "got population")
    one_line_error(lambda: quiz.check(1, 1, population=-1.4321, sample=-1.2402, pop=1.0), "unknown pop")
    one_line_error(lambda: quiz.check(1, 1, populaton=-1.4321, sample=-1.2402), "missing population",
                   "unknown populaton")
    one_line_error(lambda: quiz.check(1, 1), "missing population and sample", "got none")


def test_an_unknown_chapter_or_question_is_a_one_line_error():
    one_line_error(lambda: quiz.check(99, 1, x=1), "chapter", "got 99")
    one_line_error(lambda: quiz.check(14, 1, x=1), "chapter", "got 14")
    one_line_error(lambda: quiz.check("1", 1, x=1), "chapter", "got '1'")
    one_line_error(lambda: quiz.check(1, 2, x=1), "question", "are 1", "got 2")
    one_line_error(lambda: quiz.ask(99), "chapter", "got 99")


def test_a_wrong_count_or_not_a_number_is_a_one_line_error():
    one_line_error(lambda: quiz.check(5, 1, advantages=[-2.0, 0.0]), "advantages", "a list of 3 numbers", "got 2")
    one_line_error(lambda: quiz.check(5, 1, advantages=1.0), "advantages", "got 1 number")
    one_line_error(lambda: quiz.check(1, 1, population=[1.0, 2.0], sample=-1.2402), "population", "one number")
    one_line_error(lambda: quiz.check(1, 1, population="about -1.4", sample=-1.2402), "population", "a number",
                   "'about -1.4'")


def test_ask_lists_each_question_and_the_names_it_takes(capsys):
    quiz.ask(1)
    out = capsys.readouterr().out
    assert "1. A_3" in out and "quiz.check(1, 1, population=..., sample=...)" in out and "give 4 decimals" in out
    for key in QUESTIONS:
        quiz.ask(key[0])
        out = capsys.readouterr().out
        assert quiz.QUESTIONS[key].prompt in out


# --------------------------------------------------------------------------- the chapters point to it

def test_every_chapter_with_a_registered_question_points_to_quiz_check():
    for chapter in sorted({chapter for chapter, _ in QUESTIONS}):
        opening = check_yourself(chapter)[0]
        assert "quiz.check" in opening and "quiz.ask" in opening, (
            f"chapter {chapter}'s Check yourself does not open with the line pointing to quiz.check and quiz.ask")
        for call in re.findall(r"quiz\.check\((\d+), (\d+), ([^)]*)\)", opening):
            number = (int(call[0]), int(call[1]))
            assert number[0] == chapter and number in quiz.QUESTIONS, f"chapter {chapter} shows {call}"
            names = tuple(re.findall(r"(\w+)=", call[2]))
            assert names == quiz.QUESTIONS[number].names, f"chapter {chapter} shows quiz.check with {names}"

