# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 0. From REINFORCE to GRPO
#
# > **You will learn**
# > - what GRPO (Group Relative Policy Optimization) adds to REINFORCE, the policy gradient of 1992
# > - why a baseline cuts the gradient's noise without biasing it, computed exactly
# > - how RLOO (REINFORCE Leave-One-Out), the group mean and the group's std differ in bias and noise
# > - how PPO (Proximal Policy Optimization) reuses samples with a ratio and a clip
# > - what six advantage estimators do to a real tiny model, three seeds each
# >
# > **You need first**: nothing beyond Python and NumPy.
# >
# > **Reading time**: about 18 minutes. **Compute**: at most 60 s on a 2-core CPU. [Glossary](../docs/glossary.md) · [Notation](../docs/notation.md)
#
# GRPO did not come from nowhere. It is REINFORCE with three ideas added, and each one fixes
# a measurable problem:
#
# - a *baseline* cuts the estimator's variance without biasing it;
# - PPO's *ratio and clip* let one batch of samples feed several updates safely;
# - a *group* of samples per prompt gives a mean that replaces PPO's learned critic.
#
# This chapter builds each idea on a policy small enough that every expectation is a finite
# sum. So each claim is a number computed exactly, not an inequality to trust. Then it
# trains the real tiny model with six advantage estimators, three seeds each.
#
# $\pi$ is the policy, $r$ a reward, $G$ the number of samples per prompt, $A$ an
# advantage, and $\rho$ the ratio $\pi / \pi_\text{old}$.
# In code, `rewards` and `advantages` are (B, G) tensors: B prompts by G completions.

# %%
# The ladder this chapter climbs, one change at a time.
from grpo_edu.book import schematics
from grpo_edu.book.claims import Claims

schematics.grpo_ladder()

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from grpo_edu.algorithm import baselines
from grpo_edu.algorithm.bandit import Bandit, moments, sampled_moments
from grpo_edu.algorithm.estimators import clipped_objective
from grpo_edu.training.evaluation import wilson_interval
from grpo_edu.book import home

home.enter()   # the book's folder: its files are read and its runs written from there

np.set_printoptions(precision=4, suppress=True, floatmode="fixed")

# %% [markdown]
# ## A policy small enough to enumerate
#
# One prompt, one token to choose out of K = 4, and a softmax policy over four logits
# $\theta$. Each token has a fixed reward. Token 0 is the right answer (reward 1), token 3 is
# half right (0.5), and tokens 1 and 2 are wrong. The policy prefers a wrong token. Its
# objective is the expected reward, and its gradient has a closed form:
#
# $$
# J(\theta) = \sum_k \pi_k r_k, \qquad
# \frac{\partial J}{\partial \theta_k} = \pi_k \,(r_k - J).
# $$

# %%
bandit = Bandit(logits=[0.0, 0.5, 1.0, -0.5], rewards=[1.0, 0.0, 0.0, 0.5])
gradient = bandit.gradient()
print(f"pi      = {bandit.probs}")
print(f"r       = {bandit.rewards}")
print(f"J       = {bandit.value:.4f}")
print(f"grad J  = {gradient}")

# %% [markdown]
# The gradient raises the right token's logit and lowers the two wrong ones. It raises the
# half-right token a little, because its reward is above the average J. A language model's
# gradient has the same form, over a vocabulary and a sequence of choices. But nobody can
# sum over every completion, so the gradient must be *estimated* from samples.
#
# ## REINFORCE: the gradient from samples
#
# Since $\nabla \pi = \pi \nabla \log \pi$, the gradient is an expectation under the policy,
# and samples can estimate it:
#
# $$
# \nabla J = \mathbb{E}_{a \sim \pi}\big[r(a)\, \nabla \log \pi(a)\big], \qquad
# \hat g = \frac{1}{G} \sum_{i=1}^{G} r(a_i)\, \nabla \log \pi(a_i), \qquad
# \nabla_\theta \log \pi(a) = \mathrm{onehot}(a) - \pi .
# $$
#
# $\hat g$ is REINFORCE's estimator (Williams, 1992). With K = 4 and G = 4 there are
# $4^4$ = 256 possible groups, each with its probability. So $\hat g$'s mean and variance
# are finite sums, which `grpo_edu.algorithm.bandit.moments` computes. Beside them, the cell
# prints a sampler's estimate from 100,000 sampled groups.

