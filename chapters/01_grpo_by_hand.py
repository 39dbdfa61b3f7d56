# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 1. GRPO by hand
#
# > **You will learn**
# > - how GRPO (Group Relative Policy Optimization) turns one group's rewards into advantages, under either std
# > - how the ratio, the clip and the Kullback-Leibler (KL) penalty make one update, number by number
# > - what the k3 estimator of the KL measures, and where its gradient pulls
# > - why the first update on a fresh rollout has zero loss but a non-zero gradient
# >
# > **You need first**: chapter 0 (baselines, the ratio and the clip).
# >
# > **Reading time**: about 20 minutes. **Compute**: at most 60 s on a 2-core CPU. [Glossary](../docs/glossary.md) · [Notation](../docs/notation.md)
#
# GRPO trains a language model by sampling a *group* of G responses to the same prompt. It
# scores each response with one scalar reward and pushes up the responses that beat their
# siblings. There is no value network: the baseline is the group's own mean reward.
#
# This chapter follows one GRPO update of one prompt with G = 4 responses, in plain NumPy,
# and prints every intermediate number. Each step is a few lines in a loop over the
# responses. At the end of step 6, `grpo_edu.algorithm.reference.grpo_update` repeats the
# whole update, bit for bit. The PyTorch code of later chapters is tested against it.
#
# <details><summary>How we know</summary>
#
# `tests/test_book.py::test_prose_numbers_are_computed` fails on any decimal in a chapter's
# prose that none of its cells prints.
# `tests/test_loss.py::test_matches_reference_loss_and_logit_gradient` checks that the
# PyTorch loss of later chapters, and its gradient, equal `reference.grpo_update`'s on
# random batches, in float64.
#
# </details>

# %%
import inspect

import numpy as np

from grpo_edu.algorithm import reference
from grpo_edu.book import home

home.enter()   # the book's folder: its files are read and its runs written from there

np.set_printoptions(precision=4, suppress=True, floatmode="fixed")


def row(values, width=8):
    """Format numbers with 4 decimals in fixed-width columns."""
    return " ".join(f"{v:+{width}.4f}" for v in values)


# %% [markdown]
# ## The objective
#
# For a prompt $q$ the old policy $\pi_{\theta_\text{old}}$ samples responses
# $o_1, \dots, o_G$ with rewards $r_1, \dots, r_G$. Let $\rho_{i,t}$ be the ratio of the new
# to the old probability of token $t$ of response $i$. GRPO as DeepSeekMath introduced it
# (Shao et al., 2024, eq. 3) maximises
#
# $$
# \mathcal{J}(\theta) = \frac{1}{G}\sum_{i=1}^{G} \frac{1}{|o_i|}\sum_{t=1}^{|o_i|}
# \Big[\min\big(\rho_{i,t} A_i,\ \operatorname{clip}(\rho_{i,t}, 1-\varepsilon, 1+\varepsilon) A_i\big)
# - \beta\, \widehat{\mathrm{KL}}_{i,t}\Big],
# \qquad A_i = \frac{r_i - \operatorname{mean}(r)}{\operatorname{std}(r)},
# $$
#
# and the loss is $-\mathcal{J}$. $A_i$ is one number per response, shared by all of its
# tokens. $\widehat{\mathrm{KL}}_{i,t}$ estimates the KL divergence to a frozen reference
# policy with k3, an estimator from Schulman's note "Approximating KL Divergence" (2020,
# [joschu.net/blog/kl-approx.html](https://joschu.net/blog/kl-approx.html)). Step 5 says what
# it estimates, and what it does not.
#
# This per-token form is DeepSeekMath's, and it is what grpo_edu's `loss_type="grpo"`
# computes. The DeepSeek-R1 paper (DeepSeek-AI, 2025,
# [`arXiv 2501.12948`](https://arxiv.org/abs/2501.12948)) writes the same objective per
# whole output.
#
# <details><summary>R1's per-output form</summary>
#
# In the DeepSeek-R1 paper (its eq. 1-2) the ratio is
# $\pi_\theta(o_i \mid q) / \pi_{\theta_\text{old}}(o_i \mid q)$, the probability of a whole
# output. Its KL term compares whole outputs, and its only mean is over the G outputs. A
# sequence's probability is the product of its tokens' probabilities. So R1's ratio, as
# written, is $\prod_t \rho_{i,t}$, not a mean of the $\rho_{i,t}$. (GSPO, Group Sequence
# Policy Optimization, clips a length-normalised form of it: chapter 4.)
#
# </details>
#
# This chapter uses $\varepsilon$ = 0.2, the customary clip range of PPO (Proximal Policy
# Optimization), and $\beta$ = 0.04, DeepSeekMath's KL coefficient. **A common mistake** is
# to call them DeepSeek-R1's. R1 trained with a KL coefficient of 0.001 and, in its first
# reinforcement learning (RL) stage, a clip ratio of 10 (the last section of the chapter).
#
# ## The worked example
#
# One prompt, four responses of 3, 2, 2 and 2 tokens over a vocabulary of 3 tokens.

