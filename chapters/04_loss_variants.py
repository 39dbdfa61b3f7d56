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
# > - why groups with equal rewards dilute the gradient, and what dropping or refilling them does
# > - what a moving reference, entropy masking and overlong handling do to a small run
# >
# > **You need first**: chapter 3 (the masked step).
# >
# > **Reading time**: about 41 minutes. **Compute**: at most 60 s on a 2-core CPU. [Glossary](../docs/glossary.md) · [Notation](../docs/notation.md)
#
# Chapter 3 computed one loss of GRPO (Group Relative Policy Optimization), `grpo`: the
# clipped surrogate averaged over each completion's tokens, then over completions. Since
# DeepSeekMath, several variants have changed that loss in two places:
#
# - **how per-token losses are summed into one number** (`grpo`, `bnpo`, `dr_grpo`,
#   `dapo`): this decides how hard each *token* is pushed, and it depends on the
#   completion's length;
# - **which ratio is clipped, and where**: the sequence-level ratio of GSPO (Group Sequence
#   Policy Optimization), and the clip-higher of DAPO (Decoupled Clip and Dynamic Sampling
#   Policy Optimization).
#
# Plus one change upstream of the loss: whether advantages are divided by the group's
# standard deviation (Dr. GRPO drops the division). This chapter puts them side by side on
# one batch, measures the length bias, and looks at the groups that carry no signal at all.
#
# DAPO changes more than its loss. It drops the Kullback-Leibler (KL) term (`beta = 0` in
# grpo_edu). It leaves truncated completions out of the loss (overlong filtering), and lowers
# the reward of completions that run close to the length limit (a soft overlong punishment).
# It also replaces groups whose rewards are all equal by sampling more (dynamic sampling). A
# last variant trains only the tokens where the policy was uncertain (entropy masking, the
# "80/20" finding). The end of the chapter measures each on the tiny reasoner, under its
# grpo_edu key.

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
# Six settings on the same batch. The `dapo` row counts the tokens of a generation batch twice
# this one's, as when it is split across two GPUs, so it differs from `bnpo`; with the local
# count the two are identical. Every row keeps the same KL term, $\beta$ = 0.04, DAPO's
# included, so that the rows differ only in aggregation and clipping. For each we print the
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
print({name: divisors.__name__ for name, divisors in aggregation.AGGREGATIONS.items()})

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
# - `dapo`: the token count of the whole generation batch, summed over GPUs and accumulation
#   steps. When a rollout is split into mini-batches, grpo_edu's trainer divides by the
#   rollout's tokens per optimizer step, as TRL (Hugging Face's Transformer Reinforcement
#   Learning library) does;
# - `dr_grpo`: N L, with L the generation limit, a true constant.
#
# A warning about that constant. The textbook section "Implementing GRPO from Scratch" (its
# chapter 15) describes Dr. GRPO as dividing by the padded width of the batch. That is not a
# constant: the same completions padded to a longer batch would get a smaller loss.
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
# instead of just dropping them (`dynamic_sampling_rounds`, measured at the end of the
# chapter). `zero_std_groups` is the metric to watch: when it approaches 1, the prompts are
# too easy (or too hard) for the policy.
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
# ## The reference the KL anchors to
#
# The KL term pulls the policy toward a reference, and which reference is a choice of its
# own. DeepSeekMath and R1 **replace** it by the current policy from time to time (R1: every
# 400 optimizer steps). open-instruct and TRL can also move it **part of the way**, by Polyak
# averaging: ref = alpha x policy + (1 - alpha) x ref at every sync (TRL's
# `ref_model_mixup_alpha`, default 0.6, with `ref_model_sync_steps`). In grpo_edu the keys are
# `ref_sync_steps` (every K rollouts; 0 = frozen) and `ref_mixup_alpha` (1 = the hard copy).
# After n syncs the reference is a mixture of the policies it was synced with: the one of
# sync k weighs alpha (1 - alpha)^(n - k), and the starting policy (1 - alpha)^n. On one
# parameter, the policy's value at each of five syncs:

# %%
from grpo_edu.training.placement import Models

policy_values = [1.0, 2.0, 4.0, 3.0, 5.0]
for alpha in (1.0, 0.6, 0.05):
    reference = torch.nn.Linear(1, 1, bias=False)
    policy = torch.nn.Linear(1, 1, bias=False)
    models = Models(policy, reference, policy, None, None)
    with torch.no_grad():
        reference.weight.fill_(0.0)
    trail = []
    for value in policy_values:
        with torch.no_grad():
            policy.weight.fill_(value)
        models.sync_reference(alpha)
        trail.append(reference.weight.item())
    weights = [alpha * (1 - alpha) ** (len(policy_values) - 1 - k) for k in range(len(policy_values))]
    by_hand = sum(w * v for w, v in zip(weights, policy_values))
    print(f"alpha {alpha:<5} reference after each sync {[round(t, 4) for t in trail]}   "
          f"sum_k alpha (1 - alpha)^(n-k) x policy_k = {by_hand:.4f}")

