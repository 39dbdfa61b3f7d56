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
# > - why the first update on a fresh rollout has zero loss but a non-zero gradient
# > - what DeepSeek-R1 trained with, and where the textbook section "Implementing GRPO from Scratch" (its chapter 15) prints numbers its own listing does not produce
# >
# > **You need first**: chapter 0 (baselines, the ratio and the clip).
# >
# > **Reading time**: about 31 minutes. **Compute**: at most 60 s on a 2-core CPU. [Glossary](../docs/glossary.md) · [Notation](../docs/notation.md)
#
# GRPO trains a language model by sampling a *group* of G responses to the same prompt. It
# scores each response with one scalar reward and pushes up the responses that beat their
# siblings. There is no value network: the baseline is the group's own mean reward.
#
# This chapter follows one GRPO update of one prompt with G = 4 responses, in plain NumPy,
# and prints every intermediate number. The inputs are the worked example of the textbook
# section: rewards, token ids, old and reference log-probabilities, and new-policy logits
# over a 3-token vocabulary. That section prints numbers that its own listing does not
# produce. The end of this chapter puts the two side by side, so a reader with the section
# open can see exactly where.
#
# Each step is a few lines of NumPy in a loop over the responses, printed as it goes. At the
# end of step 6, `grpo_edu.algorithm.reference.grpo_update` repeats the whole update and
# gives the same numbers, bit for bit. It is the loop-per-response implementation that the
# PyTorch code of later chapters is tested against. Every number in the prose is one that a
# cell prints.
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
# tokens. $\widehat{\mathrm{KL}}_{i,t}$ is Schulman's k3 estimator of the KL divergence to a
# frozen reference policy. Step 5 says what it estimates, and what it does not.
#
# This per-token form is DeepSeekMath's: a ratio per token, and a mean over each response's
# $|o_i|$ tokens. It is what the textbook section, this chapter's reference and grpo_edu's
# `loss_type="grpo"` compute. The DeepSeek-R1 paper (its eq. 1-2) writes the same objective
# per *sequence*. Its ratio is $\pi_\theta(o_i \mid q) / \pi_{\theta_\text{old}}(o_i \mid q)$,
# the probability of a whole output. Its KL term compares whole outputs, and its only mean
# is over the G outputs. A sequence's probability is the product of its tokens'
# probabilities. So R1's ratio, as written, is $\prod_t \rho_{i,t}$, not a mean of the
# $\rho_{i,t}$. (GSPO, Group Sequence Policy Optimization, clips a length-normalised form of
# it: chapter 4.)
#
# This chapter uses $\varepsilon$ = 0.2 and $\beta$ = 0.04, the values of the textbook
# section's worked example. That section calls them DeepSeek-R1's; they are not. 0.04 is
# DeepSeekMath's KL coefficient, and 0.2 is the customary clip range of PPO (Proximal Policy
# Optimization). R1 trained with a KL coefficient of 0.001 and, in its first reinforcement
# learning (RL) stage, a clip ratio of 10. The last section of the chapter sets out R1's
# recipe from its paper.
#
# ## The worked example
#
# One prompt, four responses of 3, 2, 2 and 2 tokens over a vocabulary of 3 tokens. The
# numbers are those of the textbook section's listing, unchanged.

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
# group's standard deviation. Two standard deviations are in common use, and the textbook
# section uses both without saying so:
#
# - its NumPy listing calls `rewards.std()`, which divides by G: the *population* std;
# - its PyTorch listing calls `rewards.std(dim=1)`, which divides by G - 1: the *sample* std,
#   with Bessel's correction. Hugging Face's TRL (Transformer Reinforcement Learning)
#   library uses the sample std too.

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
print()
print("response  reward   r - mean   A (population)   A (sample)")
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
# What does the choice of std change? With the sample std (0.4435) every advantage is
# smaller by the same factor, 1.1547 for G = 4. That factor reaches only the policy-gradient
# term. The clip range acts on the ratio, not on $A$, so which tokens clip does not change.
# The KL term does not contain $A$ at all. So the switch is not just a smaller learning
# rate:
#
# - under plain gradient descent it is a learning rate smaller by 1.1547 *and* a $\beta$
#   larger by 1.1547;
# - under Adam, which divides each gradient by a running estimate of its own size, a
#   constant factor on the whole gradient cancels (up to Adam's small $\epsilon$). Without
#   a KL term the switch then changes nearly nothing. With one, it only changes how much the
#   KL counts.
#
# The cell below trains the example's logits for 20 steps from a fresh rollout with each
# std, and compares the results:

