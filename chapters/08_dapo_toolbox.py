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
# > - what each tool of the toolbox does, and what it assumes about the run
# > - where in the step each one acts
# > - what each tool did to the tiny reasoner, paired by seed
# > - how to choose a tool when most comparisons are not separated
# >
# > **You need first**: chapter 4 (loss variants) and chapter 7 (the failure lab).
# >
# > **Reading time**: about 24 minutes. **Compute**: at most 60 s on a 2-core CPU. [Glossary](../docs/glossary.md) · [Notation](../docs/notation.md)
#
# Chapter 4 changed the loss of GRPO (Group Relative Policy Optimization). DAPO (Decoupled
# Clip and Dynamic Sampling Policy Optimization) changes more. It is a recipe for large
# language models (LLM): Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning
# System at Scale" ([`arXiv:2503.14476`](https://arxiv.org/abs/2503.14476)). It drops the
# Kullback-Leibler (KL) term. It handles completions cut at the
# length limit. It refills groups whose rewards are all equal. Two more tools come from other
# papers: a moving reference, and entropy masking.
#
# Each tool is a bet about the run. For each, this chapter says what it is, what it assumes
# and when it helps. Then it trains chapter 6's tiny reasoner with and without it, three seeds
# apiece, and gives a verdict. A decision table closes the chapter. Where each tool acts:

# %%
import json

import matplotlib.pyplot as plt
import numpy as np
import torch

from grpo_edu.algorithm.statistics import by_seed, paired_seeds
from grpo_edu.book import home, schematics
from grpo_edu.book.claims import Claims

home.enter()   # the book's folder: its files are read and its runs written from there

torch.set_num_threads(1)
verdicts = {}   # every paired comparison of the chapter, by (tool, a, b): the decision table reads them


def results_of(name):
    """benchmarks/results/<name>.json: its variants' settings and their runs, one per seed."""
    return json.loads(home.path(f"benchmarks/results/{name}.json").read_text())


def compare(tool, results, pairs, value="final_accuracy"):
    """Each pair (a, b) of variants paired by seed on `value` (a run's key, or a function of the
    run): the mean of the differences a - b and its 95% t interval, printed and kept."""
    for a, b in pairs:
        verdicts[tool, a, b] = paired_seeds(by_seed(results["runs"], value, variant=a),
                                            by_seed(results["runs"], value, variant=b))
        print(f"  {verdicts[tool, a, b].words(a, b)}")


def table(results, **columns):
    """One row per variant: its final held-out accuracy and each column (a function of a run, and
    its format), as mean (min-max) over seeds; then its settings. Returns {column: {variant: [per seed]}}."""
    columns = {"final accuracy": (lambda run: run["final_accuracy"], ".3f"), **columns}
    values = {c: {v: by_seed(results["runs"], f, variant=v) for v in results["variants"]} for c, (f, _) in columns.items()}
    cells = {v: [f"{np.mean(x[v]):{f}} ({min(x[v]):{f}}-{max(x[v]):{f}})" for x, (_, f) in zip(values.values(), columns.values())]
             for v in results["variants"]}
    widths = [max(len(c), *(len(row[j]) for row in cells.values())) + 3 for j, c in enumerate(columns)]
    print(f"{'variant':<15}" + "".join(f"{c:<{w}}" for c, w in zip(columns, widths)) + "settings")
    for v, settings in results["variants"].items():
        print(f"{v:<15}" + "".join(f"{cell:<{w}}" for cell, w in zip(cells[v], widths))
              + (", ".join(f"{k} = {value}" for k, value in settings.items()) or "-"))
    return values


def mean_curve(axis, results, variant, key, label=None, scale=lambda y: y):
    """`key` at each step (scaled), the mean over the variant's seeds, as one line."""
    curves = np.array([[np.nan if x is None else x for x in r["steps"][key]]
                       for r in results["runs"] if r["variant"] == variant], dtype=float)
    axis.plot(np.arange(1, curves.shape[1] + 1), scale(np.nanmean(curves, 0)), label=label or variant)


