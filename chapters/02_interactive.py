# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 2. Advantages and clipping, interactively
#
# > **You will learn**
# > - how the group advantages of GRPO (Group Relative Policy Optimization) follow each reward, under group, batch or no std scaling
# > - where the clip takes a token's gradient away, and what the clip-higher of DAPO (Decoupled Clip and Dynamic Sampling Policy Optimization) changes
# > - how the k1, k2 and k3 estimators of the Kullback-Leibler (KL) penalty behave, on the policy's own tokens and on a sampler's
# > - how much one token counts under each loss type, and why that is a length bias
# >
# > **You need first**: chapter 1 (one GRPO update by hand).
# >
# > **Reading time**: about 14 minutes. **Compute**: at most 60 s on a 2-core CPU. [Glossary](../docs/glossary.md) · [Notation](../docs/notation.md)
#
# Chapter 1 computed one GRPO update by hand. This chapter takes its three moving parts, the
# group-relative advantage, the clipped ratio and the KL penalty, and puts each under
# sliders. A fourth explorer shows how the loss averages over tokens:
#
# | explorer | you drag | you watch |
# |---|---|---|
# | `AdvantageExplorer` | the rewards of two prompts' groups | their advantages, under group, batch or no std scaling |
# | `ClippingExplorer` | the advantage $A$, $\varepsilon_\text{low}$, $\varepsilon_\text{high}$ | the clipped objective and its gradient against the ratio |
# | `KLExplorer` | the logits of $\pi$ and $\pi_\text{ref}$ | the k1, k2, k3 estimators against the exact KL |
# | `LengthBiasExplorer` | the responses' lengths | how much one token counts under each loss type |
#
# None of them has its own copy of the maths. Every number they show comes from
# `grpo_edu.algorithm.advantages.group_advantages`, from `grpo_edu.algorithm.loss.grpo_loss`
# (the loss the trainer runs), and from the small functions of
# `grpo_edu.algorithm.estimators`, which read their answers off `grpo_loss`.
#
# <details><summary>How we know</summary>
#
# `tests/test_widgets.py` drives each explorer's sliders and compares what it shows with
# those functions. `tests/test_browser.py` drags a reward slider in a real JupyterLab, and
# `tests/test_html_explorers.py` checks that the HTML edition's JavaScript computes what the
# Python explorers compute.
#
# </details>
#
# In a notebook the sliders need a running kernel; on GitHub the widgets are frozen. The
# book's HTML edition (`grpo-edu book html`) keeps them live without a kernel: its pages run
# the same arithmetic in the browser. After each explorer, a normal cell prints the numbers
# of its default state. That cell is also what the book's tests re-execute and compare.

# %%
import numpy as np
import torch

from grpo_edu.algorithm import worked_example
from grpo_edu.algorithm.advantages import group_advantages
from grpo_edu.algorithm.estimators import clipped_objective, response_token_weights
from grpo_edu.algorithm.kl import kl_estimate
from grpo_edu.algorithm.loss import grpo_loss
from grpo_edu.widgets import AdvantageExplorer, ClippingExplorer, KLExplorer, LengthBiasExplorer
from grpo_edu.widgets import advantages as advantage_view
from grpo_edu.widgets import kl as kl_view

torch.set_num_threads(1)
np.set_printoptions(precision=4, suppress=True)

# %% [markdown]
# ## 1. Advantages: each response against its siblings
#
# A prompt's G responses are scored against each other:
# $A_i = (r_i - \bar r)/(\sigma + \epsilon)$. The explorer holds two prompts. Prompt 1 is
# chapter 1's group. Prompt 2 is one the policy nearly always gets right, with rewards that
# differ only a little. Try these:
#
# - drag a reward;
# - switch the std scaling: `group` is DeepSeekMath's GRPO, `batch` divides by one std over
#   the whole batch (REINFORCE++'s normalisation, Hu 2025,
#   [`arXiv 2501.03262`](https://arxiv.org/abs/2501.03262)), and `none` is Dr. GRPO;
# - switch between the population and the sample std;
# - shift every reward at once.

# %%
advantages = AdvantageExplorer()
advantages

# %%
print(advantages.report())