# %%
token_ids = [[0, 2, 1], [1, 0], [2, 2], [0, 1]]
old_logp = [[-0.50, -0.61, -0.92], [-1.20, -0.41], [-0.81, -0.69], [-0.51, -1.10]]
ref_logp = [[-0.60, -0.71, -0.82], [-1.10, -0.51], [-0.91, -0.79], [-0.41, -1.00]]
new_logits = [
    np.array([[1.10, -0.20, 0.30], [-0.40, 0.80, 1.60], [0.10, 1.40, 0.20]]),
    np.array([[-0.20, 1.10, 0.40], [0.90, -0.30, 0.10]]),
    np.array([[0.10, 0.20, 1.30], [-0.10, 0.40, 1.50]]),
    np.array([[1.20, -0.40, 0.10], [-0.30, 1.50, 0.20]]),
]
rewards = np.array([0.9, 0.3, -0.1, 0.7])
epsilon, beta = 0.2, 0.04
G = len(rewards)
print(f"G = {G}, response lengths = {[len(t) for t in token_ids]}, "
      f"tokens in the group = {sum(len(t) for t in token_ids)}")

# %% [markdown]
# ## Step 1. Group mean, group std, advantages
#
# The baseline of each response is the mean reward of its group, and the spread is the
# group's standard deviation. Two standard deviations are in common use:
#
# - the *population* std divides by G: NumPy's `rewards.std()`;
# - the *sample* std divides by G - 1 (Bessel's correction): PyTorch's `rewards.std(dim=1)`,
#   and Hugging Face's TRL (Transformer Reinforcement Learning) library.
#
# **A common mistake** is to mix them without saying so: a NumPy version and a PyTorch
# version of the same method, each with its library's default, disagree by a constant factor.

# %%
# The worked example's group: each response against the group's mean (population std).
from grpo_edu.book import schematics

schematics.group_advantages(rewards)

# %%
# Drag the rewards: the advantages follow (group, batch or no std scaling). Chapter 2 gathers the explorers.
from grpo_edu.widgets import AdvantageExplorer

AdvantageExplorer()

# %%
mean = rewards.mean()
std_population = reference.group_std(rewards, "population")
std_sample = reference.group_std(rewards, "sample")
adv_population = reference.group_advantages(rewards, std="population")
adv_sample = reference.group_advantages(rewards, std="sample")

print(f"mean(r)            = {mean:.4f}")
print(f"std, population    = sqrt({((rewards - mean) ** 2).sum() / G:.4f}) = {std_population:.4f}")
print(f"std, sample        = sqrt({((rewards - mean) ** 2).sum() / (G - 1):.4f}) = {std_sample:.4f}")
print("\nresponse  reward   r - mean   A (population)   A (sample)")
for i in range(G):
    print(f"o_{i + 1}       {rewards[i]:+.2f}    {rewards[i] - mean:+.4f}        "
          f"{adv_population[i]:+.4f}        {adv_sample[i]:+.4f}")
print(f"sum of advantages: {adv_population.sum():+.4f} (population), {adv_sample.sum():+.4f} (sample)")
print(f"A (population) / A (sample) = {adv_population[0] / adv_sample[0]:.4f} "
      f"= sqrt(G / (G - 1)) = {np.sqrt(G / (G - 1)):.4f} for every response")

# %% [markdown]
# The group mean is 0.45 and the population std is 0.3841. So the best response, $o_1$, gets
# $A_1$ = +1.1717 and the worst, $o_3$, gets $A_3$ = -1.4321. The advantages sum to zero:
# whatever pushes some responses up pushes others down by the same total.
#
# With the sample std (0.4435) every advantage is smaller by the same factor, 1.1547 for
# G = 4. The clip acts on the ratio, not on $A$, and the KL term has no $A$ in it. So under
# plain gradient descent the switch is exactly a learning rate smaller by 1.1547 *and* a
# $\beta$ larger by 1.1547. Adam divides each gradient by a running estimate of its own
# size, so a constant factor cancels: only the KL term's weight changes. (The open question
# at the end of the chapter trains both.) The choice matters when you compare numbers across
# implementations: an advantage of +1.1717 here is +1.0147 in TRL. This chapter uses the
# population std.
#
# ## Step 2. Log-probabilities of the sampled tokens under the new policy
#
# The new policy's logits give a distribution over the vocabulary at every position. A
# numerically stable log-softmax subtracts the row maximum before exponentiating:

# %%
print(inspect.getsource(reference.log_softmax))