# %% [markdown]
# What each choice does to a run: frozen; a copy every 25 rollouts; Polyak with alpha 0.6
# every 25; and alpha 0.05 at every rollout, an exponential moving average. The table gives
# the held-out greedy accuracy at the end, mean (min-max) over three seeds, and the KL the
# loss saw, median over the last 25 steps:
#
# <details><summary>How we know</summary>
#
# `benchmarks/reference.py` ran the default run (configs/cpu-tiny.toml) for 150 steps, seeds
# 0, 1 and 2, with each reference, and wrote `benchmarks/results/reference.json`, which the
# cell below reads.
#
# </details>

# %%
import json
from pathlib import Path

reference_runs = json.loads(home.path("benchmarks/results/reference.json").read_text())
ref_variants = list(reference_runs["variants"])
final = {v: [r["final_accuracy"] for r in reference_runs["runs"] if r["variant"] == v] for v in ref_variants}
late_kl = {v: [float(np.median(r["steps"]["kl"][-25:])) for r in reference_runs["runs"] if r["variant"] == v]
           for v in ref_variants}
print(f"{'reference':<10}{'settings':<46}{'final accuracy':<25}late KL")
for v in ref_variants:
    settings = ", ".join(f"{k} = {x}" for k, x in reference_runs["variants"][v].items())
    print(f"{v:<10}{settings:<46}{np.mean(final[v]):.3f} ({min(final[v]):.3f}-{max(final[v]):.3f})      "
          f"{np.mean(late_kl[v]):.4f} ({min(late_kl[v]):.4f}-{max(late_kl[v]):.4f})")
figure, axis = plt.subplots(figsize=(8, 3))
for v in ref_variants:
    curves = np.array([r["steps"]["kl"] for r in reference_runs["runs"] if r["variant"] == v], dtype=float)
    axis.plot(np.arange(1, curves.shape[1] + 1), curves.mean(0), label=v)
axis.set_xlabel("step")
axis.set_ylabel("KL to the reference (mean of 3 seeds)")
axis.legend()
plt.show()

# %% [markdown]
# A moving reference follows the policy, so the KL the loss sees stays small. The pull back
# toward the start, which a frozen reference exerts, almost vanishes (the copy's KL is exactly
# 0 right after each sync). Final accuracy is not separated at this size. The table prints
# frozen `0.751 (0.734-0.770)`, copy `0.711 (0.672-0.738)`, Polyak `0.721 (0.699-0.746)` and
# moving average `0.716 (0.668-0.742)`. The frozen reference has the highest mean, and every
# moving reference's range overlaps it. R1 resets its reference over thousands of steps,
# where an anchor to the start would hold back a policy that has to travel far. 150 steps of
# the tiny reasoner do not go far. Checked against the numbers above:

# %%
moving = [v for v in ref_variants if v != "frozen"]
claims = {
    "every moving reference keeps the late KL more than 20 times below the frozen one's, in every seed":
        max(max(late_kl[v]) for v in moving) * 20 < min(late_kl["frozen"]),
    "no moving reference ends above the frozen one in mean held-out accuracy":
        all(np.mean(final[v]) < np.mean(final["frozen"]) for v in moving),
    "every moving reference's range of final accuracies overlaps the frozen one's":
        all(max(final[v]) >= min(final["frozen"]) for v in moving),
}
for claim, holds in claims.items():
    print(f"{'holds' if holds else 'FAILS'}: {claim}")