# %%
fresh_logp = [reference.log_softmax(logits)[np.arange(len(ids)), ids]
              for logits, ids in zip(new_logits, token_ids)]   # pi_old = pi_ref = the starting logits


def train_logits(std, beta, optimizer, steps=20, lr=0.05):
    """`steps` updates of the example's logits on one rollout (pi_old fixed); returns them flat."""
    logits = [x.copy() for x in new_logits]
    first = [np.zeros_like(x) for x in logits]
    second = [np.zeros_like(x) for x in logits]
    for k in range(1, steps + 1):
        step_update = reference.grpo_update(token_ids, logits, fresh_logp, fresh_logp, rewards,
                                            epsilon=epsilon, beta=beta, std=std)
        for i, terms in enumerate(step_update.responses):
            g = terms.grad_logits
            if optimizer == "SGD":
                logits[i] = logits[i] - lr * g
            else:  # Adam, betas (0.9, 0.999), eps 1e-8, bias-corrected
                first[i] = 0.9 * first[i] + 0.1 * g
                second[i] = 0.999 * second[i] + 0.001 * g ** 2
                logits[i] = logits[i] - lr * (first[i] / (1 - 0.9 ** k)) / (np.sqrt(second[i] / (1 - 0.999 ** k)) + 1e-8)
    return np.concatenate([x.ravel() for x in logits])


print("optimizer  beta    max |logits(population) - logits(sample)|   largest change of a logit")
for optimizer, kl_weight in (("SGD", 0.0), ("SGD", beta), ("Adam", 0.0), ("Adam", beta)):
    trained = {std: train_logits(std, kl_weight, optimizer) for std in ("population", "sample")}
    start = np.concatenate([x.ravel() for x in new_logits])
    print(f"{optimizer:<9}  {kl_weight:.2f}    {np.abs(trained['population'] - trained['sample']).max():.1e}"
          f"                             {np.abs(trained['population'] - start).max():.4f}")
factor = adv_population[0] / adv_sample[0]
same = np.allclose(train_logits("sample", beta, "SGD"),
                   train_logits("population", beta * factor, "SGD", lr=0.05 / factor), rtol=0, atol=1e-12)
print(f"\nSGD with the sample std = SGD with the population std, lr / {factor:.4f} and beta x {factor:.4f}: {same}")

# %% [markdown]
# With plain gradient descent the two runs end 9.5e-03 apart, after the logits moved by up
# to 0.0702. The sample std takes smaller steps. As the last line checks, it is exactly the
# population std with a smaller learning rate and a larger $\beta$. With Adam and no KL term
# the runs end 1.5e-07 apart, after moving by up to 0.7374: the choice of std has stopped
# mattering. With Adam and $\beta$ = 0.04 they differ by 1.0e-02. What is left of the switch
# is the weight of the KL term next to the policy gradient.
#
# The choice matters more in two places. One is comparing numbers across implementations:
# an advantage of +1.1717 here is +1.0147 in TRL, which uses the sample std. The other is a
# batch whose groups differ in size, since the factor depends on G. This chapter uses the
# population std, as the textbook section's worked example does.
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