# %% [markdown]
# The default state already shows the case against per-group scaling. Prompt 2's rewards
# differ by a few hundredths, and dividing by its own small std turns them into advantages
# as large as prompt 1's. Scaling by the batch's std instead, or not at all, keeps the nearly
# solved prompt quiet. The cell below is what the explorer shows for each `scale`, computed
# by the same function the explorer calls.

# %%
rewards = advantages.rewards()
for scale in ("group", "batch", "none"):
    state = advantage_view.compute_state(rewards, scale=scale)
    print(f"scale={scale!r:8} std used {np.round(state.scales, 4)}  prompt 2's advantages "
          f"{state.advantages[1]}")
print("\nthe explorer's numbers are grpo_edu's:",
      np.array_equal(advantages.state.advantages, group_advantages(rewards)))

# %% [markdown]
# Two things happen the moment you drag into them.
#
# - Make all of a group's rewards equal, and its advantages become exactly zero: that group
#   teaches nothing, whatever its reward. The zero-std filter (`filter_zero_std_groups`)
#   drops such groups before the update. DAPO's dynamic sampling samples replacements for
#   them instead (chapter 8).
# - Shift every reward by the same amount, and nothing changes: only differences within a
#   group matter.
#
# Here is what the explorer shows for prompt 2 made all-equal and every reward shifted, from
# the function that computes its state:

# %%
flat = rewards.copy()
flat[1] = 0.5
state = advantage_view.compute_state(flat, shift=0.3)
print(f"rewards (shifted)\n{state.rewards}\nadvantages\n{state.advantages}")
for note in state.notes:
    print("note:", note)

# %% [markdown]
# ## 2. Clipping: the trust region per token
#
# Each token's objective is
# $\min(\rho A,\ \operatorname{clip}(\rho, 1-\varepsilon_\text{low}, 1+\varepsilon_\text{high})\,A)$,
# with $\rho = \pi/\pi_\text{old}$. The explorer draws it and its derivative in $\rho$, for
# the advantage on the slider. It shades the ratios where the gradient is zero. The dots are
# chapter 1's nine tokens at their actual ratios, placed where they would sit if their
# response had the slider's advantage.

# %%
# The picture the explorer below animates: PPO's clipped objective for A > 0 and A < 0.
from grpo_edu.book import schematics

schematics.clip_regions(epsilon_low=0.2, epsilon_high=0.2)

# %%
clipping = ClippingExplorer()
clipping

# %%
print(clipping.report())

# %% [markdown]
# The clipping is one-sided. With $A > 0$, a token whose ratio has already risen past
# $1+\varepsilon_\text{high}$ gets no more push. A token whose ratio fell below
# $1-\varepsilon_\text{low}$ is not clipped at all, and the full gradient pulls it back.
# With $A < 0$ it is the mirror image. Drag $A$ through zero and watch the shaded region
# jump sides. The explorer's clip decisions agree with the metrics that `grpo_loss` reports
# for the same tokens:

# %%
ratios = worked_example.token_ratios()
for advantage in (1.0, -1.0):
    shown = clipped_objective(ratios, advantage, epsilon=0.2)
    logp = torch.tensor(np.log(ratios) - 1.0).reshape(-1, 1)
    metrics = grpo_loss(logp, torch.full_like(logp, -1.0), torch.full((len(ratios),), advantage),
                        torch.ones_like(logp, dtype=torch.bool), epsilon=0.2).metrics
    print(f"A = {advantage:+.1f}: explorer clips {int(shown.clipped.sum())} of {len(ratios)} tokens, "
          f"grpo_loss clip_ratio/region = {metrics['clip_ratio/region']:.4f} "
          f"= {metrics['clip_ratio/region'] * len(ratios):.0f} of {len(ratios)}")

# %% [markdown]
# DAPO's clip-higher raises only $\varepsilon_\text{high}$ (to `0.28`). So tokens with
# $A > 0$ whose probability is rising can rise further before the gradient stops. That is
# meant to keep rare, useful tokens from being clipped away, and the policy's entropy from
# collapsing. With $\varepsilon = 0$ every token that moved in the rewarded direction is
# clipped, and only tokens that moved the wrong way still get a gradient. None of chapter
# 1's ratios lies between the two upper bounds, so here is the gradient at a few ratios
# chosen around them:

# %%
probe = np.array([0.75, 0.9, 1.1, 1.25, 1.35])
print(f"d objective / d rho at rho = {probe}")
for low, high in ((0.2, 0.2), (0.2, 0.28), (0.0, 0.0)):
    for advantage in (1.0, -1.0):
        gradient = clipped_objective(probe, advantage, epsilon=low, epsilon_high=high).gradient
        print(f"eps_low = {low:.2f}, eps_high = {high:.2f}, A = {advantage:+.0f}:  {gradient}")

# %% [markdown]
# ## 3. The KL penalty: three estimators of one number
#
# GRPO penalises $\mathrm{KL}(\pi\,\|\,\pi_\text{ref})$ per token, from the one token that was
# sampled. Let $d = \log\pi_\text{ref}(x) - \log\pi(x)$ for $x \sim \pi$. Schulman's three
# estimators are $k_1 = -d$, $k_2 = d^2/2$ and $k_3 = e^d - 1 - d$
# (`grpo_edu.algorithm.kl.kl_estimate`, the function the loss calls). The explorer sets
# $\pi$ and $\pi_\text{ref}$ over a vocabulary of three tokens by their logits. It draws
# each estimator against $d$, with the three tokens marked. And it compares their means over
# samples from $\pi$ with the exact KL.

# %%
kl = KLExplorer()
kl

# %%
print(kl.report())

# %% [markdown]
# On tokens drawn from $\pi$, $k_1$ and $k_3$ are unbiased (more on that condition below).
# $k_1$ is also negative on every token that $\pi_\text{ref}$ likes more than $\pi$ does, so
# a single-sample penalty can reward drifting away. $k_2$ is never negative, but biased.
# $k_3$ is both non-negative and unbiased. While the two distributions are close, its
# per-sample spread is far below $k_1$'s. Pull them apart and the picture changes:

# %%
print("ref logits           exact KL   E[k2] - KL   std k1   std k3")
for shift in (0.0, 1.0, 2.0, 3.0):
    state = kl_view.compute_state(kl_view.DEFAULT_LOGITS, np.array([0.5, 0.0, 0.5]) + [shift, 0, -shift])
    print(f"{np.round(state.ref_logits, 2)!s:<20} {state.exact_kl:.4f}     "
          f"{state.expected['k2'] - state.exact_kl:+.4f}      {state.sample_std['k1']:.4f}   "
          f"{state.sample_std['k3']:.4f}")

# %% [markdown]
# As the reference moves away, $k_2$'s bias grows until it exceeds the KL itself. $k_3$'s
# spread grows towards $k_1$'s: on a token that $\pi_\text{ref}$ likes far more than $\pi$
# does, $e^d$ is large. Unbiased and small in variance is a property of nearby
# distributions, which is where the KL penalty is meant to keep the policy.
#
# "Unbiased" has a condition attached: the tokens must be drawn from $\pi$, the policy whose
# KL is estimated. GRPO's tokens were drawn by $\pi_{\theta_\text{old}}$. After the first
# optimizer step on a rollout (the next mini-batch, the next pass), the policy being trained
# is no longer the one that sampled. Averaged over the sampler's tokens, every estimator
# then misses the KL. Weighting each token by the ratio $\pi/\pi_{\theta_\text{old}}$ would
# restore it. The cell below takes the explorer's $\pi$ and $\pi_\text{ref}$, and a sampler
# whose logits differ from $\pi$'s by a few tenths, and uses
# `grpo_edu.algorithm.kl.kl_estimate`:

# %%
logits, ref_logits = np.array(kl_view.DEFAULT_LOGITS), np.array(kl_view.DEFAULT_REF_LOGITS)
pi, pi_ref = torch.softmax(torch.tensor(logits), -1), torch.softmax(torch.tensor(ref_logits), -1)
pi_old = torch.softmax(torch.tensor(logits + np.array([-0.3, 0.2, 0.1])), -1)   # the sampler
exact = (pi * (pi / pi_ref).log()).sum()
print(f"exact KL(pi || pi_ref) = {exact:.4f}")
print("estimator   tokens from pi   tokens from pi_old   from pi_old, weighted by pi / pi_old")
for name in ("k1", "k2", "k3"):
    k = kl_estimate(pi.log(), pi_ref.log(), name)          # the estimate at each of the 3 tokens
    print(f"{name:<11} {(pi * k).sum():>14.4f}   {(pi_old * k).sum():>18.4f}   "
          f"{(pi_old * (pi / pi_old) * k).sum():>36.4f}")