# %%
exact = moments(bandit, 4)
sampled = sampled_moments(bandit, 4)
print(f"E[g_hat], exact over {exact.groups} groups: {exact.mean}")
print(f"E[g_hat], from {sampled.groups:,} samples:   {sampled.mean}")
print(f"grad J:                              {gradient}")
print(f"variance E||g_hat - grad J||^2: exact {exact.variance:.5f}, sampled {sampled.variance:.5f}")
print(f"signal ||grad J||^2: {gradient @ gradient:.5f}")

# %% [markdown]
# The estimator is unbiased: its mean is the gradient, and 100,000 sampled groups agree with
# the exact sum to two or three digits. But the noise is as large as the signal. The
# variance is 1.3 times the squared length of the gradient, so one group's estimate can
# point well away from $\nabla J$.
#
# The variance also depends on something it should not: where zero is on the reward scale.
# Add a constant c to every reward, so that a reward of 1 for "right" and 0 for "wrong"
# becomes 11 and 10. Neither the best policy nor the gradient changes, but REINFORCE's
# variance grows with $c^2$:

# %%
print(f"{'shift c':>8} {'E[g_hat] = grad J':>19} {'variance':>10} {'variance / ||grad J||^2':>25}")
for c in (0.0, 1.0, 10.0):
    shifted = Bandit(bandit.logits, bandit.rewards + c)
    m = moments(shifted, 4)
    print(f"{c:>8.1f} {str(np.allclose(m.mean, gradient, atol=1e-12)):>19} {m.variance:>10.4f} "
          f"{m.variance / (gradient @ gradient):>25.1f}")

# %% [markdown]
# ## A baseline
#
# Subtract from each reward a number b that does not depend on the sampled token. The mean
# does not move, because the score has mean zero under the policy:
#
# $$
# \mathbb{E}_{a \sim \pi}\big[b\, \nabla \log \pi(a)\big] = b \sum_a \pi(a) \nabla \log \pi(a)
# = b\, \nabla \sum_a \pi(a) = b\, \nabla 1 = 0 .
# $$
#
# The best constant is close to the average reward J. The advantage $A = r - b$ then says
# how much better than usual a sample was, and the shift c above cancels. But J is unknown:
# it is what we are estimating. The estimators below differ in where their b comes from.
# Each is a function from rewards (B, G) to advantages (B, G) in
# `grpo_edu.algorithm.baselines`, with the signature the trainer's `advantage_fn` takes:
#
# | name | advantage $A_i$ | the baseline |
# |---|---|---|
# | `reinforce` | $r_i$ | none |
# | `batch_mean` | $r_i - \bar r_\text{batch}$ | the mean of all B x G rewards |
# | `rloo` | $r_i - \frac{1}{G-1}\sum_{j \ne i} r_j$ | the other G - 1 samples of the group |
# | `group_mean` | $r_i - \bar r$ | the group's mean, $r_i$ included |
# | `grpo` | $(r_i - \bar r) / \sigma$ | the group's mean, over its population std |
# | `grpo_sample_std` | $(r_i - \bar r) / s$ | the same, over the sample std (as TRL) |
#
# `group_mean` is the advantage of Dr. GRPO (Liu et al., 2025,
# [`arXiv 2503.20783`](https://arxiv.org/abs/2503.20783)), a variant of
# GRPO that drops the division by the std.
#
# RLOO's baseline (Kool et al., 2019) leaves the sample's own reward out. So it is
# independent of $a_i$, and the gradient stays unbiased. The group mean includes $r_i$:
# $r_i - \bar r = \frac{G-1}{G}\,(r_i - \frac{1}{G-1}\sum_{j \ne i} r_j)$. That is RLOO
# scaled by $(G-1)/G$, so its mean is $\frac{G-1}{G}\nabla J$: biased in length only, not in
# direction. GRPO then divides by the group's std, a number that depends on every sample of
# the group. So nothing guarantees even the direction. The cell below computes all of this
# on the bandit for G = 2, 4 and 8 (up to $4^8$ = 65,536 groups). It leaves out
# `batch_mean`, which is the group mean when there is one prompt.

