"""Record, from a vLLM release's own source, what each name grpo_edu/sampling/vllm_engine.py uses is.

    python tests/freeze_vllm_api.py vllm-0.31.0-cp38-abi3-manylinux_2_28_x86_64.whl > tests/vllm_api_0.31.0.json

(`pip download vllm==0.31.0 --no-deps` fetches the wheel; it is read as a zip, parsed with
`ast`, never imported, so this runs on any machine.) For every key of VLLM_API it writes
where vLLM defines it and, for a callable, its parameter names; for a class, the names its
constructor takes (its __init__'s, else its fields: a dataclass, msgspec Struct or
TypedDict); for an attribute, where it is assigned. tests/test_vllm_engine.py checks
VLLM_API against this file.
"""

from __future__ import annotations

import ast
import json
import sys
import zipfile

from grpo_edu.sampling.vllm_engine import VLLM_API

# LLM(**kwargs) passes what its own signature does not name on to EngineArgs(**kwargs).
KWARGS_TO = {"vllm.LLM": "vllm.engine.arg_utils.EngineArgs"}

# Where each public name is defined in the release (the package re-exports some lazily).
DEFINED = {
    "vllm.LLM": "vllm/entrypoints/llm.py:LLM",
    "vllm.engine.arg_utils.EngineArgs": "vllm/engine/arg_utils.py:EngineArgs",
    "vllm.SamplingParams": "vllm/sampling_params.py:SamplingParams",
    "vllm.inputs.TokensPrompt": "vllm/inputs/llm.py:TokensPrompt",
    "vllm.outputs.RequestOutput": "vllm/outputs.py:RequestOutput",
    "vllm.outputs.CompletionOutput": "vllm/outputs.py:CompletionOutput",
    "vllm.logprobs.Logprob": "vllm/logprobs.py:Logprob",
    "vllm.v1.engine.llm_engine.LLMEngine": "vllm/v1/engine/llm_engine.py:LLMEngine",
    "vllm.v1.executor.uniproc_executor.UniProcExecutor": "vllm/v1/executor/uniproc_executor.py:UniProcExecutor",
    "vllm.v1.worker.worker_base.WorkerWrapperBase": "vllm/v1/worker/worker_base.py:WorkerWrapperBase",
    "vllm.v1.worker.gpu_worker.Worker": "vllm/v1/worker/gpu_worker.py:Worker",
    "vllm.v1.worker.gpu_model_runner.GPUModelRunner": "vllm/v1/worker/gpu_model_runner.py:GPUModelRunner",
    "vllm.model_executor.models.llama.LlamaForCausalLM": "vllm/model_executor/models/llama.py:LlamaForCausalLM",
    "vllm.model_executor.models.qwen2.Qwen2ForCausalLM": "vllm/model_executor/models/qwen2.py:Qwen2ForCausalLM",
}


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise KeyError(name)


def _parameters(function: ast.FunctionDef) -> list[str]:
    a = function.args
    return [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg != "self"]


def _fields(cls: ast.ClassDef) -> list[str]:
    return [node.target.id for node in cls.body if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)]


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def _assigned(cls: ast.ClassDef, name: str) -> bool:
    """`self.name = ...` (or `self.name: T = ...`) in a method, a class-level field, or a property."""
    if name in _fields(cls) or _method(cls, name) is not None:
        return True
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr == name and getattr(target.value, "id", None) == "self":
                return True
    return False


def freeze(wheel: str) -> dict:
    archive = zipfile.ZipFile(wheel)
    trees: dict[str, ast.Module] = {}

    def tree(path: str) -> ast.Module:
        if path not in trees:
            trees[path] = ast.parse(archive.read(path).decode())
        return trees[path]

    version = next(line.split(":", 1)[1].strip() for line in archive.read(
        next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))).decode().splitlines()
        if line.startswith("Version:"))
    out: dict = {"vllm_version": version, "names": {}}
    for key in VLLM_API:
        if key == "vllm.__version__":
            out["names"][key] = {"defined_in": "vllm/version.py", "value": version}
            continue
        owner = key if key in DEFINED else key.rsplit(".", 1)[0]
        member = None if key in DEFINED else key.rsplit(".", 1)[1]
        path, class_name = DEFINED[owner].split(":")
        cls = _class(tree(path), class_name)
        entry: dict = {"defined_in": f"{path}:{class_name}" + (f".{member}" if member else "")}
        if member is None:
            init = _method(cls, "__init__")
            entry["kind"] = "class"
            entry["parameters"] = _parameters(init) if init else _fields(cls)
            if key in KWARGS_TO:
                path_to, class_to = DEFINED[KWARGS_TO[key]].split(":")
                entry["kwargs_to"] = f"{path_to}:{class_to}"
                entry["kwargs_parameters"] = _fields(_class(tree(path_to), class_to))
        else:
            function = _method(cls, member)
            if function is not None and not any(getattr(d, "id", None) == "property" for d in function.decorator_list):
                entry["kind"] = "method"
                entry["parameters"] = _parameters(function)
            elif _assigned(cls, member):
                entry["kind"] = "attribute"
            else:
                raise KeyError(f"{key}: not found in {path}")
        out["names"][key] = entry
    return out


if __name__ == "__main__":
    json.dump(freeze(sys.argv[1]), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
