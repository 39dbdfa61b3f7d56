"""The library's layout: subpackages by role, each a room a reader finds by name.

- every import between grpo_edu's modules counts: top-level, inside a function (a lazy
  import) and under `if TYPE_CHECKING:` alike;
- a subpackage imports only the subpackages below it (ALLOWED), so the subpackages form no
  cycle, and the modules form none either;
- the maps agree with the files: the package docstring names every subpackage, each
  subpackage's docstring names every module in it, and docs/contributing.md's layout names them all;
- a module stays readable in one sitting: at most MAX_CODE_LINES lines of code (docstrings,
  comments and blank lines not counted);
- the loop module, grpo_edu.training.trainer, is imported only for what it is: the loop
  (`train`, `set_up`, `loop`) and its types; every helper lives in the module named for its step;
- the loop chapter 6 prints fits on one screen, and branches on none of the run's variants.

Counting (the closing note's figures come from `python tests/test_layout.py`): modules are the
.py files under grpo_edu/ and widgets/ (imported as grpo_edu.widgets); an arrow is one module
importing another; a module's level is 1 + the highest level among the modules it imports.
"""

import ast
import inspect
import io
import re
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "grpo_edu"
WIDGETS = ROOT / "widgets"
MAX_CODE_LINES = 450
LOOP_NAMES = {"train", "loop", "set_up", "TrainState", "RunResult", "Run"}

# Which subpackage may import which. Read bottom-up: each imports only those named beside it.
ALLOWED = {
    "runtime": set(),
    "algorithm": {"runtime"},
    "policy": {"runtime"},
    "environment": {"runtime", "algorithm", "policy"},
    "sampling": {"runtime", "algorithm", "policy"},
    "config": {"runtime", "algorithm", "policy", "environment", "sampling"},
    "doctor": {"runtime"},
    "training": {"runtime", "algorithm", "policy", "environment", "sampling", "config", "doctor"},
    "lab": {"runtime", "algorithm", "policy", "environment", "sampling", "config", "doctor", "training"},
    "widgets": {"runtime", "algorithm"},
    "exercises": {"runtime", "algorithm", "policy", "environment", "sampling", "config", "doctor", "training"},
    "book": {"runtime", "algorithm", "policy", "environment", "sampling", "config", "doctor", "training", "widgets"},
    "commands": {"runtime", "algorithm", "policy", "environment", "sampling", "config", "doctor", "lab", "training",
                 "book"},
}
TOP_LEVEL = {"grpo_edu", "grpo_edu.__main__"}   # the version, and `python -m grpo_edu`


