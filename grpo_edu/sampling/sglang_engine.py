"""engine = "sglang": an SGLang server samples the rollouts. Every line that talks to SGLang is here.

Written for sglang==0.5.23 and its native HTTP API, never its Python package: the trainer needs no
sglang installed (it pins torch 2.14.1 and transformers 5.19.0, other releases than ours). What
this module sends and reads is listed below (ROUTES, SAMPLING_FIELDS, READ, LAUNCH_FLAGS);
tests/test_sglang_engine.py checks every name against 0.5.23's own source (frozen from the
released wheel in tests/sglang_api_0.5.23.json by tests/freeze_sglang_api.py), and the tests'
stand-in server (tests/sglang_standin.py) accepts exactly those fields.

One server for the whole run: the config names its URL (sglang_url), or rank 0 starts
`python -m sglang.launch_server` on sglang_device, waits for /health_generate and stops it when
the process exits. Before every rollout rank 0 puts the trainer's weights into the server (every
rank takes part in FSDP2's gathers), flushes its prefix cache, and all ranks wait; then each rank
sends its own prompts. A rollout is one /generate request: B x G rows of token ids (prompt-major:
row b * G + g), each with its own sampling_seed. SGLang's deterministic inference
(--enable-deterministic-inference, sglang_deterministic) makes a row's tokens depend on its seed
alone, not on the rest of the batch, so 2 processes sample what 1 does. (Not rank 0 gathering
every prompt and broadcasting the completions: a multi-turn episode asks once per turn, and ranks
run different numbers of turns, so a collective inside generate would wait forever.)

The weights reach the server in one of two ways (sglang_weight_sync), each tagged with a
weight_version that every /generate answer must carry back:

    disk    a safetensors folder in the run directory, then /update_weights_from_disk: any server
            that reads the trainer's file system. One call: SGLang restores the model's weights
            for loading and post-processes them inside it.
    tensor  /begin_weight_update, one /update_weights_from_tensor per chunk, /end_weight_update:
            SGLang 0.5.23 takes tensors only inside a weight-update session (it refuses them
            outside one, and refuses a second session or closing none), as its own HTTP client
            sends them. The tensors in SGLang's MultiprocessingSerializer format, rebuilt here
            (multiprocessing's ForkingPickler with torch's reductions, base64, one copy per
            tensor-parallel rank): CUDA tensors travel as CUDA IPC handles (the device named by
            its UUID, as SGLang's monkey_patch_torch_reductions does), CPU tensors by value in
            the request; the server copies them into its model. A server on this machine only.
            A failed update still closes the session.

Sleep (sglang_sleep, a server that shares the trainer's GPU): after a rollout, once every rank's
/generate has been answered (SGLang requires an idle server), the server releases its weights,
KV cache and CUDA graphs (/release_memory_occupation); before the next one it takes back the
weights, loads the trainer's, then the rest (/resume_memory_occupation). Each tag is resumed only
after it was released: SGLang's scheduler fails on any other, and the server ends.

Stops: every EOS id of the model's files (config.json's, generation_config.json's and the
tokenizer's: grpo_edu.policy.models.eos_token_ids, which SGLang stops at by itself) and the
sampling's stop tokens (a multi-turn environment's hand-over, one token), sent as stop_token_ids,
kept in the output. SGLang also stops at a few added tokens (EXTRA_STOP_TEXTS); a tokenizer that
has one the model's files do not name as EOS is refused. Never a stop string: SGLang matches one
in the decoded text, which can end a turn inside a longer token where the other engines go on.

Log-probs: meta_info's output_token_logprobs, SGLang's log softmax(logits / T) at the sampled
token, unless the server runs with SGLANG_RETURN_ORIGINAL_LOGPROB (a server started here never
does). Failures: every request has a timeout (sglang_timeout); a server that is absent, dies,
times out or answers badly raises SGLangServerError, one line that says which.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import copyreg
import dataclasses
import http.client
import io
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import torch

from grpo_edu.policy import lora
from grpo_edu.policy.models import eos_token_ids
from grpo_edu.runtime import distributed
from grpo_edu.runtime.precision import compute_dtype
from grpo_edu.sampling.rollout import Rollout, SamplingParams, Seeded, rollout_from_tokens
from grpo_edu.sampling.vllm_engine import sampler_model_path

SGLANG_VERSION = "0.5.23"

# route: (HTTP method, the request class of sglang/srt/managers/io_struct.py its body is, the fields sent)
ROUTES: dict[str, tuple[str, str | None, tuple[str, ...]]] = {
    "/generate": ("POST", "GenerateReqInput", ("rid", "input_ids", "sampling_params", "return_logprob")),
    "/update_weights_from_disk": ("POST", "UpdateWeightFromDiskReqInput",
                                  ("model_path", "flush_cache", "weight_version")),
    "/update_weights_from_tensor": ("POST", "UpdateWeightsFromTensorReqInput",
                                    ("serialized_named_tensors", "flush_cache", "weight_version")),
    "/begin_weight_update": ("POST", "BeginWeightUpdateReqInput", ("selector",)),   # a tensor sync's session
    "/end_weight_update": ("POST", "EndWeightUpdateReqInput", ()),
    "/flush_cache": ("POST", None, ()),   # no body (an optional ?timeout=, not sent)
    "/release_memory_occupation": ("POST", "ReleaseMemoryOccupationReqInput", ("tags",)),
    "/resume_memory_occupation": ("POST", "ResumeMemoryOccupationReqInput", ("tags",)),
    "/health_generate": ("GET", None, ()),   # 200 once a one-token generation ran (/health does not generate)
    "/model_info": ("GET", None, ()),        # /get_model_info is its deprecated alias in 0.5.23
    "/server_info": ("GET", None, ()),
}
# sampling_params' keys (SGLang's API contract, sglang/api/v1/api_types.py SamplingParams, refuses others)
SAMPLING_FIELDS = ("max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop_token_ids", "sampling_seed")
# What is read of the answers.
READ = {
    "GenerateResponse": ("output_ids", "meta_info"),
    "GenerateMetaInfo": ("id", "finish_reason", "output_token_logprobs", "weight_version"),
    "LogprobEntry": ("logprob", "token_id"),   # a positional array: [logprob, token_id, text]
    "model_info": ("architectures", "weight_version"),
    "server_info": ("version", "tp_size", "enable_deterministic_inference", "enable_memory_saver"),
    "UpdateWeightFromDiskReqOutput": ("success", "message"),
    "UpdateWeightsFromTensorReqOutput": ("success", "message"),
    "BeginWeightUpdateReqOutput": ("success", "message"),
    "EndWeightUpdateReqOutput": ("success", "message"),
}
# ServerArgs field: its flag, for the server started here
LAUNCH_FLAGS = {"model_path": "--model-path", "host": "--host", "port": "--port", "device": "--device",
                "dtype": "--dtype", "mem_fraction_static": "--mem-fraction-static", "random_seed": "--random-seed",
                "enable_memory_saver": "--enable-memory-saver",
                "enable_deterministic_inference": "--enable-deterministic-inference"}
MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")   # sglang/srt/constants.py GPU_MEMORY_TYPE_*
# Added tokens SGLang also stops at, whatever the request says (sglang/srt/utils/hf_transformers/common.py)
EXTRA_STOP_TEXTS = ("<|eom_id|>", "<|content_model_end_sampling|>", "<|ifm|im_end|>")
RAW_LOGPROBS_VARIABLE = "SGLANG_RETURN_ORIGINAL_LOGPROB"   # log-probs before the temperature: not what TIS needs
CPU_ENGINE_VARIABLE = "SGLANG_USE_CPU_ENGINE"   # SGLang's CPU backend runs only with it set to 1
TENSOR_REQUEST_BYTES = 1 << 30   # a tensor sync's request carries at most this much (the copies it holds)
DISK_SHARD_BYTES = 2 << 30       # a disk sync writes safetensors files of at most this much
ENDING_SECONDS = 5.0             # a started server whose connection broke: how long to wait for its exit


def warn(message: str) -> None:
    """One line on stderr."""
    print(f"grpo-edu: warning: {message}", file=sys.stderr, flush=True)


class SGLangServerError(RuntimeError):
    """The server is absent, died, timed out or answered badly: one line that says which
    (`detail`: what went wrong, without where)."""

    def __init__(self, message: str, detail: str = ""):
        super().__init__(message)
        self.detail = detail or message


@dataclasses.dataclass(frozen=True)
class Settings:
    """The config keys sglang_* (grpo_edu.sampling.engines.SGLangSettings), and what the trainer knows besides."""

    url: str = ""
    device: str = "cuda"
    mem_fraction_static: float = 0.3
    weight_sync: str = "disk"
    sleep: bool = False
    deterministic: bool = True
    timeout: float = 600.0
    start_timeout: float = 900.0
    dtype: str = "float32"      # the server's, and the synced weights' ('bfloat16' under bf16 precision)
    seed: int = 0
    output_dir: str = "."


def check_extra_stops(tokenizer, eos_ids: tuple[int, ...]) -> None:
    """SGLang also ends a completion at any of EXTRA_STOP_TEXTS the tokenizer has as an added
    token. One that is not among the model's EOS ids would end SGLang's completions where the
    other engines go on: refused, in one line."""
    added = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
    extra = {text: added[text] for text in EXTRA_STOP_TEXTS if text in added and added[text] not in eos_ids}
    if extra:
        raise ValueError(f"engine = 'sglang': SGLang {SGLANG_VERSION} also stops at the tokenizer's {extra}, which "
                         f"the model's files do not name as EOS (eos ids {list(eos_ids)}): the other engines would go "
                         f"on there; add it to eos_token_id in the model's generation_config.json")


# --------------------------------------------------------------------------- HTTP

def _excerpt(raw: bytes) -> str:
    """An error body's message, in one short line."""
    text = raw.decode(errors="replace").strip()
    try:
        body = json.loads(text)
        if isinstance(body, dict):
            error = body.get("error", body.get("message", body.get("detail", body)))
            text = str(error.get("message", error) if isinstance(error, dict) else error)
    except json.JSONDecodeError:
        pass
    text = " ".join(text.split())
    return text[:200] + ("..." if len(text) > 200 else "") or "(empty body)"