# %% [markdown]
# ## Which tokens train: entropy masking
#
# So far every token of a completion gets its completion's advantage. Most of those tokens
# were never in doubt, like the tags and the `\boxed{`. The choices are elsewhere, and
# closing the reasoning can be one: in the example below, a completion writes `</think>` at a
# fork of 1.06 nats.
#
# Wang et al. studied which tokens matter when reinforcement learning trains a large language
# model to reason ("Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective
# Reinforcement Learning for LLM Reasoning", 2025). They measured the policy's entropy at each
# token, $H_t = -\sum_v \pi(v \mid o_{<t}) \log \pi(v \mid o_{<t})$. They found the high-entropy
# minority to be the "forks" of a trace, and trained only the top 20% of tokens by entropy.
# They report parity with training all tokens at 8B parameters, and gains at 14B and 32B.
# Their runs use DAPO, with no KL term.
#
# In grpo_edu that is `top_entropy_quantile = q` (TRL's key of the same name). Before each
# optimizer step the trainer computes the exact entropy of every token's distribution. It
# takes the threshold $\tau$ = the (1 - q)-quantile of the entropies of all the step's real
# tokens: every micro-batch, on every rank. Then it zeroes the policy term of every token
# below $\tau$. TRL 1.16 takes the quantile per `_compute_loss` call instead, that is per
# micro-batch, gathered over ranks; the two agree when an optimizer step is one micro-batch.
# As in TRL, the KL term and the normaliser still count the masked tokens. With $\beta$ = 0.04
# the KL term keeps pulling the masked tokens toward the reference, which the paper's runs,
# with no KL term, did not do.
#
# <details><summary>How we know</summary>
#
# `grpo_edu.algorithm.entropy_mask.threshold` gathers the entropies of every micro-batch on
# every rank before taking the quantile; `tests/test_entropy_mask.py` checks that
# `micro_batch_size` changes neither the threshold nor the update. TRL 1.16's
# `get_high_entropy_mask`, called from `_compute_loss`, gathers one micro-batch across
# processes; `tests/test_trl_parity.py` holds the masked loss equal to TRL's.
# `grpo_edu.commands.trl_bridge` warns when a config with `top_entropy_quantile` < 1 has
# several micro-batches per optimizer step, where the two differ.
#
# </details>
#
# Below, the committed starting policy on one problem, with four completions: right; a wrong
# tens digit in the answer; a reasoning that stops after one digit; an answer missing a digit.
# Each token shows the entropy of the distribution it was drawn from; in brackets are the
# tokens q = 0.2 keeps:

# %%
from grpo_edu.algorithm import entropy_mask
from grpo_edu.environment import tasks
from grpo_edu.algorithm.logprobs import completion_logprobs
from grpo_edu.policy.models import load_policy, policy_source

start_policy, tokenizer = load_policy(policy_source("start"))
problem = tasks.make_dataset("arithmetic", n=1, split="test", seed=0)[0]
texts = [problem["solution"], "<think>11</think>\\boxed{101}", "<think>1</think>\\boxed{111}",
         "<think>11</think>\\boxed{11}"]
prompt = tokenizer([problem["prompt"]] * len(texts), return_tensors="pt", add_special_tokens=False)
tokenizer.padding_side = "right"                      # completions are right-padded
written = tokenizer([t + tokenizer.eos_token for t in texts], return_tensors="pt", padding=True,
                    add_special_tokens=False)
with torch.no_grad():
    H = completion_logprobs(start_policy, torch.cat([prompt.input_ids, written.input_ids], 1),
                            torch.cat([prompt.attention_mask, written.attention_mask], 1),
                            written.attention_mask, entropy=True)
tau = entropy_mask.threshold([H], [written.attention_mask], 0.2)
keep = entropy_mask.high_entropy_mask(H, written.attention_mask, tau)
print(f"{problem['prompt']}  threshold tau = {tau:.2f}: {int(keep.sum())} of {int(written.attention_mask.sum())} "
      f"tokens train their policy term")
for row, text in enumerate(texts):
    tokens = tokenizer.convert_ids_to_tokens(written.input_ids[row])
    print("  " + "  ".join(f"[{t} {h:.2f}]" if k else f"{t} {h:.2f}"
                           for t, h, k, m in zip(tokens, H[row].tolist(), keep[row].tolist(),
                                                 written.attention_mask[row].tolist()) if m))

# %% [markdown]
# The problem is 49+62, and the reasoning is the units column, 9 + 2 = 11. The kept tokens are
# the forks. The first is the reasoning's second character, at 1.06 nats: after a first `1`,
# does the column sum have a second digit (`1`, for 11) or not (`</think>`)? The second is the
# answer's tens digit, the one the carry changes (0.88 nats in three rows, 0.76 in the third).
# The tags, the `\boxed{` and the end-of-sequence (EOS) token cost the policy 0.01 to 0.05
# nats: whatever their advantage, there is little left to learn there. The entropy belongs to
# the position, not to the token written. The third completion wrote `</think>` where the
# others wrote a digit, from the same distribution, 1.06 again.
#
# <details><summary>How we know</summary>
#
# The entropies are printed to two decimals: at three, one of these values sits so close to a
# rounding boundary that another CPU's kernels could tip it.
#
# </details>
#
# What it does to a run, at q = 1, 0.5 and 0.2, and at q = 1 and 0.2 without the KL term
# (beta = 0, as the paper ran DAPO). The table gives the final held-out greedy accuracy, mean
# (min-max) over three seeds, and the policy's entropy: the mean over completions of their mean
# token entropy, averaged over the last 25 steps. Under it, each comparison paired by seed: the
# mean of the seed-by-seed differences and its 95% interval (Student's t over the 3 seeds).
#
# <details><summary>How we know</summary>
#
# `benchmarks/entropy.py` ran the default run for 150 steps, seeds 0, 1 and 2, at each q, and
# wrote `benchmarks/results/entropy.json`, which the cell below reads.
#
# </details>

