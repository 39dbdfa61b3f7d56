"""`grpo-edu doctor --gpu`: the check a reader runs on a GPU machine before training with vLLM.

Each check prints one row (PASS, FAIL, or SKIP when an earlier failure leaves it nothing to
stand on) with what it measured; the command exits 0 when all pass, 1 otherwise. Without a
GPU it lists what it would check, says "no GPU found" and exits 0. `run_checks(device)` takes
the device, so the same sequence runs on the CPU: against the tests' stand-in vllm
(tests/test_doctor.py) and against vLLM's CPU build (tests/real_vllm, with its test-side shim:
the CPU build has no sleep mode and cannot load weights after start-up; without the shim the
engine check fails saying so).
"""

from __future__ import annotations

import copy
import gc
import math
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

import torch

from grpo_edu.environment import tasks
from grpo_edu.sampling.vllm_engine import VLLM_VERSION

TRANSFORMERS_RANGE = ((5, 10, 4), (5, 18, 0))   # what vllm==0.31.0 requires: >=5.10.4,<5.18
GAP_LIMIT = 0.05        # sampler_gap/mean_abs allowed between vLLM (bf16) and a float32 trainer
MOVED = 10 * GAP_LIMIT  # after the perturbation, vLLM's log-probs are at least this far (mean) from the old policy's
TEMPERATURE = 0.7       # not 1: vLLM must report log softmax(logits / T), what it sampled from
PROMPTS, GENERATIONS, MAX_NEW_TOKENS = 4, 4, 16   # the weight-sync check's held-out prompts and completions
# torchrun's variables: the engine sets them for its world of one (vLLM's external_launcher binds
# MASTER_PORT); the training check's own process must choose its own.
LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

CHECKS = [
    ("CUDA", "torch sees a GPU: torch and CUDA versions, the device's name"),
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
               engine_dtype: str = "bfloat16") -> list[Row]:
    """Run every check on `device`, printing each row as it completes. engine_dtype: vLLM's
    (bf16, as the trainer's GPU runs; the tests' quick runs of the stand-in on the CPU: float32)."""
    checks = Checks(device, output, engine_dtype)
    output(f"{'check':<13} {'result':<6} detail")
    for name, needs, body in checks.in_order():
        checks.check(name, needs, body)
    passed = sum(r.status == "PASS" for r in checks.rows)
    output(f"\n{passed} of {len(checks.rows)} checks passed")
    return checks.rows


