# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 4. Loss variants and length bias
#
# > **You will learn**
# > - how four loss types sum per-token losses, and the length bias of `grpo`
# > - what dividing by the group's std does to easy, hard and in-between prompts
# > - why groups with equal rewards dilute the gradient, and what dropping them does
# > - why a ratio per completion needs a clip range hundreds of times narrower
# >
# > **You need first**: chapter 3 (the masked step).
# >
# > **Reading time**: about 18 minutes. **Compute**: at most 60 s on a 2-core CPU. [Glossary](../docs/glossary.md) · [Notation](../docs/notation.md)
#
# Chapter 3 computed one loss of GRPO (Group Relative Policy Optimization), `grpo`: the
# clipped surrogate averaged over each completion's tokens, then over completions. Since
# DeepSeekMath, several variants have changed that loss in two places:
#
# - **how per-token losses are summed into one number** (`grpo`, `bnpo`, `dr_grpo`,
#   `dapo`): this decides how hard each *token* is pushed, and it depends on the
#   completion's length;
# - **which ratio is clipped, and where**: the sequence-level ratio of GSPO (Group Sequence
#   Policy Optimization; Zheng et al., 2025,
#   [`arXiv 2507.18071`](https://arxiv.org/abs/2507.18071)), and the clip-higher of DAPO (Decoupled Clip and Dynamic Sampling
#   Policy Optimization).
#
# Plus one change upstream of the loss: whether advantages are divided by the group's
# standard deviation (Dr. GRPO drops the division). This chapter puts them side by side on
# one batch, measures the length bias, and looks at the groups that carry no signal at all.
# DAPO's settings beyond its loss (dynamic sampling, overlong handling), and two more, are
# measured on a training run in chapter 8.

# %%
import inspect

import matplotlib.pyplot as plt
import numpy as np
import torch

from grpo_edu.algorithm.advantages import group_advantages, zero_std_groups
from grpo_edu.training.batch import RolloutBatch, pad_rollouts
from grpo_edu.algorithm import aggregation
from grpo_edu.algorithm.aggregation import LOSS_TYPES, aggregation_weights
from grpo_edu.algorithm.loss import grpo_loss
from grpo_edu.book import home

home.enter()   # the book's folder: its files are read and its runs written from there

torch.set_num_threads(1)
torch.set_printoptions(precision=4, sci_mode=False)


def f4(x):
    """4 decimals with a sign; values that round to zero print as +0.0000 on every machine."""
    return f"{0.0 if abs(x) < 5e-5 else x:+.4f}"


# %% [markdown]
# ## One batch for every variant
#
# B = 2 prompts, G = 4 completions each, with very different lengths, as a reasoning model
# produces them: a short right answer, a long right answer, a short wrong one and a long
# wrong one per prompt. The log-probabilities are synthetic but shaped like a second pass
# over the same samples (ratios spread around 1, some beyond the clip range), so that every
# term of the loss is active. `max_completion_length` L = 64 is the sampler's limit.

# %%
L = 64
lengths = torch.tensor([[6, 40, 8, 60], [4, 30, 12, 64]])          # |o_i|, (B, G)
rewards = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
B, G = lengths.shape
S = int(lengths.max())
generator = torch.Generator().manual_seed(0)
completion_mask = torch.arange(S) < lengths[..., None]                # (B, G, S)
old_logp = (-3 * torch.rand(B, G, S, generator=generator, dtype=torch.float64)) * completion_mask
logp = (old_logp + 0.15 * torch.randn(B, G, S, generator=generator, dtype=torch.float64)).clamp(max=0)
logp = (logp * completion_mask).requires_grad_()
ref_logp = (old_logp + 0.1 * torch.randn(B, G, S, generator=generator, dtype=torch.float64)).clamp(max=0)
ref_logp = ref_logp * completion_mask
advantages = group_advantages(rewards)
print(f"lengths |o_i|:\n{lengths}\nrewards:\n{rewards}\nadvantages (group scale):\n{advantages}")
print(f"{int(completion_mask.sum())} completion tokens, S = {S}, L = {L}")

