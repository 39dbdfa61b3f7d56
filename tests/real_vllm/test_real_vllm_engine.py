"""VLLMEngine against vLLM's CPU build, in this process: the engine contract every engine passes
(tests/test_engines.py, run here on the real library), and what the engine relies on vLLM for.

With the shim (cpu_shim/): sleep mode accepted, linear weights kept where load_weights writes.
So NOT proven here, for every test below that builds the engine: real memory release in
sleep mode (the CPU worker's sleep is a no-op, only the scheduler pauses), the GPU
weight-loading path and kernels (the CPU computes with float32 F.linear on the loaded weights),
bf16 GPU kernels, NCCL. What IS vLLM's own here: the engine core, scheduler, sampler, log-probs,
per-request seeds, prefix cache calls, load_weights' name mapping (q/k/v into qkv_proj,
gate/up into gate_up_proj, the tied head), and sleep/wake bookkeeping.
"""

import contextlib
import random

import numpy
import pytest
import torch

import test_engines
from grpo_edu.environment import tasks
from grpo_edu.sampling import vllm_engine
from grpo_edu.runtime.distributed import World
from grpo_edu.algorithm.logprobs import completion_logprobs
from grpo_edu.policy.models import STARTING_POLICY, load_policy
from grpo_edu.sampling.rollout import SamplingParams

G, L, T = 4, 12, 0.7
NOT_PROVEN = "not proven on a CPU: memory release in sleep mode, GPU weight loading and kernels, bf16, NCCL"


@pytest.fixture
def real_vllm_for_the_contract(monkeypatch):
    monkeypatch.setattr(test_engines, "VLLM", contextlib.nullcontext)   # the installed vllm, not the stand-in


@pytest.mark.parametrize("contract", [test_engines.test_engine_contract,
                                      test_engines.test_sync_weights_makes_the_engine_sample_from_the_current_weights,
                                      test_engines.test_same_seed_same_rollout], ids=lambda f: f.__name__[5:])
def test_the_engine_contract(contract, real_vllm_for_the_contract):
    """tests/test_engines.py's checks of the vllm engine (sleep mode on, float32), on vLLM: token
    ids in and out, prompt-major rows, masks and finished flags, log-probs of softmax(logits / T)
    equal to the trainer's recomputation, sync_weights reaching the sampler, same seed same
    rollout. (Not proven on a CPU: memory release in sleep mode, GPU weight loading and
    kernels, bf16, NCCL.)"""
    contract("vllm", test_engines.make_prompts())


@pytest.fixture(scope="module")
def setup():
    policy, tokenizer = load_policy(STARTING_POLICY)
    torch.manual_seed(123)
    random.seed(123)
    numpy.random.seed(123)
    expected = (torch.rand(3), random.random(), numpy.random.rand())
    torch.manual_seed(123)
    random.seed(123)
    numpy.random.seed(123)
    engine = vllm_engine.VLLMEngine(str(STARTING_POLICY), policy, tokenizer, World(), seed=0,
                                    gpu_memory_utilization=0.3, sleep_mode=True, dtype="float32")
    after_build = (torch.rand(3), random.random(), numpy.random.rand())
    samples = tasks.make_dataset("arithmetic", n=4, split="test", seed=0)
    encoded = tokenizer([s["prompt"] for s in samples], return_tensors="pt", padding=True, add_special_tokens=False)
    return dict(policy=policy, tokenizer=tokenizer, engine=engine, ids=encoded["input_ids"],
                mask=encoded["attention_mask"], expected=expected, after_build=after_build)


def gap(policy, rollout, temperature=T) -> float:
    full = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
    attention = torch.cat([rollout.prompt_mask, rollout.completion_mask.long()], 1)
    with torch.no_grad():
        recomputed = completion_logprobs(policy, full, attention, rollout.completion_mask, temperature=temperature)
    return float((recomputed - rollout.sampler_logp)[rollout.completion_mask].abs().max())


def roll_out(s, seeds, rows=slice(None)):
    s["engine"].sync_weights()
    return s["engine"].generate(s["ids"][rows], s["mask"][rows], SamplingParams(G, L, T), seeds=seeds)


