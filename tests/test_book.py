"""The book's manifest, its chapters' committed state, and the checks around them."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_edu import book
from grpo_edu.book import notebooks
from grpo_edu.commands.cli import main

ROOT = Path(__file__).resolve().parent.parent
BOOK = book.load_book(ROOT)


# ----------------------------------------------------------------- manifest

def _make_book(tmp_path, chapters_toml, notebooks_on_disk):
    (tmp_path / "chapters").mkdir()
    for name in notebooks_on_disk:
        (tmp_path / "chapters" / name).write_text("{}")
        (tmp_path / "chapters" / name.replace(".ipynb", ".py")).write_text("")
    (tmp_path / "book.toml").write_text(
        '[book]\ntitle = "T"\ndescription = "D"\n' + chapters_toml)
    return tmp_path


def _entry(path, tier="cpu", budget=10):
    return (f'[[chapters]]\npath = "{path}"\ntitle = "t"\nsummary = "s"\n'
            f'tier = "{tier}"\nbudget_seconds = {budget}\n')


def test_manifest_loads_and_numbers_chapters():
    """Chapter 0 is the on-ramp ([book] first_chapter = 0); each file's prefix is its number."""
    assert BOOK.chapters[0].number == 0
    assert BOOK.chapters[1].path == Path("chapters/01_grpo_by_hand.ipynb")
    assert [c.number for c in BOOK.chapters] == list(range(len(BOOK.chapters)))
    assert all(c.name.startswith(f"{c.number:02d}_") for c in BOOK.chapters)


def test_first_chapter_numbers_from_0_or_1(tmp_path):
    root = _make_book(tmp_path, _entry("chapters/a.ipynb") + _entry("chapters/b.ipynb"), ["a.ipynb", "b.ipynb"])
    assert [c.number for c in book.load_book(root).chapters] == [1, 2]
    toml = (root / "book.toml").read_text()
    (root / "book.toml").write_text(toml.replace('description = "D"', 'description = "D"\nfirst_chapter = 0'))
    assert [c.number for c in book.load_book(root).chapters] == [0, 1]
    (root / "book.toml").write_text(toml.replace('description = "D"', 'description = "D"\nfirst_chapter = 2'))
    with pytest.raises(book.ManifestError, match=r"\[book\] first_chapter: expected 0 or 1, got 2"):
        book.load_book(root)


@pytest.mark.parametrize("toml, on_disk, message", [
    (_entry("chapters/a.ipynb"), [], r"chapter 1 \(chapters/a.ipynb\): notebook 'chapters/a.ipynb' does not exist"),
    (_entry("chapters/a.ipynb", tier="tpu"), ["a.ipynb"], r"chapter 1 \(chapters/a.ipynb\): tier must be one of .*got 'tpu'"),
    (_entry("chapters/a.ipynb") + _entry("chapters/a.ipynb"), ["a.ipynb"],
     r"chapter 2 \(chapters/a.ipynb\): duplicate entry"),
    (_entry("chapters/a.ipynb"), ["a.ipynb", "b.ipynb"], r"not listed in book.toml: \['chapters/b.ipynb'\]"),
    (_entry("chapters/a.ipynb", budget=0), ["a.ipynb"], r"budget_seconds must be a positive integer, got 0"),
    (_entry("a.ipynb"), [], r"path must be chapters/<name>.ipynb, got 'a.ipynb'"),
    ('[[chapters]]\npath = "chapters/a.ipynb"\n', ["a.ipynb"], r"chapter 1 \(chapters/a.ipynb\): missing \["),
    ("", [], r"at least one \[\[chapters\]\]"),
])
def test_manifest_errors_name_the_entry(tmp_path, toml, on_disk, message):
    root = _make_book(tmp_path, toml, on_disk)
    with pytest.raises(book.ManifestError, match=message):
        book.load_book(root)


