"""`grpo-edu doctor --gpu`: the check a reader runs on a GPU machine before training with vLLM or SGLang.

Each check prints one row (PASS, FAIL, or SKIP when an earlier failure leaves it nothing to
stand on) with what it measured. Two engines, each a chain of checks: vLLM (colocated in the
trainer's process) and SGLang (a server grpo-edu starts). An engine whose package is not
installed is skipped, saying so, unless `--engine` names it; the command exits 0 when every
check that ran passed and at least one engine was checked, 1 otherwise.

Without a GPU it runs what needs none (which engines are installed, at which versions), lists
every check that needs a GPU as not run, says "no GPU found" and exits 0. `run_checks(device)`
takes the device, so the same sequences run on the CPU: against the tests' stand-in vllm
(tests/test_doctor.py), the stand-in SGLang server (tests/fake_sglang), and vLLM's CPU build
(tests/real_vllm, with its test-side shim: the CPU build has no sleep mode and cannot load
weights after start-up; without the shim the engine check fails saying so).
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import gc
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

import torch

from grpo_edu.environment import tasks
from grpo_edu.sampling.sglang_engine import SGLANG_VERSION
from grpo_edu.sampling.vllm_engine import VLLM_VERSION

TRANSFORMERS_RANGE = ((5, 10, 4), (5, 18, 0))   # what vllm==0.31.0 requires: >=5.10.4,<5.18
GAP_LIMIT = 0.05        # sampler_gap/mean_abs allowed between vLLM (bf16) and a float32 trainer
MOVED = 10 * GAP_LIMIT  # after the perturbation, vLLM's log-probs are at least this far (mean) from the old policy's
TEMPERATURE = 0.7       # not 1: vLLM must report log softmax(logits / T), what it sampled from
PROMPTS, GENERATIONS, MAX_NEW_TOKENS = 4, 4, 16   # the weight-sync check's held-out prompts and completions
# torchrun's variables: the engine sets them for its world of one (vLLM's external_launcher binds
# MASTER_PORT); the training check's own process must choose its own.
LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

COMMON_CHECKS = [
    ("CUDA", "torch sees a GPU: torch and CUDA versions, the device's name"),
]
VLLM_CHECKS = [
    ("vLLM", f"vllm imports and is version {VLLM_VERSION}, the release grpo_edu/sampling/vllm_engine.py is written for"),
    ("transformers", "its version is in vLLM 0.31.0's range (>=5.10.4,<5.18)"),
    ("engine", "builds the colocated vLLM engine on the committed tiny policy (bf16, sleep mode)"),
    ("weight sync", "loads the trainer's float32 weights, generates, compares vLLM's log-probs with the trainer's "
                    f"recomputation at T = {TEMPERATURE} (mean |gap| < {GAP_LIMIT}); perturbs the weights, syncs "
                    f"again, and checks vLLM now samples the new policy (gap < {GAP_LIMIT}), not the old "
                    f"(gap > {MOVED})"),
    ("training", "two GRPO training steps with engine = 'vllm': finite losses, the gap logged"),
    ("background", "four steps with rollout_lag = 1 sampled in turn, then with rollout_overlap (vLLM samples in a "
                   "thread while the trainer updates, its weights synced between rollouts): finite losses, the gap "
                   "logged, whether the two runs' rewards agree, and each one's seconds per step"),
]
SGLANG_CHECKS = [
    ("SGLang", f"sglang imports in this interpreter (the one grpo-edu starts `python -m sglang.launch_server` "
               f"with) and is version {SGLANG_VERSION}, the release grpo_edu/sampling/sglang_engine.py is written for"),
    ("SGLang server", "starts the server on the committed tiny policy on the GPU (bf16, deterministic inference, "
                      "memory saver), waits for /health_generate, reads /server_info"),
    ("SGLang sync", f"loads the trainer's weights both ways, from disk (safetensors) and from tensors (CUDA IPC "
                    f"handles): after each, the server's log-probs are the trainer's at T = {TEMPERATURE} (mean "
                    f"|gap| < {GAP_LIMIT}) and not the previous weights' (gap > {MOVED})"),
    ("SGLang seeds", "a completion depends on its sampling_seed alone: the same seeds give the same tokens, in a "
                     "batch or alone (what lets 2 processes train what 1 does)"),
    ("SGLang sleep", "releases the server's weights, KV cache and CUDA graphs after a rollout (the GPU's free "
                     "memory rises), takes them back with the next sync, and samples what it sampled before"),
    ("SGLang training", "two GRPO training steps with engine = 'sglang' (grpo-edu starts the server, syncs, "
                        "sleeps and stops it): finite losses, the gap logged"),
]
CHECKS = COMMON_CHECKS + VLLM_CHECKS + SGLANG_CHECKS
# Each engine's chain of checks, the common ones first.
ENGINES = {engine: [name for name, _ in COMMON_CHECKS + checks]
           for engine, checks in (("vllm", VLLM_CHECKS), ("sglang", SGLANG_CHECKS))}
# What runs without a GPU: whether each engine is installed, and at which version.
NO_GPU_NEEDED = ("vLLM", "transformers", "SGLang")
SLEEP_FREED = 1 << 30   # the GPU's free memory must rise by at least this much when the server sleeps (bytes)


class NotInstalled(RuntimeError):
    """An engine's package is missing: its checks are skipped unless the engine was asked for."""


