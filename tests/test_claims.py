"""Claims cells and exercise reports print one line where nothing is wrong, and name what is."""

import json
from pathlib import Path

import numpy as np
import pytest

from grpo_edu.book.claims import Claims
from grpo_edu.exercises import ch00
from grpo_edu.exercises.checking import CheckResult, run_cases

ROOT = Path(__file__).resolve().parents[1]


def test_claims_that_hold_print_one_line_and_keep_each_claim_one_click_away():
    claims = Claims({"the mean is 0": True, "the std is 1": np.bool_(True)})
    assert claims and repr(claims) == "2 claims checked: all hold"
    assert "\n" not in repr(claims)
    page = claims._repr_html_()
    assert page.startswith("<details") and "the mean is 0" in page and "the std is 1" in page


def test_a_failing_claim_is_named_in_the_line_a_reader_sees():
    claims = Claims({"the mean is 0": True, "the std is <1>": False})
    assert not claims
    assert repr(claims).splitlines() == ["FAILS: 1 of 2 claims:", "  - the std is <1>"]
    assert "the std is &lt;1&gt;" in claims._repr_html_().split("</details>")[1]
    assert "holds: the mean is 0" in str(claims) and "FAILS: the std is <1>" in str(claims)


@pytest.mark.parametrize("bad", [None, 1, 0.5, "yes"])
def test_a_claim_that_is_not_a_test_is_refused_by_name(bad):
    with pytest.raises(TypeError, match=r"claims\['the claim'\]: expected a bool"):
        Claims({"the claim": bad})
    with pytest.raises(ValueError, match="claims: expected at least one"):
        Claims({})


def test_an_untouched_exercise_prints_one_line_naming_the_function_to_write():
    def my_rloo(rewards):
        raise NotImplementedError("your leave-one-out advantages here")

    result = ch00.check_rloo(my_rloo)
    assert not result and result.not_attempted
    line = "exercise 0.1 RLOO: not attempted yet: write `my_rloo`, then run this cell"
    assert repr(result) == str(result) == line
    assert line in result._repr_html_()


def test_a_wrong_answer_shows_the_count_and_the_first_failing_case_and_folds_the_rest():
    result = ch00.check_rloo(lambda rewards: rewards * 0 + 1)
    assert not result and not result.not_attempted and len(result.failures) == 5
    shown = repr(result).splitlines()
    assert shown[0] == "exercise 0.1 RLOO: 5 of 5 cases failed; the first:"
    assert shown[1] == f"  - {result.failures[0]}" and len(shown) == 3 and "4 more" in shown[2]
    assert all(failure in str(result) for failure in result.failures)      # print(result): every case
    page = result._repr_html_()
    assert "<summary>the other 4</summary>" in page and result.failures[0] not in page.split("<details>")[1]


def test_a_stub_that_raises_in_some_cases_only_is_a_wrong_answer_not_an_untouched_one():
    def half_done(x):
        if x > 1:
            raise NotImplementedError("later")
        return x

    result = run_cases("exercise 0.0", [(f"x = {x}", lambda x=x: half_done(x), x) for x in (1, 2)])
    assert not result.not_attempted and result.passed == 1
    assert repr(result).splitlines()[0] == "exercise 0.0: 1 of 2 cases failed:"
    assert CheckResult("exercise 0.0", passed=3).__repr__() == "exercise 0.0: all 3 cases passed"


def _outputs(cell):
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            yield "".join(output.get("text", ""))
        else:
            yield "".join(output.get("data", {}).get("text/plain", ""))


@pytest.mark.parametrize("notebook", sorted((ROOT / "chapters").glob("[0-9]*.ipynb")), ids=lambda p: p.stem[:2])
def test_no_committed_chapter_prints_a_failing_claim_or_a_list_of_claims(notebook):
    cells = json.loads(notebook.read_text())["cells"]
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        text = "\n".join(_outputs(cell))
        assert "FAILS" not in text, f"{notebook.name}: a claim fails:\n{text[:400]}"
        lines = [line for line in text.splitlines() if line.startswith("holds: ")]
        assert not lines, f"{notebook.name}: a claims cell prints {len(lines)} lines; end it with Claims(claims)"
        if "Claims(" in "".join(cell["source"]):
            shown = [output for output in cell.get("outputs", []) if output.get("output_type") == "execute_result"]
            assert len(shown) == 1, f"{notebook.name}: a claims cell must end with Claims(claims)"
            summary = "".join(shown[0]["data"]["text/plain"])
            assert len(summary.splitlines()) == 1 and summary.endswith("all hold"), \
                f"{notebook.name}: the claims print more than one line: {summary[:200]}"


def test_a_check_of_one_case_prints_its_one_failure_on_one_line():
    result = CheckResult("exercise 6.2 read a run", failures=["no diagnoses yet: name each run"])
    assert repr(result) == str(result) == "exercise 6.2 read a run: no diagnoses yet: name each run"


@pytest.mark.parametrize("notebook", sorted((ROOT / "chapters").glob("[0-9]*.ipynb")), ids=lambda p: p.stem[:2])
def test_an_untouched_exercise_and_a_wrong_first_attempt_print_short_reports(notebook):
    """An exercise whose stub still raises prints one line; a report never lists every failing case."""
    for cell in json.loads(notebook.read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        text = "\n".join(_outputs(cell))
        assert "raised NotImplementedError" not in text, f"{notebook.name}: an untouched exercise lists its cases:\n{text[:300]}"
        if "not attempted yet" in text:
            assert len(text.strip().splitlines()) == 1, f"{notebook.name}: {text[:300]}"
        if "cases failed" in text:
            listed = [line for line in text.splitlines() if line.startswith("  - ")]
            assert len(listed) <= 1, f"{notebook.name}: a report lists {len(listed)} failing cases:\n{text[:400]}"
