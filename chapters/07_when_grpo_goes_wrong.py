# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 7. When GRPO goes wrong
#
# > **You will learn**
# > - the nine ways a GRPO (Group Relative Policy Optimization) run breaks, each caused on purpose
# > - the symptom of each, measured against a healthy run
# > - which metric gives each failure away, and what `grpo-edu doctor` reads from it
# > - where a symptom is not the one you would expect, and why
# >
# > **You need first**: chapter 6 (the training loop and its metrics).
# >
# > **Reading time**: about 29 minutes. **Compute**: at most 300 s on a 2-core CPU. [Glossary](../docs/glossary.md) · [Notation](../docs/notation.md)
#
# Every team that trains with GRPO meets the same failures. Groups whose rewards are all
# equal. A group split across GPUs. Completions that grow for no reason. A Kullback-Leibler
# (KL) coefficient set wrong. A sampler and a trainer that disagree. A mask one token off. A
# stale or too-fresh pi_old. An exploding gradient. A reference that is secretly the policy.
#
# Each has a symptom, a cause and a fix that practitioners expect. This chapter causes each
# failure on purpose, on the tiny policy and task of chapter 6. Then it measures the symptom
# against a healthy run: as numbers, as curves, and as what `grpo-edu doctor` reads from the
# run's metrics. Some symptoms are not the ones expected.
#
# Some failures have a knob in the config: a learning rate, beta, a task. The others are bugs
# that no honest config can express. The lab injects those into a run once it is set up, with
# `Faults(...).train(config)`. A fault is never a config key, and the trainer takes no fault
# argument. Each fault is announced in the run's log and written into its `summary.json`.
#
# <details><summary>How we know</summary>
#
# The faults are in `grpo_edu/lab/faults.py`. The runs are defined once, in
# `grpo_edu/lab/__init__.py`: the default config with fewer steps, evaluated every 25 steps on
# 128 held-out problems.
#
# </details>

# %%
import itertools
import math
import textwrap

import numpy as np
import torch

from grpo_edu import lab
from grpo_edu.environment import tasks
from grpo_edu.training import placement, rollouts, trainer
from grpo_edu.algorithm.advantages import group_advantages
from grpo_edu.doctor.diagnose import DETECTORS, diagnose
from grpo_edu.runtime.distributed import World
from grpo_edu.lab.faults import Faults
from grpo_edu.policy.models import load_policy
from grpo_edu.book.plots import plot_compare
from grpo_edu.book import home
from grpo_edu.book.claims import Claims
from grpo_edu.algorithm.statistics import mcnemar, paired_problems

home.enter()   # the book's folder: its files are read and its runs written from there

torch.set_num_threads(2)
ROOT = "runs/chapter-7"
results, logged, correct, verdicts = {}, {}, {}, {}


def trial(name):
    """Lab run `name`, trained now; its RunResult is kept in `results`, its final policy's
    outcome on each held-out problem (1 right, 0 wrong) in `correct`, and the lines its log
    starts with "warning" (the live doctor) or "FAULTS" (the injected bugs) in `logged`."""
    lines = logged[name] = []
    results[name] = lab.run(name, ROOT, log=lambda line: lines.append(line) if line.startswith(
        ("warning", "FAULTS")) else None)
    correct[name] = lab.held_out_outcomes(name, results[name].policy, results[name].tokenizer)
    return results[name]


def paired(a, b):
    """Runs a and b ("start": the starting policy) on the same held-out problems, problem by
    problem: the difference in accuracy with its paired bootstrap interval, and McNemar's exact
    test on the problems only one of them solves (grpo_edu.algorithm.statistics)."""
    verdict, test = paired_problems(correct[a], correct[b]), mcnemar(correct[a], correct[b])
    verdicts[a, b] = verdict
    print(f"{verdict.words(a, b)}; McNemar: {test['a_only']:.0f} problems only {a} solves, "
          f"{test['b_only']:.0f} only {b}, p = {test['p_value']:.2g}")


def doctor(*names):
    """What grpo-edu doctor reports for each run (grpo_edu.doctor.diagnose on its metrics and config)."""
    for name in names:
        findings = diagnose(results[name].history, results[name].summary["config"])
        print(f"doctor, {name}: " + ("no symptoms found" if not findings else ""))
        for finding in findings:
            print(f"  [{finding.detector}] {finding.failure}")
            print(textwrap.fill(finding.evidence, 100, initial_indent=" " * 6, subsequent_indent=" " * 6))


def live_doctor(name):
    """When the live doctor warned during run `name`, and which detector: one line (the warning
    itself is the finding `doctor` prints, with advice added)."""
    findings = diagnose(results[name].history, results[name].summary["config"])
    warned = [f"step {line.split()[3].rstrip(':')} "
              f"({next((f.detector for f in findings if f.failure in line), 'gone by the end')})"
              for line in logged[name] if line.startswith("warning")]
    print(f"the live doctor, {name}: " + ("warned at " + ", ".join(warned) if warned else "no warning"))


print(f"every run trains chapter 6's policy ({sum(p.numel() for p in load_policy()[0].parameters()):,} "
      f"parameters) from its start:")