# %% [markdown]
# ## Side by side
#
# > **Ranks, world size, micro-batches.** A run on several GPUs starts one process per GPU.
# > Each process is a *rank*, numbered from 0, and the *world size* is the number of ranks.
# > Each rank computes the loss on its own share of the batch, often in several
# > *micro-batches* whose gradients it adds up before one optimizer step.
#
# Six settings on the same batch. The `dapo` row counts the tokens of a generation batch twice
# this one's, as when it is split across two ranks, so it differs from `bnpo`. With the local
# count the two are identical. Every row keeps the same Kullback-Leibler (KL) term,
# $\beta$ = 0.04, DAPO's included, so that the rows differ only in aggregation and clipping. For each we print the
# loss and the fraction of tokens clipped. We also print the total gradient each completion
# receives, $\sum_t |\partial\, \text{loss} / \partial \log\pi_{i,t}|$, for the short and the
# long *wrong* answer of prompt 0 (the third and fourth completions).

# %%
tokens = int(completion_mask.sum())
variants = {
    "grpo": dict(loss_type="grpo"),
    "bnpo": dict(loss_type="bnpo"),
    "dr_grpo": dict(loss_type="dr_grpo", max_completion_length=L),
    "dapo (2 GPUs)": dict(loss_type="dapo", num_items=2 * tokens, epsilon_high=0.28),
    "gspo": dict(loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4),
    "grpo clip-higher": dict(loss_type="grpo", epsilon_high=0.28),
}
print(f"{'variant':18} {'loss':>8} {'clipped':>8}   {'|grad| short wrong':>18} {'|grad| long wrong':>18}  ratio")
results = {}
for name, options in variants.items():
    out = grpo_loss(logp, old_logp, advantages, completion_mask, ref_logp=ref_logp, beta=0.04, **options)
    (grad,) = torch.autograd.grad(out.loss, logp)
    per_completion = grad.abs().sum(-1)                                # (B, G)
    results[name] = (out, per_completion)
    short, long = per_completion[0, 2].item(), per_completion[0, 3].item()
    print(f"{name:18} {f4(out.loss.item()):>8} {out.metrics['clip_ratio/region']:>8.4f}   "
          f"{short:>18.4f} {long:>18.4f}  {long / short:.2f}")
print(f"\nlengths of the two wrong answers of prompt 0: {lengths[0, 2]} and {lengths[0, 3]}, "
      f"ratio {lengths[0, 3] / lengths[0, 2]:.2f}")
gspo = variants["gspo"]
print(f"GSPO's clip range against grpo's epsilon = 0.2: {0.2 / gspo['epsilon']:.0f} times narrower below, "
      f"{0.2 / gspo['epsilon_high']:.0f} times above")

# %% [markdown]
# Read the last column first. Under `grpo` the long wrong answer (60 tokens) receives *less*
# total gradient than the short wrong one (8 tokens). Each completion gets the same total
# weight, 1/N, spread over its own tokens; the ratios and clipping make up the rest. Under
# `bnpo`, `dr_grpo` and `dapo` every token weighs the same, so the long completion collects
# 6.73 times as much, close to the ratio of lengths, 7.50 (the ratios and clipping make the
# difference).
#
# GSPO moves all of a completion's tokens with one ratio, the exponential of the mean
# log-ratio, and clips it as a whole. With the GSPO paper's range of 3e-4 / 4e-4 around 1,
# 0.6250 of this batch's completions are clipped. The long wrong answer is among them, so
# only its KL term is left. Clip-higher (`epsilon_high` = 0.28, DAPO's value, also in the
# `dapo` row) only changes which *positive-advantage* tokens clip, so the wrong answers'
# gradients are unchanged.
#
# Each loss type is one registered function in `grpo_edu.algorithm.aggregation`. It returns
# the two divisors of the loss: one per response (or none) and one for the whole batch.
# `aggregate` divides the per-token losses by them. A new loss type is one more function.

