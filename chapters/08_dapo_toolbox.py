# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 8. DAPO's toolbox, measured
#
# > **You will learn**
# > - what a moving reference does to the Kullback-Leibler (KL) penalty, and to a short run
# > - which tokens entropy masking trains, and why they are the forks of a completion
# > - what overlong filtering and the soft overlong punishment assume about cut completions
# > - when dynamic sampling fills a batch with groups that carry signal, and when it cannot
# >
# > **You need first**: chapter 4 (loss variants) and chapter 7 (the failure lab).
# >
# > **Reading time**: about 28 minutes. **Compute**: at most 60 s on a 2-core CPU. [Glossary](../docs/glossary.md) · [Notation](../docs/notation.md)
#
# Chapter 4 changed the loss of GRPO (Group Relative Policy Optimization). DAPO (Decoupled
# Clip and Dynamic Sampling Policy Optimization, Yu et al. 2025) changes more than its loss.
# It drops the KL term (`beta = 0` in grpo_edu). It leaves truncated completions out of the
# loss (overlong filtering). It lowers the reward of completions that run close to the length limit (a soft
# overlong punishment). It replaces groups whose rewards are all equal by sampling more
# (dynamic sampling).
#
# Two more settings come from other papers. One moves the reference the KL term pulls
# toward. The other trains only the tokens where the policy was uncertain (entropy masking,
# the "80/20" finding).
#
# Each is a setting with an assumption about the run it is for. This chapter trains the tiny
# reasoner of chapter 6 with each one, three seeds apiece, and compares it with the plain run,
# paired by seed. Where each setting acts in the step:

# %%
import json

import matplotlib.pyplot as plt
import numpy as np
import torch

from grpo_edu.algorithm.statistics import by_seed, paired_seeds
from grpo_edu.book import home, schematics

home.enter()   # the book's folder: its files are read and its runs written from there

torch.set_num_threads(1)
torch.set_printoptions(precision=4, sci_mode=False)
schematics.dapo_toolbox()

# %% [markdown]
# Every comparison below is paired: the same seed with and without the setting, the mean
# difference over the three seeds, and its 95% t interval with 2 degrees of freedom (see
# `grpo_edu.algorithm.statistics`). A setting "beats" the plain run only where that interval
# excludes zero. Otherwise the two are not separated at this size.
#
# %% [markdown]
# ## The reference the KL anchors to
#
# The KL term pulls the policy toward a reference, and which reference is a choice of its
# own. DeepSeekMath and R1 **replace** it by the current policy from time to time. R1 does so
# every 400 optimizer steps.
#
# A reference can also move **part of the way**. TR-DPO proposed it for preference training
# (Gorbatovski et al. 2024, "Learn Your Reference Model for Real Good Alignment"): at every
# sync, ref = alpha x policy + (1 - alpha) x ref, a Polyak average of the weights. The
# open-instruct library and TRL (Transformer Reinforcement Learning, Hugging Face's library)
# offer it for GRPO. TRL's keys are `ref_model_mixup_alpha` (default 0.6) and `ref_model_sync_steps`,
# counted in optimizer steps. TRL also needs `sync_ref_model=True`, which it refuses with
# `beta = 0` (its default) or with a PEFT model.
#
# In grpo_edu the keys are `ref_sync_steps` (every K rollouts, not optimizer steps; 0 = frozen)
# and `ref_mixup_alpha` (1 = the hard copy). After n syncs each weight of the reference is a
# weighted average of that weight in the policies it was synced with. The one of sync k weighs
# alpha (1 - alpha)^(n - k), and the starting policy (1 - alpha)^n. That averages parameters.
# The model it gives is not a mixture of the policies' distributions. On one
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
          f"sum_k alpha (1 - alpha)^(n-k) x policy_k = {by_hand:.4f}   "
          f"the start's weight (1 - alpha)^n = {(1 - alpha) ** len(policy_values):.5f}")

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

ref_verdicts = {v: paired_seeds(by_seed(reference_runs["runs"], variant=v), by_seed(reference_runs["runs"], variant="frozen"))
                for v in ref_variants if v != "frozen"}
print("final accuracy, paired over seeds: mean difference [95% t interval]")
for v, verdict in ref_verdicts.items():
    print(f"  {verdict.words(v, 'frozen')}")

# %% [markdown]
# A moving reference follows the policy, so the KL the loss sees stays small. The pull back
# toward the start, which a frozen reference exerts, almost vanishes (the copy's KL is exactly
# 0 right after each sync).
#
# Final accuracy is not separated at this size. The table prints frozen `0.751 (0.734-0.770)`,
# copy `0.711 (0.672-0.738)`, Polyak `0.721 (0.699-0.746)` and moving average
# `0.716 (0.668-0.742)`. Paired by seed, every moving reference ends lower on average, and
# every interval contains zero: the copy -0.040 [-0.125, +0.044], Polyak -0.030
# [-0.076, +0.016], the moving average -0.035 [-0.147, +0.077].
#
# R1 resets its reference over thousands of steps, where an anchor to the start would hold
# back a policy that has to travel far. 150 steps of
# the tiny reasoner do not go far. Checked against the numbers above:

# %%
moving = [v for v in ref_variants if v != "frozen"]
claims = {
    "every moving reference keeps the late KL more than 20 times below the frozen one's, in every seed":
        max(max(late_kl[v]) for v in moving) * 20 < min(late_kl["frozen"]),
    "no moving reference ends above the frozen one in mean held-out accuracy":
        all(np.mean(final[v]) < np.mean(final["frozen"]) for v in moving),
    "paired by seed, no moving reference is separated from the frozen one at this size":
        not any(verdict.separated for verdict in ref_verdicts.values()),
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
from grpo_edu.environment.rewards import soft_overlong_punishment

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
# which the cell below reads. The punishment is `grpo_edu.environment.rewards.soft_overlong_punishment`,
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
# Chapter 4 showed that a group whose rewards are all equal carries no policy gradient, yet
# dilutes the rest. `filter_zero_std_groups` drops such groups, and the batch trains on fewer. DAPO's dynamic sampling (`dynamic_sampling_rounds` = k) replaces
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
# committed policy `trained` is what the default run trains (configs/cpu-tiny.toml, 1,500
# steps, seed 0). It answers 0.992 of these held-out arithmetic problems greedy. Sampled at
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
# - A moving reference keeps the KL the loss sees small, because the anchor follows the
#   policy. In 150 steps of the tiny reasoner no moving reference separated from the frozen one.
# - Entropy masking trains the policy term of the forks only: the tokens whose distribution
#   was uncertain. The KL term and the normaliser still count every token.
# - Overlong filtering and the soft punishment assume that what the limit cuts is rambling.
#   Where the limit cuts right answers, both hurt; with DAPO's slack, neither separated from
#   the plain run.
# - Dynamic sampling fills the batch with groups whose rewards differ, at the price of more
#   rollouts. It cannot make signal where no completion is right.
# - Each setting is a bet about the run. Measure it on yours, paired by seed.
#
# ## Check yourself
#
# Where an answer is a number, check yours before you open it:
# `quiz.check(8, 1, weight=...)` (`from grpo_edu.exercises import quiz`;
# `quiz.ask(8)` lists what each question takes).
#
# 1. A reference is synced 5 times with Polyak averaging at alpha = 0.6. What weight does
#    the starting policy keep in it?
#
#    <details><summary>Answer</summary>
#
#    (1 - 0.6)^5 = 0.01024. Each sync keeps 0.4 of what the reference was, so the start
#    fades geometrically. A hard copy (alpha = 1) keeps none of it after the first sync.
#
#    </details>
#
# 2. With `top_entropy_quantile = 0.2`, which parts of the loss still see the other 80% of
#    the tokens?
#
#    <details><summary>Answer</summary>
#
#    The KL term and the normaliser. Only the policy term of a token below the threshold is
#    zeroed. With $\beta$ > 0 the masked tokens are still pulled toward the reference, which
#    the paper's runs, with no KL term, did not do.
#
#    </details>
#
# 3. At L = 9 with c = 2 (accuracy weight 1, format weight 0.5), what does a right answer of
#    10 tokens earn, and a well-formed wrong answer of 7 tokens?
#
#    <details><summary>Answer</summary>
#
#    The right one is cut to 9 tokens: 1 + 0.5 - 1 = 0.5. The wrong one: 0 + 0.5 + 0 = 0.5.
#    The same reward, which is why the punishment drives the policy to seven tokens.
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
# ## Exercises
#
# Checkers are in `grpo_edu.exercises.ch08`. Each exercise has a hint and a worked solution,
# folded: open them when you want them.
#
# **8.1 The soft overlong punishment.** Write `my_overlong_punishment(lengths,
# max_completion_length, cache)`: the (N,) reward term of N completions of `lengths` tokens.
# It is 0 up to L - c tokens, falls linearly to -1 at L, and stays -1 past L (a later turn of
# an episode can run past it). The first attempt below forgets that last part.
#
# <details><summary>Hint</summary>
#
# Count the tokens over L - c, divide by c and negate. Then bound the result on both sides:
# it is never above 0 and never below -1.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# import torch
#
#
# def my_overlong_punishment(lengths, max_completion_length, cache):
#     over = lengths.to(torch.float64) - (max_completion_length - cache)
#     return (-over / cache).clamp(min=-1.0, max=0.0)
#
#
# ch08.check_overlong_punishment(my_overlong_punishment)
# ```
#
# </details>

# %%
from grpo_edu.exercises import ch08


def my_overlong_punishment(lengths, max_completion_length, cache):
    over = lengths.to(torch.float64) - (max_completion_length - cache)
    return (-over / cache).clamp(max=0.0)                     # fix me: past the limit


ch08.check_overlong_punishment(my_overlong_punishment)

# %% [markdown]
# **8.2 The tokens that train.** Write `my_entropy_mask(entropies, mask, q)`: given the (N, S)
# entropies of N completions, their (N, S) bool mask of real tokens and the share q, return
# the pair `(tau, keep)`. `tau` is the (1 - q)-quantile of the real tokens' entropies
# (`torch.quantile`, which interpolates linearly). `keep` is the (N, S) bool mask of the real
# tokens whose entropy is at least `tau`. In the checker's cases the padding holds large
# numbers, and some entropies tie at the threshold.
#
# <details><summary>Hint</summary>
#
# Take the quantile over `entropies[mask]`, not over the whole tensor. Ties at `tau` train:
# compare with `>=`. And a padded position never trains, whatever it holds.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# import torch
#
#
# def my_entropy_mask(entropies, mask, q):
#     tau = torch.quantile(entropies[mask], 1 - q).item()
#     return tau, (entropies >= tau) & mask
#
#
# ch08.check_entropy_mask(my_entropy_mask)
# ```
#
# </details>

# %%
def my_entropy_mask(entropies, mask, q):
    raise NotImplementedError("your threshold and mask here")


ch08.check_entropy_mask(my_entropy_mask)