def part(*keys):
    """The schematic below, with only the settings `keys` under their stage of the step."""
    figure = schematics.dapo_toolbox([(stage, made, [k for k in knobs if k[0] in keys])
                                      for stage, made, knobs in schematics.TOOLBOX])
    figure.axes[0].set_ylim(1.75, 3.9)   # one setting per stage: the rows below it are empty
    figure.set_size_inches(10, 2.2)
    return figure


schematics.dapo_toolbox()

# %% [markdown]
# Every comparison is paired by seed: the mean difference over three seeds, with its 95% t
# interval (`grpo_edu.algorithm.statistics`). A tool "beats" the plain run only where that
# interval excludes zero; otherwise the two are "not separated at this size".
#
# ## 1. The reference: move it, or drop it
#
# **What it is.** The KL term pulls the policy toward a reference model. DeepSeekMath (Shao et
# al. 2024) and DeepSeek-R1 (DeepSeek-AI 2025) **replace** the reference by the current policy
# from time to time; R1 every 400 optimizer steps. TR-DPO (trust-region direct preference
# optimization; Gorbatovski et al. 2024, "Learn Your Reference Model for Real Good Alignment")
# moves it **part of the way**. At every sync, ref = alpha x policy + (1 - alpha) x ref: a
# Polyak average of the weights (Polyak and Juditsky 1992). DAPO **drops** the term: beta = 0.
#
# In grpo_edu the keys are `ref_sync_steps` (a sync every K rollouts; 0 = frozen) and
# `ref_mixup_alpha` (1 = the hard copy). After n syncs, sync k's policy weighs
# alpha (1 - alpha)^(n - k) in the reference, and the start (1 - alpha)^n. That averages
# parameters, not the policies' distributions. On one parameter, over five syncs:
#
# <details><summary>The same in TRL</summary>
#
# TRL (Transformer Reinforcement Learning, Hugging Face's library) and the open-instruct
# library offer it for GRPO. TRL's keys are `ref_model_mixup_alpha` (default 0.6) and
# `ref_model_sync_steps`, counted in optimizer steps, not rollouts. TRL also needs
# `sync_ref_model=True`, which it refuses with `beta = 0` (its default) or with a
# parameter-efficient fine-tuning (PEFT) model.
#
# </details>

# %%
from grpo_edu.training.placement import Models

policy_values = [1.0, 2.0, 4.0, 3.0, 5.0]
for alpha in (1.0, 0.6, 0.05):
    policy, reference = torch.nn.Linear(1, 1, bias=False), torch.nn.Linear(1, 1, bias=False)
    models, trail = Models(policy, reference, policy, None, None), []
    torch.nn.init.zeros_(reference.weight)
    for value in policy_values:
        torch.nn.init.constant_(policy.weight, value)
        models.sync_reference(alpha)
        trail.append(round(reference.weight.item(), 4))
    by_hand = sum(alpha * (1 - alpha) ** (len(policy_values) - 1 - k) * v for k, v in enumerate(policy_values))
    print(f"alpha {alpha:<5} reference after each sync {trail}   "
          f"sum_k alpha (1 - alpha)^(n-k) x policy_k = {by_hand:.4f}   "
          f"the start's weight (1 - alpha)^n = {(1 - alpha) ** len(policy_values):.5f}")

# %% [markdown]
# **What it assumes.** That the policy must travel far from its start, where an anchor would
# hold it back. Dropping the term also assumes that the reward alone keeps the policy sane.
#
# **When it helps.** In a long run, where the policy must change a lot: R1 resets its
# reference over thousands of steps. Where it acts:

# %%
part("ref_sync_steps")