# %% [markdown]
# The first row, logits (1.10, -0.20, 0.30), has log-softmax (-0.5434, -1.8434, -1.3434).
# Each entry is its logit minus the same log-sum-exp, 1.6434. So sampled token 0 has
# log-probability -0.5434 under the new policy.
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
# These logits are far from the old policy. Five of the nine ratios lie outside the trust
# region [0.8, 1.2], and they range from 0.8608 to 2.0894. In a real run, the first update
# of a fresh rollout starts with every ratio at exactly 1 (step 7).
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
        if clipped[i][t]:
            why = "A > 0 and rho > 1 + eps: gain capped" if A[i] > 0 else "A < 0 and rho < 1 - eps: penalty capped"
        elif rho > 1 + epsilon:
            why = "A < 0 and rho > 1 + eps: full penalty, keeps its gradient"
        elif rho < 1 - epsilon:
            why = "A > 0 and rho < 1 - eps: full loss, keeps its gradient"
        else:
            why = "inside [1 - eps, 1 + eps]"
        print(f"o_{i + 1}       {A[i]:+.4f}  t={t + 1}    {rho:.4f}   {surrogate[i][t]:+.4f}   "
              f"{clipped_surrogate[i][t]:+.4f}       {objective[i][t]:+.4f}   "
              f"{'yes' if clipped[i][t] else 'no ':<7}  {why}")
print(f"\nclipped tokens: {sum(int(c.sum()) for c in clipped)} of {len(all_ratios)}")

# %% [markdown]
# Two tokens clip, both in responses with $A > 0$ whose ratio already exceeds 1.2: token 3
# of $o_1$ (ratio 1.5945) and token 2 of $o_4$ (ratio 2.0894). The new policy already made
# these good tokens much more likely than the sampler did. PPO's clip stops it from
# collecting more credit for moving further, and the token's gradient is zero.
#
# The tokens of $o_2$ and $o_3$ have $A < 0$ and ratios above 1.2. The minimum keeps the
# *unclipped* term. For example, for token 1 of $o_2$, 1.8767 times -0.3906 is -0.7330,
# below the clipped -0.4687. The policy made a bad token more likely, and it pays the full
# penalty, with gradient. The clip is asymmetric by design: it limits how much a token can
# gain, never how much it is punished for moving the wrong way.
#
# The one case this example lacks, $A < 0$ with $\rho$ < 0.8, is the mirror image. The
# policy already moved away from a bad token, and the clip caps that reward. The textbook
# section illustrates it with invented log-ratios for $o_3$, +0.25 and -0.30, instead of the
# ratios its logits give. The cell below computes that illustration too:

# %%
A3 = adv_population[2]
illustration_ratio = np.exp(np.array([0.25, -0.30]))
illustration_surrogate = illustration_ratio * A3
illustration_clipped = np.clip(illustration_ratio, 1 - epsilon, 1 + epsilon) * A3
illustration_objective = np.minimum(illustration_surrogate, illustration_clipped)
print(f"A_3 = {A3:+.4f}, log ratios (+0.25, -0.30) -> ratios [{row(illustration_ratio)}]")
print(f"rho*A       = [{row(illustration_surrogate)}]")
print(f"clip(rho)*A = [{row(illustration_clipped)}]")
print(f"min         = [{row(illustration_objective)}]   clipped: {illustration_clipped < illustration_surrogate}")
print(f"mean objective = {illustration_objective.mean():+.4f}")

# %% [markdown]
# ## Step 5. KL to the reference, per token (k3)
#
# With $d = \log\pi_\text{ref} - \log\pi_\theta$, the k3 estimator is $e^{d} - d - 1$. It is
# never negative (since $e^d \ge 1 + d$), and zero exactly when the two log-probabilities
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
# $d$ = -0.6369 and k3 = 0.16581. Multiplied by $\beta$ = 0.04, the KL term is a gentle
# leash next to objectives of order 1.
#
# **What k3 estimates, and what its gradient is.** Two caveats, both easy to miss.
#
# - k3 is unbiased only for tokens drawn from $\pi_\theta$. GRPO's tokens come from
#   $\pi_{\theta_\text{old}}$. The two coincide on the first optimizer step of a rollout.
#   On every later step (the next mini-batch, the next pass) the mean of k3 estimates
#   something else.
# - The loss does not just report k3, it differentiates it. The gradient of a KL estimate
#   is not an estimate of the KL's gradient.
#
# A categorical distribution over 4 tokens shows both exactly, as sums over the vocabulary
# with no sampling. The gradients are with respect to $\pi_\theta$'s logits:

# %%
def softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