@dataclass
class Row:
    name: str
    status: str      # PASS, FAIL, SKIP
    detail: str


def _version(text: str) -> tuple[int, ...]:
    return tuple(int("".join(c for c in part if c.isdigit()) or 0) for part in text.split(".")[:3])


def training_environment() -> dict[str, str]:
    """The environment of the training check's process: this one's without torchrun's variables."""
    return {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}


def run_checks(device: torch.device, output: Callable[[str], None] = print, *,
               engine_dtype: str = "bfloat16", engines: tuple[str, ...] = ("vllm", "sglang"),
               required: tuple[str, ...] = ()) -> list[Row]:
    """Run the checks of `engines` on `device`, printing each row as it completes. engine_dtype:
    the engines' (bf16, as the trainer's GPU runs; the tests' quick runs of the stand-ins on the
    CPU: float32). required: engines whose missing package is a FAIL, not a SKIP."""
    checks = Checks(device, output, engine_dtype, required)
    output(f"{'check':<15} {'result':<6} detail")
    for name, needs, body in checks.in_order():
        if any(name in ENGINES[engine] for engine in engines):
            checks.check(name, needs, body)
    passed = sum(r.status == "PASS" for r in checks.rows)
    output(f"\n{passed} of {len(checks.rows)} checks passed")
    return checks.rows


def engines_checked(rows: list[Row]) -> list[str]:
    """The engines whose every check passed."""
    status = {r.name: r.status for r in rows}
    return [engine for engine, names in ENGINES.items()
            if all(status.get(name) == "PASS" for name in names)]


