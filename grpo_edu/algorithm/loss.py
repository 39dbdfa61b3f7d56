"""The GRPO loss on padded, masked batches, composed from named parts, with its diagnostics.

Per-token tensors are (B, G, S) (B prompts, G completions each, S completion
columns) or already flat (N, S) with N = B * G; advantages are (B, G) or (N,), or per
token (logp's shape: process supervision, grpo_edu.environment.process).
`completion_mask` is 1 on a completion's real tokens and 0 on right padding.

One token's loss, each part a registered function named by a LossSettings field:

    rho      the ratio to pi_old, per token or per response     surrogates.RATIO_LEVELS
             (importance_sampling_level: token | sequence)
    policy_t the surrogate of rho and A                          surrogates.SURROGATES
             (surrogate: clip, with clip-higher's epsilon_high; capped)
    w_t      a constant weight for a sampler that is not pi_old  offpolicy.CORRECTIONS
             (tis_cap, is_mask), and the entropy mask's 0 or 1   (entropy_mask)
    kl_t     an estimate of KL(pi || pi_ref)                     kl.KL_ESTIMATES (k1 | k2 | k3)
    l_t      = w_t policy_t + beta kl_t

and the loss is a weighted sum of l_t over the real tokens, the weights the loss type's
(aggregation.AGGREGATIONS: grpo, bnpo, dr_grpo, dapo). A new variant is one registered
function beside its siblings, and its test. For the settings they share, the loss equals TRL
1.16's GRPOTrainer (tests/test_trl_parity.py) and, on one group, chapter 1's NumPy reference.

A batch split into parts (micro-batches, or the shares of several processes) passes the
whole batch's n (num_completions) and num_items to each part: the parts' losses then add up
to the whole batch's loss exactly, which is how grpo_edu.training.update accumulates
gradients and how N processes minimise the 1-process loss (grpo_edu.runtime.distributed).
When one generation batch feeds several optimizer steps (its mini-batches), TRL 1.16
divides each step's dapo loss by num_items / (optimizer steps per generation), the mean
token count of a step, so that every token weighs the same whichever mini-batch holds it;
grpo_edu.training.scoring passes that same mean as num_items.

    LossSettings    the loss's settings (the config keys of the same names), checked once
    grpo_loss       the loss of a batch, its per-token terms and its metrics
    GRPOLossOutput  what grpo_loss returns
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from grpo_edu.algorithm.aggregation import Counts, aggregate, aggregation_weights, check_loss_type
from grpo_edu.algorithm.entropy_mask import check_entropy_mask
from grpo_edu.algorithm.kl import check_kl_estimator, kl_estimate
from grpo_edu.algorithm.logprobs import check_logprob_values, first_bad
from grpo_edu.algorithm.offpolicy import Correction, check_sampler, correction_weights
from grpo_edu.algorithm.surrogates import (RATIO_LEVELS, SURROGATES, check_ratio_cap, check_ratio_level,
                                           check_surrogate)


@dataclass(frozen=True)
class LossSettings:
    """What the loss is, besides its tensors: the config keys of the same names (each documented
    in grpo_edu.config), checked on construction.

    beta: the KL penalty's weight; surrogate: the policy term (surrogates.SURROGATES: "clip" or
    "capped"); epsilon / epsilon_high: the clip range [1 - epsilon, 1 + epsilon_high],
    epsilon_high defaulting to epsilon (DAPO's clip-higher sets it larger); ratio_cap: the capped
    surrogate's largest weight c > 1 (0 with the clip; TRL 1.16's loss_type "cispo" with
    epsilon_high = c); loss_type: the aggregation; max_completion_length: dr_grpo's L (the
    generation limit, not S: padding must not change the loss); importance_sampling_level:
    "token" or "sequence" (GSPO); kl_estimator: "k1" | "k2" | "k3"; tis_cap, is_mask,
    is_mask_band: the sampler correction (grpo_edu.algorithm.offpolicy).
    """

    beta: float = 0.0
    surrogate: str = "clip"
    epsilon: float = 0.2
    epsilon_high: float | None = None
    ratio_cap: float = 0.0
    loss_type: str = "grpo"
    max_completion_length: int | None = None
    importance_sampling_level: str = "token"
    kl_estimator: str = "k3"
    tis_cap: float = 0.0
    is_mask: str = "none"
    is_mask_band: tuple[float, float] = (0.5, 2.0)

    def __post_init__(self):
        check_loss_type(self.loss_type)
        check_ratio_level(self.importance_sampling_level)
        check_kl_estimator(self.kl_estimator)
        check_epsilon(self.epsilon)
        check_epsilon_high(self.epsilon_high)
        check_beta(self.beta)
        check_surrogate(self.surrogate)
        check_ratio_cap(self.ratio_cap)
        SURROGATES[self.surrogate].check(self)
        object.__setattr__(self, "is_mask_band", tuple(self.is_mask_band))
        Correction(self.tis_cap, self.is_mask, self.is_mask_band)   # checks tis_cap, is_mask and is_mask_band

    @classmethod
    def of(cls, config) -> "LossSettings":
        """The settings a training config holds: its loss section, with max_completion_length
        from its rollout and the correction from its off_policy section."""
        loss, rollout, off_policy = config.loss, config.rollout, config.off_policy
        return cls(beta=loss.beta, surrogate=loss.surrogate, epsilon=loss.epsilon, epsilon_high=loss.epsilon_high,
                   ratio_cap=loss.ratio_cap, loss_type=loss.loss_type,
                   max_completion_length=rollout.max_completion_length,
                   importance_sampling_level=loss.importance_sampling_level, kl_estimator=loss.kl_estimator,
                   tis_cap=off_policy.tis_cap, is_mask=off_policy.is_mask, is_mask_band=off_policy.is_mask_band)

    @classmethod
    def given(cls, settings: "LossSettings | None", options: dict) -> "LossSettings":
        """`settings`, or LossSettings(**options) (grpo_loss(..., beta=0.04, loss_type="dr_grpo")); not both."""
        if settings is not None and options:
            raise ValueError(f"grpo_loss: pass settings or the options {sorted(options)}, not both")
        if settings is not None:
            return settings
        unknown = sorted(set(options) - {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(f"grpo_loss: unknown option {unknown[0]!r}; the options are LossSettings' fields, "
                            f"{[f.name for f in fields(cls)]}")
        return cls(**options)

    @property
    def high(self) -> float:
        """The clip range's upper offset: epsilon_high, defaulting to epsilon."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @property
    def correction(self) -> Correction:
        return Correction(self.tis_cap, self.is_mask, self.is_mask_band)


