# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 9. What GRPO teaches a model
#
# > **You will learn**
# > - what a base model must already do before outcome rewards can teach it to reason
# > - why accuracy and completion length rise together, and how much of the length is the loss
# > - whether a self-check emerges under RL, or was there before it
# > - whether RL discovers new answers or sharpens the ones the base could already sample
# >
# > **You need first**: chapter 6 (a tiny model that learns).
# >
# > **Reading time**: about 20 minutes. **Compute**: at most 120 s on a 2-core CPU. [Glossary](../docs/glossary.md) · [Notation](../docs/notation.md)
#
# DeepSeek-R1-Zero is DeepSeek-V3's base model trained by GRPO (Group Relative Policy
# Optimization) alone: no supervised fine-tuning first, and a reward that only checks the
# final answer and the format (Guo et al. 2025, "DeepSeek-R1"). Its paper reports two
# things that made GRPO famous. Accuracy and response length rose together. And the model
# began to re-check its own work, its "aha moment".
#
# Since then the field has asked what that means. Were the re-checks already in the base?
# Is the longer answer reasoning, or a bias of the loss? Does RL find answers the base could
# not, or pick the ones it already could? Each study that answered used models of hundreds of
# millions of parameters and many GPUs.
#
# This chapter answers the same questions on a laptop CPU. We write the pretraining data
# ourselves, so we know exactly what the base model has seen. Then we watch GRPO act on it.

# %%
import json

import matplotlib.pyplot as plt
import numpy as np
import torch

from grpo_edu.algorithm.statistics import paired_seeds
from grpo_edu.book import home, schematics

home.enter()   # the book's folder: its files are read and its runs written from there

torch.set_num_threads(1)
schematics.three_formats()

# %% [markdown]
# ## A task where working pays
#
# The task is the digit sum: n digits, and the answer is their sum mod 10. Each digit comes
# after a letter, so the prompt `a3b8c5d1e9=` asks for 3 + 8 + 5 + 1 + 9 = 26, answer 6.
# The letters are index hints (Zhou et al. 2024, "What Algorithms can Transformers Learn?").
# n is the problem's **depth**.
#
# A completion can answer in three formats. **Direct** writes only the answer. **Worked**
# writes the running value after each digit: `b81` says "at letter b, the digit 8, running
# value 1". **Check** is a worked chain with one wrong value, flagged with `!` and redone.
#
# Why this task? A worked step is easy at any depth. It finds its digit by its letter and
# adds it to the value three tokens back. A direct answer must add all n digits in one
# forward pass. So for a small model, working pays more the deeper the problem.
#
# We pretrained three bases of 652,928 parameters each (a Llama of three layers), on
# mixtures we chose. **start** saw half direct answers, 40% worked chains and 10% checks.
# **no-check** saw no check at all. **no-top-worked** saw no worked chain at depth 12. Each
# saw depths 3 to 12, mostly short ones.
#
# <details><summary>How we know</summary>
#
# `grpo-edu pretrain --task digitsum` wrote each base, with the command in its model card
# (`grpo_edu/assets/tiny-digitsum-*/README.md`). `benchmarks/reasoning.py --bases` measured
# them, and wrote `benchmarks/results/reasoning.json`, which this chapter reads.
#
# </details>

# %%
from grpo_edu.policy.models import load_policy, policy_source

results = json.loads(home.path("benchmarks/results/reasoning.json").read_text())
bases = results["bases"]
model, tokenizer = load_policy(policy_source("digitsum-start"))
print(f"digitsum-start: {sum(p.numel() for p in model.parameters()):,} parameters, "
      f"{model.config.num_hidden_layers} layers of width {model.config.hidden_size}")

figure, axes = plt.subplots(1, 3, figsize=(12, 3.2), sharey=True)
for axis, name in zip(axes, bases):
    rows = bases[name]["precondition"]
    depths = sorted(int(d) for d in rows)
    for key, label, color in (("direct/greedy", "direct, forced", "#9aa5b1"),
                              ("worked/greedy", "worked, forced", "#4a6fa5"),
                              ("free/sampled", "its own choice, sampled", "#e39b3b")):
        axis.plot(depths, [rows[str(d)][key] for d in depths], "o-", color=color, label=label)
    axis.axhline(0.1, color="#555555", lw=0.8, ls=":")
    axis.axvspan(12.5, 13.5, color="#f1f1f1")
    axis.set(title=name.removeprefix("digitsum-"), xlabel="depth (digits)", ylim=(-0.02, 1.05))
