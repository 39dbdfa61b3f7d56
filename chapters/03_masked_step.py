# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 3. The masked (B, G, S) step
#
# > **You will learn**
# > - how a batch is padded into (B, G, S) tensors, and what each mask means
# > - the off-by-one between logits and tokens, and why that bug hides
# > - one full training step on a real transformer, checked against chapter 1
# > - why the old policy must stay the sampler for a whole rollout
# > - why the first step's loss is 0 while its gradient is not
# >
# > **You need first**: chapter 1 (the objective).
# >
# > **Reading time**: about 28 minutes. **Compute**: at most 60 s on a 2-core CPU. [Glossary](../docs/glossary.md) · [Notation](../docs/notation.md)
#
# Chapter 1 computed one GRPO (Group Relative Policy Optimization) update of one group with
# a Python loop over responses. Each response was its own array, so nothing could leak
# between them. A trainer cannot afford loops. It holds B prompts with G completions each
# in padded tensors of shape (B, G, S), and runs a real transformer over them. Masks say
# which entries are tokens and which are padding. Almost every GRPO bug lives
# in those masks and in one off-by-one between logits and tokens.
#
# This chapter builds that step on a tiny Llama: a batch of B = 2 prompts with G = 3
# completions each, then one full step. The step runs the forward pass, the per-token
# log-probs, the ratio and its clip, the Kullback-Leibler (KL) penalty, the aggregation, the
# backward pass and the optimizer step. Every number is checked against chapter 1's NumPy
# reference, `grpo_edu.algorithm.reference`, and by a float64 gradcheck.
#
# Shapes: B prompts, G completions per prompt, P prompt columns, S completion columns,
# T = P + S, V vocabulary entries, N = B G completions in all.

# %%
import copy
import inspect

import numpy as np
import torch

from grpo_edu.algorithm import reference, worked_example
from grpo_edu.algorithm.advantages import group_advantages
from grpo_edu.training.batch import RolloutBatch, pad_rollouts
from grpo_edu.algorithm.logprobs import (completion_logprobs, position_ids_from_attention_mask,
                               token_logprobs)
from grpo_edu.algorithm.kl import kl_estimate
from grpo_edu.algorithm.loss import grpo_loss
from grpo_edu.policy.models import char_tokenizer, tiny_llama
from grpo_edu.environment.rewards import combined_reward

torch.set_num_threads(1)
torch.manual_seed(0)
torch.set_printoptions(precision=4, sci_mode=False)


def f4(x):
    """4 decimals with a sign; values that round to zero print as +0.0000 on every machine."""
    return f"{0.0 if abs(x) < 5e-5 else x:+.4f}"

# %% [markdown]
# ## A tiny Llama, built from a local config
#
# The policy is a transformers `LlamaForCausalLM`: the same class as Llama 3 or Qwen's
# relatives, built from a config in `grpo_edu.policy.models` with 2 layers of width 128 and a
# character-level tokenizer. Nothing is downloaded; the weights are a seeded random
# initialisation, which is all this chapter needs: the mechanics of a step do not depend
# on what the model knows.

# %%
tokenizer = char_tokenizer()
policy = tiny_llama(tokenizer, seed=0)
config = policy.config
print(f"{type(policy).__name__}: {config.num_hidden_layers} layers, width {config.hidden_size}, "
      f"{config.num_attention_heads} heads, vocabulary V = {config.vocab_size}, "
      f"{sum(p.numel() for p in policy.parameters()):,} parameters")
print(f"pad id {tokenizer.pad_token_id} {tokenizer.pad_token!r}, eos id {tokenizer.eos_token_id} "
      f"{tokenizer.eos_token!r}, markup tokens {tokenizer.convert_ids_to_tokens([3, 4, 5])}")

# %% [markdown]
# ## A batch of B = 2 prompts, G = 3 completions each
#
# In training, a sampler produces the completions (chapter 6). Here we write six
# plausible ones by hand, so the masks are easy to read: short and long, right and wrong,
# with and without the `<think>...</think>` format. Rewards are DeepSeek-R1's rule-based
# accuracy + format (`grpo_edu.environment.rewards`): 1 for a correct `\boxed{}` answer, 1 for the
# `<think>` format, so a correct, well-formatted completion scores 2.

# %%
prompts = ["12+7=", "3*4="]
answers = ["19", "12"]
completions = [
    ["<think>12+7=19</think>\\boxed{19}", "\\boxed{19}", "\\boxed{21}"],
    ["\\boxed{12}", "<think>3*4=12</think>\\boxed{12}", "7"],
]
B, G = len(prompts), len(completions[0])