pi = softmax(np.array([0.5, -0.2, 0.1, -1.0]))          # pi_theta
pi_ref = softmax(np.array([0.0, 0.3, -0.4, -0.5]))      # the reference
pi_old = softmax(np.array([0.9, -0.5, 0.1, -0.8]))      # the sampler, a few updates behind pi_theta
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
# On the gradient: the mean gradient of k3 over on-policy tokens is not the gradient of
# $\mathrm{KL}(\pi_\theta \,\|\, \pi_\text{ref})$. It is, exactly, the gradient of the other
# direction, $\mathrm{KL}(\pi_\text{ref} \,\|\, \pi_\theta)$, which is
# $\pi_\theta - \pi_\text{ref}$ in the logits. The two directions have the same minimum,
# $\pi_\theta = \pi_\text{ref}$, so k3 still pulls the policy towards the reference. But it
# pulls along a different path than the KL the objective names. k1, the plain log-ratio, is
# worse as a loss: its mean gradient on on-policy tokens is zero.
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
# loop over responses, written once, with its input checks and the gradient that step 7
# needs. The library call repeats the cells above, number for number:

# %%
update = reference.grpo_update(token_ids, new_logits, old_logp, ref_logp, rewards, epsilon=epsilon, beta=beta)
same = update.loss == loss and all(
    np.array_equal(terms.new_logp, new_logp[i]) and np.array_equal(terms.ratio, ratio[i])
    and np.array_equal(terms.objective, objective[i]) and np.array_equal(terms.clipped, clipped[i])
    and np.array_equal(terms.kl, kl[i]) and terms.loss == response_loss[i]
    for i, terms in enumerate(update.responses))
print(f"reference.grpo_update gives every number of steps 2 to 6, bit for bit: {same}\n")
print(inspect.getsource(reference.grpo_update))

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
# its advantage, and the advantages sum to zero. The gradient is not zero. The derivative of
# $\rho A$ with respect to $\log\pi_\theta$ is $\rho A = A$. So each token's sampled logit is
# pushed up in proportion to its response's advantage, divided by G and by the response's
# length, and times one minus the token's probability (from the softmax). Token 1 of $o_1$
# gets -0.0409 on its sampled logit, so gradient descent raises it. Token 1 of $o_3$ gets
# +0.0695, so it is lowered. The gradient's norm over all logits is 0.1527.
#
# The loss value says nothing about learning here; the gradient does all the work. A
# first-step loss far from 0, or a first-step ratio far from 1, means that the sampler and
# the trainer compute log-probabilities differently: temperature, dtype, or a mask off by
# one.
#
# Nobody has to trust that gradient: here it is against central finite differences.

# %%
def group_loss(flat_logits):
    logits, start = [], 0
    for ids in token_ids:
        logits.append(flat_logits[start:start + 3 * len(ids)].reshape(len(ids), 3))
        start += 3 * len(ids)
    return reference.grpo_update(token_ids, logits, fresh_logp, fresh_logp, rewards,
                                 epsilon=epsilon, beta=beta).loss


flat = np.concatenate([logits.ravel() for logits in new_logits])
h = 1e-6
numeric = np.array([(group_loss(flat + h * e) - group_loss(flat - h * e)) / (2 * h) for e in np.eye(len(flat))])
analytic = np.concatenate([t.grad_logits.ravel() for t in fresh.responses])
print(f"max |analytic - finite difference| = {np.abs(analytic - numeric).max():.1e}")

# %% [markdown]
# ## What DeepSeek-R1 trained with
#
# The textbook section's $\varepsilon$ and $\beta$ are not R1's. The R1 paper gives its GRPO
# settings in its "Training details" section, for two models: R1-Zero, and R1, whose RL runs
# in two stages. The first cell holds what the paper states. A "-" marks a setting the paper
# does not give. "~ stage 1" marks one where it says only that the second stage keeps most
# of the first stage's settings.

