"""Record, from an SGLang release's own source, the HTTP API grpo_edu/sampling/sglang_engine.py speaks.

    pip download sglang==0.5.23 --no-deps -d /tmp/sglang      # or: pip install --no-deps --target DIR
    python tests/freeze_sglang_api.py /tmp/sglang/sglang-0.5.23-py3-none-any.whl > tests/sglang_api_0.5.23.json

The source (the wheel, read as a zip, or a folder holding the sglang package) is parsed with
`ast`, never imported: sglang's modules import CUDA libraries, triton and transformers' image
processors at import time. It writes:

- requests: every field of the io_struct request classes the engine's routes take (their own
  and their base's), which have no default (required), and what SGLang's HTTP layer does with
  a field it does not know (msgspec Structs: the pydantic schema's extra_behavior; the
  GenerateReqInput dataclass: FastAPI's default, ignored);
- contract: the generated JSON contract of sglang/api/v1/api_types.py, which /generate's
  bodies pass through (GenerateRequest, SamplingParams: unknown keys rejected, the one 400
  the engine can trigger by a typo) and its answers are shaped by (GenerateResponse,
  GenerateMetaInfo, LogprobEntry, the finish reasons);
- routes: each route the engine uses, its methods, the body class or query parameters;
- responses: the keys the weight-update routes answer, /model_info's, /server_info's own keys;
- server_args: every ServerArgs field and its command-line flag (sglang/srt/arg_groups/fields);
- the pickle allowlist SGLang's SafeUnpickler applies to serialized tensors (and the globals it
  answers with a safe loader of its own), the memory tags, and the environment variables the
  engine sets or clears.

tests/test_sglang_engine.py checks the engine's names against this file, and re-runs freeze()
on the pinned source where GRPO_EDU_SGLANG_SOURCE names it (`make test-sglang`).
"""

from __future__ import annotations

import ast
import json
import re
import sys
import zipfile
from pathlib import Path

from grpo_edu.sampling.sglang_engine import ROUTES

IO_STRUCT = "sglang/srt/managers/io_struct.py"
HTTP_SERVER = "sglang/srt/entrypoints/http_server.py"
API_TYPES = "sglang/api/v1/api_types.py"
CONTRACT = ("GenerateRequest", "SamplingParams", "GenerateResponse", "GenerateMetaInfo", "LogprobEntry",
            "FinishStop", "FinishLength", "FinishAbort")
RESPONSES = ("UpdateWeightFromDiskReqOutput", "UpdateWeightsFromTensorReqOutput")
EXTRA_REQUESTS = ("FlushCacheReqInput",)   # /flush_cache's internal request (the route takes ?timeout=)


class Source:
    """The release's files, from a wheel or a folder."""

    def __init__(self, where: str):
        path = Path(where)
        if path.is_dir():
            root = path if (path / "sglang").is_dir() else path.parent
            self._read = lambda name: (root / name).read_text()
            self._names = lambda: [str(p.relative_to(root)) for p in (root / "sglang").rglob("*.py")]
            metadata = next(root.glob("sglang-*.dist-info/METADATA"), None)
            self.version = _version(metadata.read_text()) if metadata else _version_py(self._read("sglang/version.py"))
        else:
            archive = zipfile.ZipFile(path)
            self._read = lambda name: archive.read(name).decode()
            self._names = archive.namelist
            self.version = _version(archive.read(next(n for n in archive.namelist()
                                                      if n.endswith(".dist-info/METADATA"))).decode())
        self._trees: dict[str, ast.Module] = {}

    def tree(self, name: str) -> ast.Module:
        if name not in self._trees:
            self._trees[name] = ast.parse(self._read(name))
        return self._trees[name]

    def text(self, name: str) -> str:
        return self._read(name)

    def names(self) -> list[str]:
        return self._names()


def _version(metadata: str) -> str:
    return next(line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Version:"))


def _version_py(text: str) -> str:
    return re.search(r"__version__\s*=\s*[\"']([^\"']+)", text)[1]


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise KeyError(name)


def _fields(cls: ast.ClassDef) -> list[tuple[str, bool]]:
    """(name, has a default) for each annotated field of the class body."""
    return [(node.target.id, node.value is not None) for node in cls.body
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)]


def _docstring_rule(cls: ast.ClassDef) -> str:
    doc = ast.get_docstring(cls) or ""
    match = re.search(r"unknown keys (ignored|rejected)", doc)
    return match[1] if match else ("positional" if "positional array" in doc else "")


