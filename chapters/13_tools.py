# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 13. Tools and multi-turn episodes
#
# > **You will learn**
# > - how a completion becomes an episode of turns, with a tool's answers between them
# > - who wrote each token, and the mask that keeps the tool's tokens out of the loss
# > - what training on the tool's tokens teaches, and how the doctor sees it
# > - what a tiny policy learns in 100 steps with a calculator
# > - what an episode costs against a single-turn completion
# >
# > **You need first**: chapter 5 (verifiable rewards), chapter 6 (training the tiny reasoner).
# >
# > **Reading time**: about 24 minutes. **Compute**: at most 90 s on a 2-core CPU. [Glossary](../docs/glossary.md) · [Notation](../docs/notation.md)
#
# Every completion so far was written by the policy alone. Models trained with reinforcement
# learning (RL) today call tools: they write a call, a program answers, and they go on writing
# with the answer in front of them. Hugging Face's Transformer Reinforcement Learning library
# (TRL 1.16), verl, OpenRLHF and SkyRL all train with tools. A completion becomes an
# **episode**. The policy writes until it hands over (a tool call) or ends; the
# **environment** answers; the policy writes its next **turn**, with the prompt, everything
# written so far and the answer as its context.
#
# The first trap is the kind this book exists for. The environment's tokens sit in the
# completion like the policy's, but the policy never chose them. A trainer that masks only the
# padding puts them in the loss, the Kullback-Leibler (KL) term, the ratio and every
# normaliser. It then trains the policy on text it never sampled. Search-R1 (Jin et al. 2025)
# and ReTool (Feng et al. 2025) both mask the tool's tokens out of the loss for this reason.
#
# This chapter draws an episode token by token, with who wrote each, and the mask that keeps
# the environment's tokens out of everything but the attention. Then it trains a tiny policy
# to use a calculator with GRPO (Group Relative Policy Optimization), and once more, on
# purpose, with the calculator's tokens in its loss.

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch

from grpo_edu import lab
from grpo_edu.environment import rewards, tasks
from grpo_edu.algorithm.advantages import group_advantages
from grpo_edu.config import TrainConfig
from grpo_edu.doctor.diagnose import diagnose
from grpo_edu.training.episodes import Calculator, roll_out_episodes
from grpo_edu.algorithm.logprobs import completion_logprobs
from grpo_edu.algorithm.loss import grpo_loss
from grpo_edu.policy.models import TOOL_POLICY, load_policy
from grpo_edu.sampling.rollout import HFEngine, SamplingParams
from grpo_edu.book import home
from grpo_edu.book.claims import Claims

home.enter()   # the book's folder: its files are read and its runs written from there

torch.set_num_threads(2)
RESULTS = json.loads(home.path("benchmarks/results/tools.json").read_text())
CALCULATOR = "grpo_edu.training.episodes:Calculator"




# %% [markdown]
# ## 1. A task that needs a tool
#
# Two-digit products (`grpo_edu.environment.tasks`, task `"multiply"`): 8,100 problems, a
# tenth of them held out. The tiny policy of chapters 5-12 learned two-digit sums and
# differences in its head; a product is beyond it. The tool is
# `grpo_edu.training.episodes.Calculator`. The policy writes a call in brackets, and the
# closing bracket hands the turn over (the environment's `stop`). The calculator answers
# `=value`, or `=?` for a call it cannot read, or `=!` after four calls, which ends the
# episode. Each problem has two solutions, one that calls and one in the head:

# %%
sample = tasks.multiply_sample(47, 85)
for key in ("prompt", "answer", "solution", "direct_solution"):
    print(f"{key:<16} {sample[key]}")
calculator = Calculator()
calculator.reset(sample)
for action in ("<think>[47*85]", "[7/2]", "[forty*2]"):
    print(f"{action!r:<18} -> {calculator.step(action)}")

# %% [markdown]
# The starting policy (`grpo_edu/assets/tiny-multiply-start`, the model `multiply-start` in a
# config) was pretrained by
# `python -m grpo_edu.commands.pretrain --task multiply --tool-share 0.5`. Half of its
# training solutions call, half answer in the head. The calculator's answers were kept out of
# its loss: `grpo_edu.training.episodes.writers` splits a solution by playing it against the
# environment, and what follows a call is the environment's. Its model card, on all 816
# held-out products played with the calculator:

# %%
card = json.loads((TOOL_POLICY / "pretrain.json").read_text())["held_out"]
for key in ("sample_tool_call_rate", "sample_accuracy", "mixed_groups", "tool_call_rate", "greedy_accuracy"):
    print(f"{key:<24} {card[key]:.4f}")

# %% [markdown]
# Sampled at temperature 1 it calls in about half of its episodes, and its groups disagree:
# GRPO has a choice to learn from.
#
# ## 2. An episode, token by token
#
# The trainer rolls out episodes with `grpo_edu.training.episodes.roll_out_episodes`. Turn 0
# samples G completions of the prompt, each stopping at the end-of-sequence token (EOS) or at
# the calculator's `]`. The calculator answers each call. The next turn samples one
# continuation per open episode, from the prompt and everything the episode holds. Four
# episodes of `47*85=`, sampled by transformers' `generate` (the fused engine and vLLM run the
# same turns), the environment's text in `⟦ ⟧`:

# %%
# Who writes what in an episode, and what the loss sees (a schematic; the real episode follows).
from grpo_edu.book import schematics

schematics.episode_writers()

# %% tags=["platform-numerics"]
policy, tokenizer = load_policy(TOOL_POLICY)
engine = HFEngine(policy, tokenizer)
prompt = tokenizer([sample["prompt"]], return_tensors="pt", add_special_tokens=False)
G, L = 4, 24
torch.manual_seed(11)
rollout = roll_out_episodes(lambda turn, ids, mask, sampling, rows: engine.generate(ids, mask, sampling),
                            [sample], prompt["input_ids"], prompt["attention_mask"], SamplingParams(G, L, 1.0),
                            tokenizer, CALCULATOR, max_turns=2)


def token_text(token):
    return tokenizer.convert_ids_to_tokens(int(token))


def episode_text(i):
    out, in_env = "", False
    for s in range(rollout.completion_ids.shape[1]):
        env, mine = bool(rollout.env_mask[i, s]), bool(rollout.completion_mask[i, s])
        if not (env or mine):
            break
        if env != in_env:
            out += "⟦" if env else "⟧"
            in_env = env
        out += token_text(rollout.completion_ids[i, s])
    return out + ("⟧" if in_env else "")


written = rollout.completion_mask | rollout.env_mask
texts = tokenizer.batch_decode(rollout.completion_ids.masked_fill(~written, tokenizer.pad_token_id),
                               skip_special_tokens=True)
accuracy = rewards.accuracy_reward(texts, answer=[sample["answer"]] * G, task=["multiply"] * G)
formatted = rewards.format_reward(texts)
reward = torch.tensor([a + 0.5 * f for a, f in zip(accuracy, formatted)], dtype=torch.float64)
for i in range(G):
    print(f"episode {i}  turns {int(rollout.episode['turns'][i])}  reward {reward[i]:.2f}  {episode_text(i)}")

# %% [markdown]
# Every token carries who wrote it: `completion_mask` marks the policy's, `env_mask` the
# calculator's. The two never overlap, and their union is what the forward attends to in the
# completion. The sampler's log-prob exists for the policy's tokens only. For the calculator's
# tokens the table also shows what the policy *would* have given them, from one forward over
# the whole episode: text it was never trained to predict.
#
# TRL's `env_mask` has the opposite polarity: 1 on the model's tokens, 0 on the environment's.
# Carried from this book to TRL, a mask must be inverted.
#
# <details><summary>How we know</summary>
#
# In TRL 1.16's `trl/trainer/grpo_trainer.py`, the `env_mask` a custom `rollout_func` returns
# becomes `tool_mask`, commented "marks model tokens (1) vs external tokens (0)", and the loss
# mask is `completion_mask * tool_mask`. This book's `env_mask` is built in
# `grpo_edu/training/episodes.py`, marking the environment's tokens.
#
# </details>

# %% tags=["platform-numerics"]
called = [i for i in range(G) if bool(rollout.env_mask[i].any())]
row = called[0]
ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
attention = torch.cat([rollout.prompt_mask, written.long()], dim=1)
with torch.no_grad():
    every_token = completion_logprobs(policy, ids, attention, written)   # log pi at every written token
print(f"episode {row}: {'token':<9} {'writer':<11} completion_mask  env_mask  attention  sampler logp  "
      f"policy logp")