@dataclass
class GRPOLossOutput:
    """What `grpo_loss` returns. Tensors have the caller's leading shape ((B, G) or (N,))."""

    loss: torch.Tensor            # scalar: call .backward() on this
    metrics: dict[str, float]     # diagnostics (see grpo_loss), plain floats
    per_token_loss: torch.Tensor  # (..., S) policy_t + beta kl_t, 0 on padding
    token_weights: torch.Tensor   # (..., S) weight of each token: loss = sum(w * per_token_loss)
    ratio: torch.Tensor = field(repr=False)  # (..., S) token or (..., 1) sequence ratios, detached


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
              completion_mask: torch.Tensor, settings: LossSettings | None = None, *,
              ref_logp: torch.Tensor | None = None, sampler_logp: torch.Tensor | None = None,
              num_items: float | torch.Tensor | None = None, num_completions: int | None = None,
              entropy_mask: torch.Tensor | None = None, excluded: torch.Tensor | None = None,
              **options) -> GRPOLossOutput:
    """The GRPO loss of a batch: each token's policy term (the ratio's surrogate, weighed) plus
    beta times its KL estimate, aggregated per the loss type (module docstring).

    logp: (B, G, S) or (N, S) log pi_theta at the sampled tokens (requires grad)
    old_logp: same shape, log pi_old from the sampling policy (a constant: no grad)
    advantages: (B, G) or (N,) one advantage per completion, or logp's shape, one per token
        (process supervision, grpo_edu.environment.process: as TRL 1.16's (B, T) advantages); per-token
        advantages need importance_sampling_level = "token"
    completion_mask: same shape as logp, bool or 0/1: real completion tokens
    settings: a LossSettings; or its fields as keyword options (`grpo_loss(..., beta=0.04)`)
    ref_logp: same shape, log pi_ref; needed when beta != 0 (the "kl" metric
        is reported whenever it is given)
    sampler_logp: same shape, the sampler's log-probs; needed by a correction (tis_cap, is_mask):
        each token's policy term is weighed by a constant w from r = pi_old / pi_sampler. As TRL
        1.16 (vllm_importance_sampling_mode), the KL term is not weighed; per_token_loss includes w
    num_items: bnpo's and dapo's denominator, a token count: bnpo's the whole
        batch's (all micro-batches, all processes), dapo's the tokens of the
        generation batch per optimizer step; defaults to this batch's token count
    num_completions: grpo's and dr_grpo's n, the whole batch's completion count;
        defaults to this batch's (parts of a batch pass the whole batch's counts, and their
        losses add up)
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
      ratio/capped            (surrogate = "capped", instead of the clip_ratio metrics) the share
                              of ratios above the cap
      is_ratio/..., tis/...,  (a correction on) r's mean, min and max; the mean of w and the
      is/masked               share of tokens truncated (tis_cap) or masked (is_mask)
    Token means run over real tokens; at the sequence level the ratio and clip
    metrics run over completions, as in TRL.
    """
    settings = LossSettings.given(settings, options)
    correction = settings.correction
    check_sampler(correction, sampler_logp, logp)
    mask = check_inputs(logp, old_logp, advantages, completion_mask, ref_logp, settings.beta)
    per_token = advantages.shape == logp.shape
    if per_token and settings.importance_sampling_level == "sequence":
        raise ValueError(f"advantages of logp's shape {tuple(logp.shape)} (one per token: process supervision) "
                         f"need importance_sampling_level = 'token': a sequence-level ratio weighs a whole "
                         f"completion, which has no one advantage")
    if excluded is not None:
        mask = mask & ~check_excluded(excluded, logp.shape[:-1])[..., None]
    shape, S = logp.shape, logp.shape[-1]
    counts = Counts(settings.max_completion_length, num_items, num_completions)

    # Flatten (B, G, S) to (N, S); zero the padding first, so whatever it held
    # (NaN from a sampler, say) reaches neither the loss nor the gradient.
    mask = mask.reshape(-1, S)
    dtype = torch.promote_types(logp.dtype, torch.float32)
    weights_mask = mask.to(dtype)                                                   # (N, S)
    logp = logp.reshape(-1, S).to(dtype).masked_fill(~mask, 0.0)                    # (N, S)
    old_logp = old_logp.reshape(-1, S).to(dtype).masked_fill(~mask, 0.0)            # (N, S)
    A = advantages.reshape(-1, S if per_token else 1).to(dtype)                     # (N, 1) or (N, S)
    lengths = weights_mask.sum(-1, keepdim=True)                                    # (N, 1)

    log_ratio = logp - old_logp                                                     # (N, S)
    ratio = torch.exp(RATIO_LEVELS[settings.importance_sampling_level](log_ratio, weights_mask, lengths))
    policy = SURROGATES[settings.surrogate].loss(ratio, A, logp, settings) * weights_mask   # (N, S)
    correction_metrics = {}
    if correction.active:   # the sampler's tokens weighed back toward pi_old's
        w, correction_metrics = correction_weights(old_logp, sampler_logp.reshape(-1, S).to(dtype), mask, correction)
        policy = policy * w
    if entropy_mask is not None:   # only the high-entropy tokens' policy terms train
        policy = policy * check_entropy_mask(entropy_mask, shape).reshape(-1, S).to(dtype)
    kl = None
    if ref_logp is not None:
        ref = ref_logp.reshape(-1, S).to(dtype).masked_fill(~mask, 0.0)
        kl = kl_estimate(logp, ref, settings.kl_estimator) * weights_mask          # (N, S)
    per_token_loss = policy + settings.beta * kl if settings.beta != 0.0 else policy

    options = dict(max_completion_length=counts.max_completion_length, num_items=num_items,
                   num_completions=num_completions)
    loss = aggregate(per_token_loss, weights_mask, settings.loss_type, **options)
    with torch.no_grad():
        metrics = _metrics(loss, policy, kl, ratio, log_ratio, A, weights_mask, lengths, settings, options,
                           advantages, per_token)
        metrics.update(correction_metrics)
    return GRPOLossOutput(
        loss=loss, metrics=metrics, per_token_loss=per_token_loss.reshape(shape),
        token_weights=aggregation_weights(mask, settings.loss_type, **options).to(dtype).reshape(shape),
        ratio=ratio.detach().reshape(*shape[:-1], ratio.shape[-1]))


