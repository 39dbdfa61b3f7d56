"""Per-token log-probabilities at the sampled tokens, without the full log-softmax.

GRPO needs log pi(o_t | q, o_<t) only at the token that was sampled, one number
per position. The usual way, `log_softmax(logits).gather(ids)`, first writes
log-probabilities for the whole vocabulary: for 64 completions of 512 tokens over
a 32k vocabulary that is a 4.2 GB float32 tensor, allocated to keep 131 kB of it.
Since

    log softmax(z)_i = z_i - logsumexp(z),

`token_logprobs` runs log_softmax on a chunk of rows at a time into one reused
buffer and keeps only the chosen entry of each row. Its backward (a hand-written
autograd Function, so autograd saves no per-chunk copies, only the logits that
exist anyway) recomputes the softmax chunk by chunk, writing straight into the
gradient: d logp_t / d z_v = (onehot(o_t)_v - softmax(z / T)_v) / T.

`completion_logprobs` runs a transformers causal LM on prompt + completion ids
and returns the completion's log-probs, (..., S), aligned with its completion
mask: the logits at position j predict the token at j + 1. With
`chunk_tokens`, the hidden states go through the LM head a chunk at a time under
activation checkpointing, so (N, S, V) logits never exist at once, not even in
the backward pass.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

# Elements of one working chunk (rows x vocabulary): 2**22 float32 values = 16 MiB,
# 0.4% of the 4 GiB logits of 64 x 512 tokens over 32k entries. Much smaller chunks
# mean many small parallel regions, which stall when the CPU is shared.
CHUNK_ELEMENTS = 2 ** 22


def _rows_per_chunk(vocab_size: int, chunk_elements: int) -> int:
    return max(1, chunk_elements // vocab_size)


class _TokenLogprobs(torch.autograd.Function):
    """logits (R, V), token_ids (R,) -> log-probs (R,), a chunk of rows at a time.

    Only the logits (which exist anyway) and the ids are saved for backward. With
    overwrite_logits the backward writes the gradient into the logits' own memory.
    """

    @staticmethod
    def forward(ctx, logits, token_ids, temperature, chunk_elements, overwrite_logits):
        compute_dtype = torch.promote_types(logits.dtype, torch.float32)  # fp32 maths for bf16
        rows = _rows_per_chunk(logits.shape[-1], chunk_elements)
        logp = torch.empty(logits.shape[0], dtype=compute_dtype, device=logits.device)
        buffer = logits.new_empty((min(rows, logits.shape[0]), logits.shape[-1]), dtype=compute_dtype)
        for start in range(0, logits.shape[0], rows):
            block = _scaled(logits[start:start + rows], compute_dtype, temperature)
            log_softmax = torch.log_softmax(block, dim=-1, out=buffer[:block.shape[0]])
            logp[start:start + rows] = log_softmax.gather(-1, token_ids[start:start + rows, None]).squeeze(-1)
        ctx.save_for_backward(logits, token_ids)
        ctx.temperature, ctx.chunk_elements, ctx.overwrite = temperature, chunk_elements, overwrite_logits
        return logp

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logp):
        # d logp_r / d z_rv = (onehot(o_r)_v - softmax(z_r / T)_v) / T, chunk by chunk.
        logits, token_ids = ctx.saved_tensors
        temperature = ctx.temperature
        rows = _rows_per_chunk(logits.shape[-1], ctx.chunk_elements)
        # Overwriting: each chunk's softmax is read before its gradient is written back.
        grad_logits = logits if ctx.overwrite else torch.empty_like(logits)
        buffer = None
        if grad_logp.dtype != logits.dtype or ctx.overwrite:  # bf16 logits: fp32 maths, one cast per chunk
            buffer = logits.new_empty((min(rows, logits.shape[0]), logits.shape[-1]), dtype=grad_logp.dtype)
        for start in range(0, logits.shape[0], rows):
            block = _scaled(logits[start:start + rows], grad_logp.dtype, temperature)
            target = grad_logits[start:start + rows] if buffer is None else buffer[:block.shape[0]]
            weight = (grad_logp[start:start + rows] / temperature)[:, None]
            torch.softmax(block, dim=-1, out=target).mul_(-weight)
            target.scatter_add_(-1, token_ids[start:start + rows, None], weight)
            if buffer is not None:
                grad_logits[start:start + rows] = target
        return grad_logits, None, None, None, None


def _scaled(block: torch.Tensor, dtype: torch.dtype, temperature: float) -> torch.Tensor:
    """block / temperature in `dtype`; no copy when neither changes anything."""
    if block.dtype != dtype:
        block = block.to(dtype)
    return block / temperature if temperature != 1.0 else block


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, *, temperature: float = 1.0,
                   chunk_elements: int = CHUNK_ELEMENTS, inplace_backward: bool = False) -> torch.Tensor:
    """log softmax(logits / temperature) at token_ids: (..., S, V), (..., S) -> (..., S).

    Never materialises the (..., S, V) log-softmax: peak extra memory is one chunk
    of `chunk_elements` values (plus, in backward, the gradient itself).
    bf16 / fp16 logits are upcast chunk by chunk: the result is float32 (float64
    for float64 logits). `temperature` must match the sampler's, or the ratio
    pi / pi_old of the first step is not 1.

    inplace_backward=True writes d loss / d logits into the logits' own memory
    (the trick of fused cross-entropy kernels), so backward allocates no second
    (..., S, V) tensor. The logits are garbage afterwards: use it for logits
    that nothing else reads after the loss (fresh from the LM head). An op that
    saved them for its own backward raises instead of reading garbage, through
    autograd's in-place version check.
    """
    if not isinstance(logits, torch.Tensor) or not isinstance(token_ids, torch.Tensor):
        raise TypeError(f"logits and token_ids must be torch.Tensors, got {type(logits).__name__} "
                        f"and {type(token_ids).__name__}")
    if not logits.is_floating_point():
        raise TypeError(f"logits must be a floating-point tensor, got dtype {logits.dtype}")
    if token_ids.is_floating_point() or token_ids.is_complex() or token_ids.dtype == torch.bool:
        raise TypeError(f"token_ids must be an integer tensor, got dtype {token_ids.dtype}")
    if logits.ndim < 2 or logits.shape[:-1] != token_ids.shape:
        raise ValueError(f"logits must have shape token_ids.shape + (V,) = {tuple(token_ids.shape)} + (V,), "
                         f"got {tuple(logits.shape)}")
    if not (isinstance(temperature, (int, float)) and temperature > 0):
        raise ValueError(f"temperature must be a number > 0, got {temperature!r}")
    if not (isinstance(chunk_elements, int) and chunk_elements > 0):
        raise ValueError(f"chunk_elements must be a positive int, got {chunk_elements!r}")
    vocab_size = logits.shape[-1]
    if token_ids.numel() and (token_ids.min() < 0 or token_ids.max() >= vocab_size):
        bad = (token_ids < 0) | (token_ids >= vocab_size)
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"token_ids must lie in [0, V = {vocab_size}), got {int(token_ids[where])} "
                         f"at position {where}")
    return _apply(logits, token_ids.long(), float(temperature), chunk_elements, bool(inplace_backward))


def _apply(logits: torch.Tensor, token_ids: torch.Tensor, temperature: float, chunk_elements: int,
           inplace_backward: bool):
    # A view as (rows, V) costs nothing; a strided slice (say logits[:, P - 1:-1])
    # cannot be viewed so, and reshape would copy all of it: go one leading index
    # at a time instead.
    try:
        flat = logits.view(-1, logits.shape[-1])
    except RuntimeError:
        if logits.numel() <= chunk_elements:  # small: one copy beats a Python loop over rows
            flat = logits.reshape(-1, logits.shape[-1])
            logp = _TokenLogprobs.apply(flat, token_ids.reshape(-1), temperature, chunk_elements, False)
            return logp.view(token_ids.shape)
        return torch.stack([_apply(logits[i], token_ids[i], temperature, chunk_elements, inplace_backward)
                            for i in range(logits.shape[0])])
    logp = _TokenLogprobs.apply(flat, token_ids.reshape(-1), temperature, chunk_elements, inplace_backward)
    return logp.view(token_ids.shape)


@torch.no_grad()
def token_entropies(logits: torch.Tensor, *, temperature: float = 1.0,
                    chunk_elements: int = CHUNK_ELEMENTS) -> torch.Tensor:
    """The entropy of softmax(logits / temperature) at every position, in nats: (..., V) -> (...).

    H = -sum_v p_v log p_v, a chunk of rows at a time as token_logprobs computes its log-softmax
    (float32 maths for bf16 logits). Detached: it decides which tokens train (entropy masking,
    grpo_edu.algorithm.loss.high_entropy_mask) and is logged, but is not itself trained.
    """
    if not (isinstance(temperature, (int, float)) and temperature > 0):
        raise ValueError(f"temperature must be a number > 0, got {temperature!r}")
    compute_dtype = torch.promote_types(logits.dtype, torch.float32)
    flat = logits.reshape(-1, logits.shape[-1])
    rows = _rows_per_chunk(flat.shape[-1], chunk_elements)
    entropy = torch.empty(flat.shape[0], dtype=compute_dtype, device=logits.device)
    for start in range(0, flat.shape[0], rows):
        log_p = torch.log_softmax(_scaled(flat[start:start + rows], compute_dtype, temperature), dim=-1)
        # p log p -> 0 as p -> 0; a -inf logit (p = 0 exactly) must not give 0 x -inf = nan.
        entropy[start:start + rows] = -torch.where(log_p > -math.inf, log_p.exp() * log_p, 0.0).sum(-1)
    return entropy.view(logits.shape[:-1])


# --------------------------------------------------------------------------- a causal LM

def position_ids_from_attention_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as `generate` uses: (..., T) -> (..., T).

    Row [pad, pad, a, b] gets positions [0, 0, 0, 1]: the first real token is
    position 0 whatever the padding, so training sees the positions sampling saw.
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def check_completion_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                            completion_mask: torch.Tensor) -> None:
    """input_ids, attention_mask (..., T) and completion_mask (..., S), 1 <= S < T, the
    completion's real tokens real in the attention mask too; else ValueError saying which."""
    if input_ids.shape != attention_mask.shape:
        raise ValueError(f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, "
                         f"got {tuple(attention_mask.shape)}")
    if input_ids.ndim < 2:
        raise ValueError(f"input_ids must have shape (..., T), got {tuple(input_ids.shape)}")
    S, T = completion_mask.shape[-1], input_ids.shape[-1]
    if completion_mask.shape[:-1] != input_ids.shape[:-1] or not 1 <= S < T:
        raise ValueError(f"completion_mask must have shape {tuple(input_ids.shape[:-1])} + (S,) with "
                         f"1 <= S < T = {T} (the prompt needs at least one column), "
                         f"got {tuple(completion_mask.shape)}")
    if (completion_mask.bool() & ~attention_mask[..., T - S:].bool()).any():
        raise ValueError("completion_mask marks a token that attention_mask marks as padding")