def _extra_behavior(source: Source) -> str:
    """What the pydantic schema of SGLang's msgspec request Structs does with an unknown key."""
    for node in ast.walk(source.tree("sglang/srt/utils/msgspec_utils.py")):
        if isinstance(node, ast.keyword) and node.arg == "extra_behavior":
            return ast.literal_eval(node.value)
    raise KeyError("extra_behavior")


def requests(source: Source) -> dict:
    tree = source.tree(IO_STRUCT)
    unknown = _extra_behavior(source)
    out = {}
    for name in sorted({spec[1] for spec in ROUTES.values() if spec[1]} | set(EXTRA_REQUESTS)):
        cls = _class(tree, name)
        fields = _fields(cls)
        bases = [b.id for b in cls.bases if isinstance(b, ast.Name)]
        for base in bases:
            if base in ("BaseReq", "BaseBatchReq"):
                fields = _fields(_class(tree, base)) + fields
        dataclass = any(getattr(d, "id", None) == "dataclass" for d in cls.decorator_list)
        out[name] = {"defined_in": f"{IO_STRUCT}:{name}", "kind": "dataclass" if dataclass else "msgspec.Struct",
                     "fields": [f for f, _ in fields], "required": [f for f, default in fields if not default],
                     "unknown_fields": "ignore" if dataclass else unknown}
    for name in RESPONSES:
        fields = _fields(_class(tree, "BaseReq")) + _fields(_class(tree, name))
        out[name] = {"defined_in": f"{IO_STRUCT}:{name}", "kind": "msgspec.Struct", "fields": [f for f, _ in fields],
                     "required": [f for f, default in fields if not default]}
    return out


def contract(source: Source) -> dict:
    tree = source.tree(API_TYPES)
    out = {}
    for name in CONTRACT:
        cls = _class(tree, name)
        out[name] = {"defined_in": f"{API_TYPES}:{name}", "fields": [f for f, _ in _fields(cls)],
                     "unknown_keys": _docstring_rule(cls)}
    return out


def _route_decorators(function) -> list[tuple[str, list[str]]]:
    found = []
    for decorator in function.decorator_list:
        if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
                and getattr(decorator.func.value, "id", None) == "app" and decorator.args):
            continue
        path = decorator.args[0]
        if not isinstance(path, ast.Constant):
            continue
        kind = decorator.func.attr
        methods = {"get": ["GET"], "post": ["POST"], "put": ["PUT"]}.get(kind)
        for keyword in decorator.keywords:
            if keyword.arg == "methods":
                methods = ast.literal_eval(keyword.value)
        found.append((path.value, methods))
    return found


def _body_class(annotation) -> str | None:
    """X for `obj: X` or `obj: Annotated[X, Body()]`."""
    if isinstance(annotation, ast.Name):
        return annotation.id
    if isinstance(annotation, ast.Subscript) and getattr(annotation.value, "id", None) == "Annotated":
        first = annotation.slice.elts[0] if isinstance(annotation.slice, ast.Tuple) else annotation.slice
        return first.id if isinstance(first, ast.Name) else None
    return None


def _dict_keys(function, variable: str | None) -> list[str]:
    """The keys of the first dict literal assigned to `variable` (None: returned) in the function."""
    for node in ast.walk(function):
        if variable and isinstance(node, ast.Assign) and any(getattr(t, "id", None) == variable for t in node.targets):
            value = node.value
        elif variable is None and isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Dict):
            value = node.args[0]
        else:
            continue
        if isinstance(value, ast.Dict):
            return [k.value for k in value.keys if isinstance(k, ast.Constant)]
    raise KeyError(variable)


def routes(source: Source) -> tuple[dict, dict]:
    tree = source.tree(HTTP_SERVER)
    functions = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    by_path = {}
    for function in functions.values():
        for path, methods in _route_decorators(function):
            by_path.setdefault(path, (function, methods))
    out = {}
    for path in sorted(set(ROUTES) | {"/health", "/get_model_info"}):
        function, methods = by_path[path]
        body, query = None, []
        for argument in function.args.args:
            if argument.arg in ("request", "raw_request"):
                continue
            default_index = function.args.args.index(argument) - (len(function.args.args) - len(function.args.defaults))
            default = function.args.defaults[default_index] if default_index >= 0 else None
            if isinstance(default, ast.Call) and getattr(default.func, "id", None) == "Query":
                query.append(argument.arg)
            else:
                body = _body_class(argument.annotation)
        out[path] = {"handler": function.name, "methods": sorted(methods), "body": body, "query": query}
    responses = {
        "/update_weights_from_disk": _dict_keys(functions["update_weights_from_disk"], "content"),
        "/update_weights_from_tensor": _dict_keys(functions["update_weights_from_tensor"], "content"),
        "model_info": _dict_keys(functions["model_info"], "result"),
        "server_info": [k for k in _server_info_keys(functions["server_info"])],
    }
    return out, responses