for name, spec in lab.RUNS.items():
    print(f"{spec.failure}  {name:<17} {spec.steps:>3} steps   {spec.knob}")

# %% [markdown]
# ## The healthy run
#
# First the reference point: chapter 6's config for 100 steps. Every failure below is read
# against these numbers. The table gives held-out greedy accuracy at the start and at the
# end. Then it gives the median of each metric over the first 10 and the last 10 steps.
#
# Two runs are compared on the same 128 held-out problems, problem by problem: a paired
# bootstrap interval of the difference, and McNemar's exact test on the problems only one of
# them solves. "A beats B" only where the interval excludes zero.
#
# <details><summary>What a comparison of two single runs can say</summary>
#
# The bootstrap resamples the problems, each carrying both runs' outcomes (Efron and
# Tibshirani 1993); McNemar's test (McNemar 1947) counts the problems only one run solves
# (`grpo_edu.algorithm.statistics.paired_problems` and `mcnemar`). Each lab run has one seed.
# So a test says whether these two policies differ on these problems, not how far another
# seed would move either of them. Chapter 8 pairs over seeds.
#
# </details>

# %%
# How every experiment of this chapter is made.
from grpo_edu.book import schematics

schematics.failure_lab()

# %% tags=["platform-numerics"]
trial("healthy")
correct["start"] = lab.held_out_outcomes("healthy", *load_policy())
KEYS = ["reward/accuracy", "zero_std_groups", "kl", "grad_norm", "entropy"]
print(lab.table(results, KEYS))
paired("healthy", "start")
doctor("healthy")

# %% [markdown]
# ## 1. All-equal-reward groups
#
# **Cause.** A group whose G rewards are all equal has advantages of exactly 0. It adds
# nothing to the gradient, whatever the loss. On prompts too hard for the policy every
# completion is wrong, and the batch fills with such groups.
#
# **Knob.** `task = "countdown"`: chapter 5's harder task, which the arithmetic policy never
# solves. With the default rewards (accuracy + 0.5 format), a group still differs when some of
# its completions miss the format. With accuracy alone, every group is all zeros. Then come
# two common fixes. One leaves the all-equal groups out of the gradient (the
# zero-std filter, `filter_zero_std_groups = true`). The other samples at a higher
# temperature.

# %% tags=["platform-numerics"]
for name in ("countdown", "countdown_sparse", "countdown_filter", "countdown_hot"):
    trial(name)
ONE = ["healthy", "countdown", "countdown_sparse", "countdown_filter", "countdown_hot"]
print(lab.table({n: results[n] for n in ONE}, ["zero_std_groups", "reward/accuracy", "reward/format", "grad_norm"]))
sparse = results["countdown_sparse"].history
print(f"\ncountdown, accuracy reward only: grad_norm is 0 at {sum(m['grad_norm'] == 0 for m in sparse)} "
      f"of {len(sparse)} steps, kl is 0 at {sum(m['kl'] == 0 for m in sparse)}")
start, _ = load_policy()
unmoved = all(torch.equal(a, b) for a, b in zip(start.state_dict().values(),
                                                results["countdown_sparse"].policy.state_dict().values()))
print(f"its final weights are the starting policy's, bit for bit: {unmoved}")
skipped = sum(m.get("skipped_update", 0.0) for m in results["countdown_filter"].history)
print(f"filter_zero_std_groups: {skipped:.0f} of {len(results['countdown_filter'].history)} steps had no group "
      f"left to train on")
doctor("countdown", "countdown_sparse", "countdown_filter", "countdown_hot")

# %%
figure = plot_compare({n: results[n] for n in ONE},
                      [("zero_std_groups", "share of all-equal groups", False),
                       ("grad_norm", "gradient norm", False), ("reward/format", "format reward", False)])

# %% [markdown]
# **Symptom, measured.** With accuracy as the only reward, every group of every step is
# all-equal. The gradient norm and the KL are exactly 0, and the final weights are the
# starting policy's, bit for bit. Nothing can learn from a reward that never varies. With the
# format reward, groups differ only in format, and that is all the policy learns: the format
# reward rises, and the held-out accuracy stays at 0.
#
# The filter keeps the remaining groups' gradient at full strength, because it divides by the
# groups it keeps; a step with no group left is skipped. The higher temperature makes the
# groups differ more often: the share of all-equal groups falls. Neither teaches countdown.
# Both fixes make better use of a signal, and here the accuracy signal is absent. The fix for
# all-wrong groups is prompts the policy can sometimes solve (a curriculum). The doctor says
# so when, over the last 10 steps, half the groups or more are all-equal *and* most samples
# are wrong. Chapter 8 measures a third fix, dynamic sampling (from DAPO, Decoupled Clip and
# Dynamic Sampling Policy Optimization).
#
# The doctor also reports a second symptom on the countdown run and the filtered one. Their
# median KL to the reference over the last 10 steps is 1.207 and 1.328 nats per token, past
# the doctor's threshold of 1.0; the healthy run ends at 0.0636. Format is the only thing those
# groups reward, and the policy runs after it at full speed. That is failure 4's symptom
# caused by failure 1, and the doctor is right to name both.
#
# ## 2. A group split across ranks
#
# **Cause.** Under N processes, each rank normalises the rewards it holds. Say a sampler puts
# 4 of a prompt's 8 completions on one rank and 4 on another. Then each half gets its own mean
# and std, and the advantages no longer compare a completion with its whole group.
# `grpo_edu` shards whole prompts (chapter 10), so the lab simulates the careless sampler:
# `Faults(split_groups=2)` computes each group's advantages in two halves.
#
# First, exactly what a split does to one group. Take 3 of 8 completions right (reward 1.5),
# and the other 5 wrong but well formatted (0.5). There are 70 ways to deal them into two
# halves of 4. Here are the advantages of a right and of a wrong completion over all 70:

# %%
group = np.array([1.5, 1.5, 1.5, 0.5, 0.5, 0.5, 0.5, 0.5])
whole = group_advantages(group[None])[0]
right, wrong = [], []
for first in itertools.combinations(range(8), 4):
    halves = [list(first), [i for i in range(8) if i not in first]]
    split = np.empty(8)
    for half in halves:
        split[half] = group_advantages(group[half][None])[0]
    right += [split[i] for i in range(3)]
    wrong += [split[i] for i in range(3, 8)]
right, wrong = np.array(right), np.array(wrong)
print(f"whole group: right {whole[0]:+.4f}, wrong {whole[3]:+.4f}")
print(f"split in two (70 ways): right {right.mean():+.4f} on average (std {right.std():.4f}), "
      f"0 in {np.mean(right == 0):.1%} of cases; wrong {wrong.mean():+.4f} (std {wrong.std():.4f}), "
      f"0 in {np.mean(wrong == 0):.1%}")

# %% [markdown]
# The whole group gives every right answer the same positive advantage: +1.2910. Split, each
# advantage depends on which completions happen to share its half. A wrong answer whose half
# holds no right one gets 0, with nothing to compare it with. That happens in 11.4% of the
# wrong answers' cases, since 5 wrong answers can fill a half of 4. The spreads above are
# noise that the correct sharding does not have. The run:

# %% tags=["platform-numerics"]
trial("split")
print(lab.table({n: results[n] for n in ("healthy", "split")}, ["advantage/tie_spread", "advantage/std",
                                                               "grad_norm", "reward/accuracy"]))
healthy_at = dict(results["healthy"].summary["eval_curve"])   # held-out accuracy at steps 25, 50, 75, 100
print(f"\nheld-out accuracy after 50 steps: split {results['split'].summary['final_accuracy']:.3f}, "
      f"the healthy run {healthy_at[50]:.3f} (its step 50)")
paired("split", "start")
doctor("split")

# %% [markdown]
# The run still learns: it beats its start on the same problems, at 0.555 after 50 steps
# (the healthy run: 0.562 at its step 50). Halves of 4 are smaller groups, not wrong ones.
# What gives the bug away is a metric the trainer logs for this: `advantage/tie_spread`. It
# is the largest gap between the advantages of two completions of one group with the same
# reward. Any advantage function of a group's rewards gives equal rewards equal advantages. So
# it is exactly 0 in every healthy step, and split groups make it large from the first step.
# The doctor flags any step where it passes 0.0001.
#
# ## 3. Length bias
#
# **Cause.** The `grpo` loss averages each completion's token losses over its own length
# |o_i|. So a token of a long completion weighs less than a token of a short one (chapter 4
# computes the weights). On a wrong answer (negative advantage), a long completion is
# penalised less per token, and a policy can drift towards longer answers. `dr_grpo` divides
# by a constant instead.
#
# **Can this tier show it?** No. With room to pad (48 tokens) and a hot sampler (1.5), 200
# steps of `grpo` and of `dr_grpo` moved the mean completion length by less than a token. The
# tiny policy's completions have one shape, `<think>d</think>\boxed{answer}`, whose length the
# problem sets: it has no reasoning to pad. So this chapter shows the per-token weight each
# loss puts on a wrong answer, in a batch sampled from the starting policy at those settings.
#
# The doctor's `length_drift` detector reads a whole run of 40 steps or more. It flags one
# whose median completion length over the last 10 steps is at least 30% above the median over
# the first 10.
#
# <details><summary>How we know</summary>
#
# `benchmarks/failure_lab.py --length` ran the 200-step search above. The `length_drift`
# detector is tested on made-up metrics in `tests/test_diagnose.py`, not on a run of this
# tier.
#
# </details>

# %% tags=["platform-numerics"]
policy, tokenizer = load_policy()
config = lab.RUNS["healthy"].config(f"{ROOT}/unused")
config = type(config).from_dict({**config.to_dict(), "max_completion_length": 48, "temperature": 1.5})
engine = placement.make_engine(config, placement.build_models(config, World(), policy), tokenizer)
torch.manual_seed(0)
samples = tasks.make_dataset("arithmetic", n=config.rollout.prompts_per_step, split="train", seed=0)
rollout = rollouts.roll_out(config, samples, tokenizer, engine)
lengths = rollout.completion_mask.sum(-1).double()
print(f"completion lengths at T = 1.5, L = 48: min {lengths.min():.0f}, median {lengths.median():.0f}, "
      f"max {lengths.max():.0f} tokens")