# %%
entropy_runs = json.loads(home.path("benchmarks/results/entropy.json").read_text())
ent_variants = list(entropy_runs["variants"])
ent_final = {v: [r["final_accuracy"] for r in entropy_runs["runs"] if r["variant"] == v] for v in ent_variants}
late_entropy = {v: [float(np.mean(r["steps"]["entropy/mean"][-25:])) for r in entropy_runs["runs"]
                    if r["variant"] == v] for v in ent_variants}
kept_share = {v: [float(np.mean([k for k in r["steps"]["entropy/kept"] if k is not None] or [1.0]))
                  for r in entropy_runs["runs"] if r["variant"] == v] for v in ent_variants}
print(f"{'tokens':<13}{'settings':<70}{'final accuracy':<25}{'late entropy':<27}kept")
for v in ent_variants:
    settings = ", ".join(f"{k} = {x}" for k, x in entropy_runs["variants"][v].items())
    print(f"{v:<13}{settings:<70}{np.mean(ent_final[v]):.3f} ({min(ent_final[v]):.3f}-{max(ent_final[v]):.3f})      "
          f"{np.mean(late_entropy[v]):.4f} ({min(late_entropy[v]):.4f}-{max(late_entropy[v]):.4f})   "
          f"{np.mean(kept_share[v]):.3f}")

from grpo_edu.algorithm.statistics import by_seed, paired_seeds

ent_by_seed = {v: by_seed(entropy_runs["runs"], variant=v) for v in ent_variants}
ent_verdicts = {(a, b): paired_seeds(ent_by_seed[a], ent_by_seed[b])
                for a, b in (("top20", "all"), ("top50", "all"), ("top20-beta0", "all-beta0"), ("all-beta0", "all"))}
print("\nfinal accuracy, paired over seeds: mean difference [95% t interval]")
for (a, b), verdict in ent_verdicts.items():
    print(f"  {verdict.words(a, b)}")
figure, axes = plt.subplots(1, 2, figsize=(10, 3))
for v in ent_variants:
    runs = [r for r in entropy_runs["runs"] if r["variant"] == v]
    curves = np.array([r["steps"]["entropy/mean"] for r in runs], dtype=float)
    axes[0].plot(np.arange(1, curves.shape[1] + 1), curves.mean(0), label=v)
    evals = np.array([[a for _, a in r["eval"]] for r in runs])
    axes[1].plot([s for s, _ in runs[0]["eval"]], evals.mean(0), marker="o", label=v)
axes[0].set_xlabel("step")
axes[0].set_ylabel("policy entropy (nats per token)")
axes[1].set_xlabel("step")
axes[1].set_ylabel("held-out accuracy (mean of 3 seeds)")
axes[0].legend()
plt.show()

# %% [markdown]
# On the tiny reasoner, training a fifth of the tokens (q = 0.2) ends lower in every seed:
# `0.681 (0.652-0.711)` against `0.751 (0.734-0.770)` for all tokens. Paired by seed, the gap
# is -0.070 [-0.172, +0.031]: not separated at this size. The policy also stays more uncertain,
# 0.3567 nats against 0.3198: the tokens that would have sharpened are not trained. Half the
# tokens (q = 0.5) is not separated from all of them either: -0.003 [-0.067, +0.062].
#
# Without the KL term the picture changes. At beta = 0 a fifth of the tokens ends level with all
# of them, +0.003 [-0.012, +0.017], the paper's parity at 8B. With beta = 0.04 the KL term still
# pulls the masked 80% toward the reference, and this book's masked run is a different method
# from the paper's. (Dropping the KL term itself costs every token's run -0.044
# [-0.106, +0.017] here, not separated either.)
#
# This run differs from the paper's in more than size. The paper's traces are thousands of
# tokens long; this policy's are about ten, with two or three forks each. Checked against the
# numbers above:

# %%
claims = {
    "q = 0.2 ends below q = 1 in mean held-out accuracy, and its best seed below q = 1's worst":
        np.mean(ent_final["top20"]) < np.mean(ent_final["all"]) and max(ent_final["top20"]) < min(ent_final["all"]),
    "q = 0.5 ends within 0.01 of q = 1 in mean held-out accuracy":
        abs(np.mean(ent_final["top50"]) - np.mean(ent_final["all"])) < 0.01,
    "q = 0.2 ends with a higher policy entropy than q = 1 in every seed":
        min(late_entropy["top20"]) > max(late_entropy["all"]),
    "each masked run trained its share of tokens, to within 0.01":
        all(abs(np.mean(kept_share[v]) - entropy_runs["variants"][v]["top_entropy_quantile"]) < 0.01
            for v in ("top50", "top20", "top20-beta0")),
    "paired by seed, none of the four comparisons is separated at this size":
        not any(verdict.separated for verdict in ent_verdicts.values()),
}
for claim, holds in claims.items():
    print(f"{'holds' if holds else 'FAILS'}: {claim}")

