"""What the real-vLLM tier's tests share: where things are, the environment of the processes
they start (with or without the CPU shim, or with the stand-in instead), and a runner."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
ROOT = TESTS.parent
SHIM = HERE / "cpu_shim"             # the vLLM plugin that stands in for what the CPU build lacks
STAND_IN = TESTS / "fake_vllm"        # the main suite's stand-in vllm
BIN = Path(sys.executable).parent     # the tier's venv: its grpo-edu and torchrun
LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

if str(TESTS) not in sys.path:   # the main suite's helpers (hang_guard, test_engines, ...)
    sys.path.insert(0, str(TESTS))
from hang_guard import HANG_SECONDS  # noqa: E402

# Set for every process of the tier (conftest.py puts them in os.environ, so the processes the
# library itself starts, such as the doctor's training check, inherit them too).
TIER_ENVIRONMENT = {
    # vLLM's own switch for CPU CI: the model is traced once by dynamo and run eagerly instead of
    # compiled by inductor (an engine starts in ~15 s instead of 35-65 s). One test runs the
    # compiled path (test_real_vllm_vs_stand_in.py).
    "VLLM_CPU_CI_ENV": "1",
    # vLLM's CPU KV cache, in GiB (default: vllm_gpu_memory_utilization of the NUMA node's
    # memory minus the process's, several GiB per engine).
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "OMP_NUM_THREADS": "1",
    "PYTHONHASHSEED": "0",
}


def real_vllm_installed() -> bool:
    """A vllm that is not the stand-in is importable (vLLM's CPU build, in the tier's venv)."""
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None and STAND_IN not in Path(spec.origin).parents


def environment(*, shim: bool = True, stand_in: bool = False, **extra: str) -> dict:
    """os.environ for a process of the tier: the repository importable, the shim's plugin found
    (shim) or not, the stand-in instead of vLLM (stand_in), no torchrun variables."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p) not in (SHIM, STAND_IN)]
    front = ([str(STAND_IN)] if stand_in else []) + ([str(SHIM)] if shim and not stand_in else [])
    env["PYTHONPATH"] = os.pathsep.join(front + [str(ROOT)] + [p for p in paths if p != str(ROOT)])
    env.update(TIER_ENVIRONMENT)
    env.update(extra)
    return env


def run(command: list[str], *, env: dict, cwd: Path | str = ROOT, timeout: int = HANG_SECONDS,
        check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-6000:]}"
    return done


def vllm_lines(text: str) -> list[str]:
    """A process's stderr without vLLM's and torch's own logging."""
    noise = ("INFO ", "WARNING ", "DEBUG ", "Warning:", "Loading safetensors", "Triton is installed",
             "FutureWarning", "warnings.warn", "[W", "[rank")
    return [line for line in text.splitlines()
            if line.strip() and not any(mark in line for mark in noise) and not line.startswith((" ", "("))]