# %%
r1_stated = {  # setting: (R1-Zero, R1 first RL stage, R1 second RL stage), from the DeepSeek-R1 paper
    "learning rate": ("3e-6", "3e-6", "~ stage 1"),
    "KL coefficient beta": ("0.001", "0.001", "~ stage 1"),
    "clip ratio epsilon": ("-", "10", "~ stage 1"),
    "sampling temperature": ("1", "1", "0.7"),
    "outputs per question G": ("16", "16", "~ stage 1"),
    "max output length (tokens)": ("32,768; 65,536 from 8.2k", "32,768", "~ stage 1"),
    "questions per training step": ("32", "32", "~ stage 1"),
    "outputs per rollout": ("8,192", "8,192", "~ stage 1"),
    "mini-batches per rollout": ("16", "16", "~ stage 1"),
    "inner epochs per rollout": ("1", "1", "~ stage 1"),
    "reference replaced every": ("400 steps", "400 steps", "~ stage 1"),
    "training steps": ("10,400 = 1.6 epochs", "-", "1,700"),
    "rewards": ("accuracy + format", "+ language consistency", "+ reward models*"),
}
print(f"{'setting':<28} {'R1-Zero':<26} {'R1, RL stage 1':<24} R1, RL stage 2")
for setting, (zero, stage_1, stage_2) in r1_stated.items():
    print(f"{setting:<28} {zero:<26} {stage_1:<24} {stage_2}")
print("* for general (non-reasoning) data, in the last 400 of the 1,700 steps")

# %% [markdown]
# The counts fit together in one way only, and the next cell works it out. A training step
# is 32 questions with 16 outputs each. A rollout is 8,192 outputs, split into 16
# mini-batches and used once. So a mini-batch is exactly one training step, that is one
# optimizer step, and each rollout feeds 16 of them in a row.

# %%
questions_per_step, outputs_per_question, mini_batches, inner_epochs = 32, 16, 16, 1
outputs_per_step = questions_per_step * outputs_per_question
outputs_per_rollout = questions_per_step * outputs_per_question * mini_batches
optimizer_steps_per_rollout = mini_batches * inner_epochs
reference_every_steps, r1_zero_steps, r1_zero_epochs, r1_epsilon = 400, 10_400, 1.6, 10
print(f"outputs per training step  = {questions_per_step} x {outputs_per_question} = {outputs_per_step} "
      f"(the paper's 'training batch size of 512')")
print(f"outputs per rollout        = {questions_per_step} x {outputs_per_question} x {mini_batches} = "
      f"{outputs_per_rollout:,} (the paper's 8,192)")
print(f"questions per rollout      = {outputs_per_rollout:,} / {outputs_per_question} = "
      f"{outputs_per_rollout // outputs_per_question}")
print(f"optimizer steps per rollout = {optimizer_steps_per_rollout}, of which "
      f"{optimizer_steps_per_rollout - 1} train on outputs an earlier policy sampled")
print(f"reference replaced every {reference_every_steps} steps = every "
      f"{reference_every_steps // optimizer_steps_per_rollout} rollouts")
print(f"R1-Zero: {r1_zero_steps:,} steps = {r1_zero_steps // optimizer_steps_per_rollout} rollouts, "
      f"{r1_zero_steps * questions_per_step:,} questions drawn = {r1_zero_epochs} epochs of about "
      f"{r1_zero_steps * questions_per_step / r1_zero_epochs:,.0f} questions")
print(f"clip ratio {r1_epsilon}: ratios clipped to [{1 - r1_epsilon}, {1 + r1_epsilon}]")

# %% [markdown]
# Two consequences are worth a sentence each. First, fifteen of every 16 optimizer steps
# train on outputs that an earlier policy sampled. That is what the ratio and the clip are
# for (chapter 3 shows why $\pi_{\theta_\text{old}}$ must then stay the sampler for the whole
# rollout). Second, a clip ratio of 10 clips ratios to [-9, 11]. A ratio is never negative,
# so the lower bound never binds. The upper one only stops a token with $A > 0$ whose
# probability has grown elevenfold since sampling. R1's trust region is wide open. The paper
# stresses that the value matters: a lower one can cut off the gradients of many tokens and
# degrade the model, and a higher one can make training unstable.
#
# `configs/r1-recipe-tiny.toml` applies this recipe (R1's first RL stage) to the tiny
# arithmetic task of chapters 5 and 6. In grpo_edu a training step (`steps`) is one rollout.
# So R1's counts map onto the config's keys as below, and the config's comments say why four
# values differ.