# %%
log_probs, new_logp = [], []   # per response: (T_i, V) log-softmax, (T_i,) the sampled tokens' log-probs
for i, (logits, ids) in enumerate(zip(new_logits, token_ids)):
    log_probs.append(reference.log_softmax(logits))
    new_logp.append(log_probs[i][np.arange(len(ids)), ids])
    print(f"o_{i + 1}: token ids {ids}")
    for t in range(len(ids)):
        print(f"   t={t + 1}  logits [{row(logits[t], 6)}]  ->  log-softmax [{row(log_probs[i][t])}]"
              f"  ->  log pi(token {ids[t]}) = {new_logp[i][t]:+.4f}")
print(f"\nlog-sum-exp of the first row: {np.log(np.exp(new_logits[0][0]).sum()):.4f}; every row's "
      f"probabilities sum to 1: {all(np.allclose(np.exp(x).sum(axis=-1), 1) for x in log_probs)}")

# %% [markdown]
# The first row, logits (1.10, -0.20, 0.30), has log-softmax (-0.5434, -1.8434, -1.3434).
# Each entry is its logit minus the same log-sum-exp, 1.6434. So sampled token 0 has
# log-probability -0.5434 under the new policy.
#
# **A common mistake** is to subtract some other constant, such as a rounded log-sum-exp.
# The row still looks like log-probabilities, but its probabilities no longer sum to 1. The
# last line checks the sum.
#
# ## Step 3. Ratios
#
# The ratio compares the new and the old probability of each sampled token. It is computed
# in log space and exponentiated once, so tiny probabilities never underflow:
# $\rho_{i,t} = \exp(\log\pi_\theta - \log\pi_{\theta_\text{old}})$.

# %%
ratio = [np.exp(new - np.asarray(old)) for new, old in zip(new_logp, old_logp)]
print("response  token   log pi_new   log pi_old   log ratio    ratio")
for i in range(G):
    for t in range(len(token_ids[i])):
        print(f"o_{i + 1}       t={t + 1}     {new_logp[i][t]:+.4f}      {old_logp[i][t]:+.4f}"
              f"      {new_logp[i][t] - old_logp[i][t]:+.4f}     {ratio[i][t]:.4f}")
all_ratios = np.concatenate(ratio)
outside = (all_ratios < 1 - epsilon) | (all_ratios > 1 + epsilon)
print(f"\n{outside.sum()} of {len(all_ratios)} ratios lie outside [{1 - epsilon:.1f}, {1 + epsilon:.1f}]; "
      f"range {all_ratios.min():.4f} to {all_ratios.max():.4f}")

# %% [markdown]
# Five of the nine ratios lie outside the trust region [0.8, 1.2], and they range from
# 0.8608 to 2.0894. In a real run, the first update of a fresh rollout starts with every
# ratio at exactly 1 (step 7).
#
# ## Step 4. The clipped surrogate, token by token
#
# Each token contributes $\min(\rho A,\ \operatorname{clip}(\rho, 1-\varepsilon, 1+\varepsilon) A)$.
# The clipped term is a constant in $\theta$. So when the minimum picks it strictly, the
# token contributes no gradient: we call that token *clipped*.

# %%
# Drag the advantage and the clip range: where the objective goes flat, the token gets no gradient.
# (Chapter 2 gathers this explorer and three more.)
from grpo_edu.widgets import ClippingExplorer

ClippingExplorer()

# %%
A = adv_population
surrogate = [rho * A[i] for i, rho in enumerate(ratio)]
clipped_surrogate = [np.clip(rho, 1.0 - epsilon, 1.0 + epsilon) * A[i] for i, rho in enumerate(ratio)]
objective = [np.minimum(s, c) for s, c in zip(surrogate, clipped_surrogate)]
clipped = [c < s for s, c in zip(surrogate, clipped_surrogate)]   # the min strictly picks the constant
print("response  A        token  ratio    rho*A     clip(rho)*A   min       clipped  why")
for i in range(G):
    for t in range(len(token_ids[i])):
        rho = ratio[i][t]
        if 1 - epsilon <= rho <= 1 + epsilon:
            why = "inside [1 - eps, 1 + eps]"
        elif clipped[i][t]:
            why = "moved past the range the way A wants: no gradient"
        else:
            why = "moved against A: keeps its full gradient"
        print(f"o_{i + 1}       {A[i]:+.4f}  t={t + 1}    {rho:.4f}   {surrogate[i][t]:+.4f}   "
              f"{clipped_surrogate[i][t]:+.4f}       {objective[i][t]:+.4f}   "
              f"{'yes' if clipped[i][t] else 'no ':<7}  {why}")
print(f"\nclipped tokens: {sum(int(c.sum()) for c in clipped)} of {len(all_ratios)}")

