"""The GRPO loss on padded, masked batches, with its variants and diagnostics.

Per-token tensors are (B, G, S) (B prompts, G completions each, S completion
columns) or already flat (N, S) with N = B * G; advantages are (B, G) or (N,), or per
token (logp's shape: process supervision, grpo_edu.environment.process).
`completion_mask` is 1 on a completion's real tokens and 0 on right padding.

    rho_t    = exp(logp_t - old_logp_t)                  token ratio ("token" level)
    rho_i    = exp(mean_t (logp_t - old_logp_t))         one ratio per response (GSPO)
    policy_t = -min(rho A, clip(rho, 1 - epsilon, 1 + epsilon_high) A)
    kl_t     = k1 | k2 | k3 estimate of KL(pi || pi_ref) at token t
    w_t      = a constant weight for a sampler whose log-probs are not pi_old's: truncated
               (tis_cap) or masked (is_mask) importance sampling, grpo_edu.algorithm.offpolicy; else 1
    l_t      = w_t policy_t + beta kl_t

With ratio_cap = c > 0 the clipped surrogate gives way to a capped one, without the clip
(CISPO; prime-rl's loss family): policy_t = -sg(min(rho, c)) A log pi_t, sg a constant. Its
gradient is -min(rho, c) A grad log pi: at rho = 1 the clipped surrogate's, and a token far
off-policy keeps a capped gradient where the clip would give it none.

and the loss is a weighted sum of l_t over the real tokens; the loss types differ
only in the weight a token gets (`aggregation_weights`; `aggregate` applies the
same weights, defined once in `_divisors`):

    grpo     1 / (n |o_i|)        token mean per response, then mean over the n responses
    bnpo     1 / num_items        token mean over the batch (num_items: its token count)
    dr_grpo  1 / (n L)            L = max_completion_length, a constant
    dapo     1 / num_items        num_items: the tokens of an optimizer step's share of the
                                  generation batch

so under grpo a token of a long response weighs less than a token of a short one
(the length bias chapter 4 measures); the other three give every token the same
weight. For the settings they share, the loss equals TRL 1.16's GRPOTrainer
(tests/test_trl_parity.py) and, on one group, chapter 1's NumPy reference.

n (`num_completions`) and num_items default to the batch passed in. A batch split
into parts (micro-batches, or the shares of several processes) passes the whole
batch's n and num_items to each part: the parts' losses then add up to the whole
batch's loss exactly, which is how grpo_edu.training.update accumulates gradients and how
N processes minimise the 1-process loss (grpo_edu.runtime.distributed). When one
generation batch feeds several optimizer steps (its mini-batches), TRL 1.16
divides each step's dapo loss by num_items / (optimizer steps per generation),
the mean token count of a step, so that every token weighs the same whichever
mini-batch holds it; grpo_edu.training.scoring passes that same mean as num_items.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# The constants and check_logprob_values are re-exported: grpo_edu.algorithm.loss is where readers look for them.
from grpo_edu.algorithm.loss_checks import (IMPORTANCE_SAMPLING_LEVELS, KL_ESTIMATORS, LOSS_TYPES,  # noqa: F401
                                  check_entropy_mask, check_excluded, check_inputs, check_logprob_values,
                                  check_loss_type, check_options, check_ratio_cap, check_sampler)
from grpo_edu.algorithm.offpolicy import Correction, correction_weights


@dataclass
class GRPOLossOutput:
    """What `grpo_loss` returns. Tensors have the caller's leading shape ((B, G) or (N,))."""

    loss: torch.Tensor            # scalar: call .backward() on this
    metrics: dict[str, float]     # diagnostics (see grpo_loss), plain floats
    per_token_loss: torch.Tensor  # (..., S) policy_t + beta kl_t, 0 on padding
    token_weights: torch.Tensor   # (..., S) weight of each token: loss = sum(w * per_token_loss)
    ratio: torch.Tensor = field(repr=False)  # (..., S) token or (..., 1) sequence ratios, detached


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) at tokens sampled from pi: (...), (...) -> (...).

    With d = ref_logp - logp (Schulman, "Approximating KL divergence"):
    k1 = -d (unbiased, can be negative), k2 = d^2 / 2 (biased, low variance),
    k3 = exp(d) - d - 1 (unbiased, always >= 0; DeepSeekMath's choice).
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")
    d = ref_logp - logp
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d * d
    return torch.exp(d) - d - 1.0


def _divisors(mask: torch.Tensor, loss_type: str, max_completion_length, num_items, num_completions):
    """The one definition of the loss types' weights: loss = sum_i (sum_t mask l_t) / row_i / batch.

    mask (N, S) float. Returns (row, batch): row (N, 1) the per-response divisor, or None
    for 1 (every token weighs the same), and batch the whole-batch divisor.
    """
    check_loss_type(loss_type)
    if loss_type == "grpo":
        return mask.sum(-1, keepdim=True).clamp(min=1), _count(num_completions, mask.shape[0], "num_completions")
    if loss_type == "dr_grpo":
        length = _max_length(max_completion_length, mask.sum(-1))
        return None, _count(num_completions, mask.shape[0], "num_completions") * length
    return None, _num_items(num_items, mask)   # bnpo, dapo


def aggregation_weights(completion_mask: torch.Tensor, loss_type: str = "grpo", *,
                        max_completion_length: int | None = None,
                        num_items: float | torch.Tensor | None = None,
                        num_completions: int | None = None) -> torch.Tensor:
    """The weight of each token in the loss: mask (..., S) -> weights (..., S).

    loss = sum(weights * per_token_loss), so this is also d loss / d per_token_loss:
    how hard each token is pushed. 0 on padding.
    """
    mask = completion_mask.reshape(-1, completion_mask.shape[-1]).to(torch.float64)
    row, batch = _divisors(mask, loss_type, max_completion_length, num_items, num_completions)
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
    row, batch = _divisors(mask, loss_type, max_completion_length, num_items, num_completions)
    total = (per_token_loss * mask).sum() if row is None else ((per_token_loss * mask).sum(-1, keepdim=True) / row).sum()
    return total / batch


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
              completion_mask: torch.Tensor, *, ref_logp: torch.Tensor | None = None,
              beta: float = 0.0, epsilon: float = 0.2, epsilon_high: float | None = None,
              loss_type: str = "grpo", max_completion_length: int | None = None,
              importance_sampling_level: str = "token", kl_estimator: str = "k3",
              num_items: float | torch.Tensor | None = None,
              num_completions: int | None = None,
              sampler_logp: torch.Tensor | None = None, tis_cap: float = 0.0,
              is_mask: str = "none", is_mask_band: tuple[float, float] = (0.5, 2.0),
              ratio_cap: float = 0.0, entropy_mask: torch.Tensor | None = None,
              excluded: torch.Tensor | None = None) -> GRPOLossOutput:
    """The clipped GRPO surrogate + KL penalty, aggregated per `loss_type`.

    logp: (B, G, S) or (N, S) log pi_theta at the sampled tokens (requires grad)
    old_logp: same shape, log pi_old from the sampling policy (a constant: no grad)
    advantages: (B, G) or (N,) one advantage per completion, or logp's shape, one per token
        (process supervision, grpo_edu.environment.process: as TRL 1.16's (B, T) advantages); per-token
        advantages need importance_sampling_level = "token"
    completion_mask: same shape as logp, bool or 0/1: real completion tokens
    ref_logp: same shape, log pi_ref; needed when beta != 0 (the "kl" metric
        is reported whenever it is given)
    beta: weight of the KL penalty; epsilon / epsilon_high: clip range
        [1 - epsilon, 1 + epsilon_high], epsilon_high defaulting to epsilon
        (DAPO's clip-higher sets it larger, e.g. 0.28)
    loss_type: "grpo" | "bnpo" | "dr_grpo" | "dapo" (see the module docstring)
    max_completion_length: L of dr_grpo (the generation limit, not S: padding
        must not change the loss)
    importance_sampling_level: "token" or "sequence" (GSPO: one length-normalised
        ratio per response, clipped as a whole)
    kl_estimator: "k1" | "k2" | "k3"
    num_items: bnpo's and dapo's denominator, a token count: bnpo's the whole
        batch's (all micro-batches, all processes), dapo's the tokens of the
        generation batch per optimizer step; defaults to this batch's token count
    num_completions: grpo's and dr_grpo's n, the whole batch's completion count;
        defaults to this batch's (see the module docstring: parts of a batch
        pass the whole batch's counts, and their losses add up)
    sampler_logp, tis_cap, is_mask, is_mask_band: importance sampling. The tokens were drawn
        by a sampler whose log-probs (sampler_logp, same shape as logp) differ from pi_old's
        (vLLM's kernels, bf16; an older policy under rollout_lag); each token's policy term is
        weighed by a constant w from r = pi_old / pi_sampler (grpo_edu.algorithm.offpolicy): truncated,
        w = min(r, tis_cap), which makes the expected gradient pi_old's again (up to the
        truncation), or masked outside is_mask_band, per token or per response. As TRL 1.16
        (vllm_importance_sampling_mode), the KL term is not weighed. tis_cap = 0 and
        is_mask = "none": off (w = 1), bitwise the loss without them. per_token_loss includes w.
    ratio_cap: 0 (the clipped surrogate) or c > 1: the capped surrogate (module docstring),
        epsilon and epsilon_high then unused; TRL 1.16's loss_type "cispo" with epsilon_high = c
    entropy_mask: None, or bool of logp's shape: the tokens whose policy term counts (entropy
        masking, grpo_edu.algorithm.entropy_mask); the others keep their KL term and their place in the
        normaliser, as TRL 1.16's top_entropy_quantile
    excluded: None, or bool of logp's shape without S: completions left out of the loss (overlong
        filtering: those cut at the length limit). Their tokens count nowhere (policy, KL,
        bnpo's default num_items); they still count in grpo's and dr_grpo's n, as TRL 1.16's
        mask_truncated_completions (which zeroes their completion mask)
    Metrics (floats):
      loss, policy_loss       the loss, and the loss without the KL term
      kl                      token mean of the KL estimate to pi_ref (when ref_logp is given)
      approx_kl               token mean of (rho - 1) - log rho, an estimate of
                              KL(pi_old || pi): how far the policy moved since sampling
      clip_ratio/low          rho < 1 - epsilon with A < 0 (clipped from below)
      clip_ratio/high         rho > 1 + epsilon_high with A > 0 (clipped from above)
      clip_ratio/region       either: the tokens that get no policy gradient
      ratio/mean, /min, /max  the ratios of real tokens
      advantage/std           over completions (per-token advantages: over real tokens)
      zero_std_groups         fraction of prompts whose G advantages are all equal (per-token
                              (B, G, S) advantages: all 0) ((B, G) or (B, G, S) advantages only)
      completion_length/mean  real tokens per completion
      ratio/capped            (ratio_cap > 0, instead of the clip_ratio metrics) the share
                              of ratios above the cap
      is_ratio/..., tis/...,  (a correction on) r's mean, min and max; the mean of w and the
      is/masked               share of tokens truncated (tis_cap) or masked (is_mask)
    Token means run over real tokens; at the sequence level the ratio and clip
    metrics run over completions, as in TRL.
    """
    check_options(loss_type, importance_sampling_level, kl_estimator, epsilon, epsilon_high, beta)
    correction = Correction(tis_cap, is_mask, tuple(is_mask_band))
    check_sampler(correction, sampler_logp, logp)
    check_ratio_cap(ratio_cap)
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    mask = check_inputs(logp, old_logp, advantages, completion_mask, ref_logp, beta)
    per_token = advantages.shape == logp.shape
    if per_token and importance_sampling_level == "sequence":
        raise ValueError(f"advantages of logp's shape {tuple(logp.shape)} (one per token: process supervision) "
                         f"need importance_sampling_level = 'token': a sequence-level ratio weighs a whole "
                         f"completion, which has no one advantage")
    if excluded is not None:
        mask = mask & ~check_excluded(excluded, logp.shape[:-1])[..., None]
    shape = logp.shape
    S = shape[-1]
    if loss_type == "dr_grpo":
        _max_length(max_completion_length, mask.sum(-1).reshape(-1))

    # Flatten (B, G, S) to (N, S); zero the padding first, so whatever it held
    # (NaN from a sampler, say) reaches neither the loss nor the gradient.
    mask = mask.reshape(-1, S)
    dtype = torch.promote_types(logp.dtype, torch.float32)
    weights_mask = mask.to(dtype)
    logp = logp.reshape(-1, S).to(dtype).masked_fill(~mask, 0.0)
    old_logp = old_logp.reshape(-1, S).to(dtype).masked_fill(~mask, 0.0)
    A = advantages.reshape(-1, S if per_token else 1).to(dtype)
    lengths = weights_mask.sum(-1, keepdim=True)

    log_ratio = logp - old_logp                                            # (N, S)
    if importance_sampling_level == "sequence":
        log_ratio_used = (log_ratio * weights_mask).sum(-1, keepdim=True) / lengths.clamp(min=1)  # (N, 1)
    else:
        log_ratio_used = log_ratio
    ratio = torch.exp(log_ratio_used)
    if ratio_cap:
        # The weight is a constant; the gradient flows through log pi only.
        policy = -torch.clamp(ratio, max=ratio_cap).detach() * A * logp * weights_mask
    else:
        clipped_ratio = torch.clamp(ratio, 1.0 - epsilon, 1.0 + epsilon_high)
        # Where the clipped term is smaller, it wins the min, and it is constant in
        # theta: those tokens get no policy gradient (the trust region).
        policy = -torch.minimum(ratio * A, clipped_ratio * A) * weights_mask   # (N, S)
    correction_metrics = {}
    if correction.active:
        sampler = sampler_logp.reshape(-1, S).to(dtype)
        w, correction_metrics = correction_weights(old_logp, sampler, mask, correction)
        policy = policy * w
    if entropy_mask is not None:
        policy = policy * check_entropy_mask(entropy_mask, shape).reshape(-1, S).to(dtype)

    kl = None
    if ref_logp is not None:
        ref = ref_logp.reshape(-1, S).to(dtype).masked_fill(~mask, 0.0)
        kl = kl_estimate(logp, ref, kl_estimator) * weights_mask
    per_token_loss = policy + beta * kl if beta != 0.0 else policy

    options = dict(max_completion_length=max_completion_length, num_items=num_items,
                   num_completions=num_completions)
    loss = aggregate(per_token_loss, weights_mask, loss_type, **options)

    with torch.no_grad():
        metrics = _metrics(loss, policy, kl, ratio, log_ratio, A, weights_mask, lengths, epsilon,
                           epsilon_high, loss_type, options, advantages,
                           sequence_level=importance_sampling_level == "sequence", ratio_cap=ratio_cap,
                           per_token=per_token)
        metrics.update(correction_metrics)
    return GRPOLossOutput(
        loss=loss, metrics=metrics, per_token_loss=per_token_loss.reshape(shape),
        token_weights=aggregation_weights(mask, loss_type, **options).to(dtype).reshape(shape),
        ratio=ratio.detach().reshape(*shape[:-1], ratio.shape[-1]))


