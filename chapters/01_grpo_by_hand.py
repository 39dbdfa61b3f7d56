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
# GRPO (Group Relative Policy Optimization) trains a language model by sampling a *group*
# of G responses to the same prompt, scoring each response with one scalar reward, and
# pushing up the responses that beat their siblings. There is no value network: the
# baseline is the group's own mean reward.
#
# This chapter follows one GRPO update of one prompt with G = 4 responses, in plain NumPy,
# and prints every intermediate number. The inputs are the worked example of a popular
# textbook section on implementing GRPO (rewards, token ids, old and reference
# log-probabilities, new-policy logits over a 3-token vocabulary). That section prints
# numbers that its own listing does not produce; at the end of the chapter we put them side
# by side, so a reader with the textbook open can see exactly where.
#
# Every number below is computed by `grpo_edu.reference`, the loop-per-response NumPy
# implementation that the PyTorch code of later chapters is tested against, and every
# number in the prose is one that a cell prints (the book's CI checks both).

# %%
import inspect

import numpy as np

from grpo_edu import reference

np.set_printoptions(precision=4, suppress=True, floatmode="fixed")


def row(values, width=8):
    """Format numbers with 4 decimals in fixed-width columns."""
    return " ".join(f"{v:+{width}.4f}" for v in values)


# %% [markdown]
# ## The objective
#
# For a prompt $q$ the old policy $\pi_{\theta_\text{old}}$ samples responses
# $o_1, \dots, o_G$ with rewards $r_1, \dots, r_G$. With $\rho_{i,t}$ the ratio of the new to
# the old probability of token $t$ of response $i$, GRPO maximises
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
# frozen reference policy. DeepSeek-R1 used $\varepsilon$ = 0.2 and $\beta$ = 0.04; so do we.
#
# ## The worked example
#
# One prompt, four responses of 3, 2, 2 and 2 tokens over a vocabulary of 3 tokens. The
# numbers are the textbook listing's, unchanged.

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

update = reference.grpo_update(token_ids, new_logits, old_logp, ref_logp, rewards,
                               epsilon=epsilon, beta=beta)
print(f"G = {G}, response lengths = {[len(t) for t in token_ids]}, "
      f"tokens in the group = {sum(len(t) for t in token_ids)}")

# %% [markdown]
# ## Step 1. Group mean, group std, advantages
#
# The baseline of each response is the mean reward of its group, and the spread is the
# group's standard deviation. There are two standard deviations in common use, and the
# textbook uses both without saying so: its NumPy listing calls `rewards.std()` (divide by
# G, the *population* std) and its PyTorch listing calls `rewards.std(dim=1)` (divide by
# G - 1, the *sample* std with Bessel's correction, which is also what TRL uses).

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
# The group mean is 0.45 and the population std is 0.3841, so the best response, $o_1$, gets
# $A_1$ = +1.1717 and the worst, $o_3$, gets $A_3$ = -1.4321. The advantages sum to zero:
# whatever pushes some responses up pushes others down by the same total.
#
# What the choice of std changes: with the sample std (0.4435) every advantage is smaller by
# the same factor, 1.1547 for G = 4. Within one group that is a uniform rescaling of the
# policy gradient, the same as a learning rate smaller by that factor; the clip range acts on
# the ratio, not on $A$, so which tokens clip does not change. It matters when you compare
# numbers across implementations (an advantage of +1.1717 here is +1.0147 in TRL) and when
# groups of different sizes share a batch, since the factor depends on G. We use the
# population std in this chapter, as the textbook's worked example does.
#
# ## Step 2. Log-probabilities of the sampled tokens under the new policy
#
# The new policy's logits give a distribution over the vocabulary at every position. A
# numerically stable log-softmax subtracts the row maximum before exponentiating:

# %%
print(inspect.getsource(reference.log_softmax))

# %%
for i, terms in enumerate(update.responses):
    print(f"o_{i + 1}: token ids {token_ids[i]}")
    for t, (logits_row, logp_row) in enumerate(zip(new_logits[i], terms.log_probs)):
        print(f"   t={t + 1}  logits [{row(logits_row, 6)}]  ->  log-softmax [{row(logp_row)}]"
              f"  ->  log pi(token {token_ids[i][t]}) = {terms.new_logp[t]:+.4f}")