# %% [markdown]
# Two tokens clip, both in responses with $A > 0$ whose ratio already exceeds 1.2: token 3
# of $o_1$ (ratio 1.5945) and token 2 of $o_4$ (ratio 2.0894). The policy already made
# these good tokens much more likely, and the clip stops it collecting more credit.
#
# The tokens of $o_2$ and $o_3$ have $A < 0$ and ratios above 1.2. The minimum keeps the
# *unclipped* term: for token 1 of $o_2$, 1.8767 times -0.3906 is -0.7330, below the
# clipped -0.4687. A bad token made more likely pays the full penalty, with gradient. The
# clip limits what a token can gain, never its punishment for moving the wrong way.
#
# The mirror case, $A < 0$ with $\rho$ < 0.8, is missing here. The cell below makes it up
# with two log-ratios, +0.25 and -0.30, for the tokens of $o_3$.

# %%
A3 = adv_population[2]
made_up_ratio = np.exp(np.array([0.25, -0.30]))                 # two made-up ratios for o_3's tokens
made_up_clipped = np.clip(made_up_ratio, 1 - epsilon, 1 + epsilon) * A3
made_up_objective = np.minimum(made_up_ratio * A3, made_up_clipped)
print(f"A_3 = {A3:+.4f}, ratios [{row(made_up_ratio)}]: min(rho A, clip(rho) A) = [{row(made_up_objective)}], "
      f"clipped: {made_up_clipped < made_up_ratio * A3}")

# %% [markdown]
# The second token, with ratio 0.7408, clips. The policy already moved away from a bad
# token, and the clip caps that reward.
#
# ## Step 5. KL to the reference, per token (k3)
#
# With $d = \log\pi_\text{ref} - \log\pi_\theta$, Schulman's k3 estimator is $e^{d} - d - 1$.
# It is never negative (since $e^d \ge 1 + d$), and zero exactly when the two log-probabilities
# agree. Its mean over tokens drawn from $\pi_\theta$ itself is the exact
# $\mathrm{KL}(\pi_\theta \,\|\, \pi_\text{ref})$. Both conditions in that sentence matter:
# the end of this step shows what happens without them.

# %%
# Drag the logits of the policy and of the reference: k1, k2 and k3 against the exact KL.
from grpo_edu.widgets import KLExplorer

KLExplorer()

# %%
print(inspect.getsource(reference.k3))
kl = [reference.k3(np.asarray(ref), new) for ref, new in zip(ref_logp, new_logp)]
print("response  token   log pi_ref   log pi_new   d = ref - new    k3")
for i in range(G):
    for t in range(len(token_ids[i])):
        d = ref_logp[i][t] - new_logp[i][t]
        print(f"o_{i + 1}       t={t + 1}     {ref_logp[i][t]:+.4f}      {new_logp[i][t]:+.4f}"
              f"      {d:+.4f}        {kl[i][t]:.5f}")

# %% [markdown]
# The first token has $d$ = -0.0566 and k3 = 0.00157. The largest, token 2 of $o_4$, has
# $d$ = -0.6369 and k3 = 0.16581. Times $\beta$ = 0.04, the KL term is a gentle leash next
# to objectives of order 1.
#
# **Two caveats, both easy to miss.** k3 is unbiased only for tokens drawn from
# $\pi_\theta$, but GRPO's tokens come from $\pi_{\theta_\text{old}}$: the two coincide only
# on the first optimizer step of a rollout. And the loss differentiates k3: the gradient of
# a KL estimate is not an estimate of the KL's gradient. A categorical distribution over 4
# tokens shows both exactly, as sums over the vocabulary (gradients in $\pi_\theta$'s
# logits):

# %%
pi = np.exp(reference.log_softmax([0.5, -0.2, 0.1, -1.0]))       # pi_theta
pi_ref = np.exp(reference.log_softmax([0.0, 0.3, -0.4, -0.5]))   # the reference
pi_old = np.exp(reference.log_softmax([0.9, -0.5, 0.1, -0.8]))   # the sampler, a few updates behind pi_theta
k3_per_token = reference.k3(np.log(pi_ref), np.log(pi))  # k3 of each token of the vocabulary
exact_kl = (pi * np.log(pi / pi_ref)).sum()
print(f"exact KL(pi || pi_ref)                 {exact_kl:.4f}")
print(f"mean of k3 over tokens from pi         {(pi * k3_per_token).sum():.4f}")
print(f"mean of k3 over tokens from pi_old     {(pi_old * k3_per_token).sum():.4f}")

# d log pi(x) / d logits = onehot(x) - pi; d k3(x) / d log pi(x) = 1 - pi_ref(x) / pi(x)
d_log_pi = np.eye(4) - pi                                 # row x: gradient of log pi(x)
expected_k3_gradient = (pi * (1 - pi_ref / pi)) @ d_log_pi
kl_gradient = pi * (np.log(pi / pi_ref) - exact_kl)      # gradient of KL(pi || pi_ref)
reverse_kl_gradient = pi - pi_ref                         # gradient of KL(pi_ref || pi)
print(f"\ngradient of KL(pi || pi_ref)           [{row(kl_gradient)}]")
print(f"mean gradient of k3, tokens from pi    [{row(expected_k3_gradient)}]")
print(f"gradient of KL(pi_ref || pi)           [{row(reverse_kl_gradient)}]")
print(f"k3's mean gradient == gradient of KL(pi_ref || pi): {np.allclose(expected_k3_gradient, reverse_kl_gradient)}")
k1_gradient = pi @ d_log_pi                                # d k1(x) / d log pi(x) = 1
print(f"mean gradient of k1 = -d, tokens from pi: [{row(np.round(k1_gradient, 12) + 0.0)}]")

