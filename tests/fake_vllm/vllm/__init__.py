"""A stand-in for vllm==0.31.0 with exactly the surface grpo_edu/sampling/vllm_engine.py uses
(vllm_engine.VLLM_API; tests/test_vllm_engine.py checks the two agree), so that the trainer
trains through the vLLM engine on a CPU, in one process or under torchrun.

It samples with the policy itself (transformers' forward with a KV cache, in the dtype the
engine asks for) from its own copy of the weights, which only `load_weights` changes, as in
vLLM. It keeps vLLM's rules and refuses, with an error, a call out of order:

- sleep(level=2) discards the weights and the KV cache (with enable_sleep_mode, as on a
  GPU): after wake_up(["weights"]) the weights are NaN until every parameter is loaded
  again, and generate needs the KV cache woken too. Without enable_sleep_mode, sleep only
  pauses the scheduler (vLLM's CPU build, measured: its worker's sleep is a no-op);
- vLLM's sleep bookkeeping (vllm/v1/executor/abstract.py, vllm/v1/engine/core.py): a sleep of
  level 1 or 2 pauses the scheduler and marks both tags, weights and kv_cache, asleep; a sleep
  while the weights sleep changes nothing; wake_up(tags) wakes nothing at all when one of the
  tags is not asleep (or nothing is), else those tags (None: all), and the scheduler resumes
  only once no tag sleeps (tests/test_vllm_engine.py and tests/real_vllm check the same rules
  on both);
- generate while asleep or paused is an error here; vLLM itself waits forever (measured on
  its CPU build), which is why the engine refuses first;
- a prefix cached before load_weights is stale: generate after a load needs
  reset_prefix_cache first;
- external_launcher needs torchrun's variables (RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT);
- building the engine reseeds Python, NumPy and torch (vLLM's set_random_seed);
- logprobs_mode "processed_logprobs" gives log softmax(logits / T); vLLM's default,
  "raw_logprobs", gives log softmax(logits) (not what was sampled from when T != 1);
- sampling is vLLM's: token = argmax(probs / q) with q ~ Exp(1), a seeded request drawing q
  from its own generator (child j of a request with n > 1: seed + j), an unseeded one from
  torch's global RNG, and, as vLLM's CPU sampler does, every step draws noise for the whole
  batch from the global RNG even when every request is seeded (the seeded rows overwrite it).
  With the same seeds and weights it returns vLLM's tokens (tests/real_vllm compares them).

Every call is appended to CALLS (and, when FAKE_VLLM_LOG names a file, written there as
JSON lines, one file per rank: FAKE_VLLM_LOG.RANK).
"""

from __future__ import annotations

import json
import os
import random

import numpy
import torch

from vllm import inputs, logprobs, outputs  # noqa: F401  (the submodules vllm_engine imports)
from vllm.logprobs import Logprob
from vllm.outputs import CompletionOutput, RequestOutput

__version__ = "0.31.0"

CALLS: list[tuple] = []


def _record(*call) -> None:
    CALLS.append(call)
    path = os.environ.get("FAKE_VLLM_LOG")
    if path:
        with open(f"{path}.{os.environ.get('RANK', '0')}", "a") as f:
            f.write(json.dumps(call) + "\n")


class SamplingParams:
    def __init__(self, *, n: int = 1, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 max_tokens: int | None = 16, logprobs: int | None = None, seed: int | None = None,
                 stop_token_ids: list[int] | None = None, detokenize: bool = True):
        self.n, self.temperature, self.top_p, self.top_k = n, temperature, top_p, top_k
        self.max_tokens, self.logprobs, self.seed = max_tokens, logprobs, seed
        self.stop_token_ids, self.detokenize = list(stop_token_ids or []), detokenize


class _Model:
    """The engine's model: what vLLM's LlamaForCausalLM.load_weights takes, names as saved."""

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self.names = {name for name, _ in module.named_parameters()}
        self.loaded: set[str] = set(self.names)

    def load_weights(self, weights) -> set[str]:
        own = dict(self.module.named_parameters())
        done = set()
        for name, tensor in weights:
            if name not in own:
                raise KeyError(f"fake vllm: load_weights got an unknown parameter {name!r}")
            if tuple(tensor.shape) != tuple(own[name].shape):
                raise ValueError(f"fake vllm: {name} has shape {tuple(own[name].shape)}, got {tuple(tensor.shape)}")
            with torch.no_grad():
                own[name].copy_(tensor)
            done.add(name)
        self.loaded |= done
        return done

    def named_parameters(self):   # vLLM's model is a torch module
        return self.module.named_parameters()


class _ModelRunner:
    def __init__(self, model: _Model):
        self._model = model

    def get_model(self) -> _Model:
        return self._model


class _Worker:
    def __init__(self, runner: _ModelRunner):
        self.model_runner = runner


class _Executor:
    def __init__(self, worker: _Worker):
        self.driver_worker = worker


class _LLMEngine:
    def __init__(self, executor: _Executor):
        self.model_executor = executor


