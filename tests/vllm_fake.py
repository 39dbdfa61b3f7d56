"""The fake vllm package (tests/fake_vllm) for tests: importable in this process, or in a
subprocess through PYTHONPATH; removed again afterwards."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

FAKE_VLLM = Path(__file__).resolve().parent / "fake_vllm"
LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _forget_vllm() -> None:
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]


@contextmanager
def fake_vllm():
    """`import vllm` gives the fake inside the block (its CALLS list emptied); torchrun's
    variables the engine sets for a world of one are removed again afterwards."""
    saved = {k: os.environ.get(k) for k in LAUNCHER_VARIABLES}
    _forget_vllm()
    sys.path.insert(0, str(FAKE_VLLM))
    try:
        import vllm
        vllm.CALLS.clear()
        yield vllm
    finally:
        sys.path.remove(str(FAKE_VLLM))
        _forget_vllm()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def environment_with_fake(**extra: str) -> dict:
    """os.environ for a subprocess in which `import vllm` gives the fake."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FAKE_VLLM), env.get("PYTHONPATH")]))
    env.update(extra)
    return env