# %% [markdown]
# Drawn from $\pi_\theta$, the k3 values average to the exact KL, 0.1159. Drawn from a
# sampler a few updates behind, they average to 0.1063.
#
# The mean gradient of k3 over on-policy tokens is exactly that of the other direction,
# $\mathrm{KL}(\pi_\text{ref} \,\|\, \pi_\theta)$: $\pi_\theta - \pi_\text{ref}$ in the
# logits. Both directions are smallest at $\pi_\theta = \pi_\text{ref}$, so k3 still pulls
# the policy towards the reference, along another path. k1, the plain log-ratio, is worse as
# a loss: its mean gradient on on-policy tokens is zero.
#
# ## Step 6. Per-response loss and the group loss
#
# Each response's loss is the token mean of $-\text{objective} + \beta\,\text{k3}$. The
# group loss is the mean over the G responses. Every response weighs the same whatever its
# length (chapter 4 shows what that does to long responses).

# %%
response_loss = [float(-objective[i].mean() + beta * kl[i].mean()) for i in range(G)]
loss = float(np.mean(response_loss))
print("response  mean objective   mean k3    loss = -objective + beta * k3")
for i in range(G):
    print(f"o_{i + 1}       {objective[i].mean():+.4f}          {kl[i].mean():.5f}    {response_loss[i]:+.4f}")
print(f"\ngroup loss = mean over {G} responses = {loss:+.4f}")

# %% [markdown]
# The group loss is +0.1048. It is positive because the new logits moved two of the bad
# responses' tokens up ($o_3$'s objective is -1.9152), while the clip capped what the good
# responses could earn.
#
# Steps 1 to 6 are the whole update. `grpo_edu.algorithm.reference.grpo_update` is the same
# loop, written once, and repeats the cells above number for number. Below are the core
# lines of its loop; `grpo_edu/algorithm/reference.py` adds input checks and the gradient.

# %%
update = reference.grpo_update(token_ids, new_logits, old_logp, ref_logp, rewards, epsilon=epsilon, beta=beta)
same = update.loss == loss and all(
    np.array_equal(terms.new_logp, new_logp[i]) and np.array_equal(terms.ratio, ratio[i])
    and np.array_equal(terms.objective, objective[i]) and np.array_equal(terms.clipped, clipped[i])
    and np.array_equal(terms.kl, kl[i]) and terms.loss == response_loss[i]
    for i, terms in enumerate(update.responses))
print(f"reference.grpo_update gives every number of steps 2 to 6, bit for bit: {same}\n")
source = inspect.getsource(reference.grpo_update)
print(inspect.cleandoc(source[source.index("        A = float("):source.index("        # d loss / d new_logp")]))

# %% [markdown]
# ## Step 7. A fresh rollout: zero loss, non-zero gradient
#
# In a real run, the first update on a new rollout uses the policy that just sampled it. So
# $\pi_\theta = \pi_{\theta_\text{old}}$, and every ratio is exactly 1. Take the new
# policy's own log-probabilities as the old ones, and also as the reference, as at the very
# start of training:

# %%
fresh_logp = [terms.new_logp for terms in update.responses]
fresh = reference.grpo_update(token_ids, new_logits, fresh_logp, fresh_logp, rewards,
                              epsilon=epsilon, beta=beta)
print(f"ratios: {[terms.ratio.round(4).tolist() for terms in fresh.responses]}")
print(f"per-response objectives = A_i: [{row([t.objective_mean for t in fresh.responses])}]")
print(f"loss = -mean(A) = {fresh.loss:+.4f}")
for i, terms in enumerate(fresh.responses):
    print(f"o_{i + 1}: d loss / d logits =")
    for t in range(len(token_ids[i])):
        print(f"     t={t + 1} (token {token_ids[i][t]}) [{row(terms.grad_logits[t])}]")
gradient_norm = np.sqrt(sum((t.grad_logits ** 2).sum() for t in fresh.responses))
print(f"gradient norm over all logits = {gradient_norm:.4f}")

# %% [markdown]
# The loss is -0.0000, zero up to rounding. With every ratio 1, each response's objective is
# its advantage, and the advantages sum to zero. The gradient is not zero: the derivative of
# $\rho A$ with respect to $\log\pi_\theta$ is $\rho A = A$. Each sampled logit is pushed in
# proportion to its response's advantage, over G and the response's length, times one minus
# the token's probability. Token 1 of $o_1$ gets -0.0409, so gradient descent raises it.
# Token 1 of $o_3$ gets +0.0695, so it is lowered. The gradient's norm is 0.1527.
#
# **A common mistake** is to expect a loss of about 0 on every step. It is 0 only on a fresh
# rollout; on the example's drifted logits it was +0.1048 (step 6). A first-step loss far
# from 0, or a first-step ratio far from 1, means that the sampler and the trainer compute
# log-probabilities differently: temperature, dtype, or a mask off by one.
#
# Nobody has to trust that gradient: here it is against central finite differences.