@pytest.mark.parametrize("extra, message", [
    ('part = "Nowhere"\n', r"chapter 1 \(chapters/a.ipynb\): part must be one of \[book\] parts \['P'\], got 'Nowhere'"),
    ('part = "P"\nneeds = [1]\n', r"chapter 1 \(chapters/a.ipynb\): needs must be a list of earlier chapter numbers, got \[1\]"),
    ('part = "P"\nneeds = 2\n', r"needs must be a list of earlier chapter numbers, got 2"),
])
def test_manifest_parts_and_needs_are_checked(tmp_path, extra, message):
    root = _make_book(tmp_path, _entry("chapters/a.ipynb").replace('tier =', extra + 'tier ='), ["a.ipynb"])
    toml = (root / "book.toml").read_text().replace('description = "D"', 'description = "D"\nparts = ["P"]')
    (root / "book.toml").write_text(toml)
    with pytest.raises(book.ManifestError, match=message):
        book.load_book(root)


def _book_with_a_path(tmp_path, path_toml: str):
    """A one-chapter book whose manifest also holds the reader path `path_toml`: (its root, its toml)."""
    root = _make_book(tmp_path, _entry("chapters/a.ipynb"), ["a.ipynb"])
    toml = (root / "book.toml").read_text().replace("[[chapters]]", f"[[paths]]\n{path_toml}\n\n[[chapters]]", 1)
    (root / "book.toml").write_text(toml)
    return root, toml


@pytest.mark.parametrize("path_toml, error, wrong, right, field", [
    # a path names only chapters of the book
    ('name = "Fast"\nwho = "you"\nchapters = [1, 7]', r"\[\[paths\]\] 'Fast': chapters \[7\] are not in the book",
     "[1, 7]", "[1]", "chapters"),
    # its optional chapters are chapters of the path
    ('name = "P"\nwho = "you"\nchapters = [1]\noptional = [2]',
     r"\[\[paths\]\] 'P': optional must list chapters of the path", "optional = [2]", "optional = [1]", "optional"),
])
def test_manifest_reader_paths_are_refused_until_they_hold_chapters_of_the_book(tmp_path, path_toml, error, wrong,
                                                                               right, field):
    root, toml = _book_with_a_path(tmp_path, path_toml)
    with pytest.raises(book.ManifestError, match=error):
        book.load_book(root)
    (root / "book.toml").write_text(toml.replace(wrong, right))
    assert getattr(book.load_book(root).paths[0], field) == (1,)


def test_the_book_map_follows_the_manifest():
    """Every chapter has a part of [book] parts, in order; it needs only earlier chapters;
    every reader path holds each chapter's needs before it (chapter 0 included: chapter 1 needs
    it), with and without its optional chapters (tests/test_terms.py)."""
    from test_terms import path_problems

    assert BOOK.parts and all(c.part in BOOK.parts for c in BOOK.chapters)
    assert all(n < c.number for c in BOOK.chapters for n in c.needs)
    assert not path_problems(BOOK), path_problems(BOOK)


def test_building_accepts_a_notebook_not_yet_run(tmp_path):
    root = _make_book(tmp_path, _entry("chapters/a.ipynb"), [])
    (root / "chapters" / "a.py").write_text("")
    assert book.load_book(root, building=True).chapters[0].name == "a"


def test_select_by_number_and_name():
    assert BOOK.select(["1"]) == [BOOK.chapters[1]]
    assert BOOK.select(["01_grpo_by_hand"]) == [BOOK.chapters[1]]
    assert BOOK.select(["0"]) == [BOOK.chapters[0]]
    with pytest.raises(book.ManifestError, match="chapter '99' is not in book.toml"):
        BOOK.select(["99"])


def test_readme_chapter_table_matches_manifest():
    readme = (ROOT / "README.md").read_text()
    assert book.chapter_table(BOOK) in readme, (
        "README.md's chapter table is out of date; paste this:\n" + book.chapter_table(BOOK))


def test_the_torch_pin_the_chapters_print_is_the_makefiles():
    from grpo_edu.runtime.numerics import TORCH_PIN

    line = next(line for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith("TORCH "))
    assert line.split("?=")[1].strip() == TORCH_PIN


