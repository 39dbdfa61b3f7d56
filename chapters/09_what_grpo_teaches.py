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
# > - whether a self-check emerges under reinforcement learning (RL), or was there before it
# > - whether RL discovers new answers or sharpens the ones the base could already sample
# >
# > **You need first**: chapter 6 (a tiny model that learns).
# >
# > **Reading time**: about 18 minutes. **Compute**: at most 180 s on a 2-core CPU. [Glossary](../docs/glossary.md) · [Notation](../docs/notation.md)
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
figure.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=3, frameon=False, fontsize=8)
figure.tight_layout(rect=(0, 0.08, 1, 1))   # the legend below the panels, clear of every curve
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
# 1 for the right answer, 0 otherwise, with no format reward and no Kullback-Leibler (KL) term. Each step
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
# The direct answers die out within the first 50 steps, and the worked chains take their place.
# Nothing rewarded working. The reward only checked the answer, and the worked answers were the
# right ones. The held-out greedy accuracy jumps at once: greedy decoding picks the worked
# format as soon as it is a hair more likely than the direct one.
#
# At step 40 the run's doctor (chapter 7) warns of a length bias and advises `dr_grpo`. Question
# 2 below tests that advice: the length here grows for another reason.
#
# The live run is the results file's seed 0, step for step, on a machine with the book's pinned
# kernels:

# %% tags=["platform-numerics"]
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
# Accuracy and length rise together, as in R1-Zero's paper. Here we can see why. The length
# grows because the format that wins is longer: a worked chain of depth n costs 3n tokens more
# than a direct answer. The length's spread falls too, as one format takes over. The curves
# flatten after about 75 steps: the direct answers are gone, and working is all that is left.

# %% [markdown]
# ## Five questions, answered on a CPU
#
# Each answer below is a paired comparison over the three seeds (or over the same problems).
# It says "beats" only where its 95% interval excludes zero, and "not separated" otherwise
# (`grpo_edu.algorithm.statistics`, as in chapter 8).

# %% [markdown]
# ### 1. Was the self-check there before RL?
#
# **No, it was there.** The start base writes `!` before RL, and most of its checks flag a value
# that was wrong. GRPO did not grow the check share. It did not grow the checks that fix an
# answer either: they fell, because fewer chains go wrong. From the base that never saw a check,
# no check appeared at all. This is Liu et al.'s finding (2025, "Understanding R1-Zero-Like
# Training"): the "aha" behaviours are in the base before RL. Gandhi et al. (2025, "Cognitive
# Behaviors that Enable Self-Improving Reasoners") found that RL amplifies such behaviours only
# where the base has them.

# %%
def said(name):
    return verdicts[name]["words"]


rows = [bases["digitsum-start"]["precondition"][str(d)] for d in range(3, 13)]
written = sum(row["free/checks/written"] for row in rows)
samples = 4 * sum(row["problems"] for row in rows)
print(f"the start base, depths 3 to 12: {written} '!' in {samples:,} samples; "
      f"{sum(row['free/checks/on_wrong'] for row in rows)} on a wrong value, "
      f"{sum(row['free/checks/fixed_to_right_answer'] for row in rows)} in a completion whose answer is right")
print(f"check share: {said('grpo: check share, last - first 10 steps')}")
print(f"checks that fix, a completion: {said('grpo: checks that fix, last - first 10 steps')}")
never = sum(sum(r["steps"]["checks/written"]) for r in runs_of("no_check"))
print(f"the no-check runs: {never:g} '!' in {3 * results['steps'] * 128:,} rollouts' completions")

# %% [markdown]
# ### 2. Why does the length grow?
#
# **Because the right format is longer.** The shares of the three formats alone predict the
# mean length (exercise 9.2 computes it): the prediction and the measurement agree at both
# ends. Liu et al. (2025) showed that GRPO's per-completion normaliser also favours long wrong
# answers, and proposed `dr_grpo`, a constant normaliser. Here the two normalisers grow the length
# alike: the difference in their growth is not separated from zero.

# %%
from grpo_edu.exercises.ch09 import expected_length


def window(run, key, end):
    values = run["steps"][key][:10] if end == "first" else run["steps"][key][-10:]
    return float(np.mean(values))


for arm in ("grpo", "dr_grpo"):
    for end in ("first", "last"):
        measured = np.mean([window(r, "completion_length/mean", end) for r in runs_of(arm)])
        shares = [np.mean([window(r, f"format/{f}", end) for r in runs_of(arm)]) for f in ("direct", "worked", "check")]
        print(f"{arm:>8}, {end:>5} 10 steps: {measured:.1f} tokens measured, {expected_length(*shares, (3, 12)):.1f} "
              f"from the format shares alone")
for name in ("length growth, grpo - dr_grpo", "length at the end, grpo - dr_grpo"):
    print(f"{name}: {said(name)}")

# %% [markdown]
# ### 3. Does RL discover, or sharpen?
#
# **It sharpens.** pass@k is the chance that at least one of k samples is right (Chen et al.
# 2021, "Evaluating Large Language Models Trained on Code", give its unbiased estimator). After
# GRPO, one sample is right far more often. With 16 samples or more, the base solves as many
# problems, or more. Yue et al. (2025, "Does Reinforcement Learning Really Incentivize Reasoning
# Capacity in LLMs Beyond the Base Model?") found the same crossing on large models.
#
# Our task shows what the crossing can be made of. The answer is one digit, so a guess is right
# one time in ten, and 1 - 0.9^k guesses reach pass@k close to 1. The base keeps guessing on
# problems it cannot work, at depth 13 for one. The trained policy works every problem the same
# way, and where working fails, it fails every time.

