"""grpo_edu.algorithm.logprobs: chunked log-probs equal log_softmax + gather (values and
gradients), never see more than one chunk at once, and a causal LM's completion
log-probs are aligned, padding-invariant and the same chunked or not."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_edu.algorithm.logprobs import (completion_logprobs, lm_head_logprobs, position_ids_from_attention_mask,
                               token_logprobs)
from grpo_edu.policy.models import char_tokenizer, tiny_llama

F64 = torch.float64


def naive(logits, ids, temperature=1.0):
    return torch.log_softmax(logits / temperature, -1).gather(-1, ids[..., None]).squeeze(-1)


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), V=st.integers(1, 40),
       temperature=st.sampled_from([1.0, 0.7, 1.3]), chunk=st.integers(1, 200), seed=st.integers(0, 999))
def test_property_values_and_gradients_equal_log_softmax_gather(shape, V, temperature, chunk, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(*shape, V, generator=gen, dtype=F64)).requires_grad_()
    ids = torch.randint(0, V, shape, generator=gen)
    weights = torch.randn(shape, generator=gen, dtype=F64)
    got = token_logprobs(logits, ids, temperature=temperature, chunk_elements=chunk)
    (got_grad,) = torch.autograd.grad((got * weights).sum(), logits)
    expected = naive(logits, ids, temperature)
    (expected_grad,) = torch.autograd.grad((expected * weights).sum(), logits)
    assert got.shape == tuple(shape) and got.dtype == F64
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(got_grad, expected_grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("temperature, chunk", [(1.0, 7), (0.6, 5), (1.5, 10_000)])
def test_gradcheck(temperature, chunk):
    logits = torch.randn(2, 3, 6, dtype=F64, requires_grad=True)
    ids = torch.randint(0, 6, (2, 3))
    torch.autograd.gradcheck(lambda z: token_logprobs(z, ids, temperature=temperature, chunk_elements=chunk),
                             (logits,))


def test_huge_logits_stay_finite():
    logits = torch.tensor([[1000.0, 999.0, -1000.0]], dtype=F64)
    got = token_logprobs(logits, torch.tensor([0]))
    assert torch.isfinite(got).all()
    assert got.item() == pytest.approx(-torch.log1p(torch.exp(torch.tensor(-1.0, dtype=F64))).item(), abs=1e-14)


def test_never_runs_log_softmax_on_more_than_one_chunk(monkeypatch):
    """The point of the module: no (N, S, V) log-softmax or softmax, forward or backward."""
    seen = []
    for name in ("log_softmax", "softmax", "logsumexp"):
        original = getattr(torch, name)

        def spy(x, *args, _original=original, **kwargs):
            seen.append(x.numel())
            return _original(x, *args, **kwargs)
        monkeypatch.setattr(torch, name, spy)
    logits = torch.randn(4, 50, 100, requires_grad=True)
    ids = torch.randint(0, 100, (4, 50))
    token_logprobs(logits, ids, chunk_elements=1000).sum().backward()
    assert seen and max(seen) <= 1000  # 10 rows of V = 100 at a time
    assert len(seen) == 2 * 4 * 50 // 10  # forward and backward, 20 chunks each


def test_strided_slices_are_not_copied_whole(monkeypatch):
    """logits[:, P - 1:-1] cannot be viewed as (rows, V); it is processed row block by row block."""
    logits = torch.randn(3, 9, 20, dtype=F64, requires_grad=True)
    ids = torch.randint(0, 20, (3, 5))
    sliced = logits[:, 3:8]
    assert not sliced.is_contiguous()
    got = token_logprobs(sliced, ids)
    torch.testing.assert_close(got, naive(sliced, ids), rtol=0, atol=1e-12)
    got.sum().backward()
    expected = torch.zeros_like(logits)
    expected[:, 3:8] = torch.autograd.grad(naive(logits[:, 3:8], ids).sum(), logits)[0][:, 3:8]
    torch.testing.assert_close(logits.grad, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits_use_float32_maths(dtype):
    logits = (4 * torch.randn(3, 5, 1000)).to(dtype).requires_grad_()
    ids = torch.randint(0, 1000, (3, 5))
    got = token_logprobs(logits, ids, temperature=0.8)
    assert got.dtype == torch.float32
    # the same as log_softmax of the upcast logits in float32
    torch.testing.assert_close(got, naive(logits.detach().float(), ids, 0.8), rtol=0, atol=1e-5)
    got.sum().backward()
    assert logits.grad.dtype == dtype
    upcast = logits.detach().float().requires_grad_()
    naive(upcast, ids, 0.8).sum().backward()
    torch.testing.assert_close(logits.grad.float(), upcast.grad.to(dtype).float(), rtol=0, atol=1e-2)


def test_no_grad_and_detached_inputs():
    logits = torch.randn(2, 4, 7)
    ids = torch.randint(0, 7, (2, 4))
    with torch.no_grad():
        got = token_logprobs(logits, ids)
    assert not got.requires_grad
    torch.testing.assert_close(got, naive(logits, ids), rtol=0, atol=1e-6)


@pytest.mark.parametrize("logits, ids, kwargs, error, message", [
    (torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long), {}, ValueError,
     r"logits must have shape token_ids.shape \+ \(V,\) = \(2, 4\) \+ \(V,\), got \(2, 3, 5\)"),
    (torch.zeros(2, 3, 5), torch.tensor([[0, 1, 5], [0, 0, 0]]), {}, ValueError,
     r"token_ids must lie in \[0, V = 5\), got 5 at position \(0, 2\)"),
    (torch.zeros(2, 3, 5), torch.tensor([[0, 1, -1], [0, 0, 0]]), {}, ValueError, "got -1 at position"),
    (torch.zeros(2, 3, 5), torch.zeros(2, 3), {}, TypeError, "token_ids must be an integer tensor"),
    (torch.zeros(2, 3, 5, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long), {}, TypeError,
     "logits must be a floating-point tensor"),
    (torch.zeros(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), {"temperature": 0.0}, ValueError,
     "temperature must be a number > 0"),
    (torch.zeros(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), {"chunk_elements": 0}, ValueError,
     "chunk_elements must be a positive int"),
])
def test_bad_input(logits, ids, kwargs, error, message):
    with pytest.raises(error, match=message):
        token_logprobs(logits, ids, **kwargs)


# --------------------------------------------------------------------------- a causal LM

@pytest.fixture(scope="module")
def policy():
    tokenizer = char_tokenizer()
    model = tiny_llama(tokenizer, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    return model.double(), tokenizer


def padded(tokenizer, prompts, completions):
    """Left-padded prompts + right-padded completions, (N, P + S), as generate returns them."""
    pad = tokenizer.pad_token_id
    P = max(len(p) for p in prompts)
    S = max(len(c) for c in completions)
    ids = torch.full((len(prompts), P + S), pad)
    attention = torch.zeros(len(prompts), P + S, dtype=torch.long)
    completion_mask = torch.zeros(len(prompts), S, dtype=torch.long)
    for row, (p, c) in enumerate(zip(prompts, completions)):
        ids[row, P - len(p):P] = torch.tensor(p)
        ids[row, P:P + len(c)] = torch.tensor(c)
        attention[row, P - len(p):P + len(c)] = 1
        completion_mask[row, :len(c)] = 1
    return ids, attention, completion_mask


def encode(tokenizer, texts):
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


PROMPTS = ["1+2=", "17+25=", "3*4=", "100-1="]
COMPLETIONS = ["3<eos>", "42<eos>", "<think>12</think>", "9<eos>"]


def test_positions_skip_left_padding():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    assert position_ids_from_attention_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 3]]


def test_each_row_equals_the_unpadded_sequence_alone(policy):
    """Padding and batching change nothing, and token j is scored by the logits at j - 1."""
    model, tokenizer = policy
    prompts, completions = encode(tokenizer, PROMPTS), encode(tokenizer, COMPLETIONS)
    ids, attention, completion_mask = padded(tokenizer, prompts, completions)
    with torch.no_grad():
        got = completion_logprobs(model, ids, attention, completion_mask)
        for row, (p, c) in enumerate(zip(prompts, completions)):
            alone = torch.tensor([p + c])
            log_probs = torch.log_softmax(model(alone).logits[0], -1)
            expected = log_probs[len(p) - 1:-1].gather(-1, torch.tensor(c)[:, None]).squeeze(-1)
            torch.testing.assert_close(got[row, :len(c)], expected, rtol=0, atol=1e-10)
            assert (got[row, len(c):] == 0).all()


def test_grouped_layout_and_temperature(policy):
    model, tokenizer = policy
    ids, attention, completion_mask = padded(tokenizer, encode(tokenizer, PROMPTS), encode(tokenizer, COMPLETIONS))
    with torch.no_grad():
        flat = completion_logprobs(model, ids, attention, completion_mask, temperature=0.7)
        grouped = completion_logprobs(model, ids.view(2, 2, -1), attention.view(2, 2, -1),
                                      completion_mask.view(2, 2, -1), temperature=0.7)
        logits = model(ids, attention_mask=attention,
                       position_ids=position_ids_from_attention_mask(attention)).logits
        S = completion_mask.shape[1]
        expected = naive(logits[:, -S - 1:-1], ids[:, -S:], 0.7) * completion_mask
    assert grouped.shape == (2, 2, S)
    torch.testing.assert_close(grouped.view(4, S), flat, rtol=0, atol=0)
    torch.testing.assert_close(flat, expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("chunk_tokens", [1, 5, 1000])
def test_chunked_lm_head_equals_one_pass_in_values_and_parameter_gradients(policy, chunk_tokens):
    model, tokenizer = policy
    ids, attention, completion_mask = padded(tokenizer, encode(tokenizer, PROMPTS), encode(tokenizer, COMPLETIONS))
    weights = torch.randn(completion_mask.shape, dtype=F64)
    results = []
    for chunk in (None, chunk_tokens):
        model.zero_grad()
        logp = completion_logprobs(model, ids, attention, completion_mask, temperature=0.9, chunk_tokens=chunk)
        (logp * weights).sum().backward()
        results.append((logp.detach(), [p.grad.clone() for p in model.parameters()]))
    (one_pass, grads_one), (chunked, grads_chunked) = results
    torch.testing.assert_close(chunked, one_pass, rtol=0, atol=1e-12)
    for a, b in zip(grads_chunked, grads_one):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    model.zero_grad()


def test_lm_helper_bad_input(policy):
    model, tokenizer = policy
    ids, attention, completion_mask = padded(tokenizer, encode(tokenizer, PROMPTS), encode(tokenizer, COMPLETIONS))
    with pytest.raises(ValueError, match="attention_mask must have the shape of input_ids"):
        completion_logprobs(model, ids, attention[:, 1:], completion_mask)
    with pytest.raises(ValueError, match=r"completion_mask must have shape \(4,\) \+ \(S,\)"):
        completion_logprobs(model, ids, attention, torch.ones(4, ids.shape[1]))
    covering_padding = completion_mask.clone()
    covering_padding[0, -1] = 1  # row 0's completion "3<eos>" is 2 tokens; column S - 1 is padding
    with pytest.raises(ValueError, match="completion_mask marks a token that attention_mask marks as padding"):
        completion_logprobs(model, ids, attention, covering_padding)
    with pytest.raises(ValueError, match="chunk_tokens must be a positive int or None"):
        completion_logprobs(model, ids, attention, completion_mask, chunk_tokens=0)



def test_lm_head_logprobs_equals_full_logits_in_values_and_gradients():
    gen = torch.Generator().manual_seed(3)
    head = torch.nn.Linear(8, 30, bias=False).double()
    hidden = torch.randn(2, 5, 8, generator=gen, dtype=F64, requires_grad=True)
    ids = torch.randint(0, 30, (2, 5), generator=gen)
    weights = torch.randn(2, 5, generator=gen, dtype=F64)
    results = []
    for fn in (lambda: naive(head(hidden), ids, 0.8),
               lambda: lm_head_logprobs(hidden, head, ids, temperature=0.8, chunk_tokens=3)):
        logp = fn()
        grads = torch.autograd.grad((logp * weights).sum(), (hidden, head.weight))
        results.append((logp.detach(), grads))
    (expected, expected_grads), (got, got_grads) = results
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    for a, b in zip(got_grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"hidden must have shape token_ids.shape \+ \(H,\)"):
        lm_head_logprobs(hidden, head, ids[:, :4])


def test_chapter3_alignment_checker():
    from grpo_edu.exercises import ch03

    def score(logits, ids, columns, S):
        return torch.log_softmax(logits[:, columns], -1).gather(-1, ids[:, -S:, None]).squeeze(-1)

    assert ch03.check_completion_logprobs(lambda z, ids, S: score(z, ids, slice(-S - 1, -1), S))
    off_by_one = ch03.check_completion_logprobs(lambda z, ids, S: score(z, ids, slice(-S, None), S))
    assert not off_by_one and off_by_one.passed == 0
    assert str(off_by_one).count("off by one column") == len(ch03.ALIGNMENT_CASES)
    wrong_tokens = ch03.check_completion_logprobs(
        lambda z, ids, S: torch.log_softmax(z[:, -S - 1:-1], -1).gather(-1, ids[:, -S - 1:-1, None]).squeeze(-1))
    assert not wrong_tokens and "off by one column" not in str(wrong_tokens)
    assert "elements are wrong" in str(wrong_tokens) and "expected" not in str(wrong_tokens)


def test_inplace_backward_gives_the_same_gradients_and_fails_loudly_when_unsafe():
    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(50, 8, generator=gen, dtype=F64, requires_grad=True)
    hidden = torch.randn(3, 4, 8, generator=gen, dtype=F64, requires_grad=True)
    ids = torch.randint(0, 50, (3, 4), generator=gen)

    def gradients(inplace, other=None):
        logits = hidden @ weight.T
        extra = other(logits) if other is not None else 0.0   # an op created before the log-probs
        logp = token_logprobs(logits, ids, temperature=0.7, chunk_elements=60, inplace_backward=inplace)
        return torch.autograd.grad(logp.sum() + extra, (hidden, weight))

    for a, b in zip(gradients(False), gradients(True)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # Another op that saved the logits and whose backward runs after ours: autograd's
    # version check refuses to hand it the overwritten logits.
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        gradients(True, other=lambda z: (z * z).sum())