# --------------------------------------------------------------------------- metrics

def _metrics(loss, policy, kl, ratio, log_ratio, A, mask, lengths, settings: LossSettings, options: dict,
             advantages, per_token: bool) -> dict[str, float]:
    loss_type, sequence_level = settings.loss_type, settings.importance_sampling_level == "sequence"

    def token_mean(x):
        return ((x * mask).sum() / mask.sum()).item()

    if not mask.any():   # every completion excluded: there is nothing to average
        return {"loss": loss.item(), "policy_loss": 0.0, "advantage/std": A.std(correction=0).item()}

    if sequence_level:  # one ratio per completion
        def unit_mean(x):
            return x.to(mask.dtype).mean().item()
        real_ratios = ratio.reshape(-1)
    else:
        def unit_mean(x):
            return token_mean(x.to(mask.dtype))
        real_ratios = ratio[mask.bool()]
    token_ratio = torch.exp(log_ratio)
    metrics = {
        "loss": loss.item(),
        "policy_loss": aggregate(policy, mask, loss_type, **options).item(),
        "approx_kl": token_mean(token_ratio - 1.0 - log_ratio),
        **SURROGATES[settings.surrogate].metrics(ratio, A, unit_mean, settings),   # the clip's, or the cap's
    }
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


# --------------------------------------------------------------------------- the arguments, checked