def encode(text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


prompt_ids = [encode(p) for p in prompts]
completion_ids = [[encode(c) + [tokenizer.eos_token_id] for c in group] for group in completions]
reward_fn = combined_reward()
rewards = torch.tensor([reward_fn(group, answer=answer) for group, answer in zip(completions, answers)])
for b in range(B):
    for g in range(G):
        print(f"prompt {b} {prompts[b]!r:9} completion {g}: {len(completion_ids[b][g]):2d} tokens, "
              f"reward {rewards[b, g]:.0f}   {completions[b][g]!r}")

# %% [markdown]
# ### Padding, and the seam between prompt and completion
#
# `pad_rollouts` lays the batch out the way `generate` returns it: prompts **left**-padded
# to the longest prompt P, completions **right**-padded to the longest completion S. The
# two paddings face away from each other, so every prompt ends at column P - 1 and every
# completion starts at column P: one seam for the whole batch. Each prompt is repeated G
# times, one row per completion.

# %%
# A schematic of a padded batch (not this batch): prompts padded on the left, completions on the right.
from grpo_edu.book import schematics

schematics.bgs_tensor()

# %%
input_ids, attention_mask, completion_mask = pad_rollouts(prompt_ids, completion_ids, tokenizer.pad_token_id)
P = input_ids.shape[-1] - completion_mask.shape[-1]
S = completion_mask.shape[-1]
print(f"input_ids {tuple(input_ids.shape)} = (B, G, T), attention_mask {tuple(attention_mask.shape)}, "
      f"completion_mask {tuple(completion_mask.shape)} = (B, G, S); P = {P}, S = {S}, T = {P + S}")


# %% [markdown]
# Row (prompt 1, completion 0), column by column, shows four things. They are the decoded
# token, the attention mask, the completion mask (defined on the S completion columns
# only), and the position id that `generate` gave the token. The last column states the one fact that causes most bugs:
# **the logits at column j predict the token at column j + 1**. The completion's first
# token, at column P, is scored by the logits at column P - 1, the last prompt token. The
# logits at the last column predict nothing we have.

# %%
def show_row(b, g):
    ids, attention = input_ids[b, g], attention_mask[b, g]
    positions = position_ids_from_attention_mask(attention)
    print(f"{'column':>6} {'token':>9} {'attention':>9} {'completion':>10} {'position':>8}   scored by logits at")
    for j in range(P + S):
        token = tokenizer.convert_ids_to_tokens(int(ids[j]))
        in_completion = completion_mask[b, g, j - P].item() if j >= P else "-"
        role = ("prompt padding" if not attention[j] and j < P else "prompt" if j < P
                else f"column {j - 1}" if attention[j] else "completion padding")
        print(f"{j:>6} {token!r:>9} {attention[j].item():>9} {in_completion!s:>10} {positions[j].item():>8}   {role}")


show_row(1, 0)

# %% [markdown]
# Three things to read off the table. The prompt `3*4=` is 4 characters and P is 5, so
# column 0 is padding. Its position id is 0, like the first real token's: positions count
# real tokens, as in `generate`. The completion `\boxed{12}<eos>` is 5 tokens
# (`\boxed{` is one); columns 10 to 18 are padding, with attention 0 and completion mask
# 0. And the end-of-sequence (EOS) token is a completion token: it was sampled, so its
# log-probability is trained (the model learns when to stop).
#
# ### The off-by-one, measured
#
# Take the logits of the whole batch and score the completion tokens twice. Once with the
# logits one column to the left (right), and once with the logits at the token's own
# column (the classic mistake). The check is the row run alone, unpadded and unbatched.

# %%
flat_ids, flat_attention = input_ids.view(B * G, -1), attention_mask.view(B * G, -1)
with torch.no_grad():
    logits = policy(flat_ids, attention_mask=flat_attention,
                    position_ids=position_ids_from_attention_mask(flat_attention)).logits
    targets = flat_ids[:, P:]
    right = token_logprobs(logits[:, P - 1:-1], targets)      # logits at j - 1 score token j
    wrong = token_logprobs(logits[:, P:], targets)            # logits at j score token j
    row = 3                                                   # prompt 1, completion 0
    alone = torch.tensor([prompt_ids[1] + completion_ids[1][0]])
    alone_logp = torch.log_softmax(policy(alone).logits[0], -1)
    n = len(completion_ids[1][0])
    expected = alone_logp[-n - 1:-1].gather(-1, alone[0, -n:, None]).squeeze(-1)
print("alone, unpadded ", [f"{v:.4f}" for v in expected.tolist()])
print("shifted (right) ", [f"{v:.4f}" for v in right[row, :n].tolist()])
print("unshifted (bug) ", [f"{v:.4f}" for v in wrong[row, :n].tolist()])
print(f"right == alone: {torch.allclose(right[row, :n], expected, atol=1e-5)}; "
      f"bug == alone: {torch.allclose(wrong[row, :n], expected, atol=1e-5)}")

# %% [markdown]
# The bug raises no error: the shapes agree, the numbers look like log-probabilities, and
# training runs. It just trains the wrong conditional. Here it even makes the numbers look
# *better*. This model ties its input and output embeddings, and the hidden state at a
# column still carries the embedding of the token it has just read. The LM head then
# scores that token highly. A bug that improves the numbers is the worst kind. `grpo_edu.algorithm.logprobs.completion_logprobs`
# does the shift once, with the position ids above, and asks the model for logits of the
# last S + 1 columns only (`logits_to_keep`), so the prompt's logits are never computed:

# %%
with torch.no_grad():
    old_logp = completion_logprobs(policy, input_ids, attention_mask, completion_mask)
print(f"old_logp {tuple(old_logp.shape)}; equals the shifted log-probs on real tokens: "
      f"{torch.allclose(old_logp.view(B * G, S)[completion_mask.view(B * G, S).bool()], right[completion_mask.view(B * G, S).bool()], atol=1e-6)}")
print(f"padding positions hold exactly 0: {bool((old_logp[completion_mask == 0] == 0).all())}")

# %% [markdown]
# The same off-by-one can hide in the mask. A completion mask cut from the attention mask
# one column too early, `attention_mask[..., P - 1:]`, has S + 1 columns and covers the
# last prompt token. `RolloutBatch` checks a batch's layout when it is built and says
# what is wrong:

# %%
advantages = group_advantages(rewards)
reference_policy = copy.deepcopy(policy).eval().requires_grad_(False)   # frozen pi_ref
with torch.no_grad():
    ref_logp = completion_logprobs(reference_policy, input_ids, attention_mask, completion_mask)

fields = dict(input_ids=input_ids, attention_mask=attention_mask, old_logp=old_logp, ref_logp=ref_logp,
              rewards=rewards, advantages=advantages)
try:
    RolloutBatch(completion_mask=attention_mask[..., P - 1:], **fields)
except ValueError as error:
    print(f"ValueError: {error}")
batch = RolloutBatch(completion_mask=completion_mask, **fields)
print(f"\nRolloutBatch: B = {batch.num_prompts}, G = {batch.group_size}, P = {batch.prompt_length}, "
      f"S = {batch.completion_length}, {batch.num_tokens} completion tokens")
print("advantages (population std, eps = 1e-8):")
print(advantages)

# %% [markdown]
# ## One full step
#
# The old policy is the one that sampled (here: the policy itself, before any update),
# and the reference policy is a frozen copy of the starting weights. On the first
# optimizer step after sampling, all three coincide. Now the step, piece by piece, on
# the flat (N, S) view of the batch.
#
# **Forward and per-token log-probs**, with gradients this time:

# %%
optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-4, weight_decay=0.0)
policy.train()
logp = completion_logprobs(policy, batch.input_ids, batch.attention_mask, batch.completion_mask)
logp.retain_grad()                                     # to look at d loss / d logp below
mask = batch.completion_mask.bool()
print(f"logp {tuple(logp.shape)}, requires grad: {logp.requires_grad}")
print(f"mean log-probability of a completion token: {logp[mask].mean():.4f} "
      f"(uniform over V would be {-np.log(config.vocab_size):.4f})")