def _server_info_keys(function) -> list[str]:
    """/server_info's own keys beside ServerArgs' fields (the dict literal after **build_server_info)."""
    for node in ast.walk(function):
        if isinstance(node, ast.Dict) and None in node.keys:   # {**build_server_info(...), "key": ...}
            return [k.value for k in node.keys if isinstance(k, ast.Constant)]
    raise KeyError("server_info")


def server_args(source: Source) -> dict:
    """{ServerArgs field: its flag, or None where it has none (no_cli)} from arg_groups/fields/*.py."""
    out = {}
    for name in sorted(n for n in source.names() if re.fullmatch(r"sglang/srt/arg_groups/fields/\w+\.py", n)):
        for cls in (c for c in source.tree(name).body if isinstance(c, ast.ClassDef)):
            for node in cls.body:
                if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                    continue
                flag = "--" + node.target.id.replace("_", "-")
                for call in ast.walk(node.annotation):
                    if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "Arg":
                        options = {k.arg: k.value for k in call.keywords}
                        if "no_cli" in options and ast.literal_eval(options["no_cli"]):
                            flag = None
                        elif "cli_name" in options:
                            flag = ast.literal_eval(options["cli_name"])
                out[node.target.id] = flag
    return out


def safe_unpickler_globals(source: Source) -> list[str]:
    tree = source.tree("sglang/srt/utils/common.py")
    cls = _class(tree, "SafeUnpickler")
    for node in cls.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "ALLOWED_GLOBALS":
            return sorted(f"{module}:{name}" for module, name in ast.literal_eval(node.value))
    raise KeyError("ALLOWED_GLOBALS")


def safe_unpickler_redirects(source: Source) -> dict:
    """The globals SafeUnpickler.find_class answers with a function of its own instead:
    {"module:name": the function's name} (`if (module, name) == (...): return function`)."""
    cls = _class(source.tree("sglang/srt/utils/common.py"), "SafeUnpickler")
    find_class = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "find_class")
    out = {}
    for node in ast.walk(find_class):
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and isinstance(node.test.ops[0], ast.Eq)
                and isinstance(node.body[-1], ast.Return) and isinstance(node.body[-1].value, ast.Name)):
            module, name = ast.literal_eval(node.test.comparators[0])
            out[f"{module}:{name}"] = node.body[-1].value.id
    return out


def serializer(source: Source) -> dict:
    """How MultiprocessingSerializer.serialize writes: the pickler it calls and the base64 step."""
    cls = _class(source.tree("sglang/srt/utils/common.py"), "MultiprocessingSerializer")
    serialize = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "serialize")
    calls = {ast.unparse(n.func) for n in ast.walk(serialize) if isinstance(n, ast.Call)}
    return {"pickler": "ForkingPickler" if any(c.startswith("ForkingPickler") for c in calls) else sorted(calls),
            "base64": any(c.endswith("b64encode") for c in calls)}


def memory_tags(source: Source) -> dict:
    tree = source.tree("sglang/srt/constants.py")
    return {t.id: ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
            for t in n.targets if getattr(t, "id", "").startswith("GPU_MEMORY_TYPE_")}


def environment_variables(source: Source) -> dict:
    """Where each environment variable the engine sets or clears is read."""
    found = {}
    for name, variable in (("sglang/srt/layers/sampler.py", "SGLANG_RETURN_ORIGINAL_LOGPROB"),
                           ("sglang/srt/utils/common.py", "SGLANG_USE_CPU_ENGINE")):
        if f'"{variable}"' in source.text(name):
            found[variable] = name
    return found


def freeze(where: str) -> dict:
    source = Source(where)
    paths, answered = routes(source)
    return {"sglang_version": source.version, "requests": requests(source), "contract": contract(source),
            "routes": paths, "responses": answered, "server_args": server_args(source),
            "launch_server": "sglang/launch_server.py" in source.names(),
            "safe_unpickler_globals": safe_unpickler_globals(source),
            "safe_unpickler_redirects": safe_unpickler_redirects(source), "serializer": serializer(source),
            "memory_tags": memory_tags(source), "environment_variables": environment_variables(source)}


if __name__ == "__main__":
    json.dump(freeze(sys.argv[1]), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
