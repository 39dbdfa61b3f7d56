"""The rollout engine contract (grpo_edu.sampling.rollout.RolloutEngine), checked for every engine the
trainer can run: fused, hf, vllm (here the fake vllm of tests/fake_vllm, which samples
with the same weights; tests/real_vllm runs these same tests against vLLM's CPU build, and
the GPU check is `grpo-edu doctor --gpu`) and sglang (a client of the stand-in SGLang server
of tests/sglang_standin.py, which checks every request against SGLang 0.5.23's own fields).

Token ids in, token ids out (no re-tokenising); prompt-major rows; the same Rollout fields
and shapes; masks up to and including EOS; finished flags; sampler log-probs of
softmax(logits / T) at the sampled ids, equal to the trainer's recomputation; and
sync_weights makes the engine sample from the trainer's current weights.
"""

import json
import shutil
import tempfile
from contextlib import ExitStack
from pathlib import Path

import pytest
import torch

from grpo_edu.environment import tasks
from grpo_edu.sampling import fused_llama, sglang_engine, vllm_engine
from grpo_edu.runtime.distributed import World
from grpo_edu.algorithm.logprobs import completion_logprobs
from grpo_edu.policy.models import STARTING_POLICY, load_policy
from grpo_edu.sampling.rollout import HFEngine, SamplingParams
from sglang_standin import StandIn
from vllm_fake import fake_vllm

ENGINES = ("fused", "hf", "vllm", "sglang")
B, G, L, T = 3, 4, 12, 0.7
# The vllm the "vllm" engine is built on: a context in which `import vllm` gives it. Here the
# stand-in; tests/real_vllm sets contextlib.nullcontext (the installed vLLM) and runs these tests.
VLLM = fake_vllm


def make_prompts():
    policy, tokenizer = load_policy(STARTING_POLICY)
    samples = tasks.make_dataset("arithmetic", n=B, split="test", seed=0)
    encoded = tokenizer([s["prompt"] for s in samples], return_tensors="pt", padding=True, add_special_tokens=False)
    return encoded["input_ids"], encoded["attention_mask"]


@pytest.fixture(scope="module")
def prompts():
    return make_prompts()


def build(name: str, stack: ExitStack, model_dir: Path = STARTING_POLICY):
    policy, tokenizer = load_policy(model_dir)
    if name == "fused":
        return policy, tokenizer, fused_llama.FusedEngine(policy, tokenizer)
    if name == "hf":
        return policy, tokenizer, HFEngine(policy, tokenizer)
    if name == "sglang":   # a server of its own, stopped with the stack
        server = StandIn(model_dir)
        stack.callback(server.close)
        folder = stack.enter_context(tempfile.TemporaryDirectory())
        engine = sglang_engine.SGLangEngine(str(model_dir), policy, tokenizer, World(),
                                            sglang_engine.Settings(url=server.url, output_dir=folder))
        return policy, tokenizer, engine
    stack.enter_context(VLLM())
    engine = vllm_engine.VLLMEngine(str(model_dir), policy, tokenizer, World(), seed=0,
                                    gpu_memory_utilization=0.3, sleep_mode=True, dtype="float32")
    return policy, tokenizer, engine


def sample(engine, prompt_ids, prompt_mask, sampling, seed=0):
    torch.manual_seed(seed)
    engine.sync_weights()
    if isinstance(engine, vllm_engine.VLLMEngine):
        return engine.generate(prompt_ids, prompt_mask, sampling, seeds=[seed + b * G for b in range(len(prompt_ids))])
    if isinstance(engine, sglang_engine.SGLangEngine):   # a seed per completion
        return engine.generate(prompt_ids, prompt_mask, sampling, seeds=[seed * 1000 + r for r in range(len(prompt_ids) * G)])
    return engine.generate(prompt_ids, prompt_mask, sampling)


@pytest.mark.parametrize("name", ENGINES)
def test_engine_contract(name, prompts):
    prompt_ids, prompt_mask = prompts
    with ExitStack() as stack:
        policy, tokenizer, engine = build(name, stack)
        rollout = sample(engine, prompt_ids, prompt_mask, SamplingParams(G, L, T))
    N, S = B * G, rollout.completion_ids.shape[1]
    assert rollout.num_generations == G and rollout.num_prompts == B
    # Token ids in: each prompt's ids, unchanged, repeated for its G completions (prompt-major).
    assert torch.equal(rollout.prompt_ids, prompt_ids.repeat_interleave(G, dim=0))
    assert torch.equal(rollout.prompt_mask, prompt_mask.repeat_interleave(G, dim=0))
    assert rollout.completion_ids.shape == rollout.completion_mask.shape == rollout.sampler_logp.shape == (N, S)
    assert 1 <= S <= L and rollout.finished.shape == (N,)
    assert rollout.completion_ids.dtype == torch.long and rollout.completion_mask.dtype == torch.bool
    # Masks: a run of real tokens from the first column; finished = ends with EOS, which is real.
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    lengths = rollout.completion_mask.sum(1)
    assert torch.equal(rollout.completion_mask, torch.arange(S)[None] < lengths[:, None])
    last = rollout.completion_ids.gather(1, (lengths - 1).clamp(min=0)[:, None])[:, 0]
    assert torch.equal(rollout.finished, last == eos)
    real_eos = (rollout.completion_ids == eos) & rollout.completion_mask
    assert int(real_eos.sum(1).max()) <= 1, "no real token after EOS"
    assert bool((lengths[~rollout.finished] == L).all()), "an unfinished completion is truncated at L"
    assert bool(rollout.finished.any()), "the tiny policy ends some answers within L tokens"
    # Padding: the pad id, log-prob 0.
    assert bool((rollout.completion_ids[~rollout.completion_mask] == pad).all())
    assert bool((rollout.sampler_logp[~rollout.completion_mask] == 0).all())
    # Sampler log-probs: softmax(logits / T) of the trainer's model at the sampled ids.
    input_ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
    attention = torch.cat([rollout.prompt_mask, rollout.completion_mask.long()], 1)
    with torch.no_grad():
        recomputed = completion_logprobs(policy, input_ids, attention, rollout.completion_mask, temperature=T)
    gap = (recomputed - rollout.sampler_logp)[rollout.completion_mask].abs().max()
    assert float(gap) < 1e-4, f"{name}: sampler log-probs differ from the recomputation by {float(gap):.2e}"
    # Not at T = 1: the temperature is really applied.
    with torch.no_grad():
        at_one = completion_logprobs(policy, input_ids, attention, rollout.completion_mask, temperature=1.0)
    assert float((at_one - rollout.sampler_logp)[rollout.completion_mask].abs().max()) > 1e-2