# %% [markdown]
# **Ratio, clip, KL, aggregation.** The per-token objective is chapter 1's, evaluated on
# every entry of the (B, G, S) tensors at once; the advantage (B, G) broadcasts over S.
# Padding is multiplied by 0 before anything is summed, and the `grpo` aggregation is a
# mean over each completion's own tokens, then over the N completions.

# %%
epsilon, beta = 0.2, 0.04
A = batch.advantages[..., None]                                   # (B, G, 1)
ratio = torch.exp(logp - batch.old_logp)                          # (B, G, S)
clipped_ratio = torch.clamp(ratio, 1 - epsilon, 1 + epsilon)
policy_term = -torch.minimum(ratio * A, clipped_ratio * A)         # (B, G, S)
kl = kl_estimate(logp, batch.ref_logp, "k3")                      # (B, G, S)
per_token_loss = (policy_term + beta * kl) * mask
lengths = mask.sum(-1)                                            # (B, G): |o_i|
loss_inline = (per_token_loss.sum(-1) / lengths).mean()
print(f"completion lengths |o_i|:\n{lengths}")
print(f"loss = {f4(loss_inline.item())}")

# %% [markdown]
# The library computes the same thing in `grpo_edu.algorithm.loss.grpo_loss`, with the variants of
# chapter 4, input checks and the diagnostics. This cell holds the inline code above to
# the library's result, so the two cannot drift apart:

# %%
out = grpo_loss(logp, batch.old_logp, batch.advantages, batch.completion_mask,
                ref_logp=batch.ref_logp, beta=beta, epsilon=epsilon)
print(f"grpo_loss: {f4(out.loss.item())}; inline == library: "
      f"{torch.allclose(loss_inline, out.loss, rtol=0, atol=1e-7)}, "
      f"same per-token losses: {torch.allclose(per_token_loss, out.per_token_loss, rtol=0, atol=1e-7)}")

# %% [markdown]
# **Backward, gradient-norm clipping, optimizer step.** `clip_grad_norm_` returns the norm
# before clipping, and a trainer logs it. A norm that keeps hitting the limit means that
# the effective learning rate is the clip, not the one in the config.

# %%
out.loss.backward()
grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), max_norm=1.0)
print(f"loss {f4(out.loss.item())}, gradient norm before clipping {grad_norm.item():.4f} "
      f"(clipped to 1.0: {grad_norm.item() > 1.0})")
optimizer.step()
optimizer.zero_grad()

# %% [markdown]
# **Diagnostics.** `grpo_loss` returns what a trainer logs, as plain floats:

# %%
for name, value in out.metrics.items():
    print(f"{name:24} {f4(value)}")

# %% [markdown]
# Before the step the new policy *is* the old one: every ratio is 1 and nothing is clipped.
# approx_kl (how far the policy moved since sampling) and kl (to the reference) are both
# 0. After the step they are not. This is what a second pass over the same samples sees
# (`num_iterations` = 2 in TRL, Hugging Face's Transformer Reinforcement Learning library,
# or the next mini-batch):

# %%
with torch.no_grad():
    logp_after = completion_logprobs(policy, batch.input_ids, batch.attention_mask, batch.completion_mask)
    after = grpo_loss(logp_after, batch.old_logp, batch.advantages, batch.completion_mask,
                      ref_logp=batch.ref_logp, beta=beta, epsilon=epsilon)