class Client:
    """Requests to one server, each with a timeout; every failure one SGLangServerError line."""

    def __init__(self, url: str, timeout: float, server: LaunchedServer | None = None):
        self.url, self.timeout, self.server = url.rstrip("/"), timeout, server
        # Straight to the server: an HTTP(S)_PROXY meant for the internet must not carry these requests.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def call(self, method: str, route: str, body=None, *, json_answer: bool = True, timeout: float | None = None):
        where = f"SGLang server at {self.url}: {method} {route}"
        data = None if body is None else json.dumps(body).encode()
        headers = {} if data is None else {"Content-Type": "application/json"}
        request = urllib.request.Request(self.url + route, data=data, method=method, headers=headers)
        wait = self.timeout if timeout is None else timeout
        key = "sglang_timeout" if timeout is None else "sglang_start_timeout"

        def failed(detail: str, hint: str = "") -> SGLangServerError:
            return SGLangServerError(f"{where}{' ' if detail.startswith('answered') else ': '}{detail}{hint}", detail)
        try:
            with self._opener.open(request, timeout=wait) as response:
                raw = response.read()
        except urllib.error.HTTPError as error:
            raise failed(f"answered HTTP {error.code}: {_excerpt(error.read())}") from None
        except (TimeoutError, socket.timeout):
            raise failed(f"no answer within {wait:g} s (config key {key})") from None
        except urllib.error.URLError as error:
            if isinstance(error.reason, (TimeoutError, socket.timeout)):
                raise failed(f"no answer within {wait:g} s (config key {key})") from None
            self._check_alive(0.0 if isinstance(error.reason, ConnectionRefusedError) else ENDING_SECONDS)
            raise failed(f"cannot connect ({error.reason})", "; start the server or fix config key sglang_url "
                                                             "('' starts one)") from None
        except (ConnectionError, http.client.HTTPException) as error:
            self._check_alive(ENDING_SECONDS)
            raise failed(f"the connection broke ({type(error).__name__}: {error})") from None
        text = raw.decode(errors="replace")
        if not json_answer:
            return text
        try:
            return json.loads(text) if text.strip() else None
        except json.JSONDecodeError:
            raise failed(f"answered with a body that is not JSON: {text[:80]!r}") from None

    def _check_alive(self, wait: float = 0.0) -> None:
        """A server this run started that ended is the failure to report. A broken connection waits
        `wait` s for the exit to show: the socket closes a moment before (SGLang kills its own
        process tree)."""
        if self.server is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.server.process.wait(timeout=wait)
        if ended := self.server.ended():
            raise SGLangServerError(ended)


