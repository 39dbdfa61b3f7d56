"""Checkers for the exercises at the end of each chapter.

Each checker runs a reader's function (or answers) on a set of cases and says
exactly which case failed and how the answer is wrong there (checking.compare), never
the right value:

    >>> from grpo_edu.exercises import ch01
    >>> ch01.check_group_advantages(my_group_advantages)

    checking.py  CheckResult, run_cases and compare: what every checker reports
    ch00.py ... ch14.py  one module per chapter with exercises
    quiz.py      the "Check yourself" questions whose answer is a number: quiz.check(1, 1, ...)
    data/        the fixed cases some checkers read (chapter 7's mystery runs)
"""

from grpo_edu.exercises.checking import CheckResult

__all__ = ["CheckResult"]