# %%
def group_loss(flat_logits):
    """The fresh rollout's group loss, as a function of all 27 logits in one flat vector."""
    ends = np.cumsum([3 * len(ids) for ids in token_ids])[:-1]          # where each response's logits end
    logits = [x.reshape(-1, 3) for x in np.split(flat_logits, ends)]
    return reference.grpo_update(token_ids, logits, fresh_logp, fresh_logp, rewards, epsilon=epsilon, beta=beta).loss


flat = np.concatenate([logits.ravel() for logits in new_logits])
h = 1e-6
numeric = np.array([(group_loss(flat + h * e) - group_loss(flat - h * e)) / (2 * h) for e in np.eye(len(flat))])
analytic = np.concatenate([t.grad_logits.ravel() for t in fresh.responses])
print(f"max |analytic - finite difference| = {np.abs(analytic - numeric).max():.1e}")

# %% [markdown]
# ## What DeepSeek-R1 trained with
#
# The DeepSeek-R1 paper gives its GRPO settings for R1 and for R1-Zero. DeepSeek-R1-Zero is
# RL straight from the base model, with no supervised fine-tuning first. The cell puts R1's
# first RL stage in grpo_edu's config keys, beside `configs/r1-recipe-tiny.toml`, which
# applies it to the tiny arithmetic task of chapters 5 and 6.

# %%
from grpo_edu.config import TrainConfig