def modules() -> dict[str, Path]:
    """{dotted name: file} for every module of the package, widgets included."""
    found = {}
    for root, prefix in ((PACKAGE, ("grpo_edu",)), (WIDGETS, ("grpo_edu", "widgets"))):
        for path in sorted(root.rglob("*.py")):
            name = ".".join((*prefix, *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
            found[name] = path
    return found


def subpackage(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and name not in TOP_LEVEL) else None


def imported(path: Path, known: set[str]) -> set[str]:
    """The grpo_edu modules that path imports, wherever the import statement stands."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("grpo_edu")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("grpo_edu"):
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in known else node.module)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(path, set(known)) - {name} for name, path in known.items()}


def code_lines(path: Path) -> int:
    """Lines holding code: not blank, not only a comment, not part of a docstring."""
    source = path.read_text()
    docstring_lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                docstring_lines |= set(range(first.lineno, first.end_lineno + 1))
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                              tokenize.DEDENT, tokenize.ENDMARKER):
            lines |= set(range(token.start[0], token.end[0] + 1))
    return len(lines - docstring_lines)


def levels(edges: dict[str, set[str]]) -> dict[str, int]:
    memo: dict[str, int] = {}

    def level(name: str) -> int:
        if name not in memo:
            memo[name] = 1 + max((level(target) for target in edges[name] if target in edges), default=0)
        return memo[name]
    return {name: level(name) for name in edges}


def test_every_module_belongs_to_a_subpackage():
    loose = sorted(name for name in modules() if subpackage(name) is None and name not in TOP_LEVEL)
    assert not loose, f"modules outside every subpackage (give each a room by role): {loose}"
    unknown = sorted({subpackage(name) for name in modules()} - set(ALLOWED) - {None})
    assert not unknown, f"subpackages missing from ALLOWED (say what each may import): {unknown}"


def test_subpackages_import_only_those_below_them():
    offenders = []
    for name, targets in graph().items():
        for target in sorted(targets):
            source, destination = subpackage(name), subpackage(target)
            if destination is None and target not in TOP_LEVEL:
                continue
            if source and destination and source != destination and destination not in ALLOWED[source]:
                offenders.append(f"{name} -> {target}")
            if source and target == "grpo_edu.__main__":
                offenders.append(f"{name} -> {target}")
    assert not offenders, "imports against the layout (grpo_edu/__init__.py's order): " + "; ".join(offenders)


def test_allowed_table_has_no_cycle():
    for source in ALLOWED:
        seen, frontier = set(), set(ALLOWED[source])
        while frontier:
            target = frontier.pop()
            assert target != source, f"ALLOWED lets {source} import itself through {sorted(seen)}"
            if target not in seen:
                seen.add(target)
                frontier |= ALLOWED[target]


def test_modules_form_no_cycle_counting_every_import():
    edges = graph()
    state: dict[str, str] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = "open"
        for target in sorted(edges.get(name, ())):
            if target not in edges:
                continue
            if state.get(target) == "open":
                cycle = trail[trail.index(target):] + [target]
                raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            if target not in state:
                visit(target, trail + [target])
        state[name] = "done"
    for name in edges:
        if name not in state:
            visit(name, [name])


def docstring_names(path: Path) -> set[str]:
    """The module file names (x.py) a package docstring lists, one per line at its start."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return set(re.findall(r"^\s*(\w+\.py)\b", doc, flags=re.M))


def test_each_subpackage_docstring_lists_its_modules():
    problems = []
    for init in sorted([*PACKAGE.glob("*/__init__.py"), WIDGETS / "__init__.py"]):
        files = {path.name for path in init.parent.glob("*.py")} - {"__init__.py"}
        listed = docstring_names(init) - {"__init__.py"}
        if init.parent.name == "exercises":   # "ch00.py ... ch14.py": one line for the chapters
            listed |= {name for name in files if re.fullmatch(r"ch\d\d\.py", name)}
        if files != listed:
            problems.append(f"{init.relative_to(ROOT)}: missing {sorted(files - listed)}, "
                            f"no such file {sorted(listed - files)}")
    assert not problems, "; ".join(problems)


def test_the_package_docstring_lists_every_subpackage():
    doc = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text())) or ""
    listed = set(re.findall(r"^\s*(\w+)/?\s", doc, flags=re.M))
    assert listed >= set(ALLOWED), f"grpo_edu/__init__.py's map lacks {sorted(set(ALLOWED) - listed)}"


def test_the_contributing_doc_layout_lists_every_module():
    readme = (ROOT / "docs" / "contributing.md").read_text()
    layout = readme[readme.index("## Layout"):]
    layout = layout.split("\n## ")[0]
    missing = []
    for name, path in modules().items():
        if path.name == "__init__.py" and subpackage(name):
            if f"{path.parent.name}/" not in layout:
                missing.append(f"{path.parent.name}/")
        elif re.fullmatch(r"ch\d\d\.py", path.name) and re.search(r"ch00\.py \.\.\. ch\d\d\.py", layout):
            continue   # the exercise checkers, one per chapter: one line for all
        elif name not in TOP_LEVEL and path.name not in layout:
            missing.append(str(path.relative_to(ROOT)))
    assert not missing, f"docs/contributing.md's layout does not name: {missing}"


def test_no_module_is_longer_than_one_sitting():
    long = {name: n for name, path in modules().items() if (n := code_lines(path)) > MAX_CODE_LINES}
    assert not long, f"modules over {MAX_CODE_LINES} lines of code (split them by role): {long}"