axes[0].set_ylabel("accuracy (greedy unless named)")
axes[0].legend(frameon=False, fontsize=8)
figure.tight_layout()
plt.show()

start = bases["digitsum-start"]["precondition"]
taught = [str(d) for d in range(3, 13)]
direct = [start[d]["direct/greedy"] for d in taught]
worked = [start[d]["worked/greedy"] for d in taught]
print(f"start, depths 3 to 12: direct answers right {min(direct):.2f} to {max(direct):.2f} of the time "
      f"(chance: 0.10); worked chains {min(worked):.2f} to {max(worked):.2f}")
print(f"start, depth 13 (never taught): direct {start['13']['direct/greedy']:.2f}, "
      f"worked {start['13']['worked/greedy']:.2f}")
free = [start[d]["free/sampled"] for d in taught]
print(f"start, its own choice: greedy picks {start['12']['free/greedy_format']} at every depth; sampled, "
      f"right {min(free):.2f} to {max(free):.2f}, worked share "
      f"{min(start[d]['free/format/worked'] for d in taught):.2f} to {max(start[d]['free/format/worked'] for d in taught):.2f}")

# %% [markdown]
# **The precondition.** Emergence needs a base for which working is worth it. Direct
# answers must fail at depth while each written step stays easy. The figure forces each
# format: we write the first tokens of a direct answer (`<think></think>`) or of a worked
# chain (`<think>a`) and let the model go on. The dotted line is chance, one digit in ten.
#
# It holds, and more strongly than we asked. Forced to answer directly, the start base is
# right no more often than a guess, at every depth, even three digits. Forced to work, it is
# right every time up to depth 12. At depth 13 it has never seen the letter `m`, and working
# fails too. The other two bases look the same where they were taught. no-top-worked never saw
# a worked chain at depth 12, and there its working fails.
#
# Left to itself, the start base answers directly about half the time, as its pretraining did.
# Half its samples are then a guess. The behaviour that GRPO could reward is already in the
# base. Only the choice between the formats is left to learn.

# %% [markdown]
# ## GRPO on the base, live
#
# Now the run. `configs/cpu-reasoning.toml` trains the start base with outcome reward alone:
# 1 for the right answer, 0 otherwise, with no format reward and no KL term. Each step
# samples G = 8 completions for each of B = 16 problems of depths 3 to 12. Here are its
# first 50 steps:

# %% tags=["platform-numerics"]
from grpo_edu.config import TrainConfig
from grpo_edu.training import trainer

config = TrainConfig.from_toml(home.path("configs/cpu-reasoning.toml"),
                               ["steps=50", "checkpoint_every=0", "progress=false",
                                "output_dir='runs/chapter-9'"])
live = trainer.train(config)
history = live.history
print(f"{'step':>4} {'reward':>7} {'length':>7} {'direct':>7} {'worked':>7} {'check':>6}  (rollouts, mean of 10 steps)")
for end in range(10, len(history) + 1, 10):
    window = history[end - 10:end]
    mean = {key: np.mean([m[key] for m in window]) for key in
            ("reward/mean", "completion_length/mean", "format/direct", "format/worked", "format/check")}
    print(f"{end:>4} {mean['reward/mean']:>7.3f} {mean['completion_length/mean']:>7.1f} "
          f"{mean['format/direct']:>7.3f} {mean['format/worked']:>7.3f} {mean['format/check']:>6.3f}")
print(f"held-out greedy accuracy: {live.summary['start_accuracy']:.4f} -> {live.summary['final_accuracy']:.4f}")

# %% [markdown]
# LIVE PROSE

# %%
grid = results["runs"]


def runs_of(arm):
    return sorted((r for r in grid if r["arm"] == arm), key=lambda r: r["seed"])


same = [history[i][key] == runs_of("grpo")[0]["steps"][key][i]
        for i in range(len(history)) for key in ("reward/mean", "completion_length/mean", "format/worked")]
print(f"the live run's first {len(history)} steps equal the results file's seed 0: {all(same)}")