for name in ("loss", "kl", "approx_kl", "ratio/min", "ratio/max", "clip_ratio/region"):
    print(f"{name:24} {f4(after.metrics[name])}")
change = ((logp_after - batch.old_logp) * mask).sum(-1) / lengths     # mean change per completion
print("\nmean change of log pi per token, by completion, next to its advantage:")
for b in range(B):
    for g in range(G):
        print(f"  prompt {b}, completion {g}:  A = {f4(batch.advantages[b, g].item())}   "
              f"change = {f4(change[b, g].item())}")

# %% [markdown]
# One step moved the completions the way their advantages say: those with $A > 0$ became
# more likely, those with $A < 0$ less likely. The two with A = 0 got no gradient of their
# own. They still moved a little, through the weights they share with the others: a
# token's gradient changes every probability the same weights produce.
#
# ## Why pi_old is the sampler, for the whole rollout
#
# A trainer rarely stops at one optimizer step per rollout. It may split the rollout into
# mini-batches of whole groups, one optimizer step each (DeepSeek-R1 split each rollout
# into 16). And it may pass over the rollout more than once: `num_iterations`, the epochs
# of PPO (Proximal Policy Optimization). Every step after the first computes its loss with
# a policy that has already moved, on completions it did not sample. That is exactly the
# situation the ratio and its clip exist for. They only work if
# $\pi_{\theta_\text{old}}$ stays the policy that sampled, from the first step on the
# rollout to the last.
#
# **A common mistake** is to do the opposite when a rollout gets several passes: to refresh
# the old log-probabilities at the start of every pass. Then the ratio does not drift far
# from 1, and the clipped fraction does not spike. But both symptoms are the trust region
# doing its job.
# Refreshing removes them by moving the ratio's reference point to wherever the policy has
# got to. Here are three choices of $\pi_{\theta_\text{old}}$ on this chapter's batch. Each
# trains from the sampling policy with the same AdamW settings, over 2 passes of 2
# mini-batches (one prompt's group each), so 4 optimizer steps per rollout:
#
# - `sampler`: the log-probs of the policy that sampled, fixed for the whole rollout;
# - `each pass`: recomputed from the current policy before every pass (the common mistake
#   above);
# - `each step`: the current policy's own log-probs, detached, in every step (the easy
#   mistake of writing `old_logp = logp.detach()`).

# %%
def passes_over_rollout(old_logp_from, num_iterations=2, num_mini_batches=2):
    """Train a copy of the sampling policy on `batch`; one row of metrics per optimizer step."""
    model = copy.deepcopy(reference_policy).requires_grad_(True).train()
    model_optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.0)
    parts = [batch.select(torch.isin(torch.arange(B), rows))   # whole groups per mini-batch
             for rows in torch.arange(B).chunk(num_mini_batches)]
    steps = []
    for iteration in range(num_iterations):
        if old_logp_from == "each pass":
            with torch.no_grad():
                pass_old_logp = [completion_logprobs(model, part.input_ids, part.attention_mask,
                                                     part.completion_mask) for part in parts]
        for mini_batch, part in enumerate(parts):
            logp_part = completion_logprobs(model, part.input_ids, part.attention_mask, part.completion_mask)
            if old_logp_from == "sampler":
                old_part = part.old_logp
            elif old_logp_from == "each pass":
                old_part = pass_old_logp[mini_batch]
            else:
                old_part = logp_part.detach()
            step_out = grpo_loss(logp_part, old_part, part.advantages, part.completion_mask,
                                 ref_logp=part.ref_logp, beta=beta, epsilon=epsilon)
            step_out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            model_optimizer.step()
            model_optimizer.zero_grad()
            steps.append((iteration + 1, mini_batch + 1, step_out.metrics))
    with torch.no_grad():   # where the policy ended up, seen from the sampler
        final_logp = completion_logprobs(model, batch.input_ids, batch.attention_mask, batch.completion_mask)
    moved = grpo_loss(final_logp, batch.old_logp, batch.advantages, batch.completion_mask,
                      epsilon=epsilon).metrics
    return steps, moved


runs = {name: passes_over_rollout(name) for name in ("sampler", "each pass", "each step")}
print(f"{'pi_old':<10} {'pass':>4} {'mini-batch':>10} {'ratio min':>10} {'ratio max':>10} {'clipped':>8}")
for name, (steps, _) in runs.items():
    for iteration, mini_batch, metrics in steps:
        print(f"{name:<10} {iteration:>4} {mini_batch:>10} {f4(metrics['ratio/min']):>10} "
              f"{f4(metrics['ratio/max']):>10} {metrics['clip_ratio/region']:>8.4f}")
print(f"\noptimizer steps in which the clip acted, of {len(runs['sampler'][0])}: "
      + ", ".join(f"{name} {sum(m['clip_ratio/region'] > 0 for *_, m in steps)}"
                  for name, (steps, _) in runs.items()))
print("after the rollout, measured against the sampler:")
for name, (_, metrics) in runs.items():
    print(f"  {name:<10} approx_kl {f4(metrics['approx_kl'])}, ratio {metrics['ratio/min']:.4f} to "
          f"{metrics['ratio/max']:.4f}")
ratio_gap = max(abs(m["ratio/max"] - 1) + abs(m["ratio/min"] - 1)
                for iteration, mini_batch, m in runs["each pass"][0] if mini_batch == 1)