for s in range(int(written[row].sum())):
    writer = "calculator" if rollout.env_mask[row, s] else "policy"
    sampler = f"{rollout.sampler_logp[row, s]:.4f}" if rollout.completion_mask[row, s] else "-"
    print(f"{s:>3} {token_text(rollout.completion_ids[row, s])!r:<13} {writer:<11} "
          f"{int(rollout.completion_mask[row, s]):^15} {int(rollout.env_mask[row, s]):^9} "
          f"{int(written[row, s]):^10} {sampler:>12}  {every_token[row, s]:11.4f}")

# %% [markdown]
# ## 3. The environment's tokens are context, not actions
#
# The loss sees an episode through `completion_mask`. Give `grpo_loss` the policy's mask, and
# the gradient with respect to the log-prob of every calculator token is exactly zero. Give it
# the union of the two masks, as a trainer that masks only the padding does, and every
# calculator token is pushed like an action: up in the episodes with a positive advantage,
# down in the others. The same mask sets every normaliser: the token counts below are grpo's
# per-sequence lengths. (The ratio is 1 and the KL 0 here, pi_old and the reference being this
# policy: the gradient is the advantage's alone.)

# %% tags=["platform-numerics"]
advantages = group_advantages(reward[None, :])[0]
for name, mask in (("the policy's tokens", rollout.completion_mask), ("every written token", written)):
    logp = every_token.detach().clone().requires_grad_(True)
    out = grpo_loss(logp, logp.detach(), advantages.float(), mask, ref_logp=logp.detach(), beta=0.04)
    out.loss.backward()
    on_env = logp.grad[rollout.env_mask]
    print(f"mask = {name:<20} tokens per episode {mask.sum(-1).tolist()}   "
          f"max |d loss / d logp| at the calculator's tokens {on_env.abs().max().item():.6f}")
print("advantages", [round(a, 4) for a in advantages.tolist()])

# %% [markdown]
# The sampler gap (mean |log pi_trainer - log pi_sampler| per token, chapter 11) tells the two
# apart from a run's metrics alone. Over the policy's tokens the trainer's forward recomputes
# what the sampler drew, equal up to float rounding. Over every written token it also compares
# the policy's log-prob of the calculator's text with a sampler that never drew it (0 in the
# rollout):

# %% tags=["platform-numerics"]
from grpo_edu.doctor.diagnose import ENV_GAP

sampler_logp = rollout.sampler_logp.double()
for name, mask in (("the policy's tokens", rollout.completion_mask), ("every written token", written)):
    gap = ((every_token.double() - sampler_logp).abs() * mask).sum() / mask.sum()
    print(f"sampler gap over {name:<20} {gap.item():.3g} nats per token")
print(f"the doctor's threshold, grpo_edu.doctor.diagnose.ENV_GAP: {ENV_GAP} nats per token")

# %% [markdown]
# The doctor (`grpo-edu doctor`, chapter 7) reads a run's logged metrics and names each
# failure it recognises. Its check `environment_tokens_trained` reads exactly this gap. With an
# environment set, it flags a gap of 0.03 nats per token or more over the early steps
# (`grpo_edu.doctor.diagnose.ENV_GAP`, the gap at which it also calls a sampler mismatch).
# The tool run of section 4 measures a gap more than five orders of magnitude below it, the
# leak run more than ten times above it.
#
# ## 4. GRPO learns to call
#
# `configs/cpu-tools.toml` is the CPU tier's config with the multiply task, the tool policy,
# the calculator and two turns. Twenty steps of it, and the same twenty with the calculator's
# tokens in the loss. Both are runs of the failure lab (`grpo_edu.lab`, chapter 7): short runs,
# each with one fault injected on purpose, or none. Per step, from the runs' metrics: the
# sampled episodes' accuracy, their mean policy turns (2: it called), the sampler gap and the KL:
#
# <details><summary>How we know</summary>
#
# Both runs are `grpo_edu.lab.TOOL_RUNS`, the failure lab's runs of this chapter; the leak is
# injected by `grpo_edu.lab.faults.Faults(env_tokens_in_loss=True)`.
#
# </details>

# %% tags=["platform-numerics"]
live = {name: lab.run(name, Path("runs") / "chapter11") for name in lab.TOOL_RUNS}
print(f"{'step':>4}  " + "".join(f"{name + ': accuracy turns gap kl':<44}" for name in live))
for step in (1, 5, 10, 15, 20):
    cells = []
    for result in live.values():
        m = result.history[step - 1]
        cells.append(f"{m['reward/accuracy']:8.3f} {m['episode/turns']:5.2f} {m['sampler_gap/mean_abs']:9.3g} "
                     f"{m['kl']:8.4f}".ljust(44))
    print(f"{step:>4}  " + "".join(cells))