def test_the_engine_reaches_vllms_own_model(setup):
    """llm_engine.model_executor.driver_worker.model_runner.get_model(): vLLM's Llama, every
    trainer parameter loaded into it by name (q/k/v stacked into qkv_proj, gate/up into
    gate_up_proj, the tied head with the embedding)."""
    engine = setup["engine"]
    engine.sync_weights()   # wakes the weights
    model = engine._model()
    assert f"{type(model).__module__}.{type(model).__qualname__}" == "vllm.model_executor.models.llama.LlamaForCausalLM"
    names = {name for name, _ in model.named_parameters()}
    assert "model.layers.0.self_attn.qkv_proj.weight" in names and "model.layers.0.mlp.gate_up_proj.weight" in names
    loaded = set()
    for name, tensor in vllm_engine.named_weights(setup["policy"]):
        loaded |= model.load_weights(weights=[(name, tensor)])
    engine.llm.reset_prefix_cache()
    assert loaded == names


def test_building_the_engine_leaves_the_trainers_rng_as_it_was(setup):
    """vLLM seeds Python, NumPy and torch when it builds (set_random_seed): the engine puts the
    trainer's states back."""
    expected, got = setup["expected"], setup["after_build"]
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]


def test_a_seeded_generate_leaves_the_trainers_rng_as_it_was(setup):
    """The RNG fix: vLLM's CPU sampler draws the whole batch's noise from torch's RNG even with
    every request seeded (test_real_vllm_cpu_build.py measures it); generate puts Python's,
    NumPy's and torch's states back, for any batch size. Fails without the fix. (Not proven
    on a CPU: memory release in sleep mode, GPU weight loading and kernels, bf16, NCCL.)"""
    for count in (4, 2, 1):
        torch.manual_seed(7)
        random.seed(7)
        numpy.random.seed(7)
        states = (torch.get_rng_state(), random.getstate(), numpy.random.get_state()[1].copy())
        roll_out(setup, [3 + G * b for b in range(count)], slice(0, count))
        assert torch.equal(torch.get_rng_state(), states[0]), f"a {count}-prompt rollout moved torch's RNG"
        assert random.getstate() == states[1]
        assert (numpy.random.get_state()[1] == states[2]).all()


def test_unseeded_vllm_samples_from_the_process_rng(setup):
    """Without seeds the engine leaves vLLM's draws alone: the same RNG state, the same rollout."""
    draws = []
    for _ in range(2):
        torch.manual_seed(11)
        setup["engine"].sync_weights()
        draws.append(setup["engine"].generate(setup["ids"], setup["mask"], SamplingParams(G, L, T)).completion_ids)
    assert torch.equal(draws[0], draws[1])


def test_processed_logprobs_are_the_trainers_log_softmax_at_the_temperature(setup):
    """logprobs_mode = processed_logprobs at T = 0.7: vLLM's float32 log-probs against the
    trainer's recomputation (measured 3.9e-6 max here); T = 1's are far off. (Not proven on a
    CPU: the gap of vLLM's bf16 GPU kernels, which `grpo-edu doctor --gpu` bounds at 0.05.)"""
    rollout = roll_out(setup, [99 + G * b for b in range(4)])
    assert gap(setup["policy"], rollout) < 1e-5
    assert gap(setup["policy"], rollout, temperature=1.0) > 0.1


def test_a_completion_depends_on_its_seed_not_on_the_rest_of_the_batch(setup):
    """Sampled in one call or in two halves (two ranks), each completion is the same: per-request
    seeds are independent of the batch, and reproducible."""
    seeds = [99 + G * b for b in range(4)]
    whole = roll_out(setup, seeds)
    again = roll_out(setup, seeds)
    assert torch.equal(whole.completion_ids, again.completion_ids)
    for rows in (slice(0, 2), slice(2, 4)):
        part = roll_out(setup, seeds[rows], rows)
        S = part.completion_ids.shape[1]
        assert torch.equal(part.completion_ids, whole.completion_ids[rows.start * G:rows.stop * G, :S])
        assert torch.equal(part.sampler_logp, whole.sampler_logp[rows.start * G:rows.stop * G, :S])


