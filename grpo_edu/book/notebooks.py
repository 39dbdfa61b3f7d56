"""Build an executed notebook from a jupytext py:percent source, reproducibly.

The .py source is what people edit and review; the .ipynb is generated from it
with outputs, normalised so that rebuilding an unchanged chapter gives the same
bytes: cell ids from the cell index, execution counts 1..n, no timing metadata.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import nbformat

GPU_TAG = "gpu"   # a cell that needs a CUDA GPU: `# %% tags=["gpu"]`

NBVAL_SKIP_KERNEL = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def read_source(source: Path) -> nbformat.NotebookNode:
    """The py:percent source as an unexecuted notebook."""
    import jupytext

    notebook = jupytext.read(source, fmt="py:percent")
    notebook.metadata = {"kernelspec": NBVAL_SKIP_KERNEL,
                         "language_info": {"name": "python"}}
    return notebook


def normalise(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Strip what differs between runs of the same chapter: ids, counts, timings."""
    count = 0
    for index, cell in enumerate(notebook.cells):
        cell["id"] = f"cell-{index:03d}"
        cell.metadata.pop("execution", None)
        if cell.metadata.get("jupyter") == {}:
            cell.metadata.pop("jupyter")
        if cell.cell_type != "code":
            continue
        count += 1
        cell.execution_count = count
        for output in cell.get("outputs", []):
            if "execution_count" in output:
                output["execution_count"] = count
            output.get("metadata", {}).pop("execution", None)
    if not _has_widget_outputs(notebook):
        notebook.metadata.pop("widgets", None)
    notebook.nbformat, notebook.nbformat_minor = 4, 5
    return _renumber_widget_models(notebook)


WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def _renumber_widget_models(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Replace the kernel's random widget model ids (uuid4) by 1, 2, ... as 32-digit hex,
    in the order the kernel created the models (which a rerun repeats). The ids occur as
    keys of the saved widget state, as "IPY_MODEL_<id>" references inside it and as the
    model_id of widget outputs. Sorted, the new ids keep their order, so normalising a
    normalised notebook changes nothing."""
    state = notebook.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state")
    if not state:
        return notebook
    renamed = {old: uuid.UUID(int=number).hex for number, old in enumerate(state, start=1)}
    if all(old == new for old, new in renamed.items()):
        return notebook
    text = json.dumps(notebook)
    for old, new in renamed.items():
        text = text.replace(old, new)
    return nbformat.from_dict(json.loads(text))


def _has_widget_outputs(notebook: nbformat.NotebookNode) -> bool:
    return any("application/vnd.jupyter.widget-view+json" in o.get("data", {})
               for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", []))


def gpu_cells(notebook: nbformat.NotebookNode) -> list[int]:
    """Indices of the code cells tagged `gpu`."""
    return [i for i, c in enumerate(notebook.cells)
            if c.cell_type == "code" and GPU_TAG in c.metadata.get("tags", [])]


def not_run_output(machine: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_output("stream", name="stdout",
                                  text=f"Not run here: this cell needs a CUDA GPU (built on {machine}).\n")


def _machine() -> str:
    """Where a chapter without CUDA was built, in a few words: "x86_64 Linux, no CUDA GPU"."""
    import platform
    return f"{platform.machine()} {platform.system()}, no CUDA GPU"


def _gpu() -> str:
    """The GPU a gpu cell ran on: "NVIDIA H100 80GB HBM3 (1 of 8 GPUs, CUDA 12.8)"."""
    import torch
    return (f"{torch.cuda.get_device_name(0)} (1 of {torch.cuda.device_count()} GPUs, "
            f"CUDA {torch.version.cuda})")


def ran_on_output(gpu: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_output("stream", name="stdout", text=f"Run on {gpu}.\n")


def _prepend(cell: nbformat.NotebookNode, line: nbformat.NotebookNode) -> None:
    """Put `line` (a stdout stream) first in the cell's outputs, merged with a stdout stream
    that already comes first (as coalesce_streams would have)."""
    outputs = cell.get("outputs", [])
    if outputs and outputs[0].get("output_type") == "stream" and outputs[0].get("name") == "stdout":
        outputs[0]["text"] = line["text"] + outputs[0]["text"]
    else:
        cell.outputs = [line, *outputs]


def execute(notebook: nbformat.NotebookNode, cwd: Path, env: dict[str, str], timeout: int
            ) -> nbformat.NotebookNode:
    """Run every cell in a fresh kernel (the current Python environment). Where torch sees no
    CUDA GPU, the cells tagged `gpu` are not run: each gets one line saying so, and on what
    machine the chapter was built (nbval skips them there too, chapters/conftest.py). Where it
    sees one, they run, and their output starts with a line naming the GPU."""
    from nbclient import NotebookClient
    import torch

    has_gpu = torch.cuda.is_available()
    set_aside = [] if has_gpu else gpu_cells(notebook)
    for index in set_aside:   # raw cells are not executed
        notebook.cells[index].cell_type = "raw"

    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}},
                            coalesce_streams=True, store_widget_state=True,
                            record_timing=False, allow_errors=False)
    client.execute(env=env)  # the kernel gets exactly the book's environment
    for index in set_aside:
        cell = notebook.cells[index]
        cell.cell_type = "code"
        cell.outputs, cell.execution_count = [not_run_output(_machine())], None
    if has_gpu:
        for index in gpu_cells(notebook):
            _prepend(notebook.cells[index], ran_on_output(_gpu()))
    return notebook


def build(source: Path, target: Path, env: dict[str, str], timeout: int = 600) -> None:
    """Rebuild `target` (.ipynb) from `source` (.py), executed and normalised."""
    notebook = execute(read_source(source), cwd=target.parent, env=env, timeout=timeout)
    nbformat.write(normalise(notebook), target)


def code_sources(notebook_path: Path) -> list[str]:
    """The code and markdown sources of a notebook, cell by cell (for drift checks)."""
    notebook = nbformat.read(notebook_path, as_version=4)
    return [f"{c.cell_type}:{c.source}" for c in notebook.cells]


class CodeChangedError(ValueError):
    """The source's code differs from the executed notebook's: the chapter must be re-run."""


def sync_prose(source: Path, target: Path) -> int:
    """Write `source`'s markdown into the executed notebook `target`, keeping every output,
    where the two have the same code cells in the same order (outputs depend on code only).
    Returns the number of markdown cells that changed; raises CodeChangedError naming the
    first code cell that differs (then `grpo-edu book run` rebuilds the chapter)."""
    fresh = read_source(source)
    executed = nbformat.read(target, as_version=4)
    new_code = [c for c in fresh.cells if c.cell_type == "code"]
    old_code = [c for c in executed.cells if c.cell_type == "code"]
    for index, (new, old) in enumerate(zip(new_code, old_code)):
        if new.source != old.source or new.metadata.get("tags") != old.metadata.get("tags"):
            raise CodeChangedError(f"{source}: code cell {index + 1} differs from {target.name}'s; "
                                   f"run the chapter (grpo-edu book run)")
    if len(new_code) != len(old_code):
        raise CodeChangedError(f"{source}: {len(new_code)} code cells against {len(old_code)} in "
                               f"{target.name}; run the chapter (grpo-edu book run)")
    old_markdown = [c.source for c in executed.cells if c.cell_type != "code"]
    outputs = iter(old_code)
    cells = []
    for cell in fresh.cells:
        cells.append(next(outputs) if cell.cell_type == "code" else cell)
    executed.cells = cells
    nbformat.write(normalise(executed), target)
    new_markdown = [c.source for c in cells if c.cell_type != "code"]
    return sum(a != b for a, b in zip(new_markdown, old_markdown)) + abs(len(new_markdown) - len(old_markdown))