# %% [markdown]
# **What our runs saw.** The default run for 150 steps with four references: frozen; a copy
# every 25 rollouts; Polyak with alpha 0.6 every 25; and alpha 0.05 at every rollout, an
# exponential moving average. Then the same run with beta = 0. The table gives the final
# held-out greedy accuracy and the late KL, as mean (min-max) over seeds.
#
# <details><summary>How we know</summary>
#
# `benchmarks/reference.py` ran the default run (configs/cpu-tiny.toml) for 150 steps, seeds
# 0, 1 and 2, with each reference, and wrote `benchmarks/results/reference.json`, which the
# cell below reads. The beta = 0 runs are `benchmarks/entropy.py`'s (its variants `all` and
# `all-beta0`; `all` is the frozen run here, with the same seeds).
#
# </details>

# %%
reference_runs, entropy_runs = results_of("reference"), results_of("entropy")
ref = table(reference_runs, **{"late KL": (lambda run: float(np.median(run["steps"]["kl"][-25:])), ".4f")})
ref_variants, final, late_kl = list(reference_runs["variants"]), ref["final accuracy"], ref["late KL"]
print("\nfinal accuracy, paired over seeds: mean difference [95% t interval]")
compare("reference", reference_runs, [(v, "frozen") for v in ref_variants if v != "frozen"])
compare("beta = 0", entropy_runs, [("all-beta0", "all")])
figure, axis = plt.subplots(figsize=(8, 3))
for v in ref_variants:
    mean_curve(axis, reference_runs, v, "kl")
axis.set(xlabel="step", ylabel="KL to the reference\n(mean of 3 seeds)")
axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
plt.show()

# %% [markdown]
# A moving reference follows the policy, so the KL the loss sees stays small: the pull back
# toward the start almost vanishes. Every moving reference, and beta = 0, ends lower on
# average than the frozen reference, and every interval contains zero. In 150 steps the tiny
# reasoner does not go far: this is not the run these tools were made for.
#
# **Verdict.** A moving reference keeps the KL small, as designed; in 150 steps neither it nor
# beta = 0 is separated from a frozen reference.

# %%
moving = [v for v in ref_variants if v != "frozen"]
claims = {
    "every moving reference keeps the late KL more than 20 times below the frozen one's, in every seed":
        max(max(late_kl[v]) for v in moving) * 20 < min(late_kl["frozen"]),
    "no moving reference ends above the frozen one in mean held-out accuracy":
        all(np.mean(final[v]) < np.mean(final["frozen"]) for v in moving),
    "the entropy benchmark's all-token run is the frozen run, seed by seed":
        by_seed(entropy_runs["runs"], variant="all") == final["frozen"],
    "paired by seed, no moving reference and no beta = 0 run is separated from the frozen one at this size":
        not any(verdicts[key].separated for key in verdicts),
}
Claims(claims)

# %% [markdown]
# ## 2. Entropy masking: train only the forks
#
# **What it is.** So far every token of a completion gets its completion's advantage. Wang et
# al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective Reinforcement
# Learning for LLM Reasoning" ([`arXiv:2506.01939`](https://arxiv.org/abs/2506.01939)),
# measured the policy's entropy at each token,
# $H_t = -\sum_v \pi(v \mid o_{<t}) \log \pi(v \mid o_{<t})$. The high-entropy minority are the
# "forks" of a trace, where the policy chooses. They trained only the top 20% of tokens by
# entropy (the "80/20" finding). They report parity with training all tokens at 8B
# parameters, and gains at 14B and 32B. Their runs use DAPO, with no KL term.
#
# In grpo_edu that is `top_entropy_quantile = q`. Before each optimizer step the trainer
# takes the threshold $\tau$: the (1 - q)-quantile of the exact entropies of all the step's
# real tokens. Then it zeroes the policy term of every token below $\tau$. The KL term and the
# normaliser still count the masked tokens.
#
# <details><summary>How we know, and where TRL differs</summary>
#
# TRL has the key of the same name, and also counts the masked tokens in the KL term and the
# normaliser. `grpo_edu.algorithm.entropy_mask.threshold` gathers the entropies of every
# micro-batch on every rank before taking the quantile; `tests/test_entropy_mask.py` checks that
# `micro_batch_size` changes neither the threshold nor the update. TRL 1.16's
# `get_high_entropy_mask`, called from `_compute_loss`, takes the quantile per micro-batch,
# gathered across processes; the two agree when an optimizer step is one micro-batch.
# `tests/test_trl_parity.py` holds the masked loss equal to TRL's, and
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
from grpo_edu.algorithm.logprobs import completion_logprobs
from grpo_edu.environment import tasks
from grpo_edu.policy.models import load_policy, policy_source

