"""What vLLM's CPU build lacks, measured without the shim (cpu_build_probe.py, one process), and
what the engine and `grpo-edu train` then say: one line, naming what to do.

These are the reasons for cpu_shim/: sleep mode is refused; every linear layer's weight is
repacked at load time, so the trainer's weights cannot be loaded afterwards; a generate while
the engine is paused never returns (the engine refuses it first: test_real_vllm_engine.py).
"""

import json
import re
import sys

import pytest

from real_vllm_support import BIN, HERE, environment, run
from hang_guard import HANG_SECONDS

LINEAR = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


@pytest.fixture(scope="module")
def probe():
    env = environment(shim=False)
    env.pop("VLLM_CPU_KVCACHE_SPACE")   # the first engine sizes its KV cache itself: measured below
    done = run([sys.executable, str(HERE / "cpu_build_probe.py")], env=env, timeout=HANG_SECONDS)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert "error" not in found, found["error"]
    assert found["plugins"].find("cpu_shim") < 0, "the probe must run without the shim"
    return found, done.stdout


def test_sleep_mode_is_refused(probe):
    found, _ = probe
    assert "Sleep mode is not supported on current platform" in found["sleep_mode"]
    assert found["engine_sleep_True"].startswith("config key 'vllm_sleep_mode' is true but this vLLM has no sleep "
                                                 "mode ('Sleep mode is not supported on current platform'): "
                                                 "vLLM's CPU build cannot serve")


def test_linear_weights_are_repacked_so_nothing_loads_after_start_up(probe):
    """Every linear layer becomes a size-0 parameter without a weight_loader (the kernels hold
    packed copies); the embedding and the norms keep their weights (the norms lose their
    weight_loader too, and load through the default loader)."""
    found, _ = probe
    assert found["model_class"] == "vllm.model_executor.models.llama.LlamaForCausalLM"
    expected = sorted(f"model.layers.{i}.{name}.weight" for i in (0, 1) for name in LINEAR)
    assert found["empty"] == expected
    assert set(expected) <= set(found["no_weight_loader"])
    assert "model.embed_tokens.weight" not in found["no_weight_loader"]
    assert found["load_q_proj"] == "AttributeError: 'Parameter' object has no attribute 'weight_loader'"
    assert found["engine_sleep_False"].startswith(
        "vLLM repacked its weights at load time (model.layers.0.self_attn.qkv_proj.weight is empty), so the "
        "trainer's weights cannot be loaded into it: vLLM's CPU build cannot serve")


def test_the_tied_head_keeps_its_packed_copy(probe):
    """The embedding loads, the head it is tied to does not follow: vLLM's log-probs are far from
    the policy whose embedding and head both changed (with the shim: ~1e-6)."""
    found, _ = probe
    assert found["tied_head_gap"] > 0.05


def test_a_seeded_generate_moves_torchs_global_rng_by_an_amount_that_depends_on_the_batch(probe):
    """vLLM's CPU sampler draws noise for the whole batch from the global RNG, every request
    seeded or not: the reason VLLMEngine.generate restores the trainer's RNG."""
    found, _ = probe
    assert found["rng_moved"] == {"4": True, "2": True}
    assert found["rng_next_draw"]["4"] != found["rng_next_draw"]["2"]


def test_the_kv_cache_is_a_fraction_of_the_nodes_memory_minus_the_processs(probe):
    """gpu_memory_utilization x the NUMA node's memory, less what the process holds already
    (VLLM_CPU_KVCACHE_SPACE sets it instead, in GiB: the tier's 1)."""
    _, log = probe
    auto = re.search(r"Auto set \(([\d.]+)/([\d.]+)\) GiB for KV cache on node \d+, with ([\d.]+) GiB requested "
                     r"memory for the worker\. ([\d.]+) GiB memory was consumed by non-kv usages", log)
    assert auto, "vLLM's KV cache line not found"
    kv, node, requested, consumed = map(float, auto.groups())
    assert requested == pytest.approx(0.15 * node, abs=0.01)   # the probe's gpu_memory_utilization
    assert kv == pytest.approx(requested - consumed, abs=0.015)
    assert "Explicitly set (1.0/" in log


def test_two_live_engines_in_one_process(probe):
    """Both generate (with VLLM_CPU_KVCACHE_SPACE set: sized from what is left, the second engine
    of a process may find no memory for its KV cache)."""
    found, _ = probe
    assert found["two_live_engines_generate"] == [4, 4]


def test_without_sleep_mode_sleep_pauses_and_generate_while_paused_never_returns(probe):
    """The CPU worker's sleep is a no-op; the engine core still pauses its scheduler until every
    tag is awake again. A generate meanwhile waits (here 20 s, busy) and would wait forever:
    the stand-in raises instead, and the engine refuses before asking (its own test)."""
    found, _ = probe
    assert found["asleep_after_sleep"] is True and found["asleep_after_waking_weights"] is True
    assert found["generate_while_asleep_returned"] is False
    assert found["generate_while_asleep_waited_s"] >= 20
    assert found["cpu_busy_while_waiting"] > 0.3, "it spins rather than sleeps"


@pytest.mark.parametrize("sleep_mode", ["true", "false"])
def test_grpo_edu_train_with_the_cpu_build_is_one_line(tmp_path, sleep_mode):
    """`grpo-edu train --set engine=vllm` with vLLM's CPU build and no shim: exit 2 and one line
    saying why and what to use instead (not a traceback from inside vLLM)."""
    done = run([str(BIN / "grpo-edu"), "train", "--set", "engine=vllm", "--set", "steps=1", "--set",
                f"vllm_sleep_mode={sleep_mode}", "--set", f"output_dir={tmp_path / 'run'}"],
               env=environment(shim=False), cwd=tmp_path, check=False, timeout=HANG_SECONDS)
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("grpo-edu train: engine: ")
    assert ("config key 'vllm_sleep_mode' is true" if sleep_mode == "true" else "vLLM repacked its weights") in last
    assert last.endswith("on a CPU, train with engine = 'fused' or 'hf'")