print(f"'each pass', first step of each pass: largest |ratio - 1| = {ratio_gap:.1e}")
epochs = {name: passes_over_rollout(name, num_iterations=3, num_mini_batches=1)[0] for name in ("sampler", "each pass")}
print("3 passes of one mini-batch (PPO-style epochs), clipped share per step: "
      + "; ".join(f"{name} " + " ".join(f"{m['clip_ratio/region']:.4f}" for *_, m in steps)
                  for name, steps in epochs.items()))

# %% [markdown]
# With $\pi_{\theta_\text{old}}$ fixed at the sampler, the first step sees ratios of 1 and
# every later step sees how far the policy has drifted since sampling. In the second pass
# the ratios span 0.4854 to 1.8383. The clip stops 0.5833 of the first mini-batch's
# tokens: those that have already moved far enough in their advantage's direction.
# Refreshed before each pass, the ratio is exactly 1 again on the second pass's first
# step. So nothing the policy did in the first pass can be clipped there, and the clip acts
# in one step of four instead of two. Now take one mini-batch per pass: several PPO-style
# epochs over one rollout. There refreshing switches the clip off entirely: 0 clipped tokens in every pass, against 0.4091 and 0.5455 in the second and
# third passes with a fixed $\pi_{\theta_\text{old}}$. Computed inside each step, the ratio is 1
# everywhere, and the loop is plain policy gradient with no trust region at all.
#
# The last lines measure the consequence from the sampler's point of view. Without a fixed
# $\pi_{\theta_\text{old}}$ the policy ends the rollout further from the policy that
# produced its data (approx_kl 0.1701 and 0.1715 against 0.1026). The clip is not a wall:
# even with it, ratios end between 0.4491 and 2.3210. A clipped token's probability still
# moves, through the weights it shares with unclipped tokens and through AdamW's momentum. It is a brake on the gradient, and it only brakes when its reference point is
# the sampler.
#
# `grpo_edu.training.trainer` therefore computes $\log\pi_{\theta_\text{old}}$ once per rollout, with
# the policy that sampled, whenever a rollout feeds more than one optimizer step
# (`num_iterations` x `num_mini_batches` > 1), as TRL does. With one step per rollout
# the policy's own detached log-probs are the sampler's exactly, and nothing need be
# recomputed.
#
# ## Why the first step's loss is 0, and its gradient is not
#
# With $\rho$ = 1 and $\pi = \pi_\text{ref}$, every token's objective is $A_i$ and every KL
# is 0, so the `grpo` loss is $-\frac{1}{N}\sum_i A_i$, and the advantages of each group
# sum to zero. The loss printed above was 0 up to rounding. Its gradient is another
# matter: the derivative of $-\min(\rho A, \operatorname{clip}(\rho) A)$ in $\log\pi$ at
# $\rho$ = 1 is $-A_i$, so, with the token-mean weights,
#
# $$\frac{\partial\, \text{loss}}{\partial \log \pi_{i,t}} = -\frac{A_i}{N\,|o_i|},$$
#
# which is what autograd left in `logp.grad` (up to float32 rounding):

# %%
N = B * G
predicted = -batch.advantages[..., None] / (N * lengths[..., None]) * mask
print(f"first-step loss: {f4(out.loss.item())}; each group's advantages sum to zero: "
      f"{bool((batch.advantages.sum(-1).abs() < 1e-6).all())}")
print(f"d loss / d logp == -A_i / (N |o_i|) on every token: "
      f"{torch.allclose(logp.grad, predicted, rtol=1e-5, atol=1e-8)}")
print("d loss / d logp of the first token of each completion:")
print(logp.grad[..., 0] + 0.0)   # + 0.0 turns -0.0 into 0.0

# %% [markdown]
# So a GRPO loss curve that hovers around 0 says nothing about learning: the loss is a
# surrogate whose *value* at the sampling policy is $-\text{mean}(A)$ by construction.
# Watch the rewards, the KL and the clip fractions instead.
#
# ## The same numbers as chapter 1
#
# The reference (`grpo_edu.algorithm.reference`) is a loop over responses in NumPy with its own
# hand-derived gradient with respect to the logits. Two checks, in float64.
#
# **Chapter 1's worked example**, laid out as a (1, 4, 3) batch over a 3-token vocabulary
# and run through the PyTorch path (`token_logprobs` then `grpo_loss`):

# %%
lengths_example = [len(ids) for ids in worked_example.TOKEN_IDS]
S_example = max(lengths_example)
example_logits = torch.zeros(1, 4, S_example, 3, dtype=torch.float64)
example_ids = torch.zeros(1, 4, S_example, dtype=torch.long)
example_old = torch.zeros(1, 4, S_example, dtype=torch.float64)
example_ref = torch.zeros(1, 4, S_example, dtype=torch.float64)
for i, T_i in enumerate(lengths_example):
    example_logits[0, i, :T_i] = torch.tensor(worked_example.NEW_LOGITS[i], dtype=torch.float64)
    example_ids[0, i, :T_i] = torch.tensor(worked_example.TOKEN_IDS[i])
    example_old[0, i, :T_i] = torch.tensor(worked_example.OLD_LOGP[i], dtype=torch.float64)
    example_ref[0, i, :T_i] = torch.tensor(worked_example.REF_LOGP[i], dtype=torch.float64)