def completion_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        completion_mask: torch.Tensor, *, temperature: float = 1.0,
                        chunk_tokens: int | None = None,
                        chunk_elements: int = CHUNK_ELEMENTS, entropy: bool = False) -> torch.Tensor:
    """Log-probs of the completion tokens under a causal LM: -> (..., S).

    model: a transformers causal LM (LlamaForCausalLM, Qwen2ForCausalLM, ...)
    input_ids: (..., T) prompt (left-padded) then completion (right-padded); the
        completion is the last S = completion_mask.shape[-1] columns
    attention_mask: (..., T) 1 on real tokens
    completion_mask: (..., S) 1 on real completion tokens; the result is 0 elsewhere
    temperature: the sampler's temperature (logits are divided by it)
    chunk_tokens: None: one forward, logits for the last S + 1 positions only.
        An int: the LM head runs on this many positions at a time, recomputed
        in backward (activation checkpointing), so peak memory holds one
        chunk of logits, not N x S x V.
    entropy: instead of the log-probs, the entropies of the distributions the completion
        tokens were drawn from (token_entropies; detached), for entropy masking
    Leading dimensions ((B, G) or (N,)) are kept.

    The token at column j is predicted by the logits at column j - 1: the S
    completion tokens use the logits of columns T - S - 1 ... T - 2.
    """
    check_completion_inputs(input_ids, attention_mask, completion_mask)
    S, T = completion_mask.shape[-1], input_ids.shape[-1]
    if chunk_tokens is not None and not (isinstance(chunk_tokens, int) and chunk_tokens > 0):
        raise ValueError(f"chunk_tokens must be a positive int or None, got {chunk_tokens!r}")

    lead = input_ids.shape[:-1]
    ids = input_ids.reshape(-1, T)
    mask = attention_mask.reshape(-1, T)
    positions = position_ids_from_attention_mask(mask)
    completion_ids = ids[:, T - S:]
    if chunk_tokens is None:
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                       logits_to_keep=S + 1, use_cache=False).logits[:, :-1]
        if entropy:
            logp = token_entropies(logits, temperature=temperature, chunk_elements=chunk_elements)
        else:
            logp = token_logprobs(logits, completion_ids, temperature=temperature,
                                  chunk_elements=chunk_elements)
    else:
        logp = _chunked_head_logprobs(model, ids, mask, positions, completion_ids, temperature,
                                      chunk_tokens, chunk_elements, entropy)
    logp = logp.masked_fill(~completion_mask.reshape(-1, S).bool(), 0.0)
    return logp.reshape(*lead, S)