# %%
print(f"{'G':>2} {'estimator':<16} {'share of grad J, per logit':<36} {'cosine':>8} {'noise / signal':>15}")
for G in (2, 4, 8):
    for name, (function, _) in baselines.ESTIMATORS.items():
        if name == "batch_mean":
            continue
        m = moments(bandit, G, None if name == "reinforce" else function)
        cosine = m.mean @ gradient / np.linalg.norm(m.mean) / np.linalg.norm(gradient)
        # noise against signal: the variance over the squared length of the mean, blind to a constant scale
        print(f"{G:>2} {name:<16} {np.array2string(m.mean / gradient, precision=4):<36} {cosine:>8.6f} "
              f"{m.variance / (m.mean @ m.mean):>15.3f}")
shifted = Bandit(bandit.logits, bandit.rewards + 10.0)
unmoved = [name for name, (function, _) in baselines.ESTIMATORS.items() if name not in ("reinforce", "batch_mean")
           and np.allclose(moments(shifted, 4, function).mean, moments(bandit, 4, function).mean, atol=1e-12)
           and np.isclose(moments(shifted, 4, function).variance, moments(bandit, 4, function).variance)]
print(f"\nevery reward + 10, G = 4: mean and variance unchanged for {', '.join(unmoved)}")

# %% [markdown]
# Read the table column by column.
#
# - *Bias.* `reinforce` and `rloo` give exactly $\nabla J$: a share of 1 on every logit. The
#   group mean gives exactly $(G-1)/G$ of it (0.5, 0.75, 0.875), in the same direction
#   (cosine 1). GRPO's std gives a different share on each logit, so its direction is a few
#   degrees off (cosine below 1). The population and the sample std give the same direction,
#   since they differ by the constant $\sqrt{G/(G-1)}$.
# - *Noise.* The last column divides the variance by the squared length of the mean. So a
#   constant scale, such as the group mean's $(G-1)/G$ or the std's division, does not count.
#   At G = 2 no baseline is the least noisy. The rewards as given put 0 close to
#   J = 0.2182, so "no baseline" is already a fair one, while RLOO's baseline is a single
#   other sample. From G = 4 on, the group's baselines are less noisy than none. The std's
#   division moves this noise figure a little either way: above RLOO's at G = 4, below it at G = 8.
# - *Shift.* Shift the rewards as above and only `reinforce`'s numbers change. Every
#   baseline from the group cancels the shift.
#
# An optimiser that normalises the step's scale ignores a constant factor on the gradient.
# Adam does, and every run in this book uses it, so there the group mean's bias costs
# nothing. The std's reweighting is not a constant. It gives more weight to prompts whose
# groups agree (a small std). Dr. GRPO argues that this is a bias towards too-easy and
# too-hard prompts. The measured comparison at the end of the chapter asks whether any of
# this shows in a real run.
#
# ## PPO: reusing samples, and the clip
#
# A rollout is expensive; an update is cheap. So PPO (Schulman et al., 2017) takes several
# gradient steps on one batch sampled by $\pi_\text{old}$. The gradient at $\theta$ is then
# an expectation under the *old* policy, reweighted by the ratio
# $\rho = \pi_\theta(a) / \pi_\text{old}(a)$:
#
# $$
# \nabla J(\theta) = \mathbb{E}_{a \sim \pi_\text{old}}\big[\rho\, A\, \nabla \log \pi_\theta(a)\big]
# = \nabla_\theta\, \mathbb{E}_{a \sim \pi_\text{old}}\big[\rho\, A\big] .
# $$
#
# Maximising $\rho A$ without limit would chase the few samples whose ratio has grown. So
# PPO takes the pessimistic minimum of it and of a clipped copy:
# $\min(\rho A,\ \operatorname{clip}(\rho, 1-\varepsilon, 1+\varepsilon) A)$. The cell
# below draws it and its slope in $\rho$. `grpo_edu.algorithm.estimators.clipped_objective`
# computes both from the trainer's own loss (chapter 2 has the interactive version):

