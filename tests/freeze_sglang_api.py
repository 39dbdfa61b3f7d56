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
  engine sets or clears;
- protocol: the state the server keeps across the engine's calls, each rule with the file and
  line it is read from: which weight-update calls need an open weight-update session (and the
  message of each refusal), the HTTP status a failed one answers with, how SGLang's own HTTP
  client opens and closes one; what release and resume of memory require (an idle server, a tag
  released before it is resumed) and what a broken requirement does (the scheduler's exception
  ends the server); where a completion ends (the model's EOS ids, the tokenizer's, the
  sampling's stop ids, SGLang's extra stop tokens).

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
RESPONSES = ("UpdateWeightFromDiskReqOutput", "UpdateWeightsFromTensorReqOutput", "BeginWeightUpdateReqOutput",
             "EndWeightUpdateReqOutput")
EXTRA_REQUESTS = ("FlushCacheReqInput",)   # /flush_cache's internal request (the route takes ?timeout=)
WEIGHT_UPDATER = "sglang/srt/managers/scheduler_components/weight_updater.py"
HTTP_CLIENT = "sglang/srt/entrypoints/http_server_engine.py"
SCHEDULER = "sglang/srt/managers/scheduler.py"
MODEL_CONFIG = "sglang/srt/configs/model_config.py"
SCHEDULE_BATCH = "sglang/srt/managers/schedule_batch.py"
TOKENIZER_COMMON = "sglang/srt/utils/hf_transformers/common.py"
RUNNER_UPDATER = "sglang/srt/model_executor/model_runner_components/weight_updater.py"
# The scheduler's handlers of the routes the engine uses (SchedulerWeightUpdaterManager's methods).
SESSION_CALLS = ("begin_weight_update", "end_weight_update", "update_weights_from_tensor", "update_weights_from_disk",
                 "release_memory_occupation", "resume_memory_occupation")


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
        "/begin_weight_update": _dict_keys(functions["begin_weight_update"], None),
        "/end_weight_update": _dict_keys(functions["end_weight_update"], None),
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


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    return next(n for n in _class(tree, cls).body if isinstance(n, ast.FunctionDef) and n.name == name)


def _function(tree: ast.Module, name: str):
    return next(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name)


def _session_guard(function) -> dict:
    """`if self._session is None / is not None: return X(success=False, message=...)`: when the call
    is refused, with what message, at which line; {"refused_when": None} for a call without one."""
    for node in ast.walk(function):
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and ast.unparse(node.test.left) == "self._session"
                and isinstance(node.test.comparators[0], ast.Constant) and node.test.comparators[0].value is None):
            continue
        answer = node.body[-1].value
        keywords = {k.arg: k.value for k in answer.keywords}
        return {"refused_when": "no session is open" if isinstance(node.test.ops[0], ast.Is) else "a session is open",
                "success": ast.literal_eval(keywords["success"]), "message": ast.literal_eval(keywords["message"]),
                "line": node.lineno}
    return {"refused_when": None}


def _calls(function, text: str) -> list[int]:
    """The lines of the calls in `function` whose callee reads `text` (ast.unparse)."""
    return [n.lineno for n in ast.walk(function) if isinstance(n, ast.Call) and ast.unparse(n.func) == text]