@pytest.mark.parametrize("name", ENGINES)
def test_sync_weights_makes_the_engine_sample_from_the_current_weights(name, prompts):
    """Change the trainer's weights: after sync_weights the engine's log-probs are the new
    policy's (the vllm engine holds its own copy, loaded from the policy)."""
    prompt_ids, prompt_mask = prompts
    with ExitStack() as stack:
        policy, tokenizer, engine = build(name, stack)
        before = sample(engine, prompt_ids, prompt_mask, SamplingParams(G, L, T))
        with torch.no_grad():
            policy.lm_head.weight.mul_(3.0)   # sharper: a clearly different distribution
        after = sample(engine, prompt_ids, prompt_mask, SamplingParams(G, L, T))
    input_ids = torch.cat([after.prompt_ids, after.completion_ids], 1)
    attention = torch.cat([after.prompt_mask, after.completion_mask.long()], 1)
    with torch.no_grad():
        recomputed = completion_logprobs(policy, input_ids, attention, after.completion_mask, temperature=T)
    assert float((recomputed - after.sampler_logp)[after.completion_mask].abs().max()) < 1e-4
    assert not torch.equal(before.sampler_logp, after.sampler_logp)


@pytest.mark.parametrize("name", ENGINES)
def test_same_seed_same_rollout(name, prompts):
    prompt_ids, prompt_mask = prompts
    with ExitStack() as stack:
        _, _, engine = build(name, stack)
        first = sample(engine, prompt_ids, prompt_mask, SamplingParams(G, L, T), seed=7)
        again = sample(engine, prompt_ids, prompt_mask, SamplingParams(G, L, T), seed=7)
        other = sample(engine, prompt_ids, prompt_mask, SamplingParams(G, L, T), seed=8)
    assert torch.equal(first.completion_ids, again.completion_ids)
    assert not torch.equal(first.completion_ids, other.completion_ids)


def two_eos_model(folder: Path) -> tuple[Path, int]:
    """The starting policy, its generation_config.json naming two EOS ids (as a Qwen2.5 instruct
    model's does: <|im_end|> and <|endoftext|>): the tokenizer's <eos> and </think>, which the
    tiny policy writes in every answer, a few tokens before its <eos>. config.json names <eos> alone."""
    model_dir = folder / "two-eos"
    shutil.copytree(STARTING_POLICY, model_dir)
    _, tokenizer = load_policy(STARTING_POLICY)
    second = tokenizer.convert_tokens_to_ids("</think>")
    generation = json.loads((model_dir / "generation_config.json").read_text())
    generation["eos_token_id"] = [tokenizer.eos_token_id, second]
    (model_dir / "generation_config.json").write_text(json.dumps(generation))
    assert json.loads((model_dir / "config.json").read_text())["eos_token_id"] == tokenizer.eos_token_id
    return model_dir, second


@pytest.mark.parametrize("name", ENGINES)
def test_every_engine_ends_a_completion_at_every_eos_id_of_the_models_files(name, prompts, tmp_path):
    """A model whose generation_config.json names two EOS ids: every engine stops at the first
    of either (SGLang 0.5.23 and vLLM 0.31.0 do by themselves), keeps it, and marks the
    completion finished there; the tokenizer's one EOS alone would leave these unfinished."""
    model_dir, second = two_eos_model(tmp_path)
    prompt_ids, prompt_mask = prompts
    with ExitStack() as stack:
        _, tokenizer, engine = build(name, stack, model_dir)
        assert engine.eos_token_ids == (tokenizer.eos_token_id, second)
        rollout = sample(engine, prompt_ids, prompt_mask, SamplingParams(G, L, T))
    ends = torch.isin(rollout.completion_ids, torch.tensor([tokenizer.eos_token_id, second]))
    lengths = rollout.completion_mask.sum(1)
    last = rollout.completion_ids.gather(1, (lengths - 1)[:, None])[:, 0]
    assert torch.equal(rollout.finished, torch.isin(last, torch.tensor([tokenizer.eos_token_id, second])))
    assert int((ends & rollout.completion_mask).sum(1).max()) <= 1, "a real token after an EOS id"
    assert bool((lengths[~rollout.finished] == L).all())
    assert bool((last[rollout.finished] == second).any()), "some completion ends at the second EOS id"
