"""A fused forward for Llama-family models: the CPU tier's fast path.

transformers' LlamaForCausalLM spends most of a small model's time outside its
matrix products: for the 2-layer, 128-wide policy of the CPU tier the seven
projections of a layer are about a quarter of a forward pass, and some thirty
elementwise operations per layer (each RMSNorm is six, the rotary embedding of
q and k fourteen) are most of the rest. And a GRPO batch repeats each prompt G
times and pads every completion to the longest. This module computes the same
function with fewer operations and leaves out what need not be computed,
reading the model's own parameters (gradients reach them, LoRA's too: W + B A
per layer, grpo_edu.policy.lora; the optimizer and evaluation see a transformers model):

- Group packing (`group_logprobs`): each prompt runs once for its G
  completions, which attend to it and to their own earlier tokens through a
  block mask, at the positions they would have alone. Padding is not computed:
  a batch is one flat run of real tokens, placed on a padded grid only inside
  attention.
- RMSNorm's weight is folded into the projection that follows it,
  (x * r * w) @ W^T = (x * r) @ (W * w)^T; q, k and v are one matrix product,
  as are the MLP's gate and up; the residual additions ride in the output
  projections (torch.addmm).
- The rotary embedding is one complex multiplication for q and k together: their
  rows are permuted the same way (so every q . k is unchanged) to put each
  rotated pair side by side.
- `FusedEngine` samples with a plain decoding loop over a preallocated KV cache:
  each prompt is prefilled once and its cache shared by its G completions, and
  rows that have finished leave the batch (model.generate re-runs each prompt G
  times and spends milliseconds per token on bookkeeping).

The maths is transformers': float32 (or float64), the same RoPE angles, causal
attention that skips left padding. tests/test_fused_llama.py holds logits,
log-probs and parameter gradients equal to transformers' forward to 1e-10 in
float64 for Llama, grouped-query Llama and Qwen2 (biased q, k, v), for any
prompt padding and completion lengths, and the engine's greedy output equal to
`generate`'s. Other models and features (scaled RoPE, sliding windows, biased
MLPs, bf16 weights) are refused by name: train those with
`engine = "hf"` (transformers' forward and generate).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from grpo_edu.algorithm.logprobs import check_completion_inputs, position_ids_from_attention_mask, token_entropies, token_logprobs
from grpo_edu.policy.lora import effective_weight as weight
from grpo_edu.runtime.distributed import World
from grpo_edu.policy.models import eos_token_ids
from grpo_edu.sampling.rollout import Rollout, SamplingParams, Seeded, completion_mask_from_ids

SUPPORTED_MODELS = ("LlamaForCausalLM", "Qwen2ForCausalLM")


def check_supported(model) -> None:
    """Raise ValueError naming the first feature this module does not implement."""
    name = type(model).__name__
    if name not in SUPPORTED_MODELS:
        raise ValueError(f"fused_llama supports {SUPPORTED_MODELS}, got {name}; "
                         f"use engine = 'hf' (transformers' forward) for this model")
    config = model.config
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    problems = {
        "hidden_act": (getattr(config, "hidden_act", "silu"), "silu"),
        "rope_type": (rope.get("rope_type", rope.get("type", "default")), "default"),
        "mlp_bias": (getattr(config, "mlp_bias", False), False),
        "pretraining_tp": (getattr(config, "pretraining_tp", 1), 1),
        "use_sliding_window": (getattr(config, "use_sliding_window", False), False),
    }
    for key, (value, wanted) in problems.items():
        if value != wanted:
            raise ValueError(f"fused_llama implements {key} = {wanted!r}, this model has {value!r}; "
                             f"use engine = 'hf' (transformers' forward) for this model")
    if model.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"fused_llama computes in float32 or float64, this model is {model.dtype}; "
                         f"use engine = 'hf' (transformers' forward) for this model")


@dataclass
class _Layer:
    qkv: torch.Tensor            # (H, (Hq + 2 Hkv) D): [q, k, v] columns, norm weight folded in
    qkv_bias: torch.Tensor | None
    o: torch.Tensor              # (Hq * D, H)
    gate_up: torch.Tensor        # (H, 2 * I): [gate, up] columns, norm weight folded in
    down: torch.Tensor           # (I, H)


@dataclass
class FusedWeights:
    """The model's parameters rearranged for the fused forward (built by `fuse`,
    with differentiable ops, so gradients flow back to the model's parameters)."""

    embed: torch.Tensor          # (V, H)
    layers: list[_Layer]
    head: torch.Tensor           # (H, V) final norm weight folded in
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    inv_freq: torch.Tensor       # (D / 2,) RoPE frequencies
    attention_scaling: float