start_policy, tokenizer = load_policy(policy_source("start"))
problem = tasks.make_dataset("arithmetic", n=1, split="test", seed=0)[0]
texts = [problem["solution"], "<think>11</think>\\boxed{101}", "<think>1</think>\\boxed{111}", "<think>11</think>\\boxed{11}"]
prompt = tokenizer([problem["prompt"]] * len(texts), return_tensors="pt", add_special_tokens=False)
tokenizer.padding_side = "right"                      # completions are right-padded
written = tokenizer([t + tokenizer.eos_token for t in texts], return_tensors="pt", padding=True, add_special_tokens=False)
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
# The problem is 49+62; the reasoning is the units column, 9 + 2 = 11. The kept tokens are
# the forks. The first is the reasoning's second character, at 1.06 nats: does the column sum
# have a second digit or not? The second is the answer's tens digit, which the carry changes.
# The tags and the end-of-sequence (EOS) token sit at 0.01 to 0.05 nats: little is left to
# learn there.
#
# <details><summary>How we know</summary>
#
# The entropies are printed to two decimals: at three, one of these values sits so close to a
# rounding boundary that another CPU's kernels could tip it.
#
# </details>
#
# **What it assumes.** Long traces in which a few forks carry the choices. And no KL term, as
# in the paper: with beta = 0.04 the KL term still pulls the masked tokens toward the
# reference, which makes it a different method.
#
# **When it helps.** On the long traces of a large policy, where most tokens have nothing
# left to learn. It acts in the loss:

# %%
part("top_entropy_quantile")

# %% [markdown]
# **What our runs saw.** The default run at q = 1, 0.5 and 0.2, and at q = 1 and 0.2 with
# beta = 0. The table adds the policy's late entropy and the share of tokens kept.
#
# <details><summary>How we know</summary>
#
# `benchmarks/entropy.py` ran the default run for 150 steps, seeds 0, 1 and 2, at each q, and
# wrote `benchmarks/results/entropy.json`, which the cell below reads.
#
# </details>

# %%
ent = table(entropy_runs, **{
    "late entropy": (lambda run: float(np.mean(run["steps"]["entropy/mean"][-25:])), ".4f"),
    "tokens kept": (lambda run: float(np.mean([k for k in run["steps"]["entropy/kept"] if k is not None] or [1.0])), ".3f")})
ent_final, late_entropy, kept_share = ent["final accuracy"], ent["late entropy"], ent["tokens kept"]
print("\nfinal accuracy, paired over seeds: mean difference [95% t interval]")
compare("entropy masking", entropy_runs, [("top20", "all"), ("top50", "all"), ("top20-beta0", "all-beta0")])
figure, axes = plt.subplots(1, 2, figsize=(11, 3))
for v in entropy_runs["variants"]:
    mean_curve(axes[0], entropy_runs, v, "entropy/mean")
    runs = [r for r in entropy_runs["runs"] if r["variant"] == v]
    axes[1].plot([s for s, _ in runs[0]["eval"]], np.mean([[a for _, a in r["eval"]] for r in runs], 0),
                 marker="o", label=v)