class Checks:
    """The checks, each a method that returns its row's detail or raises; a check runs only when
    the checks it needs passed (`in_order` says which)."""

    def __init__(self, device: torch.device, output: Callable[[str], None], engine_dtype: str,
                 required: tuple[str, ...] = ()):
        self.device, self.output, self.engine_dtype, self.required = device, output, engine_dtype, required
        self.rows: list[Row] = []
        self.state: dict = {}   # the engine, the policy and its tokenizer, between checks

    def in_order(self) -> list[tuple[str, list[str], Callable[[], str]]]:
        return [
            ("CUDA", [], self.cuda),
            ("vLLM", [], self.vllm_version),
            ("transformers", ["vLLM"], self.transformers_version),
            ("engine", ["CUDA", "vLLM"], self.engine),
            ("weight sync", ["engine"], self.weight_sync),
            ("training", ["weight sync"], self.training),
            ("background", ["training"], self.background),
            ("SGLang", [], self.sglang_version),
            ("SGLang server", ["CUDA", "SGLang"], self.sglang_server),
            ("SGLang sync", ["SGLang server"], self.sglang_sync),
            ("SGLang seeds", ["SGLang sync"], self.sglang_seeds),
            ("SGLang sleep", ["SGLang sync"], self.sglang_sleep),
            ("SGLang training", ["SGLang sync"], self.sglang_training),
        ]

    def record(self, name: str, status: str, detail: str) -> None:
        self.rows.append(Row(name, status, detail))
        self.output(f"{name:<15} {status:<6} {detail}")

    def check(self, name: str, needs: list[str], body: Callable[[], str]) -> None:
        failed = [n for n in needs if not any(r.name == n and r.status == "PASS" for r in self.rows)]
        if failed:
            self.record(name, "SKIP", f"needs {', '.join(failed)}")
            return
        try:
            self.record(name, "PASS", body())
        except NotInstalled as error:
            engine = next(e for e, names in ENGINES.items() if name in names[len(COMMON_CHECKS):])
            if engine in self.required:
                self.record(name, "FAIL", str(error))
            else:
                self.record(name, "SKIP", f"{error}; --engine {engine} to require it")
        except Exception as error:   # a check that fails says why in one line, and the next ones go on
            self.record(name, "FAIL", " ".join(f"{type(error).__name__}: {error}".split())[:300])

    def cuda(self) -> str:
        if self.device.type == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("torch.cuda.is_available() is False")
            return (f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
                    f"{torch.cuda.get_device_name(self.device)}")
        return f"torch {torch.__version__} on the CPU (no GPU is checked)"

    def vllm_version(self) -> str:
        import importlib.util
        if importlib.util.find_spec("vllm") is None:
            raise NotInstalled(f"vllm is not installed; pip install -e '.[gpu]' (vllm=={VLLM_VERSION})")
        try:
            import vllm
        except ImportError as error:
            raise RuntimeError(f"vllm does not import ({error}); pip install -e '.[gpu]' (vllm=={VLLM_VERSION})") \
                from None
        if vllm.__version__ != VLLM_VERSION:
            raise RuntimeError(f"found vllm {vllm.__version__}, the engine is written for {VLLM_VERSION} "
                               f"(pip install -e '.[gpu]')")
        return f"vllm {vllm.__version__}"

    def transformers_version(self) -> str:
        import transformers
        low, high = TRANSFORMERS_RANGE
        if not low <= _version(transformers.__version__) < high:
            raise RuntimeError(f"found transformers {transformers.__version__}, vLLM {VLLM_VERSION} needs "
                               f">=5.10.4,<5.18")
        return f"transformers {transformers.__version__}"

    def engine(self) -> str:
        from grpo_edu.runtime.distributed import World
        from grpo_edu.policy.models import STARTING_POLICY, load_policy
        from grpo_edu.sampling.vllm_engine import VLLMEngine
        policy, tokenizer = load_policy(STARTING_POLICY, device=self.device)
        world = World(device=self.device)
        started = time.perf_counter()
        dtype = self.engine_dtype
        self.state["engine"] = VLLMEngine(str(STARTING_POLICY), policy, tokenizer, world, seed=0,
                                          gpu_memory_utilization=0.2, sleep_mode=True, dtype=dtype)
        self.state.update(policy=policy, tokenizer=tokenizer)
        return f"built in {time.perf_counter() - started:.1f} s ({dtype}, gpu_memory_utilization 0.2, sleep mode)"

    def weight_sync(self) -> str:
        engine, policy, tokenizer = self.state["engine"], self.state["policy"], self.state["tokenizer"]
        samples, encoded, sampling = _prompts(tokenizer, self.device)

        def sync_and_sample():
            engine.sync_weights()
            return engine.generate(encoded["input_ids"], encoded["attention_mask"], sampling,
                                   seeds=[1000 + GENERATIONS * b for b in range(len(samples))])

        before = _gap_to(policy, sync_and_sample())
        if not before["sampler_gap/mean_abs"] < GAP_LIMIT:
            raise RuntimeError(f"vLLM's log-probs differ from the trainer's by {before['sampler_gap/mean_abs']:.4f} "
                               f"on average (limit {GAP_LIMIT})")
        old = copy.deepcopy(policy)
        _perturb(policy, seed=0)
        rollout = sync_and_sample()
        after, stale = _gap_to(policy, rollout), _gap_to(old, rollout)["sampler_gap/mean_abs"]
        if not after["sampler_gap/mean_abs"] < GAP_LIMIT:
            raise RuntimeError(f"after a weight change vLLM's log-probs differ from the new policy's by "
                               f"{after['sampler_gap/mean_abs']:.4f} (limit {GAP_LIMIT}): the sync did not take")
        if not stale > MOVED:
            raise RuntimeError(f"after a weight change vLLM's log-probs are within {stale:.4f} of the old policy's "
                               f"(expected > {MOVED}): the sync did not take")
        return (f"gap mean {before['sampler_gap/mean_abs']:.2e}, max ratio {before['sampler_gap/max_ratio']:.4f} "
                f"(limit {GAP_LIMIT}, T = {TEMPERATURE}); after a weight change: {after['sampler_gap/mean_abs']:.2e} "
                f"to the new policy, {stale:.3f} to the old (expected > {MOVED})")

    def train_steps(self, steps: int, *extra: str, engine: str = "vllm") -> list[dict]:
        """`grpo-edu train` with `engine` for `steps` steps, in a process of its own, as a reader
        runs it (one engine per process); its metrics, checked finite and with the gap."""
        import json
        self.state.clear()   # this process's engine, asleep, and its models: memory back for the run's
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        memory = ("vllm_gpu_memory_utilization=0.2" if engine == "vllm"
                  else "sglang_mem_fraction_static=0.2")
        settings = [f"engine={engine}", f"device={self.device.type}", f"steps={steps}", "prompts_per_step=4",
                    "num_generations=4", "eval_size=8", "eval_every=1000", "checkpoint_every=0", "progress=false",
                    memory, *extra]
        with tempfile.TemporaryDirectory() as directory:
            command = [sys.executable, "-m", "grpo_edu", "train", *[f"--set={s}" for s in settings],
                       f"--set=output_dir={directory}/run"]
            done = subprocess.run(command, capture_output=True, text=True, timeout=1800, env=training_environment())
            if done.returncode != 0:
                raise RuntimeError(f"grpo-edu train exited {done.returncode}: "
                                   f"{(done.stderr.strip().splitlines() or ['(no output)'])[-1]}")
            history = [json.loads(line) for line in open(f"{directory}/run/metrics.jsonl")]
        if len(history) != steps or not all(math.isfinite(m["loss"]) for m in history):
            raise RuntimeError(f"expected {steps} steps with finite losses, got {[m.get('loss') for m in history]}")
        if not all("sampler_gap/mean_abs" in m for m in history):
            raise RuntimeError("sampler_gap/mean_abs missing from the steps' metrics")
        return history

    def training(self) -> str:
        from grpo_edu.training.metrics import step_seconds
        history = self.train_steps(2)
        return (f"grpo-edu train --set engine=vllm, 2 steps: losses {history[0]['loss']:.2e}, "
                f"{history[1]['loss']:.2e}; step {step_seconds(history[-1]):.2f} s; "
                f"gap mean {history[-1]['sampler_gap/mean_abs']:.2e}")

    def background(self) -> str:
        from grpo_edu.training.metrics import step_seconds
        lagged = ("rollout_lag=1", "vllm_sleep_mode=false")
        in_turn = self.train_steps(4, *lagged)
        beside = self.train_steps(4, *lagged, "rollout_overlap=true")
        if not all("time/step" in m for m in beside):
            raise RuntimeError("the overlapped run logged no time/step: it did not sample in the background")
        same = [m["reward/mean"] for m in beside] == [m["reward/mean"] for m in in_turn]
        alone, overlapped = (sorted(step_seconds(m) for m in h[1:])[1] for h in (in_turn, beside))
        return (f"rollout_lag = 1, 4 steps: in turn {alone:.2f} s per step, overlapped {overlapped:.2f} s "
                f"(median of steps 2-4); rewards {'the same' if same else 'differ'} step by step; "
                f"gap mean {beside[-1]['sampler_gap/mean_abs']:.2e}")


    # ------------------------------------------------------------------ SGLang
    def sglang_version(self) -> str:
        """Asked of a fresh interpreter, as the server will be started: importing sglang here
        would load its GPU stack into the trainer's process."""
        import importlib.util
        if importlib.util.find_spec("sglang") is None:
            raise NotInstalled(f"sglang is not installed in {sys.executable}; pip install -e '.[sglang]' "
                               f"(sglang=={SGLANG_VERSION}), or run its server elsewhere and set sglang_url")
        done = subprocess.run([sys.executable, "-c", "import sglang; print(sglang.__version__)"],
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise RuntimeError(f"import sglang failed in {sys.executable}: {last}")
        version = done.stdout.strip().splitlines()[-1]
        if version != SGLANG_VERSION:
            raise RuntimeError(f"found sglang {version}, the engine is written for {SGLANG_VERSION} "
                               f"(pip install -e '.[sglang]')")
        return f"sglang {version}"

    def sglang_server(self) -> str:
        from grpo_edu.policy.models import STARTING_POLICY, load_policy
        from grpo_edu.runtime.distributed import World
        from grpo_edu.sampling.sglang_engine import SGLangEngine, Settings
        self.state.clear()   # the vLLM checks' engine and models, if they ran: memory back for the server
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        policy, tokenizer = load_policy(STARTING_POLICY, device=self.device)
        directory = tempfile.mkdtemp(prefix="grpo-edu-doctor-sglang-")   # the server's log and synced weights
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        settings = Settings(device=str(self.device), mem_fraction_static=0.2, weight_sync="disk", sleep=True,
                            deterministic=True, timeout=300.0, start_timeout=900.0, dtype=self.engine_dtype,
                            output_dir=directory)
        started = time.perf_counter()
        engine = SGLangEngine(str(STARTING_POLICY), policy, tokenizer, World(device=self.device), settings,
                              say=lambda message: None)
        seconds = time.perf_counter() - started
        self.state.update(sglang=engine, policy=policy, tokenizer=tokenizer, directory=directory)
        info = engine.client.call("GET", "/server_info")
        return (f"started in {seconds:.1f} s on {self.device} ({self.engine_dtype}), sglang "
                f"{info.get('version', '?')}, deterministic inference "
                f"{info.get('enable_deterministic_inference', '?')}, memory saver {info.get('enable_memory_saver', '?')}")

    def _sglang_sample(self, seeds_from: int = 1000):
        """The server's rollout of the check prompts, each completion seeded."""
        engine, tokenizer = self.state["sglang"], self.state["tokenizer"]
        _, encoded, sampling = _prompts(tokenizer, self.device)
        seeds = list(range(seeds_from, seeds_from + PROMPTS * GENERATIONS))
        return engine.generate(encoded["input_ids"], encoded["attention_mask"], sampling, seeds=seeds)

    def sglang_sync(self) -> str:
        engine, policy = self.state["sglang"], self.state["policy"]
        found = []
        for step, how in enumerate(("disk", "tensor", "disk")):
            previous = copy.deepcopy(policy) if step else None
            if step:   # a new policy each time after the first, so a sync that does not take shows
                _perturb(policy, seed=step)
            engine.settings = dataclasses.replace(engine.settings, weight_sync=how)
            engine.sync_weights()
            rollout = self._sglang_sample()
            now = _gap_to(policy, rollout)["sampler_gap/mean_abs"]
            if not now < GAP_LIMIT:
                raise RuntimeError(f"after a sync from {how}, the server's log-probs differ from the trainer's by "
                                   f"{now:.4f} on average (limit {GAP_LIMIT})"
                                   + (": the sync did not take" if step else ""))
            line = f"{how} {now:.2e}"
            if step:
                stale = _gap_to(previous, rollout)["sampler_gap/mean_abs"]
                if not stale > MOVED:
                    raise RuntimeError(f"after a weight change and a sync from {how}, the server's log-probs are "
                                       f"within {stale:.4f} of the old policy's (expected > {MOVED}): the sync did "
                                       f"not take")
                line += f" (old weights {stale:.3f})"
            found.append(line)
        self.state["reference rollout"] = rollout   # seeds 1000..., the policy as it stays
        return (f"mean |gap| to the trainer at T = {TEMPERATURE} (limit {GAP_LIMIT}): " + ", then ".join(found)
                + f"; each change of weights seen (expected > {MOVED})")

    def sglang_seeds(self) -> str:
        engine, tokenizer = self.state["sglang"], self.state["tokenizer"]
        batch = self.state["reference rollout"]
        engine.sync_weights()   # a sleeping server takes its memory back first
        again = self._sglang_sample()
        if not torch.equal(again.completion_ids, batch.completion_ids):
            raise RuntimeError("the same seeds gave other tokens on a second request: the server does not sample "
                               "by sampling_seed (start it with --enable-deterministic-inference)")
        _, encoded, sampling = _prompts(tokenizer, self.device)
        b = PROMPTS - 1   # the last prompt alone, with the seeds its completions had in the batch
        engine.sync_weights()
        alone = engine.generate(encoded["input_ids"][b:b + 1], encoded["attention_mask"][b:b + 1], sampling,
                                seeds=list(range(1000 + b * GENERATIONS, 1000 + (b + 1) * GENERATIONS)))
        rows = slice(b * GENERATIONS, (b + 1) * GENERATIONS)
        width = alone.completion_ids.shape[1]
        if not (torch.equal(alone.completion_ids, batch.completion_ids[rows, :width])
                and not batch.completion_mask[rows, width:].any()):
            raise RuntimeError("a prompt's completions alone differ from the same seeds' completions in a batch: "
                               "2 processes would not sample what 1 does")
        return (f"{PROMPTS * GENERATIONS} seeded completions the same on a second request, and prompt {b + 1}'s "
                f"{GENERATIONS} the same alone as in the batch")

    def sglang_sleep(self) -> str:
        engine = self.state["sglang"]
        if not engine.settings.sleep:
            raise RuntimeError("the engine was built without sglang_sleep")
        engine.sync_weights()   # awake: weights, KV cache, CUDA graphs
        awake = _free_memory(self.device)
        before = self._sglang_sample(seeds_from=5000)   # released after the rollout
        if not engine.released:
            raise RuntimeError("the engine did not release the server's memory after a rollout")
        asleep = _free_memory(self.device)
        freed = ""
        if awake is not None:
            if not asleep - awake >= SLEEP_FREED:
                raise RuntimeError(f"the GPU's free memory rose by {(asleep - awake) / 2**30:.2f} GiB when the server "
                                   f"slept (expected >= {SLEEP_FREED / 2**30:.0f} GiB): it kept its memory")
            freed = f"{(asleep - awake) / 2**30:.1f} GiB freed while asleep; "
        else:
            freed = f"free memory not measured on {self.device.type} (no CUDA); "
        engine.sync_weights()   # resumed, the same weights loaded again
        after = self._sglang_sample(seeds_from=5000)
        if not torch.equal(before.completion_ids, after.completion_ids):
            raise RuntimeError("after a release and a resume the server samples other tokens with the same seeds and "
                               "weights: what it took back is not what it had")
        return f"{freed}after resuming, the same {after.completion_ids.shape[0]} seeded completions"

    def sglang_training(self) -> str:
        from grpo_edu.training.metrics import step_seconds
        engine = self.state.get("sglang")
        if engine is not None:
            engine.close()   # the training run starts a server of its own
        history = self.train_steps(2, f"sglang_device={self.device.type}", "sglang_sleep=true", engine="sglang")
        return (f"grpo-edu train --set engine=sglang, 2 steps: losses {history[0]['loss']:.2e}, "
                f"{history[1]['loss']:.2e}; step {step_seconds(history[-1]):.2f} s; "
                f"gap mean {history[-1]['sampler_gap/mean_abs']:.2e}")


def _prompts(tokenizer, device: torch.device):
    """The checks' held-out prompts, encoded, and their sampling settings."""
    from grpo_edu.sampling.rollout import SamplingParams
    samples = tasks.make_dataset("arithmetic", n=PROMPTS, split="test", seed=0)
    encoded = tokenizer([s["prompt"] for s in samples], return_tensors="pt", padding=True,
                        add_special_tokens=False).to(device)
    sampling = SamplingParams(num_generations=GENERATIONS, max_new_tokens=MAX_NEW_TOKENS, temperature=TEMPERATURE)
    return samples, encoded, sampling


def _gap_to(model, rollout) -> dict[str, float]:
    """sampler_gap between `model`'s recomputed log-probs of a rollout and the sampler's."""
    from grpo_edu.algorithm.logprobs import completion_logprobs
    from grpo_edu.training.metrics import sampler_gap
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
    mask = torch.cat([rollout.prompt_mask, rollout.completion_mask.long()], 1)
    with torch.no_grad():
        recomputed = completion_logprobs(model, ids, mask, rollout.completion_mask, temperature=TEMPERATURE)
    return sampler_gap(recomputed, rollout.sampler_logp, rollout.completion_mask)


def _perturb(policy, seed: int) -> None:
    """Noise of the weights' own scale on the output layer: a clearly different distribution
    (tied to the embedding in the tiny policy: its input moves too)."""
    with torch.no_grad():
        weight = policy.lm_head.weight
        noise = torch.randn(weight.shape, generator=torch.Generator().manual_seed(seed))
        weight.add_(noise.to(weight.device) * weight.std())


def _free_memory(device: torch.device) -> int | None:
    """The GPU's free bytes (every process's use counted), or None on the CPU."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.mem_get_info(device)[0]


def gpu(output: Callable[[str], None] = print, engines: tuple[str, ...] = ("vllm", "sglang"),
        required: tuple[str, ...] = ()) -> int:
    """`grpo-edu doctor --gpu [--engine E]`: 0 when every check that ran passed and at least one
    engine was checked (or there is no GPU to check), else 1. required: the engines --engine named."""
    if not torch.cuda.is_available():
        return _without_gpu(output, engines, required)
    rows = run_checks(torch.device("cuda", 0), output, engines=engines, required=required)
    if any(r.status == "FAIL" for r in rows):
        return 1
    if not engines_checked(rows):
        output("no engine was checked: install one (pip install -e '.[gpu]' for vLLM, '.[sglang]' for SGLang)")
        return 1
    return 0


def _without_gpu(output: Callable[[str], None], engines: tuple[str, ...], required: tuple[str, ...]) -> int:
    """No GPU: the checks that need none run (which engines are installed, and their versions);
    every other one is listed, with what it would check, as not run. Exits 0: nothing was checked."""
    checks = Checks(torch.device("cpu"), output, "bfloat16", required)
    described = dict(CHECKS)
    output(f"{'check':<15} {'result':<6} detail")
    skipped = []
    for name, needs, body in checks.in_order():
        if not any(name in ENGINES[engine] for engine in engines):
            continue
        if name in NO_GPU_NEEDED:   # what it needs that needs no GPU either (transformers' range is vLLM's)
            checks.check(name, [n for n in needs if n in NO_GPU_NEEDED], body)
        else:
            checks.record(name, "SKIP", f"needs a GPU, not run here: {described[name]}")
            skipped.append(name)
    output(f"no GPU found (torch.cuda.is_available() is False): {len(skipped)} checks need one and did not run "
           f"({', '.join(skipped)})")
    return 0