# A training step of R1 is 32 questions x 16 outputs, and a rollout 16 such mini-batches, one optimizer
# step each. In grpo_edu a step is one rollout. R1-Zero ran 10,400 optimizer steps: 650 rollouts, 1.6 epochs.
r1_first_stage = {   # grpo_edu key: R1's value in that key's units
    "prompts_per_step": 32 * 16, "num_generations": 16, "num_mini_batches": 16, "num_iterations": 1,
    "learning_rate": 3e-6, "beta": 0.001, "epsilon": 10, "epsilon_high": 10, "temperature": 1.0,
    "ref_sync_steps": 400 // 16, "max_completion_length": 32_768}   # reference replaced every 400 steps
tiny_r1 = TrainConfig.from_toml(home.path("configs/r1-recipe-tiny.toml"))
for key, r1_value in r1_first_stage.items():
    ours = tiny_r1.value(key)
    print(f"{key:<22} R1 {r1_value:>8g}   r1-recipe-tiny {ours:>8g}   {'' if ours == r1_value else 'changed'}".rstrip())

# %% [markdown]
# <details><summary>What the table means, and what the tiny recipe changes</summary>
#
# Fifteen of every 16 optimizer steps train on outputs that an earlier policy sampled. That
# is what the ratio and the clip are for (chapter 3 shows why $\pi_{\theta_\text{old}}$ must
# then stay the sampler for the whole rollout). A clip ratio of 10 clips ratios to [-9, 11].
# A ratio is never negative, so the lower bound never binds. The upper one only stops a
# token with $A > 0$ whose probability has grown elevenfold since sampling: R1's trust
# region is wide open. The paper stresses that the value matters: a lower one can cut off
# the gradients of many tokens, and a higher one can make training unstable. R1-Zero uses
# the same learning rate, $\beta$, temperature and counts; the paper gives no clip ratio for
# it. R1's second RL stage keeps most of the first stage's settings.
#
# The length limit shrinks because a correct completion of the tiny task has at most ten
# tokens. The learning rate grows because 3e-6 was chosen for DeepSeek-V3-Base, the
# 671-billion-parameter model R1 starts from, and 3e-4 is the tiny policy's tuned value.
# `grpo_loss` requires $\varepsilon$ < 1, and 0.999 puts the lower bound at 0.001: it binds
# only on a token whose probability fell a thousandfold since sampling. Instead of
# R1-Zero's 650 rollouts, the config keeps its 1.6 epochs: 31 rollouts of 512 prompts draw
# 15,872 times from the 10,000 training problems the trainer samples from
# (`grpo_edu.environment.tasks.TRAIN_POOL`).
#
# </details>

# %% [markdown]
# ## What you learned
#
# - GRPO's advantage is each reward minus the group's mean, over the group's std; the advantages of a group sum to zero.
# - The population and the sample std differ by the factor $\sqrt{G/(G-1)}$. Under plain gradient descent that is a smaller step and a larger $\beta$; under Adam, only the KL term's weight changes.
# - A token clips only when it has moved past the range in the direction its advantage wants; the clip never stops a correction.
# - k3 is never negative and, on tokens from $\pi_\theta$, unbiased; its mean gradient is that of $\mathrm{KL}(\pi_\text{ref} \,\|\, \pi_\theta)$.
# - On a fresh rollout the loss is zero, but the gradient is not.
# - DeepSeek-R1 trained with $\beta$ = 0.001 and a clip ratio of 10, not DeepSeekMath's 0.04 and PPO's 0.2.
#
# ## Check yourself
#
# Where an answer is a number, check yours before you open it:
# `quiz.check(1, 1, population=..., sample=...)` (`from grpo_edu.exercises import quiz`;
# `quiz.ask(1)` lists what each question takes).
#
# 1. With the example's rewards and the population std, what is $A_3$? What is it with the
#    sample std?
#
#    <details><summary>Answer</summary>
#
#    -1.4321 with the population std, and -1.2402 with the sample std: smaller by the factor
#    1.1547 for G = 4, like every advantage of the group.
#
#    </details>
#
# 2. Token 3 of $o_1$ has $A > 0$ and ratio 1.5945, with $\varepsilon$ = 0.2. Does its
#    policy term give it a gradient? What if its advantage were negative?
#
#    <details><summary>Answer</summary>
#
#    No: the minimum picks the clipped term, a constant, so the token is clipped. With
#    $A < 0$ the minimum keeps the unclipped term, and the token keeps its full gradient, as
#    the tokens of $o_2$ and $o_3$ do.
#
#    </details>
#
# 3. Why is the group loss +0.1048 on the example's logits, but -0.0000 on a fresh rollout?
#
#    <details><summary>Answer</summary>
#
#    On a fresh rollout every ratio is 1 and the policy is the reference. Each response's
#    objective is then its advantage, the advantages sum to zero, and every k3 is 0. On the
#    example's logits, two bad responses' tokens moved up ($o_3$'s objective is -1.9152),
#    while the clip capped what the good responses could earn.
#
#    </details>
#
# 4. Step 5's k3 values average to 0.1063 over a sampler's tokens, but to the exact KL,
#    0.1159, over $\pi_\theta$'s own. Why?
#
#    <details><summary>Answer</summary>
#
#    k3 is unbiased only for tokens drawn from the policy whose KL it estimates. After the
#    first optimizer step on a rollout, the sampler $\pi_{\theta_\text{old}}$ is no longer
#    that policy.
#
#    </details>
#
# 5. On the first update of a fresh rollout, a run logs ratios far from 1. What does that
#    tell you?
#
#    <details><summary>Answer</summary>
#
#    The sampler and the trainer compute log-probabilities differently: a different
#    temperature, a different dtype, or a mask off by one. With the same policy on both
#    sides every ratio should be exactly 1.
#
#    </details>
#
# ## Exercises
#
# Each exercise has a checker in `grpo_edu.exercises.ch01`. It names each case your answer
# fails and how (its shape, its sign, its size, a factor, NaN), never the right value. Hints
# and worked solutions (for the open question, a written answer) are folded.
#
# **1.1 Group advantages.** Write `my_group_advantages(rewards, std)` for one group:
# `(r - mean) / (std + 1e-8)`, with `std` either `"population"` or `"sample"`. The first
# attempt below makes step 1's common mistake. Run the checker, read which cases fail, and
# fix it. Then make sure an all-equal group returns
# zeros, not NaN.
#
# <details><summary>Hint</summary>
#
# NumPy's `std` divides by G unless told otherwise; `ddof=1` makes it divide by G - 1. The
# `+ 1e-8` is what keeps an all-equal group at zeros.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# import numpy as np
#
#
# def my_group_advantages(rewards, std):
#     spread = rewards.std(ddof=0 if std == "population" else 1)
#     return (rewards - rewards.mean()) / (spread + 1e-8)
#
#
# ch01.check_group_advantages(my_group_advantages)
# ```
#
# </details>

# %%
from grpo_edu.exercises import ch01


def my_group_advantages(rewards, std):
    return (rewards - rewards.mean()) / (rewards.std() + 1e-8)  # ignores `std`: fix me


ch01.check_group_advantages(my_group_advantages)

# %% [markdown]
# **1.2 Which tokens clip?** For each (ratio, advantage) pair in `ch01.CLIP_QUIZ`, with
# $\varepsilon$ = 0.2, predict whether the token is clipped: the minimum strictly picks the
# clipped term, so the token gets no gradient. Write your answers as a list of 8 booleans,
# then check them. The checker says how many predictions are wrong in each half of the quiz
# (the pairs with A > 0, those with A < 0), but not which.
#
# <details><summary>Hint</summary>
#
# Step 4's table: a token clips only when it has already moved past the range *in the
# direction its advantage wants*. On the boundary itself the two terms are equal, and the
# minimum does not strictly pick the clipped one.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# my_predictions = [(A > 0 and rho > 1.2) or (A < 0 and rho < 0.8) for rho, A in ch01.CLIP_QUIZ]
# ch01.check_clip_predictions(my_predictions)
# ```
#
# </details>

# %%
print(ch01.CLIP_QUIZ)
my_predictions = []  # fill in 8 booleans, one per pair
ch01.check_clip_predictions(my_predictions)

# %% [markdown]
# **1.3 The k3 estimator.** Write `my_k3(log_ref, log_new)` returning the per-token k3
# estimate, then check it. Bonus: sample tokens from step 5's $\pi_\theta$, then from its
# $\pi_{\theta_\text{old}}$, and watch the mean of k3 settle at two different values.
#
# <details><summary>Hint</summary>
#
# With $d = \log\pi_\text{ref} - \log\pi_\theta$, k3 is $e^{d} - d - 1$ (step 5).
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# import numpy as np
#
#
# def my_k3(log_ref, log_new):
#     d = np.asarray(log_ref) - np.asarray(log_new)
#     return np.exp(d) - d - 1
#
#
# ch01.check_k3(my_k3)
# ```
#
# </details>

# %%
def my_k3(log_ref, log_new):
    raise NotImplementedError("your k3 here")


ch01.check_k3(my_k3)

# %% [markdown]
# **1.4 Predict, then compute.** Before running anything: if every reward of the example is
# multiplied by 10, which numbers of steps 1 to 7 change? Check your answer with
# `reference.grpo_update`.
#
# <details><summary>Hint</summary>
#
# Follow the rewards: they enter the update only through the advantages (step 1). What do
# the group's mean and std do when every reward is multiplied by 10?
#
# </details>
#
# <details><summary>Answer</summary>
#
# Step 1's mean, std and centred rewards are 10 times larger, and nothing else changes: the
# advantages $(r - \bar r)/\sigma$ are the same, because the numerator and the denominator
# both scale by 10 (up to the $10^{-8}$ in the denominator, far below the printed digits).
# Steps 2 to 7 read the rewards only through the advantages, so every ratio, clip, k3, loss
# and gradient is unchanged. `reference.grpo_update(..., rewards * 10, ...)` gives the same
# loss and gradients. Without the std (`scale_by_std=False`, Dr. GRPO's advantage) the
# policy-gradient term would be 10 times larger and the KL term's relative weight 10 times
# smaller.
#
# </details>
#
# **Open question: the std under an optimiser.** Check step 1's claims about the two stds.
# Train the example's logits for 20 steps on one fresh rollout, with each std, with plain
# gradient descent and with Adam, with $\beta$ = 0 and 0.04. Which pairs of runs end apart?
#
# <details><summary>Hint</summary>
#
# `reference.grpo_update(..., std=std)` returns each response's `grad_logits`. For a fresh
# rollout, pass the starting log-probabilities as both the old and the reference ones
# (step 7). Adam keeps two running averages per logit: of the gradient and of its square.
#
# </details>
#
# <details><summary>Answer</summary>
#
# ```python
# def train_logits(std, beta, adam, steps=20, lr=0.05):
#     """The example's logits after `steps` updates on step 7's fresh rollout, flat."""
#     logits = [x.copy() for x in new_logits]
#     first, second = [0 * x for x in logits], [0 * x for x in logits]   # Adam's moments
#     for k in range(1, steps + 1):
#         out = reference.grpo_update(token_ids, logits, fresh_logp, fresh_logp, rewards,
#                                     epsilon=epsilon, beta=beta, std=std)
#         for i, g in enumerate(terms.grad_logits for terms in out.responses):
#             first[i] = 0.9 * first[i] + 0.1 * g
#             second[i] = 0.999 * second[i] + 0.001 * g ** 2
#             adam_step = (first[i] / (1 - 0.9 ** k)) / (np.sqrt(second[i] / (1 - 0.999 ** k)) + 1e-8)
#             logits[i] = logits[i] - lr * (adam_step if adam else g)
#     return np.concatenate([x.ravel() for x in logits])
#
#
# for adam in (False, True):
#     for kl_weight in (0.0, beta):
#         gap = np.abs(train_logits("population", kl_weight, adam) - train_logits("sample", kl_weight, adam))
#         print(f"adam={adam}, beta={kl_weight}: the logits end {gap.max():.1e} apart")
# factor = adv_population[0] / adv_sample[0]
# print(np.allclose(train_logits("sample", beta, False),
#                   train_logits("population", beta * factor, False, lr=0.05 / factor), rtol=0, atol=1e-12))
# ```
#
# Under gradient descent the runs end apart, and the last line prints True: the sample std
# is the population std with the learning rate divided by the factor and $\beta$ multiplied
# by it. Under Adam without a KL term the two runs agree up to Adam's small $\epsilon$,
# because Adam divides out a constant factor on the gradient. With $\beta$ = 0.04 they part
# again: the std now sets the KL term's weight against the policy gradient.
#
# </details>
