"""grpo_edu.sampling.fused_llama computes transformers' function: logits, log-probs and gradients
equal the transformers forward (float64 to 1e-10, float32 to 1e-5) for Llama, Llama with
grouped-query attention and Qwen2 (biased q, k, v); group packing is exact for any
prompt padding and completion lengths; the engine samples what it says it samples."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

from grpo_edu.environment import tasks
from grpo_edu.sampling import fused_llama
from grpo_edu.algorithm.logprobs import completion_logprobs, position_ids_from_attention_mask
from grpo_edu.policy.models import STARTING_POLICY, char_tokenizer, load_policy
from grpo_edu.sampling.rollout import HFEngine, SamplingParams

F64 = torch.float64
SIZES = dict(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64, initializer_range=0.3, pad_token_id=0, eos_token_id=1)


def model(kind: str, dtype=F64, seed=0):
    """A random model with weights large enough that its logits are far from uniform."""
    config = {"llama": lambda: LlamaConfig(num_key_value_heads=4, **SIZES),
              "llama-gqa": lambda: LlamaConfig(num_key_value_heads=2, rope_theta=500.0, **SIZES),
              "qwen2": lambda: Qwen2Config(num_key_value_heads=2, **SIZES)}[kind]()
    cls = Qwen2ForCausalLM if kind == "qwen2" else LlamaForCausalLM
    torch.manual_seed(seed)
    return cls(config).to(dtype).eval()


def batch(B, G, P, S, seed=0, vocab=40):
    """Left-padded prompts (prompt-major, repeated G times), right-padded completions."""
    gen = torch.Generator().manual_seed(seed)
    prompt_len = torch.randint(1, P + 1, (B,), generator=gen)
    prompt_mask = (torch.arange(P) >= P - prompt_len[:, None]).long()
    prompt = torch.randint(2, vocab, (B, P), generator=gen) * prompt_mask
    lengths = torch.randint(1, S + 1, (B * G,), generator=gen)
    completion_mask = torch.arange(S) < lengths[:, None]
    completion = torch.randint(2, vocab, (B * G, S), generator=gen) * completion_mask
    ids = torch.cat([prompt.repeat_interleave(G, 0), completion], 1)
    mask = torch.cat([prompt_mask.repeat_interleave(G, 0), completion_mask.long()], 1)
    return ids, mask, completion_mask


@pytest.fixture(autouse=True)
def rms_norm_in_the_input_dtype(monkeypatch):
    """transformers' RMSNorm computes in float32 whatever the input: for a float64 model
    that is a 1e-7 rounding step, which would hide everything below it. The float64
    comparisons use the same formula in float64 (for float32 inputs it is identical)."""
    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))
    for cls in (LlamaRMSNorm, Qwen2RMSNorm):
        monkeypatch.setattr(cls, "forward", forward)


def transformers_logits(m, ids, mask):
    return m(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_attention_mask(mask)).logits


# ----------------------------------------------------------------- the same function

@pytest.mark.parametrize("kind", ["llama", "llama-gqa", "qwen2"])
def test_logits_equal_transformers_in_float64(kind):
    m = model(kind)
    ids, mask, _ = batch(3, 2, 5, 7)
    expected = transformers_logits(m, ids, mask)
    got = fused_llama.logits(m, ids, mask)
    assert expected.abs().max() > 1.0             # not a near-uniform model
    torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], rtol=0, atol=1e-10)


@pytest.mark.parametrize("kind", ["llama", "llama-gqa", "qwen2"])
@pytest.mark.parametrize("group_size", [1, 4])
def test_logprobs_and_gradients_equal_transformers_in_float64(kind, group_size):
    m = model(kind)
    ids, mask, completion_mask = batch(3, 4, 5, 7, seed=1)
    weights = torch.randn(completion_mask.shape, dtype=F64, generator=torch.Generator().manual_seed(2))
    expected = completion_logprobs(m, ids, mask, completion_mask, temperature=0.7)
    got = fused_llama.completion_logprobs(m, ids, mask, completion_mask, temperature=0.7, group_size=group_size)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
    parameters = list(m.parameters())
    expected_grads = torch.autograd.grad((expected * weights).sum(), parameters)
    got_grads = torch.autograd.grad((got * weights).sum(), parameters)
    for (name, _), e, g in zip(m.named_parameters(), expected_grads, got_grads):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-10, msg=lambda text: f"{name}: {text}")


@settings(max_examples=25, deadline=None)
@given(B=st.integers(1, 3), G=st.integers(1, 4), P=st.integers(1, 6), S=st.integers(1, 8),
       seed=st.integers(0, 10_000))
def test_property_group_packing_is_exact(B, G, P, S, seed):
    """Any prompt padding, any completion lengths: packed groups = one row per completion."""
    m = MODEL_GQA
    ids, mask, completion_mask = batch(B, G, P, S, seed=seed)
    expected = completion_logprobs(m, ids, mask, completion_mask)
    got = fused_llama.completion_logprobs(m, ids, mask, completion_mask, group_size=G)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)


MODEL_GQA = model("llama-gqa")


def test_starting_policy_float32_within_1e_5():
    policy, tokenizer = load_policy(STARTING_POLICY)
    samples = tasks.make_dataset(n=8, split="test", seed=3)
    prompts = tokenizer([s["prompt"] for s in samples], return_tensors="pt", padding=True, add_special_tokens=False)
    rollout = HFEngine(policy, tokenizer).generate(prompts["input_ids"], prompts["attention_mask"],
                                                   SamplingParams(4, 16))
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
    mask = torch.cat([rollout.prompt_mask, rollout.completion_mask.long()], 1)
    expected = completion_logprobs(policy, ids, mask, rollout.completion_mask)
    got = fused_llama.completion_logprobs(policy, ids, mask, rollout.completion_mask, group_size=4)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


# ----------------------------------------------------------------- the engine

@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_greedy_decoding_equals_transformers_generate(kind):
    m = model(kind, dtype=torch.float32)
    tokenizer = char_tokenizer()
    ids, mask, _ = batch(6, 1, 5, 1, seed=4)
    prompt_ids, prompt_mask = ids[:, :5], mask[:, :5]
    sampling = SamplingParams(1, 12)
    expected = HFEngine(m, tokenizer).generate(prompt_ids, prompt_mask, sampling, greedy=True)
    got = fused_llama.FusedEngine(m, tokenizer).generate(prompt_ids, prompt_mask, sampling, greedy=True)
    assert torch.equal(got.completion_ids, expected.completion_ids)
    assert torch.equal(got.completion_mask, expected.completion_mask)
    torch.testing.assert_close(got.sampler_logp, expected.sampler_logp, rtol=0, atol=1e-5)


def test_greedy_decoding_of_the_starting_policy_equals_generate():
    """Rows finish at different steps, so the engine drops finished rows mid-way."""
    policy, tokenizer = load_policy(STARTING_POLICY)
    samples = tasks.make_dataset(n=64, split="test", seed=5)
    prompts = tokenizer([s["prompt"] for s in samples], return_tensors="pt", padding=True, add_special_tokens=False)
    sampling = SamplingParams(1, 16)
    expected = HFEngine(policy, tokenizer).generate(prompts["input_ids"], prompts["attention_mask"], sampling,
                                                    greedy=True)
    got = fused_llama.FusedEngine(policy, tokenizer).generate(prompts["input_ids"], prompts["attention_mask"],
                                                              sampling, greedy=True)
    lengths = got.completion_mask.sum(1)
    assert lengths.min() < lengths.max()
    assert torch.equal(got.completion_ids, expected.completion_ids)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_logprobs_equal_the_fused_recomputation(temperature):
    policy, tokenizer = load_policy(STARTING_POLICY)
    samples = tasks.make_dataset(n=16, split="train", seed=6)
    prompts = tokenizer([s["prompt"] for s in samples], return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(0)
    rollout = fused_llama.FusedEngine(policy, tokenizer).generate(
        prompts["input_ids"], prompts["attention_mask"], SamplingParams(8, 16, temperature))
    assert not rollout.completion_mask.all() and rollout.completion_mask.sum(1).min() < 16
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
    mask = torch.cat([rollout.prompt_mask, rollout.completion_mask.long()], 1)
    recomputed = fused_llama.completion_logprobs(policy, ids, mask, rollout.completion_mask,
                                                 temperature=temperature, group_size=8)
    torch.testing.assert_close(rollout.sampler_logp, recomputed, rtol=0, atol=1e-5)


def test_sampling_draws_each_token_with_its_probability():
    probabilities = torch.tensor([0.5, 0.0, 0.2, 0.25, 0.05])
    logp = probabilities.log().expand(50_000, -1)
    torch.manual_seed(0)
    draws = fused_llama._sample(logp, torch.rand(50_000))
    counts = torch.bincount(draws, minlength=5).double()
    assert counts[1] == 0                           # probability 0 is never drawn
    expected = 50_000 * probabilities.double()
    sigma = (expected * (1 - probabilities.double())).sqrt()
    assert ((counts - expected).abs() <= 4 * sigma + 1e-9).all(), counts


def test_sampling_never_draws_a_zero_probability_token_at_the_edges(monkeypatch):
    """u = 0 and u rounding up to the whole mass: still tokens of positive probability."""
    logp = torch.tensor([[float("-inf"), -0.1, float("-inf")], [-0.7, -0.7, float("-inf")]]).log_softmax(-1)
    for u in (0.0, 1.0):
        draws = fused_llama._sample(logp, torch.full((2,), u))
        assert (logp.gather(1, draws[:, None]) > float("-inf")).all(), (u, draws)


def test_a_completion_depends_only_on_its_own_row_of_uniforms():
    """What makes a rollout independent of the number of processes: sample 4 prompts at once,
    or each half with its rows of the same uniforms table, and get the same completions."""
    policy, tokenizer = load_policy(STARTING_POLICY)
    prompts = tokenizer(["12+34=", "7-5=", "60+1=", "3-99="], return_tensors="pt", padding=True,
                        add_special_tokens=False)
    ids, mask = prompts["input_ids"], prompts["attention_mask"]
    engine, sampling = fused_llama.FusedEngine(policy, tokenizer), SamplingParams(4, 12)
    uniforms = torch.rand(16, 12, generator=torch.Generator().manual_seed(5))
    whole = engine.generate(ids, mask, sampling, uniforms=uniforms)
    halves = [engine.generate(ids[part], mask[part], sampling, uniforms=uniforms[rows])
              for part, rows in ((slice(0, 2), slice(0, 8)), (slice(2, 4), slice(8, 16)))]
    for name in ("completion_ids", "completion_mask", "finished"):
        joined = [getattr(h, name) for h in halves]
        if joined[0].ndim == 2:   # the halves may be padded to different widths
            S = getattr(whole, name).shape[1]
            joined = [torch.nn.functional.pad(t, (0, S - t.shape[1]), value=tokenizer.pad_token_id
                                              if name == "completion_ids" else 0) for t in joined]
        assert torch.equal(torch.cat(joined).to(getattr(whole, name).dtype), getattr(whole, name)), name
    with pytest.raises(ValueError, match=r"uniforms must have shape \(B \* G, max_new_tokens\) = \(16, 12\)"):
        engine.generate(ids, mask, sampling, uniforms=uniforms[:8])


def test_same_seed_same_samples():
    policy, tokenizer = load_policy(STARTING_POLICY)
    prompts = tokenizer(["12+34=", "7-5="], return_tensors="pt", padding=True, add_special_tokens=False)
    engine = fused_llama.FusedEngine(policy, tokenizer)
    runs = []
    for _ in range(2):
        torch.manual_seed(3)
        runs.append(engine.generate(prompts["input_ids"], prompts["attention_mask"], SamplingParams(8, 16)))
    assert torch.equal(runs[0].completion_ids, runs[1].completion_ids)
    assert torch.equal(runs[0].sampler_logp, runs[1].sampler_logp)


# ----------------------------------------------------------------- errors

def test_unsupported_models_are_refused_by_name():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=40))
    with pytest.raises(ValueError, match="fused_llama supports .* got GPT2LMHeadModel; use engine = 'hf'"):
        fused_llama.FusedEngine(gpt2, char_tokenizer())
    scaled = LlamaForCausalLM(LlamaConfig(rope_scaling={"rope_type": "linear", "factor": 2.0}, **SIZES))
    with pytest.raises(ValueError, match="rope_type = 'default', this model has 'linear'"):
        fused_llama.check_supported(scaled)
    with pytest.raises(ValueError, match="float32 or float64, this model is torch.bfloat16"):
        fused_llama.check_supported(model("llama").to(torch.bfloat16))


def test_rows_of_a_group_must_share_their_prompt():
    ids, mask, completion_mask = batch(2, 2, 4, 3)
    ids[1, 3] = ids[0, 3] + 1
    with pytest.raises(ValueError, match="group_size=2: rows of one group must share their prompt columns"):
        fused_llama.completion_logprobs(MODEL_GQA, ids, mask, completion_mask, group_size=2)
    with pytest.raises(ValueError, match="group_size must be a positive int dividing the 4 rows, got 3"):
        fused_llama.completion_logprobs(MODEL_GQA, ids, mask, completion_mask, group_size=3)


def test_a_scored_token_after_an_unattended_one_is_an_error():
    """Token 2 would be predicted from token 1's column, which attends to nothing real."""
    ids, mask, _ = batch(1, 1, 3, 4)
    completion_mask = torch.tensor([[True, False, True, True]])
    mask[:, 3:] = completion_mask.long()
    with pytest.raises(ValueError, match="must follow a real \\(attended\\) token"):
        fused_llama.completion_logprobs(MODEL_GQA, ids, mask, completion_mask)