# %%
from grpo_edu.config import TrainConfig

tiny_r1 = TrainConfig.from_toml(home.path("configs/r1-recipe-tiny.toml"))
r1_as_keys = {  # grpo_edu key: R1's first RL stage in that key's units
    "prompts_per_step": outputs_per_rollout // outputs_per_question,
    "num_generations": outputs_per_question,
    "num_mini_batches": mini_batches,
    "num_iterations": inner_epochs,
    "learning_rate": 3e-6,
    "beta": 0.001,
    "epsilon": r1_epsilon,
    "epsilon_high": r1_epsilon,
    "temperature": 1.0,
    "ref_sync_steps": reference_every_steps // optimizer_steps_per_rollout,
    "max_completion_length": 32_768,
}
print(f"{'key':<22} {'R1':>10} {'r1-recipe-tiny':>15}")
for key, r1_value in r1_as_keys.items():
    ours = tiny_r1.value(key)
    print(f"{key:<22} {r1_value:>10g} {ours:>15g}   {'' if ours == r1_value else 'changed'}".rstrip())
drawn = tiny_r1.optimisation.steps * tiny_r1.rollout.prompts_per_step
print(f"steps: {tiny_r1.optimisation.steps} rollouts = {tiny_r1.optimisation.steps * tiny_r1.optimisation.num_mini_batches} optimizer steps, "
      f"{drawn:,} prompts drawn, {drawn * tiny_r1.rollout.num_generations:,} completions")

# %% [markdown]
# The length limit shrinks because a correct completion of the tiny task has at most ten
# tokens. The learning rate grows because 3e-6 was chosen for DeepSeek-V3-Base, the
# 671-billion-parameter model R1 starts from. Learning rates do not carry across a change of
# scale that large, and 3e-4 is the tiny policy's tuned value. `grpo_loss` requires
# $\varepsilon$ < 1, and 0.999 puts the lower bound at 0.001. It binds there only on a token
# whose probability fell a thousandfold since sampling. Instead of R1-Zero's 650 rollouts,
# the config keeps its 1.6 epochs: 31 rollouts of 512 prompts draw 15,872 times from the
# 10,000 training problems the trainer samples from (`grpo_edu.environment.tasks.TRAIN_POOL`).
# %% [markdown]
# ## Where the textbook section and its own listing disagree
#
# The textbook section prints numbers next to its listing. Running the listing shows which
# of them it does not produce. Here the listing runs as `grpo_edu.algorithm.reference` on the
# same inputs, which gives the same values as the listing's own code. Each row: what the
# section prints, and what the computation gives at the same precision.

# %%
kl_example = reference.k3(-0.600, -0.476)[()]
textbook_claims = [
    # (what, printed by the textbook, computed, decimals)
    ("mean(r)", 0.45, mean, 2),
    ("population std", 0.384, std_population, 3),
    ("A_1..A_4", [1.172, -0.391, -1.432, 0.651], adv_population, 3),
    ("log-softmax of o_1 token 1 row", [-0.476, -1.776, -1.276], update.responses[0].log_probs[0], 3),
    ("log pi_new of o_1 tokens", [-0.476, -0.176, -0.376], update.responses[0].new_logp, 3),
    ("ratios of o_1", [1.024, 1.105, 1.052], update.responses[0].ratio, 3),
    ("rho*A of o_1", [1.200, 1.295, 1.232], update.responses[0].surrogate, 3),
    ("mean objective of o_1", 1.242, update.responses[0].objective_mean, 3),
    ("k3 for d = -0.124 (step 5)", 0.0074, kl_example, 4),
    ("k3 for d = -0.124 (listing note)", 0.0078, kl_example, 4),
    ("k3 for d = -0.124 (PyTorch note)", 0.0073, kl_example, 4),
    ("rho*A for invented log ratio +0.25", -1.838, illustration_surrogate[0], 3),
    ("mean objective, invented o_3", -1.492, illustration_objective.mean(), 3),
    ("per-response losses", [-1.242, 0.402, 1.492, -0.651], [t.loss for t in update.responses], 3),
    ("group loss", 0.000, update.loss, 3),
]
print(f"{'quantity':<36} {'textbook prints':<31} {'computed':<31} agree")
for what, claimed, computed, decimals in textbook_claims:
    claimed, computed = np.atleast_1d(claimed), np.round(np.atleast_1d(computed), decimals)
    agree = np.allclose(claimed, computed, atol=0.5 * 10 ** -decimals)
    show = lambda v: ", ".join(f"{x:.{decimals}f}" for x in v)
    print(f"{what:<36} {show(claimed):<31} {show(computed):<31} {'yes' if agree else 'NO'}")