# %%
ratios = np.linspace(0.5, 1.5, 201)
figure, axes = plt.subplots(1, 2, figsize=(10, 3.4))
for A, colour in ((1.0, "tab:green"), (-1.0, "tab:red")):
    clip = clipped_objective(ratios, A, epsilon=0.2)
    _ = axes[0].plot(ratios, clip.objective, color=colour, label=f"A = {A:+.0f}")
    _ = axes[1].plot(ratios, clip.gradient, color=colour, label=f"A = {A:+.0f}")
for axis, title in zip(axes, ("objective min(rho A, clip(rho) A)", "its slope in rho")):
    axis.axvspan(0.8, 1.2, color="0.92")
    axis.set_title(title)
    axis.set_xlabel("rho = pi / pi_old")
    axis.legend()
figure.tight_layout()
for rho in (0.7, 0.9, 1.1, 1.3):
    up, down = clipped_objective([rho], 1.0), clipped_objective([rho], -1.0)
    print(f"rho = {rho}: slope {up.gradient[0]:+.0f} with A = +1, {down.gradient[0]:+.0f} with A = -1")

# %% [markdown]
# The slope is $A$ inside the range (the shaded band). It is 0 where the sample has already
# moved as far as the clip allows in its advantage's direction: above $1+\varepsilon$ for a
# good sample, below $1-\varepsilon$ for a bad one. Where the sample moved the wrong way,
# the slope stays. The clip bounds gains, never corrections.
#
# ## GRPO: the group replaces the critic
#
# PPO for language models gets $A$ from a learned value network, the critic. It is a second
# model as large as the policy, trained beside it, and its estimate of the expected reward
# is the baseline. GRPO (Shao et al., 2024) drops it. It samples G completions of each
# prompt and takes their mean (and std) as the baseline. The group costs G samples per
# prompt, which a rollout wanted anyway. Every token of completion $i$ shares its $A_i$, and the clipped objective above
# applies per token.
#
# The figure sets the two side by side. PPO as InstructGPT ran it (Ouyang et al., 2022)
# keeps four networks; GRPO keeps the policy and, optionally, the reference. This book, like
# DeepSeek-R1, scores completions with a rule instead of a reward model.

# %%
# PPO's networks against GRPO's: what each runs beside the policy.
schematics.ppo_vs_grpo()

# %% [markdown]
# This is only GRPO's policy-gradient part. Chapter 1 computes one whole update by hand and
# adds the two pieces this chapter leaves out. One is a penalty on the Kullback-Leibler (KL)
# divergence, which holds the policy near a frozen reference model. The other is the
# $1/|o_i|$ weight, which averages each completion's token terms over its own length
# $|o_i|$.
#
# ## Measured: six estimators, one task, three seeds
#
# The book's starting policy is a tiny one, a 2-layer Llama
# (chapter 5 builds it, chapter 6 trains it with GRPO). It has learned the format of
# two-digit addition and subtraction, `<think>...</think>\boxed{answer}`, but gets most
# answers wrong. Each estimator becomes the real trainer's `advantage_fn`, with everything
# else the default config. The measure is **held-out greedy accuracy**: the share of 256
# problems never trained on whose greedy (most likely) completion boxes the right answer.
# It is evaluated every 20 steps of 300, for seeds 0, 1 and 2. The cell below reads the
# eighteen runs from a results file.
#
# <details><summary>How we know</summary>
#
# `benchmarks/estimators.py` trains the eighteen runs and writes
# `benchmarks/results/estimators.json`, which the cell reads. `tests/test_baselines.py`
# re-trains one of them and checks that its numbers are the file's, exactly.
#
# </details>
#
# An accuracy measured on 256 problems is itself uncertain. The cell ends with its 95%
# confidence interval: Wilson's interval for a proportion
# (`grpo_edu.training.evaluation.wilson_interval`). It is the range of true accuracies that 256 problems cannot tell apart from the
# measured one.

# %%
RESULTS = json.loads(home.path("benchmarks/results/estimators.json").read_text())
TARGET = 0.8
runs = RESULTS["runs"]