# %% [markdown]
# ## Accuracy and length rise together
#
# The results file holds the whole run, 150 steps, on three seeds. The figure is R1-Zero's two
# curves at toy scale, with the format shares beneath: thin lines are seeds, thick ones their
# mean, each a 5-step moving mean.

# %%
def curves(arm, key):
    """(seeds, steps): a kept step figure of each seed's run."""
    return np.array([r["steps"][key] for r in runs_of(arm)], dtype=float)


def smooth(values, width=5):
    return np.convolve(values, np.ones(width) / width, mode="valid")


figure = plt.figure(figsize=(11, 5.6))
top_left, top_right = figure.add_subplot(2, 2, 1), figure.add_subplot(2, 2, 2)
bottom = figure.add_subplot(2, 1, 2)
x = np.arange(1, results["steps"] + 1)
xs = x[2:-2]   # where a centred 5-step mean is defined
for axis, key, title in ((top_left, "reward/mean", "accuracy of the rollouts"),
                         (top_right, "completion_length/mean", "completion length (tokens)")):
    for seed_curve in curves("grpo", key):
        axis.plot(xs, smooth(seed_curve), color="#4a6fa5", lw=0.8, alpha=0.35)
    axis.plot(xs, smooth(curves("grpo", key).mean(axis=0)), color="#4a6fa5", lw=2)
    axis.set(title=title, xlabel="step")
top_left.set_ylim(0, 1.02)
shares = [smooth(curves("grpo", f"format/{name}").mean(axis=0)) for name in ("direct", "worked", "check", "other")]
bottom.stackplot(xs, shares, labels=["direct", "worked", "check", "other"],
                 colors=["#9aa5b1", "#4a6fa5", "#3c8d5a", "#e39b3b"], alpha=0.8)
bottom.set(title="share of each format in the rollouts", xlabel="step", ylim=(0, 1), xlim=(x[0], x[-1]))
bottom.legend(loc="center right", frameon=False, fontsize=8)
figure.tight_layout()
plt.show()

verdicts = results["verdicts"]
for name in ("grpo: length, last - first 10 steps", "grpo: worked share, last - first 10 steps"):
    print(f"{name}: {verdicts[name]['words']}")

# %% [markdown]
# HEADLINE PROSE

# %% [markdown]
# ## Five questions, answered on a CPU
#
# Each answer below is a paired comparison over the three seeds, or over the same problems.
# A difference is "separated" only where its 95% interval excludes zero.

# %% [markdown]
# ### 1. Was the self-check there before RL?
#
# Q1 PROSE

# %%
for arm in ("grpo", "no_check"):
    base = bases[results["arms"][arm][0]]["probe"]["by_depth"]
    written = sum(row["free/checks/written"] for row in base.values())
    print(f"{arm:>9} base: '!' written {written} times in {4 * sum(row['problems'] for row in base.values())} "
          f"samples")
for name in ("grpo: check share, last - first 10 steps", "grpo: checks that fix, last - first 10 steps",
             "no_check: check share, last - first 10 steps"):
    print(f"{name}: {verdicts[name]['words']}")

# %% [markdown]
# ### 2. How much of the length is the loss?
#
# Q2 PROSE

# %%
for name in ("length growth, grpo - dr_grpo", "length at the end, grpo - dr_grpo",
             "dr_grpo: length, last - first 10 steps"):
    print(f"{name}: {verdicts[name]['words']}")

# %% [markdown]
# ### 3. Does RL discover, or sharpen?
#
# Q3 PROSE

# %%
figure, axis = plt.subplots(figsize=(6, 3.4))
base_pass = bases["digitsum-start"]["pass"]["pass_at_k"]
ks = [int(k) for k in base_pass]
axis.plot(ks, [base_pass[str(k)] for k in ks], "o-", color="#9aa5b1", label="the base")
trained = np.mean([[r["pass"]["pass_at_k"][str(k)] for k in ks] for r in runs_of("grpo")], axis=0)
axis.plot(ks, trained, "o-", color="#4a6fa5", label="after GRPO (mean of 3 seeds)")
axis.plot(ks, [1 - 0.9 ** k for k in ks], ":", color="#555555", label="a guess: 1 - 0.9^k")
axis.set(xscale="log", xlabel="k (samples a problem)", ylabel="pass@k", ylim=(0, 1.02))
axis.legend(frameon=False)
figure.tight_layout()
plt.show()
for k in (1, 16, 256):
    print(f"pass@{k}: {verdicts[f'grpo: pass@{k}, trained - base']['words']}")