example_mask = torch.arange(S_example) < torch.tensor(lengths_example)[None, :, None]
example_logits.requires_grad_()
example_out = grpo_loss(token_logprobs(example_logits, example_ids), example_old,
                        group_advantages(torch.tensor([worked_example.REWARDS], dtype=torch.float64)),
                        example_mask, ref_logp=example_ref, beta=worked_example.BETA,
                        epsilon=worked_example.EPSILON)
example_out.loss.backward()
update = worked_example.update()
gradient_gap = max(np.abs(example_logits.grad[0, i, :T_i].numpy() - r.grad_logits).max()
                   for i, (T_i, r) in enumerate(zip(lengths_example, update.responses)))
print(f"chapter 1 (NumPy reference): loss {update.loss:.4f}")
print(f"this chapter (PyTorch):      loss {example_out.loss.item():.4f}")
print(f"|loss difference| < 1e-12: {abs(example_out.loss.item() - update.loss) < 1e-12}; "
      f"largest |d loss / d logit difference| < 1e-12: {gradient_gap < 1e-12}")

# %% [markdown]
# **The tiny Llama's batch.** Now the step above, in float64, against the reference fed the
# model's own logits response by response. To make every term count we use the state
# *after* the optimizer step: ratios away from 1, some clipped, KL not 0.

# %%
policy64 = copy.deepcopy(policy).double().eval()
old64, ref64 = batch.old_logp.double(), batch.ref_logp.double()
positions = position_ids_from_attention_mask(flat_attention)
logits64 = policy64(flat_ids, attention_mask=flat_attention, position_ids=positions).logits
completion_logits = logits64[:, P - 1:-1].view(B, G, S, -1).detach().requires_grad_()
torch_out = grpo_loss(token_logprobs(completion_logits, batch.completion_ids), old64,
                      group_advantages(rewards.double()), batch.completion_mask, ref_logp=ref64,
                      beta=beta, epsilon=epsilon)
torch_out.loss.backward()

group_losses, worst_gap = [], 0.0
for b in range(B):
    T = lengths[b].tolist()
    group = reference.grpo_update(
        [completion_ids[b][g] for g in range(G)],
        [completion_logits[b, g, :T[g]].detach().numpy() for g in range(G)],
        [old64[b, g, :T[g]].numpy() for g in range(G)], [ref64[b, g, :T[g]].numpy() for g in range(G)],
        rewards[b].double().numpy(), epsilon=epsilon, beta=beta)
    group_losses.append(group.loss)
    for g in range(G):   # the batch loss is the mean of B groups: each group's gradient / B
        gap = np.abs(completion_logits.grad[b, g, :T[g]].numpy() - group.responses[g].grad_logits / B).max()
        worst_gap = max(worst_gap, gap)
print(f"reference, mean of the {B} group losses: {np.mean(group_losses):.4f}")
print(f"grpo_loss on the padded batch:         {torch_out.loss.item():.4f}")
print(f"|loss difference| < 1e-12: {abs(np.mean(group_losses) - torch_out.loss.item()) < 1e-12}; "
      f"largest |gradient difference| < 1e-12: {worst_gap < 1e-12}")
print(f"clipped tokens in this state: {torch_out.metrics['clip_ratio/region']:.4f} of all, "
      f"kl {f4(torch_out.metrics['kl'])}")

# %% [markdown]
# Padding, batching, broadcasting and autograd together reproduce the loop-based
# reference to 12 decimals.
#
# <details><summary>How we know</summary>
#
# `tests/test_loss.py` repeats this check on random ragged batches, 60 per test run, and
# `tests/test_trl_parity.py` checks the same loss against TRL's GRPOTrainer.
#
# </details>
#
# ## A float64 gradcheck
#
# The reference's gradient is hand-derived; `torch.autograd.gradcheck` compares autograd
# with finite differences instead, here for the loss as a function of the logits (through
# the chunked log-softmax and the masked loss, padding included):