def steps_to(curve, target=TARGET):
    """The first evaluation step with held-out accuracy >= target, or None."""
    return next((step for step, accuracy in curve if accuracy >= target), None)


print(f"{RESULTS['steps']} steps, seeds {RESULTS['seeds']}; held-out greedy accuracy (256 problems), "
      f"start {runs[0]['start_accuracy']:.3f}\n")
print(f"{'estimator':<30} {'final accuracy, per seed':<26} {'mean':>6}  {'steps to ' + str(TARGET):<20}")
table = {}
for name, (_, label) in baselines.ESTIMATORS.items():
    mine = [r for r in runs if r["estimator"] == name]
    finals = [r["final_accuracy"] for r in mine]
    reached = [steps_to(r["eval"]) for r in mine]
    table[name] = (finals, reached)
    shown = " ".join("-" if s is None else str(s) for s in reached)
    print(f"{label:<30} {' '.join(f'{a:.3f}' for a in finals):<26} {np.mean(finals):>6.3f}  {shown:<20}")
low, high = wilson_interval(round(0.85 * 256), 256)
print(f"\none final accuracy near 0.85 on 256 problems has a 95% interval of [{low:.3f}, {high:.3f}], "
      f"+-{(high - low) / 2:.3f}")

# %%
figure, axis = plt.subplots(figsize=(8, 4.2))
for name, (_, label) in baselines.ESTIMATORS.items():
    mine = [r for r in runs if r["estimator"] == name]     # each curve from step 0, the starting policy
    curves = np.array([[r["start_accuracy"]] + [accuracy for _, accuracy in r["eval"]] for r in mine])
    steps = [0] + [step for step, _ in runs[0]["eval"]]
    line, = axis.plot(steps, curves.mean(axis=0), label=label)
    axis.fill_between(steps, curves.min(axis=0), curves.max(axis=0), color=line.get_color(), alpha=0.15)
axis.axhline(TARGET, color="0.6", linestyle=":")
axis.set_xlabel("training step")
axis.set_ylabel("held-out greedy accuracy")
axis.set_title("mean of 3 seeds; the band spans the seeds")
axis.legend(fontsize=8)
figure.tight_layout()

# %% [markdown]
# Seed $s$ of one estimator and seed $s$ of another share their prompts and their start, so
# the fair comparison is paired: the difference seed by seed, its mean, and a 95% interval
# for that mean (Student's t over the 3 seeds, `grpo_edu.algorithm.statistics.paired_seeds`).
# "A beats B" is said only where that interval excludes zero.

# %%
from grpo_edu.algorithm.statistics import by_seed as finals_by_seed, paired_seeds

by_seed = {name: finals_by_seed(runs, estimator=name) for name in baselines.ESTIMATORS}
baselined = [name for name in baselines.ESTIMATORS if name != "reinforce"]
print("final accuracy, paired over seeds: mean difference [95% t interval]")
verdicts = {}
for a, b in [(name, "reinforce") for name in baselined] + [(name, "grpo") for name in baselined if name != "grpo"]:
    verdicts[a, b] = paired_seeds(by_seed[a], by_seed[b])
    print(f"  {verdicts[a, b].words(a, b)}")

# %% [markdown]
# The baseline itself is the one difference that stands out. Without one, REINFORCE ends
# between 0.668 and 0.684 and reaches 0.8 on no seed. It even dips below its start
# (0.418) at first. The unbaselined estimate pushes up every sampled answer, the wrong ones
# less, and early on that noise outweighs the signal. Every run with a baseline ends
# between 0.793 and 0.879, and each of those five estimators passes 0.8 on at least two of
# three seeds, between steps 180 and 240. Paired by seed, each of the five beats REINFORCE,
# by +0.148 (the group mean) to +0.174 (GRPO). Every one of those intervals excludes zero: the
# lowest bound of the five is RLOO's, +0.061.
#
# The five estimators with a baseline are not separated at this size. Against GRPO with the
# population std, the paired differences run from -0.026 to +0.000, and every interval holds
# zero. So on this task, with AdamW, these runs cannot tell apart the group
# mean's $(G-1)/G$, the std's reweighting, or one baseline for the whole batch. The
# arithmetic prompts are of a similar difficulty, which may be why. A task whose prompts
# differ in difficulty is where the group's baseline is meant to matter. That is the case
# GRPO was made for, and the one Dr. GRPO's argument about the std is about.
#
# What this chapter claims, checked:

# %%
finals = {name: table[name][0] for name in baselines.ESTIMATORS}
reached = {name: table[name][1] for name in baselines.ESTIMATORS}
baselined = [name for name in baselines.ESTIMATORS if name != "reinforce"]
means = [np.mean(finals[name]) for name in baselined]
claims = {
    "REINFORCE and RLOO are unbiased, the group mean is exactly (G-1)/G of the gradient (G = 2, 3, 5)": all(
        np.allclose(moments(bandit, G).mean, gradient, atol=1e-12)
        and np.allclose(moments(bandit, G, baselines.rloo).mean, gradient, atol=1e-12)
        and np.allclose(moments(bandit, G, baselines.group_mean).mean, (G - 1) / G * gradient, atol=1e-12)
        for G in (2, 3, 5)),
    "every baseline from the group is blind to a shift of the rewards": len(unmoved) == 4,
    "without a baseline every seed ends below every seed of every estimator with one":
        max(finals["reinforce"]) < min(min(finals[name]) for name in baselined),
    "REINFORCE is below its start at step 100 on every seed": all(
        dict(map(tuple, r["eval"]))[100] < r["start_accuracy"] for r in runs if r["estimator"] == "reinforce"),
    "REINFORCE reaches 0.8 on no seed; every other estimator on at least 2 of 3":
        all(step is None for step in reached["reinforce"])
        and all(sum(step is not None for step in reached[name]) >= 2 for name in baselined),
    "the five baselined estimators' means lie within one accuracy's 95% half-interval of each other":
        max(means) - min(means) < (high - low) / 2,
    "paired by seed, every baselined estimator beats REINFORCE":
        all(verdicts[name, "reinforce"].low > 0 for name in baselined),
    "paired by seed, no baselined estimator is separated from GRPO":
        not any(verdicts[name, "grpo"].separated for name in baselined if name != "grpo"),
}
Claims(claims)