axes[0].set(xlabel="step", ylabel="policy entropy (nats per token)")
axes[1].set(xlabel="step", ylabel="held-out accuracy\n(mean of 3 seeds)")
axes[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1))
plt.show()

# %% [markdown]
# Training a fifth of the tokens ends lower in every seed, and its policy stays more uncertain
# (the left panel): the tokens that would have sharpened are not trained. Paired by seed, the
# gap is not separated at this size. Without the KL term, as in the paper, a fifth of the
# tokens ends level with all of them. But these traces are about ten tokens long, with two or
# three forks each; the paper's run to thousands.
#
# **Verdict.** On traces of ten tokens, entropy masking is not separated from training every
# token, with or without the KL term.

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
    "without the KL term, q = 0.2 ends within 0.01 of q = 1 on average":
        abs(verdicts["entropy masking", "top20-beta0", "all-beta0"].difference) < 0.01,
    "paired by seed, none of the three comparisons is separated at this size":
        not any(v.separated for (tool, _, _), v in verdicts.items() if tool == "entropy masking"),
}
Claims(claims)

# %% [markdown]
# ## 3. Completions cut at the limit: overlong filtering and punishment
#
# **What they are.** A completion that reaches `max_completion_length` without its EOS is cut,
# and its reward judges an unfinished text. DAPO offers two remedies:
#
# - **overlong filtering** (`mask_truncated_completions`) leaves truncated completions out
#   of the loss; their rewards still enter their group's advantages;
# - a **soft overlong punishment** (`overlong_cache` = c) is a reward term that is 0 up to
#   L - c tokens and falls linearly to -1 at the limit L.
#
# **What they assume.** That what the limit cuts is rambling, not answers.
#
# **When they help.** With a policy that rambles past its answer, under a limit with slack:
# DAPO trains at L = 20,480 with c = 4,096. Filtering acts in the loss, the punishment on the
# reward:

# %%
part("mask_truncated_completions", "overlong_cache")

# %% [markdown]
# Our test first puts both where the assumption fails. At L = 9 tokens the limit cuts right
# answers: the tiny reasoner's take 7 to 10 tokens, EOS included.

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
# So at L = 9 every answer that needs 10 tokens is cut just before its EOS, and is still
# right: the accuracy reward reads the boxed answer. The run's reward is accuracy
# (weight 1) plus format (weight 0.5) plus the punishment. A right answer of 9 or 10 tokens
# therefore earns 1 + 0.5 - 1 = 0.5, exactly what a well-formed wrong answer of 7 tokens earns.
#
# Then the same runs with DAPO's slack, scaled to this task: L = 13 and c = 3, so that
# L - c = 10, the longest right answer. The table adds, over the last 25 steps, the share of
# truncated completions and the mean completion length; the figure shows that length.
#
# <details><summary>How we know</summary>
#
# `benchmarks/overlong.py` ran the default run (configs/cpu-tiny.toml: accuracy 1.0, format
# 0.5) at L = 9 and at L = 13 for 150 steps, seeds 0, 1 and 2, and wrote `benchmarks/results/overlong.json`,
# which the cell below reads. The punishment is `grpo_edu.environment.rewards.soft_overlong_punishment`,
# added to the reward with weight 1. `mask_truncated_completions` is TRL's name for filtering.
#
# </details>

# %%
overlong_runs = results_of("overlong")
ol = table(overlong_runs, **{key: (lambda run, key=key: float(np.mean(run["steps"][key][-25:])), f)
                             for key, f in (("truncated", ".3f"), ("completion_length/mean", ".2f"))})
