"""Rollout: G sampled completions per prompt, with the sampler's log-probabilities.

An engine turns B prompts into B * G completions in prompt-major order (row
b * G + g is completion g of prompt b), so `.view(B, G, ...)` recovers the
groups. Every engine returns the same `Rollout`; the trainer never needs to
know which engine sampled. `HFEngine` uses transformers' `generate` and runs
any causal LM; `grpo_edu.sampling.fused_llama.FusedEngine` is the CPU tier's fast
sampler for Llama-family models (a decoding loop over a shared KV cache);
`grpo_edu.sampling.vllm_engine.VLLMEngine` samples with vLLM (the GPU tier);
`grpo_edu.sampling.sglang_engine.SGLangEngine` asks an SGLang server over HTTP.

Shapes: N = B * G completions, P prompt columns (left-padded), S completion
columns (right-padded, S <= max_new_tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from grpo_edu.algorithm.logprobs import completion_logprobs
from grpo_edu.policy.models import eos_token_ids
from grpo_edu.runtime.distributed import World


TURN_STRIDE = 1_000_003   # an episode's turn t of rank r seeds seed + r + t x this (ranks never collide)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: G completions per prompt of at most max_new_tokens tokens, from
    softmax(logits / temperature) (no top-k / top-p: the log-probs the trainer
    recomputes must describe the distribution that was really sampled)."""

    num_generations: int
    max_new_tokens: int
    temperature: float = 1.0
    # Tokens that end a completion beside EOS, kept in it: a multi-turn episode's hand-over to
    # its environment (grpo_edu.training.episodes). Empty: EOS alone.
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if self.num_generations < 1:
            raise ValueError(f"num_generations must be >= 1, got {self.num_generations}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")


@dataclass
class Rollout:
    """What an engine returns; every tensor is on the engine's device."""

    prompt_ids: torch.Tensor       # (N, P) left-padded prompts, each repeated G times
    prompt_mask: torch.Tensor      # (N, P) 1 on real prompt tokens
    completion_ids: torch.Tensor   # (N, S) right-padded with the pad id
    completion_mask: torch.Tensor  # (N, S) 1 on real tokens, up to and including EOS
    sampler_logp: torch.Tensor     # (N, S) log softmax(logits / T) at the sampled ids, 0 on padding
    finished: torch.Tensor         # (N,) True if the completion ended with EOS (else truncated at S)
    num_generations: int           # G
    # Multi-turn episodes (grpo_edu.training.episodes) only; None for a single-turn rollout. The
    # completion columns then hold the whole episode: completion_mask marks the policy's
    # tokens, env_mask the environment's (context, never trained on; disjoint from it).
    env_mask: torch.Tensor | None = None     # (N, S) 1 on tokens the environment wrote
    # (N,) float64 per episode, on the CPU: env_reward (the environment's reward contributions,
    # summed), turns (the policy's), env_tokens, cut_answers and turn_limit (1 where it ended so)
    episode: dict[str, torch.Tensor] | None = None

    @property
    def num_prompts(self) -> int:
        return self.completion_ids.shape[0] // self.num_generations


class RolloutEngine(Protocol):
    """What the trainer asks of an engine (tests/test_engines.py: every engine's contract).

    Token ids in, token ids out (nothing is re-tokenised), in prompt-major order; the
    completion mask covers the tokens up to and including EOS; `finished` says which
    completions ended with EOS; the sampler's log-probs are those of softmax(logits / T) at
    the sampled ids."""

    def sync_weights(self) -> None:
        """Before every rollout, on every rank at once: sample from the trainer's current
        weights (an engine that samples with the policy module itself has nothing to do)."""

    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                 sampling: SamplingParams) -> Rollout:
        """prompt_ids, prompt_mask: (B, P) left-padded -> Rollout of B * G completions."""

    def seeded(self, rows: int, length: int, world: World, turns: int | None = None) -> "Seeded":
        """The random numbers of one training step's rollout, drawn now from torch's RNG, the
        same draws on every rank (each engine its own way: its own numbers or seeds); returns
        the generate that samples with them. rows: the step's B * G completions (every rank's);
        length: max_new_tokens; turns: an episode's most policy turns (None: one turn, no
        environment)."""


# generate(turn, prompt_ids, prompt_mask, sampling, rows): one policy turn, `rows` the step's
# rows (b * G + g over all ranks' prompts) the prompts' completions are; at turn 0 the prompts
# are whole groups' (G completions each), later one completion per prompt.
Seeded = Callable[[int, torch.Tensor, torch.Tensor, SamplingParams, torch.Tensor], Rollout]