class LLM:
    def __init__(self, model: str, *, tensor_parallel_size: int = 1, distributed_executor_backend: str | None = None,
                 seed: int = 0, dtype: str = "auto", gpu_memory_utilization: float = 0.92,
                 enable_sleep_mode: bool = False, enable_prefix_caching: bool | None = None,
                 logprobs_mode: str = "raw_logprobs", max_num_batched_tokens: int | None = None):
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as transformers_logging

        if distributed_executor_backend == "external_launcher":
            missing = [k for k in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
            if missing:
                raise KeyError(f"fake vllm: external_launcher needs {missing} in the environment")
        if tensor_parallel_size != 1:
            raise ValueError("fake vllm: tensor_parallel_size must be 1")
        if logprobs_mode not in ("raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits"):
            raise ValueError(f"fake vllm: unknown logprobs_mode {logprobs_mode!r}")
        _record("LLM", {"model": model, "seed": seed, "dtype": dtype, "backend": distributed_executor_backend,
                        "sleep_mode": enable_sleep_mode, "logprobs_mode": logprobs_mode,
                        "gpu_memory_utilization": gpu_memory_utilization})
        # vLLM's set_random_seed: the whole process is reseeded.
        random.seed(seed)
        numpy.random.seed(seed)
        torch.manual_seed(seed)
        torch_dtype = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
        transformers_logging.disable_progress_bar()
        module = AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype or "auto").eval()
        transformers_logging.enable_progress_bar()
        self._seed, self._sleep_mode, self._logprobs_mode = seed, enable_sleep_mode, logprobs_mode
        self._sleeping: set[str] = set()   # vLLM's executor's sleeping_tags
        self._paused = False                # vLLM's scheduler pause
        self._prefix_stale = False
        self._eos = module.generation_config.eos_token_id
        self._model = _Model(module)
        self.llm_engine = _LLMEngine(_Executor(_Worker(_ModelRunner(self._model))))
        self._model.load_weights = self._tracked_load(self._model.load_weights)

    @property
    def _weights_awake(self) -> bool:
        return "weights" not in self._sleeping

    def _tracked_load(self, load):
        def load_weights(weights):
            if not self._weights_awake:
                raise RuntimeError("fake vllm: load_weights while the weights sleep (wake_up(['weights']) first)")
            done = load(weights)
            self._prefix_stale = True
            _record("load_weights", sorted(done))
            return done
        return load_weights

    def sleep(self, level: int = 1) -> None:
        _record("sleep", level)
        self._paused = True
        if level < 1 or "weights" in self._sleeping:   # level 0 pauses only; asleep already: nothing more
            return
        self._sleeping |= {"weights", "kv_cache"}
        if level == 2 and self._sleep_mode:   # the weights are discarded, not kept on the host
            with torch.no_grad():
                for parameter in self._model.module.parameters():
                    parameter.fill_(float("nan"))
            self._model.loaded = set()

    def wake_up(self, tags: list[str] | None = None) -> None:
        _record("wake_up", tags)
        if tags is not None:
            tags = [t for t in tags if t != "scheduling"]
        if (tags is None or tags) and self._sleeping and all(t in self._sleeping for t in tags or []):
            self._sleeping -= set(self._sleeping if tags is None else tags)
        if not self._sleeping:
            self._paused = False

    def reset_prefix_cache(self) -> bool:
        _record("reset_prefix_cache")
        self._prefix_stale = False
        return True

    @torch.no_grad()
    def generate(self, prompts, sampling_params=None, *, use_tqdm=True) -> list[RequestOutput]:
        if self._paused:   # vLLM: waits forever
            raise RuntimeError("fake vllm: generate while asleep (wake_up weights and kv_cache first)")
        if self._model.loaded != self._model.names:
            missing = sorted(self._model.names - self._model.loaded)
            raise RuntimeError(f"fake vllm: generate with weights discarded by sleep and not loaded again: {missing[:3]}")
        if self._prefix_stale:
            raise RuntimeError("fake vllm: generate after load_weights without reset_prefix_cache (stale prefixes)")
        params = sampling_params if isinstance(sampling_params, (list, tuple)) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError("fake vllm: one SamplingParams per prompt, or one for all")
        _record("generate", len(prompts))
        results = []
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            rows = self._sample(prompt["prompt_token_ids"], p)
            results.append(RequestOutput(request_id=str(i), prompt_token_ids=list(prompt["prompt_token_ids"]),
                                         outputs=rows))
        return results

    def _sample(self, prompt: list[int], p: SamplingParams) -> list[CompletionOutput]:
        """p.n completions of one prompt, sampled as vLLM samples (see the module docstring)."""
        model = self._model.module
        n, L, T = p.n, p.max_tokens, p.temperature
        stop = set(p.stop_token_ids) | ({self._eos} if isinstance(self._eos, int) else set(self._eos or []))
        generators = [torch.Generator().manual_seed(p.seed + j) for j in range(n)] if p.seed is not None else None
        ids = torch.tensor([prompt] * n)
        out = model(input_ids=ids, use_cache=True)
        tokens = [[] for _ in range(n)]
        logps = [[] for _ in range(n)]
        done = torch.zeros(n, dtype=torch.bool)
        for t in range(L):
            logits = out.logits[:, -1].float()
            processed = torch.log_softmax(logits / T, dim=-1)
            reported = processed if self._logprobs_mode == "processed_logprobs" else torch.log_softmax(logits, -1)
            probs = torch.softmax(logits / T, dim=-1)
            noise = torch.empty_like(probs).exponential_()   # the global RNG, whether or not seeded
            for j, generator in enumerate(generators or []):
                noise[j].exponential_(generator=generator)
            next_ids = (probs / noise).argmax(dim=-1)
            for j in range(n):
                if not done[j]:
                    token = int(next_ids[j])
                    tokens[j].append(token)
                    logps[j].append({token: Logprob(logprob=float(reported[j, token]), rank=None)})
                    done[j] = token in stop
            if bool(done.all()):
                break
            out = model(input_ids=next_ids[:, None], past_key_values=out.past_key_values, use_cache=True)
        return [CompletionOutput(index=j, text="", token_ids=tokens[j], cumulative_logprob=None,
                                 logprobs=logps[j] if p.logprobs is not None else None,
                                 finish_reason="stop" if tokens[j] and tokens[j][-1] in stop else "length")
                for j in range(n)]