# %% [markdown]
# ## What you learned
#
# - REINFORCE's estimate is unbiased, but its variance grows with a constant shift of the rewards.
# - A baseline that does not depend on the sample keeps the mean and cuts the noise.
# - RLOO's baseline keeps the gradient exact; the group mean scales it by $(G-1)/G$; GRPO's std also tilts its direction a little.
# - PPO's ratio lets one batch feed several updates, and its clip bounds gains, never corrections.
# - GRPO takes the group's mean and std as the baseline, in place of a learned critic.
# - On the tiny model, runs without a baseline end at 0.668 to 0.684, below every run with one (0.793 to 0.879); the five baselines are not separated at this size.
#
# ## Check yourself
#
# Where an answer is a number, check yours before you open it:
# `quiz.check(0, 1, variance=...)` (`from grpo_edu.exercises import quiz`;
# `quiz.ask(0)` lists what each question takes).
#
# 1. On the chapter's bandit with G = 4, REINFORCE's variance is 0.0405. Add 10 to every
#    reward. What happens to the estimate's mean, and to its variance?
#
#    <details><summary>Answer</summary>
#
#    The mean stays the gradient: the shift changes neither the best policy nor $\nabla J$.
#    The variance grows to 18.1107, 576.2 times the squared length of the gradient. Every
#    baseline from the group cancels the shift.
#
#    </details>
#
# 2. Why does subtracting a baseline b, chosen without looking at the sampled token, leave
#    the gradient's mean unchanged?
#
#    <details><summary>Answer</summary>
#
#    The score $\nabla \log \pi(a)$ has mean zero under the policy:
#    $\sum_a \pi(a) \nabla \log \pi(a) = \nabla \sum_a \pi(a) = \nabla 1 = 0$. So
#    $b\, \nabla \log \pi(a)$ adds nothing on average.
#
#    </details>
#
# 3. At G = 4, what share of $\nabla J$ does the group-mean estimator give on average, and
#    in which direction?
#
#    <details><summary>Answer</summary>
#
#    0.75 of it on every logit, that is $(G-1)/G$, in exactly the same direction (cosine 1).
#    The group mean is RLOO scaled by $(G-1)/G$.
#
#    </details>
#
# 4. A sample has $A = -1$ and ratio $\rho = 0.7$, with $\varepsilon = 0.2$. What is the
#    clipped objective's slope in $\rho$, and why?
#
#    <details><summary>Answer</summary>
#
#    The slope is 0. The sample has already moved below $1 - \varepsilon$ in the direction its negative
#    advantage wants, so the clipped branch wins and gives no gradient. With $A = +1$ at
#    the same ratio, the slope would stay 1: the clip never stops a correction.
#
#    </details>
#
# 5. What does GRPO use instead of PPO's critic, and what does it cost?
#
#    <details><summary>Answer</summary>
#
#    The mean (and std) of the rewards of G completions of the same prompt. It costs G
#    samples per prompt, which a rollout wanted anyway, instead of a second model as large as
#    the policy.
#
#    </details>
#
# ## Exercises
#
# Each checker in `grpo_edu.exercises.ch00` runs your answer on several cases. It names each
# case that fails and how your answer is wrong there: its shape, its sign, too large or too
# small, off by a factor, NaN. It never gives the right value. Each exercise has a hint and
# a worked solution, folded: open them when you want them.
#
# **0.1 RLOO.** Write `my_rloo(rewards)`: for (B, G) rewards, each completion's reward minus
# the mean of the *other* G - 1 rewards of its group.
#
# <details><summary>Hint</summary>
#
# The sum of the others is the group's sum minus the completion's own reward; no loop is
# needed (`rewards.sum(dim=1, keepdim=True)` keeps the shape for broadcasting).
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# def my_rloo(rewards):
#     G = rewards.shape[1]
#     others = (rewards.sum(dim=1, keepdim=True) - rewards) / (G - 1)
#     return rewards - others
#
#
# ch00.check_rloo(my_rloo)
# ```
#
# </details>

# %%
from grpo_edu.exercises import ch00


def my_rloo(rewards):
    raise NotImplementedError("your leave-one-out advantages here")


ch00.check_rloo(my_rloo)

# %% [markdown]
# **0.2 The estimator's exact mean.** Write `my_exact_mean(probs, rewards, G, advantage_fn)`:
# the exact $\mathbb{E}[\hat g]$ of this chapter's estimator for a K-token policy. `probs`
# (K,) holds its probabilities and `rewards` (K,) its rewards; a group has G samples.
# `advantage_fn` maps a (N, G) float64 tensor of rewards to advantages, or is None (A = r).
# Then use it to confirm the group mean's $(G-1)/G$ for G = 6. Neither the table (G = 2, 4
# and 8) nor the claims cell (G = 2, 3 and 5) computed that case.
#
# <details><summary>Hint</summary>
#
# `itertools.product(range(K), repeat=G)` lists every group; a group's probability is the
# product of its tokens' probabilities. Stack all groups' rewards into one (K^G, G) tensor
# and call `advantage_fn` once. The score of token a is `np.eye(K)[a] - probs`.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# import itertools
#
# import numpy as np
# import torch
#
#
# def my_exact_mean(probs, rewards, G, advantage_fn):
#     K = len(probs)
#     actions = np.array(list(itertools.product(range(K), repeat=G)))     # (K^G, G)
#     probability = probs[actions].prod(axis=1)                            # (K^G,)
#     r = rewards[actions]
#     A = r if advantage_fn is None else advantage_fn(torch.from_numpy(r)).numpy()
#     g_hat = (A[..., None] * (np.eye(K)[actions] - probs)).mean(axis=1)   # (K^G, K)
#     return probability @ g_hat
#
#
# ch00.check_exact_mean(my_exact_mean)
# ```
#
# </details>

# %%
def my_exact_mean(probs, rewards, G, advantage_fn):
    raise NotImplementedError("your exact mean here")


ch00.check_exact_mean(my_exact_mean)