ol_final = ol["final accuracy"]
ol_late = {v: {key: ol[key][v] for key in ("truncated", "completion_length/mean")} for v in overlong_runs["variants"]}
print("\nfinal accuracy, paired over seeds: mean difference [95% t interval]")
compare("overlong filtering", overlong_runs, [("filter", "plain"), ("filter-13", "plain-13")])
compare("overlong punishment", overlong_runs, [("soft", "plain"), ("soft-13", "plain-13")])
figure, axes = plt.subplots(1, 2, figsize=(11, 3), sharey=True)
for axis, limit, suffix in ((axes[0], 9, ""), (axes[1], 13, "-13")):
    for v in ("plain", "filter", "soft"):
        mean_curve(axis, overlong_runs, v + suffix, "completion_length/mean", label=v)
    axis.axhline(limit, color="gray", linestyle="--", linewidth=1)
    axis.set(xlabel="step", title=f"L = {limit}")
axes[0].set_ylabel("completion length (tokens,\nmean of 3 seeds)")
axes[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1))
plt.show()

# %% [markdown]
# At L = 9, paired by seed, the plain run beats both methods. Filtering never trains a right
# answer that needs 10 tokens, since every one is truncated. The punishment collapses every
# seed: the group-relative advantage prefers the short answers, and the policy learns to stop
# at seven tokens (the left panel), where only a one-character answer fits.
#
# With DAPO's slack the policy truncates under 1% of its completions, and neither method is
# separated from the plain run at this size. They are made for a policy that rambles past its
# answer, and this one does not.
#
# **Verdict.** Where the limit cuts right answers, the plain run beats both; with DAPO's slack,
# neither is separated from the plain run.

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
        verdicts["overlong filtering", "filter", "plain"].high < 0
        and verdicts["overlong punishment", "soft", "plain"].high < 0,
    "at L = 13 every run truncates under 1% of its completions, and neither method is separated from plain":
        all(np.mean(ol_late[v]["truncated"]) < 0.01 for v in ("plain-13", "filter-13", "soft-13"))
        and not verdicts["overlong filtering", "filter-13", "plain-13"].separated
        and not verdicts["overlong punishment", "soft-13", "plain-13"].separated,
}
Claims(claims)

# %% [markdown]
# ## 4. Dynamic sampling: refill the groups with no signal
#
# **What it is.** A group whose rewards are all equal carries no policy gradient, yet dilutes
# the rest (chapter 4). `filter_zero_std_groups` drops such groups, and the batch trains on
# fewer. DAPO's dynamic sampling (`dynamic_sampling_rounds` = k) replaces them with the
# differing groups of up to k more rollouts of fresh prompts.
#
# **What it assumes.** That fresh prompts hold groups that differ: a policy that solves some
# prompts and not others. DAPO filters on accuracy. This book's filter reads the total reward,
# so a group that differs only in its format reward counts as signal here.
#
# **When it helps.** As a policy improves, more of its groups are all right, and the batch
# would shrink. It acts where the completions are sampled:

# %%
part("dynamic_sampling_rounds")

# %% [markdown]
# **What our runs saw.** Three runs keep, drop and refill (k = 4) the all-equal groups for 40
# steps, on two tasks. The first is a hard case: chapter 7's Countdown, which the arithmetic
# policy never solves, so only the format reward varies within some groups. The second is the
# regime DAPO made refill for. The committed policy `trained` (the default run's 1,500 steps)
# answers 0.992 of the held-out arithmetic problems greedy. Sampled, some of its groups hold a
# wrong answer and many are all right. These runs (`-solved`) continue training it at a tenth
# of the learning rate, and score pass@1 from 4 samples per problem.
#
# The table gives, per step, the groups that carry a gradient, the rollouts sampled, and the
# steps that reached the limit; then the KL over the last 10 steps. The figure shows the
# groups with signal.
#
# <details><summary>How we know</summary>
#
# `benchmarks/dynamic_sampling.py` ran the six variants for 40 steps, seeds 0, 1 and 2, and
# wrote `benchmarks/results/dynamic_sampling.json`, which the cell below reads. The filter is
# `grpo_edu.algorithm.advantages.zero_std_groups`, applied to the weighted sum of the rewards
# (`grpo_edu.training.dynamic_sampling`). When k rollouts do not fill the batch, the slots
# left keep all-equal groups and the step logs `dynamic_sampling/short` (verl's recipe raises
# an error there instead). The `-solved` variants set `model = "trained"`,
# `learning_rate = 3e-5` and `eval_samples = 4`; the policy is
# `grpo_edu/assets/tiny-arithmetic-trained`, and `benchmarks/dynamic_sampling.py
# --trained-policy` makes it again.
#
# </details>

