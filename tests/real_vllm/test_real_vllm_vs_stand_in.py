"""The main suite's stand-in (tests/fake_vllm) against vLLM's CPU build: the same scenarios
(scenarios.py) through the engine on both, and what they return compared.

The stand-in samples as vLLM does (argmax(probs / q), q ~ Exp(1) from each request's own
generator, child j of a request seeded seed + j), so with the same seeds and weights both
return the same tokens, and their log-probs agree to float32 rounding. vLLM runs here as a
reader's machine runs it: compiled by inductor (the rest of the tier runs it eagerly).

Where they differ, by decision (each one tested):
- generate while the engine sleeps: the stand-in raises, vLLM waits forever; the engine
  refuses first, so both return the engine's error;
- load_weights then generate without reset_prefix_cache: the stand-in refuses (stale prefixes);
  vLLM would sample from the old weights' cached prefixes (on the tiny policy no prefix is
  ever cached: a CPU KV block is longer than its context, test_real_vllm_engine.py);
- sleep level 2 with sleep mode: the stand-in discards the weights (NaN until loaded again), as
  vLLM does on a GPU; on the CPU (the shim) nothing is released;
- the stand-in ignores gpu_memory_utilization; vLLM's CPU build sizes its KV cache from the
  NUMA node's memory (test_real_vllm_cpu_build.py).
Not proven on a CPU: memory release in sleep mode, GPU weight loading and kernels, bf16, NCCL.
"""

import json
import sys

import pytest

from real_vllm_support import HERE, STAND_IN, environment, run
from hang_guard import HANG_SECONDS


def scenarios(*, stand_in: bool) -> dict:
    env = environment(stand_in=stand_in)
    if not stand_in:
        env.pop("VLLM_CPU_CI_ENV")   # vLLM's default on a CPU: inductor compiles the model
    done = run([sys.executable, str(HERE / "scenarios.py")], env=env, timeout=HANG_SECONDS)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def both():
    stand_in, real = scenarios(stand_in=True), scenarios(stand_in=False)
    assert str(STAND_IN) in stand_in["vllm"] and str(STAND_IN) not in real["vllm"]
    return stand_in, real


def same_rollout(a: dict, b: dict) -> None:
    assert a["ids"] == b["ids"]
    assert a["finished"] == b["finished"]
    worst = max(abs(x - y) for row_a, row_b in zip(a["logprobs"], b["logprobs"]) for x, y in zip(row_a, row_b))
    assert worst < 2e-5, f"log-probs differ by {worst:.2e}"


def test_the_same_seeds_give_the_same_rollout(both):
    stand_in, real = both
    same_rollout(stand_in["rollout"], real["rollout"])
    assert stand_in["rollout"]["gap_to_policy"] < 1e-5 and real["rollout"]["gap_to_policy"] < 1e-5


def test_after_a_weight_change_both_sample_the_new_policy(both):
    stand_in, real = both
    same_rollout(stand_in["after_weight_change"], real["after_weight_change"])
    for side in both:
        assert side["after_weight_change"]["gap_to_policy"] < 1e-4
        assert side["after_weight_change"]["gap_to_old_policy"] > 1.0


def test_randomness_is_handled_alike(both):
    """Both reseed the process when built (the engine restores it); vLLM's own seeded generate
    moves torch's RNG by a batch-dependent amount on both; the engine's does not; n children
    with seed s are n requests with seeds s..s+n-1; unseeded, the process's RNG decides."""
    stand_in, real = both
    for key in ("build_keeps_rng", "seeded_generate_keeps_rng", "vllm_generate_moves_rng", "vllm_moves_rng_by_batch",
                "unseeded_same_rng_same_rollout", "reset_prefix_cache"):
        assert stand_in[key] == real[key], key
    assert real["build_keeps_rng"] is True and real["seeded_generate_keeps_rng"] == {"4": True, "2": True}
    assert real["vllm_generate_moves_rng"] == {"4": True, "2": True} and real["vllm_moves_rng_by_batch"] is True
    assert real["unseeded_same_rng_same_rollout"] is True
    assert stand_in["n_children"] == stand_in["n_requests"] == real["n_children"] == real["n_requests"]


def test_generate_while_asleep_is_the_engines_refusal_on_both(both):
    stand_in, real = both
    assert stand_in["generate_asleep"] == real["generate_asleep"]
    assert real["generate_asleep"].startswith("VLLMEngine.generate: the engine's weights sleep")