# %%
print(inspect.getsource(aggregation.per_response_mean))   # grpo
print(inspect.getsource(aggregation.batch_token_mean))    # bnpo
print(inspect.getsource(aggregation.constant_length))     # dr_grpo
print(inspect.getsource(aggregation.step_token_mean))     # dapo
print({name: entry.divisors.__name__ for name, entry in aggregation.AGGREGATIONS.items()})

# %% [markdown]
# ## The length bias, in numbers
#
# Since the loss is $\sum_{i,t} w_{i,t}\, \ell_{i,t}$, the weight $w_{i,t}$ is the gradient
# each token receives per unit of per-token loss. `aggregation_weights` returns it. Fix a
# batch of N = 8 completions of which 7 have 100 tokens, and vary the length $|o|$ of the
# eighth:

# %%
# One group: a 4-token and a 12-token completion. The weight each token gets, by loss type.
from grpo_edu.book import schematics

schematics.token_weights(lengths=(4, 12), max_completion_length=16)

# %%
# The same weights, live: drag the lengths and switch the loss type (chapter 2 gathers every explorer).
from grpo_edu.widgets import LengthBiasExplorer

LengthBiasExplorer()

# %%
def token_weight(length, loss_type, others=100, N=8, max_length=1024):
    """Weight of one token of a completion of `length` tokens in a batch of N completions."""
    lengths_ = torch.tensor([length] + [others] * (N - 1))
    mask = torch.arange(max(length, others)) < lengths_[:, None]
    weights = aggregation_weights(mask, loss_type, max_completion_length=max_length,
                                  num_items=int(mask.sum()))
    return weights[0, 0].item()


print(f"{'|o|':>6} " + " ".join(f"{t:>10}" for t in LOSS_TYPES) + "   grpo: per-token weight x |o|")
for length in (10, 100, 1000):
    row = [token_weight(length, t) for t in LOSS_TYPES]
    print(f"{length:>6} " + " ".join(f"{w:>10.6f}" for w in row) + f"   {row[0] * length:.4f}")

# %% [markdown]
# Under `grpo` the per-token weight is $1/(N|o|)$. A token of a 10-token completion weighs 10
# times as much as a token of a 100-token one, and every completion's weights add up to the
# same 1/N = 0.1250. That is the **length bias** the Dr. GRPO paper describes, and its sign
# depends on the advantage:
#
# - $A > 0$: the tokens of a *short* correct answer are pushed up hardest, so brevity is
#   rewarded among correct answers;
# - $A < 0$: the tokens of a *long* wrong answer are pushed down least, so a wrong answer
#   costs less the longer it is. Response length then grows for reasons that have nothing
#   to do with reasoning.
#
# `bnpo`, `dr_grpo` and `dapo` give every token of the batch the same weight. A completion's
# total weight is then proportional to its length, and there is no per-token preference.
# They differ in the constant they divide by:
#
# - `bnpo`: this batch's token count, which varies from micro-batch to micro-batch;
# - `dapo`: the token count of the whole generation batch, summed over ranks and
#   micro-batches. When a rollout is split into mini-batches, grpo_edu's trainer divides by the
#   rollout's tokens per optimizer step, as TRL (Hugging Face's Transformer Reinforcement
#   Learning library) does;
# - `dr_grpo`: N L, with L the generation limit, a true constant.
#
# **A common mistake** is to implement Dr. GRPO by dividing by the padded width of the
# batch. That is not a constant: the same completions padded to a longer batch would get a
# smaller loss.
# `grpo_loss` therefore requires `max_completion_length` for `dr_grpo` instead of inferring
# it from the tensor:

# %%
try:
    grpo_loss(logp, old_logp, advantages, completion_mask, loss_type="dr_grpo")