# %%
check_logits = torch.randn(2, 3, 5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
check_ids = torch.randint(0, 7, (2, 3, 5), generator=torch.Generator().manual_seed(2))
check_mask = torch.arange(5) < torch.tensor([[5, 2, 3], [1, 4, 5]])[..., None]
check_old = (token_logprobs(check_logits, check_ids) + 0.2 * torch.randn(2, 3, 5, dtype=torch.float64,
             generator=torch.Generator().manual_seed(3))).clamp(max=0)
check_advantages = group_advantages(torch.tensor([[1.0, 0.0, 2.0], [0.5, 1.5, 0.0]], dtype=torch.float64))


def loss_of_logits(z):
    return grpo_loss(token_logprobs(z, check_ids), check_old, check_advantages, check_mask,
                     ref_logp=check_old, beta=0.1, epsilon_high=0.28).loss


print(f"gradcheck passed: {torch.autograd.gradcheck(loss_of_logits, (check_logits.requires_grad_(),))}")

# %% [markdown]
# ## Expand, not repeat
#
# Every prompt appears G times in the batch. Building the (B, G, P) prompt block with
# `repeat` copies it G times; `expand` returns a view with stride 0 along G that shares
# the original memory. The same holds for the advantages (B, G), which the loss needs at
# every one of S positions: broadcasting (`A[..., None]` above) is an expand, never a
# (B, G, S) copy.

# %%
def storage_bytes(t):
    return t.untyped_storage().nbytes()


for name, (B_, G_, P_) in {"this chapter": (B, G, P), "a GPU batch": (64, 16, 512)}.items():
    prompt_block = torch.zeros(B_, P_, dtype=torch.long)
    expanded = prompt_block[:, None, :].expand(B_, G_, P_)
    repeated = prompt_block[:, None, :].repeat(1, G_, 1)
    print(f"{name:13} (B, G, P) = {(B_, G_, P_)}: expand {storage_bytes(expanded):>9,} bytes "
          f"(stride {expanded.stride()}), repeat {storage_bytes(repeated):>9,} bytes")

# %% [markdown]
# For token ids the saving is small change. What it teaches matters for the large
# tensors: never materialise a per-prompt quantity G times, or a per-completion one S
# times. (The model still runs its forward on N = B G full rows; sharing the prompt's
# computation across a group is what prefix caching in vLLM does at sampling time.)
#
# The largest tensor of the step is not an input at all: the logits, N x S x V floats.
# This chapter's model has a vocabulary of 102, but a real one has 32k to over 150k
# entries. `torch.log_softmax(logits)` writes another tensor of that size only to read one
# entry per row. `token_logprobs` never does: it works through the logits a chunk of
# rows at a time, and its backward recomputes the softmax chunk by chunk:
#
# <details><summary>How we know</summary>
#
# `benchmarks/logprobs.py` measures the memory and time of the chunked and the plain
# log-softmax.
#
# </details>

# %%
print(inspect.getsource(token_logprobs).split('    if not isinstance')[0].rstrip())

# %% [markdown]
# ## What you learned
#
# - Prompts are left-padded and completions right-padded, so every completion starts at column P.
# - The logits at column j score the token at column j + 1. Scoring with column j raises no
#   error; it trains the wrong conditional.
# - Padding is zeroed before anything is summed; `grpo` averages each completion's tokens,
#   then the N completions.
# - $\pi_{\theta_\text{old}}$ is the sampler's log-probs, fixed for the whole rollout.
#   Refreshing it switches the clip off.
# - At the first step the loss is $-\text{mean}(A)$, here 0, while each token's gradient is
#   $-A_i / (N\,|o_i|)$.
#
# ## Check yourself
#
# Where an answer is a number, check yours before you open it:
# `quiz.check(3, 3, gradient=...)` (`from grpo_edu.exercises import quiz`;
# `quiz.ask(3)` lists what each question takes).
#
# 1. The prompt `3*4=` has 4 tokens and P = 5. In which column is its completion's first
#    token, and the logits of which column score it?
#
#    <details><summary>Answer</summary>
#
#    The token sits in column 5 (= P). The logits at column 4, the last prompt token, score
#    it. Column 0 is padding.
#
#    </details>
#
# 2. The unshifted (buggy) log-probs came out higher than the right ones, -3.7209 against
#    -4.5904 for the first token. Why does the bug look *better*?
#
#    <details><summary>Answer</summary>
#
#    The model ties its input and output embeddings. The hidden state at a column still
#    carries the embedding of the token it just read, and the head scores that same token
#    highly. The bug asks the model to predict a token it can already see.
#
#    </details>
#
# 3. The completion `7` of the prompt `3*4=` has 2 tokens (EOS included) and A = -1.2247,
#    in a batch of N = 6 completions. What is d loss / d logp on each of its tokens at the
#    first step?
#
#    <details><summary>Answer</summary>
#
#    $-A_i / (N\,|o_i|)$ = 1.2247 / 12 = +0.1021, the largest entry of the printed gradient.
#    A large advantage shared by few tokens pushes each of them hard.
#
#    </details>
#
# 4. You run three PPO-style passes over one mini-batch and refresh
#    $\pi_{\theta_\text{old}}$ before each pass. What share of tokens does the clip stop
#    in the second and third passes, and with the sampler fixed instead?
#
#    <details><summary>Answer</summary>
#
#    Refreshed: 0 in every pass, since each pass starts at a ratio of exactly 1. Fixed at
#    the sampler: 0.4091 and 0.5455. Only a fixed reference point lets the clip act.
#
#    </details>
#
# ## Exercises
#
# Each exercise has a checker in `grpo_edu.exercises.ch03` that runs your function on
# several cases. It names each failing case and how your answer is wrong there (its shape,
# its sign, too large or too small, off by a factor, NaN), never the right value. Each has
# a hint and a worked solution (the open question, a written answer), folded: open them when
# you want them.
#
# **3.1 Align logits with tokens.** Write `my_completion_logprobs(logits, input_ids, S)`:
# given the logits of a whole batch, (N, T, V), and its ids, (N, T), return the log-probs
# of the last S tokens of each row, (N, S). The attempt below is the classic off-by-one;
# the checker recognises it.
#
# <details><summary>Hint</summary>
#
# The logits at column j are the model's prediction for the token at column j + 1. The last S
# tokens sit in columns T - S to T - 1, so the logits that score them are columns T - S - 1
# to T - 2.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# import torch
#
#
# def my_completion_logprobs(logits, input_ids, S):
#     log_probs = torch.log_softmax(logits[:, -S - 1:-1], dim=-1)      # column j - 1 scores token j
#     return log_probs.gather(-1, input_ids[:, -S:, None]).squeeze(-1)
#
#
# ch03.check_completion_logprobs(my_completion_logprobs)
# ```
#
# </details>

# %%
from grpo_edu.exercises import ch03


def my_completion_logprobs(logits, input_ids, S):
    log_probs = torch.log_softmax(logits[:, -S:], dim=-1)     # off by one: fix me
    return log_probs.gather(-1, input_ids[:, -S:, None]).squeeze(-1)


ch03.check_completion_logprobs(my_completion_logprobs)

# %% [markdown]
# **3.2 The masked loss.** Write `my_masked_grpo_loss(logp, old_logp, advantages, mask, epsilon)`
# for (N, S) tensors and (N,) advantages: the clipped surrogate without KL, token mean per
# completion, then mean over completions. The checker puts NaN and huge values in the
# padding: a loss that multiplies by the mask *after* computing on padding fails it.
#
# <details><summary>Hint</summary>
#
# NaN times 0 is NaN, and `exp` of a huge log-ratio is inf. Replace the padding's values
# with `torch.where(mask, ..., 0)` *before* any arithmetic that could blow up, and again
# on the objective before summing.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# import torch
#
#
# def my_masked_grpo_loss(logp, old_logp, advantages, mask, epsilon):
#     log_ratio = torch.where(mask, logp - old_logp, torch.zeros_like(logp))   # padding never reaches exp
#     ratio = torch.exp(log_ratio)
#     A = advantages[:, None]
#     objective = torch.minimum(ratio * A, ratio.clamp(1 - epsilon, 1 + epsilon) * A)
#     objective = torch.where(mask, objective, torch.zeros_like(objective))
#     return -(objective.sum(-1) / mask.sum(-1)).mean()
#
#
# ch03.check_masked_grpo_loss(my_masked_grpo_loss)
# ```
#
# </details>

# %%
def my_masked_grpo_loss(logp, old_logp, advantages, mask, epsilon):
    ratio = torch.exp(logp - old_logp)
    objective = torch.minimum(ratio * advantages[:, None],
                              ratio.clamp(1 - epsilon, 1 + epsilon) * advantages[:, None])
    return -((objective * mask).sum(-1) / mask.sum(-1)).mean()     # padding leaks: fix me


ch03.check_masked_grpo_loss(my_masked_grpo_loss)

# %% [markdown]
# **3.3 The first-step gradient.** Without autograd, write
# `my_first_step_gradient(advantages, mask)` returning d loss / d logp, (N, S), at
# $\rho$ = 1 for `loss_type="grpo"` with no KL. Then predict, and check with the function:
# which token of this chapter's batch is pushed hardest, and why is it in the shortest
# completion?
#
# <details><summary>Hint</summary>
#
# At $\rho$ = 1 no token clips, and the derivative of $\rho A$ in $\log\pi$ is $\rho A = A$.
# The loss is minus the mean over N completions of each completion's token mean, so each
# real token of completion i gets $-A_i / (N\,|o_i|)$.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# import torch
#
#
# def my_first_step_gradient(advantages, mask):
#     N = mask.shape[0]
#     lengths = mask.sum(-1, keepdim=True).to(advantages.dtype)
#     gradient = -advantages[:, None] / (N * lengths)
#     return torch.where(mask, gradient, torch.zeros_like(gradient))
#
#
# ch03.check_first_step_gradient(my_first_step_gradient)
# ```
#
# The hardest-pushed tokens are those with the largest $|A_i| / |o_i|$: a large advantage
# shared by few tokens. In this chapter's batch that is the shortest completion, 2 tokens
# long, with one of the two largest advantages in size. Each of its tokens gets 7 times the
# push of a token of the 14-token completion with the same $|A|$. That is the `grpo` loss's
# length bias (chapter 4).
#
# </details>

# %%
def my_first_step_gradient(advantages, mask):
    raise NotImplementedError("your gradient here")


ch03.check_first_step_gradient(my_first_step_gradient)

# %% [markdown]
# **Open question: bf16.** Run the step with the policy in `torch.bfloat16`. Which numbers of
# the diagnostics change, and by how much? Why does `token_logprobs` return float32 for
# bf16 logits, and what would go wrong in the ratio $\exp(\log\pi - \log\pi_\text{old})$
# if the two log-probabilities were rounded to bf16's 8 bits of mantissa?
#
# <details><summary>Hint</summary>
#
# bf16 keeps 8 significant bits: between 2 and 4, its numbers are 1/64 apart. Compare that
# spacing with the differences between log-probabilities that the ratio exists to measure,
# and with the clip range.
#
# </details>
#
# <details><summary>Answer</summary>
#
# In bf16 every logit is rounded to about 3 significant digits. So the log-probs, the KL
# and the loss move in their third digit. The diagnostics that compare two computations
# of the same numbers (the ratio at the first step, the sampler/trainer gap) stop being
# exactly 1 and 0. `token_logprobs` upcasts the logits to float32 before the log-softmax,
# because the quantities downstream are *differences* of log-probs. A log-prob near -3
# rounded to bf16 can be off by up to 1/128 (half its spacing of 1/64). So the ratio of two
# such numbers can be off by nearly 2% (a spacing of 1/64 in the log-ratio) before the policy
# has moved at all. That is close to a tenth of a clip range of 0.2 spent on rounding; in the
# other direction it can hide a real change of the same size. Rounded log-probs would also
# make the first step's ratio differ from 1, the symptom the book uses to detect a sampler
# and a trainer that disagree (chapter 11 measures it for a bf16 sampler).
#
# </details>