# %%
dynamic_runs = results_of("dynamic_sampling")
B = 16   # prompts_per_step of configs/cpu-tiny.toml, on both tasks


def last_pass_at_1(run):
    return [x for x in run["steps"]["eval/pass_at_1"] if x is not None][-1]


ds = table(dynamic_runs, **{
    "groups with signal": (lambda run: B * (1 - np.mean(run["steps"]["zero_std_groups"])), ".1f"),
    "rollouts": (lambda run: np.mean([1.0 if x is None else x for x in run["steps"]["dynamic_sampling/rounds"]]), ".2f"),
    "steps at the limit": (lambda run: sum(1 for x in run["steps"]["dynamic_sampling/short"] if x), ".1f"),
    "late KL": (lambda run: np.mean([k for k in run["steps"]["kl"][-10:] if k is not None]), ".4f")})
signal = ds["groups with signal"]
print("\npass@1 at step 40, paired over seeds: mean difference [95% t interval]")
compare("dynamic sampling", dynamic_runs, [("refill-solved", "keep-solved"), ("refill-solved", "drop-solved"),
                                           ("drop-solved", "keep-solved")], value=last_pass_at_1)
figure, axes = plt.subplots(1, 2, figsize=(11, 3), sharey=True)
for axis, suffix, title in ((axes[0], "", "Countdown (never solved)"), (axes[1], "-solved", "arithmetic (mostly solved)")):
    for v in ("keep", "drop", "refill"):
        mean_curve(axis, dynamic_runs, v + suffix, "zero_std_groups", label=v, scale=lambda y: B * (1 - y))
    axis.set(xlabel="step", title=title)
axes[0].set_ylabel(f"groups with signal, of {B}\n(mean of 3 seeds)")
axes[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1))
plt.show()

# %% [markdown]
# On Countdown, refilling trains two to three times as many groups with signal as dropping.
# It pays in rollouts, and reaches the limit in about half the steps. But it cannot make
# signal where there is none. The groups it finds differ in format only, the KL grows faster,
# and held-out accuracy stays 0. DAPO's accuracy filter would find them all-equal.
#
# On the solved task refill does what it was made for: it fills all 16 slots, at about half
# Countdown's rollouts. What that buys is not visible: pass@1 is not separated between any two
# of the three, and at this learning rate the policy barely moves in 40 steps. DAPO reports its
# gain over a whole run of a 32B model; this shows the mechanism, not that gain.
#
# **Verdict.** Refill fills the batch with groups that carry a gradient, at a price in
# rollouts; it cannot create signal, and in 40 steps it is not separated from keep or drop.

# %%
first_all_equal = [x for r in dynamic_runs["runs"] if r["variant"] == "refill-solved"
                   for x in r["steps"]["dynamic_sampling/first_zero_std"]]
claims = {
    "Countdown: refill trains more than twice as many groups with signal per step as drop, in every seed":
        min(signal["refill"]) > 2 * max(signal["drop"]),
    "Countdown: refill samples more than 3 rollouts per step on average":
        np.mean(ds["rollouts"]["refill"]) > 3,
    "held-out Countdown accuracy is 0 for every variant, seed and evaluation":
        all(a == 0.0 for r in dynamic_runs["runs"] if not r["variant"].endswith("-solved") for _, a in r["eval"]),
    "Countdown: refill ends with a larger KL than every keep and drop seed":
        min(ds["late KL"]["refill"]) > max(ds["late KL"]["keep"] + ds["late KL"]["drop"]),
    "solved: refill trains every slot on a group with signal, where keep and drop train fewer than 12 of 16":
        min(signal["refill-solved"]) == B and max(signal["keep-solved"] + signal["drop-solved"]) < 12,
    "solved: more than a third of the first rollout's groups are all-equal under refill":
        np.mean(first_all_equal) > 1 / 3,
    "solved: paired by seed, pass@1 at step 40 does not separate refill from keep or drop":
        not any(v.separated for (tool, _, _), v in verdicts.items() if tool == "dynamic sampling"),
}
Claims(claims)

