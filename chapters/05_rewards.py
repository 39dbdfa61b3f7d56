# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 5. Rewards you can verify
#
# > **You will learn**
# > - DeepSeek-R1's three rule-based rewards: accuracy, format and language consistency
# > - how a group's rewards become advantages, and when they give none
# > - why a reward function must never fail, and how a sloppy rule and a learned model get hacked
# > - how process supervision rewards every step, and what it changed on a small task
# >
# > **You need first**: chapter 1 (the objective).
# >
# > **Reading time**: about 30 minutes. **Compute**: at most 120 s on a 2-core CPU. [Glossary](../docs/glossary.md) · [Notation](../docs/notation.md)
#
# GRPO (Group Relative Policy Optimization) needs one number per completion. For reasoning
# tasks DeepSeek-R1 computes it with rules, not with a model (the DeepSeek-R1 paper, "Reward
# design"; reward models score only its general, non-reasoning data):
#
# - an **accuracy reward**: is the final answer, written in a specified place such as a
#   box, correct?
# - a **format reward**: is the reasoning enclosed in `<think>` and `</think>`?
# - added with the same weight, $\text{Reward}_\text{rule} = \text{Reward}_\text{acc} +
#   \text{Reward}_\text{format}$ (eq. 4), and, against language mixing in the reasoning,
#   a **language-consistency reward**: the proportion of target-language words (eq. 7).
#
# The paper is explicit about why it keeps learned rewards out of reinforcement learning (RL) on
# reasoning: "we abstain from applying neural reward models [...] to reasoning tasks [...]
# neural reward models are susceptible to reward hacking during large-scale RL".
#
# This chapter builds the three rules on problems a program can check and runs them on real
# samples of a small policy. It turns them into group advantages, then breaks two rewards
# that are *not* verifiable, one rule and one learned model, to see what the paper was
# avoiding. It hands the same functions to the `GRPOTrainer` of TRL (Hugging Face's
# Transformer Reinforcement Learning library). It ends with process supervision, a reward
# for every step.

# %%
import collections
import inspect
import json
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch

from grpo_edu.environment import rewards, tasks
from grpo_edu.algorithm.advantages import group_advantages
from grpo_edu.exercises import ch05
from grpo_edu.policy.models import STARTING_POLICY, generate_completions, load_policy
from grpo_edu.book import home
from grpo_edu.book.claims import Claims

home.enter()   # the book's folder: its files are read and its runs written from there

torch.set_num_threads(1)
torch.manual_seed(0)
torch.set_printoptions(precision=4, sci_mode=False)


def show(text, width=40):
    """A completion as one line of at most `width` characters (newlines shown as \\n)."""
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[:width - 3] + "..."

# %% [markdown]
# ## Problems with answers a program can check
#
# The CPU tier's task is two-digit addition and subtraction. A sample is a plain dict, so a
# list of them is also a `datasets.Dataset` for TRL; `solution` is a completion in the
# format the rewards expect. The reasoning inside `<think>` is the units column: its carry
# (a result of 10 or more) or borrow (a negative result) is the one step of two-digit
# arithmetic that is more than a lookup.

# %%
for sample in tasks.make_dataset("arithmetic", 4, "train", seed=0):
    print(sample)

# %% [markdown]
# Completions are short on purpose. `<think>`, `</think>` and `\boxed{` are one token
# each in the character-level tokenizer, so a correct completion is at most ten tokens. A
# 2-core laptop samples hundreds a second, so chapter 6's training run takes minutes. Train
# and held-out problems are split by a hash of the prompt, so no seed or sampler can draw a
# held-out problem for training:

# %%
policy, tokenizer = load_policy()
longest = max(tasks.arithmetic_problems("train"),
              key=lambda s: len(tokenizer(s["solution"])["input_ids"]))
print(f"longest solution: {longest['prompt']} {longest['solution']} -> "
      f"{len(tokenizer(longest['solution'])['input_ids'])} tokens + <eos>")
train, held_out = tasks.arithmetic_problems("train"), tasks.arithmetic_problems("test")
print(f"{len(train):,} train and {len(held_out):,} held-out problems "
      f"(held-out share {len(held_out) / (len(train) + len(held_out)):.4f}), "
      f"overlap: {len({s['prompt'] for s in train} & {s['prompt'] for s in held_out})}")

# %% [markdown]
# The same rewards check two more tasks. Countdown ("reach the target with these numbers,
# each once") has many right answers, so its accuracy reward parses the boxed expression
# with a small recursive-descent parser (never Python's `eval`) and checks both the
# numbers used and the value. GSM8K, for the GPU tiers, comes through the `datasets`
# library; its reference answers follow `####`, which `gsm8k_final_answer` extracts (here
# from an inline example).

# %%
countdown = tasks.make_dataset("countdown", 1, "train", seed=0)[0]
print({key: countdown[key] for key in ("prompt", "numbers", "target", "solution")})
attempts = [countdown["solution"], "<think>guess</think>\\boxed{23*14+11}",
            "<think>code</think>\\boxed{__import__('os').system('ls')}"]
print(rewards.accuracy_reward(attempts, answer=[countdown["answer"]] * 3, task=["countdown"] * 3,
                              numbers=[countdown["numbers"]] * 3))
print(tasks.gsm8k_sample("Tom has 3 boxes of 1,000 pins. How many pins?",
                         "3 * 1,000 = 3,000 pins.\n#### 3,000"))

