"""The rollout engines, registered whole: what samples a run's completions (config key engine).

One registration carries everything the rest of the library needs to know about an engine:

    factory       "module:function", imported only when a run builds the engine:
                  (config, models, tokenizer, world) -> a grpo_edu.sampling.rollout.RolloutEngine
    settings      its config section (a grpo_edu.runtime.settings.Section), or None
    own_weights   it samples from weights of its own, loaded from the policy before every rollout
                  (else it samples with the trainer's whole-weight policy module itself)
    forward       "module:function", the trainer's log-probs of completion tokens: (model,
                  input_ids, attention_mask, completion_mask, *, temperature, group_size,
                  entropy) -> (n, S); group_size > 1: rows come in whole groups of one prompt
    layer_forward the forward runs each decoder layer's own forward (FSDP2 may shard per layer)
    check         (config, device) -> None: what needs the machine, at start-up

    fused    the CPU tier's fast sampler and forward for Llama-family policies, float32
    hf       transformers' generate and forward: any causal LM, any device
    vllm     vLLM 0.31.0 samples (colocated, or a server), transformers' forward trains
    sglang   an SGLang 0.5.23 server samples, over its HTTP API

This module imports no engine client: grpo_edu.config composes the sections, and a run imports
the factory it uses. A new engine is one `register_engine(Engine(...))` call (from any module,
see docs/contributing.md, "Adding an engine").
"""

from __future__ import annotations

import dataclasses
import importlib
import ipaddress
import re
import urllib.parse
from dataclasses import dataclass
from typing import Callable

import torch

from grpo_edu.runtime.precision import compute_dtype
from grpo_edu.runtime.settings import Section, setting


@dataclass(frozen=True)
class Engine:
    """A registered rollout engine (module docstring)."""

    name: str
    factory: str
    doc: str
    settings: type[Section] | None = None
    own_weights: bool = False
    forward: str = "grpo_edu.sampling.rollout:transformers_logprobs"
    layer_forward: bool = True
    check: Callable | None = None

    def make(self, config, models, tokenizer, world):
        """The engine for a run: its factory, imported now."""
        return load(self.factory)(config, models, tokenizer, world)

    def logprobs(self) -> Callable:
        return load(self.forward)


ENGINES: dict[str, Engine] = {}


def register_engine(engine: Engine) -> Engine:
    """Add an engine under engine.name (config key engine); its settings section becomes a config
    section of the same title."""
    if engine.settings is not None and not (dataclasses.is_dataclass(engine.settings)
                                            and issubclass(engine.settings, Section)):
        raise ValueError(f"engine {engine.name!r}: settings must be a Section dataclass, got {engine.settings!r}")
    ENGINES[engine.name] = engine
    return engine


def load(path: str) -> Callable:
    """'package.module:function' -> the function."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


# --------------------------------------------------------------------------- the settings sections

def fraction_open(value, name):
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {value}")


VLLM_MODES = ("colocate", "server")   # config key vllm_mode: VLLMEngine, VLLMServerEngine


@dataclass
class VLLMSettings(Section):
    """[vllm]: the vLLM engine's keys (engine = 'vllm')."""

    title = "vllm"

    vllm_mode: str = setting("engine = 'vllm': 'colocate' (an engine inside every training process, sharing its GPU, "
                             "asleep between rollouts) or 'server' (a separate `grpo-edu vllm-serve` process at "
                             "vllm_server_url, for models that do not fit beside the trainer)", "colocate",
                             choices=VLLM_MODES, trl="vllm_mode")
    vllm_gpu_memory_utilization: float = setting("colocated vLLM: the fraction of the GPU's memory vLLM may take for "
                                                 "its weights and KV cache; the trainer gets the rest", 0.3,
                                                 check=fraction_open,
                                                 trl="vllm_gpu_memory_utilization")
    vllm_sleep_mode: bool = setting("colocated vLLM: release the engine's weights and KV cache between rollouts "
                                    "(sleep level 2), so the update has the GPU to itself", True,
                                    trl_note="vllm_enable_sleep_mode")
    vllm_server_url: str = setting("vllm_mode = 'server': the server's address", "http://127.0.0.1:8000",
                                   trl_note="vllm_server_base_url")


WEIGHT_SYNCS = ("disk", "tensor")   # config key sglang_weight_sync


def check_url(value: str, name: str) -> None:
    if value and not re.fullmatch(r"https?://[^/\s?#]+/?", value):
        raise ValueError(f"{name} must be '' (grpo-edu starts a server) or a server's address such as "
                         f"'http://127.0.0.1:30000', got {value!r}")


def check_device(value: str, name: str) -> None:
    if not re.fullmatch(r"cpu|cuda(:\d+)?", value):
        raise ValueError(f"{name} must be 'cuda' (the trainer's GPU), 'cuda:N' (GPU N) or 'cpu', got {value!r}")