for length in (int(lengths.min()), int(lengths.median()), int(lengths.max())):
    print(f"  a {length:>2}-token wrong answer (advantage -1): grpo puts {-1 / length:+.4f} on each token, "
          f"dr_grpo {-1 / config.rollout.max_completion_length:+.4f}")

# %% [markdown]
# ## 4. The KL coefficient
#
# **Cause.** beta weighs the KL penalty that holds the policy near the reference. Too small,
# and nothing stops the policy from running far from the reference when the update is strong.
# Too large, and the penalty outweighs the reward.
#
# **Knob.** beta = 0, the default 0.04, and 1.0 (25 times the default). Then the learning rate
# of failure 8 (1e-2), where the policy does run away.

# %% tags=["platform-numerics"]
for name in ("beta_0", "beta_1"):
    trial(name)
FOUR = ["beta_0", "healthy", "beta_1"]
print(lab.table({n: results[n] for n in FOUR}, ["kl", "reward/mean", "entropy", "grad_norm"]))
print("\nfinal held-out accuracy, paired over the same problems:")
paired("beta_0", "healthy")
paired("beta_1", "healthy")
gap = results["healthy"].summary["final_accuracy"] - results["beta_1"].summary["final_accuracy"]
print(f"beta = 1.0 ends {gap:.3f} below the default\n")
doctor("beta_0", "beta_1")

# %% [markdown]
# beta = 0 and the default are not separated at this size: they end at 0.719 and 0.727, and
# each solves 9 or 10 problems the other does not. At this learning rate the update itself
# keeps the policy near its start. With beta = 0 the KL is simply not computed, and no
# reference model is built: the saving of chapter 1.
#
# beta = 1.0 holds the KL lower: 0.00943 at the end, against the default's 0.0636. It pays in
# accuracy: the default beats it on the same problems, by 0.125. Of the problems only one of
# the two solves, the default has 23 and beta = 1.0 has 7 (McNemar's p = 0.005). The doctor
# flags neither run: a beta too large has no symptom of its own among its detectors.
#
# Where a small beta matters is a run whose update is strong enough to leave. The countdown
# runs above and the learning-rate runs of failure 8 do leave. With beta at its default, they
# reach a KL that the doctor flags (`kl_runaway`: a median over the last 10 steps of 1.0 nats
# per token or more).
#
# ## 5. A temperature mismatch between sampler and trainer
#
# **Cause.** The sampler draws from softmax(logits / T). A trainer that computes log-probs
# from softmax(logits), at T = 1, scores the same tokens under another distribution. With
# pi_old taken from the sampler, the ratio pi / pi_old is then far from 1 before the policy
# has moved.
#
# **Knob.** Sampling at T = 0.7, `old_logprobs = "sampler"`, and
# `Faults(trainer_temperature=1.0)`.

# %% tags=["platform-numerics"]
trial("temperature")
print(lab.table({n: results[n] for n in ("healthy", "temperature")},
                ["sampler_gap/mean_abs", "ratio/max", "ratio/min", "clip_ratio/region"]))
first = results["temperature"].history[0]
print(f"\nstep 1, before any update: ratio from {first['ratio/min']:.3f} to {first['ratio/max']:.2f}, "
      f"{first['clip_ratio/region']:.1%} of tokens outside the clip range")
doctor("temperature")

# %% [markdown]
# The healthy run's gap is rounding: two float32 computations of the same numbers. The
# mismatched run's ratio is far from 1 at step 1, 37.42 at most. The clip acts on tokens before
# any update has been taken, so the trust region is spent on a bug. `sampler_gap/mean_abs`
# reveals the bug whatever pi_old is. With `old_logprobs = "recomputed"` the ratio would be 1
# and hide it. The doctor flags a gap whose median over the first 10 steps is 0.03 nats per
# token or more, and below 0.5 (failure 6's level).
#
# ## 6. The log-probs one token off
#
# **Cause.** The token at column j is predicted by the logits at column j - 1. So the right
# alignment scores `input_ids[:, 1:]` with `logits[:, :-1]`. A slip between these two slices
# is a common off-by-one. The slip here keeps that pairing, and cuts
# the completion out one column late. For a prompt of P tokens, it takes the per-token
# log-probs `logp[:, P:]` instead of `logp[:, P - 1:]`. Each completion position is then
# scored with the log-prob of the token after it. The first token is never trained, and the
# end-of-sequence (EOS) token's position trains the padding after it.
#
# **Knob.** `Faults(off_by_one=True)`: the trainer's log-prob function, for the policy,
# pi_old and the reference alike, misaligned by one column.

# %% tags=["platform-numerics"]
trial("off_by_one")
print(lab.table({n: results[n] for n in ("healthy", "off_by_one")},
                ["sampler_gap/mean_abs", "reward/mean", "kl", "entropy"]))
print(f"\nheld-out accuracy after 50 steps: off_by_one {results['off_by_one'].summary['final_accuracy']:.3f}, "
      f"the healthy run {healthy_at[50]:.3f} (its step 50)")
paired("off_by_one", "start")
doctor("off_by_one")

