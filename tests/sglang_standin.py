"""A stand-in SGLang 0.5.23 server for the tests: a real HTTP server (the standard library's, in a
thread, or in a process of its own through tests/fake_sglang's `python -m sglang.launch_server`)
that speaks the native API grpo_edu/sampling/sglang_engine.py uses, in SGLang's shapes, and
samples with the committed tiny policy (transformers, float32) so that its log-probs are real.

Every request is checked against SGLang's own source, frozen in tests/sglang_api_0.5.23.json
(tests/freeze_sglang_api.py): the route and its methods; the body's fields against the io_struct
request class the route parses (GenerateReqInput, UpdateWeightFromDiskReqInput, ...), its
required fields (FastAPI's 422 where one is missing); sampling_params' keys against SGLang's API
contract, which refuses an unknown key with a 400 and serde's text, as SGLang does. Stricter than
SGLang on one point, on purpose: an unknown top-level field is a 400 here, where SGLang 0.5.23
ignores it (the request structs' schema says extra_behavior "ignore"), because a field the
server ignores is a setting the engine believes it sent and did not.

What it models of SGLang's behaviour: per-request sampling_seed under deterministic inference
(a row's tokens depend on its seed alone; 42 where none is given, as SGLang's batch info does),
the server's own random state otherwise; output_ids ending with the stop token; log-probs of
softmax(logits / T) at the sampled token, as [logprob, token_id, text]; finish reasons; weight
versions; updates from a safetensors folder and from serialized tensors (SGLang's SafeUnpickler
allowlist, frozen, enforced). And the state SGLang keeps across calls, each rule read from the
source into the frozen file's "protocol" (tests/test_sglang_engine.py holds each):

- the weight-update session: /update_weights_from_tensor outside one, a second
  /begin_weight_update, an /end_weight_update with none open are each refused with SGLang's own
  answer (HTTP 400, success false, SGLang's message); /update_weights_from_disk needs none;
- memory: /release_memory_occupation records its tags (none: all), whether or not the server
  runs with --enable-memory-saver; /resume_memory_occupation of a tag not released, or a release
  while a /generate is running, raises in SGLang's scheduler, whose handler ends the whole server:
  here too the connection drops and the server is gone (a launched one exits, killed as SGLang
  kills itself, with "Scheduler hit an exception" in its log);
- stops: the model's EOS ids read from its config.json and generation_config.json, the
  tokenizer's EOS, the tokenizer's added tokens among SGLang's extra stop texts, and the
  request's stop_token_ids.

Stricter than SGLang on purpose (SGLang has no check, and would read memory it freed): a
/generate, or a weight update, while the weights or the KV cache are released is a 400 here.
Faults for the error tests: an HTTP 500, a body that is not JSON, a slow answer, a dropped
connection.
"""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import signal
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

FROZEN = json.loads((Path(__file__).resolve().parent / "sglang_api_0.5.23.json").read_text())
TOP_K_ALL = 1 << 30   # SGLang's "no top-k" (what its contract decodes an absent top_k to)


class Refused(Exception):
    def __init__(self, status: int, body):
        super().__init__(str(body))
        self.status, self.body = status, body


class Crashed(Exception):
    """SGLang's scheduler raised: its handler ends the server (the request gets no answer)."""


def _error(status: int, message: str) -> Refused:
    return Refused(status, {"error": {"message": message}})


def check_fields(body, request_class: str) -> None:
    """The body's keys against the frozen request class: required ones present, no unknown one."""
    spec = FROZEN["requests"][request_class]
    if not isinstance(body, dict):
        raise Refused(422, {"detail": [{"type": "model_attributes_type", "loc": ["body"],
                                        "msg": f"Input should be a valid dictionary or object to extract fields from"}]})
    missing = [f for f in spec["required"] if f not in body]
    if missing:
        raise Refused(422, {"detail": [{"type": "missing", "loc": ["body", f], "msg": "Field required"} for f in missing]})
    unknown = sorted(set(body) - set(spec["fields"]))
    if unknown:
        raise _error(400, f"the stand-in refuses field(s) {unknown} that SGLang {FROZEN['sglang_version']}'s "
                          f"{request_class} does not have (SGLang itself would ignore them silently)")