def on_this_machine(url: str) -> bool:
    """'' (a server started here) or a loopback address: where shared memory and CUDA IPC reach."""
    host = urllib.parse.urlsplit(url).hostname if url else "127.0.0.1"
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_NO_SGLANG_IN_TRL = "engine = 'sglang' only: TRL 1.16 has no SGLang backend (the bridge samples with transformers' generate)"


@dataclass
class SGLangSettings(Section):
    """[sglang]: the SGLang engine's keys (engine = 'sglang')."""

    title = "sglang"

    sglang_url: str = setting("engine = 'sglang': the address of a running SGLang server (python -m "
                              "sglang.launch_server ...); '' = grpo-edu starts one on sglang_device and stops it when "
                              "the run ends", "", check=check_url, trl_note=_NO_SGLANG_IN_TRL)
    sglang_device: str = setting("engine = 'sglang', sglang_url = '': the started server's device: 'cuda' (the "
                                 "trainer's GPU, shared: see sglang_sleep), 'cuda:N' (GPU N, its own) or 'cpu' "
                                 "(SGLang's CPU backend, built from source)", "cuda", check=check_device,
                                 trl_note=_NO_SGLANG_IN_TRL)
    sglang_mem_fraction_static: float = setting("engine = 'sglang', sglang_url = '': SGLang's --mem-fraction-static, "
                                                "the share of the device's memory the server takes for its weights "
                                                "and KV cache (beside the trainer, leave it the rest)", 0.3,
                                                check=fraction_open, trl_note=_NO_SGLANG_IN_TRL)
    sglang_weight_sync: str = setting("engine = 'sglang': how the trainer's weights reach the server before every "
                                      "rollout: 'disk' (safetensors files in output_dir, then "
                                      "/update_weights_from_disk: a server that reads this file system) or 'tensor' "
                                      "(/update_weights_from_tensor: CUDA IPC handles or shared memory, a server on "
                                      "this machine)", "disk", choices=WEIGHT_SYNCS, trl_note=_NO_SGLANG_IN_TRL)
    sglang_sleep: bool = setting("engine = 'sglang': the server releases its weights, KV cache and CUDA graphs while "
                                 "the trainer updates, and takes them back for the next rollout (SGLang's "
                                 "release/resume_memory_occupation; needs --enable-memory-saver, which a started "
                                 "server gets): for a server that shares the trainer's GPU", False,
                                 trl_note=_NO_SGLANG_IN_TRL)
    sglang_deterministic: bool = setting("engine = 'sglang': a seed per completion (sampling_seed) and SGLang's "
                                         "batch-invariant kernels (--enable-deterministic-inference): a rollout is "
                                         "reproducible and independent of how the prompts split over processes; a "
                                         "running server must have been started with the flag. false: no seeds are "
                                         "sent, the server samples from its own random state", True,
                                         trl_note=_NO_SGLANG_IN_TRL)
    sglang_timeout: float = setting("engine = 'sglang': seconds any one request to the server may take (a rollout's "
                                    "/generate, a weight update); past it the run stops with one line", 600.0, above=0,
                                    trl_note=_NO_SGLANG_IN_TRL)
    sglang_start_timeout: float = setting("engine = 'sglang', sglang_url = '': seconds to wait for the started server "
                                          "to answer /health_generate (it loads the model, captures CUDA graphs)",
                                          900.0, above=0, trl_note=_NO_SGLANG_IN_TRL)


# --------------------------------------------------------------------------- the engines

def check_fused(config, device) -> None:
    """The fused path is the CPU tier's float32 fast path: refused by name elsewhere."""
    if device.type != "cpu":
        raise ValueError(f"config key 'engine' is 'fused', but the fused forward and sampler are the CPU "
                         f"tier's fast path and run on the CPU only (device is {device}); set "
                         f"engine = 'hf' (transformers' forward and generate) or 'vllm' on {device.type}")
    if compute_dtype(config.run.precision, device) != torch.float32:
        raise ValueError("config key 'engine' is 'fused' with precision = 'bf16': the fused path computes "
                         "in float32 only; set engine = 'hf' or 'vllm' for bf16 autocast")


register_engine(Engine(
    "fused", "grpo_edu.sampling.fused_llama:make_engine",
    "the CPU tier's fast sampler and forward for Llama/Qwen2 policies, transformers' maths tested to 1e-5; CPU, "
    "float32", forward="grpo_edu.sampling.fused_llama:completion_logprobs", layer_forward=False, check=check_fused))
register_engine(Engine(
    "hf", "grpo_edu.sampling.rollout:make_hf_engine",
    "transformers' generate and forward: any causal LM, any device"))
register_engine(Engine(
    "vllm", "grpo_edu.sampling.vllm_engine:make_engine",
    "vLLM 0.31.0 samples, transformers' forward trains; see vllm_mode", settings=VLLMSettings, own_weights=True))
register_engine(Engine(
    "sglang", "grpo_edu.sampling.sglang_engine:make_engine",
    "an SGLang 0.5.23 server samples, over its HTTP API; see sglang_url", settings=SGLangSettings, own_weights=True))