def test_book_list_prints_every_chapter(capsys):
    assert main(["book", "list"]) == 0
    out = capsys.readouterr().out
    for chapter in BOOK.chapters:
        assert chapter.title in out and f"{chapter.budget_seconds} s" in out


def test_the_readme_doors_open_with_make_targets():
    """The README's three doors (Read, Train, and Work on it for contributors) each open with a
    make target, and CI runs the last one, make test (tests/test_readme.py checks every other
    command it shows)."""
    readme = (ROOT / "README.md").read_text()
    firsts = []
    for door in ("### Read\n", "### Train\n", "## Work on it\n"):
        block = readme.split(door, 1)[1].split("```bash", 1)[1].split("```", 1)[0]
        firsts.append(block.strip().splitlines()[0].split("#")[0].strip())
    assert firsts == ["make book", "make train", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    for target in ("train", "test", "book"):
        assert re.search(rf"^{target}:", makefile, re.M), target
    assert re.search(r"^make test$", (ROOT / ".ci" / "run").read_text(), re.M)
    assert "torch==2.13.0" in makefile


def test_the_readme_states_every_part_of_ci_in_order():
    """The CI table (docs/contributing.md, which the README links) lists .ci/run's make targets,
    in .ci/run's order, each with a time."""
    run = re.findall(r"^make ([\w-]+)$", (ROOT / ".ci" / "run").read_text(), re.M)
    readme = (ROOT / "docs" / "contributing.md").read_text()
    assert "](docs/contributing.md)" in (ROOT / "README.md").read_text()
    table = readme.split("| part | command | what it runs | time |", 1)[1].split("\n\n", 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.strip().splitlines()[1:]]
    listed = [row[1].strip("`").removeprefix("make ") for row in rows if row[1].startswith("`make ")]
    assert listed == run
    assert all(re.fullmatch(r"(\d+ min )?\d+ s", row[3]) for row in rows), rows
    assert rows[-1][1] == "`.ci/run`"


# ----------------------------------------------------------------- committed chapters

@pytest.mark.parametrize("chapter", BOOK.chapters, ids=lambda c: c.name)
def test_chapter_is_committed_executed(chapter):
    """A stripped notebook passes nbval vacuously: every code cell must carry an
    integer execution count, and the chapter must have outputs and no errors."""
    cells = json.loads((ROOT / chapter.path).read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    assert code, f"{chapter.path} has no code cells"
    not_run = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and not isinstance(c["execution_count"], int)]
    assert not not_run, f"{chapter.path}: cells {not_run} were not executed"
    assert any(c["outputs"] for c in code), f"{chapter.path}: no outputs committed"
    errors = [i for i, c in enumerate(cells) for o in c.get("outputs", []) if o.get("output_type") == "error"
              and "raises-exception" not in c.get("metadata", {}).get("tags", [])]
    assert not errors, f"{chapter.path}: error outputs in cells {errors}"


@pytest.mark.parametrize("chapter", BOOK.chapters, ids=lambda c: c.name)
def test_notebook_matches_its_source(chapter):
    """The .ipynb was built from the current .py: no edit of one without the other."""
    built = [f"{c.cell_type}:{c.source}" for c in notebooks.read_source(ROOT / chapter.source).cells]
    assert notebooks.code_sources(ROOT / chapter.path) == built, (
        f"{chapter.path} is stale: run `grpo-edu book run {chapter.number}`")


@pytest.mark.parametrize("chapter", BOOK.chapters, ids=lambda c: c.name)
def test_prose_numbers_are_computed(chapter):
    offenders = book.prose_number_offenders(ROOT / chapter.path)
    assert not offenders, "\n".join(offenders)


# ----------------------------------------------------------------- the prose-number check

def _notebook(tmp_path, markdown, code, output):
    nb = {"cells": [
        {"cell_type": "markdown", "metadata": {}, "source": markdown},
        {"cell_type": "code", "metadata": {}, "source": code, "execution_count": 1,
         "outputs": [{"output_type": "stream", "name": "stdout", "text": output}]},
    ], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    return path


@pytest.mark.parametrize("markdown, found", [
    ("the std is 0.384", True),              # printed 0.38406 rounds to it
    ("the std is 0.3841", True),
    ("the std is 0.385", False),
    ("advantage -1.432", True),
    ("advantage −1.432", True),               # unicode minus
    ("advantage 1.432", False),              # sign matters
    ("eps is 1e-8", True),                   # written in the code
    ("eps is 1e-6", False),
    ("see Section 15.2 and TRL 1.16", True),  # references, not results
    ("exercise 1.1 and exercises 6.1 to 6.2", True),
    ("vLLM 0.10.2 or v0.11", True),
    ("`x = 3.14159` in code", True),
    ("G = 4 responses in 2026", True),       # integers are not checked
    ("a range up to 0.770", True),           # printed as 0.734-0.770: a dash, not a sign
    ("a range down to -0.770", True),
    ("the upper end 0.771", False),
])
def test_prose_number_matching(tmp_path, markdown, found):
    path = _notebook(tmp_path, markdown, "eps = 1e-8\n", "std 0.38406, A -1.43208, range 0.734-0.770\n")
    offenders = book.prose_number_offenders(path)
    assert (not offenders) == found, offenders


def test_prose_offender_names_its_cell(tmp_path):
    path = _notebook(tmp_path, "## Results\nthe loss is 0.000", "x = 1\n", "loss 0.1048\n")
    assert book.prose_number_offenders(path) == [
        "cell 0 ('## Results'): 0.000 is not computed by the chapter"]


# ----------------------------------------------------------------- nbval really compares

@pytest.mark.slow
def test_nbval_catches_a_changed_number(tmp_path):
    """Guard against a vacuous check: change one printed number in a copy of
    chapter 1 and the strict nbval run over it must fail."""
    shutil.copy(ROOT / "chapters" / "conftest.py", tmp_path / "conftest.py")
    notebook = json.loads((ROOT / "chapters" / "01_grpo_by_hand.ipynb").read_text())
    changed = False
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            text = "".join(output.get("text", []))
            if not changed and "group loss = mean over 4 responses = +0.1048" in text:
                output["text"] = text.replace("+0.1048", "+0.1049")
                changed = True
    assert changed
    (tmp_path / "ch.ipynb").write_text(json.dumps(notebook))
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
                             str(tmp_path / "ch.ipynb")],
                            cwd=ROOT, capture_output=True, text=True, env=book.kernel_env())
    assert result.returncode == 1, result.stdout[-2000:]
    assert "+0.1049" in result.stdout and "+0.1048" in result.stdout