def check_sampling_params(params) -> None:
    """SGLang's API contract (api_types.SamplingParams): unknown keys rejected, with serde's text."""
    if not isinstance(params, dict):
        raise _error(400, f"invalid type: {type(params).__name__}, expected struct SamplingParams")
    fields = FROZEN["contract"]["SamplingParams"]["fields"]
    for key in params:
        if key not in fields:
            listed = ", ".join(f"`{f}`" for f in fields)
            raise Refused(400, {"error": f"unknown field `{key}`, expected one of {listed}"})


def _ints(value, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise Refused(422, {"detail": [{"loc": ["body", what], "msg": "Input should be a list of integers"}]})
    return value


def _safe_load_torch_storage(data: bytes):
    """SGLang's answer to torch.storage._load_from_bytes: torch.load with weights_only, a storage or nothing."""
    storage = torch.load(io.BytesIO(data), weights_only=True)
    if not isinstance(storage, (torch.storage.TypedStorage, torch.UntypedStorage)):
        raise pickle.UnpicklingError(f"Expected a Torch storage, got {type(storage).__name__}")
    return storage


class SafeUnpickler(pickle.Unpickler):
    """SGLang's SafeUnpickler: only the frozen allowlist's globals, and its own storage loader."""

    ALLOWED = {tuple(entry.split(":", 1)) for entry in FROZEN["safe_unpickler_globals"]}
    REDIRECTS = {tuple(entry.split(":", 1)): globals()[function]
                 for entry, function in FROZEN["safe_unpickler_redirects"].items()}

    def find_class(self, module, name):
        if (module, name) in self.REDIRECTS:
            return self.REDIRECTS[(module, name)]
        if (module, name) not in self.ALLOWED:
            raise RuntimeError(f"Blocked unsafe global ({module}.{name}) during pickle deserialization")
        return super().find_class(module, name)


class StandIn:
    """The server. `url` once built; `calls`: (method, route, body) of every request; close() stops it."""

    def __init__(self, model_dir=None, *, deterministic: bool = True, memory_saver: bool = True,
                 random_seed: int = 0, tp_size: int = 1, port: int = 0, starting_seconds: float = 0.0,
                 ignore_seeds: bool = False,
                 call_log: str | None = None, serve: bool = True):
        from grpo_edu.policy.models import STARTING_POLICY, load_policy
        self.model_dir = str(model_dir or STARTING_POLICY)
        self.model, self.tokenizer = load_policy(self.model_dir)
        self.deterministic, self.memory_saver, self.tp_size = deterministic, memory_saver, tp_size
        self.random_seed = random_seed
        self.ignore_seeds = ignore_seeds   # a fault: says it is deterministic, samples from its own random state
        self.rng = torch.Generator().manual_seed(random_seed)
        self.weight_version = "default"
        self.offloaded: set[str] = set()   # SGLang's offload_tags
        self.session: str | None = None     # the open weight-update session's selector
        self.generating = 0                 # /generate requests being answered
        self.crashed: str | None = None     # the scheduler's exception that ended the server
        self.counting = threading.Lock()
        self.calls: list[tuple[str, str, object]] = []
        self.call_log = call_log
        self.faults: dict[str, list[str]] = {}
        self.ready_at = time.monotonic() + starting_seconds
        self.closed = False
        self.lock = threading.Lock()
        self.eos = self._stops()
        self.server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = None
        if serve:
            self.thread = threading.Thread(target=self.server.serve_forever, name="sglang stand-in", daemon=True)
            self.thread.start()

    def _stops(self) -> set[int]:
        """What SGLang stops at besides the request's stop_token_ids (the frozen protocol's "stops"):
        the eos_token_id of the model's config.json and generation_config.json, the tokenizer's
        EOS and its added tokens among SGLang's extra stop texts."""
        rule = FROZEN["protocol"]["stops"]
        files = {"hf_config": "config.json", "hf_generation_config": "generation_config.json"}
        found = set()
        for source in rule["model_eos"]["reads"]:
            path = Path(self.model_dir) / files[source]
            value = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
            found |= set([] if value is None else [value] if isinstance(value, int) else value)
        added = self.tokenizer.get_added_vocab()
        extra = {added[t] for t in rule["additional_stop_token_texts"]["texts"] if t in added}
        return found | {self.tokenizer.eos_token_id} | extra

    def close(self) -> None:
        self.closed = True
        self.server.shutdown()
        self.server.server_close()

    def crash(self, error: str) -> None:
        """The scheduler raised `error`: SGLang's handler signals the server, which kills its whole
        process tree. In a process of its own: the log's line, then SIGKILL, as SGLang's
        kill_process_tree does to itself; in a thread: no more answers, the port closed."""
        self.crashed = error
        if self.thread is None:
            print(f"Scheduler hit an exception: {error}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        self.server.shutdown()   # from a request's thread: the serving loop ends within its 0.5 s poll
        self.server.server_close()
        raise Crashed(error)

    def fault(self, route: str, kind: str, times: int = 1) -> None:
        """The next `times` requests to `route` fail: 'http500', 'not_json', 'slow:SECONDS' or 'drop'."""
        self.faults.setdefault(route, []).extend([kind] * times)

    def record(self, method: str, route: str, body) -> None:
        if route == "/update_weights_from_tensor" and isinstance(body, dict):
            body = {**body, "serialized_named_tensors": [len(p) for p in body.get("serialized_named_tensors") or []]}
        self.calls.append((method, route, body))
        if self.call_log:
            with open(self.call_log, "a") as log:
                log.write(json.dumps([method, route, body]) + "\n")

    # ------------------------------------------------------------------ routes
    def answer(self, method: str, route: str, query: dict, body):
        """(status, JSON-able body or text) for one request."""
        spec = FROZEN["routes"].get(route)
        if spec is None:
            raise Refused(404, {"detail": "Not Found"})
        if method not in spec["methods"]:
            raise Refused(405, {"detail": "Method Not Allowed"})
        unknown = set(query) - set(spec["query"])
        if unknown:
            raise _error(400, f"the stand-in refuses query parameter(s) {sorted(unknown)} of {route}")
        if spec["body"] is not None:
            check_fields(body, spec["body"])
        elif body is not None:
            raise _error(400, f"{route} takes no body")
        if route in ("/health", "/health_generate"):
            return (503, "") if time.monotonic() < self.ready_at else (200, "")
        handler = getattr(self, "route_" + route.strip("/"))
        if route == "/release_memory_occupation" and self.generating:   # SGLang's scheduler asserts it is idle
            self.crash(f"AssertionError: {FROZEN['protocol']['memory']['release_requires_idle']['message']}")
        with self.counting:
            self.generating += route == "/generate"
        try:
            with self.lock:
                return handler(body if body is not None else query)
        finally:
            with self.counting:
                self.generating -= route == "/generate"

    def route_model_info(self, _):
        values = {"model_path": self.model_dir, "served_model_name": self.model_dir, "tokenizer_path": self.model_dir,
                  "is_generation": True, "preferred_sampling_params": None, "weight_version": self.weight_version,
                  "load_format": "auto", "reasoning_parser": None, "tool_call_parser": None,
                  "disaggregation_mode": "null", "has_image_understanding": False, "has_audio_understanding": False,
                  "model_type": self.model.config.model_type, "architectures": self.model.config.architectures}
        return 200, {key: values[key] for key in FROZEN["responses"]["model_info"]}

    route_get_model_info = route_model_info

    def route_server_info(self, _):
        arguments = {"model_path": self.model_dir, "tp_size": self.tp_size, "random_seed": self.random_seed,
                     "enable_deterministic_inference": self.deterministic, "enable_memory_saver": self.memory_saver,
                     "weight_version": "default", "device": "cpu", "dtype": "float32"}
        own = {"startup_time": 0.0, "internal_states": [], "version": FROZEN["sglang_version"], "frontend": "python"}
        return 200, {**arguments, **own}

    def route_flush_cache(self, query):
        if "timeout" in query and not float(query["timeout"][0]) >= 0:
            raise Refused(422, {"detail": [{"loc": ["query", "timeout"], "msg": "Input should be >= 0"}]})
        return 200, "Cache flushed.\nPlease check backend logs for more details. (When there are running or " \
                    "waiting requests, the operation will not be performed.)\n"

    def _tags(self, body) -> list[str]:
        tags = body.get("tags")
        if tags is not None and (not isinstance(tags, list) or not set(tags) <= set(FROZEN["memory_tags"].values())):
            raise _error(400, f"tags must be a list of {sorted(FROZEN['memory_tags'].values())}, got {tags!r}")
        return tags or list(FROZEN["memory_tags"].values())

    def route_release_memory_occupation(self, body):
        """SGLang records the tags (none: all), with or without --enable-memory-saver (which only
        decides whether memory is really freed); a tag released twice stays released."""
        self.offloaded |= set(self._tags(body))
        return 200, None

    def route_resume_memory_occupation(self, body):
        """SGLang removes each tag from its released set: a tag not released is a KeyError in its
        scheduler, which ends the server."""
        tags = self._tags(body)
        for tag in tags:
            if tag not in self.offloaded:
                self.crash(f"KeyError: {tag!r}")
            self.offloaded.discard(tag)
        return 200, None

    def _session_refusal(self, call: str):
        """SGLang's answer where the session's state refuses `call`, else None."""
        rule = FROZEN["protocol"]["weight_update_session"][call]
        refused = {"no session is open": self.session is None, "a session is open": self.session is not None,
                   None: False}[rule["refused_when"]]
        return (FROZEN["protocol"]["failure_status"][f"/{call}"], {"success": rule["success"],
                                                                   "message": rule["message"]}) if refused else None

    def route_begin_weight_update(self, body):
        if refusal := self._session_refusal("begin_weight_update"):
            return refusal
        self.session = body.get("selector", "all")
        return 200, {"success": True, "message": "Success"}

    def route_end_weight_update(self, body):
        if refusal := self._session_refusal("end_weight_update"):
            return refusal
        self.session = None
        return 200, {"success": True, "message": "Success"}

    def _load(self, named, body, route):
        if "weights" in self.offloaded and self.memory_saver:   # the stand-in's own rule (module docstring)
            raise _error(400, f"{route}: the weights are released (resume_memory_occupation first)")
        if body.get("load_format") is not None:
            raise _error(400, f"the stand-in loads the default format only, got load_format {body['load_format']!r}")
        parameters = dict(self.model.named_parameters())
        try:
            for name, tensor in named:
                if name not in parameters or parameters[name].shape != tensor.shape:
                    raise KeyError(f"{name} {tuple(tensor.shape)} is not a parameter of the served model")
            with torch.no_grad():
                for name, tensor in named:
                    parameters[name].copy_(tensor.to(parameters[name].dtype))
        except KeyError as error:
            return 400, {"success": False, "message": f"Failed to update weights: {error}."}
        message = "Succeeded to update model weights."
        if body.get("weight_version") is not None:
            self.weight_version = body["weight_version"]
            message += f" Weight version updated to {body['weight_version']}."
        return 200, {"success": True, "message": message}

    def route_update_weights_from_disk(self, body):
        from safetensors.torch import load_file
        if refusal := self._session_refusal("update_weights_from_disk"):
            return refusal
        folder = Path(str(body["model_path"]))
        files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
        if not files:
            return 400, {"success": False, "message": f"Failed to get weights iterator: no safetensors files in "
                                                      f"{folder}.", "num_paused_requests": 0}
        named = [item for path in files for item in load_file(str(path)).items()]
        status, answer = self._load(named, body, "/update_weights_from_disk")
        return status, {**answer, "num_paused_requests": 0}

    def route_update_weights_from_tensor(self, body):
        if refusal := self._session_refusal("update_weights_from_tensor"):
            return refusal
        payloads = body["serialized_named_tensors"]
        if not isinstance(payloads, list) or len(payloads) < self.tp_size or not all(isinstance(p, str) for p in payloads):
            raise _error(400, f"serialized_named_tensors: one base64 payload per tensor-parallel rank "
                              f"({self.tp_size}) expected")
        ranks = []
        for payload in payloads[:self.tp_size]:   # each rank deserialises its own
            try:
                named = SafeUnpickler(io.BytesIO(base64.b64decode(payload, validate=True))).load()
            except Exception as error:   # in SGLang the scheduler's failure, answered as the update's
                return 400, {"success": False, "message": f"Failed to update weights: {error}."}
            if not (isinstance(named, list) and all(isinstance(n, tuple) and len(n) == 2 and isinstance(n[0], str)
                                                     and isinstance(n[1], torch.Tensor) for n in named)):
                raise _error(400, "serialized_named_tensors must hold a list of (name, tensor)")
            ranks.append(named)
        return self._load(ranks[0], body, "/update_weights_from_tensor")

    def route_generate(self, body):
        inputs = body.get("input_ids")
        if body.get("text") is not None or not isinstance(inputs, list) or not inputs:
            raise _error(400, "the stand-in takes input_ids only (a list of token ids, or a list of them)")
        single = not isinstance(inputs[0], list)
        rows = [_ints(inputs, "input_ids")] if single else [_ints(row, "input_ids") for row in inputs]
        params = body.get("sampling_params") or {}
        params = [params] * len(rows) if isinstance(params, dict) else params
        if not isinstance(params, list) or len(params) != len(rows):
            raise _error(400, "The length of sampling_params should be equal to the batch size.")
        for p in params:
            check_sampling_params(p)
        rids = body.get("rid")
        rids = [uuid.uuid4().hex for _ in rows] if rids is None else [rids] if single else rids
        if not isinstance(rids, list) or len(rids) != len(rows):
            raise _error(400, "The rid should be a list of the batch size for batch processing.")
        if {"weights", "kv_cache"} & self.offloaded and self.memory_saver:   # the stand-in's own rule
            raise _error(400, f"generate while {sorted(self.offloaded)} are released")
        out = [self._sample(row, p, rid, bool(body.get("return_logprob"))) for row, p, rid in zip(rows, params, rids)]
        return 200, out[0] if single else out

    @torch.no_grad()
    def _sample(self, prompt: list[int], params: dict, rid: str, logprobs: bool) -> dict:
        if params.get("n", 1) != 1 or params.get("top_p", 1.0) != 1.0 or params.get("min_p", 0.0) != 0.0 \
                or params.get("top_k", -1) not in (-1, TOP_K_ALL):
            raise _error(400, f"the stand-in samples n = 1 rows from the whole softmax only, got {params}")
        T = params.get("temperature", 1.0)
        stops = self.eos | set(params.get("stop_token_ids") or [])
        if self.deterministic and not self.ignore_seeds:
            seed = params.get("sampling_seed")
            generator = torch.Generator().manual_seed((42 if seed is None else seed) % (1 << 63))
        else:
            generator = self.rng
        started = time.monotonic()
        out = self.model(input_ids=torch.tensor([prompt]), use_cache=True)
        tokens, entries, finish = [], [], None
        for _ in range(params.get("max_new_tokens", 128)):
            logits = out.logits[0, -1].float()
            logp = torch.log_softmax(logits / T, dim=-1) if T > 0 else torch.log_softmax(logits, dim=-1)
            token = int(logp.argmax()) if T == 0 else int(torch.multinomial(logp.exp(), 1, generator=generator))
            tokens.append(token)
            entries.append([float(logp[token]), token, None])
            if token in stops:
                finish = {"type": "stop", "matched": token}
                break
            out = self.model(input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
        meta = {"id": rid, "finish_reason": finish or {"type": "length", "length": len(tokens)},
                "prompt_tokens": len(prompt), "weight_version": self.weight_version, "completion_tokens": len(tokens),
                "cached_tokens": 0, "reasoning_tokens": 0, "e2e_latency": time.monotonic() - started}
        if logprobs:
            meta["output_token_logprobs"] = entries
        return {"text": self.tokenizer.decode(tokens, skip_special_tokens=True), "output_ids": tokens, "meta_info": meta}


def _handler(standin: StandIn):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):   # quiet
            pass

        def _serve(self, method: str):
            parts = urllib.parse.urlsplit(self.path)
            route, query = parts.path, urllib.parse.parse_qs(parts.query)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except json.JSONDecodeError:
                return self._send(422, {"detail": [{"type": "json_invalid", "loc": ["body"], "msg": "JSON decode error"}]})
            standin.record(method, route, body)
            if standin.crashed:   # the server is gone: nothing answers
                self.close_connection = True
                return
            fault = standin.faults.get(route, []).pop(0) if standin.faults.get(route) else None
            if fault == "drop":
                self.close_connection = True
                return
            if fault and fault.startswith("slow:"):
                time.sleep(float(fault.split(":")[1]))
                if standin.closed:   # the test is over: no work in a thread the interpreter may be leaving
                    return
            if fault == "http500":
                return self._send(500, {"error": {"message": "Internal Server Error (injected)"}})
            if fault == "not_json":
                return self._send(200, "<html>not json</html>")
            try:
                status, answer = standin.answer(method, route, query, body)
            except Refused as refused:
                status, answer = refused.status, refused.body
            except Crashed:
                self.close_connection = True
                return
            except Exception as error:   # a stand-in bug: answered, never a dropped connection
                status, answer = 500, {"error": {"message": f"{type(error).__name__}: {error}"}}
            if standin.crashed:   # the server ended while this request ran: it gets no answer either
                self.close_connection = True
                return
            self._send(status, answer)

        def _send(self, status: int, answer):
            data = answer.encode() if isinstance(answer, str) else json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if isinstance(answer, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._serve("GET")

        def do_POST(self):
            self._serve("POST")

        def do_PUT(self):
            self._serve("PUT")
    return Handler