# Each check of a setting names it `name`: the argument, or the config key ("config key 'beta'");
# grpo_edu.config attaches the same functions to its keys.

def check_beta(beta, name: str = "beta") -> None:
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not beta >= 0:
        raise ValueError(f"{name} must be a number >= 0 (the KL term's weight), got {beta!r}")


def check_epsilon(epsilon, name: str = "epsilon") -> None:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0 <= epsilon < 1:
        raise ValueError(f"{name} must be a number in [0, 1) (the clip range below: ratio >= 1 - epsilon), "
                         f"got {epsilon!r}")


def check_epsilon_high(epsilon_high, name: str = "epsilon_high") -> None:
    if epsilon_high is not None and (isinstance(epsilon_high, bool) or not isinstance(epsilon_high, (int, float))
                                     or not epsilon_high >= 0):
        raise ValueError(f"{name} must be a number >= 0 (the clip range above: ratio <= 1 + epsilon_high), or "
                         f"None (= epsilon), got {epsilon_high!r}")


def check_excluded(excluded: torch.Tensor, shape) -> torch.Tensor:
    if not isinstance(excluded, torch.Tensor) or excluded.shape != shape or excluded.dtype != torch.bool:
        got = f"{excluded.dtype} of shape {tuple(excluded.shape)}" if isinstance(excluded, torch.Tensor) else \
            type(excluded).__name__
        raise ValueError(f"excluded must be a bool tensor of the advantages' shape {tuple(shape)}, got {got}")
    return excluded


def check_inputs(logp, old_logp, advantages, completion_mask, ref_logp, beta) -> torch.Tensor:
    """Validate everything; return the completion mask as bool."""
    tensors = {"logp": logp, "old_logp": old_logp, "advantages": advantages,
               "completion_mask": completion_mask}
    if ref_logp is not None:
        tensors["ref_logp"] = ref_logp
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if logp.ndim not in (2, 3):
        raise ValueError(f"logp must have shape (B, G, S) or (N, S), got shape {tuple(logp.shape)}")
    if logp.shape[-1] < 1:
        raise ValueError(f"logp needs at least one completion column, got shape {tuple(logp.shape)}")
    for name in ("old_logp", "completion_mask", "ref_logp"):
        if name in tensors and tensors[name].shape != logp.shape:
            raise ValueError(f"{name} must have the shape of logp {tuple(logp.shape)}, "
                             f"got {tuple(tensors[name].shape)}")
    if advantages.shape not in (logp.shape[:-1], logp.shape):
        layout = "(B, G)" if logp.ndim == 3 else "(N,)"
        raise ValueError(f"advantages must have shape {layout} = {tuple(logp.shape[:-1])} (one per completion) "
                         f"or logp's shape {tuple(logp.shape)} (one per token: process supervision), got "
                         f"{tuple(advantages.shape)}")
    if logp.ndim == 3 and logp.shape[1] < 2:
        raise ValueError(f"logp of shape (B, G, S) needs G >= 2 completions per prompt, got G = {logp.shape[1]}")
    for name in ("logp", "old_logp", "advantages", "ref_logp"):
        if name in tensors and not tensors[name].is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {tensors[name].dtype}")
    for name in ("old_logp", "ref_logp", "advantages"):
        if name in tensors and tensors[name].requires_grad:
            raise ValueError(f"{name} requires grad, but it is a constant of the loss: pass "
                             f"{name}.detach() (with old_logp = logp undetached, the ratio is 1 "
                             f"for every theta and the policy gradient vanishes)")
    if beta != 0.0 and ref_logp is None:
        raise ValueError(f"beta = {beta} needs ref_logp (the reference policy's log-probs); "
                         f"pass ref_logp or set beta = 0")

    if completion_mask.dtype == torch.bool:
        mask = completion_mask
    elif completion_mask.is_complex() or not ((completion_mask == 0) | (completion_mask == 1)).all():
        raise ValueError("completion_mask must be bool or hold only 0 and 1, got values "
                         f"{torch.unique(completion_mask)[:5].tolist()}")
    else:
        mask = completion_mask != 0
    lengths = mask.sum(-1)
    if (lengths == 0).any():
        raise ValueError(f"every completion needs at least one token in completion_mask; completion at "
                         f"{first_bad(lengths == 0)} (of shape {tuple(lengths.shape)}) has none")

    with torch.no_grad():
        for name in ("logp", "old_logp", "ref_logp"):
            if name not in tensors:
                continue
            check_logprob_values(name, tensors[name].detach(), mask)
        bad = ~torch.isfinite(advantages)
        if bad.any():
            raise ValueError(f"advantages must be finite, got {advantages[tuple(bad.nonzero()[0])].item()} "
                             f"at {first_bad(bad)}")
    return mask