found = {name: [f.detector for f in diagnose(result.history, lab.TOOL_RUNS[name].config("unused").to_dict())]
         for name, result in live.items()}
for name, result in live.items():
    print(f"{name}: held-out greedy accuracy {result.summary['start_accuracy']:.3f} -> "
          f"{result.summary['final_accuracy']:.3f}; the doctor finds {found[name] or 'nothing'}")

# %% [markdown]
# ## 5. Measured: the tool, no tool, the leak, 3 seeds
#
# A benchmark trains `configs/cpu-tools.toml` for 100 steps three ways, seeds 0, 1 and 2.
# **tool** runs with the calculator. **no tool** runs single-turn: the same policy with nobody
# to answer its calls, so only products in the head earn reward. **leak** runs with the
# calculator's tokens in the loss. Before and after, each policy plays all 816 held-out
# products the way its run plays them. The table gives the greedy accuracy and tool-call rate,
# the mean policy turns, and the accuracy and tool-call rate of 4 samples per problem at
# temperature 1, each as the mean over the seeds (min-max).
#
# Several "start" figures appear, all of the same starting policy. The model card and the
# table's "start, tool" row play all 816 held-out products with the calculator: greedy, both
# give 0.783; sampled, the card's 0.3629 is over 8 samples per problem and the table's 0.376
# over 4. Section 4's 0.828 is greedy on the failure lab's 128 held-out problems. Its step-1
# accuracy, 0.383, is that of the first training batch's sampled episodes, before any update.
# The "start, no_tool" row, 0.002, is the same policy played single-turn, greedy, with nobody
# to answer its calls.
#
# The lines under the table compare paired by seed: the mean of the seed-by-seed
# differences with a 95% interval (Student's t over the 3 seeds,
# `grpo_edu.algorithm.statistics.paired_seeds`). Against the start, each seed is compared with
# the one starting policy. The book says "A beats B" only where the interval excludes zero.
#
# <details><summary>How we know</summary>
#
# `benchmarks/tools.py` trained the nine runs and wrote `benchmarks/results/tools.json`, which
# the cell reads; `tests/test_tools.py` re-trains one of them and compares its per-step
# numbers with the file's. The card's sample count is `pass_k` = 8 in
# `grpo_edu/assets/tiny-multiply-start/pretrain.json`; the benchmark's is `samples` = 4 in the
# results file; the failure lab's 128 problems are `grpo_edu.lab.SETTINGS["eval_size"]`.
#
# </details>

# %%
runs = RESULTS["runs"]
VARIANTS = ["tool", "no_tool", "leak"]
KEYS = ["greedy_accuracy", "tool_call_rate", "mean_turns", "sample_accuracy", "sample_tool_call_rate"]


def cell(values):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return f"{np.mean(values):.3f} ({min(values):.3f}-{max(values):.3f})" if len(values) > 1 else f"{values[0]:.3f}"


print(f"{'':<16}" + "".join(f"{key:<24}" for key in KEYS))
for name, before in RESULTS["before"].items():
    print(f"{'start, ' + name:<16}" + "".join(f"{cell([before[key]]):<24}" for key in KEYS))
for variant in VARIANTS:
    mine = [r["after"] for r in runs if r["variant"] == variant]
    print(f"{variant:<16}" + "".join(f"{cell([m[key] for m in mine]):<24}" for key in KEYS))

from grpo_edu.algorithm.statistics import by_seed, paired_seeds

after_by_seed = {v: by_seed(runs, "after", variant=v) for v in VARIANTS}
start_of = RESULTS["before"]["tool"]
tool_verdicts = {}
print("\npaired over seeds: mean difference [95% t interval]")
for key in ("greedy_accuracy", "sample_accuracy", "sample_tool_call_rate"):
    tool = [m[key] for m in after_by_seed["tool"]]
    tool_verdicts["start", key] = paired_seeds(tool, [start_of[key]] * len(tool))
    tool_verdicts["leak", key] = paired_seeds(tool, [m[key] for m in after_by_seed["leak"]])
    print(f"{key:<22} {tool_verdicts['start', key].words('tool', 'start')}")
    print(f"{'':<22} {tool_verdicts['leak', key].words('tool', 'leak')}")

from grpo_edu.algorithm.statistics import mcnemar