# %% [markdown]
# ## Completions cut at the limit
#
# A completion that reaches `max_completion_length` without its EOS is cut, and its reward
# judges an unfinished text. DAPO offers two remedies:
#
# - **overlong filtering** (`mask_truncated_completions`, TRL's name) leaves truncated
#   completions out of the loss. Their tokens count nowhere, while their rewards stay in
#   their group's advantages and they still count among `grpo`'s N;
# - a **soft overlong punishment** (`overlong_cache` = c) is a reward term that is 0 up to
#   L - c tokens and falls linearly to -1 at the limit L.
#
# Both assume that what the limit cuts is rambling. At L = 9 tokens that is not so for the
# tiny reasoner, whose right answers take 7 to 10 tokens, EOS included (the reasoning and the
# answer are one to three characters each):

# %%
from grpo_edu.training.scoring import soft_overlong_punishment

answers = tasks.make_dataset("arithmetic", n=816, split="test", seed=0)
needed = torch.tensor([len(tokenizer(a["solution"] + tokenizer.eos_token, add_special_tokens=False).input_ids)
                       for a in answers])
for n in sorted(set(needed.tolist())):
    print(f"right answers of {n} tokens: {int((needed == n).sum()):4d} of {len(answers)}")
lengths = torch.arange(5, 10)
print("punishment at L = 9, c = 2, by length", dict(zip(lengths.tolist(),
                                                        soft_overlong_punishment(lengths, 9, 2).tolist())))

# %% [markdown]
# So at L = 9 every answer that needs 10 tokens is cut just before its EOS. It is still read,
# and still right: the accuracy reward reads the boxed answer. With c = 2, L - c = 7 is the
# length of the shortest right answer, and an answer of 8 tokens costs 0.5 and one of 9 costs
# 1. The run's reward is accuracy (weight 1) plus format (weight 0.5) plus this term. A right
# answer of 9 or 10 tokens therefore earns 1 + 0.5 - 1 = 0.5, exactly what a well-formed
# wrong answer of 7 tokens earns. At this setting the punishment cannot tell most right
# answers from the shortest wrong ones, so the test below puts the method where it cannot help.
#
# So the benchmark also runs the three with DAPO's slack, scaled to this task. DAPO trains at
# L = 20,480 with c = 4,096, so L - c is 0.8 of the limit. Here L = 13 and c = 3: L - c = 10,
# the longest right answer. The table gives the held-out greedy accuracy at each run's own
# limit, and over the last 25 steps the share of truncated completions and the mean completion
# length. Under it, each method against the plain run at the same limit, paired by seed:
#
# <details><summary>How we know</summary>
#
# `benchmarks/overlong.py` ran the default run (configs/cpu-tiny.toml: accuracy 1.0, format
# 0.5) at L = 9 and at L = 13 for 150 steps, seeds 0, 1 and 2, and wrote `benchmarks/results/overlong.json`,
# which the cell below reads. The punishment is `grpo_edu.training.scoring.soft_overlong_punishment`,
# added to the reward with weight 1.
#
# </details>

# %%
overlong_runs = json.loads(home.path("benchmarks/results/overlong.json").read_text())
ol_variants = list(overlong_runs["variants"])
ol_final = {v: [r["final_accuracy"] for r in overlong_runs["runs"] if r["variant"] == v] for v in ol_variants}
ol_late = {v: {key: [float(np.mean(r["steps"][key][-25:])) for r in overlong_runs["runs"] if r["variant"] == v]
               for key in ("truncated", "completion_length/mean")} for v in ol_variants}
print(f"{'variant':<11}{'settings':<64}{'final accuracy':<25}{'late truncated':<17}late length")
for v in ol_variants:
    settings = ", ".join(f"{k} = {x}" for k, x in overlong_runs["variants"][v].items()) or "-"
    print(f"{v:<11}{settings:<64}{np.mean(ol_final[v]):.3f} ({min(ol_final[v]):.3f}-{max(ol_final[v]):.3f})      "
          f"{np.mean(ol_late[v]['truncated']):.3f}            {np.mean(ol_late[v]['completion_length/mean']):.2f}")