# %% [markdown]
# On the policy's own tokens, k1 and k3 give the exact 0.0792. On the sampler's tokens they
# give -0.0080 and 0.0803, and only the ratio-weighted means recover the KL.
#
# A second caveat concerns the loss rather than the estimate. The loss differentiates k3 at
# the sampled tokens. The mean of that gradient is not the gradient of
# $\mathrm{KL}(\pi\,\|\,\pi_\text{ref})$, but that of the reverse KL,
# $\mathrm{KL}(\pi_\text{ref}\,\|\,\pi)$. Chapter 1, step 5, computes both.

# %% [markdown]
# ## 4. Length bias: what one token is worth
#
# The loss types differ only in how they average the per-token losses.
#
# - `grpo` takes each response's token mean, then the mean over responses. So a token of a
#   long response weighs less than a token of a short one.
# - `dr_grpo` divides every token by the same constant, G times `max_completion_length`.
# - `dapo` and `bnpo` (batch-normalized policy optimization) divide by the number of tokens
#   in the batch.
#
# The explorer plots the weight of one token against response length, read from
# `grpo_edu.algorithm.aggregation.aggregation_weights`. Chapter 4 measures what this does to
# training.

# %%
length_bias = LengthBiasExplorer()
length_bias

# %%
print(length_bias.report())

# %% [markdown]
# Under `grpo` every response weighs the same in total, so each of a long response's tokens
# gets a small share. For a wrong answer ($A < 0$), that means a smaller penalty per token
# the longer it rambles. Dr. GRPO's paper traces the growing length of wrong answers to
# exactly this. Both other aggregations give every token the same weight. The cell below
# checks that the explorer's weights are the loss's own gradient, by autograd through
# `grpo_loss`:

# %%
lengths = length_bias.state.lengths
mask = torch.arange(lengths.max())[None, :] < torch.from_numpy(lengths)[:, None]
for loss_type in ("grpo", "dr_grpo", "dapo"):
    logp = torch.full(mask.shape, -1.0, dtype=torch.float64, requires_grad=True)
    loss = grpo_loss(logp, logp.detach(), torch.ones(len(lengths), dtype=torch.float64), mask,
                     loss_type=loss_type, max_completion_length=512).loss
    (gradient,) = torch.autograd.grad(loss, logp)
    shown = response_token_weights(lengths, loss_type, max_completion_length=512)
    print(f"{loss_type:<8} -d loss / d logp at each response's first token: "
          f"{np.array2string(-gradient[:, 0].numpy(), precision=4)}   explorer: "
          f"{np.array2string(shown, precision=4)}")