print("\nwithin each seed, greedy, the same 816 problems: tool against leak (McNemar's exact test)")
within_seed = {}
for seed, tool, leak in zip(RESULTS["seeds"], after_by_seed["tool"], after_by_seed["leak"]):
    within_seed[seed] = mcnemar(tool["greedy_correct"], leak["greedy_correct"])
    test = within_seed[seed]
    print(f"  seed {seed}: tool right where the leak is wrong on {test['a_only']:.0f} problems, the reverse on "
          f"{test['b_only']:.0f}; p = {test['p_value']:.2g}")

# %% [markdown]
# Against its own start, the tool run learned to call and to read the answer: greedy from
# 0.783 to 1.000, sampled from 0.376 to 0.917, calling in 0.984 of its samples against 0.509.
# Paired by seed, each of those gains excludes zero (sampled accuracy +0.542 [+0.536, +0.547]).
#
# Greedy, the tool run and the leak are not separated over seeds (+0.009 [-0.008, +0.027]).
# Within one seed the two runs meet the same 816 problems, so only the problems they disagree
# on count. McNemar's exact test (McNemar 1947) asks whether those split evenly. In seed 0
# the tool run is right where the leak is wrong on 15 problems, the reverse on 1 (p =
# 0.00052). In seed 2 it is 3 against 0 (p = 0.25). Each of these tests knows the noise of
# the problems for one pair of trained policies. It does not know that another seed trains
# other policies. That is why the book's "beats" is paired over seeds.
# The no-tool runs start at 0.002 and end at 0.001. Their reward almost never comes, so their
# groups' rewards are all equal (`zero_std_groups`, below), and GRPO has nothing to learn
# from. They check that the task needs the tool; they do not measure what the tool adds.
#
# The training accuracy per step (sampled episodes; the mean of 3 seeds, the band their
# range):

# %%
figure, axis = plt.subplots(figsize=(8, 3.2))
colors = {"tool": "tab:green", "no_tool": "tab:gray", "leak": "tab:red"}
for variant in VARIANTS:
    curves = np.array([r["steps"]["reward/accuracy"] for r in runs if r["variant"] == variant], dtype=float)
    steps = np.arange(1, curves.shape[1] + 1)
    axis.plot(steps, curves.mean(0), color=colors[variant], label=variant)
    axis.fill_between(steps, curves.min(0), curves.max(0), color=colors[variant], alpha=0.2)
axis.set_xlabel("step")
axis.set_ylabel("accuracy of the sampled episodes")
axis.legend()
plt.show()

# %% [markdown]
# ## 6. The failure, measured
#
# With its tokens in the loss, the calculator's answers are trained on as actions. After a
# call, `=3995` is pushed up in the episodes that scored above their group and down in the
# others. The KL to the reference, which never learned to predict an answer, counts them too.
# Three things measure what that teaches, on each run's policy after its 100 steps:
#
# - **answer log-prob**: the mean log-prob per token the policy gives the calculator's answer
#   after its call, teacher-forced on the 816 held-out calling solutions. A rising value means
#   the policy is learning to predict the tool instead of reading it.
# - **writes a result itself**: with the calculator taken away (single-turn, greedy), the
#   share of completions with a number of three or more digits between the call's `]` and
#   `</think>`, where the answer would stand. Every product of two two-digit numbers has three
#   or four digits. "of those right" is the share of those numbers that are the product; the
#   rest are hallucinated results.
# - the median over the run's steps of the **sampler gap** and the **KL**, and what the doctor
#   finds in its metrics.

# %%
print(f"{'':<11}{'answer log-prob':<17}{'writes a result':<17}{'of those right':<16}{'sampled accuracy':<18}"
      f"{'sampler gap':<13}{'kl':<9}doctor")
print(f"{'start':<11}{RESULTS['before']['tool']['answer_logp']:<17.3f}{RESULTS['before']['tool']['self_answer_rate']:<17.3f}")
for variant in VARIANTS:
    for r in (r for r in runs if r["variant"] == variant):
        gap = np.median([g for g in r["steps"]["sampler_gap/mean_abs"] if g is not None])
        kl = np.median([k for k in r["steps"]["kl"] if k is not None])
        after = r["after"]
        print(f"{variant + ' ' + str(r['seed']):<11}{after['answer_logp']:<17.3f}{after['self_answer_rate']:<17.3f}"
              f"{after['self_answers_right']:<16.3f}{after['sample_accuracy']:<18.3f}{gap:<13.3g}{kl:<9.4f}"
              f"{', '.join(r['findings']) or '-'}")