ol_by_seed = {v: by_seed(overlong_runs["runs"], variant=v) for v in ol_variants}
ol_verdicts = {(a, b): paired_seeds(ol_by_seed[a], ol_by_seed[b])
               for a, b in (("filter", "plain"), ("soft", "plain"), ("filter-13", "plain-13"), ("soft-13", "plain-13"))}
print("\nfinal accuracy, paired over seeds: mean difference [95% t interval]")
for (a, b), verdict in ol_verdicts.items():
    print(f"  {verdict.words(a, b)}")

# %% [markdown]
# Filtering ends lower in every seed: `0.685 (0.656-0.715)` against `0.743 (0.738-0.754)` for the
# plain run (three seeds, no paired interval). At L = 9 every right answer that needs 10
# tokens (211 of the 816 held-out problems above) is truncated, so filtering never trains
# one; it leaves out every other truncated completion too. The punishment collapses every seed, to
# `0.003 (0.000-0.008)`. Only a completion of 7 tokens or fewer is free of the punishment, and
# a right answer of 9 or 10 tokens earns no more than a well-formed wrong one of 7. The
# group-relative advantage prefers the short ones, and the policy learns to stop at seven
# tokens (7.02 late), where only a one-character answer fits. Paired by seed, the plain run
# beats both at L = 9: filtering -0.059 [-0.113, -0.005], the punishment -0.741
# [-0.771, -0.711].
#
# With DAPO's slack the methods leave the right answers alone, and the policy truncates under 1%
# of its completions. Neither method is separated from the plain run at this size: filtering
# +0.009 [-0.069, +0.088], the punishment +0.018 [-0.052, +0.088]. They are made for a policy that
# rambles past its answer, and this one does not. Checked against the numbers above:

# %%
claims = {
    "overlong filtering ends below the plain run in every seed (its best below the plain run's worst)":
        max(ol_final["filter"]) < min(ol_final["plain"]),
    "the soft punishment collapses every seed: final accuracy below 0.01":
        max(ol_final["soft"]) < 0.01,
    "under the punishment the completions shrink to the 7 tokens of a one-character answer, or fewer":
        max(ol_late["soft"]["completion_length/mean"]) < int(needed.min()) + 0.1,
    "the plain run truncates a quarter of its completions at the end, and keeps its accuracy":
        0.2 < np.mean(ol_late["plain"]["truncated"]) < 0.3 and np.mean(ol_final["plain"]) > 0.7,
    "paired by seed, the plain run beats filtering and the punishment at L = 9":
        ol_verdicts["filter", "plain"].high < 0 and ol_verdicts["soft", "plain"].high < 0,
    "at L = 13 every run truncates under 1% of its completions, and neither method is separated from plain":
        all(np.mean(ol_late[v]["truncated"]) < 0.01 for v in ("plain-13", "filter-13", "soft-13"))
        and not ol_verdicts["filter-13", "plain-13"].separated and not ol_verdicts["soft-13", "plain-13"].separated,
}
for claim, holds in claims.items():
    print(f"{'holds' if holds else 'FAILS'}: {claim}")

# %% [markdown]
# ## Dynamic sampling, measured
#
# Back to the groups that carry no signal. `filter_zero_std_groups` drops them, and the batch
# trains on fewer groups. DAPO's dynamic sampling (`dynamic_sampling_rounds` = k) replaces
# them with the differing groups of up to k more rollouts of fresh prompts, until the batch is
# full. At the limit the slots left keep all-equal groups, which do not train, and the step
# says so (`dynamic_sampling/short`; verl's recipe raises an error there instead).
#
# DAPO (Yu et al. 2025) made it for saturated groups, whose accuracy is all 1 or all 0; the
# all-1 share grows as the policy improves. DAPO filters on accuracy. This book's filter
# reads the total reward and keeps every group whose total rewards differ. A group that
# differs only in its format reward therefore counts as signal here.
#
# The test below is a hard case, not the one the method was made for: chapter 7's Countdown
# failure. The arithmetic policy cannot solve Countdown, so most groups are all wrong, and
# only the format reward varies within some. Three runs keep, drop and refill (k = 4) the
# all-equal groups for 40 steps. Per step, the table gives the groups that carry a gradient
# (whose rewards differ), the rollouts sampled, the steps that reached the limit, the seconds
# spent sampling, and the KL over the last 10 steps:
#
# <details><summary>How we know</summary>
#
# `benchmarks/dynamic_sampling.py` ran the three variants on Countdown for 40 steps, seeds 0,
# 1 and 2, and wrote `benchmarks/results/dynamic_sampling.json`, which the cell below reads.
# The filter is `grpo_edu.algorithm.advantages.zero_std_groups`, applied to the weighted sum of
# the rewards (`grpo_edu.training.dynamic_sampling`).
#
# </details>