# %%
figure, axis = plt.subplots(figsize=(6.5, 3.4))
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
    print(f"pass@{k}: {said(f'grpo: pass@{k}, trained - base')}")
from grpo_edu.training.evaluation import pass_at_k

n, asked = bases["digitsum-start"]["pass"]["n"], bases["digitsum-start"]["pass"]["depths"]
for label, keep in (("depths 3 to 12", lambda d: d <= 12), ("depth 13", lambda d: d == 13)):
    def mean_pass(correct, k):
        return np.mean([pass_at_k(n, c, k) for c, d in zip(correct, asked) if keep(d)])
    base_correct = bases["digitsum-start"]["pass"]["correct"]
    print(f"{label}: pass@1 {mean_pass(base_correct, 1):.2f} -> "
          f"{np.mean([mean_pass(r['pass']['correct'], 1) for r in runs_of('grpo')]):.2f}, pass@256 "
          f"{mean_pass(base_correct, 256):.2f} -> {np.mean([mean_pass(r['pass']['correct'], 256) for r in runs_of('grpo')]):.2f}"
          f" (the base -> after GRPO)")

# %% [markdown]
# ### 4. Does RL reach past what pretraining taught?
#
# **No.** Depth 13 was beyond the bases' pretraining. There the trained policy is no better
# than before RL; it is slightly worse, as question 3 explains. The no-top-worked base never saw
# a worked chain at depth 12. RL did not teach it to work there. Zhang, Neubig and Yue (2025,
# "On the Interplay of Pre-Training, Mid-Training, and RL on Reasoning Language Models") found
# that RL extends a model only where pretraining leaves it close to competence. A depth with no
# worked example at all is not close.

# %%
for arm, depth in (("grpo", 13), ("no_top_worked", 12)):
    base = bases[results["arms"][arm][0]]["probe"]["by_depth"][str(depth)]
    ends = [r["probes"][-1]["by_depth"][str(depth)] for r in runs_of(arm)]
    print(f"{arm}, depth {depth}: sampled accuracy {base['free/sampled']:.2f} -> "
          f"{np.mean([e['free/sampled'] for e in ends]):.2f}, worked share {base['free/format/worked']:.2f} -> "
          f"{np.mean([e['free/format/worked'] for e in ends]):.2f}; "
          f"{said(f'{arm}: depth {depth} sampled accuracy, end - start')}")

# %% [markdown]
# ### 5. Which behaviour does RL amplify?
#
# **The format that pays.** From every base, GRPO drove the direct answers out and kept one
# format: the worked chain, the more accurate one of those that pretraining put there. Zhao et
# al. (2025, "Echo Chamber: RL Post-training Amplifies Behaviors Learned in Pretraining") saw the
# same with models trained from scratch on known mixtures. RL chose among the behaviours it
# found. It did not write a new one.

# %%
for arm in ("grpo", "no_check", "no_top_worked"):
    shares = {f: (np.mean([window(r, f"format/{f}", "first") for r in runs_of(arm)]),
                  np.mean([window(r, f"format/{f}", "last") for r in runs_of(arm)])) for f in ("direct", "worked", "check")}
    print(f"{arm:>13}: " + ", ".join(f"{f} {a:.2f} -> {b:.2f}" for f, (a, b) in shares.items()))
first = runs_of("grpo")[0]
print()
for (prompt, before), (_, after) in zip(first["examples_start"], first["examples_end"]):
    print(f"{prompt:<22} step 0:   {before}\n{'':<22} step {results['steps']}: {after}")

# %% [markdown]
# ## What you learned
#
# - Outcome reward teaches a behaviour only where the base already has it and it pays: here,
#   worked chains that are right where direct answers are a guess.
# - Accuracy and length rose together because the right format is longer. The format shares
#   alone predict the length, under either normaliser.
# - The self-check did not emerge. It was in the base, RL did not grow it, and a base without it
#   never wrote one.
# - RL sharpened: one sample is right far more often, while many samples of the base solve as
#   much. It did not reach a depth that pretraining left without worked examples.
# - Measure the base before RL. What RL can do is decided there.
#
# ## Check yourself
#
# 1. A base answers directly 3 times in 5 and works otherwise. Direct answers are right one
#    time in 10, worked ones always. What is its sampled accuracy, and what does outcome reward
#    push it towards?
#
#    <details><summary>Answer</summary>
#
#    3/5 x 1/10 + 2/5 x 1 = 23/50, or 46%. Within a group, the worked completions are right more
#    often, so their advantages are positive and the policy moves towards working.
#
#    </details>
#
# 2. Why did the held-out greedy accuracy jump from chance to perfect in the first steps, while
#    the rollouts' accuracy climbed slowly?
#
#    <details><summary>Answer</summary>
#
#    Greedy decoding takes the likelier first token. The base gave `</think>` (direct) a hair
#    more probability than `a` (worked). A few updates tip it, and every greedy answer becomes a
#    worked chain. The samples keep the mixture until the direct share has drained away.
#
#    </details>
#
# 3. The trained policy's pass@256 at depth 13 is below the base's. Does that mean the base
#    "can reason" at depth 13?
#
#    <details><summary>Answer</summary>
#
#    No. Both are near chance there. The base often answers directly, and a direct answer is a
#    guess that is right one time in ten: enough samples find the answer by luck. The trained
#    policy always works the chain, and at depth 13 the chain fails the same way each time.
#
#    </details>
#
# 4. Which experiment would show that RL can invent a check? What did ours show?
#
#    <details><summary>Answer</summary>
#
#    Train from a base that never saw one, and look for `!` after RL. Our no-check base wrote
#    none in any of its runs' completions.
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