except ValueError as error:
    print(f"ValueError: {error}")

# %% [markdown]
# The same numbers as a plot: the weight of one token against the length of its
# completion, for each loss type (log scales).

# %%
lengths_axis = np.unique(np.geomspace(4, 1024, 40).astype(int))
figure, axis = plt.subplots(figsize=(7, 4))
for loss_type, style in zip(LOSS_TYPES, ("-", "--", "-.", ":")):
    weights = [token_weight(int(n), loss_type) for n in lengths_axis]
    _ = axis.loglog(lengths_axis, weights, style, label=loss_type, linewidth=2)
_ = axis.set_xlabel("completion length |o| (tokens)")
_ = axis.set_ylabel("weight of one of its tokens")
_ = axis.set_title("N = 8 completions, the other 7 of 100 tokens, L = 1024")
_ = axis.legend()
figure.tight_layout()
plt.show()

# %% [markdown]
# The `grpo` line falls with slope -1: doubling a completion halves the push on each of
# its tokens. The other three are flat in $|o|$ (`bnpo` and `dapo` bend slightly because the
# completion's own tokens are part of the count they divide by).
#
# ## Groups that carry no signal
#
# If every completion of a prompt gets the same reward (all right on an easy prompt, all
# wrong on a hard one), the group's advantages are all zero. Its tokens then contribute
# no policy gradient, only KL. They still count in the denominators: under `grpo` they are
# part of N; under `bnpo` and `dapo` their tokens are part of the token count. Either way
# they dilute the gradient of the prompts that do carry signal.
#
# A batch of B = 4 prompts of which two are saturated:

# %%
prompt_ids = [[5, 6, 7], [8, 9], [10, 11, 12], [13]]
extra = (0, 10, 6, 2)                                  # the saturated prompts ramble longer
completion_ids = [[[20 + g] * (2 + 3 * g + extra[b]) for g in range(4)] for b in range(4)]
input_ids, attention_mask, dyn_mask = pad_rollouts(prompt_ids, completion_ids, pad_token_id=0)
dyn_rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0],
                            [0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
dyn_generator = torch.Generator().manual_seed(1)
dyn_old = (-2 * torch.rand(dyn_mask.shape, generator=dyn_generator, dtype=torch.float64)) * dyn_mask
batch = RolloutBatch(input_ids=input_ids, attention_mask=attention_mask, completion_mask=dyn_mask,
                     old_logp=dyn_old, rewards=dyn_rewards, advantages=group_advantages(dyn_rewards))
flat = zero_std_groups(batch.rewards)
print(f"zero-std groups: {flat.tolist()} -> fraction {flat.float().mean():.4f}")
print(f"completion tokens: {batch.num_tokens} in all, {int(batch.completion_mask[~flat].sum())} in the "
      f"informative groups (ratio {batch.num_tokens / batch.completion_mask[~flat].sum().item():.4f})")


def policy_gradient(b, loss_type):
    """d loss / d logp at the first step (logp = old_logp), and the loss's metrics."""
    logp_ = b.old_logp.clone().requires_grad_()
    out = grpo_loss(logp_, b.old_logp, b.advantages, b.completion_mask, loss_type=loss_type,
                    max_completion_length=32)
    (grad,) = torch.autograd.grad(out.loss, logp_)
    return grad, out.metrics


kept = batch.select(~flat)                       # the zero-std filter: keep the informative groups
for loss_type in ("grpo", "bnpo", "dr_grpo"):
    full_grad, metrics = policy_gradient(batch, loss_type)
    kept_grad, _ = policy_gradient(kept, loss_type)
    same_tokens = full_grad[~flat]                # the kept groups' gradients inside the full batch
    scale = kept_grad.abs().sum() / same_tokens.abs().sum()
    print(f"{loss_type:8} zero_std_groups metric {metrics['zero_std_groups']:.4f}; gradient on the "
          f"informative groups: {same_tokens.abs().sum():.4f} in the full batch, "
          f"{kept_grad.abs().sum():.4f} after filtering (x{scale:.4f})")

# %% [markdown]
# Filtering does not change the *direction* of the gradient on the informative prompts, only
# its size. Under `grpo` and `dr_grpo` it doubles (N halves). Under `bnpo` it grows by the
# ratio of token counts, 2.9333: the saturated prompts here also wrote the longer completions,
# so they took the larger share of the denominator. That is why a batch in which most groups
# saturate trains slowly even at a fixed learning rate. DAPO's **dynamic sampling** therefore
# keeps sampling until the batch is full of groups whose accuracy is neither all 0 nor all 1,
# instead of just dropping them (`dynamic_sampling_rounds`, measured in chapter 8).
# `zero_std_groups` is the metric to watch: when it approaches 1, the prompts are too easy
# (or too hard) for the policy.
#
# ## Dividing by the std: easy, hard and in-between prompts
#
# With binary rewards and a group of G completions of which a fraction p is right, the
# group std is $\sqrt{p(1-p)}$. Dividing by it makes every group's advantages have unit
# spread, whatever p. Not dividing (Dr. GRPO's `scale="none"`) leaves the spread at
# $\sqrt{p(1-p)}$, largest at p = 1/2. One number summarises how hard a group pushes:
# $\sum_i |A_i|$.

# %%
G8 = 8
print(f"{'right':>6} {'p':>7}   {'sum|A| group':>12} {'sum|A| batch':>12} {'sum|A| none':>12}   A of a right answer (group, none)")
groups = torch.stack([torch.cat([torch.ones(k), torch.zeros(G8 - k)]) for k in range(1, G8)])
scaled = {scale: group_advantages(groups, scale=scale) for scale in ("group", "batch", "none")}
for k in range(1, G8):
    row = {scale: scaled[scale][k - 1].abs().sum().item() for scale in scaled}
    print(f"{k:>4}/8 {k / G8:>7.4f}   {row['group']:>12.4f} {row['batch']:>12.4f} {row['none']:>12.4f}   "
          f"{scaled['group'][k - 1, 0]:+.4f}, {scaled['none'][k - 1, 0]:+.4f}")
push = {scale: scaled[scale].abs().sum(-1) for scale in scaled}
print("\nsum|A| of the 1/8 prompt relative to the 4/8 prompt: "
      + ", ".join(f"{scale} {(push[scale][0] / push[scale][3]).item():.4f}" for scale in push))

# %% [markdown]
# With the group std, the prompt the policy solves once in 8 (p = 0.125) pushes with
# $\sum|A|$ = 5.2915, against 8.0000 for a coin-flip prompt: a ratio of 0.6614. Without it,
# the same prompts push with 1.7500 and 4.0000: a ratio of 0.4375. The single right answer to
# a hard prompt gets A = +2.6458 with the std and +0.8750 without. So std scaling
# **up-weights prompts that are nearly always right or nearly always wrong** relative to the
# in-between ones.
#
# Whether that is good is the disagreement. It amplifies the rare success on a hard prompt
# (useful signal), but also the rare failure on an easy one, and with few samples the std of
# a near-saturated group is itself noisy. Dr. GRPO drops the division. `scale="batch"` keeps
# one std for the whole batch, so prompts keep their relative scale while the overall
# magnitude stays normalised.
#
# The same rows as a plot, per prompt difficulty:

# %%
figure, axis = plt.subplots(figsize=(7, 3.5))
p_axis = np.arange(1, G8) / G8
for scale, style in zip(("group", "batch", "none"), ("-o", "--s", ":^")):
    _ = axis.plot(p_axis, scaled[scale].abs().sum(-1).numpy(), style, label=f'scale="{scale}"')
_ = axis.set_xlabel("fraction of the group that is right, p")
_ = axis.set_ylabel("sum of |A| over the group")
_ = axis.set_title("G = 8 binary rewards")
_ = axis.legend()
figure.tight_layout()
plt.show()

# %% [markdown]
# ## What you learned
#
# - `grpo` gives every completion the same total weight, 1/N, so each token weighs
#   $1/(N|o|)$: that is the length bias.
# - `bnpo`, `dr_grpo` and `dapo` weigh every token the same and differ only in the constant
#   they divide by; `dr_grpo`'s must be the generation limit, not the padded width.
# - Dividing advantages by the group's std up-weights nearly saturated prompts relative to
#   coin-flip ones.
# - A group whose rewards are all equal carries no policy gradient but still counts in the
#   denominators. Dropping it rescales the rest of the gradient without turning it.
# - GSPO clips one ratio per completion, the geometric mean of its token ratios, so its clip
#   range must be hundreds of times narrower than GRPO's.
#
# ## Check yourself
#
# Where an answer is a number, check yours before you open it:
# `quiz.check(4, 1, short_token=..., long_token=..., completion=...)` (`from grpo_edu.exercises import quiz`;
# `quiz.ask(4)` lists what each question takes).
#
# 1. Under `grpo`, in a batch of N = 8 completions, what does one token of a 10-token
#    completion weigh, and one of a 100-token completion? What does each whole completion
#    weigh?
#
#    <details><summary>Answer</summary>
#
#    1/(8 x 10) = 0.012500 and 1/(8 x 100) = 0.001250. Each completion weighs 1/8 = 0.1250 in
#    all, whatever its length.
#
#    </details>
#
# 2. A group of G = 8 binary rewards has one right answer. What is that answer's advantage
#    with the group std, and without it?
#
#    <details><summary>Answer</summary>
#
#    +2.6458 with the std, +0.8750 without. The std of a near-saturated group is small, so
#    dividing by it amplifies the lone success.
#
#    </details>
#
# 3. Dropping the two saturated groups of the four doubled the informative groups' gradient
#    under `grpo`, but multiplied it by 2.9333 under `bnpo`. Why the difference?
#
#    <details><summary>Answer</summary>
#
#    `grpo` divides by the number of completions N, which halves. `bnpo` divides by the token
#    count, which falls from 176 to 60, because the saturated groups wrote the longer
#    completions.
#
#    </details>
#
# ## Exercises
#
# Checkers are in `grpo_edu.exercises.ch04`. Each exercise has a hint and a worked solution
# (an open question, a written answer), folded: open them when you want them.
#
# **4.1 Token weights.** Write `my_token_weights(lengths, loss_type, max_completion_length)`:
# given the lengths $|o_i|$ of N completions, return the weight (N,) of one token of each
# completion in the loss, for `loss_type` in grpo, bnpo, dr_grpo (dapo with the local
# token count is bnpo). The first attempt below forgets something about one loss type.
#
# <details><summary>Hint</summary>
#
# `dr_grpo` replaces each completion's own length by the constant `max_completion_length`,
# but it still averages over the N completions.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# import torch
#
#
# def my_token_weights(lengths, loss_type, max_completion_length):
#     lengths = torch.as_tensor(lengths, dtype=torch.float64)
#     N = len(lengths)
#     if loss_type == "grpo":
#         return 1 / (N * lengths)
#     if loss_type == "bnpo":
#         return torch.full_like(lengths, 1 / lengths.sum().item())
#     return torch.full_like(lengths, 1 / (N * max_completion_length))      # dr_grpo
#
#
# ch04.check_token_weights(my_token_weights)
# ```
#
# </details>

# %%
from grpo_edu.exercises import ch04


def my_token_weights(lengths, loss_type, max_completion_length):
    lengths = torch.as_tensor(lengths, dtype=torch.float64)
    N = len(lengths)
    if loss_type == "grpo":
        return 1 / (N * lengths)
    if loss_type == "bnpo":
        return torch.full_like(lengths, 1 / lengths.sum().item())
    return torch.full_like(lengths, 1 / max_completion_length)      # dr_grpo: fix me


ch04.check_token_weights(my_token_weights)

# %% [markdown]
# **4.2 The zero-std filter.** Write `my_informative_groups(rewards)`: (B, G) rewards to a
# (B,) bool mask of the groups to keep. The checker includes equal rewards whose mean
# rounds (so r - mean is not exactly 0) and a partial-credit reward with a small spread:
# a tolerance that is too loose or too tight fails one of them.
#
# <details><summary>Hint</summary>
#
# The question is not "is the spread small" but "are the rewards equal". Compare each
# reward with the group's first, exactly: no mean, no std, no tolerance.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# def my_informative_groups(rewards):
#     return (rewards != rewards[:, :1]).any(dim=1)
#
#
# ch04.check_informative_groups(my_informative_groups)
# ```
#
# </details>

# %%
def my_informative_groups(rewards):
    return rewards.std(dim=1) > 1e-3


ch04.check_informative_groups(my_informative_groups)

# %% [markdown]
# **4.3 The GSPO ratio.** Write `my_sequence_ratio(logp, old_logp, mask)`: (N, S) tensors to
# the (N,) sequence-level ratio $\exp\big(\frac{1}{|o_i|}\sum_t (\log\pi - \log\pi_\text{old})\big)$
# that GSPO clips. Then explain, with the numbers of the side-by-side table, why GSPO's
# clip range is hundreds of times narrower than GRPO's (667 times below 1 and 500 times
# above, from the side-by-side cell).
#
# <details><summary>Hint</summary>
#
# Mask the log-ratio before summing (padding must not count), divide by each completion's
# number of real tokens, then exponentiate once.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# import torch
#
#
# def my_sequence_ratio(logp, old_logp, mask):
#     log_ratio = torch.where(mask, logp - old_logp, torch.zeros_like(logp))
#     return torch.exp(log_ratio.sum(-1) / mask.sum(-1))
#
#
# ch04.check_sequence_ratio(my_sequence_ratio)
# ```
#
# The sequence ratio is the geometric mean of the token ratios. Token log-ratios scatter
# around 0 in both directions, and a mean over a completion's tokens cancels most of that
# scatter, so the sequence ratio stays far closer to 1 than the token ratios do. A clip
# range as wide as GRPO's would then never bind; to bound the update, GSPO must clip the
# mean's much smaller deviations, hence a range hundreds of times narrower.
#
# </details>

# %%
def my_sequence_ratio(logp, old_logp, mask):
    raise NotImplementedError("your sequence ratio here")


ch04.check_sequence_ratio(my_sequence_ratio)

# %% [markdown]
# **Open question: length over training.** With `grpo_edu.training.trainer` (chapter 6), train the tiny
# reasoner twice, with `loss_type="grpo"` and `loss_type="dr_grpo"`, and plot the mean
# length of *wrong* completions against the step. Which way does the prediction of this
# chapter say they should diverge, and do they?
#
# <details><summary>Hint</summary>
#
# Under `grpo` a wrong completion's penalty is spread over its own tokens: what does a
# longer wrong answer cost per token? Then look at chapter 7's failure 3, which ran this
# experiment.
#
# </details>
#
# <details><summary>Answer</summary>
#
# The prediction: under `grpo` a token of a long wrong completion is penalised less than a
# token of a short one, so wrong completions should drift longer than under `dr_grpo`,
# whose per-token weight does not depend on length. Measured on the tiny reasoner, they do
# not: chapter 7 (failure 3, `benchmarks/failure_lab.py --length`) trains both for 200
# steps with a longer length limit and a hotter sampler, and the mean completion length
# moves by less than a token under either loss. The tiny policy's completions have one
# shape whose length the problem sets, so there is no reasoning to pad; the bias is real
# arithmetic (this chapter) that this policy has no way to exploit.
#
# </details>