# --------------------------------------------------------------------------- metrics

def _metrics(loss, policy, kl, ratio, log_ratio, A, mask, lengths, epsilon, epsilon_high,
             loss_type, options, advantages, sequence_level, ratio_cap=0.0, per_token=False) -> dict[str, float]:
    def token_mean(x):
        return ((x * mask).sum() / mask.sum()).item()

    if not mask.any():   # every completion excluded: there is nothing to average
        return {"loss": loss.item(), "policy_loss": 0.0, "advantage/std": A.std(correction=0).item()}

    if sequence_level:  # one ratio per completion
        def unit_mean(x):
            return x.mean().item()
        real_ratios = ratio.reshape(-1)
    else:
        unit_mean = token_mean
        real_ratios = ratio[mask.bool()]
    low = (ratio < 1.0 - epsilon) & (A < 0)
    high = (ratio > 1.0 + epsilon_high) & (A > 0)
    token_ratio = torch.exp(log_ratio)
    metrics = {
        "loss": loss.item(),
        "policy_loss": aggregate(policy, mask, loss_type, **options).item(),
        "approx_kl": token_mean(token_ratio - 1.0 - log_ratio),
    }
    if ratio_cap:   # no clip: the clip_ratio metrics would describe a trust region that is not there
        metrics["ratio/capped"] = unit_mean((ratio > ratio_cap).to(mask.dtype))
    else:
        metrics.update({"clip_ratio/low": unit_mean(low.to(mask.dtype)),
                        "clip_ratio/high": unit_mean(high.to(mask.dtype)),
                        "clip_ratio/region": unit_mean((low | high).to(mask.dtype))})
    metrics.update({
        "ratio/mean": real_ratios.mean().item(),
        "ratio/min": real_ratios.min().item(),
        "ratio/max": real_ratios.max().item(),
        "advantage/std": A.std(correction=0).item(),
        "completion_length/mean": lengths.mean().item(),
    })
    if kl is not None:
        metrics["kl"] = token_mean(kl)
    if per_token:   # over tokens; a group without signal has every advantage exactly 0
        metrics["advantage/std"] = A[mask.bool()].std(correction=0).item()
        if advantages.ndim == 3:
            flat = ((A == 0) | (mask == 0)).reshape(advantages.shape).all(-1).all(-1)
            metrics["zero_std_groups"] = flat.float().mean().item()
    elif advantages.ndim == 2:
        # All-equal rewards give bitwise-equal advantages under any convention.
        flat = (advantages == advantages[:, :1]).all(dim=1)
        metrics["zero_std_groups"] = flat.float().mean().item()
    return metrics


# --------------------------------------------------------------------------- checks

def _max_length(max_completion_length, lengths: torch.Tensor) -> int:
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


def _num_items(num_items, mask: torch.Tensor):
    if num_items is None:
        return mask.sum().clamp(min=1)   # 0 only when every completion is excluded: then the loss is 0
    value = float(num_items.item() if isinstance(num_items, torch.Tensor) else num_items)
    if not value > 0:
        raise ValueError(f"num_items (the token count bnpo and dapo divide by) must be > 0, "
                         f"got {num_items!r}")
    return num_items.to(mask.dtype) if isinstance(num_items, torch.Tensor) else value


def _count(value, default: int, name: str) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} (the whole batch's completion count) must be a positive int, got {value!r}")
    return value
