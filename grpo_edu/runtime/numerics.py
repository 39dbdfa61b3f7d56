"""The book's numerical environment: the same floating-point kernels on every x86-64 machine.

A training run's trajectory depends on which CPU kernels compute it. Matrix products and
vectorised elementwise kernels round differently for different instruction sets (AVX2,
AVX-512, AMX) and vendors, and GRPO amplifies a difference in the last bit into a
different sample a few steps later: the chapter-6 run ends at 0.7734 on one machine and
0.7539 on another. So the book (`grpo-edu book run` / `check`, nbval over chapters/) runs
every chapter with the kernels pinned, before any library is loaded:

    variable               value        what it fixes
    ATEN_CPU_CAPABILITY    avx2         PyTorch's own vectorised kernels (elementwise ops,
                                        softmax, reductions, attention, Sleef's exp/log)
    MKL_CBWR               COMPATIBLE   MKL's code branch for matrix products (and VML):
                                        the only branch MKL keeps identical on Intel and
                                        non-Intel CPUs (its AVX2 branch is Intel-only and
                                        silently falls back to AUTO elsewhere)
    OPENBLAS_CORETYPE      Haswell      NumPy's OpenBLAS kernels (dot, matmul)
    NPY_DISABLE_CPU_FEATURES  AVX-512   NumPy's own SIMD loops (exp, log, tanh, sums) at
                                        their AVX2 level: its AVX-512 loops round differently
    ONEDNN_MAX_CPU_ISA     AVX2         oneDNN; unused by the book's float32 paths today
                                        (measured), pinned so that a future path cannot
                                        bring AMX or AVX-512 in unnoticed
    OMP/MKL/OPENBLAS_NUM_THREADS 1      a fixed thread count (chapters set torch's own);
    MKL_DYNAMIC            FALSE        MKL may not choose fewer threads than asked: its
                                        reproducibility holds for a fixed thread count

What is deliberately not pinned: `grpo-edu train`, which keeps the machine's fastest
kernels: a user's run needs reproducibility on one machine (same seed, same threads,
same weights), not equality with ours. Every piece that is pinned is shown necessary by
tests/test_numerics.py: leave it out and a short training run's weights change with the
kernels the machine offers.

The pin needs x86-64 with AVX2 and FMA (every Intel CPU since 2013 and AMD since 2015).
Elsewhere (Apple silicon, ARM Linux) `unpinnable_reason()` says why, and the book's
checks compare exactly only the cells that do not depend on the platform's kernels; cells
tagged `platform-numerics` are executed and their claims checked, not their digits.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

# The torch release the book is built and checked with: the Makefile's TORCH, and the release
# vllm==0.31.0 (the gpu extra) pins. tests/test_book.py keeps the two equal.
TORCH_PIN = "torch==2.13.0"

PINNED_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "COMPATIBLE",
    "OPENBLAS_CORETYPE": "Haswell",
    # Every AVX-512 dispatch target a NumPy 1.26 to 2.x build may have (names it does not
    # know are ignored), so its loops stop at X86_V3 (AVX2 + FMA). Commas, not spaces (NumPy
    # takes either): `env $(python -m grpo_edu.runtime.numerics)` splits the line at spaces.
    "NPY_DISABLE_CPU_FEATURES": "X86_V4,AVX512F,AVX512CD,AVX512_KNL,AVX512_KNM,AVX512_SKX,"
                                "AVX512_CLX,AVX512_CNL,AVX512_ICL,AVX512_SPR",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_DYNAMIC": "FALSE",
}

# The cell tag of a chapter cell whose printed numbers depend on the floating-point
# kernels (training trajectories, samples): exact under the pin, checked by claims elsewhere.
PLATFORM_TAG = "platform-numerics"

_REQUIRED_FLAGS = ("avx2", "fma")


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags (Linux), or None where /proc/cpuinfo is not readable."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return None


def unpinnable_reason() -> str | None:
    """None if this machine can run the pinned environment; else why not, in one line."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return f"this machine is {platform.system()} {platform.machine()}, the pin needs x86-64"
    if sys.platform != "linux":
        return f"this machine runs {sys.platform}; the pin is checked on x86-64 Linux only"
    flags = cpu_flags()
    if flags is None:
        return "cannot read /proc/cpuinfo to confirm AVX2 and FMA"
    missing = [flag for flag in _REQUIRED_FLAGS if flag not in flags]
    if missing:
        return f"this CPU lacks {', '.join(missing)} (the pin needs AVX2 and FMA)"
    return None


def pinned_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with the kernels pinned.

    The pin overrides whatever `base` says about the same variables: a reader's shell
    that asks for ATEN_CPU_CAPABILITY=avx512 still gets the book's numbers.
    """
    env = dict(os.environ if base is None else base)
    env.update(PINNED_ENV)
    return env


def active_pin_problems() -> list[str]:
    """Inside a process that should run pinned: what is not as pinned (empty = all set).

    Environment variables are read once, when each library loads, so a pin set after
    torch was imported does nothing; this checks what torch actually dispatches to.
    """
    problems = [f"{key}={os.environ.get(key)!r}, expected {value!r}"
                for key, value in PINNED_ENV.items() if os.environ.get(key) != value]
    if "torch" in sys.modules:
        import torch
        capability = torch.backends.cpu.get_cpu_capability()
        if capability != "AVX2":
            problems.append(f"torch dispatches to {capability} kernels, expected AVX2")
    return problems


if __name__ == "__main__":
    # `env $(python -m grpo_edu.runtime.numerics) jupyter lab`: the book's kernels for an
    # interactive session (make book), so that re-running a chapter prints its committed numbers.
    reason = unpinnable_reason()
    if reason is None:
        print(" ".join(f"{key}={value}" for key, value in PINNED_ENV.items()))
    else:
        print(f"grpo_edu.runtime.numerics: no pinned kernels ({reason}); training chapters will print "
              f"numbers of their own here", file=sys.stderr)