# %% [markdown]
# The leak learned to predict the calculator: its answer log-prob per token is -3.163 to
# -2.802, against -8.889 at the start. With the calculator taken away it writes a result of
# its own after its call in nearly every completion, almost never the product. The tool runs
# almost never do (at most 0.001). What they write there instead shows in the first held-out
# problems, below: closing brackets, sometimes a stray digit. A tool policy never learned what
# follows its call, because the calculator always wrote it. The leak learned to write it
# itself. The leak's KL runs away (`kl_runaway`). Its
# sampled accuracy, 0.865-0.870, is below every tool seed's (0.915-0.919). Paired by seed, the
# tool run beats the leak there (+0.049 [+0.038, +0.061]). Greedy, the two are not separated at
# this size (+0.009 [-0.008, +0.027]): the calculator still answers the leak's calls.
#
# With the calculator taken away, greedy, seed 0 of each (the benchmark keeps the first three
# held-out problems' completions as text):

# %%
for variant in ("tool", "leak"):
    for text in after_by_seed[variant][0]["unaided_examples"]:
        print(f"{variant:<6}{text}")

# %% [markdown]
# What this chapter claims, checked against the numbers above. The first claim checks the
# no-tool runs, which learn nothing; it checks the runs, not what the tool adds.

# %%
after = {v: [r["after"] for r in runs if r["variant"] == v] for v in VARIANTS}
start = RESULTS["before"]["tool"]
median_kl = {v: [np.median(r["steps"]["kl"]) for r in runs if r["variant"] == v] for v in VARIANTS}
claims = {
    "the no-tool runs learn nothing: every seed ends within 0.01 of its start's greedy accuracy":
        all(abs(a["greedy_accuracy"] - RESULTS["before"]["no_tool"]["greedy_accuracy"]) < 0.01
            for a in after["no_tool"]),
    "paired by seed, the tool run beats its start in greedy and sampled accuracy and in sampled calls":
        all(tool_verdicts["start", key].low > 0
            for key in ("greedy_accuracy", "sample_accuracy", "sample_tool_call_rate")),
    "paired by seed, the tool run beats the leak in sampled accuracy, not separated greedy":
        tool_verdicts["leak", "sample_accuracy"].low > 0 and not tool_verdicts["leak", "greedy_accuracy"].separated,
    "every tool seed raises the sampled tool-call rate above 0.95 from the start's":
        all(a["sample_tool_call_rate"] > 0.95 > start["sample_tool_call_rate"] for a in after["tool"]),
    "every tool seed raises the sampled accuracy by more than 0.3":
        all(a["sample_accuracy"] > start["sample_accuracy"] + 0.3 for a in after["tool"]),
    "every leak seed gives the calculator's answers a higher log-prob than the start and every tool seed":
        min(a["answer_logp"] for a in after["leak"]) > max([start["answer_logp"]] + [a["answer_logp"]
                                                                                     for a in after["tool"]]),
    "every leak seed writes a result of its own after a call in more than 0.9 of its completions, "
    "every tool seed in at most 0.01":
        min(a["self_answer_rate"] for a in after["leak"]) > 0.9 and max(a["self_answer_rate"] for a in after["tool"]) <= 0.01,
    "in seed 0, McNemar's test separates the tool run from the leak greedy over the problems; over seeds they are "
    "not separated": within_seed[0]["p_value"] < 0.05 and not tool_verdicts["leak", "greedy_accuracy"].separated,
    "every leak seed ends below every tool seed in sampled accuracy":
        max(a["sample_accuracy"] for a in after["leak"]) < min(a["sample_accuracy"] for a in after["tool"]),
    "the leak's median KL is more than 10 times every tool seed's":
        min(median_kl["leak"]) > 10 * max(median_kl["tool"]),
    "the doctor names the leak (environment_tokens_trained) in every leak seed, and in no other run":
        all(("environment_tokens_trained" in r["findings"]) == (r["variant"] == "leak") for r in runs),
    "the live runs of section 4: the doctor names the leak, as the failure lab expects, and nothing in the tool run":
        found["tool"] == [] and lab.TOOL_RUNS["env_leak"].diagnosed_as_expected(set(found["env_leak"])),
}
Claims(claims)