def test_n_completions_with_seed_s_are_n_requests_with_seeds_s_to_s_plus_n_minus_1(setup):
    """vLLM's rule for n > 1 (child j samples with seed + j), which the trainer's seeds rely on."""
    engine, ids, mask = setup["engine"], setup["ids"], setup["mask"]
    engine.sync_weights()
    engine.llm.wake_up(tags=["kv_cache"])
    prompt = engine._tokens_prompt(prompt_token_ids=ids[0][mask[0].bool()].tolist())
    sampling = SamplingParams(G, L, T)
    together = engine.llm.generate(prompts=[prompt], sampling_params=[engine._sampling_params(sampling, 7)],
                                   use_tqdm=False)[0].outputs
    one = SamplingParams(1, L, T)
    apart = [engine.llm.generate(prompts=[prompt], sampling_params=[engine._sampling_params(one, 7 + j)],
                                 use_tqdm=False)[0].outputs[0] for j in range(G)]
    engine.llm.sleep(level=2)
    engine._weights_asleep = True
    assert [list(c.token_ids) for c in sorted(together, key=lambda c: c.index)] == [list(c.token_ids) for c in apart]


def test_reset_prefix_cache_is_accepted(setup):
    """vLLM's answer is True (the cache was reset). Not shown here: a stale prefix's effect: on
    the CPU a KV block is 128 tokens, longer than the tiny policy's whole 64-token context, so
    no prefix is ever cached (the stand-in refuses a generate after a load without a reset)."""
    assert setup["engine"].llm.reset_prefix_cache() is True
    assert setup["engine"].llm.llm_engine.vllm_config.cache_config.block_size > 64


def test_generate_while_the_weights_sleep_is_refused_by_the_engine(setup):
    """vLLM would wait forever (test_real_vllm_cpu_build.py); the engine refuses before any call."""
    engine = setup["engine"]
    roll_out(setup, [1, 5, 9, 13])   # ends asleep
    assert engine.llm.llm_engine.is_sleeping()
    with pytest.raises(RuntimeError, match=r"the engine's weights sleep \(vllm_sleep_mode\): call sync_weights first"):
        engine.generate(setup["ids"], setup["mask"], SamplingParams(G, L, T), seeds=[1, 5, 9, 13])
    assert engine.llm.llm_engine.is_sleeping()


def test_a_weight_change_reaches_the_sampler(setup):
    """Every parameter perturbed by noise of half its scale: after sync_weights vLLM samples the
    new policy (max gap ~1e-5), not the old one. (Not proven on a CPU: GPU weight loading and
    kernels, bf16, memory release in sleep mode, NCCL: the shim keeps the weights where
    load_weights writes them.)"""
    import copy
    policy = setup["policy"]
    old = copy.deepcopy(policy)
    with torch.no_grad():
        for _, parameter in policy.named_parameters():
            noise = torch.randn(parameter.shape, generator=torch.Generator().manual_seed(0))
            parameter.add_(noise * parameter.std() * 0.5)
    try:
        rollout = roll_out(setup, [1 + G * b for b in range(4)])
        assert gap(policy, rollout) < 1e-4
        assert gap(old, rollout) > 1.0
    finally:
        with torch.no_grad():
            for (_, parameter), (_, kept) in zip(policy.named_parameters(), old.named_parameters()):
                parameter.copy_(kept)


def test_vllm_keeps_its_sleep_state_as_the_stand_in_does(setup):
    """tests/test_vllm_engine.py's check_sleep_rules on vLLM itself (the bookkeeping is vLLM's own on
    the CPU too: the scheduler pauses, the executor tracks the sleeping tags; the shim only lets
    sleep mode through): a sleep pauses and marks both tags, a second sleep changes nothing, a
    wake-up with a tag that is not asleep wakes nothing, the scheduler resumes once no tag sleeps.
    Each rule's place in vLLM's source: test_real_vllm_protocol.py."""
    from test_vllm_engine import check_sleep_rules
    engine = setup["engine"]
    engine.llm.wake_up()   # the fixture's engine sleeps between rollouts
    try:
        check_sleep_rules(engine.llm)
    finally:
        engine.llm.sleep(level=2)
        engine._weights_asleep = True


def test_the_engine_ends_at_every_eos_id_of_the_models_files(real_vllm_for_the_contract, tmp_path):
    """tests/test_engines.py's two-EOS model (generation_config.json names <eos> and </think>), on vLLM."""
    test_engines.test_every_engine_ends_a_completion_at_every_eos_id_of_the_models_files(
        "vllm", test_engines.make_prompts(), tmp_path)
