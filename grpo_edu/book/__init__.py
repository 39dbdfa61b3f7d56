"""The book's tools: its manifest (book.toml), the chapter builds and checks, the website and
the training plots the chapters show. No module of the algorithm imports it; `grpo-edu
book`, the tests and chapters/conftest.py do.

    __init__.py        Book and Chapter: the manifest, run_chapter / check_chapter, the prose checks
    notebooks.py       a chapter notebook built from its py:percent source, reproducibly
    commands.py        `grpo-edu book list | run | check | prose | map | html`
    prose.py           the prose measured: sentences, their length, reading time, acronyms at first use
    map.py             the map of the book (parts, chapters, what needs what) drawn as SVG
    html.py            the static website (`grpo-edu book html`)
    explorer_specs.py  the explorers as static pictures and tables for the website
    schematics.py      the schematic pictures of the chapters, drawn in code
    home.py            where a chapter reads and writes, in the repository or anywhere else
    plots.py           training curves from a run's metrics.jsonl (matplotlib, lazily)
    claims.py          a chapter's claims cell as one line: "8 claims checked: all hold"
    static/            the website's scripts, styles and KaTeX

A chapter is a jupytext `py:percent` source (chapters/NN_name.py) beside its
executed notebook (chapters/NN_name.ipynb, outputs committed). `run_chapter`
rebuilds the notebook from the source in a fresh kernel; `check_chapter`
re-executes it under nbval and compares every output; `prose_number_offenders`
finds numbers written in the prose that the code never computes. The notebook
building itself (jupytext, nbclient, normalised ids) is `grpo_edu.book.notebooks`,
imported only when a chapter is built, so the rest needs no Jupyter packages.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from grpo_edu.runtime import numerics

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

TIERS = ("cpu", "gpu", "multi-gpu")
ROOT = Path(__file__).resolve().parents[2]   # the repository root: book.toml, chapters/

# The execution settings shared by `book run` and `book check`: the same kernel
# environment is what makes a rebuilt notebook equal to a re-executed one.
KERNEL_ENV = {
    "PYTHONHASHSEED": "0",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "MPLBACKEND": "module://matplotlib_inline.backend_inline",
    "TQDM_MININTERVAL": "1000",
}


class ManifestError(ValueError):
    """book.toml is inconsistent with itself or with chapters/."""


@dataclass(frozen=True)
class Chapter:
    number: int
    path: Path          # the executed notebook, relative to the book root
    title: str
    summary: str
    tier: str
    budget_seconds: int
    part: str = ""
    needs: tuple[int, ...] = ()

    @property
    def source(self) -> Path:
        """The jupytext py:percent source beside the notebook."""
        return self.path.with_suffix(".py")

    @property
    def name(self) -> str:
        return self.path.stem


@dataclass(frozen=True)
class ReaderPath:
    """A way through the book for one kind of reader; `optional` are chapters of it a reader may
    leave out (the README states the path's time with and without them)."""
    name: str
    who: str
    chapters: tuple[int, ...]
    optional: tuple[int, ...] = ()


@dataclass(frozen=True)
class Book:
    root: Path
    title: str
    description: str
    chapters: tuple[Chapter, ...]
    parts: tuple[str, ...] = ()
    paths: tuple[ReaderPath, ...] = ()

    def chapter(self, number: int) -> Chapter:
        return next(c for c in self.chapters if c.number == number)

    def reading_minutes(self, chapter: Chapter) -> int:
        """The chapter's reading time, computed from its notebook's text (grpo_edu.book.prose)."""
        from grpo_edu.book import prose

        return prose.reading_minutes(json.loads((self.root / chapter.path).read_text())["cells"])

    def path_minutes(self, path: ReaderPath, leaving_out: tuple[int, ...] = ()) -> int:
        """A reader path's reading time: the sum of its chapters' (those in leaving_out not read)."""
        return sum(self.reading_minutes(self.chapter(n)) for n in path.chapters if n not in leaving_out)

    def select(self, names: list[str] | None) -> list[Chapter]:
        """Chapters by number ("1"), stem ("01_grpo_by_hand") or path; all when empty."""
        if not names:
            return list(self.chapters)
        chosen = []
        for name in names:
            matches = [c for c in self.chapters
                       if name in (str(c.number), f"{c.number:02d}", c.name, str(c.path))]
            if not matches:
                known = ", ".join(f"{c.number} ({c.name})" for c in self.chapters)
                raise ManifestError(f"chapter {name!r} is not in book.toml; known: {known}")
            chosen.extend(m for m in matches if m not in chosen)
        return chosen


def load_book(root: Path | str = ROOT, *, building: bool = False) -> Book:
    """Read and validate book.toml: every listed notebook exists, once, with a known
    tier and a positive budget, and every notebook in chapters/ is listed.

    building=True (for `book run`) accepts a listed notebook that does not exist
    yet, as long as its .py source does: running the chapter creates it."""
    root = Path(root)
    manifest = root / "book.toml"
    with open(manifest, "rb") as f:
        data = tomllib.load(f)
    meta = data.get("book", {})
    for key in ("title", "description"):
        if not isinstance(meta.get(key), str) or not meta[key].strip():
            raise ManifestError(f"book.toml [book] needs a non-empty string {key!r}")
    entries = data.get("chapters")
    if not isinstance(entries, list) or not entries:
        raise ManifestError("book.toml needs at least one [[chapters]] entry")

    parts = meta.get("parts", [])
    if not isinstance(parts, list) or not all(isinstance(p, str) and p for p in parts):
        raise ManifestError(f"book.toml [book] parts: expected a list of names, got {parts!r}")
    first = meta.get("first_chapter", 1)
    if first not in (0, 1) or isinstance(first, bool):
        raise ManifestError(f"book.toml [book] first_chapter: expected 0 or 1, got {first!r}")
    chapters, seen = [], set()
    for number, entry in enumerate(entries, start=first):
        label = f"book.toml chapter {number} ({entry.get('path', '<no path>')})"
        missing = {"path", "title", "summary", "tier", "budget_seconds"} - set(entry)
        if missing:
            raise ManifestError(f"{label}: missing {sorted(missing)}")
        unknown = set(entry) - {"path", "title", "summary", "tier", "budget_seconds", "part", "needs"}
        if unknown:
            raise ManifestError(f"{label}: unknown keys {sorted(unknown)}")
        path = Path(entry["path"])
        if path.suffix != ".ipynb" or path.parent != Path("chapters"):
            raise ManifestError(f"{label}: path must be chapters/<name>.ipynb, got {entry['path']!r}")
        if path in seen:
            raise ManifestError(f"{label}: duplicate entry for {entry['path']!r}")
        seen.add(path)
        if not (root / path).is_file() and not building:
            raise ManifestError(f"{label}: notebook {entry['path']!r} does not exist")
        if not (root / path.with_suffix(".py")).is_file():
            raise ManifestError(f"{label}: source {path.with_suffix('.py')} does not exist")
        if entry["tier"] not in TIERS:
            raise ManifestError(f"{label}: tier must be one of {TIERS}, got {entry['tier']!r}")
        budget = entry["budget_seconds"]
        if not isinstance(budget, int) or isinstance(budget, bool) or budget <= 0:
            raise ManifestError(f"{label}: budget_seconds must be a positive integer, got {budget!r}")
        part = entry.get("part", "")
        if parts and part not in parts:
            raise ManifestError(f"{label}: part must be one of [book] parts {list(parts)}, got {part!r}")
        needs = entry.get("needs", [])
        if (not isinstance(needs, list)
                or not all(isinstance(n, int) and not isinstance(n, bool) and first <= n < number for n in needs)):
            raise ManifestError(f"{label}: needs must be a list of earlier chapter numbers, got {needs!r}")
        chapters.append(Chapter(number, path, entry["title"], entry["summary"], entry["tier"], budget,
                                part, tuple(needs)))

    on_disk = {p.relative_to(root) for p in (root / "chapters").glob("*.ipynb")}
    unlisted = sorted(str(p) for p in on_disk - seen)
    if unlisted:
        raise ManifestError(f"notebooks in chapters/ not listed in book.toml: {unlisted}")
    if parts:
        order = [parts.index(c.part) for c in chapters]
        if order != sorted(order):
            raise ManifestError(f"book.toml: the chapters' parts must follow [book] parts {parts} in order")
    numbers = {c.number for c in chapters}
    paths = []
    for entry in data.get("paths", []):
        if not {"name", "who", "chapters"} <= set(entry) <= {"name", "who", "chapters", "optional"}:
            raise ManifestError(f"book.toml [[paths]]: expected the keys name, who, chapters (and optional), "
                                f"got {sorted(entry)}")
        unknown = [n for n in entry["chapters"] if n not in numbers]
        if unknown:
            raise ManifestError(f"book.toml [[paths]] {entry['name']!r}: chapters {unknown} are not in the book")
        optional = entry.get("optional", [])
        if not isinstance(optional, list) or not set(optional) <= set(entry["chapters"]):
            raise ManifestError(f"book.toml [[paths]] {entry['name']!r}: optional must list chapters of the path, "
                                f"got {optional!r}")
        paths.append(ReaderPath(entry["name"], entry["who"], tuple(entry["chapters"]), tuple(optional)))
    return Book(root, meta["title"], meta["description"], tuple(chapters), tuple(parts), tuple(paths))


def chapter_table(book: Book) -> str:
    """The map of the book as Markdown (the README carries exactly this): the chapters by part,
    each with what it needs first, its reading time and its compute budget; then the paths."""
    rows = ["| # | Chapter | Needs | Reading | Runs in |", "|---|---|---|---|---|"]
    part = None
    for c in book.chapters:
        if c.part and c.part != part:
            part = c.part
            rows.append(f"| | **{part}** | | | |")
        needs = ", ".join(str(n) for n in c.needs) or "-"
        rows.append(f"| {c.number} | [{c.title}]({c.path}): {c.summary} | {needs} | "
                    f"{book.reading_minutes(c)} min | {c.budget_seconds} s |")
    lines = ["\n".join(rows)]
    if book.paths:
        lines.append("\n".join(f"- **{p.name}** ({p.who}): {path_line(book, p)}" for p in book.paths))
    return "\n\n".join(lines)


def path_line(book: Book, path: ReaderPath) -> str:
    """A reader path's chapters and its reading time, computed: "0 → 1 → 2, about 63 min", and
    with its optional chapters left out where it has any ("; 214 min without chapter 9")."""
    line = " → ".join(str(n) for n in path.chapters) + f", about {book.path_minutes(path)} min"
    if path.optional:
        left_out = ", ".join(str(n) for n in path.optional)
        line += (f"; {book.path_minutes(path, path.optional)} min without chapter"
                 f"{'s' if len(path.optional) > 1 else ''} {left_out}")
    return line


# --------------------------------------------------------------------------- tiers

def available_tiers() -> dict[str, str | None]:
    """For each tier, None if this machine can run it, else the reason it cannot."""
    try:
        import torch
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        gpus = 0
    return {
        "cpu": None,
        "gpu": None if gpus >= 1 else "no CUDA GPU on this machine",
        "multi-gpu": None if gpus >= 2 else f"needs >= 2 CUDA GPUs, this machine has {gpus}",
    }


# --------------------------------------------------------------------------- prose numbers

# A decimal number: 0.384, -1.432, .5, 1e-8, 2.5e+3. Integers are not checked.
_NUMBER = re.compile(r"(?<![\w.])[-−]?(?:\d+\.\d+(?:[eE][-+]?\d+)?|\.\d+|\d+[eE][-+]?\d+)(?![\w.]*\d)")
# Contexts that hold numbers that are not results: versions (1.2.3, v0.10,
# TRL 1.16), section and exercise references, URLs and code spans.
_SKIPPED_SPANS = re.compile(
    r"`[^`]*`"                                   # inline code: shown code, not a claim
    r"|\]\([^)]*\)|https?://\S+"                 # link targets
    r"|\b\d+\.\d+(?:\.\d+)+\b"                   # dotted versions 0.10.2
    r"|(?:[Ss]ection|§|[Cc]hapter|[Ee]xercises?|[Vv]ersion|\bv|TRL|vLLM|PyTorch|torch|transformers|Python|nbval)\s*[\d.]+(?:\s*(?:and|or|,|-|to)\s*[\d.]+)*"
)


def _numbers(text: str) -> list[str]:
    text = _SKIPPED_SPANS.sub(" ", text)
    return [m.group(0).replace("−", "-") for m in _NUMBER.finditer(text)]


def _decimals(literal: str) -> int:
    mantissa = re.split(r"[eE]", literal)[0]
    return len(mantissa.split(".")[1]) if "." in mantissa else 0


def _matches(claim: str, candidates: list[float]) -> bool:
    """A prose number matches a computed one if they agree at the precision written:
    0.384 matches 0.38406; -1.432 matches -1.43208; 1e-8 matches 1e-08."""
    value = float(claim)
    if re.search(r"[eE]", claim):
        return any(math.isclose(value, c, rel_tol=10 ** -(_decimals(claim) + 1)) for c in candidates)
    digits = _decimals(claim)
    return any(abs(c - value) <= 0.5 * 10 ** -digits + 1e-12 for c in candidates)


def _cell_text(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _output_text(cell: dict) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if "text" in output:
            parts.append(_cell_text({"source": output["text"]}))
        for mime in ("text/plain", "text/html", "text/latex", "text/markdown"):
            if mime in output.get("data", {}):
                parts.append(_cell_text({"source": output["data"][mime]}))
    return "\n".join(parts)


def prose_number_offenders(notebook: Path | str) -> list[str]:
    """Decimal numbers in a chapter's markdown that occur nowhere in its code or
    outputs at the precision written. Each offender names its cell."""
    cells = json.loads(Path(notebook).read_text())["cells"]
    computed_text = "\n".join(_cell_text(c) + "\n" + _output_text(c)
                              for c in cells if c["cell_type"] == "code")
    candidates = []
    for match in re.finditer(r"[-−]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?", computed_text):
        literal = match.group(0).replace("−", "-")
        try:
            candidates.append(float(literal))
            if literal.startswith("-") and match.start() and computed_text[match.start() - 1].isalnum():
                candidates.append(float(literal[1:]))     # a range 0.734-0.770: the dash is not a sign
        except ValueError:
            continue
    offenders = []
    for index, cell in enumerate(cells):
        if cell["cell_type"] != "markdown":
            continue
        for claim in _numbers(_cell_text(cell)):
            if not _matches(claim, candidates):
                first_line = _cell_text(cell).strip().splitlines()[0][:60]
                offenders.append(f"cell {index} ({first_line!r}): {claim} is not computed by the chapter")
    return offenders


# --------------------------------------------------------------------------- run and check

def kernel_env(pinned: bool = True) -> dict[str, str]:
    """This process's environment with the book's kernel settings and, where the machine
    allows and `pinned`, the pinned floating-point kernels (grpo_edu.runtime.numerics)."""
    env = dict(os.environ)
    env.update(KERNEL_ENV)
    if pinned and numerics.unpinnable_reason() is None:
        env = numerics.pinned_env(env)
    return env


class UnpinnedBuildError(RuntimeError):
    """A chapter would be built with kernels other than the pinned ones."""


def run_chapter(chapter: Chapter, root: Path = ROOT) -> float:
    """Rebuild chapter.path from its py:percent source in a fresh kernel, with the pinned
    floating-point kernels, and write it with outputs. Returns the execution time in seconds.

    Refuses on a machine that cannot run the pin: outputs built there would not be the
    ones every x86-64 reader's `make test` reproduces."""
    from grpo_edu.book import notebooks

    reason = numerics.unpinnable_reason()
    if reason is not None:
        raise UnpinnedBuildError(f"book run: {reason}; chapters are built with the pinned kernels "
                                 f"(grpo_edu.runtime.numerics) so that they reproduce on every x86-64 machine")
    start = time.perf_counter()
    notebooks.build(root / chapter.source, root / chapter.path, env=kernel_env(),
                    timeout=max(600, 3 * chapter.budget_seconds))
    return time.perf_counter() - start


def check_chapter(chapter: Chapter, root: Path = ROOT, extra_args: list[str] | None = None
                  ) -> tuple[bool, float, str]:
    """Re-execute a chapter under strict nbval and compare every output.
    Returns (passed, seconds, pytest's output)."""
    # pyproject.toml's addopts carry the nbval settings; chapters/conftest.py the
    # kernel environment. The suite and this command therefore check alike.
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
               str(root / chapter.path), *(extra_args or [])]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=root, env=kernel_env(), capture_output=True, text=True)
    return result.returncode == 0, time.perf_counter() - start, result.stdout + result.stderr