# %% [markdown]
# ## The starting policy
#
# `grpo_edu/assets/tiny-arithmetic-start` is a 2-layer, 128-wide Llama trained by
# `python -m grpo_edu.commands.pretrain`: supervised fine-tuning on these solutions, stopped on
# purpose while the policy is still often wrong. Its model card records how; here its
# greedy accuracy is recomputed on every held-out problem:

# %%
card = json.loads((STARTING_POLICY / "pretrain.json").read_text())
figures = card["held_out"]
print(f"{sum(p.numel() for p in policy.parameters()):,} parameters, SFT stopped at step {card['steps']}")
greedy = [g[0] for g in generate_completions(policy, tokenizer, [s["prompt"] for s in held_out])]
columns = {"answer": [s["answer"] for s in held_out]}
print(f"held-out greedy accuracy {np.mean(rewards.accuracy_reward(greedy, **columns)):.4f} "
      f"(model card: {figures['greedy_accuracy']:.4f}), "
      f"format {np.mean(rewards.format_reward(greedy)):.4f}")
print(f"model card, 8 samples per problem at temperature 1: pass@1 {figures['sample_accuracy']:.4f}, "
      f"pass@8 {figures['pass_at_8']:.4f}")

# %% [markdown]
# That is the shape GRPO needs. Greedy decoding is right on about two problems in five;
# a single sample at temperature 1 is right far less often; but among eight samples at
# least one is right for most problems. Those are the groups that disagree, and only a
# group that disagrees has non-zero advantages. Eight samples for four held-out prompts:

# %%
prompts = held_out[::400][:4]
groups = generate_completions(policy, tokenizer, [s["prompt"] for s in prompts], num_samples=8,
                              temperature=1.0, seed=0)
for sample, group in zip(prompts, groups):
    print(f"{sample['prompt']:<7} answer {sample['answer']:>4}:  " + "  ".join(f"{show(c, 28):<28}" for c in group[:4]))
    print(" " * 20 + "  ".join(f"{show(c, 28):<28}" for c in group[4:]))

# %% [markdown]
# ## Three rules
#
# The library's format check is plain string scanning, with no regular expression that
# could backtrack: the completion, stripped of surrounding whitespace, must start with
# `<think>`, hold a non-empty reasoning, close it once, and end with exactly one final
# answer.

# %%
print(inspect.getsource(rewards.has_format))

# %% [markdown]
# The accuracy reward finds the final answer: the last `\boxed{...}`, braces matched, else
# an `Answer:` line, else a GSM8K-style `####` line. It compares it exactly, as a number
# when both sides are numbers. So `132`, `0132` and `132.0` are the same answer, and
# `١٣٢` (Arabic-Indic digits, which Python's `int` accepts) is not. The language-consistency
# reward counts words, runs of letters, in the reasoning: for English, the share written in
# ASCII letters. Here are all three on real samples of the starting policy, the first
# correct, wrong and malformed one among 8 samples of 64 held-out problems:

# %%
pool_problems = held_out[::24][:64]
pool = generate_completions(policy, tokenizer, [s["prompt"] for s in pool_problems], num_samples=8,
                            temperature=1.0, seed=1)
flat = [(s, c) for s, group in zip(pool_problems, pool) for c in group]
strict = rewards.accuracy_reward([c for _, c in flat], answer=[s["answer"] for s, _ in flat])
well_formed = rewards.format_reward([c for _, c in flat])
kinds = ["malformed" if not f else "correct" if a else "wrong" for a, f in zip(strict, well_formed)]
examples = [flat[kinds.index(kind)] for kind in ("correct", "wrong", "malformed")]
mixed = next(s for s in held_out if s["prompt"][1:3] == "7+" and s["prompt"][4] == "5")   # units 7 + 5
examples.append((mixed, f"<think>seven plus five makes 十二</think>\\boxed{{{mixed['answer']}}}"))
print(f"{'prompt':<8}{'answer':>7}  {'completion':<40}{'accuracy':>9}{'format':>8}{'language':>10}")
for sample, completion in examples:
    scores = [rewards.accuracy_reward([completion], answer=[sample["answer"]])[0],
              rewards.format_reward([completion])[0],
              rewards.language_consistency_reward([completion], language="en")[0]]
    print(f"{sample['prompt']:<8}{sample['answer']:>7}  {show(completion):<40}"
          + "".join(f"{v:>{w}.4f}" for v, w in zip(scores, (9, 8, 10))))
counts = collections.Counter(kinds)
print(f"of {len(flat)} samples: {counts['correct']} correct, {counts['wrong']} wrong, "
      f"{counts['malformed']} malformed")

# %% [markdown]
# The last row is written by hand for a problem whose units column is 7 + 5, with the right
# answer boxed. Its reasoning has six words: four English, and two Chinese ideographs (each
# ideograph counts as a word, as Chinese has no spaces).
# A reasoning of digits only, like the policy's, has no words and nothing to mix: it scores
# 1 (and a completion with no reasoning at all scores 0).
#
# ## From rewards to advantages
#
# `combined_reward` is the weighted sum, callable like any reward function;
# `components` also returns each reward for logging. With R1's weights (accuracy 1,
# format 1), four prompts of the pool and their eight samples each give a (B, G) = (4, 8)
# reward matrix, and `grpo_edu.algorithm.advantages.group_advantages` turns each row into
# advantages: (r - mean) / std within the row.