def test_a_gpu_cell_is_not_run_without_a_gpu_and_says_so(tmp_path, monkeypatch):
    """A cell tagged `gpu` on a machine without CUDA: not executed (it would raise), one line of
    output saying why and where the chapter was built; the cells around it run."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    source = tmp_path / "gpu.py"
    source.write_text('# %%\nx = 21\n\n# %% tags=["gpu"]\nraise RuntimeError("needs a GPU")\n\n# %%\nprint(2 * x)\n')
    target = tmp_path / "gpu.ipynb"
    notebooks.build(source, target, env=dict(book.KERNEL_ENV, PATH="/usr/bin:/bin"))
    import nbformat
    cells = [c for c in nbformat.read(target, as_version=4).cells if c.cell_type == "code"]
    assert [c.execution_count for c in cells] == [1, 2, 3]
    assert cells[1].outputs[0]["text"].startswith("Not run here: this cell needs a CUDA GPU (built on ")
    assert cells[2].outputs[0]["text"] == "42\n"
    assert notebooks.gpu_cells(nbformat.read(target, as_version=4)) == [1]


def test_a_gpu_cell_runs_on_a_gpu_and_names_it(tmp_path, monkeypatch):
    """Where torch sees a CUDA GPU, a cell tagged `gpu` runs like any other, and its output
    starts with a line naming the GPU it ran on (here a pretend one: the cell itself needs none)."""
    import nbformat
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Pretend H100")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    source = tmp_path / "gpu.py"
    source.write_text('# %%\nx = 21\n\n# %% tags=["gpu"]\nprint(2 * x)\n\n# %% tags=["gpu"]\nx + 1\n')
    target = tmp_path / "gpu.ipynb"
    notebooks.build(source, target, env=dict(book.KERNEL_ENV, PATH="/usr/bin:/bin"))
    cells = [c for c in nbformat.read(target, as_version=4).cells if c.cell_type == "code"]
    assert [c.execution_count for c in cells] == [1, 2, 3]
    assert cells[0].outputs == []
    assert [o["text"] for o in cells[1].outputs] == ["Run on Pretend H100 (1 of 8 GPUs, CUDA 12.8).\n42\n"]
    first, result = cells[2].outputs   # a cell without stdout: the line comes before its result
    assert first["text"] == "Run on Pretend H100 (1 of 8 GPUs, CUDA 12.8).\n"
    assert result["data"]["text/plain"] == "22"


def _build_without_gpu(source: Path, text: str, env: dict) -> Path:
    """Build `text` (py:percent) into a notebook in a process of its own that sees no GPU."""
    source.write_text(text)
    target = source.with_suffix(".ipynb")
    done = subprocess.run([sys.executable, "-c", "import os, sys; from pathlib import Path; "
                           "from grpo_edu.book import notebooks; "
                           "notebooks.build(Path(sys.argv[1]), Path(sys.argv[2]), env=dict(os.environ))",
                           str(source), str(target)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return target


def _nbval(notebook: Path, env: dict, *options: str) -> subprocess.CompletedProcess:
    """Strict nbval over `notebook` with chapters/conftest.py beside it, as over a chapter."""
    shutil.copy(ROOT / "chapters" / "conftest.py", notebook.parent / "conftest.py")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *options,
                           "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"), str(notebook)],
                          cwd=ROOT, capture_output=True, text=True, env=env)


@pytest.mark.slow
def test_nbval_skips_a_gpu_cell_without_a_gpu(tmp_path):
    """nbval over a notebook built without a GPU: the cell tagged `gpu` (which would raise if
    run) is skipped with the reason "needs a CUDA GPU", the cells around it pass."""
    env = dict(book.kernel_env(), CUDA_VISIBLE_DEVICES="")   # no GPU, even on a machine with one
    notebook = _build_without_gpu(tmp_path / "gpu.py", '# %%\nx = 21\n\n# %% tags=["gpu"]\n'
                                  'raise RuntimeError("needs a GPU")\n\n# %%\nprint(2 * x)\n', env)
    result = _nbval(notebook, env)
    assert result.returncode == 0, result.stdout[-2000:]
    assert "2 passed, 1 skipped" in result.stdout, result.stdout[-2000:]
    skipped = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 1 and "needs a CUDA GPU" in skipped[0], result.stdout[-2000:]


@pytest.mark.slow
def test_nbval_runs_a_gpu_cell_on_a_gpu_without_comparing(tmp_path):
    """On a machine with a GPU (pretended in pytest's process: the cells need none), nbval runs
    the cells tagged gpu: one that prints other output than the committed one passes and is
    reported as not compared; one that raises fails."""
    env = dict(book.kernel_env(), CUDA_VISIBLE_DEVICES="")
    (tmp_path / "pretend_gpu.py").write_text("import torch\ntorch.cuda.is_available = lambda: True\n"
                                             "torch.cuda.device_count = lambda: 1\n")
    notebook = _build_without_gpu(tmp_path / "gpu.py", '# %% tags=["gpu"]\nprint("on a GPU")\n', env)
    pretend = dict(env, PYTHONPATH=str(tmp_path))
    result = _nbval(notebook, pretend, "-p", "pretend_gpu")
    assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout[-2000:]
    assert "cells tagged gpu" in result.stdout and "differs from committed" in result.stdout, result.stdout[-2000:]

    raising = _build_without_gpu(tmp_path / "raising.py", '# %% tags=["gpu"]\nraise RuntimeError("broken")\n', env)
    result = _nbval(raising, pretend, "-p", "pretend_gpu")
    assert result.returncode == 1 and "1 failed" in result.stdout, result.stdout[-2000:]