# %% [markdown]
# What the table shows:
#
# - The group statistics and advantages agree: the section's arithmetic for step 1 is right.
# - Everything downstream of the logits disagrees. The section's log-softmax row
#   (-0.476, -1.776, -1.276) is the logits minus 1.576. But the log-sum-exp of that row is
#   1.6434, so the printed row is not a distribution: its probabilities sum to 1.0697 (see
#   below). The printed ratios and the printed per-response losses describe logits that are
#   not the ones in the listing.
# - The section prints three values for the same k3 term (0.0074, 0.0078, 0.0073). Only the
#   first is right at four decimals.
# - With its invented log-ratio of +0.25 for $o_3$, the section prints -1.838, where 1.2840
#   times -1.4321 gives -1.839. Its mean, -1.492, survives the rounding.
# - The section's group loss of about 0.000 is true only for a fresh rollout (step 7). On the
#   listing's drifted logits the loss is +0.1048.
# - Its two listings also disagree with each other on the std (step 1).

# %%
printed_row = np.array([-0.476, -1.776, -1.276])
print(f"sum of exp(printed row) = {np.exp(printed_row).sum():.4f}; "
      f"logits minus printed row = {new_logits[0][0] - printed_row}; "
      f"log-sum-exp of the logits = {np.log(np.exp(new_logits[0][0]).sum()):.4f}")

# %% [markdown]
# ## What you learned
#
# - GRPO's advantage is each reward minus the group's mean, over the group's std; the advantages of a group sum to zero.
# - The population and the sample std differ by the factor $\sqrt{G/(G-1)}$. Under plain gradient descent that is a smaller step and a larger $\beta$; under Adam, only the KL term's weight changes.
# - A token clips only when it has moved past the range in the direction its advantage wants; the clip never stops a correction.
# - k3 is never negative and, on tokens from $\pi_\theta$, unbiased; its mean gradient is that of $\mathrm{KL}(\pi_\text{ref} \,\|\, \pi_\theta)$.
# - On a fresh rollout the loss is zero, but the gradient is not.
# - R1 trained with $\beta$ = 0.001 and a clip ratio of 10, not the textbook section's 0.04 and 0.2.
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
# Each exercise has a checker in `grpo_edu.exercises.ch01` that runs your answer on several
# cases. It names each case that fails and how your answer is wrong there: its shape, its
# sign, too large or too small, off by a factor, NaN. It never gives the right value. Each
# exercise has a hint and a worked solution (for the open question, a written answer),
# folded: open them when you want them.
#
# **1.1 Group advantages.** Write `my_group_advantages(rewards, std)` for one group:
# `(r - mean) / (std + 1e-8)`, with `std` either `"population"` or `"sample"`. The first
# attempt below has a bug that the textbook section's two listings share between them. Run
# the checker, read which cases fail, and fix it. Then make sure an all-equal group returns
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
# (the pairs with A > 0, those with A < 0), but not which. Naming a wrong yes-or-no would
# give its answer away.
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
# estimate, then check it. Bonus: sample tokens from step 5's $\pi_\theta$. Show that the
# mean of k3 over samples approaches the exact KL, while k1 = $-d$ takes negative values on
# single samples. Then sample from its $\pi_{\theta_\text{old}}$ instead, and watch the
# mean settle somewhere else.
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
