"""The loss types: how the per-token losses l_t of a batch add up to one number.

Every loss type is a weighted sum of the real tokens' l_t; they differ only in each token's
weight, and each is one registered function that returns the two divisors of
loss = sum_i (sum_t mask l_t) / row_i / batch:

    grpo     1 / (n |o_i|)        token mean per response, then mean over the n responses
    bnpo     1 / num_items        token mean over the batch (num_items: its token count)
    dr_grpo  1 / (n L)            L = max_completion_length, a constant (Liu et al., 2025,
                                  "Understanding R1-Zero-Like Training")
    dapo     1 / num_items        num_items: the tokens of an optimizer step's share of the
                                  generation batch (Yu et al., 2025, DAPO)

so under grpo a token of a long response weighs less than a token of a short one (the
length bias chapter 4 measures); the other three give every token the same weight.

n and num_items default to the batch passed in. A batch split into parts (micro-batches, or
the shares of several processes) passes the whole batch's Counts to each part: the parts'
losses then add up to the whole batch's loss exactly.

    AGGREGATIONS         name -> Aggregation(divisors, num_items): divisors(mask (N, S) float, Counts)
                         -> (row (N, 1) or None, batch), and the token count num_items a
                         mini-batch's loss divides by (grpo_edu.training.plan passes it)
    aggregation(name)    registers one (a new loss type is one function and its test)
    aggregate            per-token losses (N, S) -> the scalar loss
    aggregation_weights  each token's weight: d loss / d per_token_loss
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from grpo_edu.runtime.registry import registrar


@dataclass(frozen=True)
class Counts:
    """What a part's loss divides by: the whole batch's completions n (num_completions) and
    tokens (num_items), and the generation limit L (max_completion_length). None: this batch's."""

    max_completion_length: int | None = None
    num_items: float | torch.Tensor | None = None
    num_completions: int | None = None


Divisors = Callable[[torch.Tensor, Counts], tuple]
# lengths (B, G) real tokens, the mini-batch's prompts, every mini-batch's prompts -> num_items
TokenCount = Callable[[torch.Tensor, torch.Tensor, list], float]


def mini_batch_tokens(lengths: torch.Tensor, chosen: torch.Tensor, mini_batches: list) -> float:
    """The mini-batch's own token count (bnpo's num_items; unused by grpo and dr_grpo)."""
    return float(lengths[chosen].sum())


def step_share_of_rollout_tokens(lengths: torch.Tensor, chosen: torch.Tensor, mini_batches: list) -> float:
    """dapo, as TRL 1.16: every token of the rollout weighs the same in every optimizer step,
    1 / (rollout tokens / num_mini_batches), whichever mini-batch holds it. TRL divides by
    num_items_in_batch (the generation batch's tokens) x gradient_accumulation_steps /
    steps_per_generation, i.e. by the tokens per optimizer step; not by the mini-batch's own
    count, which would weigh the tokens of a short mini-batch more. Filtered groups do not
    count: they are not trained on."""
    trained = torch.cat(mini_batches)
    return int(lengths[trained].sum()) / len(mini_batches)


@dataclass(frozen=True)
class Aggregation:
    """A registered loss type: its divisors and the token count its num_items is."""

    divisors: Divisors
    num_items: TokenCount = mini_batch_tokens


AGGREGATIONS: dict[str, Aggregation] = {}


def aggregation(name: str, *, num_items: TokenCount = mini_batch_tokens):
    """@aggregation("name") registers `divisors` as loss type `name` (config key loss_type), with
    the token count a mini-batch's loss divides by (default: its own tokens)."""
    def register(divisors: Divisors) -> Divisors:
        AGGREGATIONS[name] = Aggregation(divisors, num_items)
        return divisors
    return register


@aggregation("grpo")
def per_response_mean(mask: torch.Tensor, counts: Counts):
    """Token mean per response, then mean over the n responses: 1 / (n |o_i|)."""
    return mask.sum(-1, keepdim=True).clamp(min=1), completions(counts, mask)


@aggregation("bnpo")
def batch_token_mean(mask: torch.Tensor, counts: Counts):
    """Token mean over the whole batch: 1 / num_items."""
    return None, tokens(counts, mask)