class Checks:
    """The checks, each a method that returns its row's detail or raises; a check runs only when
    the checks it needs passed (`in_order` says which)."""

    def __init__(self, device: torch.device, output: Callable[[str], None], engine_dtype: str):
        self.device, self.output, self.engine_dtype = device, output, engine_dtype
        self.rows: list[Row] = []
        self.state: dict = {}   # the engine, the policy and its tokenizer, between checks

    def in_order(self) -> list[tuple[str, list[str], Callable[[], str]]]:
        return [
            ("CUDA", [], self.cuda),
            ("vLLM", [], self.vllm_version),
            ("transformers", [], self.transformers_version),
            ("engine", ["CUDA", "vLLM"], self.engine),
            ("weight sync", ["engine"], self.weight_sync),
            ("training", ["weight sync"], self.training),
            ("background", ["training"], self.background),
        ]

    def record(self, name: str, status: str, detail: str) -> None:
        self.rows.append(Row(name, status, detail))
        self.output(f"{name:<13} {status:<6} {detail}")

    def check(self, name: str, needs: list[str], body: Callable[[], str]) -> None:
        failed = [n for n in needs if not any(r.name == n and r.status == "PASS" for r in self.rows)]
        if failed:
            self.record(name, "SKIP", f"needs {', '.join(failed)}")
            return
        try:
            self.record(name, "PASS", body())
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
        from grpo_edu.algorithm.logprobs import completion_logprobs
        from grpo_edu.sampling.rollout import SamplingParams
        from grpo_edu.training.metrics import sampler_gap
        engine, policy, tokenizer = self.state["engine"], self.state["policy"], self.state["tokenizer"]
        samples = tasks.make_dataset("arithmetic", n=PROMPTS, split="test", seed=0)
        encoded = tokenizer([s["prompt"] for s in samples], return_tensors="pt", padding=True,
                            add_special_tokens=False).to(self.device)
        sampling = SamplingParams(num_generations=GENERATIONS, max_new_tokens=MAX_NEW_TOKENS,
                                  temperature=TEMPERATURE)

        def gap_to(model, rollout) -> dict[str, float]:
            ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
            mask = torch.cat([rollout.prompt_mask, rollout.completion_mask.long()], 1)
            with torch.no_grad():
                recomputed = completion_logprobs(model, ids, mask, rollout.completion_mask,
                                                 temperature=TEMPERATURE)
            return sampler_gap(recomputed, rollout.sampler_logp, rollout.completion_mask)

        def sync_and_sample():
            engine.sync_weights()
            return engine.generate(encoded["input_ids"], encoded["attention_mask"], sampling,
                                   seeds=[1000 + GENERATIONS * b for b in range(len(samples))])

        before = gap_to(policy, sync_and_sample())
        if not before["sampler_gap/mean_abs"] < GAP_LIMIT:
            raise RuntimeError(f"vLLM's log-probs differ from the trainer's by {before['sampler_gap/mean_abs']:.4f} "
                               f"on average (limit {GAP_LIMIT})")
        old = copy.deepcopy(policy)
        with torch.no_grad():   # noise of the weights' own scale: a clearly different distribution
            weight = policy.lm_head.weight   # tied to the embedding in the tiny policy: its input moves too
            noise = torch.randn(weight.shape, generator=torch.Generator().manual_seed(0))
            weight.add_(noise.to(weight.device) * weight.std())
        rollout = sync_and_sample()
        after, stale = gap_to(policy, rollout), gap_to(old, rollout)["sampler_gap/mean_abs"]
        if not after["sampler_gap/mean_abs"] < GAP_LIMIT:
            raise RuntimeError(f"after a weight change vLLM's log-probs differ from the new policy's by "
                               f"{after['sampler_gap/mean_abs']:.4f} (limit {GAP_LIMIT}): the sync did not take")
        if not stale > MOVED:
            raise RuntimeError(f"after a weight change vLLM's log-probs are within {stale:.4f} of the old policy's "
                               f"(expected > {MOVED}): the sync did not take")
        return (f"gap mean {before['sampler_gap/mean_abs']:.2e}, max ratio {before['sampler_gap/max_ratio']:.4f} "
                f"(limit {GAP_LIMIT}, T = {TEMPERATURE}); after a weight change: {after['sampler_gap/mean_abs']:.2e} "
                f"to the new policy, {stale:.3f} to the old (expected > {MOVED})")

    def train_steps(self, steps: int, *extra: str) -> list[dict]:
        """`grpo-edu train` with engine = 'vllm' for `steps` steps, in a process of its own, as a
        reader runs it (one vLLM engine per process); its metrics, checked finite and with the gap."""
        import json
        import subprocess
        import sys
        self.state.clear()   # this process's engine, asleep, and its models: memory back for the run's
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        settings = ["engine=vllm", f"device={self.device.type}", f"steps={steps}", "prompts_per_step=4",
                    "num_generations=4", "eval_size=8", "eval_every=1000", "checkpoint_every=0", "progress=false",
                    "vllm_gpu_memory_utilization=0.2", *extra]
        with tempfile.TemporaryDirectory() as directory:
            command = [sys.executable, "-m", "grpo_edu", "train", *[f"--set={s}" for s in settings],
                       f"--set=output_dir={directory}/run"]
            done = subprocess.run(command, capture_output=True, text=True, timeout=1800, env=training_environment())
            if done.returncode != 0:
                raise RuntimeError(f"grpo-edu train exited {done.returncode}: "
                                   f"{(done.stderr.strip().splitlines() or ['(no self.output)'])[-1]}")
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


def gpu(output: Callable[[str], None] = print) -> int:
    """`grpo-edu doctor --gpu`: 0 when every check passes (or there is no GPU to check), else 1."""
    if not torch.cuda.is_available():
        output("grpo-edu doctor --gpu checks, on a machine with an NVIDIA GPU:")
        for name, what in CHECKS:
            output(f"  {name:<13} {what}")
        output("no GPU found (torch.cuda.is_available() is False): nothing was checked")
        return 0
    rows = run_checks(torch.device("cuda", 0), output)
    return 0 if all(r.status == "PASS" for r in rows) else 1