def _interleave(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Reorder each head's rows from transformers' half-split RoPE layout (x_i pairs with
    x_{i + D/2}) to interleaved pairs (x_0, x_{D/2}, x_1, x_{D/2 + 1}, ...). q and k get
    the same permutation, so every q . k (and the attention) is unchanged, and each
    rotated pair is adjacent: one complex multiplication applies the embedding."""
    w = weight.view(heads, 2, -1, *weight.shape[1:])        # (heads, half-split, D/2, ...)
    return w.transpose(1, 2).reshape(weight.shape)


def fuse(model) -> FusedWeights:
    """Rearrange `model`'s parameters; cheap (a few weight-sized copies), call it per forward."""
    check_supported(model)
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    layers = []
    for layer in model.model.layers:
        attention, mlp = layer.self_attn, layer.mlp
        q, k, v = attention.q_proj, attention.k_proj, attention.v_proj   # W + (alpha / r) B A under LoRA
        qkv = (torch.cat([_interleave(weight(q), heads), _interleave(weight(k), kv_heads), weight(v)])
               * layer.input_layernorm.weight).t()
        bias = None
        if q.bias is not None:
            bias = torch.cat([_interleave(q.bias, heads), _interleave(k.bias, kv_heads), v.bias])
        gate_up = (torch.cat([weight(mlp.gate_proj), weight(mlp.up_proj)])
                   * layer.post_attention_layernorm.weight).t()
        layers.append(_Layer(qkv, bias, weight(attention.o_proj).t(), gate_up, weight(mlp.down_proj).t()))
    rotary = model.model.rotary_emb
    return FusedWeights(
        embed=model.model.embed_tokens.weight, layers=layers,
        head=(model.lm_head.weight * model.model.norm.weight).t(),
        heads=heads, kv_heads=kv_heads, head_dim=head_dim, eps=config.rms_norm_eps,
        inv_freq=rotary.inv_freq, attention_scaling=float(rotary.attention_scaling))


def _normalise(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) without the weight (folded into the next projection)."""
    mean_square = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(mean_square + eps)


def _project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    out = flat @ weight if bias is None else torch.addmm(bias, flat, weight)
    return out.view(*x.shape[:-1], weight.shape[1])


def _add_projection(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """residual + x @ weight, the addition inside the matrix product."""
    out = torch.addmm(residual.reshape(-1, residual.shape[-1]), x.reshape(-1, x.shape[-1]), weight)
    return out.view(residual.shape)


def rope_tables(weights: FusedWeights, positions: torch.Tensor) -> torch.Tensor:
    """e^{i theta} for `positions` (...,) -> complex (..., 1, D/2), the angles computed as
    transformers computes them, once per distinct position (a table), not per token."""
    table = torch.arange(int(positions.max()) + 1, device=positions.device, dtype=torch.float32)
    angles = table[:, None] * weights.inv_freq.float()
    scale = weights.attention_scaling
    rotation = torch.complex(angles.cos() * scale, angles.sin() * scale)
    return rotation[positions].unsqueeze(-2)


def _qkv(layer: _Layer, weights: FusedWeights, x: torch.Tensor, rotation: torch.Tensor, layout=None):
    """x (..., H) -> q (..., Hq, D), k, v (..., Hkv, D): normalised, projected, RoPE
    applied (q and k in the interleaved layout, see _interleave). With a flat
    `layout` (see _attend), x is (tokens, H) and q, k, v come out on the (B, L) grid."""
    D, Hq, Hkv = weights.head_dim, weights.heads, weights.kv_heads
    out = _project(_normalise(x, weights.eps), layer.qkv, layer.qkv_bias)
    if layout is not None:                       # one scatter for q, k and v together
        flat, B, L = layout[2:]
        out = out.new_zeros(B * L, out.shape[-1]).index_copy(0, flat, out).view(B, L, -1)
    # split, not slicing: its backward concatenates instead of zero-filling copies.
    qk, v = out.split([(Hq + Hkv) * D, Hkv * D], dim=-1)
    pairs = torch.view_as_complex(qk.unflatten(-1, (Hq + Hkv, D // 2, 2)))
    qk = torch.view_as_real(pairs * rotation).flatten(-2)               # (..., T, Hq + Hkv, D)
    q, k = qk.split([Hq, Hkv], dim=-2)
    return q, k, v.unflatten(-1, (Hkv, D))


def _mlp_block(layer: _Layer, weights: FusedWeights, x: torch.Tensor) -> torch.Tensor:
    gate, up = _project(_normalise(x, weights.eps), layer.gate_up).chunk(2, dim=-1)
    return _add_projection(x, F.silu(gate) * up, layer.down)


def _attend(q, k, v, mask, weights: FusedWeights, layout=None):
    """Causal self-attention: q (N, T, Hq, D), k, v (N, T, Hkv, D), mask (N, 1, T, T),
    True = may attend -> (N, T, Hq * D). With a flat layout = (rows, columns, flat, B, L),
    the inputs are on the (B, L) grid and the output is gathered back to the flat
    tokens (tokens, Hq * D): token i sits at (rows[i], columns[i]) of the grid, entry
    flat[i] = rows[i] * L + columns[i] of its rows, the only place padding exists."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=mask, enable_gqa=weights.kv_heads != weights.heads)
    out = out.transpose(1, 2).flatten(2)          # (N, T, Hq * D)
    # A gather of whole rows: index_select, whose backward adds each row's gradient into zeros
    # (the same bits as advanced indexing's accumulating index_put, without its sort).
    return out if layout is None else out.reshape(-1, out.shape[-1]).index_select(0, layout[2])


def _forward(weights: FusedWeights, input_ids: torch.Tensor, positions: torch.Tensor,
             mask: torch.Tensor, layout=None) -> torch.Tensor:
    """Ids at `positions` -> final normalised hidden states (the final norm's weight is
    folded into `weights.head`). Padded: (N, T) -> (N, T, H). Flat: (tokens,) ->
    (tokens, H), `positions` given on the (B, L) grid of `layout` (see _attend)."""
    x = F.embedding(input_ids, weights.embed)
    rotation = rope_tables(weights, positions)
    for layer in weights.layers:
        q, k, v = _qkv(layer, weights, x, rotation, layout)
        x = _add_projection(x, _attend(q, k, v, mask, weights, layout), layer.o)
        x = _mlp_block(layer, weights, x)
    return _normalise(x, weights.eps)


def _causal_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(N, T) -> (N, 1, T, T): causal, padding is never a key; a padding query sees
    itself so that no row of the softmax is empty."""
    T = attention_mask.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool, device=attention_mask.device).tril()
    eye = torch.eye(T, dtype=torch.bool, device=attention_mask.device)
    return (causal & (attention_mask.bool()[:, None, :] | eye))[:, None]


def logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(N, T) -> (N, T, V) logits, as transformers' model(input_ids, attention_mask,
    position_ids=position_ids_from_attention_mask(attention_mask)).logits."""
    weights = fuse(model)
    hidden = _forward(weights, input_ids, position_ids_from_attention_mask(attention_mask),
                      _causal_mask(attention_mask))
    return _project(hidden, weights.head)


def group_logprobs(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                   completion_mask: torch.Tensor, *, temperature: float = 1.0,
                   completion_attention: torch.Tensor | None = None, entropy: bool = False) -> torch.Tensor:
    """Log-probs of G completions of each prompt, with the prompt computed once: -> (B, G, S).

    prompt_ids, prompt_mask: (B, P) left-padded; completion_ids, completion_mask:
    (B, G, S) right-padded; completion_attention (default completion_mask): the
    completion tokens that later tokens attend to, as the attention mask of the
    unpacked forward. entropy: the entropies the tokens were drawn at instead (token_entropies).

    Each row of the forward pass is one group, packed without padding:

        [prompt | completion 1 | completion 2 | ... | completion G]

    Completion g attends to the prompt and to its own earlier tokens only (a
    block mask), at the positions it has in its own sequence. Every token sees
    exactly the keys and positions of the unpacked forward, so the result is the
    same function (to float rounding); the prompt runs once instead of G times,
    padding is not computed at all, and attention is B problems instead of B * G.
    """
    B, G, S = completion_ids.shape
    P = prompt_ids.shape[-1]
    device = prompt_ids.device
    attended = (completion_mask if completion_attention is None else completion_attention).bool()
    scored = completion_mask.bool()
    # Unpacked layout (B, P + G * S): the prompt, then each completion's S columns.
    ids = torch.cat([prompt_ids, completion_ids.reshape(B, G * S)], dim=1)
    keep = torch.cat([prompt_mask.bool(), attended.reshape(B, G * S)], dim=1)
    prompt_length = prompt_mask.sum(-1)                                  # (B,)
    positions = torch.cat([prompt_mask.long().cumsum(-1) - 1,
                           (prompt_length[:, None, None] + attended.long().cumsum(-1) - 1).reshape(B, G * S)], 1)
    block = torch.cat([torch.full((P,), -1, device=device),
                       torch.arange(G, device=device).repeat_interleave(S)]).expand(B, -1)
    # A scored token is predicted by the column before it, which must be a real token.
    previous = torch.cat([prompt_mask[:, -1:].bool().expand(B, G)[..., None], attended[..., :-1]], dim=-1)
    if bool((scored & ~previous).any()):
        raise ValueError("every scored completion token must follow a real (attended) token")

    # Pack: only the kept entries are computed, as one flat run of tokens; for attention
    # each group is a row of a (B, L) grid, right-padded to the longest.
    rows, entries = keep.nonzero(as_tuple=True)                           # row-major: the flat order
    column = keep.long().cumsum(-1) - 1                                   # grid column of each kept entry
    L = int(column[:, -1].max()) + 1
    columns = column[rows, entries]
    layout = (rows, columns, rows * L + columns, B, L)
    grid_block = block.new_full((B, L), -2).index_put(layout[:2], block[rows, entries])   # -2: padding
    grid_positions = positions.new_zeros(B, L).index_put(layout[:2], positions[rows, entries])
    real = grid_block != -2
    # Query i may see key j <= i that is real and in the prompt or in i's own completion.
    causal = torch.ones(L, L, dtype=torch.bool, device=device).tril()
    visible = (grid_block[:, None, :] == -1) | (grid_block[:, None, :] == grid_block[:, :, None])
    eye = torch.eye(L, dtype=torch.bool, device=device)
    mask = ((causal & visible & real[:, None, :]) | eye)[:, None]

    weights = fuse(model)
    hidden = _forward(weights, ids[rows, entries], grid_positions, mask, layout)   # (tokens, H)
    # Completion token (g, s) is predicted by the token at unpacked column
    # P + g * S + s - 1 (s > 0), or at the prompt's last column P - 1 (s = 0).
    predictor = P + torch.arange(G, device=device)[:, None] * S + torch.arange(S, device=device) - 1
    predictor[:, 0] = P - 1
    flat_index = (keep.reshape(-1).long().cumsum(0) - 1).view(B, -1)     # flat position of each entry
    # index_select: its backward adds rows into zeros without sorting (padding's rows get zero gradients)
    picked = hidden.index_select(0, flat_index[:, predictor.reshape(-1)].clamp(min=0).reshape(-1))
    picked = picked.view(B, G * S, -1)                                     # (B, G * S, H)
    logits = _project(picked, weights.head).view(B, G, S, -1)
    logp = (token_entropies(logits, temperature=temperature) if entropy
            else token_logprobs(logits, completion_ids, temperature=temperature))
    return logp.masked_fill(~scored, 0.0)


def completion_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        completion_mask: torch.Tensor, *, temperature: float = 1.0,
                        group_size: int = 1, entropy: bool = False) -> torch.Tensor:
    """grpo_edu.algorithm.logprobs.completion_logprobs through the fused forward: (N, T) -> (N, S).

    group_size: rows come in consecutive groups of this many completions of one
    prompt (the rollout's prompt-major order); each group's prompt is computed
    once (`group_logprobs`). 1 treats every row alone.
    """
    check_completion_inputs(input_ids, attention_mask, completion_mask)
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be (N, T) rows in prompt-major order, got {tuple(input_ids.shape)}")
    S, T = completion_mask.shape[-1], input_ids.shape[-1]
    N, P = input_ids.shape[0], T - S
    if not (isinstance(group_size, int) and group_size >= 1 and N % group_size == 0):
        raise ValueError(f"group_size must be a positive int dividing the {N} rows, got {group_size!r}")
    G, B = group_size, N // group_size
    prompt_ids, prompt_mask = input_ids[:, :P].view(B, G, P), attention_mask[:, :P].view(B, G, P)
    if not (torch.equal(prompt_ids, prompt_ids[:, :1].expand_as(prompt_ids))
            and torch.equal(prompt_mask, prompt_mask[:, :1].expand_as(prompt_mask))):
        raise ValueError(f"group_size={G}: rows of one group must share their prompt columns")
    logp = group_logprobs(model, prompt_ids[:, 0], prompt_mask[:, 0], input_ids[:, P:].view(B, G, S),
                          completion_mask.view(B, G, S), temperature=temperature,
                          completion_attention=attention_mask[:, P:].reshape(B, G, S), entropy=entropy)
    return logp.view(N, S)


