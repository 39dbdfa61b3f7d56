"""The library's layout: one module per step of GRPO, each small enough to read in one sitting.

- no module of grpo_edu is longer than MAX_LINES;
- the modules' top-level imports of each other form no cycle (a function-level import, made
  lazily for a heavy optional dependency such as vLLM, does not count);
- the loop module, grpo_edu.trainer, is imported only for what it is: the loop (`train`) and
  the loop's own steps (`roll_out`, `sample_prompts`, `TrainState`, `RunResult`); every helper
  lives in the module named for its step.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "grpo_edu"
MAX_LINES = 450
LOOP_NAMES = {"train", "roll_out", "sample_prompts", "TrainState", "RunResult", "Run"}


def modules() -> dict[str, Path]:
    return {".".join(("grpo_edu", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__"): path
            for path in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path, top_level_only: bool) -> dict[str, set[str]]:
    """{grpo_edu module: names taken from it} for path's imports."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: dict[str, set[str]] = {}
    known = modules()
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("grpo_edu"):
                    found.setdefault(alias.name, set())
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("grpo_edu"):
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if submodule in known:
                    found.setdefault(submodule, set())
                else:
                    found.setdefault(node.module, set()).add(alias.name)
    found.pop(name, None)
    return found


def test_no_module_is_longer_than_one_sitting():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by role): {long}"


def test_top_level_imports_form_no_cycle():
    graph = {name: set(imported(name, path, top_level_only=True)) for name, path in modules().items()}
    state: dict[str, str] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = "open"
        for target in sorted(graph.get(name, ())):
            if state.get(target) == "open":
                cycle = trail[trail.index(target):] + [target] if target in trail else [name, target]
                raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            if target not in state:
                visit(target, trail + [target])
        state[name] = "done"
    for name in graph:
        if name not in state:
            visit(name, [name])


def loop_names_used(path: Path) -> set[str]:
    """What path takes from grpo_edu.trainer: names imported from it, and attributes of it
    where it is imported as a module (`from grpo_edu import trainer; trainer.train(...)`)."""
    tree = ast.parse(path.read_text())
    taken, aliases = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "grpo_edu.trainer":
            taken |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "grpo_edu":
            aliases |= {alias.asname or alias.name for alias in node.names if alias.name == "trainer"}
        elif isinstance(node, ast.Import):
            aliases |= {alias.asname for alias in node.names if alias.name == "grpo_edu.trainer" and alias.asname}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            taken.add(node.attr)
    return taken


def test_nothing_imports_helpers_from_the_loop_module():
    offenders = {}
    for name, path in modules().items():
        if name == "grpo_edu.trainer":
            continue
        taken = loop_names_used(path)
        if taken - LOOP_NAMES:
            offenders[name] = sorted(taken - LOOP_NAMES)
    assert not offenders, f"modules import helpers from grpo_edu.trainer (move them to their step's module): {offenders}"