# --------------------------------------------------------------------------- starting a server

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(model_path: str, port: int, settings: Settings, trainer_device: torch.device
                   ) -> tuple[list[str], dict[str, str]]:
    """`python -m sglang.launch_server ...` for settings.device, and its environment."""
    environment = {k: v for k, v in os.environ.items() if k != RAW_LOGPROBS_VARIABLE}
    kind, _, index = settings.device.partition(":")
    if kind == "cuda":   # one GPU, seen by the server as its cuda:0 (a name within the trainer's visible ones)
        if not index:
            index = str(trainer_device.index or 0) if trainer_device.type == "cuda" else "0"
        visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        environment["CUDA_VISIBLE_DEVICES"] = visible[int(index)] if int(index) < len(visible) else index
    else:
        environment[CPU_ENGINE_VARIABLE] = "1"
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_path, "--host", "127.0.0.1",
            "--port", str(port), "--device", kind, "--dtype", settings.dtype,
            "--mem-fraction-static", str(settings.mem_fraction_static), "--random-seed", str(settings.seed)]
    if settings.sleep:
        argv.append("--enable-memory-saver")
    if settings.deterministic:
        argv.append("--enable-deterministic-inference")
    return argv, environment


class LaunchedServer:
    """The server process rank 0 started: its own process group, its log in the run directory,
    stopped at exit (and on SIGTERM, torchrun's way of ending a rank)."""

    def __init__(self, argv: list[str], environment: dict[str, str], log_path: Path):
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(argv, env=environment, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        atexit.register(self.stop)
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            try:
                signal.signal(signal.SIGTERM, self._terminated)
            except ValueError:   # not the main thread: atexit alone
                pass

    def _terminated(self, signum, frame):
        self.stop()
        os._exit(128 + signum)

    def ended(self) -> str | None:
        """None while it runs; else one line: its exit code and its log's last line."""
        code = self.process.poll()
        if code is None:
            return None
        lines = [line for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()]
        last = " ".join(lines[-1].split())[:200] if lines else "(empty)"
        return f"the SGLang server grpo-edu started exited with code {code}; the last line of its log " \
               f"({self.log_path}): {last}"

    def wait_until_healthy(self, client: Client, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while True:
            if ended := self.ended():
                raise SGLangServerError(ended)
            try:
                client.call("GET", "/health_generate", json_answer=False, timeout=max(1.0, min(30.0, seconds)))
                return
            except SGLangServerError as error:
                if self.ended() is not None:
                    continue
                if time.monotonic() > deadline:
                    raise SGLangServerError(f"the SGLang server grpo-edu started did not answer /health_generate "
                                            f"within {seconds:g} s (config key sglang_start_timeout); last: "
                                            f"{error.detail}; its log: {self.log_path}") from None
            time.sleep(0.25)

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        for sent, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.process.pid, sent)
            except ProcessLookupError:
                return
            try:
                self.process.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue


# --------------------------------------------------------------------------- weights

def named_weights(model: torch.nn.Module):
    """(name, whole tensor) per parameter, LoRA adapters merged, as transformers saves them (under
    FSDP2 gathered: a collective, every rank iterates)."""
    return lora.named_merged_weights(model, gather=distributed.full_tensor)


def _chunks(named, dtype: torch.dtype, limit: int, device: torch.device | None = None):
    """Lists of (name, a copy in dtype, on device: default the tensor's) of at most `limit` bytes
    (one tensor may pass it alone)."""
    chunk, size = [], 0
    for name, tensor in named:
        copy = tensor.detach().to(device=device or tensor.device, dtype=dtype, copy=True).contiguous()
        if chunk and size + copy.nbytes > limit:
            yield chunk
            chunk, size = [], 0
        chunk.append((name, copy))
        size += copy.nbytes
    if chunk:
        yield chunk


def _reduce_tensor(tensor: torch.Tensor):
    """A CUDA tensor: torch's IPC reduction, its device given by its UUID (SGLang's
    monkey_patch_torch_reductions: the server may number the GPUs otherwise). A CPU tensor: by
    value, its storage as torch.save bytes (which SGLang's unpickler loads with weights_only)."""
    if not tensor.is_cuda:
        return tensor.__reduce_ex__(pickle.DEFAULT_PROTOCOL)
    from torch.multiprocessing.reductions import reduce_tensor
    rebuild, arguments = reduce_tensor(tensor)
    device = str(torch.cuda.get_device_properties(arguments[6]).uuid)
    return rebuild, (*arguments[:6], device, *arguments[7:])


def serialize_named_tensors(named_tensors: list) -> str:
    """SGLang's MultiprocessingSerializer.serialize(named_tensors, output_str=True): ForkingPickler,
    then base64. CUDA tensors travel as IPC handles; CPU tensors by value, not as torch's shared
    memory: its file descriptors pass only to a process that shares the sender's multiprocessing
    authkey ("digest sent was rejected", measured with a server started apart from the trainer),
    and its named files start torch_shm_manager, a daemon that keeps the trainer's output pipes
    open after it exits (a caller reading them waits forever, measured)."""
    buffer = io.BytesIO()
    pickler = ForkingPickler(buffer)
    pickler.dispatch_table = {**copyreg.dispatch_table, torch.Tensor: _reduce_tensor}
    pickler.dump(named_tensors)
    return base64.b64encode(buffer.getvalue()).decode()


def write_safetensors(named, folder: Path, dtype: torch.dtype, limit: int | None = None) -> None:
    """The weights as safetensors files of at most `limit` bytes (each written whole, then renamed
    into place), the folder's earlier ones removed."""
    from safetensors.torch import save_file
    for old in folder.glob("*.safetensors"):
        old.unlink()
    for number, chunk in enumerate(_chunks(named, dtype, limit or DISK_SHARD_BYTES, torch.device("cpu"))):
        part = folder / f".model-{number:05d}.safetensors.partial"
        save_file(dict(chunk), str(part), metadata={"format": "pt"})
        part.replace(folder / f"model-{number:05d}.safetensors")


# --------------------------------------------------------------------------- the engine

class SGLangEngine:
    """engine = "sglang" (see the module docstring). `policy` is the trainer's model (under FSDP2,
    sharded); `model_path` a folder holding the policy's config.json (and, to start a server,
    its weights and tokenizer)."""

    def __init__(self, model_path: str, policy: torch.nn.Module, tokenizer, world: distributed.World,
                 settings: Settings, say=None):
        if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
            raise ValueError("tokenizer needs an eos and a pad token for batched generation")
        self.policy, self.tokenizer, self.world, self.settings = policy, tokenizer, world, settings
        self.eos_token_ids = eos_token_ids(policy, tokenizer)
        check_extra_stops(tokenizer, self.eos_token_ids)
        self.server: LaunchedServer | None = None
        self.weights_dir = Path(settings.output_dir) / "sglang_weights"
        self._dtype = getattr(torch, settings.dtype)
        self.version, self._syncs, self.tp_size, self.released = None, 0, 1, False
        url, run = settings.url, uuid.uuid4().hex[:8]   # run: tells this run's weight versions from another's
        if world.is_main:
            if not url:
                url = self._launch(model_path)
            client = Client(url, settings.timeout, self.server)
            self.version, self.tp_size = self._connect(client, say or warn)
            if settings.weight_sync == "disk":
                self.weights_dir.mkdir(parents=True, exist_ok=True)
                for name in ("config.json", "generation_config.json"):   # the folder a model loader reads
                    if (Path(model_path) / name).is_file():
                        shutil.copy(Path(model_path) / name, self.weights_dir / name)
            if settings.sleep:
                self._release(client)
        url, self.version, self._run = world.gather_objects([(url, self.version, run)])[0]
        self.client = Client(url, settings.timeout, self.server)
        self.released = settings.sleep
        world.barrier()

    def _launch(self, model_path: str) -> str:
        import importlib.util
        if importlib.util.find_spec("sglang") is None:
            raise SGLangServerError(f"config key 'sglang_url' is '' (grpo-edu starts the server), but sglang does "
                                    f"not import in {sys.executable}: pip install -e '.[sglang]' (sglang=="
                                    f"{SGLANG_VERSION}), or start the server in an environment of its own and set "
                                    f"sglang_url")
        port = _free_port()
        argv, environment = launch_command(model_path, port, self.settings, self.world.device)
        self.server = LaunchedServer(argv, environment, Path(self.settings.output_dir) / "sglang_server.log")
        url = f"http://127.0.0.1:{port}"
        self.server.wait_until_healthy(Client(url, self.settings.timeout, self.server), self.settings.start_timeout)
        return url

    def _connect(self, client: Client, say) -> tuple[str | None, int]:
        """The server's version, settings and model, checked against what this run needs."""
        server = client.call("GET", "/server_info")
        model = client.call("GET", "/model_info")
        if not isinstance(server, dict) or not isinstance(model, dict):
            raise SGLangServerError(f"SGLang server at {client.url}: /server_info and /model_info must answer JSON "
                                    f"objects, got {type(server).__name__} and {type(model).__name__}")
        if server.get("version") != SGLANG_VERSION:
            say(f"engine = 'sglang' is written for sglang=={SGLANG_VERSION}, the server runs "
                f"{server.get('version', '?')}")
        for key, flag, needed in (("sglang_deterministic", "enable_deterministic_inference",
                                   self.settings.deterministic),
                                  ("sglang_sleep", "enable_memory_saver", self.settings.sleep)):
            if needed and server.get(flag) is False:
                raise SGLangServerError(f"config key {key!r} is true, but the SGLang server at {client.url} was "
                                        f"started without --{flag.replace('_', '-')}: restart it with the flag, or "
                                        f"set {key} = false")
        ours = list(getattr(self.policy.config, "architectures", None) or [])
        theirs = list(model.get("architectures") or [])
        if ours and theirs and ours != theirs:
            raise SGLangServerError(f"SGLang server at {client.url} serves a {theirs} model, the trainer trains a "
                                    f"{ours}: start it on the policy's model (config key 'model')")
        return model.get("weight_version"), int(server.get("tp_size") or 1)

    def close(self) -> None:
        """Stop the server this engine started (a server named by sglang_url is left running)."""
        if self.server is not None:
            self.server.stop()

    # ------------------------------------------------------------------ weight sync
    def sync_weights(self) -> None:
        """The trainer's current weights into the server, its prefix cache flushed (every rank at
        once: FSDP2 gathers; rank 0 talks, the others wait for it)."""
        self._syncs += 1
        version = f"grpo-edu-{self._run}-{self._syncs}"
        if not self.world.is_main:
            for _ in named_weights(self.policy):   # take part in FSDP2's gathers
                pass
            self.version, self.released = version, False
            self.world.barrier()   # rank 0 is done: the server has the new weights
            return
        if self.settings.sleep:
            self.client.call("POST", "/resume_memory_occupation", {"tags": ["weights"]})
        if self.settings.weight_sync == "disk":   # one call: SGLang restores and post-processes inside it
            write_safetensors(named_weights(self.policy), self.weights_dir, self._dtype)
            self._updated("/update_weights_from_disk", {"model_path": str(self.weights_dir.resolve()),
                                                        "flush_cache": False, "weight_version": version})
        else:
            self._tensor_sync(version)
        self.client.call("POST", "/flush_cache", json_answer=False)   # prefixes cached with the old weights
        if self.settings.sleep:
            self.client.call("POST", "/resume_memory_occupation", {"tags": ["kv_cache", "cuda_graph"]})
        self.version, self.released = version, False
        self.world.barrier()   # no rank samples before the server has the new weights

    def _tensor_sync(self, version: str) -> None:
        """/update_weights_from_tensor inside a weight-update session, as SGLang's own HTTP client
        (HttpServerEngineAdapter) sends it: SGLang 0.5.23 refuses a tensor update outside one.
        A failed update still closes the session, so that the server takes the next sync."""
        self._updated("/begin_weight_update", {"selector": "all"})
        try:
            for chunk in _chunks(named_weights(self.policy), self._dtype, TENSOR_REQUEST_BYTES):
                # one serialisation per tensor-parallel rank: each deserialises its own
                payloads = [serialize_named_tensors(chunk) for _ in range(self.tp_size)]
                self._updated("/update_weights_from_tensor", {"serialized_named_tensors": payloads,
                                                              "flush_cache": False, "weight_version": version})
        except SGLangServerError:
            with contextlib.suppress(SGLangServerError):
                self.client.call("POST", "/end_weight_update", {})
            raise
        self._updated("/end_weight_update", {})

    def _updated(self, route: str, body: dict) -> None:
        """One weight-update call; SGLang's refusal (HTTP 400, or success false) is one line that
        names the call and carries SGLang's message."""
        answer = self.client.call("POST", route, body)
        if not isinstance(answer, dict) or answer.get("success") is not True:
            message = answer.get("message") if isinstance(answer, dict) else answer
            raise SGLangServerError(f"SGLang server at {self.client.url}: {route} failed: "
                                    f"{_excerpt(str(message).encode())}")

    def _release(self, client: Client) -> None:
        client.call("POST", "/release_memory_occupation", {"tags": list(MEMORY_TAGS)})

    # ------------------------------------------------------------------ sampling
    def seeded(self, rows: int, length: int, world: distributed.World, turns: int | None = None) -> Seeded:
        """One number drawn for the step (on every rank alike); row r of the step's B x G at turn t
        samples with seed + t x rows + r: a completion's seed does not depend on the split."""
        seed = int(torch.randint(0, 2**62, (1,)))

        def generate(turn: int, prompt_ids, prompt_mask, sampling: SamplingParams, batch_rows) -> Rollout:
            return self.generate(prompt_ids, prompt_mask, sampling,
                                 seeds=[seed + turn * rows + int(r) for r in batch_rows])
        return generate

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, sampling: SamplingParams, *,
                 seeds: list[int] | None = None) -> Rollout:
        """prompt_ids, prompt_mask: (B, P) left-padded -> Rollout of B * G completions, in one request.
        seeds: one per completion (B * G, prompt-major); sent where sglang_deterministic is true."""
        if self.released:   # the server's weights were released: nothing sensible to sample from
            raise RuntimeError("SGLangEngine.generate: the server's memory is released (sglang_sleep): call "
                               "sync_weights first, which takes it back and loads the trainer's weights")
        G = sampling.num_generations
        rows = [ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids, prompt_mask) for _ in range(G)]
        if seeds is not None and len(seeds) != len(rows):
            raise ValueError(f"seeds: expected one per completion ({len(rows)}), got {len(seeds)}")
        params = {"max_new_tokens": sampling.max_new_tokens, "temperature": sampling.temperature, "top_p": 1.0,
                  "top_k": -1, "min_p": 0.0,   # the whole softmax(logits / T): what the trainer's log-probs describe
                  "stop_token_ids": [*self.eos_token_ids, *sampling.stop_token_ids]}
        per_row = seeds is not None and self.settings.deterministic
        rids = [f"grpo-edu-{uuid.uuid4().hex}-{i}" for i in range(len(rows))]
        body = {"rid": rids, "input_ids": rows, "return_logprob": True,
                "sampling_params": [dict(params, sampling_seed=s) for s in seeds] if per_row else params}
        answer = self.client.call("POST", "/generate", body)
        completions = self._completions(answer, rids)
        if self.settings.sleep:   # the update comes next: the server gives its memory back (rank 0, all done)
            self.world.barrier()
            if self.world.is_main:
                self._release(self.client)
            self.released = True
        return rollout_from_tokens(prompt_ids, prompt_mask, completions, sampling, self.tokenizer,
                                   self.eos_token_ids)

    def _completions(self, answer, rids: list[str]) -> list[tuple[list[int], list[float]]]:
        where = f"SGLang server at {self.client.url}: POST /generate"
        if not isinstance(answer, list) or len(answer) != len(rids):
            got = f"a list of {len(answer)}" if isinstance(answer, list) else type(answer).__name__
            raise SGLangServerError(f"{where} answered {got}, expected a list of {len(rids)} completions")
        by_id = {}
        for item in answer:
            meta = item.get("meta_info") if isinstance(item, dict) else None
            if not isinstance(meta, dict) or not isinstance(item.get("output_ids"), list):
                raise SGLangServerError(f"{where} answered a completion without output_ids and meta_info: "
                                        f"{str(item)[:80]}")
            by_id[meta.get("id")] = (item["output_ids"], meta)
        out = []
        for rid in rids:
            if rid not in by_id:
                raise SGLangServerError(f"{where} answered no completion for the request id {rid!r}")
            tokens, meta = by_id[rid]
            finish = meta.get("finish_reason")
            if isinstance(finish, dict) and finish.get("type") == "abort":
                raise SGLangServerError(f"{where}: the server aborted a completion: {finish.get('message')}")
            if meta.get("weight_version") is not None and meta["weight_version"] != self.version:
                raise SGLangServerError(f"{where}: sampled with the weights {meta['weight_version']!r}, but the "
                                        f"trainer's last sync was {self.version!r} (did another client update them?)")
            entries = meta.get("output_token_logprobs")
            if (not isinstance(entries, list) or len(entries) != len(tokens)
                    or any(not isinstance(e, list) or len(e) < 2 or e[1] != t or not isinstance(e[0], (int, float))
                           for e, t in zip(entries, tokens))):
                raise SGLangServerError(f"{where}: meta_info.output_token_logprobs must hold [logprob, token_id, "
                                        f"text] for each of the {len(tokens)} output_ids, got {str(entries)[:80]}")
            out.append(([int(t) for t in tokens], [float(e[0]) for e in entries]))
        return out


def make_engine(config, models, tokenizer, world: distributed.World) -> SGLangEngine:
    """engine = "sglang" (grpo_edu.sampling.engines): the config's [sglang] keys, and a folder holding
    the policy's model (the one it was loaded from, else saved once into the run directory) for a
    server to start on."""
    with models.whole() as whole:
        path = sampler_model_path(whole, tokenizer, config.logging.output_dir, world)
    sglang = config.sglang
    settings = Settings(
        url=sglang.sglang_url, device=sglang.sglang_device, mem_fraction_static=sglang.sglang_mem_fraction_static,
        weight_sync=sglang.sglang_weight_sync, sleep=sglang.sglang_sleep, deterministic=sglang.sglang_deterministic,
        timeout=sglang.sglang_timeout, start_timeout=sglang.sglang_start_timeout, seed=config.run.seed,
        dtype="bfloat16" if compute_dtype(config.run.precision, world.device) == torch.bfloat16 else "float32",
        output_dir=config.logging.output_dir)
    return SGLangEngine(path, models.policy, tokenizer, world, settings)