# %% [markdown]
# Such a run is expected to look fine, its reward inching up, while evaluation shows no change
# from the starting policy. Measured here, it does learn: it beats its start on the same
# problems, at 0.609 after 50 steps. On this task the first token is always `<think>`, which
# carries no decision. Every other token is still pushed by its completion's advantage, one
# column late.
#
# The bug is not harmless in general: on a task whose first token decides, that token never
# learns. And it is invisible in the reward and the loss. What does show it, at once and in
# any task, is the gap between the trainer's log-probs and the sampler's. It is larger than
# any temperature or precision explains, because the two score different tokens: 1.82 nats
# per token here. The doctor separates the two cases by size, at 0.5 nats per token.
#
# ## 7. pi_old fixed for the rollout, or refreshed every pass
#
# **Cause.** With several passes over a rollout (`num_iterations` > 1), the ratio compares
# the current policy with pi_old. PPO (Proximal Policy Optimization), TRL (Transformer
# Reinforcement Learning, Hugging Face's library) and this trainer keep pi_old fixed to the
# policy that sampled.
#
# > **A common mistake.** Refreshing pi_old at the start of every pass, to keep it "current".
# > The ratio then restarts at 1 every pass. With one mini-batch per pass it is exactly 1 at
# > every optimizer step. Then the clip can never act, and nothing bounds how far four passes
# > move the policy.
#
# **Knob.** `num_iterations = 4`, pi_old fixed (the trainer), and refreshed
# (`Faults(refresh_old_logprobs=True)`).

# %% tags=["platform-numerics"]
for name in ("old_fixed", "old_refreshed"):
    trial(name)
print(lab.table({n: results[n] for n in ("healthy", "old_fixed", "old_refreshed")},
                ["ratio/min", "ratio/max", "clip_ratio/region", "kl", "reward/accuracy"]))
print()
paired("old_fixed", "start")
paired("old_refreshed", "start")
doctor("old_fixed", "old_refreshed")

# %% [markdown]
# Fixed, the last pass's ratio spreads around 1, and the clip acts on part of the tokens: the
# trust region does its job. Refreshed, the ratio is exactly 1 at every step and the clip
# fraction exactly 0: four unclipped optimizer steps per rollout. The KL to the reference ends
# about three times the fixed run's (0.271 against 0.0912). Held-out accuracy collapses, to
# 0.141 from 0.445, well below its start on the same problems, and the all-wrong groups of a
# broken policy follow. The fixed run ends at 0.391: lower than its start, but not separated
# from it at this size. The doctor flags a run with several optimizer steps per rollout whose
# last ratio is always exactly 1.
#
# ## 8. The gradient explodes
#
# **Cause.** Two causes are commonly named. One is a KL coefficient too small, so that the
# policy escapes to extreme outputs. The other is a reward bug that pays unboundedly large
# rewards on some inputs. The expected symptom is a gradient norm that climbs a hundredfold
# over a hundred steps, after a few hundred. The expected fixes are a larger beta, or rewards
# clipped at the source. Clipping the gradient's norm at 1.0, as `max_grad_norm` does here, is
# meant to keep a single noisy mini-batch from throwing the policy into a region it never
# recovers from.
#
# **Knobs.** Both causes, pushed hard enough to act within this tier's short runs. First, an
# update far too strong for the default beta to hold: `learning_rate = 1e-2`, 33 times the
# default. It runs clipped at norm 1.0 (the default) and not clipped (`max_grad_norm = 0`).
# Then large rewards: 100 times larger, with no std to divide them back
# (`advantage_scale = "none"`), clipped and not.

# %% tags=["platform-numerics"]
for name in ("lr_clipped", "lr_unclipped", "reward_x100", "reward_x100_unclipped"):
    trial(name)
    live_doctor(name)
EIGHT = ["healthy", "lr_clipped", "lr_unclipped", "reward_x100", "reward_x100_unclipped"]
print(lab.table({n: results[n] for n in EIGHT}, ["grad_norm", "kl", "zero_std_groups", "completion_length/mean"]))
for name in EIGHT[1:]:
    norms = [m["grad_norm"] for m in results[name].history]
    print(f"{name:<22} grad_norm: largest {max(norms):.3g} (step {norms.index(max(norms)) + 1}), "
          f"above 1.0 at {sum(n > 1 for n in norms)} of {len(norms)} steps")
print(f"the healthy run's held-out accuracy at its step 75: {healthy_at[75]:.3f}")
for a, b in (("reward_x100", "start"), ("reward_x100_unclipped", "start"), ("reward_x100", "reward_x100_unclipped")):
    paired(a, b)
doctor("lr_clipped", "lr_unclipped", "reward_x100", "reward_x100_unclipped")

# %%
figure = plot_compare({n: results[n] for n in EIGHT},
                      [("grad_norm", "gradient norm (before clipping)", True), ("kl", "KL to the reference", True),
                       ("reward/accuracy", "accuracy reward", False)])