# %% [markdown]
# ## 7. What an episode costs
#
# Each turn is one more request to the engine, with the whole context so far as its prompt.
# Our engines compute the prompt again every turn: no key-value (KV) cache is kept across
# turns. Measured on this book's CPU, the rollout of the default task as episodes, with an
# environment that answers at the digit 1, against the same task single-turn:
#
# <details><summary>How we know</summary>
#
# `benchmarks/episodes.py` measured both and wrote `benchmarks/results/episodes.json`, which
# the cell reads.
#
# </details>

# %%
cost = json.loads(home.path("benchmarks/results/episodes.json").read_text())
for name, figures in cost["figures"].items():
    extra = (f", {figures['turns_per_episode']:.2f} turns and {figures['environment_tokens_per_episode']:.2f} "
             f"environment tokens per episode" if "turns_per_episode" in figures else "")
    print(f"{name:<12} rollout {figures['phase_median_seconds']['rollout']:.3f} s per step{extra}")
ratio = cost["figures"]["episodes"]["phase_median_seconds"]["rollout"] / \
    cost["figures"]["single-turn"]["phase_median_seconds"]["rollout"]
print(f"an episode's rollout costs x{ratio:.2f} a single-turn completion's")

# %% [markdown]
# ## What you learned
#
# - With a tool, a completion becomes an episode: the policy's turns, with the environment's
#   answers between them.
# - `completion_mask` marks the policy's tokens and `env_mask` the environment's; only the
#   policy's enter the loss, the KL, the ratio and the normalisers.
# - Trained on, the environment's tokens teach the policy to predict the tool, and the sampler
#   gap shows it.
# - In 100 steps the tiny policy learned to call on almost every problem: sampled accuracy
#   from 0.376 to 0.917.
# - Each turn sends the whole context again, so an episode costs more than a single-turn
#   completion.
#
# ## Check yourself
#
# 1. In the episode drawn token by token, what is max |d loss / d logp| at the calculator's
#    tokens with the policy's mask, and with every written token?
#
#    <details><summary>Answer</summary>
#
#    0.000000 with the policy's mask: the calculator's tokens are context only. 0.006873 with
#    every written token: they are pushed like actions, by their episode's advantage.
#
#    </details>
#
# 2. The sampler gap over the policy's tokens was 6.87e-08 nats per token, over every written
#    token 1.86. Why so different?
#
#    <details><summary>Answer</summary>
#
#    The sampler never drew the calculator's tokens, so its log-prob there is 0, while the
#    policy gives them a log-prob far below 0. Counting them adds those large gaps to the
#    mean. Over the policy's own tokens, the trainer recomputes what the sampler computed.
#
#    </details>
#
# 3. Why do the no-tool runs not show how much the tool helps?
#
#    <details><summary>Answer</summary>
#
#    They start at 0.002: the reward almost never comes, every group's rewards are equal, and
#    GRPO gets no signal. They show that the task needs the tool, not what it adds.
#
#    </details>
#
# 4. The leak ends at 0.990 greedy held-out accuracy. Why is it still a failure?
#
#    <details><summary>Answer</summary>
#
#    The calculator still answers its calls. But the leak has learned to predict the answer
#    (log-prob from -8.889 to about -3), writes results of its own where the answer would
#    stand when the calculator is taken away, and its KL runs away.
#
#    </details>
#
# 5. You move an `env_mask` from this book into a TRL `rollout_func`. What must you do to it?
#
#    <details><summary>Answer</summary>
#
#    Invert it. This book's `env_mask` is True on the environment's tokens; TRL's is 1 on the
#    model's tokens and 0 on the environment's.
#
#    </details>
#
# ## Exercises
#
# **13.1 A strict calculator.** Write a class `StrictCalculator`, an environment as
# `grpo_edu.training.episodes` defines one. It has a class attribute `stop = "]"`,
# `reset(sample)` for a new episode (the sample's prompt is `"47*85="`), and
# `step(action) -> Reply`. It answers only the problem's own product. A call `[a*b]` whose two
# factors are the prompt's (either order, spaces allowed) gets `Reply("=" + product)`. Any
# other call, or text that is not a call, gets `Reply("=?", ch13.INVALID_CALL)`: a reward of
# -0.1, the per-call validity reward the environment adds to the episode's. An episode may
# hand over `ch13.MAX_CALLS` = 2 times. Every `step` counts toward that limit, text that is
# not a call included. The third `step` gets `Reply("=!", ch13.INVALID_CALL, done=True)`,
# whatever it holds. The checker plays scripted episodes against it, in fresh instances and in
# an instance reset from another episode. Saved in a file, it trains:
# `environment = "my_env.py:StrictCalculator"` in a config.
#
# <details><summary>Hint</summary>
#
# `action` is everything the policy wrote in this turn, ending with `]`: the call is the text
# between the last `[` and that `]`. Keep the episode's state (the factors, the calls so far)
# on the instance, and set all of it in `reset`: the trainer plays each episode in a fresh
# instance, but nothing in the protocol promises that. Count a call before you judge it.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# import re
#
# from grpo_edu.exercises import ch13
# from grpo_edu.training.episodes import Reply
#
#
# class StrictCalculator:
#     stop = "]"
#
#     def reset(self, sample):
#         self.factors = sorted(int(x) for x in sample["prompt"].rstrip("=").split("*"))
#         self.calls = 0
#
#     def step(self, action):
#         self.calls += 1
#         if self.calls > ch13.MAX_CALLS:
#             return Reply("=!", ch13.INVALID_CALL, done=True)
#         call = re.search(r"\[([^\[\]]*)\]$", action)
#         parts = call.group(1).replace(" ", "").split("*") if call else []
#         if len(parts) == 2 and all(p.isdigit() for p in parts) and sorted(map(int, parts)) == self.factors:
#             return Reply(f"={self.factors[0] * self.factors[1]}")
#         return Reply("=?", ch13.INVALID_CALL)
#
#
# ch13.check_strict_calculator(StrictCalculator)
# ```
#
# </details>