# %% [markdown]
# The first row, logits (1.10, -0.20, 0.30), has log-softmax (-0.5434, -1.8434, -1.3434):
# each entry is its logit minus the same log-sum-exp, 1.6434. Sampled token 0 therefore has
# log-probability -0.5434 under the new policy.
#
# ## Step 3. Ratios
#
# The ratio compares the new and the old probability of each sampled token. It is computed
# in log space and exponentiated once, so tiny probabilities never underflow:
# $\rho_{i,t} = \exp(\log\pi_\theta - \log\pi_{\theta_\text{old}})$.

# %%
print("response  token   log pi_new   log pi_old   log ratio    ratio")
for i, terms in enumerate(update.responses):
    for t in range(len(token_ids[i])):
        print(f"o_{i + 1}       t={t + 1}     {terms.new_logp[t]:+.4f}      {terms.old_logp[t]:+.4f}"
              f"      {terms.new_logp[t] - terms.old_logp[t]:+.4f}     {terms.ratio[t]:.4f}")
all_ratios = np.concatenate([terms.ratio for terms in update.responses])
outside = (all_ratios < 1 - epsilon) | (all_ratios > 1 + epsilon)
print(f"\n{outside.sum()} of {len(all_ratios)} ratios lie outside [{1 - epsilon:.1f}, {1 + epsilon:.1f}]; "
      f"range {all_ratios.min():.4f} to {all_ratios.max():.4f}")

# %% [markdown]
# These logits are far from the old policy: five of the nine ratios lie outside the trust
# region [0.8, 1.2], and they range from 0.8608 to 2.0894. In a real run the first update of a fresh
# rollout starts with every ratio at exactly 1 (step 7).
#
# ## Step 4. The clipped surrogate, token by token
#
# Each token contributes $\min(\rho A,\ \operatorname{clip}(\rho, 1-\varepsilon, 1+\varepsilon) A)$.
# The clipped term is a constant in $\theta$, so when the minimum picks it strictly, the
# token contributes no gradient: we call that token *clipped*.

# %%
print("response  A        token  ratio    rho*A     clip(rho)*A   min       clipped  why")
for i, terms in enumerate(update.responses):
    for t in range(len(token_ids[i])):
        rho, A = terms.ratio[t], terms.advantage
        if terms.clipped[t]:
            why = "A > 0 and rho > 1 + eps: gain capped" if A > 0 else "A < 0 and rho < 1 - eps: penalty capped"
        elif rho > 1 + epsilon:
            why = "A < 0 and rho > 1 + eps: full penalty, keeps its gradient"
        elif rho < 1 - epsilon:
            why = "A > 0 and rho < 1 - eps: full loss, keeps its gradient"
        else:
            why = "inside [1 - eps, 1 + eps]"
        print(f"o_{i + 1}       {A:+.4f}  t={t + 1}    {rho:.4f}   {terms.surrogate[t]:+.4f}   "
              f"{terms.clipped_surrogate[t]:+.4f}       {terms.objective[t]:+.4f}   "
              f"{'yes' if terms.clipped[t] else 'no ':<7}  {why}")
print(f"\nclipped tokens: {sum(int(terms.clipped.sum()) for terms in update.responses)} of {len(all_ratios)}")

# %% [markdown]
# Two tokens clip, both in responses with $A > 0$ whose ratio already exceeds 1.2: token 3
# of $o_1$ (ratio 1.5945) and token 2 of $o_4$ (ratio 2.0894). The new policy already made
# these good tokens much more likely than the sampler did; PPO's clip stops it from
# collecting more credit for moving further, and the token's gradient is zero.
#
# The tokens of $o_2$ and $o_3$ have $A < 0$ and ratios above 1.2. The minimum keeps the
# *unclipped* term (for example $o_2$, token 1: 1.8767 times -0.3906 is -0.7330, below the
# clipped -0.4687). The policy made a bad token more likely, and it pays the full penalty,
# with gradient. The clip is asymmetric by design: it limits how much a token can gain, never
# how much it is punished for moving the wrong way.
#
# The one case this example lacks, $A < 0$ with $\rho$ < 0.8, is the mirror image: the
# policy already moved away from a bad token, and the clip caps that reward. The textbook
# illustrates it with invented log-ratios for $o_3$, +0.25 and -0.30, instead of the ratios
# its logits give; we compute that illustration here too:

# %%
A3 = adv_population[2]
illustration_ratio = np.exp(np.array([0.25, -0.30]))
surrogate = illustration_ratio * A3
clipped_surrogate = np.clip(illustration_ratio, 1 - epsilon, 1 + epsilon) * A3
objective = np.minimum(surrogate, clipped_surrogate)
print(f"A_3 = {A3:+.4f}, log ratios (+0.25, -0.30) -> ratios [{row(illustration_ratio)}]")
print(f"rho*A       = [{row(surrogate)}]")
print(f"clip(rho)*A = [{row(clipped_surrogate)}]")
print(f"min         = [{row(objective)}]   clipped: {clipped_surrogate < surrogate}")
print(f"mean objective = {objective.mean():+.4f}")

# %% [markdown]
# ## Step 5. KL to the reference, per token (k3)
#
# With $d = \log\pi_\text{ref} - \log\pi_\theta$, the k3 estimator is $e^{d} - d - 1$. It is
# never negative (since $e^d \ge 1 + d$), zero exactly when the two log-probabilities agree,
# and its expectation under $\pi_\theta$ is the true $\mathrm{KL}(\pi_\theta \,\|\, \pi_\text{ref})$.

# %%
print(inspect.getsource(reference.k3))
print("response  token   log pi_ref   log pi_new   d = ref - new    k3")
for i, terms in enumerate(update.responses):
    for t in range(len(token_ids[i])):
        d = terms.ref_logp[t] - terms.new_logp[t]
        print(f"o_{i + 1}       t={t + 1}     {terms.ref_logp[t]:+.4f}      {terms.new_logp[t]:+.4f}"
              f"      {d:+.4f}        {terms.kl[t]:.5f}")

# %% [markdown]
# The first token has $d$ = -0.0566 and k3 = 0.00157; the largest, token 2 of $o_4$, has
# $d$ = -0.6369 and k3 = 0.16581. Multiplied by $\beta$ = 0.04, the KL term is a gentle
# leash next to objectives of order 1.
#
# ## Step 6. Per-response loss and the group loss
#
# Each response's loss is the token mean of $-\text{objective} + \beta\,\text{k3}$; the group
# loss is the mean over the G responses. Every response weighs the same whatever its length
# (chapter 4 shows what that does to long responses).

# %%
print("response  mean objective   mean k3    loss = -objective + beta * k3")
for i, terms in enumerate(update.responses):
    print(f"o_{i + 1}       {terms.objective_mean:+.4f}          {terms.kl_mean:.5f}    {terms.loss:+.4f}")
print(f"\ngroup loss = mean over {G} responses = {update.loss:+.4f}")

# %% [markdown]
# The group loss is +0.1048. It is positive because the new logits moved two of the bad
# responses' tokens up ($o_3$'s objective is -1.9152) while the clip capped what the good
# responses could earn.
#
# The reference implementation, a loop over responses that reads top to bottom:

# %%
print(inspect.getsource(reference.grpo_update))