# %% [markdown]
# ## Choosing a tool
#
# Every paired comparison of this chapter, by tool:

# %%
print(f"{'tool':<21}{'comparisons':<13}separated (the interval excludes 0)")
for tool in dict.fromkeys(tool for tool, _, _ in verdicts):
    mine = {(a, b): v for (t, a, b), v in verdicts.items() if t == tool}
    print(f"{tool:<21}{len(mine):<13}" + (", ".join(v.words(a, b).split(":")[0] for (a, b), v in mine.items()
                                                    if v.separated) or "none"))
separated = sum(v.separated for v in verdicts.values())
print(f"\n{len(verdicts)} paired comparisons: {separated} separated, {len(verdicts) - separated} not separated at this size")

# %%
Claims({"the only separated comparisons are the plain run's wins at L = 9":
        {key for key, v in verdicts.items() if v.separated}
        == {("overlong filtering", "filter", "plain"), ("overlong punishment", "soft", "plain")}})

# %% [markdown]
# 12 of the 14 comparisons are not separated. For a reader choosing tools, that means one
# thing: at this size (a tiny policy, 150 steps or fewer) and with three seeds, our runs cannot
# tell the tool from no tool. It is not evidence that the tool does nothing. An effect smaller
# than the interval, or one that needs long traces, a large policy or a long run, would look
# exactly like this. So choose a tool by its assumption:
#
# | Symptom in your run | Tool (key) | It assumes | What our runs saw |
# |---|---|---|---|
# | The KL to a frozen reference keeps growing in a long run | a moving reference (`ref_sync_steps`, `ref_mixup_alpha`) | the policy must travel far from its start | the KL stays small; accuracy not separated (3 of 3) |
# | The KL term holds the policy back | no KL term (`beta = 0`) | the reward alone keeps the policy sane | not separated (1 of 1) |
# | Most completion tokens are near-certain; the choices sit at a few forks | entropy masking (`top_entropy_quantile`) | long traces, few forks, no KL term | not separated, with or without the KL term (3 of 3) |
# | Many completions end at `max_completion_length` (`truncated`) | overlong filtering (`mask_truncated_completions`) | what the limit cuts is rambling | plain beats it where the limit cuts right answers; not separated with slack |
# | The same | soft overlong punishment (`overlong_cache`) | the same, and L - c above every right answer | collapses the run where the limit cuts right answers; not separated with slack |
# | Many groups are all right or all wrong (`zero_std_groups`) | dynamic sampling (`dynamic_sampling_rounds`) | fresh prompts hold groups that differ | fills the batch; cannot create signal; pass@1 not separated in 40 steps (3 of 3) |
#
# ## What you learned
#
# - Each tool is a bet about the run: a reference that must move, forks among near-certain
#   tokens, rambling at the limit, groups that differ somewhere.
# - A moving reference keeps the KL the loss sees small, because the anchor follows the policy.
# - Entropy masking trains the policy term of the forks only; the KL term and the normaliser
#   still count every token.
# - Overlong filtering and the soft punishment hurt where the limit cuts right answers.
# - Dynamic sampling fills the batch with groups whose rewards differ, at the price of
#   rollouts; it cannot make signal where no completion is right.
# - Choose a tool by its assumption; then measure it on your own run, paired by seed.
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