# %% [markdown]
# ## What you learned
#
# - Group scaling turns a nearly solved prompt's small reward differences into advantages as large as any other prompt's; batch scaling or none keeps that prompt quiet.
# - A group whose rewards are all equal has zero advantages and teaches nothing; shifting every reward changes nothing.
# - The clip is one-sided: it stops a token only past the bound its advantage pushes towards. Clip-higher raises only the upper bound.
# - On the policy's own tokens k1 and k3 are unbiased and k3 is never negative; on a sampler's tokens every estimator misses the KL unless each token is weighted by $\pi/\pi_{\theta_\text{old}}$.
# - Under `grpo` every response counts the same in total, so a long response's tokens count less; `dr_grpo`, `dapo` and `bnpo` give every token the same weight.
#
# ## Check yourself
#
# Where an answer is a number, check yours before you open it:
# `quiz.check(2, 1, group=..., none=..., batch=...)` (`from grpo_edu.exercises import quiz`;
# `quiz.ask(2)` lists what each question takes).
#
# 1. Prompt 2's rewards are [1.0, 0.9, 1.0, 0.9]. What are its advantages under group
#    scaling, and under no scaling?
#
#    <details><summary>Answer</summary>
#
#    Under group scaling, +1, -1, +1, -1: its own std is 0.0500, so a difference of a few
#    hundredths becomes an advantage of 1. Without scaling they stay +0.05 and -0.05.
#    Batch scaling divides by 0.3708 and gives 0.1348 and -0.1348.
#
#    </details>
#
# 2. With $A = +1$ and $\varepsilon$ = 0.2, how many of chapter 1's nine tokens get no
#    gradient? And with $A = -1$?
#
#    <details><summary>Answer</summary>
#
#    Five with $A = +1$: every token whose ratio is above 1.2. None with $A = -1$, because
#    no ratio is below 0.8 (the smallest is 0.8608).
#
#    </details>
#
# 3. A token with $A = +1$ has ratio 1.25. Does it get a gradient under the symmetric clip
#    ($\varepsilon_\text{high}$ = 0.2)? Under clip-higher ($\varepsilon_\text{high}$ = 0.28)?
#
#    <details><summary>Answer</summary>
#
#    Not under the symmetric clip: 1.25 is past 1.2, so its slope is 0. Under clip-higher it
#    is still inside the range, so its slope is 1.
#
#    </details>
#
# 4. Why can $k_1$ as a single-sample penalty reward the policy for drifting away from the
#    reference?
#
#    <details><summary>Answer</summary>
#
#    $k_1 = -d$ is negative on every token that $\pi_\text{ref}$ likes more than $\pi$
#    does (tokens x1 and x2 in the explorer's default). A negative penalty on such a token
#    rewards it.
#
#    </details>
#
# 5. Under `grpo`, a group holds responses of 20 and 400 tokens. How much more does one
#    token of the short response count? And under `dr_grpo`?
#
#    <details><summary>Answer</summary>
#
#    20.00 times as much under `grpo`: each response counts the same in total, so each
#    token counts one over its own length. Under `dr_grpo` every token counts the same,
#    1 / (G x 512).
#
#    </details>
#
# ## Exercises
#
# Each checker in `grpo_edu.exercises.ch02` runs your function on several cases, and
# computes the right values with the functions the explorers use. It names each case that
# fails and how your answer is wrong there: its shape, its sign, too large or too small, off
# by a factor, NaN. It never gives the right value. Each exercise has a hint and a worked
# solution, folded: open them when you want them.
#
# **2.1 Three ways to scale.** Write `my_advantages(rewards, scale)` for a batch of B
# prompts of G rewards each, with the population std and `eps = 1e-8`. `scale="group"`
# divides by each prompt's std. `"batch"` divides by one std over all B x G rewards (the
# mean stays per prompt). `"none"` does not divide at all. The attempt below gets one of the
# three wrong.
#
# <details><summary>Hint</summary>
#
# "batch" keeps each prompt's own mean but divides by a single number for the whole batch:
# the std of all B x G rewards, not a std per row.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# def my_advantages(rewards, scale):
#     centred = rewards - rewards.mean(axis=1, keepdims=True)
#     if scale == "none":
#         return centred
#     std = rewards.std(axis=1, keepdims=True) if scale == "group" else rewards.std()
#     return centred / (std + 1e-8)
#
#
# ch02.check_batch_advantages(my_advantages)
# ```
#
# </details>

# %%
from grpo_edu.exercises import ch02


def my_advantages(rewards, scale):
    centred = rewards - rewards.mean(axis=1, keepdims=True)
    if scale == "none":
        return centred
    std = rewards.std(axis=1, keepdims=True)  # fix me: one of the scales wants another std
    return centred / (std + 1e-8)


ch02.check_batch_advantages(my_advantages)