def completion_mask_from_ids(completion_ids: torch.Tensor, eos_token_id: int | tuple[int, ...],
                             stop_token_ids: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, S) ids -> (mask (N, S), finished (N,)): tokens up to and including the
    first EOS (any of eos_token_id's: grpo_edu.policy.models.eos_token_ids) or stop
    token are real; everything after it is padding."""
    ends = torch.tensor([eos_token_id] if isinstance(eos_token_id, int) else [*eos_token_id],
                        dtype=completion_ids.dtype, device=completion_ids.device)
    is_eos = torch.isin(completion_ids, ends)
    for stop in stop_token_ids:
        is_eos |= completion_ids == stop
    finished = is_eos.any(dim=1)
    # Position of the first EOS, or S when there is none.
    first_eos = torch.where(finished, is_eos.int().argmax(dim=1),
                            torch.full_like(finished, completion_ids.shape[1], dtype=torch.long))
    positions = torch.arange(completion_ids.shape[1], device=completion_ids.device)
    return positions[None, :] <= first_eos[:, None], finished


class HFEngine:
    """Sampling with transformers' `model.generate` (KV cache, any causal LM). It stops at every
    EOS id of the model's files (eos_token_ids), as the other engines do."""

    def __init__(self, model, tokenizer):
        self.model = model
        self.tokenizer = tokenizer
        if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
            raise ValueError("tokenizer needs an eos and a pad token for batched generation")
        self.eos_token_ids = eos_token_ids(model, tokenizer)

    def sync_weights(self) -> None:
        """Samples with the policy module itself: nothing to copy."""

    def seeded(self, rows: int, length: int, world: World, turns: int | None = None) -> Seeded:
        """transformers draws from torch's RNG: one seed for the step, each rank and turn its
        own stream from it (seed + rank + turn x TURN_STRIDE). A rank's samples are
        reproducible, but depend on how the prompts are split among the ranks."""
        seed = int(torch.randint(0, 2**62, (1,)))
        devices = [world.device] if world.device.type == "cuda" else []

        def generate(turn: int, prompt_ids, prompt_mask, sampling: SamplingParams, batch_rows) -> Rollout:
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(seed + world.rank + TURN_STRIDE * turn)
                return self.generate(prompt_ids, prompt_mask, sampling)
        return generate

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                 sampling: SamplingParams, *, greedy: bool = False) -> Rollout:
        if prompt_ids.ndim != 2 or prompt_ids.shape != prompt_mask.shape:
            raise ValueError(f"prompt_ids and prompt_mask must both be (B, P), got "
                             f"{tuple(prompt_ids.shape)} and {tuple(prompt_mask.shape)}")
        if bool((prompt_mask[:, -1] == 0).any()):
            raise ValueError("prompts must be left-padded: prompt_mask[:, -1] must be 1 for every prompt")
        G, T = sampling.num_generations, sampling.temperature
        ids = prompt_ids.repeat_interleave(G, dim=0)
        mask = prompt_mask.repeat_interleave(G, dim=0)
        was_training = self.model.training
        self.model.eval()
        out = self.model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=sampling.max_new_tokens,
            do_sample=not greedy, temperature=None if greedy else T, top_k=None if greedy else 0,
            top_p=None if greedy else 1.0,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=[*self.eos_token_ids, *sampling.stop_token_ids],
            output_logits=True, return_dict_in_generate=True)
        self.model.train(was_training)
        completion_ids = out.sequences[:, ids.shape[1]:]
        completion_mask, finished = completion_mask_from_ids(completion_ids, self.eos_token_ids,
                                                             sampling.stop_token_ids)
        # out.logits: one (N, V) tensor per generated position, before temperature. Each becomes
        # its sampled token's log-prob on its own: stacking them first would hold N x S x V floats
        # several times over (a 151,936-token vocabulary, 64 completions of 256 tokens: 10 GB each).
        temperature = 1.0 if greedy else T
        sampler_logp = torch.stack([
            torch.log_softmax(step.float() / temperature, dim=-1).gather(-1, completion_ids[:, j, None]).squeeze(-1)
            for j, step in enumerate(out.logits)], dim=1)                              # (N, S)
        sampler_logp = sampler_logp.masked_fill(~completion_mask, 0.0)
        completion_ids = completion_ids.masked_fill(~completion_mask, self.tokenizer.pad_token_id)
        return Rollout(ids, mask, completion_ids, completion_mask, sampler_logp, finished, G)


def rollout_from_tokens(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                        completions: list[tuple[list[int], list[float]]], sampling: SamplingParams,
                        tokenizer, eos_ids: tuple[int, ...]) -> Rollout:
    """A server engine's answer -> the Rollout every engine returns: per completion, prompt-major
    (G per prompt), its token ids and each sampled token's log-prob (vLLM's and SGLang's).
    eos_ids: the model's EOS ids (eos_token_ids), which end a completion beside the stop tokens."""
    G, pad = sampling.num_generations, tokenizer.pad_token_id
    S = max(1, max(len(tokens) for tokens, _ in completions))
    ids = torch.full((len(completions), S), pad, dtype=torch.long)
    logp = torch.zeros(len(completions), S, dtype=torch.float32)
    for i, (tokens, logprobs) in enumerate(completions):
        ids[i, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        logp[i, :len(tokens)] = torch.tensor(logprobs, dtype=torch.float32)
    mask, _ = completion_mask_from_ids(ids, eos_ids, sampling.stop_token_ids)
    # A pad id that equals EOS would make padding look like an ending: only real tokens count.
    lengths = torch.tensor([len(tokens) for tokens, _ in completions])
    mask &= torch.arange(S)[None, :] < lengths[:, None]
    ends = torch.isin(ids, torch.tensor([*eos_ids, *sampling.stop_token_ids], dtype=torch.long))
    finished = ends.logical_and(mask).any(dim=1)
    device = prompt_ids.device
    return Rollout(prompt_ids.repeat_interleave(G, dim=0), prompt_mask.repeat_interleave(G, dim=0),
                   ids.masked_fill(~mask, pad).to(device), mask.to(device),
                   logp.masked_fill(~mask, 0.0).to(device), finished.to(device), G)


def make_hf_engine(config, models, tokenizer, world) -> HFEngine:
    """engine = "hf" (grpo_edu.sampling.engines): samples with the trainer's whole-weight policy."""
    return HFEngine(models.full_policy, tokenizer)


def transformers_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_mask: torch.Tensor,
                          *, temperature: float = 1.0, group_size: int = 1, entropy: bool = False) -> torch.Tensor:
    """The trainer's forward for every engine but fused: transformers' own, each row alone
    (grpo_edu.algorithm.logprobs.completion_logprobs; group_size is not used)."""
    return completion_logprobs(model, input_ids, attention_mask, completion_mask, temperature=temperature,
                               entropy=entropy)