# %%
reward = rewards.combined_reward({"accuracy": 1.0, "format": 1.0})
print(reward)
rows = [0, 1, 2, 3]
texts = [c for b in rows for c in pool[b]]
parts = reward.components(texts, answer=[pool_problems[b]["answer"] for b in rows for _ in range(8)])
R = torch.tensor(parts["reward"], dtype=torch.float64).view(len(rows), 8)
A = group_advantages(R, scale="group", std="population")
for b, (r, a) in zip(rows, zip(R, A)):
    print(f"{pool_problems[b]['prompt']:<7} rewards {' '.join(f'{x:.0f}' for x in r.tolist())}  "
          f"mean {r.mean():.4f} std {r.std(correction=0):.4f}  "
          f"advantages {' '.join(f'{x:+.2f}' for x in a.tolist())}")

# %% [markdown]
# A row whose eight rewards are equal has zero advantages everywhere: all eight samples of
# that prompt contribute no policy gradient, however right or wrong they are (here the
# first and last rows, eight well-formed wrong answers each). In a row that disagrees the
# advantages sum to zero. Right samples are pushed up and wrong ones down. A malformed
# sample, a format point lower, goes further down than a well-formed wrong one. In the
# second row the well-formed wrong samples sit exactly at the group mean and get no push
# at all.
#
# ## Robust by construction
#
# A reward function runs on whatever the policy writes, including text no test author
# imagined, millions of times. It must return a defined number for anything, quickly: one
# exception kills a run at step 40,000, and one regular expression with nested
# quantifiers turns a long completion into hours of backtracking. The library scans with
# `str.find`, bounded loops and linear patterns, even on megabyte inputs:
#
# <details><summary>How we know</summary>
#
# The tests feed every reward random unicode, random mixtures of markup, and the megabyte
# inputs below, with a time limit.
#
# </details>