# %%
dynamic_runs = json.loads(home.path("benchmarks/results/dynamic_sampling.json").read_text())
ds_variants = [v for v in dynamic_runs["variants"] if not v.endswith("-solved")]   # Countdown; the rest below
B_countdown = 16                                      # prompts_per_step of configs/cpu-tiny.toml
ds = {v: [r for r in dynamic_runs["runs"] if r["variant"] == v] for v in ds_variants}


def per_run(v, value):
    return [value(r["steps"]) for r in ds[v]]


signal = {v: per_run(v, lambda st: B_countdown * (1 - np.mean(st["zero_std_groups"]))) for v in ds_variants}
ds_kl = {v: per_run(v, lambda st: float(np.mean([k for k in st["kl"][-10:] if k is not None]))) for v in ds_variants}
print(f"{'variant':<8}{'groups with signal':<22}{'rollouts':<10}{'at the limit':<14}{'s sampling':<12}"
      f"{'late KL':<18}held-out accuracy")
for v in ds_variants:
    rounds = per_run(v, lambda st: np.mean([x if x is not None else 1.0 for x in st["dynamic_sampling/rounds"]]))
    limit = per_run(v, lambda st: sum(1 for x in st["dynamic_sampling/short"] if x))
    seconds = per_run(v, lambda st: np.mean(st["time/rollout"]))
    groups = f"{np.mean(signal[v]):.1f} ({min(signal[v]):.1f}-{max(signal[v]):.1f})"
    print(f"{v:<8}{groups:<22}{np.mean(rounds):<10.2f}{np.mean(limit):<14.1f}{np.mean(seconds):<12.3f}"
          f"{np.mean(ds_kl[v]):.2f} ({min(ds_kl[v]):.2f}-{max(ds_kl[v]):.2f})  "
          f"{max(r['final_accuracy'] for r in ds[v]):.3f}")
print(f"first rollout's all-equal share under refill: "
      f"{np.mean(per_run('refill', lambda st: np.mean(st['dynamic_sampling/first_zero_std']))):.3f}")

# %% [markdown]
# Refilling trains between two and three times as many groups that carry a gradient as
# dropping does, 13.5 against 5.0 per step. It pays for them in rollouts: 4.13 per step, and
# it reaches the limit in 19.3 of the 40 steps on average. 0.711 of the first rollout's
# groups are all equal, and fresh prompts are no easier (the sampling seconds are this
# machine's).
#
# What it cannot do is make signal where there is none. No completion is ever right, so the
# groups it finds differ in format only. The policy is pushed harder toward that (the KL
# grows faster), and held-out accuracy stays 0. Under DAPO's accuracy filter every one of
# these groups would count as all-equal, and refilling would find nothing. Dynamic sampling
# helps a policy that solves some prompts and not others. For one that solves none, the task
# or the starting policy has to change (chapter 7). Checked:

# %%
claims = {
    "refill trains more than twice as many groups with signal per step as drop, in every seed":
        min(signal["refill"]) > 2 * max(signal["drop"]),
    "refill samples more than 3 rollouts per step on average":
        np.mean(per_run("refill", lambda st: np.mean(st["dynamic_sampling/rounds"]))) > 3,
    "held-out countdown accuracy is 0 for every variant and seed":
        all(e == 0.0 for v in ds_variants for r in ds[v] for _, e in r["eval"]),
    "refill ends with a larger KL than every keep and drop seed":
        min(ds_kl["refill"]) > max(max(ds_kl["keep"]), max(ds_kl["drop"])),
}
for claim, holds in claims.items():
    print(f"{'holds' if holds else 'FAILS'}: {claim}")

# %% [markdown]
# Now the regime DAPO made refill for: a policy that solves most of its problems. The
# committed policy `trained` is what `make train` trains (1,500 steps of the default run,
# seed 0). It answers 0.992 of these held-out arithmetic problems greedy. Sampled at
# temperature 1 it is right less often (pass@1, below), so some groups hold a wrong answer
# and many are all right. The same three runs continue training it
# for 40 steps, at a tenth of the first run's learning rate, as a second stage would.
# Greedy accuracy has almost no room left, so each evaluation also samples 4 completions per
# problem; pass@1 is their share right. The filter still reads the total reward.
#
# <details><summary>How we know</summary>
#
# The same benchmark ran the `-solved` variants (`model = "trained"`, `task = "arithmetic"`,
# `learning_rate = 3e-5`, `eval_samples = 4`). The policy is
# `grpo_edu/assets/tiny-arithmetic-trained`; `benchmarks/dynamic_sampling.py
# --trained-policy` makes it again.
#
# </details>