@aggregation("dr_grpo")
def constant_length(mask: torch.Tensor, counts: Counts):
    """Dr. GRPO: sum over n responses of L tokens each, L the generation limit: 1 / (n L)."""
    length = max_length(counts.max_completion_length, mask.sum(-1))
    return None, completions(counts, mask) * length


@aggregation("dapo", num_items=step_share_of_rollout_tokens)
def step_token_mean(mask: torch.Tensor, counts: Counts):
    """DAPO's token-level mean: 1 / num_items, the tokens of an optimizer step's share of the
    generation batch (grpo_edu.training.scoring passes it)."""
    return None, tokens(counts, mask)


LOSS_TYPES = tuple(AGGREGATIONS)


def check_loss_type(loss_type: str, name: str = "loss_type") -> None:
    if loss_type not in AGGREGATIONS:
        raise ValueError(f"{name} must be one of {tuple(AGGREGATIONS)}, got {loss_type!r}")


def divisors(mask: torch.Tensor, loss_type: str, counts: Counts):
    """The registered loss type's (row, batch) for mask (N, S) float."""
    check_loss_type(loss_type)
    return AGGREGATIONS[loss_type].divisors(mask, counts)


def aggregation_weights(completion_mask: torch.Tensor, loss_type: str = "grpo", *,
                        max_completion_length: int | None = None,
                        num_items: float | torch.Tensor | None = None,
                        num_completions: int | None = None) -> torch.Tensor:
    """The weight of each token in the loss: mask (..., S) -> weights (..., S).

    loss = sum(weights * per_token_loss), so this is also d loss / d per_token_loss:
    how hard each token is pushed. 0 on padding.
    """
    mask = completion_mask.reshape(-1, completion_mask.shape[-1]).to(torch.float64)
    row, batch = divisors(mask, loss_type, Counts(max_completion_length, num_items, num_completions))
    weights = (mask if row is None else mask / row) / float(batch)
    return weights.reshape(completion_mask.shape)


def aggregate(per_token_loss: torch.Tensor, completion_mask: torch.Tensor, loss_type: str = "grpo", *,
              max_completion_length: int | None = None,
              num_items: float | torch.Tensor | None = None,
              num_completions: int | None = None) -> torch.Tensor:
    """Reduce per-token losses (N, S) to the scalar loss the way `loss_type` says.

    per_token_loss must already be 0 on padding (grpo_loss makes it so).
    """
    mask = completion_mask.to(per_token_loss.dtype)
    row, batch = divisors(mask, loss_type, Counts(max_completion_length, num_items, num_completions))
    total = (per_token_loss * mask).sum() if row is None else ((per_token_loss * mask).sum(-1, keepdim=True) / row).sum()
    return total / batch


# --------------------------------------------------------------------------- the counts, checked

def max_length(max_completion_length, lengths: torch.Tensor) -> int:
    """L of dr_grpo: given, a positive int, and at least the longest completion."""
    if max_completion_length is None:
        raise ValueError("loss_type='dr_grpo' needs max_completion_length (the generation limit L "
                         "in sum / (N L)); it is not inferred from the padded width, which would "
                         "make the loss depend on padding")
    if isinstance(max_completion_length, bool) or not isinstance(max_completion_length, int) \
            or max_completion_length < 1:
        raise ValueError(f"max_completion_length must be a positive int, got {max_completion_length!r}")
    longest = int(lengths.max().item()) if lengths.numel() else 0
    if longest > max_completion_length:
        raise ValueError(f"max_completion_length = {max_completion_length} is shorter than the longest "
                         f"completion in completion_mask ({longest} tokens)")
    return max_completion_length


def tokens(counts: Counts, mask: torch.Tensor):
    """num_items, or this batch's token count (0 only when every completion is excluded: the loss is then 0)."""
    num_items = counts.num_items
    if num_items is None:
        return mask.sum().clamp(min=1)
    value = float(num_items.item() if isinstance(num_items, torch.Tensor) else num_items)
    if not value > 0:
        raise ValueError(f"num_items (the token count bnpo and dapo divide by) must be > 0, "
                         f"got {num_items!r}")
    return num_items.to(mask.dtype) if isinstance(num_items, torch.Tensor) else value


def completions(counts: Counts, mask: torch.Tensor) -> int:
    """num_completions, or this batch's rows."""
    value = counts.num_completions
    if value is None:
        return mask.shape[0]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"num_completions (the whole batch's completion count) must be a positive int, got {value!r}")
    return value