# %%
megabyte = 1 << 20
nasty = {
    "empty": "",
    "1 MB of digits": "1" * megabyte,
    "1 MB of open braces": "\\boxed{" + "{" * megabyte,
    "150,000 boxes": "\\boxed{" * 150_000,
    "huge reasoning, right answer": "<think>" + "x " * (megabyte // 2) + "</think>\\boxed{132}",
    "nested braces": "<think>a</think>\\boxed{{{132}}}",
    "unbalanced braces": "<think>a</think>\\boxed{132}}",
    "unicode digits": "<think>٢</think>\\boxed{١٣٢}",
    "full-width digits": "<think>2</think>\\boxed{１３２}",
    "answer then junk": "<think>2</think>\\boxed{132}</think>",
}
print(f"{'input':<30}{'accuracy':>9}{'format':>8}{'language':>10}")
for name, text in nasty.items():
    scores = (rewards.accuracy_reward([text], answer=["132"])[0], rewards.format_reward([text])[0],
              rewards.language_consistency_reward([text])[0])
    print(f"{name:<30}" + "".join(f"{v:>{w}.4f}" for v, w in zip(scores, (9, 8, 10))))

# %% [markdown]
# ## Rewards a policy can hack
#
# RL optimises exactly the number it is given. A reward that is only *correlated* with what
# we want is a target, and a policy that samples hundreds of thousands of completions finds
# where the correlation breaks. Two examples, both in `grpo_edu.exercises.ch05`.
#
# **A sloppy rule.** "The reference answer occurs somewhere in the completion" sounds like
# an accuracy check. It pays wrong completions whose reasoning happens to contain the
# answer's digits, and it pays in full a completion that commits to nothing:

# %%
print(inspect.getsource(ch05.lenient_accuracy_reward))
every_number = "<think>" + " ".join(str(n) for n in range(-89, 199)) + "</think>"
answers = [s["answer"] for s in held_out]
print(f"one completion listing -89..198, on all {len(held_out)} held-out problems: "
      f"lenient {np.mean(ch05.lenient_accuracy_reward([every_number] * len(held_out), answer=answers)):.4f}, "
      f"verified {np.mean(rewards.accuracy_reward([every_number] * len(held_out), answer=answers)):.4f}")
lenient = ch05.lenient_accuracy_reward([c for _, c in flat], answer=[s["answer"] for s, _ in flat])
paid_wrong = sum(1 for l, s in zip(lenient, strict) if l and not s)
print(f"policy samples: {int(sum(strict))} right; the lenient rule also pays {paid_wrong} of the "
      f"{len(flat) - int(sum(strict))} wrong ones")

# %% [markdown]
# **A learned reward.** A neural reward model is a function fitted to labels, and it is
# only trustworthy on the kind of text it was fitted on. A stand-in small enough to read: a
# linear model over 15 character counts and the length, fitted by ridge regression to the
# verifier's labels on 2,400 samples of the starting policy for train problems.

# %%
fit_problems = tasks.make_dataset("arithmetic", 300, "train", seed=7)
fit_groups = generate_completions(policy, tokenizer, [s["prompt"] for s in fit_problems],
                                  num_samples=8, temperature=1.0, seed=2)
fit_texts = [c for group in fit_groups for c in group]
fit_labels = rewards.accuracy_reward(fit_texts, answer=[s["answer"] for s in fit_problems for _ in range(8)])
reward_model = ch05.CharacterRewardModel.fit(fit_texts, fit_labels)
print({name: round(w, 4) for name, w in reward_model.named_weights().items()})
test_texts = [c for _, c in flat]
test_scores = reward_model(test_texts)
best_correct = max(s for s, right in zip(test_scores, strict) if right)
# Its 95% interval: a bootstrap over the problems, each drawn with all 8 of its samples.
by_problem = np.arange(len(flat)).reshape(len(pool_problems), -1)
draws = np.random.default_rng(0).integers(0, len(by_problem), size=(2000, len(by_problem)))
resampled = [ch05.ranking_accuracy(np.asarray(test_scores)[rows], np.asarray(strict)[rows])
             for rows in (by_problem[d].ravel() for d in draws)]
low, high = np.quantile(resampled, [0.025, 0.975])
print(f"on the {len(test_texts)} held-out samples: ranks a right one above a wrong one "
      f"{ch05.ranking_accuracy(test_scores, strict):.4f} of the time, 95% interval [{low:.4f}, {high:.4f}] "
      f"(bootstrap over the {len(by_problem)} problems); best score of a right one {best_correct:.4f}")
hack = "9" * 40
print(f"{hack!r}: score {reward_model([hack])[0]:.4f}, verified accuracy "
      f"{rewards.accuracy_reward([hack], answer=['99'])[0]:.4f}, format {rewards.format_reward([hack])[0]:.4f}")

# %% [markdown]
# On the policy's own samples the model ranks a right completion above a wrong one 0.5607 of
# the time, 95% interval [0.4741, 0.6415]. The interval holds 0.5: on these 64 problems it is
# not separated from a coin flip. Counting characters
# cannot do arithmetic, and a real reward model is far better at this in-distribution job.
# The failure that matters is the other one. The model learned that digits and the closing tags go with correct
# answers, and a linear score has no ceiling, so a string of nines, which no verifier
# accepts, outscores every correct completion. Under RL the policy would
# drift toward such text, and the reward would rise while accuracy fell. A bigger network
# moves the failure further out without removing it. Retraining it as the policy drifts costs
# compute and pipeline complexity: the paper's second reason. The rules cannot drift: `accuracy_reward` is the definition of correct.
#
# ## The same functions in TRL
#
# Each reward has TRL's signature, `fn(completions, **kwargs) -> list[float]`, with the
# dataset's columns (here `answer` and `task`) arriving as keyword arguments. One step of
# TRL's `GRPOTrainer` on the starting policy, with our two rules as `reward_funcs`:

# %%
import importlib.util
import tempfile

if importlib.util.find_spec("trl") is None:
    print("TRL is not installed (pip install 'grpo-edu[trl]'): the GRPOTrainer demo is skipped")
else:
    from datasets import Dataset
    from transformers import PrinterCallback
    from transformers.utils import logging as transformers_logging
    from trl import GRPOConfig, GRPOTrainer

    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()  # TRL loads its reference model with a progress bar
    received = []

    def accuracy_reward(completions, **kwargs):
        received.append(sorted(kwargs))
        return rewards.accuracy_reward(completions, **kwargs)

    trl_policy, _ = load_policy()
    dataset = Dataset.from_list([{key: s[key] for key in ("prompt", "answer", "task")}
                                 for s in tasks.make_dataset("arithmetic", 16, "train", seed=1)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers' renamed options, not ours
        args = GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=16,
                          num_generations=8, max_completion_length=16, temperature=1.0, top_k=0, beta=0.04,
                          learning_rate=3e-4, max_steps=1, seed=0, use_cpu=True, report_to=[],
                          save_strategy="no", logging_steps=1, disable_tqdm=True)
        trainer = GRPOTrainer(model=trl_policy, processing_class=tokenizer, args=args, train_dataset=dataset,
                              reward_funcs=[accuracy_reward, rewards.format_reward])
        trainer.remove_callback(PrinterCallback)  # it prints timings; the numbers we want are below
        trainer.train()
    print("keyword arguments TRL passed:", received[0])
    log = trainer.state.log_history[0]
    for key in ("rewards/accuracy_reward/mean", "rewards/format_reward/mean", "reward", "frac_reward_zero_std"):
        print(f"{key:<30} {log[key]:.4f}")

# %% [markdown]
# The keyword arguments are the dataset columns plus TRL's own (`prompts`,
# `completion_ids`, `trainer_state` and logging hooks), which our functions accept and
# ignore through `**kwargs`. Chapter 6 trains with the same functions in grpo_edu's own
# loop.
#
# ## Rewarding every step: process supervision
#
# Everything above gives one number per completion, and GRPO turns it into one advantage that
# every token of the completion shares. A right first step of a wrong answer is pushed down
# with the rest of it. DeepSeekMath (section 4.1.3) also trains with *process supervision*, a
# reward at the end of every reasoning step. Completion i's step j ends at token index(j) and
# gets a reward $r_i^{index(j)}$. Every step reward of the group, R, is normalised by the mean
# and standard deviation of all of them. The advantage of token t is the sum of the
# normalised rewards of the steps that end at or after it:
#
# $$\tilde r_i^{index(j)} = \frac{r_i^{index(j)} - \mathrm{mean}(R)}{\mathrm{std}(R)}, \qquad
# \hat A_{i,t} = \sum_{index(j) \ge t} \tilde r_i^{index(j)}.$$
#
# DeepSeekMath's step rewards come from a learned process reward model (PRM). DeepSeek-R1 tried
# one and dropped it (DeepSeek-AI 2025, "Unsuccessful Attempts"). A fine-grained step is hard
# to define in general reasoning, and whether an intermediate step is right is hard to judge.
# And a learned PRM invites reward hacking, while retraining it costs compute and complicates
# the pipeline.
#
# Here a rule gives the step rewards instead, on a task whose every step a program can check.
# `chain` (`grpo_edu.environment.process`) sums three numbers, one written partial sum at a
# time. A step `a+b=c` is right when it adds the prompt's next number to the total the
# completion itself wrote last, and c = a + b. So a step after a wrong one can be right.
#
# The completion's last token carries its outcome reward, its accuracy, as one more step.
# `configs/cpu-chain.toml` rewards accuracy alone, so every step, the final answer included,
# is right (1) or wrong (0). The two kinds of supervision then see the same outcome, and
# process supervision sees the steps too; with one step, at the last token, the formula is
# outcome supervision again. Counting the outcome as the last step is this book's choice, not
# DeepSeekMath's: there the PRM scores the reasoning steps, and no separate outcome reward is
# added.

# %%
# The same completion, scored two ways.
from grpo_edu.book import schematics

schematics.reward_paths()

# %%
from grpo_edu.environment import process
from grpo_edu.algorithm.advantages import process_advantages
from grpo_edu.policy.models import CHAIN_POLICY

chain = process.chain_sample([57, 17, 29])
print(f"{chain['prompt']} -> {chain['solution']}")
for text in (chain["solution"], "<think>57+17=74,74+29=102</think>\\boxed{102}",
             "<think>57+17=73,73+29=102</think>\\boxed{102}", "<think>103</think>\\boxed{103}"):
    steps = process.chain_steps(text, chain["numbers"])
    print(f"{text:<44} steps (end, reward): {steps}")

# %% [markdown]
# The committed policy `grpo_edu/assets/tiny-chain-start` (`configs/cpu-chain.toml` trains it)
# was pretrained on these solutions and stopped while still often wrong. Eight samples for
# each of 40 held-out problems, and, per group, whether the outcome rewards and the step
# rewards differ:

# %%
chain_policy, chain_tokenizer = load_policy(CHAIN_POLICY)
chain_problems = tasks.make_dataset("chain", 40, "test", seed=0)
chain_groups = generate_completions(chain_policy, chain_tokenizer, [s["prompt"] for s in chain_problems],
                                    num_samples=8, temperature=1.0, max_new_tokens=32, seed=0)
outcome_reward = rewards.combined_reward({"accuracy": 1.0})


def group_tensors(sample, texts):
    """One group's completions as (1, G, S) ids and mask (EOS included), its outcome rewards
    (1, G) and its steps (grpo_edu.environment.process.completion_steps), with the final answer last."""
    rows = [chain_tokenizer(t, add_special_tokens=False)["input_ids"] + [chain_tokenizer.eos_token_id] for t in texts]
    S = max(map(len, rows))
    ids = torch.tensor([r + [chain_tokenizer.pad_token_id] * (S - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (S - len(r)) for r in rows])
    outcome = torch.tensor(outcome_reward(texts, answer=[sample["answer"]] * len(texts)), dtype=torch.float64)
    columns = {"task": ["chain"] * len(texts), "numbers": [sample["numbers"]] * len(texts)}
    return ids, mask, outcome[None], process.completion_steps(texts, columns, chain_tokenizer, ids, mask, outcome)


def differ(values):
    return bool((values != values.reshape(-1)[0]).any())


scored = [(sample, texts, *group_tensors(sample, texts)) for sample, texts in zip(chain_problems, chain_groups)]
flat_groups = [k for k, (*_, outcome, steps) in enumerate(scored) if not differ(outcome)]
steps_differ = [k for k in flat_groups if differ(scored[k][-1].rewards[scored[k][-1].mask])]
print(f"{len(scored)} groups: {len(flat_groups)} with all eight outcome rewards equal (no advantage anywhere under "
      f"outcome supervision), {len(steps_differ)} of them with step rewards that differ")
right_after_wrong = sum(int(outcome[0, g]) == 1 and steps.right[g] < steps.written[g]
                        for *_, outcome, steps in scored for g in range(8))
print(f"{right_after_wrong} of the {8 * len(scored)} samples box the right answer after a wrong or missing step")

# %% [markdown]
# A group whose eight outcome rewards are equal teaches nothing under outcome supervision. If
# its steps differ, process supervision still has something to say. Here is the first such
# group, its advantages token by token both ways:

# %%
sample, texts, ids, mask, outcome, steps = scored[steps_differ[0]]
S = ids.shape[1]
outcome_A = group_advantages(outcome)[..., None].expand(1, 8, S) * mask
process_A = process_advantages(steps.rewards[None], steps.ends[None], steps.mask[None], S) * mask
print(f"problem {sample['prompt']} (answer {sample['answer']}); step rewards of the group: mean "
      f"{steps.rewards[steps.mask].mean():.4f}, std {steps.rewards[steps.mask].std(correction=0):.4f}")
for g, text in enumerate(texts):
    marks = "".join("+" if r else "-" for r in steps.rewards[g, :int(steps.written[g])].tolist())
    print(f"{text:<40} steps {marks:<3} outcome {outcome[0, g]:.0f}  A outcome {outcome_A[0, g, 0]:+.2f}  "
          f"A process first token {process_A[0, g, 0]:+.4f}, last {process_A[0, g, int(mask[g].sum()) - 1]:+.4f}")

labels = {chain_tokenizer.convert_tokens_to_ids(t): short for t, short in
          (("<think>", "T"), ("</think>", "/T"), ("\\boxed{", "B"), ("<eos>", "E"))}
figure, axes = plt.subplots(1, 2, figsize=(13, 3.6), sharey=True)
limit = float(process_A.abs().max())
for ax, values, title in ((axes[0], outcome_A[0], "outcome supervision: one advantage per completion"),
                          (axes[1], process_A[0], "process supervision: the steps' rewards, summed from the right")):
    shown = np.ma.masked_where(~mask.bool().numpy(), values.numpy())
    image = ax.imshow(shown, cmap="coolwarm_r", vmin=-limit, vmax=limit, aspect="auto")
    for g in range(8):
        for t in range(int(mask[g].sum())):
            token = int(ids[g, t])
            ax.text(t, g, labels.get(token, chain_tokenizer.decode([token])), ha="center", va="center", fontsize=6)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("token")
axes[0].set_ylabel("completion")
_ = figure.colorbar(image, ax=axes, shrink=0.8, label="advantage")

# %% [markdown]
# Under outcome supervision every token of this group gets 0: all eight answers are equally
# wrong. Under process supervision the tokens before a right step are pushed up and those
# before a wrong one down (blue up, red down). The tokens after a completion's last written
# step get only the outcome's share, -0.4472 here.
#
# The seventh row shows what "right" means to the verifier. Its first step, 47+28=74, is
# wrong, yet its first token gets +1.3416, as much as the rows whose first step is right. The
# verifier judges each step against the running total the completion itself wrote. The second
# step, 74+38=112, adds 38 to the 74 written before it correctly, so it earns 1. Its
# normalised reward counts for every token before it, the wrong first step's included, and
# outweighs the two -0.4472 shares of the wrong first step and the wrong outcome.
#
# Per token, the loss is chapter 4's with $\hat A_{i,t}$ in place of $\hat A_i$. `grpo_loss`
# takes advantages of shape (B, G, S), as TRL 1.16's loss takes (B, T) ones, and the trainer
# computes them under the config key `supervision = "process"`.
#
# <details><summary>How we know</summary>
#
# `tests/test_trl_parity.py` holds `grpo_loss` with per-token advantages equal to TRL 1.16's
# loss. `grpo_edu.algorithm.reference.process_advantages`, a plain loop, is the version
# `process_advantages` is tested against.
#
# </details>
#
# **Does it train better?** The chain policy trains both ways, 150 steps, three seeds each,
# everything else as in the CPU tier's default run. Every run is evaluated greedily on 256
# held-out problems every 25 steps, and the share of written steps that are right is logged
# either way:
#
# <details><summary>How we know</summary>
#
# `benchmarks/process.py` ran the six runs and wrote `benchmarks/results/process.json`, which
# the cell below reads.
#
# </details>

# %%
PROCESS_RESULTS = json.loads(home.path("benchmarks/results/process.json").read_text())
process_runs = PROCESS_RESULTS["runs"]
for variant in PROCESS_RESULTS["variants"]:
    mine = [r for r in process_runs if r["variant"] == variant]
    final = [r["final_accuracy"] for r in mine]
    steps_right = [np.mean(r["steps"]["process/step_accuracy"][-25:]) for r in mine]
    print(f"{variant:<8} held-out accuracy {mine[0]['start_accuracy']:.4f} -> {np.mean(final):.4f} "
          f"({min(final):.4f}-{max(final):.4f});  steps right, last 25 steps {np.mean(steps_right):.4f} "
          f"({min(steps_right):.4f}-{max(steps_right):.4f});  KL, last 25 steps "
          f"{np.mean([np.mean(r['steps']['kl'][-25:]) for r in mine]):.4f}")
figure, axes = plt.subplots(1, 2, figsize=(11, 3.4))
for r in process_runs:
    color = {"outcome": "tab:gray", "process": "tab:purple"}[r["variant"]]
    label = r["variant"] if r["seed"] == 0 else None
    axes[0].plot([0] + [s for s, _ in r["eval"]], [r["start_accuracy"]] + [a for _, a in r["eval"]], color=color,
                 label=label)
    window = np.convolve(r["steps"]["process/step_accuracy"], np.ones(10) / 10, mode="valid")
    axes[1].plot(np.arange(10, len(window) + 10), window, color=color, label=label)
axes[0].set_title("held-out greedy accuracy (256 problems)")
axes[1].set_title("share of written steps that are right (sampled, 10-step mean)")
for ax in axes:
    ax.set_xlabel("step")
    ax.legend()
figure.tight_layout()

# %% [markdown]
# Is process supervision better here? Each seed gives both variants the same prompts and the
# same start, so the fair comparison is paired: the difference process - outcome in each seed,
# and a 95% interval for its mean (Student's t over the seeds,
# `grpo_edu.algorithm.statistics.paired_seeds`). The book says "A beats B" only when that
# interval excludes zero.

# %%
from grpo_edu.algorithm.statistics import paired_seeds


def by_variant(value):
    return {v: [value(r) for r in sorted(process_runs, key=lambda r: r["seed"]) if r["variant"] == v]
            for v in PROCESS_RESULTS["variants"]}


compared = {
    "final held-out accuracy": by_variant(lambda r: r["final_accuracy"]),
    "held-out accuracy at the first evaluation (step 25)": by_variant(lambda r: r["eval"][0][1]),
    "share of right steps, last 25 steps": by_variant(lambda r: np.mean(r["steps"]["process/step_accuracy"][-25:])),
}
verdicts = {name: paired_seeds(values["process"], values["outcome"]) for name, values in compared.items()}
for name, verdict in verdicts.items():
    print(f"{name}: {verdict.words('process', 'outcome')}")
print(f"({verdicts['final held-out accuracy'].method})")
claims = {
    "every run learns: its final held-out accuracy is at least 0.1 above the start's":
        all(r["final_accuracy"] > r["start_accuracy"] + 0.1 for r in process_runs),
    "final held-out accuracy: not separated at this size (the paired interval includes 0)":
        not verdicts["final held-out accuracy"].separated,
    "at the first evaluation: not separated either":
        not verdicts["held-out accuracy at the first evaluation (step 25)"].separated,
    "the share of right steps: process supervision beats outcome supervision (the interval is above 0)":
        verdicts["share of right steps, last 25 steps"].low > 0,
}
Claims(claims)

# %% [markdown]
# Each run also kept its final policy's outcome on every one of the 256 held-out problems. So
# within one seed the two variants can be compared on the same problems: McNemar's exact test
# (McNemar 1947) counts the problems only one of them gets right.

# %%
from grpo_edu.algorithm.statistics import mcnemar

outcomes = {v: {r["seed"]: r["greedy_correct"] for r in process_runs if r["variant"] == v} for v in ("process", "outcome")}
within = {seed: mcnemar(outcomes["process"][seed], outcomes["outcome"][seed]) for seed in sorted(outcomes["process"])}
for seed, test in within.items():
    print(f"seed {seed}: right only under process {test['a_only']:.0f}, only under outcome {test['b_only']:.0f}, "
          f"McNemar p = {test['p_value']:.3f}")
stored = PROCESS_RESULTS["verdicts"]["process - outcome"]["per_seed"]
claims = {
    "the results file's verdicts within each seed are these":
        all(stored[str(seed)][key] == test[key] for seed, test in within.items() for key in test),
    "within seeds 0 and 1 process supervision is right alone on more problems, p < 0.05":
        all(within[s]["a_only"] > within[s]["b_only"] and within[s]["p_value"] < 0.05 for s in (0, 1)),
    "within seed 2 the two are not separated (p > 0.5)":
        within[2]["p_value"] > 0.5,
}
Claims(claims)

# %% [markdown]
# Within seeds 0 and 1, process supervision gets more of the same problems right: 28 against
# 12 (p = 0.017) and 30 against 13 (p = 0.014). Within seed 2 it does not: 25 against 22
# (p = 0.771). Each test speaks for one training run. Whether another run would agree is what
# the interval over seeds asks, and that interval holds zero. So: ahead in two runs of three,
# not separated over runs.
#
# DeepSeekMath reports process supervision ahead of outcome supervision in its GRPO runs. Here
# the steps agree: process supervision's completions write right steps more often, +0.074
# [+0.058, +0.090], an interval well above zero. The final answers are not separated at this
# size: +0.047 [-0.029, +0.123], an interval that holds zero.
#
# The task explains part of it. With three numbers there are two steps, so an outcome reward
# already says a lot about them. And the policy's answer does not always follow its own steps:
# 16 of the 320 samples above box the right answer after a wrong or missing step. That caps
# what rewarding the steps can do for the answer. Where process supervision earns its keep is
# in groups like the one drawn above. Of the 40 groups sampled from the start, 16 have eight
# equal outcomes and give no gradient at all under outcome supervision; 13 of them still
# differ in their steps. The price is a step verifier: a rule here, a trained PRM in
# DeepSeekMath, with the hacking risk of any learned reward (two sections back) that led
# DeepSeek-R1 to drop it.
#
# ## What you learned
#
# - A verifiable reward is a rule a program checks: the boxed answer's accuracy, the
#   `<think>` format, the reasoning's language.
# - A group whose rewards are all equal gets zero advantages. In a group that disagrees, the
#   advantages sum to zero: right samples up, wrong ones down.
# - A reward function runs on whatever the policy writes, so it must return a number, fast,
#   for every input.
# - A reward only correlated with correctness gets hacked: a lenient rule pays answers that
#   commit to nothing, and a linear reward model pays a string of nines more than any right
#   answer.
# - Process supervision gives each token the summed, normalised rewards of the steps at or
#   after it. On the chain task it raised the share of right steps; final accuracy was not
#   separated at this size.
#
# ## Check yourself
#
# Where an answer is a number, check yours before you open it:
# `quiz.check(5, 1, advantages=...)` (`from grpo_edu.exercises import quiz`;
# `quiz.ask(5)` lists what each question takes).
#
# 1. A group's rewards (accuracy + format) are 0 1 2 1 1 1 1 1. What are the advantages of
#    its first three samples?
#
#    <details><summary>Answer</summary>
#
#    The mean is 1.0000 and the population std 0.5000, so -2.00, +0.00 and +2.00. The five
#    other well-formed wrong samples also sit at the mean and get no push.
#
#    </details>
#
# 2. Eight samples of a prompt are all right and well formed. What do they teach the policy,
#    and why?
#
#    <details><summary>Answer</summary>
#
#    Nothing: all eight rewards are equal, so every advantage is 0 and the group gives no
#    policy gradient, however right its samples are.
#
#    </details>
#
# 3. One completion lists every integer from -89 to 198 in its reasoning. What does it score
#    on the held-out problems under the lenient rule, and under the verifier?
#
#    <details><summary>Answer</summary>
#
#    1.0000 under the lenient rule, which pays any completion that contains the answer, and
#    0.0000 under the verifier, which reads only the final answer (and there is none).
#
#    </details>
#
# 4. In the process-supervised group, the row that writes 47+28=74 gets +1.3416 on its first
#    token although that step is wrong. Why?
#
#    <details><summary>Answer</summary>
#
#    The verifier judges each step against the running total the completion wrote. Its second
#    step, 74+38=112, is right on those terms and earns 1. That step's normalised reward is
#    added to every token before it and outweighs the -0.4472 of the wrong first step and of
#    the wrong outcome.
#
#    </details>
#
# 5. Process minus outcome supervision: +0.074 [+0.058, +0.090] for the share of right steps,
#    +0.047 [-0.029, +0.123] for final accuracy. What may you claim?
#
#    <details><summary>Answer</summary>
#
#    Process supervision raises the share of right steps: the paired interval excludes zero.
#    Final accuracy is not separated at this size: its interval holds zero.
#
#    </details>
#
# ## Exercises
#
# Each checker in `grpo_edu.exercises.ch05` runs your answer on several cases. It names each
# case that fails and what your answer does wrong there (accepts what the rule rejects, or
# rejects what it accepts), never the right value.
#
# **5.1 A stricter format reward.** The policy's completions have one exact shape. Write
# `strict_format_reward(completions, **kwargs)`. It returns 1.0 exactly when a completion is
# `<think>N</think>\boxed{M}` with N and M plain integers (an optional minus sign, ASCII
# digits, no leading zero, no spaces, nothing before or after) and 0.0 otherwise. It never
# raises, and is fast on a megabyte. The attempt below looks right; the checker says where it
# is not.
#
# <details><summary>Hint</summary>
#
# `re.match` anchors only the start; `\d` matches every Unicode digit; and "no leading
# zero" means 0 itself or a digit 1-9 followed by any digits. A pattern without nested
# repetition stays linear on a megabyte.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# import re
#
# from grpo_edu.environment import rewards
#
# INTEGER = r"-?(?:0|[1-9][0-9]*)"          # ASCII digits, no leading zero
# PATTERN = re.compile(rf"<think>{INTEGER}</think>\\boxed\{{{INTEGER}\}}")
#
#
# def strict_format_reward(completions, **kwargs):
#     return [1.0 if PATTERN.fullmatch(rewards.completion_text(c)) else 0.0 for c in completions]
#
#
# ch05.check_strict_format(strict_format_reward)
# ```
#
# </details>

# %%
import re


def strict_format_reward(completions, **kwargs):
    pattern = re.compile(r"<think>-?\d+</think>\\boxed\{-?\d+\}")
    return [1.0 if pattern.match(rewards.completion_text(c)) else 0.0 for c in completions]


ch05.check_strict_format(strict_format_reward)

# %% [markdown]
# **5.2 Hack the learned reward.** The string of nines above is not something the policy
# could be paid for in a real run: it is malformed, and 40 tokens long. Find a completion
# for the problem below that has at most 16 tokens, passes `format_reward`, is wrong, and
# still scores above every correct completion under `reward_model`.
#
# <details><summary>Hint</summary>
#
# `reward_model.named_weights()` prints what each character is worth. The score is linear
# and has no ceiling: within 16 tokens and the `<think>N</think>\boxed{M}` shape, spend
# every character you can on the best-paid digit, and make M wrong for the problem.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# # this chapter's reward model, problem and best correct score, rebuilt the same way (the cell below checks)
# reward_model, target_problem, best_correct, tokenizer = ch05.reward_model_exercise()
# weights = reward_model.named_weights()
# digit = max("0123456789", key=weights.get)        # the best-paid digit
# # the four tags are one token each, which leaves 12 digits; six 9s are not the problem's answer
# my_hack = f"<think>{digit * 6}</think>\\boxed{{{digit * 6}}}"
# ch05.check_reward_model_hack(my_hack, reward_model, target_problem, best_correct, tokenizer)
# ```
#
# </details>

# %%
rebuilt, rebuilt_problem, rebuilt_best, _ = ch05.reward_model_exercise(policy, tokenizer)
print(f"ch05.reward_model_exercise() rebuilds this chapter's model, problem and best correct score: "
      f"{np.array_equal(rebuilt.weights, reward_model.weights) and rebuilt_best == best_correct}")
target_problem = held_out[0]
assert rebuilt_problem == target_problem
my_hack = hack  # replace with your completion
ch05.check_reward_model_hack(my_hack, reward_model, target_problem, best_correct, tokenizer)

# %% [markdown]
# **5.3 A countdown verifier.** Write `countdown_reward(completions, numbers, target,
# **kwargs)`: 1.0 when the last `\boxed{...}` holds an expression that uses each of
# `numbers` exactly once and equals `target`, else 0.0. Use
# `grpo_edu.environment.tasks.evaluate_expression` and `expression_numbers` (never `eval`), and make
# sure a malicious or enormous completion scores 0.0 instead of raising.
#
# <details><summary>Hint</summary>
#
# Take the text between the last `\boxed{` and the last `}`. `evaluate_expression` raises
# on anything that is not plain integer arithmetic (and on division by zero): catch that
# and score 0. Compare the numbers used with the pool as sorted lists, so that a pool with
# a repeated number needs it twice.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# from grpo_edu.environment import rewards, tasks
#
#
# def countdown_reward(completions, numbers, target, **kwargs):
#     scores = []
#     for completion, pool, goal in zip(completions, numbers, target):
#         text = rewards.completion_text(completion)
#         start, end = text.rfind("\\boxed{"), text.rfind("}")
#         if start < 0 or end < start:
#             scores.append(0.0)
#             continue
#         expression = text[start + len("\\boxed{"):end]
#         try:
#             value = tasks.evaluate_expression(expression)
#         except Exception:       # not arithmetic, too long, too deep, division by zero
#             scores.append(0.0)
#             continue
#         right = sorted(tasks.expression_numbers(expression)) == sorted(pool) and value == goal
#         scores.append(1.0 if right else 0.0)
#     return scores
#
#
# ch05.check_countdown_reward(countdown_reward)
# ```
#
# </details>

# %%
def countdown_reward(completions, numbers, target, **kwargs):
    raise NotImplementedError("your verifier here")


ch05.check_countdown_reward(countdown_reward)