# %% [markdown]
# **2.2 Where the gradient stops.** Write
# `my_clip_gradient(ratio, advantage, eps_low, eps_high)` returning
# $\partial\,\text{objective}/\partial\rho$ per token. The attempt below zeroes the
# gradient everywhere outside the clip range, whatever the sign of $A$. Use the clipping
# explorer to see which half of that is wrong.
#
# <details><summary>Hint</summary>
#
# Outside the range, the clip takes the gradient away only on the side the advantage pushes
# towards: above $1 + \varepsilon_\text{high}$ when $A > 0$, below $1 - \varepsilon_\text{low}$
# when $A < 0$. On the other side the unclipped term is the minimum, and its slope is $A$.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# import numpy as np
#
#
# def my_clip_gradient(ratio, advantage, eps_low, eps_high):
#     capped = ((advantage > 0) & (ratio > 1 + eps_high)) | ((advantage < 0) & (ratio < 1 - eps_low))
#     return np.where(capped, 0.0, advantage * np.ones_like(ratio))
#
#
# ch02.check_clip_gradient(my_clip_gradient)
# ```
#
# </details>

# %%
def my_clip_gradient(ratio, advantage, eps_low, eps_high):
    inside = (ratio >= 1 - eps_low) & (ratio <= 1 + eps_high)
    return np.where(inside, advantage, 0.0)


ch02.check_clip_gradient(my_clip_gradient)

# %% [markdown]
# **2.3 The estimators' exact means.** Write `my_expected_estimates(logits, ref_logits)`
# returning $[\mathbb{E}_\pi k_1, \mathbb{E}_\pi k_2, \mathbb{E}_\pi k_3]$ exactly, as a sum
# over the vocabulary weighted by $\pi$ (no sampling). Which two equal the exact KL in every
# case, and why can the third not?
#
# <details><summary>Hint</summary>
#
# With $d = \log\pi_\text{ref}(x) - \log\pi(x)$: $k_1 = -d$, $k_2 = d^2 / 2$,
# $k_3 = e^{d} - d - 1$. Compute both log-softmaxes stably (subtract the maximum), then
# $\mathbb{E}_\pi f = \sum_x \pi(x) f(x)$.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# import numpy as np
#
#
# def my_expected_estimates(logits, ref_logits):
#     log_pi = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
#     log_ref = ref_logits - ref_logits.max() - np.log(np.exp(ref_logits - ref_logits.max()).sum())
#     pi, d = np.exp(log_pi), log_ref - log_pi
#     return [pi @ -d, pi @ (d ** 2 / 2), pi @ (np.exp(d) - d - 1)]
#
#
# ch02.check_expected_estimates(my_expected_estimates)
# ```
#
# k1 and k3 have the exact KL as their mean: $\mathbb{E}_\pi[-d]$ is the KL's definition,
# and k3 adds $e^{d} - 1$, whose mean $\sum_x \pi_\text{ref}(x) - 1$ is 0. k2's mean is half
# the second moment of the log-ratio, which matches the KL only to second order, as the two
# distributions approach each other; the checker's cases with distant distributions show
# the gap.
#
# </details>

# %%
def my_expected_estimates(logits, ref_logits):
    raise NotImplementedError("sum over the vocabulary, weighted by pi")


ch02.check_expected_estimates(my_expected_estimates)

# %% [markdown]
# **2.4 What a response is worth.** Write
# `my_response_weights(lengths, loss_type, max_completion_length)`. It returns how much each
# response counts in the loss in total: its length times the weight of one of its tokens,
# the right-hand plot of the length-bias explorer. Cover `"grpo"`, `"dr_grpo"` and `"dapo"`,
# with `num_items` the group's token count.
#
# <details><summary>Hint</summary>
#
# A token's weight is one over the loss's denominator for it: `grpo` divides by G and by
# the response's own length, `dr_grpo` by G and by `max_completion_length`, `dapo` by the
# group's token count. Multiply by the response's length.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# import numpy as np
#
#
# def my_response_weights(lengths, loss_type, max_completion_length):
#     lengths = np.asarray(lengths, dtype=np.float64)
#     G = len(lengths)
#     if loss_type == "grpo":
#         return np.full(G, 1 / G)                          # every response the same, whatever its length
#     if loss_type == "dr_grpo":
#         return lengths / (G * max_completion_length)      # proportional to length
#     return lengths / lengths.sum()                        # dapo: proportional to length, summing to 1
#
#
# ch02.check_response_weights(my_response_weights)
# ```
#
# </details>

# %%
def my_response_weights(lengths, loss_type, max_completion_length):
    return np.full(len(lengths), 1 / len(lengths))  # grpo's, whatever loss_type says: fix me


ch02.check_response_weights(my_response_weights)