def _sample(logp: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One token per row from exp(logp) (N, V), by inverting the cumulative distribution:
    token i where cdf[i-1] <= u * cdf[V-1] < cdf[i], for the row's u ~ U[0, 1) in
    `uniform` (N,). Exact for the float32 probabilities (a zero-probability token is
    never drawn), and one random number per row where torch.multinomial draws V."""
    cdf = logp.exp().cumsum(-1)
    total = cdf[:, -1:].contiguous()
    u = uniform.to(cdf.dtype)[:, None] * total
    token = torch.searchsorted(cdf, u, right=True)
    # u * total can round up to total itself: then take the last token of positive probability.
    last = torch.searchsorted(cdf, total)
    return torch.minimum(token, last).squeeze(-1)


class FusedEngine:
    """The rollout engine of the fused path: prompts run once, a shared KV cache, a plain decode loop.

    Same contract as grpo_edu.sampling.rollout.HFEngine (prompt-major Rollout, sampler
    log-probs at the sampling temperature, masks that end at any EOS id of the model's files).
    """

    def __init__(self, model, tokenizer):
        check_supported(model)   # at construction, so a trainer fails before its first step
        if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
            raise ValueError("tokenizer needs an eos and a pad token for batched generation")
        self.model, self.tokenizer = model, tokenizer
        self.eos_token_ids = eos_token_ids(model, tokenizer)

    def sync_weights(self) -> None:
        """Samples with the policy module itself (fused afresh each call): nothing to copy."""

    def seeded(self, rows: int, length: int, world: World, turns: int | None = None) -> Seeded:
        """One table of U[0, 1) numbers for every row (and turn) of the step, drawn on every rank
        alike; each rank samples its rows' numbers, so the rollout does not depend on the number
        of ranks."""
        table = torch.rand(rows, length) if turns is None else torch.rand(rows, turns, length)

        def generate(turn: int, prompt_ids, prompt_mask, sampling: SamplingParams, batch_rows) -> Rollout:
            uniforms = table[batch_rows] if turns is None else table[batch_rows, turn, :sampling.max_new_tokens]
            return self.generate(prompt_ids, prompt_mask, sampling, uniforms=uniforms.to(world.device))
        return generate

    @torch.inference_mode()
    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, sampling: SamplingParams, *,
                 greedy: bool = False, uniforms: torch.Tensor | None = None) -> Rollout:
        """uniforms: (B * G, max_new_tokens) the U[0, 1) number each completion's token t is
        drawn with (default: drawn here, in one call). A completion's tokens depend only on
        its own row, whatever else is in the batch: a trainer that draws the table for a
        whole batch and hands each process its rows samples what one process would."""
        if prompt_ids.ndim != 2 or prompt_ids.shape != prompt_mask.shape:
            raise ValueError(f"prompt_ids and prompt_mask must both be (B, P), got "
                             f"{tuple(prompt_ids.shape)} and {tuple(prompt_mask.shape)}")
        if bool((prompt_mask[:, -1] == 0).any()):
            raise ValueError("prompts must be left-padded: prompt_mask[:, -1] must be 1 for every prompt")
        G, L, T = sampling.num_generations, sampling.max_new_tokens, sampling.temperature
        B, P = prompt_ids.shape
        N = B * G
        if uniforms is None and not greedy:
            uniforms = torch.rand(N, L, device=prompt_ids.device)
        elif uniforms is not None and uniforms.shape != (N, L):
            raise ValueError(f"uniforms must have shape (B * G, max_new_tokens) = ({N}, {L}), "
                             f"got {tuple(uniforms.shape)}")
        weights = fuse(self.model)
        D, Hkv = weights.head_dim, weights.kv_heads
        pad = self.tokenizer.pad_token_id
        ends = torch.tensor([*self.eos_token_ids, *sampling.stop_token_ids], device=prompt_ids.device)

        # Prefill: B prompts, then every cache row is repeated for the prompt's G completions.
        real = prompt_mask.bool()
        positions = position_ids_from_attention_mask(prompt_mask)
        # One RoPE table for every position this call reaches: the prompts' and L more.
        rotations = rope_tables(weights, torch.arange(int(positions.max()) + 1 + L, device=prompt_ids.device))
        x = F.embedding(prompt_ids, weights.embed)
        rotation = rotations[positions]                                   # (B, P, 1, D/2)
        mask = _causal_mask(prompt_mask)
        keys = torch.empty(len(weights.layers), N, Hkv, P + L, D, dtype=x.dtype, device=x.device)
        values = torch.empty_like(keys)
        for i, layer in enumerate(weights.layers):
            q, k, v = _qkv(layer, weights, x, rotation)                  # (B, P, heads, D)
            keys[i, :, :, :P] = k.transpose(1, 2).repeat_interleave(G, dim=0)
            values[i, :, :, :P] = v.transpose(1, 2).repeat_interleave(G, dim=0)
            x = _add_projection(x, _attend(q, k, v, mask, weights), layer.o)
            x = _mlp_block(layer, weights, x)
        step_logits = _project(_normalise(x[:, -1], weights.eps), weights.head).repeat_interleave(G, dim=0)

        # Keys a new token may attend to: the real prompt tokens, then every generated one.
        key_bias = torch.zeros(N, 1, 1, P + L, dtype=x.dtype, device=x.device)
        key_bias[:, 0, 0, :P].masked_fill_(~real.repeat_interleave(G, dim=0), float("-inf"))
        position = positions[:, -1].repeat_interleave(G) + 1             # (N,) next token's position
        scale = D ** -0.5
        group = weights.heads // Hkv
        tokens = torch.full((N, L), pad, dtype=torch.long, device=x.device)
        logp = torch.zeros(N, L, dtype=torch.float32, device=x.device)
        rows = torch.arange(N, device=x.device)     # the completions still in the batch
        done = torch.zeros(N, dtype=torch.bool, device=x.device)
        steps = 0
        for t in range(L):
            step_logp = torch.log_softmax(step_logits.float() / (1.0 if greedy else T), dim=-1)
            token = step_logp.argmax(-1) if greedy else _sample(step_logp, uniforms[rows, t])
            token = token.masked_fill(done, pad)
            tokens[rows, t] = token
            logp[rows, t] = step_logp.gather(-1, token[:, None]).squeeze(-1)
            # any EOS id of the model's, or a turn handed to the environment (grpo_edu.training.episodes)
            done |= torch.isin(token, ends)
            steps = t + 1
            if t == L - 1 or bool(done.all()):
                break
            if 4 * int(done.sum()) >= len(rows):
                # A quarter of the batch has finished: drop those rows (and their cache)
                # so later steps compute only what is still being written.
                keep = ~done
                rows, token, position, done = rows[keep], token[keep], position[keep], done[keep]
                keys, values, key_bias = keys[:, keep], values[:, keep], key_bias[keep]
            n = len(rows)
            x = F.embedding(token, weights.embed)[:, None]                # (n, 1, H)
            rotation = rotations[position].unsqueeze(1)                 # (n, 1, 1, D/2)
            column = P + t
            for i, layer in enumerate(weights.layers):
                q, k, v = _qkv(layer, weights, x, rotation)              # q (n, 1, Hq, D)
                keys[i, :, :, column] = k[:, 0]
                values[i, :, :, column] = v[:, 0]
                # One query per row: two small matrix products beat the fused attention kernel.
                q = q.view(n, Hkv, group, D)
                scores = torch.matmul(q, keys[i, :, :, :column + 1].transpose(-1, -2)) * scale
                probabilities = torch.softmax(scores + key_bias[..., :column + 1], dim=-1)
                attended = torch.matmul(probabilities, values[i, :, :, :column + 1]).reshape(n, 1, -1)
                x = _add_projection(x, attended, layer.o)
                x = _mlp_block(layer, weights, x)
            step_logits = _project(_normalise(x[:, 0], weights.eps), weights.head)
            position = position + 1

        completion_ids = tokens[:, :steps]
        completion_mask, finished = completion_mask_from_ids(completion_ids, self.eos_token_ids,
                                                             sampling.stop_token_ids)
        sampler_logp = logp[:, :steps].masked_fill(~completion_mask, 0.0)
        completion_ids = completion_ids.masked_fill(~completion_mask, pad)
        return Rollout(prompt_ids.repeat_interleave(G, dim=0), prompt_mask.repeat_interleave(G, dim=0),
                       completion_ids, completion_mask, sampler_logp, finished, G)


def make_engine(config, models, tokenizer, world) -> FusedEngine:
    """engine = "fused" (grpo_edu.sampling.engines): samples with the trainer's whole-weight policy."""
    return FusedEngine(models.full_policy, tokenizer)