# %% [markdown]
# **Symptom, measured, and not the one expected.** The learning rate wrecks the policy in two
# steps, clipped or not. The KL to the reference jumps past 4 nats per token. The completions
# turn to noise: 16 tokens, the length limit, in the clipped run. Every group is all wrong,
# and held-out accuracy is 0. The gradient norm does not climb: it *falls*, because all-wrong
# groups give no gradient.
#
# Clipping cannot help. AdamW divides each update by the gradient's own running scale, so the
# step's size is set by the learning rate, not by the gradient's norm. The clip did act: at
# step 2 the norm reached 2.79, the largest of either run, and the clipped run cut it to 1.0.
# That run was wrecked all the same.
#
# The rewards x100 give the climb's level without the damage. The gradient norm's medians are
# 30.8 to 34.2, above 1.0 at every step, where the healthy run's stays near 1. Clipped and
# unclipped are not separated at this size: 0.539 and 0.594 after 75 steps, on the same
# problems. The unclipped run beats its start; the clipped one is not separated from it. The
# healthy run had 0.703 at its step 75. AdamW again: scaling every gradient by one factor
# does not change its update. What the scale does change is the balance with the KL term,
# which is not scaled: in effect beta is 100 times smaller.
#
# So on this tier (float32, a policy of 341,376 parameters, AdamW) a large gradient is not
# what breaks a run. The doctor's `kl_runaway` and `zero_std_groups` catch the broken runs,
# and the live doctor warned during training. `truncated_completions` fires beside them: a
# wrecked policy stops ending its completions. The climb commonly described comes from causes
# these runs do not have, over hundreds of steps, and its fixes act on those causes. The fix
# for the runs here is the learning rate. The doctor's `grad_explosion` detector flags a run
# of 40 steps or more whose median gradient norm over the last 10 steps is 10 times or more
# its median over the first 10, or any loss that is not finite.
#
# <details><summary>How we know</summary>
#
# The `grad_explosion` detector is tested on made-up metrics in `tests/test_diagnose.py`, not
# on a run of this tier.
#
# </details>
#
# ## 9. The reference aliased to the policy
#
# **Cause.** `reference = policy` where a copy was meant. Both names hold the same tensors,
# and the KL to the reference is 0 whatever the policy does.
#
# **Knob.** `Faults(alias_reference=True)`. Without the fault, the trainer refuses such a
# reference at start-up:

# %%
try:
    placement.build_models(lab.RUNS["healthy"].config(f"{ROOT}/unused"), World(), policy, policy)
except ValueError as error:
    print(f"ValueError: {error}")

# %% tags=["platform-numerics"]
trial("alias")
print(next(line for line in logged["alias"] if line.startswith("FAULTS")))
live_doctor("alias")
print(lab.table({n: results[n] for n in ("healthy", "beta_0", "alias")}, ["kl", "reward/mean", "grad_norm"]))
same = all(torch.equal(a, b) for a, b in zip(results["alias"].policy.state_dict().values(),
                                             results["beta_0"].policy.state_dict().values()))
print(f"\nthe aliased run's final weights equal the beta = 0 run's, bit for bit: {same}")
doctor("alias")

# %% [markdown]
# Such a policy is expected never to move. Measured, it moves exactly as with beta = 0: the
# k3 penalty's gradient is 0 where the reference equals the policy. So the run is the beta = 0
# run, bit for bit, logging a KL of exactly 0. The doctor (and the trainer, live) reports a KL
# of exactly 0 at every step after the first, with beta > 0, while the policy moves. The last
# condition matters: the countdown run with accuracy alone also logs a KL of 0, but its
# gradient is 0 too, and the doctor does not call its reference aliased.
#
# ## The doctor on every run
#
# Each lab run must trigger the detectors that `grpo_edu/lab/__init__.py` expects of it. It may
# add only the consequences named there: the countdown runs' KL, the learning-rate runs'
# truncated completions, and the all-wrong groups of the policy that refreshing pi_old broke.
# The healthy run, beta's runs, pi_old fixed and the rewards x100 must trigger none.

# %% tags=["platform-numerics"]
rows = []
for name, result in results.items():
    spec = lab.RUNS[name]
    found = {f.detector for f in diagnose(result.history, result.summary["config"])}
    rows.append((name, spec.diagnosed_as_expected(found)))
    print(f"{spec.failure}  {name:<22} {', '.join(sorted(found)) or '-':<30} "
          + ("as expected" if rows[-1][1] else f"expected {sorted(spec.expected)}, may add {sorted(spec.also)}"))
print(f"\n{sum(ok for _, ok in rows)} of {len(rows)} runs diagnosed as expected; detectors: {', '.join(DETECTORS)}")

# %% [markdown]
# Each threshold sits in `grpo_edu/doctor/diagnose.py`, beside the measurement that sets it.
# Run the doctor on your own runs: `grpo-edu doctor runs/cpu-tiny`.
#
# <details><summary>How we know</summary>
#
# `tests/test_diagnose.py` runs the doctor on three whole 1,500-step healthy runs (no finding)
# and on short versions of these lab runs (each its own detector, no other).
#
# </details>
#
# **What holds on every machine.** The digits above are exact under the book's pinned
# kernels; elsewhere the runs end at other digits. So the next cell checks the claims this
# chapter makes, and its output is what `make test` compares on every platform:

# %%
h = {name: result.history for name, result in results.items()}
acc = {name: result.summary["final_accuracy"] for name, result in results.items()}
claims = {
    "each run's kept outcomes reproduce its final held-out accuracy": all(
        sum(correct[n]) / len(correct[n]) == acc[n] for n in results),
    "the healthy run climbs by more than 0.2 held-out accuracy, and beats its start on the same problems": acc[
        "healthy"] - results["healthy"].summary["start_accuracy"] > 0.2 and verdicts["healthy", "start"].low > 0,
    "countdown with the accuracy reward only: zero gradient, weights unchanged": unmoved and all(
        m["grad_norm"] == 0 for m in h["countdown_sparse"]),
    "countdown never reaches a right held-out answer, with either fix": max(
        acc[n] for n in ONE[1:]) == 0.0,
    "a higher temperature lowers the share of all-equal groups": lab.early_late(h["countdown_hot"], "zero_std_groups")[1]
    < lab.early_late(h["countdown"], "zero_std_groups")[1],
    "split groups: tie spread 0 in every healthy step, > 0.1 in the split run": all(
        m["advantage/tie_spread"] == 0 for m in h["healthy"]) and max(
        m["advantage/tie_spread"] for m in h["split"]) > 0.1 and verdicts["split", "start"].low > 0,
    "beta = 0 is not separated from the default; the default beats beta = 1.0, on the same problems": not verdicts[
        "beta_0", "healthy"].separated and verdicts["beta_1", "healthy"].high < 0,
    "the temperature mismatch: ratio beyond 2 at step 1": h["temperature"][0]["ratio/max"] > 2,
    "off by one: the gap exceeds 0.5 nats per token; the run beats its start": lab.early_late(
        h["off_by_one"], "sampler_gap/mean_abs")[0] > 0.5 and verdicts["off_by_one", "start"].low > 0,
    "pi_old refreshed: ratio exactly 1 and no clipping at every step; fixed: clipping": all(
        m["ratio/min"] == 1 == m["ratio/max"] and m["clip_ratio/region"] == 0 for m in h["old_refreshed"]) and max(
        m["clip_ratio/region"] for m in h["old_fixed"]) > 0,
    "pi_old refreshed ends below its start; fixed is not separated from its start": verdicts[
        "old_refreshed", "start"].high < 0 and not verdicts["old_fixed", "start"].separated,
    "learning rate 1e-2 ends at 0 held-out accuracy, clipped or not": acc["lr_clipped"] == acc["lr_unclipped"] == 0,
    "learning rate 1e-2: the gradient norm's late median is below its early one (no climb)": all(
        lab.early_late(h[n], "grad_norm")[1] < lab.early_late(h[n], "grad_norm")[0] for n in ("lr_clipped", "lr_unclipped")),
    "rewards x100: median grad_norm over 10 x the healthy run's, above 1.0 at most steps": all(
        np.median([m["grad_norm"] for m in h[n]]) > 10 * np.median([m["grad_norm"] for m in h["healthy"]])
        and sum(m["grad_norm"] > 1 for m in h[n]) > len(h[n]) / 2 for n in ("reward_x100", "reward_x100_unclipped")),
    "rewards x100: the unclipped run beats its start; the clipped one is separated neither from it nor from "
    "the unclipped one": verdicts["reward_x100_unclipped", "start"].low > 0 and not any(
        verdicts[pair].separated for pair in (("reward_x100", "start"), ("reward_x100", "reward_x100_unclipped"))),
    "the aliased reference: kl exactly 0 at every step, weights equal to beta = 0's": same and all(
        m["kl"] == 0 for m in h["alias"]),
    "every run diagnosed as expected": all(ok for _, ok in rows),
}
Claims(claims)

