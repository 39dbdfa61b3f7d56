"""The library functions whose source (or docstring) a chapter prints.

A chapter that prints `inspect.getsource(f)` commits f's source in its outputs: edit f and
that chapter's committed notebook is stale (strict nbval fails until it is rebuilt with
`grpo-edu book run CHAPTER`). PRINTED lists every such function with the chapters that
print it, so whoever edits one knows which notebooks change with it; this test fails when
a chapter starts or stops printing one and the list is not updated.
"""

import ast
from pathlib import Path

from grpo_edu import book

ROOT = Path(__file__).resolve().parent.parent
BOOK = book.load_book(ROOT)

# qualified name -> the chapters (numbers) whose outputs hold its source or docstring
PRINTED = {
    "grpo_edu.algorithm.reference.log_softmax": [1],
    "grpo_edu.algorithm.reference.k3": [1],
    "grpo_edu.algorithm.reference.grpo_update": [1],
    "grpo_edu.algorithm.logprobs.token_logprobs": [3],
    "grpo_edu.algorithm.aggregation.per_response_mean": [4],
    "grpo_edu.algorithm.aggregation.batch_token_mean": [4],
    "grpo_edu.algorithm.aggregation.constant_length": [4],
    "grpo_edu.algorithm.aggregation.step_token_mean": [4],
    "grpo_edu.environment.rewards.has_format": [5],
    "grpo_edu.exercises.ch05.lenient_accuracy_reward": [5],
    "grpo_edu.training.trainer.loop": [6],
    "grpo_edu.sampling.vllm_engine.seeded_by_numbers": [11],
    "grpo_edu.training.update.optimise": [10],
    "grpo_edu.runtime.distributed.World.shard": [10],
    "grpo_edu.training.plan.Plan.totals": [10],
    "grpo_edu.runtime.distributed.init_world": [10],
    "grpo_edu.sampling.vllm_engine.VLLMEngine.sync_weights": [11],
    "grpo_edu.sampling.vllm_engine.named_weights": [11],
    "grpo_edu.sampling.vllm_engine.VLLMEngine.generate": [11],
    "grpo_edu.training.placement.build_models": [11],
    "grpo_edu.training.placement.Models.whole": [11],
}


def printed_by(chapter) -> set[str]:
    """The qualified names of what `chapter`'s source passes to inspect.getsource / getdoc,
    resolved through the chapter's own imports."""
    tree = ast.parse((ROOT / chapter.source).read_text())
    namespace: dict = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("grpo_edu") or (
                isinstance(node, ast.Import) and all(a.name.startswith("grpo_edu") for a in node.names)):
            exec(compile(ast.Module([node], []), str(chapter.source), "exec"), namespace)
    names = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "inspect"
                and node.func.attr in ("getsource", "getdoc", "getsourcelines")):
            target = eval(ast.unparse(node.args[0]), namespace)
            names.add(f"{target.__module__}.{target.__qualname__}")
    return names


def test_every_printed_source_is_listed():
    found: dict[str, list[int]] = {}
    for chapter in BOOK.chapters:
        for name in printed_by(chapter):
            found.setdefault(name, []).append(chapter.number)
    assert found == PRINTED, (
        "a chapter prints the source of other functions than PRINTED lists: "
        f"new {sorted(set(found) - set(PRINTED))}, gone {sorted(set(PRINTED) - set(found))}, "
        f"chapters changed {sorted(n for n in set(found) & set(PRINTED) if found[n] != PRINTED[n])}")