def _chunked_head_logprobs(model, ids, mask, positions, completion_ids, temperature, chunk_tokens,
                           chunk_elements, entropy=False):
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for attribute in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        if getattr(config, attribute, None) not in (None, 1, 1.0):
            raise NotImplementedError(f"chunk_tokens applies the LM head alone; this model also uses "
                                      f"{attribute} = {getattr(config, attribute)}: pass chunk_tokens=None")
    S = completion_ids.shape[-1]
    hidden = model.base_model(input_ids=ids, attention_mask=mask, position_ids=positions,
                              use_cache=False).last_hidden_state
    if entropy:
        head = model.get_output_embeddings()
        rows = hidden[:, -S - 1:-1]
        return torch.cat([token_entropies(head(part), temperature=temperature, chunk_elements=chunk_elements)
                          for part in rows.reshape(-1, rows.shape[-1]).split(chunk_tokens)]).view(rows.shape[:-1])
    return lm_head_logprobs(hidden[:, -S - 1:-1], model.get_output_embeddings(), completion_ids,
                            temperature=temperature, chunk_tokens=chunk_tokens, chunk_elements=chunk_elements)


def lm_head_logprobs(hidden: torch.Tensor, head, token_ids: torch.Tensor, *, temperature: float = 1.0,
                     chunk_tokens: int = 1024, chunk_elements: int = CHUNK_ELEMENTS) -> torch.Tensor:
    """log softmax(head(hidden) / T) at token_ids, chunk by chunk: (..., H), (...) -> (...).

    head: the LM head (an nn.Linear from H to V, or any callable). It runs on
    `chunk_tokens` positions at a time; under autograd each chunk is wrapped in
    activation checkpointing, so its (chunk_tokens, V) logits are freed after the
    forward and recomputed in backward. Peak memory: one chunk of logits (and
    its gradient), never (..., V).
    """
    if hidden.shape[:-1] != token_ids.shape:
        raise ValueError(f"hidden must have shape token_ids.shape + (H,) = {tuple(token_ids.shape)} + (H,), "
                         f"got {tuple(hidden.shape)}")
    if not (isinstance(chunk_tokens, int) and chunk_tokens > 0):
        raise ValueError(f"chunk_tokens must be a positive int, got {chunk_tokens!r}")
    rows = hidden.reshape(-1, hidden.shape[-1])  # (positions, H): small beside (positions, V)
    targets = token_ids.reshape(-1)

    def chunk_logprobs(h, t):
        # The chunk's logits are private to this function: their memory can hold their gradient.
        return token_logprobs(head(h), t, temperature=temperature, chunk_elements=chunk_elements,
                              inplace_backward=True)

    pieces = []
    for start in range(0, rows.shape[0], chunk_tokens):
        h, t = rows[start:start + chunk_tokens], targets[start:start + chunk_tokens]
        if torch.is_grad_enabled():
            pieces.append(checkpoint(chunk_logprobs, h, t, use_reentrant=False))
        else:
            pieces.append(chunk_logprobs(h, t))
    return torch.cat(pieces).reshape(token_ids.shape)


# --------------------------------------------------------------------------- values, checked

def check_logprob_values(name: str, value: torch.Tensor, mask: torch.Tensor,
                         where: Callable[[torch.Tensor], str] | None = None) -> None:
    """Log-probabilities on the tokens of `mask` must be finite and <= 0 (a little slack for
    rounding near p = 1); a clearly positive one means probabilities or logits were passed.
    `where` names the first offending element (default: its index)."""
    where = where or first_bad
    bad = mask & ~torch.isfinite(value)
    if bad.any():
        raise ValueError(f"{name} must be finite on completion tokens, got "
                         f"{value[tuple(bad.nonzero()[0])].item()} at {where(bad)}")
    positive = mask & (value > 1e-4)
    if positive.any():
        raise ValueError(f"{name} must hold log-probabilities (<= 0), got "
                         f"{value[tuple(positive.nonzero()[0])].item():.4g} at {where(positive)}: "
                         f"were probabilities or logits passed?")


def first_bad(bad: torch.Tensor) -> str:
    return "position " + str(tuple(int(i) for i in bad.nonzero()[0]))