# %%
solved = [v for v in dynamic_runs["variants"] if v.endswith("-solved")]
ds_solved = {v: sorted((r for r in dynamic_runs["runs"] if r["variant"] == v), key=lambda r: r["seed"])
             for v in solved}


def last_pass_at_1(run):
    return [x for x in run["steps"]["eval/pass_at_1"] if x is not None][-1]


B_solved = B_countdown   # prompts_per_step: the same config, another task
solved_signal = {v: [B_solved * (1 - np.mean(r["steps"]["zero_std_groups"])) for r in ds_solved[v]] for v in solved}
print(f"{'variant':<15}{'groups with signal':<22}{'rollouts':<10}{'first all-equal':<17}{'greedy':<9}pass@1 at step 40")
for v in solved:
    rounds = [np.mean([x if x is not None else 1.0 for x in r["steps"]["dynamic_sampling/rounds"]]) for r in ds_solved[v]]
    first = [np.mean(r["steps"]["dynamic_sampling/first_zero_std"]) for r in ds_solved[v]
             if r["steps"]["dynamic_sampling/first_zero_std"][0] is not None]
    final_pass = [last_pass_at_1(r) for r in ds_solved[v]]
    print(f"{v:<15}{np.mean(solved_signal[v]):<22.1f}{np.mean(rounds):<10.2f}"
          f"{(f'{np.mean(first):.3f}' if first else '-'):<17}{np.mean([r['final_accuracy'] for r in ds_solved[v]]):<9.3f}"
          f"{np.mean(final_pass):.3f} ({min(final_pass):.3f}-{max(final_pass):.3f})")

solved_verdicts = {(a, b): paired_seeds([last_pass_at_1(r) for r in ds_solved[a]], [last_pass_at_1(r) for r in ds_solved[b]])
                   for a, b in (("refill-solved", "keep-solved"), ("refill-solved", "drop-solved"),
                                ("drop-solved", "keep-solved"))}
print("\npass@1 at step 40, paired over seeds: mean difference [95% t interval]")
for (a, b), verdict in solved_verdicts.items():
    print(f"  {verdict.words(a, b)}")

# %% [markdown]
# Here refill does what it was made for. 0.416 of the first rollout's groups have all-equal
# rewards, so keep and drop train 9.4 groups with signal per step. Refill
# trains all 16, and pays 2.10 rollouts per step for them, half of what Countdown cost.
#
# What it buys in 40 steps is not visible. Pass@1 at step 40 is 0.891 for refill and 0.890
# for keep, not separated at this size (+0.001 [-0.013, +0.015]). At this learning rate the
# policy barely moves in 40 steps, whichever groups it trains on. DAPO reports its gain over
# a whole training run of a 32B model, where refill also keeps the batch's size steady as
# accuracy climbs. This measurement shows the mechanism, not that gain.

# %%
show_solved = {
    "refill trains every slot of the batch on a group with signal here, where keep and drop train fewer than 12 of 16":
        min(solved_signal["refill-solved"]) == B_solved
        and max(solved_signal["keep-solved"] + solved_signal["drop-solved"]) < 12,
    "more than a third of the first rollout's groups are all-equal under refill":
        np.mean([x for r in ds_solved["refill-solved"] for x in r["steps"]["dynamic_sampling/first_zero_std"]]) > 1 / 3,
    "paired by seed, pass@1 at step 40 does not separate refill from keep or drop":
        not any(solved_verdicts[pair].separated for pair in solved_verdicts),
}
for claim, holds in show_solved.items():
    print(f"{'holds' if holds else 'FAILS'}: {claim}")

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
#   denominators. Dropping it rescales the rest. Refilling replaces it: it fills the batch
#   where many groups are all right, and cannot make signal where no completion is right.
# - A moving reference, entropy masking and overlong handling are settings with assumptions.
#   On the tiny reasoner none ended with a higher mean held-out accuracy than the plain run.
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
# 4. On Countdown, refilling trains 13.5 groups with signal per step against 5.0 when
#    dropping, yet held-out accuracy stays 0. Why, and what would DAPO's own filter do?
#
#    <details><summary>Answer</summary>
#
#    No completion is right, so the groups it finds differ only in their format reward.
#    This book's filter reads the total reward and keeps them; DAPO filters on accuracy and
#    would find every one of them all-equal.
#
#    </details>
#
# 5. At L = 9 with c = 2 (accuracy weight 1, format weight 0.5), what does a right answer of
#    10 tokens earn, and a well-formed wrong answer of 7 tokens?
#
#    <details><summary>Answer</summary>
#
#    The right one is cut to 9 tokens: 1 + 0.5 - 1 = 0.5. The wrong one: 0 + 0.5 + 0 = 0.5.
#    The same reward, which is why the punishment drives the policy to seven tokens.
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