# %% [markdown]
# ## Step 7. A fresh rollout: zero loss, non-zero gradient
#
# In a real run the first update on a new rollout uses the policy that just sampled it, so
# $\pi_\theta = \pi_{\theta_\text{old}}$ and every ratio is exactly 1. Take the new policy's
# own log-probabilities as the old ones (and, as at the very start of training, as the
# reference):

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
# The loss is -0.0000 (zero up to rounding): with every ratio 1, each response's objective is
# its advantage, and the advantages sum to zero. The gradient is not zero. The derivative of
# $\rho A$ with respect to $\log\pi_\theta$ is $\rho A = A$, so each token's sampled logit is
# pushed up in proportion to its response's advantage divided by G and by the response's
# length (and by one minus the token's probability, from the softmax): for token 1 of
# $o_1$ the sampled logit gets -0.0409 (gradient descent raises it) while token 1 of $o_3$
# gets +0.0695 (lowered). The gradient's norm over all logits is 0.1527. The loss value says nothing about learning
# here; the gradient does all the work. A first-step loss far from 0, or a first-step ratio
# far from 1, means the sampler and the trainer compute log-probabilities differently
# (temperature, dtype, or a mask off by one).
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
# ## Where the textbook and its own listing disagree
#
# The textbook section prints numbers next to its listing. Running the listing (here:
# `grpo_edu.reference` on the same inputs, which gives the same values as the listing's own
# code) shows which printed numbers it does not produce. Each row: what the text prints,
# what the computation gives at the same precision.

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
    ("rho*A for invented log ratio +0.25", -1.838, surrogate[0], 3),
    ("mean objective, invented o_3", -1.492, objective.mean(), 3),
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
# - The group statistics and advantages agree: the text's arithmetic for step 1 is right.
# - Everything downstream of the logits disagrees. The text's log-softmax row
#   (-0.476, -1.776, -1.276) is the logits minus 1.576, but the log-sum-exp of that row is
#   1.6434, so the printed row is not a distribution (its probabilities sum to 1.0697, see
#   below). The printed ratios and the printed per-response losses describe logits that are
#   not the ones in the listing.
# - The text prints three values for the same k3 term (0.0074, 0.0078, 0.0073); only the
#   first is right at four decimals.
# - With its invented log-ratio of +0.25 for $o_3$, the text prints -1.838 where
#   1.2840 times -1.4321 gives -1.839 (its mean, -1.492, survives the rounding).
# - The text's group loss of about 0.000 is true only for a fresh rollout (step 7); on the
#   listing's drifted logits the loss is +0.1048.
# - Its two listings also disagree with each other on the std (step 1).

# %%
printed_row = np.array([-0.476, -1.776, -1.276])
print(f"sum of exp(printed row) = {np.exp(printed_row).sum():.4f}; "
      f"logits minus printed row = {new_logits[0][0] - printed_row}; "
      f"log-sum-exp of the logits = {np.log(np.exp(new_logits[0][0]).sum()):.4f}")

# %% [markdown]
# ## Exercises
#
# Each exercise has a checker in `grpo_edu.exercises.ch01` that runs your answer on several
# cases and names each case that fails, with the expected and the actual value.
#
# **1.1 Group advantages.** Write `my_group_advantages(rewards, std)` for one group:
# `(r - mean) / (std + 1e-8)`, with `std` either `"population"` or `"sample"`. The first
# attempt below has a bug that the textbook's two listings share between them; run the
# checker, read which cases fail, and fix it. Then make sure an all-equal group returns
# zeros, not NaN.

# %%
from grpo_edu.exercises import ch01


def my_group_advantages(rewards, std):
    return (rewards - rewards.mean()) / (rewards.std() + 1e-8)  # ignores `std`: fix me


ch01.check_group_advantages(my_group_advantages)

# %% [markdown]
# **1.2 Which tokens clip?** For each (ratio, advantage) pair in `ch01.CLIP_QUIZ`, with
# $\varepsilon$ = 0.2, predict whether the token is clipped (the minimum strictly picks the
# clipped term, so the token gets no gradient). Write your answers as a list of 8 booleans,
# then check them.

# %%
print(ch01.CLIP_QUIZ)
my_predictions = []  # fill in 8 booleans, one per pair
ch01.check_clip_predictions(my_predictions)

# %% [markdown]
# **1.3 The k3 estimator.** Write `my_k3(log_ref, log_new)` returning the per-token k3
# estimate, then check it. Bonus: show numerically, by sampling tokens from a categorical
# distribution, that its mean over samples approaches the exact KL while k1 = $-d$ takes
# negative values on single samples.

# %%
def my_k3(log_ref, log_new):
    raise NotImplementedError("your k3 here")


ch01.check_k3(my_k3)

# %% [markdown]
# **1.4 Predict, then compute.** Before running anything: if every reward of the example is
# multiplied by 10, which numbers of steps 1 to 7 change? Check your answer with
# `reference.grpo_update` (hint: only the advantages' scale could change, and it does not).