# %% [markdown]
# ### 4. Does RL extend what pretraining left out?
#
# Q4 PROSE

# %%
for arm, depth in (("grpo", 13), ("no_top_worked", 12)):
    print(f"{arm}, depth {depth}: {verdicts[f'{arm}: depth {depth} sampled accuracy, end - start']['words']}")

# %% [markdown]
# ### 5. What the model writes, before and after
#
# Q5 PROSE

# %%
first = runs_of("grpo")[0]
for (prompt, before), (_, after) in zip(first["examples_start"], first["examples_end"]):
    print(f"{prompt:<28} before: {before}\n{'':<28} after:  {after}")

# %% [markdown]
# ## What you learned
#
# - LEARNED
#
# ## Check yourself
#
# 1. Q
#
#    <details><summary>Answer</summary>
#
#    A
#
#    </details>
#
# ## Exercises
#
# Checkers are in `grpo_edu.exercises.ch09`. Each exercise has a hint and a worked solution,
# folded: open them when you want them.
#
# **9.1 What a completion does.** Write `my_read_format(completion)`: `"direct"`, `"worked"`,
# `"check"` or `"other"`, as the run's format shares count them. A completion must be
# `<think>`, its reasoning, `</think>`, then `\boxed{...}` and nothing after it; else it is
# `"other"`. Empty reasoning is direct. Reasoning made only of steps (a letter, a digit, a
# digit, each step optionally followed by `!`) is worked, or check if it holds a `!`. Anything
# else in the reasoning is `"other"`. The first attempt below counts any `!` as a check.
#
# <details><summary>Hint</summary>
#
# Split at the first `</think>`. Check the tail before the reasoning. A regular expression
# for the steps is `(?:[a-z]\d\d!?)+`, matched against the whole reasoning
# (`re.fullmatch`).
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# import re
#
#
# def my_read_format(completion):
#     if not completion.startswith("<think>") or "</think>" not in completion:
#         return "other"
#     reasoning, _, rest = completion[len("<think>"):].partition("</think>")
#     if not (rest.startswith("\\boxed{") and rest.endswith("}") and rest.count("}") == 1):
#         return "other"
#     if reasoning == "":
#         return "direct"
#     if not re.fullmatch(r"(?:[a-z]\d\d!?)+", reasoning):
#         return "other"
#     return "check" if "!" in reasoning else "worked"
#
#
# ch09.check_read_format(my_read_format)
# ```
#
# </details>

# %%
import re

from grpo_edu.exercises import ch09


def my_read_format(completion):
    if "!" in completion:                                  # fix me: where the "!" is, and the rest
        return "check"
    if not completion.startswith("<think>") or "</think>" not in completion:
        return "other"
    reasoning, _, rest = completion[len("<think>"):].partition("</think>")
    if reasoning == "":
        return "direct"
    return "worked" if re.fullmatch(r"(?:[a-z]\d\d)+", reasoning) else "other"


ch09.check_read_format(my_read_format)

# %% [markdown]
# **9.2 The length a format costs.** Every markup tag is one token, and so is every character.
# A direct answer is 6 tokens: `<think>`, `</think>`, `\boxed{`, the digit, `}` and the end.
# A worked chain adds 3 tokens a step, n steps at depth n. A check adds 4 more: the wrong step
# and its `!`. Write `my_expected_length(direct, worked, check, depths)`: the mean completion
# length of a policy that answers in each format with these shares, on problems whose depth
# is uniform over `depths = (low, high)`, both ends included. Then compare it with the run's
# lengths above.
#
# <details><summary>Hint</summary>
#
# The mean depth of a uniform depth from low to high is (low + high) / 2. Every format pays the
# 6 tokens; worked and check pay 3 a step; check pays 4 more.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# def my_expected_length(direct, worked, check, depths):
#     mean_depth = (depths[0] + depths[1]) / 2
#     return 6 + 3 * mean_depth * (worked + check) + 4 * check
#
#
# ch09.check_expected_length(my_expected_length)
# ```
#
# </details>

# %%
def my_expected_length(direct, worked, check, depths):
    raise NotImplementedError("your expected length here")


ch09.check_expected_length(my_expected_length)