def protocol(source: Source) -> dict:
    """The state the server keeps across the engine's calls (see the module docstring)."""
    updater = source.tree(WEIGHT_UPDATER)
    manager = "SchedulerWeightUpdaterManager"
    session = {"defined_in": f"{WEIGHT_UPDATER}:{manager}"}
    for name in SESSION_CALLS:
        session[name] = _session_guard(_method(updater, manager, name))
    server = source.tree(HTTP_SERVER)
    failure_status = {}
    for route in ("/begin_weight_update", "/end_weight_update", "/update_weights_from_tensor",
                  "/update_weights_from_disk"):
        function = _function(server, route.strip("/"))
        statuses = {ast.unparse(n) for n in ast.walk(function) if isinstance(n, ast.Attribute)
                    and getattr(n.value, "id", None) == "HTTPStatus"}
        failure_status[route] = 400 if "HTTPStatus.BAD_REQUEST" in statuses else sorted(statuses)
    adapter = source.tree(HTTP_CLIENT)
    client = {"defined_in": f"{HTTP_CLIENT}:HttpServerEngineAdapter"}
    for name in ("begin_weight_update", "end_weight_update", "update_weights_from_tensor"):
        method = _method(adapter, "HttpServerEngineAdapter", name)
        call = next(n for n in ast.walk(method) if isinstance(n, ast.Call) and ast.unparse(n.func) == "self._make_request")
        body = call.args[1] if len(call.args) > 1 else None
        client[name] = {"route": "/" + ast.literal_eval(call.args[0]), "line": call.lineno,
                        "body": [k.value for k in body.keys] if isinstance(body, ast.Dict) else None}
    make_request = _method(adapter, "HttpServerEngineAdapter", "_make_request")
    client["no_body_sent_as"] = "{}" if "payload or {}" in ast.unparse(make_request) else None
    release = _method(updater, manager, "release_memory_occupation")
    resume = _method(updater, manager, "resume_memory_occupation")
    idle = next(n for n in ast.walk(release) if isinstance(n, ast.Assert) and "is_fully_idle" in ast.unparse(n.test))
    no_tags = [ast.unparse(n.body[0].value) for n in ast.walk(release) if isinstance(n, ast.If)
               and ast.unparse(n.test) == "tags is None or len(tags) == 0"]
    scheduler = _function(source.tree(SCHEDULER), "run_scheduler_process")
    handler = next(h for h in ast.walk(scheduler) if isinstance(h, ast.ExceptHandler)
                   and "SIGQUIT" in ast.unparse(h))
    memory = {
        "defined_in": f"{WEIGHT_UPDATER}:{manager}",
        "release_requires_idle": {"message": ast.literal_eval(idle.msg), "line": idle.lineno},
        "no_tags_means": no_tags[0] if no_tags else None,
        "release_records_tags": _calls(release, "self.offload_tags.add"),
        "resume_removes_each_tag": _calls(resume, "self.offload_tags.remove"),   # KeyError where not released
        "memory_saver_checked": "enable_memory_saver" in ast.unparse(release) + ast.unparse(resume),
        "scheduler_exception_ends_the_server": {"defined_in": f"{SCHEDULER}:run_scheduler_process",
                                                "line": handler.lineno,
                                                "signals_parent": "SIGQUIT" in ast.unparse(handler)},
    }
    config = _method(source.tree(MODEL_CONFIG), "ModelConfig", "_get_hf_eos_token_id")
    read = sorted({ast.unparse(n.args[0]).removeprefix("self.") for n in ast.walk(config) if isinstance(n, ast.Call)
                   and ast.unparse(n.func) == "getattr" and ast.literal_eval(n.args[1]) == "eos_token_id"})
    finish = _method(source.tree(SCHEDULE_BATCH), "Req", "_check_token_based_finish")
    checked = [ast.unparse(n.comparators[0]).removeprefix("self.") for n in ast.walk(finish)
               if isinstance(n, ast.Compare) and ast.unparse(n.left) == "token_id"]
    texts = next(n.value for n in source.tree(TOKENIZER_COMMON).body if isinstance(n, ast.Assign)
                 and getattr(n.targets[0], "id", None) == "_ADDITIONAL_STOP_TOKEN_TEXTS")
    stops = {"model_eos": {"defined_in": f"{MODEL_CONFIG}:ModelConfig._get_hf_eos_token_id", "line": config.lineno,
                           "reads": read},
             "finish": {"defined_in": f"{SCHEDULE_BATCH}:Req._check_token_based_finish", "line": finish.lineno,
                        "token_in": checked, "ignore_eos_first": ast.unparse(finish.body[0].test)
                        == "self.sampling_params.ignore_eos"},
             "additional_stop_token_texts": {"defined_in": f"{TOKENIZER_COMMON}:_ADDITIONAL_STOP_TOKEN_TEXTS",
                                             "line": texts.lineno, "texts": list(ast.literal_eval(texts))}}
    runner = source.tree(RUNNER_UPDATER)
    prepared = {}
    for name in ("update_weights_from_disk", "begin_weight_update", "end_weight_update", "update_weights_from_tensor"):
        method = _method(runner, "WeightUpdater", name)
        calls = sorted({ast.unparse(n.func).rsplit(".", 1)[-1] for n in ast.walk(method) if isinstance(n, ast.Call)}
                       & {"restore_weights_before_loading", "load_weights_and_postprocess", "postprocess_weights"})
        prepared[name] = {"line": method.lineno, "calls": calls}
    # The model's weights are made loadable (restored) and finished (post-processed) inside a disk
    # update; a tensor update does neither: begin and end do it around it.
    session["runner"] = {"defined_in": f"{RUNNER_UPDATER}:WeightUpdater", **prepared}
    return {"weight_update_session": session, "failure_status": failure_status, "client": client,
            "memory": memory, "stops": stops}


def freeze(where: str) -> dict:
    source = Source(where)
    paths, answered = routes(source)
    return {"sglang_version": source.version, "requests": requests(source), "contract": contract(source),
            "routes": paths, "responses": answered, "server_args": server_args(source),
            "launch_server": "sglang/launch_server.py" in source.names(),
            "safe_unpickler_globals": safe_unpickler_globals(source),
            "safe_unpickler_redirects": safe_unpickler_redirects(source), "serializer": serializer(source),
            "memory_tags": memory_tags(source), "environment_variables": environment_variables(source),
            "protocol": protocol(source)}


if __name__ == "__main__":
    json.dump(freeze(sys.argv[1]), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