def test_code_lines_skip_docstrings_comments_and_blanks(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('"""Doc\n\nmore."""\n\n# a comment\nx = (1,\n     2)  # why\n\n\ndef f():\n'
                    '    """Doc."""\n    return """not a\ndocstring"""\n')
    assert code_lines(path) == 5   # x = (1, / 2) / def f(): / return """not a / docstring"""


def loop_names_used(path: Path) -> set[str]:
    """What path takes from grpo_edu.training.trainer: names imported from it, and attributes
    of it where it is imported as a module (`from grpo_edu.training import trainer`)."""
    tree = ast.parse(path.read_text())
    taken, aliases = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "grpo_edu.training.trainer":
            taken |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "grpo_edu.training":
            aliases |= {alias.asname or alias.name for alias in node.names if alias.name == "trainer"}
        elif isinstance(node, ast.Import):
            aliases |= {alias.asname for alias in node.names
                        if alias.name == "grpo_edu.training.trainer" and alias.asname}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            taken.add(node.attr)
    return taken


def test_nothing_imports_helpers_from_the_loop_module():
    offenders = {}
    for name, path in modules().items():
        if name == "grpo_edu.training.trainer":
            continue
        taken = loop_names_used(path)
        if taken - LOOP_NAMES:
            offenders[name] = sorted(taken - LOOP_NAMES)
    assert not offenders, f"modules import helpers from grpo_edu.training.trainer (move them to their step's module): {offenders}"


def report() -> str:
    """The layout in figures: subpackages, modules, lines of code, import levels and arrows."""
    edges = graph()
    known = {name: path for name, path in modules().items()}
    inner = {name: {t for t in targets if t in edges} for name, targets in edges.items()}
    packages: dict[str, list[str]] = {}
    for name in known:
        packages.setdefault(subpackage(name) or "(top)", []).append(name)
    lines = [f"{'subpackage':12s} {'modules':>7s} {'code lines':>10s}"]
    for package in sorted(packages):
        names = packages[package]
        lines.append(f"{package:12s} {len(names):7d} {sum(code_lines(known[n]) for n in names):10d}")
    longest = sorted(((code_lines(path), name) for name, path in known.items()), reverse=True)[:5]
    lines += [f"modules {len(known)}, code lines {sum(code_lines(p) for p in known.values())}, "
              f"all lines {sum(len(p.read_text().splitlines()) for p in known.values())}",
              f"import arrows {sum(len(t) for t in inner.values())}, levels {max(levels(inner).values())}",
              "longest modules (code lines): " + ", ".join(f"{name} {n}" for n, name in longest)]
    return "\n".join(lines)


# Names whose branch would make the loop a variant's: ranks, processes, episodes, lag, overlap,
# refills, supervision, adapters, engines. Those live in the stages the loop calls.
VARIANT_NAMES = {"rank", "size", "distributed", "is_main", "environment", "episode", "max_turns", "rollout_lag",
                 "rollout_overlap", "background", "in_flight", "dynamic_sampling_rounds", "supervision",
                 "lora_rank", "engine", "vllm_mode", "faults"}


def branch_names(function) -> set[str]:
    """The names and attributes that the conditions of `function`'s if statements read."""
    tree = ast.parse(inspect.getsource(function).lstrip())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            for part in ast.walk(node.test):
                if isinstance(part, ast.Name):
                    found.add(part.id)
                elif isinstance(part, ast.Attribute):
                    found.add(part.attr)
    return found


def test_the_loop_fits_on_one_screen_and_branches_on_no_variant():
    from grpo_edu.training import trainer
    lines = inspect.getsource(trainer.loop).splitlines()
    assert len(lines) <= 60, f"trainer.loop is {len(lines)} lines: move what is not the GRPO step into a stage"
    variants = branch_names(trainer.loop) & VARIANT_NAMES
    assert not variants, f"trainer.loop branches on {sorted(variants)}: give the variant a stage of its own"
    signature = inspect.signature(trainer.train).parameters
    assert "faults" not in signature and "faults" not in inspect.signature(trainer.set_up).parameters


def test_branch_names_sees_a_branch_on_a_variant():
    def looped(run):
        while run.step < 3:
            if run.config.off_policy.rollout_lag and run.world.is_main:
                pass
    assert {"rollout_lag", "is_main", "step"} <= branch_names(looped)


if __name__ == "__main__":
    sys.exit(print(report()))