# %% [markdown]
# ## What you learned
#
# - Each of the nine failures has a metric that gives it away: the share of all-equal groups,
#   the tie spread, the sampler gap, the ratio's extremes, the KL.
# - A reward that never varies within a group teaches nothing; the fixes for all-wrong groups
#   use a signal better, but cannot create one.
# - A KL of exactly 0 while the policy moves means the reference is the policy.
# - Refreshing pi_old every pass keeps the ratio at 1, so the clip never acts.
# - With AdamW, a large gradient norm is not what breaks these runs; a learning rate too large
#   is, and the KL and the all-wrong groups show it.
# - Several failures do not show the symptom commonly expected; measure before you trust a
#   symptom, and compare runs on the same problems.
#
# ## Check yourself
#
# Where an answer is a number, check yours before you open it:
# `quiz.check(7, 2, advantage=...)` (`from grpo_edu.exercises import quiz`;
# `quiz.ask(7)` lists what each question takes).
#
# 1. A run with beta = 0.04 logs `kl` = 0 at every step. Name two causes, and the metric that
#    tells them apart.
#
#    <details><summary>Answer</summary>
#
#    An aliased reference, or a policy that never moves (every group all-equal, as in the
#    countdown run with accuracy alone). `grad_norm` tells them apart: above 0 for the aliased
#    reference, exactly 0 when nothing moves.
#
#    </details>
#
# 2. A group has 3 right completions (reward 1.5) and 5 wrong ones (0.5). Whole, a right one
#    gets +1.2910. Split into halves of 4, what does a wrong completion get when its half holds
#    no right one, and why?
#
#    <details><summary>Answer</summary>
#
#    0: all four rewards in its half are equal, so the half's advantages are all 0. It
#    happened in 11.4% of the wrong answers' cases over the 70 splits.
#
#    </details>
#
# 3. In the temperature run, the ratio reached 37.42 at step 1, before any update. Why, and
#    which metric shows the bug even when pi_old is recomputed?
#
#    <details><summary>Answer</summary>
#
#    The sampler drew at T = 0.7 and the trainer scored at T = 1, so the two log-probs of the
#    same token differ before the policy moves. `sampler_gap/mean_abs` shows it (0.062 per
#    token over the first 10 steps); a recomputed pi_old would make the ratio 1 and hide it.
#
#    </details>
#
# 4. Why did clipping the gradient norm at 1.0 not save the run at learning rate 1e-2?
#
#    <details><summary>Answer</summary>
#
#    AdamW divides each update by the gradient's running scale, so the step's size is set by
#    the learning rate. The clip did cut the largest norm, 2.79, to 1.0, and the run was
#    wrecked all the same.
#
#    </details>
#
# 5. With `num_iterations = 4` and pi_old refreshed every pass, why is the clip fraction
#    exactly 0?
#
#    <details><summary>Answer</summary>
#
#    Each pass has one mini-batch, so one optimizer step, and pi_old is recomputed from the
#    policy just before it. The ratio is exactly 1 at every optimizer step, and a ratio of 1
#    is never outside the clip range.
#
#    </details>
#
# ## Exercises
#
# Each checker in `grpo_edu.exercises.ch07` runs your answer and names each case that fails
# and what is wrong there, never the right answer. Each exercise has a hint and a worked
# solution, folded: open them when you want them.
#
# **7.1 Name the failure.** `ch07.mystery_runs()` holds the metrics of four lab runs at
# another seed (1) than this chapter's, under letters: one healthy, three broken by one knob
# each. Read them as you would a run of your own (the cell below prints their last step;
# `plot_compare` draws any of their keys), and name each with one of `ch07.FAILURES`. Then
# check your reading against the doctor's: `ch07.mystery_configs()` holds each run's
# `config.json` (a bug injected through `Faults` is no more in it than in a real run's
# config), and `diagnose(history, config)` reads a run as `grpo-edu doctor` does.
#
# <details><summary>Hint</summary>
#
# Look first at the numbers that a healthy run holds still: the KL (0 only at step 1), the
# sampler/trainer gap (a float32 rounding error, under a millionth), and the ratio's
# extremes beside `optimizer_steps` (exactly 1 is right for one optimizer step per rollout,
# and suspicious for four). Each broken run here moves exactly one of them.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# my_diagnoses = {}
# for run, history in ch07.mystery_runs().items():
#     if all(m["kl"] == 0 for m in history[1:]) and any(m["grad_norm"] > 0 for m in history):
#         my_diagnoses[run] = "aliased reference"        # the policy moves, the KL never does
#     elif history[0]["sampler_gap/mean_abs"] > 0.03:
#         my_diagnoses[run] = "temperature mismatch"     # the trainer disagrees with the sampler at step 1
#     elif all(m["optimizer_steps"] > 1 and m["ratio/min"] == 1 == m["ratio/max"] for m in history):
#         my_diagnoses[run] = "pi_old refreshed"         # 4 steps per rollout, and the clip never sees a ratio
#     else:
#         my_diagnoses[run] = "healthy"
# ch07.check_mystery_runs(my_diagnoses)
# ```
#
# </details>

# %%
from grpo_edu.exercises import ch07

mystery = ch07.mystery_runs()
print(f"{'the last step':<24}" + "".join(f"{run:>10}" for run in mystery))
for key in ch07.KEYS:
    print(f"{key:<24}" + "".join(f"{history[-1][key]:>10.4g}" for history in mystery.values()))
print(f"\nnames: {', '.join(ch07.FAILURES)}")
my_diagnoses = {}  # e.g. {"run A": "healthy", ...}
ch07.check_mystery_runs(my_diagnoses)

# %% [markdown]
# **7.2 The tie spread.** Write `my_tie_spread(rewards, advantages)`: for (B, G) rewards and
# advantages, the largest |A_i - A_j| over pairs of completions of one group that have the
# same reward (0 when there are none). The trainer logs it as `advantage/tie_spread`; the
# checker compares yours with a slow reference on whole and split groups, including the
# group of failure 2.
#
# <details><summary>Hint</summary>
#
# Within one group, completions with the same reward form a set; the widest gap inside a set
# is its largest advantage minus its smallest. `r.unique()` lists a group's reward values,
# and `a[r == value]` picks the advantages of one set.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# def my_tie_spread(rewards, advantages):
#     worst = 0.0
#     for r, a in zip(rewards, advantages):         # one group at a time
#         for value in r.unique():
#             tied = a[r == value]
#             worst = max(worst, float(tied.max() - tied.min()))
#     return worst
#
#
# ch07.check_tie_spread(my_tie_spread)
# ```
#
# </details>

# %%
def my_tie_spread(rewards, advantages):
    raise NotImplementedError("your tie spread here")


ch07.check_tie_spread(my_tie_spread)