# %%
import re

from grpo_edu.training.episodes import Reply
from grpo_edu.exercises import ch13

print(f"ch13.INVALID_CALL = {ch13.INVALID_CALL}, ch13.MAX_CALLS = {ch13.MAX_CALLS}")


class StrictCalculator:
    stop = "]"

    def reset(self, sample):
        self.factors = sorted(int(x) for x in sample["prompt"].rstrip("=").split("*"))
        self.calls = 0

    def step(self, action):
        self.calls += 1                                      # counted, never limited: fix me
        call = re.search(r"\[(\d+)\*(\d+)\]$", action)       # no spaces allowed: fix me
        if call and sorted(int(x) for x in call.groups()) == self.factors:
            return Reply(f"={self.factors[0] * self.factors[1]}")
        return Reply("=?", ch13.INVALID_CALL)


ch13.check_strict_calculator(StrictCalculator)

# %% [markdown]
# **13.2 Who trains on what.** Write `my_loss_masks(pieces, tokenizer, length)`. `pieces` is
# one episode as `grpo_edu.training.episodes.writers` splits it: (text, written by the
# environment) pairs, in order. It returns two masks of `length` True/False values, one per
# token position. The loss mask is True on the policy's tokens, `env_mask` on the
# environment's; the padding after the episode is False in both. `length` is
# `max_completion_length`: the rollout cuts a longer episode there. The checker rolls each
# episode out with `roll_out_episodes`, the calculator answering, and compares with its
# `completion_mask` and `env_mask`. Its episodes include two calls (two spans of the
# calculator's), a call it cannot read, an answer that ends the episode, and cuts.
#
# <details><summary>Hint</summary>
#
# Count tokens, not characters: `<think>` is one token of the policy's tokenizer. Tokenize
# each piece with `tokenizer(text, add_special_tokens=False)["input_ids"]`: all its tokens
# have the piece's writer. Then cut at `length`, and pad with False.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# import torch
#
# from grpo_edu.exercises import ch13
#
#
# def my_loss_masks(pieces, tokenizer, length):
#     loss_mask, env_mask = [], []
#     for text, by_env in pieces:
#         n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
#         loss_mask += [not by_env] * n
#         env_mask += [by_env] * n
#     padding = [False] * max(0, length - len(loss_mask))
#     return torch.tensor(loss_mask[:length] + padding), torch.tensor(env_mask[:length] + padding)
#
#
# ch13.check_loss_masks(my_loss_masks)
# ```
#
# </details>

# %%
from grpo_edu.training.episodes import writers

print(writers(sample["solution"], CALCULATOR, sample))


def my_loss_masks(pieces, tokenizer, length):
    ids = tokenizer("".join(text for text, _ in pieces), add_special_tokens=False)["input_ids"][:length]
    written = torch.zeros(length, dtype=torch.bool)
    written[:len(ids)] = True
    return written, torch.zeros(length, dtype=torch.bool)   # masks only the padding: fix me


ch13.check_loss_masks(my_loss_masks)
