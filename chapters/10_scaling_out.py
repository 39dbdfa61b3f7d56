# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 10. Scaling out
#
# > **You will learn**
# > - how N processes split a GRPO (Group Relative Policy Optimization) step without splitting a group
# > - why every rank samples from the same table of random numbers
# > - which counts each rank's loss must divide by, and what goes wrong if it uses its own
# > - that 2 processes train the policy 1 process trains, checked on a real run
# > - what FSDP2 saves per rank, and what the same config becomes on 8 GPUs
# >
# > **You need first**: chapter 6 (the training loop and its config).
# >
# > **Reading time**: about 24 minutes. **Compute**: at most 120 s on a 2-core CPU. [Glossary](../docs/glossary.md) · [Notation](../docs/notation.md)
#
# Chapter 6 trained in one process. The same command with `torchrun` in front trains in N
# processes (ranks), each with its own share of every step's work:
#
# ```bash
# grpo-edu train --config configs/cpu-tiny.toml                                            # 1 process
# torchrun --standalone --nproc-per-node 2 -m grpo_edu train --config configs/cpu-tiny.toml  # 2 processes
# ```
#
# > **Rank and world size.** Each of the N processes is a **rank**, numbered 0 to N - 1. N is
# > the **world size**. The trainer keeps the two in one small object, `World(rank, size)`:
# > the `world` that chapter 6's loop hands to every stage. One process is rank 0 of a world
# > of size 1.
#
# The promise of this chapter is that the two commands train **the same policy**, up to
# floating-point rounding. That holds for every loss type, with DDP (Distributed Data
# Parallel) or FSDP2 (PyTorch's Fully Sharded Data Parallel, second version). Three things
# make it hold, and each has a way to go wrong: which rank owns which completions, which
# random numbers each rank samples with, and what each rank's loss divides by.
#
# We take them in turn. Then we launch a real 2-process run from the notebook (gloo, on this
# CPU), and compare its weights with the 1-process run's. Last, we look at what FSDP2 saves
# per rank, and work out what the same config becomes on 8 H100s.
#
# A word on speed, before anything else: on a 2-core laptop two processes are **not** faster
# than one. Each gets one core, which one process with two threads already uses, and every
# step adds communication. The point here is equality. Speed comes when each rank has a GPU
# of its own.

# %%
import inspect
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from grpo_edu.environment import tasks
from grpo_edu.runtime import distributed
from grpo_edu.runtime import precision
from grpo_edu.training import placement, rollouts, scoring, trainer, update
from grpo_edu.training.plan import Plan, optimizer_steps_per_rollout, plan_mini_batches
from grpo_edu.algorithm.advantages import group_advantages, zero_std_groups
from grpo_edu.config import TrainConfig
from grpo_edu.runtime.distributed import World
from grpo_edu.algorithm.aggregation import LOSS_TYPES
from grpo_edu.algorithm.loss import grpo_loss
from grpo_edu.policy.models import load_policy
from grpo_edu.book import home
from grpo_edu.book.claims import Claims

home.enter()   # the book's folder: its files are read and its runs written from there

torch.set_num_threads(1)
torch.set_printoptions(precision=4, sci_mode=False)


def f4(x):
    """4 decimals with a sign; values that round to zero print as +0.0000 on every machine."""
    return f"{0.0 if abs(x) < 5e-5 else x:+.4f}"

# %% [markdown]
# ## Who owns what
#
# A GRPO step samples B prompts and G completions of each. The rank is the unit of work, and
# the group is the unit of GRPO: a completion's advantage is its reward against the mean and
# spread of its group's G rewards. So `grpo_edu.runtime.distributed.World.shard` gives every
# rank **whole prompts**: a contiguous B / N of them, with all G completions of each.

# %%
# Whole groups dealt out to ranks.
from grpo_edu.book import schematics

schematics.groups_to_ranks(groups=4, G=4, ranks=2)

# %%
print(inspect.getsource(World.shard))

# %% [markdown]
# Every rank draws the same prompt list from the shared seed (`rollouts.sample_prompts`), and
# takes its slice. Here are the 16 prompts of the first step of this chapter's config on 2
# ranks. Beside them are the rows each rank holds of the prompt-major batch of B x G rows,
# where completion j of prompt i is row i G + j:

# %%
config = TrainConfig.from_toml(home.path("configs/cpu-tiny.toml"))
B, G, N = config.rollout.prompts_per_step, config.rollout.num_generations, 2
pool = tasks.make_dataset(config.run.task, n=tasks.TRAIN_POOL, split="train", seed=0)
first_step = rollouts.sample_prompts(B, random.Random(config.run.seed), pool)
for rank in range(N):
    share = World(rank=rank, size=N).shard(B)
    print(f"rank {rank}: prompts {share.start}..{share.stop - 1}, rows {share.start * G}..{share.stop * G - 1}: "
          + " ".join(sample["prompt"] for sample in first_step[share]))
try:
    World(rank=0, size=N).shard(15)
except ValueError as error:
    print(f"B = 15 on {N} ranks: {error}")

# %% [markdown]
# A split of the B x G rows into N equal runs would be the same split whenever B divides by
# N. When only B x G divides, it would cut a group in two (B = 3, G = 4 on 2 ranks: prompt 1's
# completions on both). Such a config is refused rather than split: exercise 10.1.
#
# Ownership is half of it; the other half is sampling. If each rank drew its own random
# numbers, 2 ranks would sample other completions than 1 process, and the runs would part at
# the first step. So the fused sampler takes a table of uniforms, one row per completion.
# Every rank draws the table for the whole batch, B x G rows, and samples with its own rows
# (the engine's `seeded`, which `rollouts.roll_out` calls). The rollout does not depend on N,
# and every rank's random generator stays in step with the 1-process one.
#
# After sampling, each rank scores its own completions. The rewards are then gathered, so that
# every rank holds all B x G of them. The advantages (batch-level std included), the
# mini-batch plan and the zero-std filter are computed from the whole batch, the same on every
# rank (`scoring.score`, `plan.Plan`).

# %% [markdown]
# ## The normaliser pitfall, with numbers
#
# Each rank computes a loss on its share and backpropagates it. DDP (and FSDP2) then
# **average** the gradients over the ranks. With the ranks' shares of a batch, which loss must
# each rank compute, so that the average is the 1-process gradient?
#
# The obvious answer is to call `grpo_loss` on the rank's share, as one process calls it on
# the whole batch. Then each rank divides by its **own** counts. `bnpo` (batch-normalized
# policy optimization) and `dapo` divide by the rank's own tokens, `grpo` and `dr_grpo` by its
# own completions. The average of those per-rank means is not the mean over the batch whenever
# the ranks' counts differ.
#
# Here is one batch where they do: 2 ranks x 2 prompts x G = 4, with rank 1's completions
# about twice as long as rank 0's. Prompt 3's rewards are all equal: it has no advantage, but
# its tokens count.

# %%
L = 12                                          # max_completion_length
lengths = torch.tensor([[3, 5, 2, 4], [6, 2, 3, 5], [12, 9, 11, 7], [10, 12, 8, 12]])   # (B, G)
rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]],
                       dtype=torch.float64)
B, G = lengths.shape
generator = torch.Generator().manual_seed(0)
mask = torch.arange(L) < lengths[..., None]                                  # (B, G, S)
old_logp = -3 * torch.rand(*mask.shape, generator=generator, dtype=torch.float64) * mask
new_logp = (old_logp + 0.2 * torch.randn(*mask.shape, generator=generator, dtype=torch.float64)).clamp(max=0) * mask
advantages = group_advantages(rewards)


def ddp_loss(shares, loss_type, counts):
    """The loss whose gradient DDP steps with: each rank's loss on its prompts, averaged over
    ranks. counts="own": each rank divides by its own counts (grpo_loss's defaults);
    "global": by the whole batch's, and each rank's loss is multiplied by N. Returns
    (loss, gradient with respect to the log-probs)."""
    logp = new_logp.clone().requires_grad_()
    everything = [p for prompts in shares for p in prompts]
    whole = {"num_items": int(mask[everything].sum()), "num_completions": len(everything) * G}
    N = len(shares)
    parts = [grpo_loss(logp[prompts], old_logp[prompts], advantages[prompts], mask[prompts], loss_type=loss_type,
                       max_completion_length=L, **({} if counts == "own" else whole)).loss
             for prompts in shares]
    loss = sum(part if counts == "own" else N * part for part in parts) / N    # DDP's average
    loss.backward()
    return float(loss.detach()), logp.grad


def compare(one_process, two_ranks):
    """The 1-process loss against DDP's with each rank's own counts and with the global ones."""
    print(f"{'loss_type':<9} {'1 process':>10} {'own counts':>11} {'global':>9}   "
          f"max |gradient - 1-process gradient|: own counts, global")
    for loss_type in LOSS_TYPES:
        one, one_grad = ddp_loss([one_process], loss_type, "global")
        own, own_grad = ddp_loss(two_ranks, loss_type, "own")
        glob, glob_grad = ddp_loss(two_ranks, loss_type, "global")
        print(f"{loss_type:<9} {one:>+10.4f} {own:>+11.4f} {glob:>+9.4f}   "
              f"{(own_grad - one_grad).abs().max():.4f}, {(glob_grad - one_grad).abs().max():.4f}")
    return ddp_loss(two_ranks, "bnpo", "own")[0] / ddp_loss([one_process], "bnpo", "global")[0]


shares = [[0, 1], [2, 3]]
tokens = [int(mask[prompts].sum()) for prompts in shares]
for rank, prompts in enumerate(shares):
    print(f"rank {rank}: prompts {prompts}, {len(prompts) * G} completions, {tokens[rank]} tokens")
bnpo_factor = compare([0, 1, 2, 3], shares)
print(f"bnpo with own counts: a token of rank 0 weighs 1 / (2 x {tokens[0]}), one of rank 1 1 / (2 x {tokens[1]}): "
      f"{tokens[1] / tokens[0]:.1f} times less; one process weighs every token 1 / {sum(tokens)}; "
      f"the loss comes out {bnpo_factor:.1f} times the 1-process loss")

# %% [markdown]
# `grpo` and `dr_grpo` come out right by luck. The ranks hold the same number of completions,
# and an average of equal-sized means is the mean. `bnpo` and `dapo` do not. Rank 0's 30
# tokens and rank 1's 81 each weigh half, so a token of rank 0 counts 2.7 times as much as a
# token of rank 1. One process weighs all 111 alike. The loss comes out 2.6 times too large,
# and the gradient, the direction the policy moves, is off too.
#
# The luck runs out as soon as ranks hold different numbers of completions. Take the zero-std
# filter (`filter_zero_std_groups`, chapter 4): it drops prompt 3, whose rewards are all
# equal. Now rank 0 trains on 8 completions and rank 1 on 4, and every loss type's per-rank
# mean is wrong. Mini-batches that split unevenly over the ranks do the same:

# %%
kept = [p for p in range(4) if not zero_std_groups(rewards)[p]]
uneven = [[p for p in prompts if p in kept] for prompts in shares]
for rank, prompts in enumerate(uneven):
    print(f"rank {rank}: prompts {prompts}, {len(prompts) * G} completions, {int(mask[prompts].sum())} tokens")
_ = compare(kept, uneven)

# %% [markdown]
# The fix is in the "global" column, and it is the trainer's. Every rank divides by the
# **whole** mini-batch's counts. It knows them, because the completion lengths are gathered
# with the rewards (`plan.LossTotals`). And it multiplies its part by N, because DDP
# averages. `grpo_loss` takes the counts as `num_items` and `num_completions`. With them, the
# ranks' parts add up to the 1-process loss, and their averaged gradient is the 1-process
# gradient (the last column). With each rank's own counts, `grpo`'s loss even changed sign.
# These are the lines of the trainer that do it:

# %%
print(inspect.getsource(Plan.totals))
optimise_source = inspect.getsource(update.optimise)
print("\n".join(line for line in optimise_source.splitlines() if "world.size).backward()" in line))

# %% [markdown]
# ## A real 2-process run
#
# Now the run itself: the chapter's config (configs/cpu-tiny.toml) for 5 steps, 1 thread per
# process, evaluated on 32 held-out problems. It runs three times: one process, two processes
# with DDP, and two processes with FSDP2. Each is launched as a reader would launch it: with
# `grpo-edu train` (`python -m grpo_edu train`), or with `torchrun`
# (`python -m torch.distributed.run`) in front of it. On the CPU the ranks talk through gloo.

# %%
RUNS = Path(tempfile.mkdtemp(prefix="grpo-edu-chapter-10-"))   # print(RUNS) to look inside
SETTINGS = ["steps=5", "eval_size=32", "threads=1", "progress=false", "checkpoint_every=0"]


def grpo_edu_train(name, processes, *settings):
    """Launch `grpo-edu train` with `processes` ranks; returns the run directory."""
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"] if processes > 1 else []
    overrides = [f"--set={s}" for s in [*SETTINGS, *settings, f"output_dir={RUNS / name}"]]
    shown = (f"torchrun --standalone --nproc-per-node {processes} -m grpo_edu" if processes > 1 else "grpo-edu")
    print(f"$ {shown} train " + " ".join(o.replace("--set=", "--set ") for o in overrides[:-1]))
    environment = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run([sys.executable, *launcher, "-m", "grpo_edu", "train", *overrides],
                          env=dict(environment, OMP_NUM_THREADS="1"), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
    summary = json.loads((RUNS / name / "summary.json").read_text())
    print(f"  -> exit code 0; summary.json: world_size {summary['world_size']}, "
          f"parallelism {summary['parallelism']!r}, {summary['steps']} steps")
    return RUNS / name


runs = {"1 process": grpo_edu_train("one", 1),
        "2 ranks, ddp": grpo_edu_train("ddp", 2, "parallelism=ddp"),
        "2 ranks, fsdp2": grpo_edu_train("fsdp2", 2, "parallelism=fsdp2")}

# %% [markdown]
# Every rank runs the whole trainer; rank 0 alone writes the run directory. Here is what the
# three runs logged, step by step. Then come the final weights, which every run writes whole
# to `checkpoints/<latest>/policy.safetensors` (FSDP2's shards are gathered first):

# %% tags=["platform-numerics"]
histories = {name: [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
             for name, path in runs.items()}
summaries = {name: json.loads((path / "summary.json").read_text()) for name, path in runs.items()}
print(f"{'step':>4}  " + "  ".join(f"{name + ': reward, loss':>30}" for name in runs))
for step in range(5):
    print(f"{step + 1:>4}  " + "  ".join(f"{h[step]['reward/mean']:>22.4f}{f4(h[step]['loss']):>8}"
                                        for h in histories.values()))
for name, summary in summaries.items():
    print(f"{name:<15} held-out greedy accuracy {summary['start_accuracy']:.4f} -> {summary['final_accuracy']:.4f}")


def final_weights(run):
    latest = (run / "checkpoints" / "latest").read_text().strip()
    return load_file(run / "checkpoints" / latest / "policy.safetensors")


one_process = final_weights(runs["1 process"])
differences = {}
for name in ("2 ranks, ddp", "2 ranks, fsdp2"):
    weights = final_weights(runs[name])
    differences[name] = max(float((weights[k] - one_process[k]).abs().max()) for k in one_process)
    print(f"{name}: max |weight - 1-process weight| = {differences[name]:.1e} over "
          f"{sum(v.numel() for v in one_process.values()):,} weights")

# %% [markdown]
# Two ranks train the policy one process trains. The rewards are the same at every step,
# because the same completions were sampled. The losses are the same, and so is the held-out
# accuracy. The final weights agree to well within 1e-5: at most 6.4e-07 apart. What remains
# is the rounding of float32 sums taken in another order. The gradient of 128 completions is
# one sum in one process, and two sums of 64 plus an all-reduce in two.
#
# This is one config. The digits above depend on the machine's floating-point kernels, so
# the next cell checks what the prose claims, on any machine:
#
# <details><summary>How we know</summary>
#
# `tests/test_distributed.py` makes the same comparison for every loss type, with several
# mini-batches and passes per rollout and with the zero-std filter, under DDP and FSDP2.
#
# </details>

# %%
starting_policy, _ = load_policy()
moved = max(float((one_process[name] - p.detach()).abs().max()) for name, p in starting_policy.named_parameters())
claims = {
    "both 2-rank runs ran on 2 processes, with ddp and fsdp2":
        [summaries[n]["world_size"] for n in runs] == [1, 2, 2]
        and [summaries[n]["parallelism"] for n in runs] == ["none", "ddp", "fsdp2"],
    "their final weights are within 1e-5 of the 1-process weights": max(differences.values()) < 1e-5,
    "training moved the weights more than 100 times as far: the equality is not two untouched copies":
        moved > 100 * max(differences.values()),
    "the mean reward and the loss of every step are the 1-process ones, to 1e-6":
        all(abs(h[s][key] - histories["1 process"][s][key]) < 1e-6
            for h in histories.values() for s in range(5) for key in ("reward/mean", "loss")),
    "the same held-out accuracy at the start and the end":
        len({(s["start_accuracy"], s["final_accuracy"]) for s in summaries.values()}) == 1,
}
Claims(claims)

# %% [markdown]
# ## What FSDP2 saves per rank
#
# DDP keeps a whole replica on every rank: the float32 parameters, their gradients and
# AdamW's two moments, 4 + 4 + 8 = 16 bytes per parameter. FSDP2 (torch's `fully_shard`)
# splits each of them into N shards, one per rank. It gathers the parameters for each forward
# and backward. `summary.json` records what each rank held:

# %%
memory = {name: summaries[name]["memory_bytes_per_rank"] for name in ("2 ranks, ddp", "2 ranks, fsdp2")}
parameters = sum(v.numel() for v in one_process.values())
print(f"policy: {parameters:,} parameters = {4 * parameters:,} bytes in float32")
print(f"{'':<16}{'rank':>5}{'parameters':>12}{'gradients':>12}{'AdamW':>12}{'total':>12}  bytes")
for name, ranks in memory.items():
    for rank, held in enumerate(ranks):
        print(f"{name:<16}{rank:>5}{held['parameters']:>12,}{held['gradients']:>12,}{held['optimizer']:>12,}"
              f"{sum(held.values()):>12,}")
ddp_total, fsdp2_total = (max(sum(r.values()) for r in ranks) for ranks in memory.values())
print(f"largest rank, fsdp2 / ddp: {fsdp2_total / ddp_total:.4f}")

# %% [markdown]
# Each FSDP2 rank holds half of each. The policy's tied embedding is one tensor, so it is
# counted once.
#
# What the table does not show is one whole copy that every rank keeps under FSDP2 besides:
# the sampler's weights, 4 bytes per parameter. This copy (`placement.Models.full_policy`) is
# synced after every update, so that sampling and evaluation run on it without gathering
# shards. (With `engine = "vllm"` nothing samples from it, and the trainer gathers it only
# while it evaluates: chapter 11.) The frozen reference model is sharded like the policy.
# Activations depend on the micro-batch, not on the sharding, and are not counted. So on N
# ranks FSDP2 holds about 4 + (16 + 4) / N bytes per parameter, and DDP 16 + 4 = 20.
#
# ## The same config on 8 H100s
#
# On a GPU node nothing in the algorithm changes. Set `device = "cuda"`, and three things
# change with it. The trainer derives the first two from the device, and refuses to start
# without the third:
#
# - **the backend**: `device = "cuda"` (or `"auto"` on a machine with GPUs) gives each rank
#   the GPU `cuda:LOCAL_RANK`, and the process group **nccl** instead of gloo: the NVIDIA
#   Collective Communications Library (NCCL);
# - **the precision**: `precision = "auto"` becomes **bf16** autocast on CUDA for the forward
#   passes, while the master weights and AdamW's moments stay float32;
# - **the engine**: the fused sampler and forward are the CPU tier's float32 fast path. On
#   GPUs, use `engine = "vllm"` (vLLM samples, transformers' forward trains) or `"hf"`
#   (transformers' forward and `generate`).
#
# Here is that checked against the trainer itself, without a GPU:

# %%
print("\n".join(line.strip() for line in inspect.getsource(distributed.init_world).splitlines()
                if "init_process_group" in line or '"nccl"' in line))
gpu = torch.device("cuda", 0)
print(f"precision 'auto' on {gpu}: {precision.compute_dtype(config.run.precision, gpu)}; on the CPU: "
      f"{precision.compute_dtype(config.run.precision, torch.device('cpu'))}")
try:
    placement.check_engine_settings(config, gpu)
except ValueError as error:
    print(f"engine = 'fused' on {gpu}: {error}")

# %% [markdown]
# And the arithmetic of a step. A step's size is set by the config, not by N: B prompts,
# B x G completions, at most B x G x L tokens. N only divides them. Each rank samples, scores
# and trains its B / N prompts. Each optimizer step trains one mini-batch of
# B / num_mini_batches prompts, whose parts lie on the ranks that own its prompts. Below are
# five cases:
#
# - this chapter's config on 2 and on 8 ranks;
# - chapter 1's R1 recipe (configs/r1-recipe-tiny.toml) on 8;
# - the GPU tier's two configs: configs/gpu-1x.toml for one GPU, configs/h100-8x.toml for 8
#   H100s.

# %%
def step_arithmetic(config, world_size):
    """What one training step of `config` is, on `world_size` ranks."""
    B, G, L = config.rollout.prompts_per_step, config.rollout.num_generations, config.rollout.max_completion_length
    rank_shares = [World(rank=r, size=world_size).shard(B) for r in range(world_size)]
    mini_batches = plan_mini_batches(config, torch.zeros(B, G))

    def ranks_holding(prompts):
        return {r for r, share in enumerate(rank_shares) for p in prompts.tolist() if share.start <= p < share.stop}
    return {
        "prompts per rank (B / N)": B // world_size,
        "completions per rank (B G / N)": B // world_size * G,
        "completions per step (B G)": B * G,
        "tokens per step, at most (B G L)": B * G * L,
        "optimizer steps per rollout": optimizer_steps_per_rollout(config),
        "prompts per mini-batch": len(mini_batches[0]),
        "ranks holding a mini-batch": max(len(ranks_holding(prompts)) for prompts in mini_batches),
    }


runs_on = [("cpu-tiny", 2), ("cpu-tiny", 8), ("r1-recipe-tiny", 8), ("gpu-1x", 1), ("h100-8x", 8)]
configs = {name: TrainConfig.from_toml(home.path(f"configs/{name}.toml")) for name, _ in runs_on}
tables = {f"{name} on {n}": step_arithmetic(configs[name], n) for name, n in runs_on}
print(f"{'':<32}" + "".join(f"{name:>21}" for name in tables))
for key in next(iter(tables.values())):
    print(f"{key:<32}" + "".join(f"{table[key]:>21,}" for table in tables.values()))
h100 = configs["h100-8x"]
print(f"\nconfigs/h100-8x.toml: device {h100.run.device!r}, precision {h100.run.precision!r}, "
      f"engine {h100.run.engine!r}, parallelism {h100.run.parallelism!r}, model {h100.run.model!r}")

# %% [markdown]
# Read down a column. The chapter's config on 8 ranks gives each GPU 2 prompts, 16
# completions: far too little work for an H100. The GPU tier's configs keep the policy, the
# task and the loss, and raise B instead. configs/h100-8x.toml samples 512 prompts a step, 64
# per GPU. It sets the three device keys of the list above (`device = "cuda"`,
# `precision = "bf16"`, `engine = "vllm"`) and `parallelism = "fsdp2"`.
#
# The last row explains how the trainer builds its mini-batches. It deals a rollout's groups
# out to them in turn (`plan_mini_batches`: mini-batch k holds groups k, k + M, k + 2M, ...).
# It does not cut the batch into runs of prompts. A rank's share is a run, so a run-shaped
# mini-batch would lie on few ranks. In the R1 recipe, 16 mini-batches of 32 prompts on 8
# ranks of 64 would lie on one rank each. The other seven would run a zero-weight
# micro-batch, only to keep the collectives in step. Dealt, every optimizer step's
# mini-batch has a part on every rank, and all ranks compute in every step. The update is the
# same either way: which groups share a mini-batch does not change what a group contributes.
#
# Memory is the other half of the arithmetic. For a policy of P parameters in float32 with
# AdamW, DDP holds 16 P bytes per rank, and FSDP2 16 P / N. In this trainer, FSDP2 adds the
# sampler's whole copy and the reference's shard, as above. For policies of 1.5 and 7 billion
# parameters on 8 GPUs of 80 GB (an H100's memory), per rank, in GB:

# %%
N_GPUS, GB = 8, 1e9
print(f"{'policy':<28}{'ddp':>8}{'fsdp2':>8}   (with the reference, and fsdp2's whole copy for the sampler)")
for P in (1.5e9, 7e9):
    print(f"{P / 1e9:.1f} billion parameters{'':<4}{16 * P / GB:>8.1f}{16 * P / N_GPUS / GB:>8.1f}"
          f"   ({20 * P / GB:.1f}, {(4 + 20 / N_GPUS) * P / GB:.1f})")
    print(f"  DDP's gradient all-reduce per optimizer step: {4 * P / GB:.1f} GB of float32 gradients, "
          f"each rank sending about 2 (N - 1) / N of it: {2 * (N_GPUS - 1) / N_GPUS * 4 * P / GB:.1f} GB")

# %% [markdown]
# At 1.5 billion parameters both fit an 80 GB GPU, with room for activations. At 7 billion,
# DDP's 112 GB per rank does not fit, and FSDP2's 14 GB do. With the reference's shard and the
# sampler's whole copy FSDP2 needs 45.5 GB, and the copy is then the largest item. With vLLM,
# which samples from a copy of its own, the trainer keeps that copy only while evaluating.
#
# That is the case for FSDP2: memory per rank, paid for in traffic. DDP all-reduces the
# gradients once per optimizer step. FSDP2 all-gathers the parameters for every forward. Where
# it shards layer by layer, it gathers them again for the backward (configs/h100-8x.toml's
# path: each decoder layer's, before its backward). And it reduce-scatters the gradients once
# per optimizer step, so that each rank keeps only its shard of them.
#
# <details><summary>How we know</summary>
#
# `benchmarks/distributed.py` counts the bytes of each collective; [docs/gpu.md](../docs/gpu.md#n-processes-torchrun) has its table.
#
# </details>
#
# ## What you learned
#
# - Each rank owns whole prompts, all G completions of each, so every group's advantages are
#   computed over the whole group.
# - Every rank draws the same random table for the whole batch, so the rollout does not depend
#   on N.
# - Each rank's loss must divide by the whole mini-batch's counts and be multiplied by N.
#   Dividing by its own counts gives the wrong loss and gradient whenever the ranks' counts
#   differ.
# - 2 processes, with DDP or FSDP2, train the 1-process policy up to float32 rounding.
# - FSDP2 trades memory per rank for traffic: about 4 + 20 / N bytes per parameter in this
#   trainer, against DDP's 20.
#
# ## Check yourself
#
# Where an answer is a number, check yours before you open it:
# `quiz.check(10, 2, times=...)` (`from grpo_edu.exercises import quiz`;
# `quiz.ask(10)` lists what each question takes).
#
# 1. A config sets B = 15 prompts and runs on 2 ranks. What does the trainer do, and why?
#
#    <details><summary>Answer</summary>
#
#    It refuses to start, with a `ValueError`: 15 prompts cannot be dealt out as whole
#    prompts over 2 ranks, and splitting one would cut a group in two.
#
#    </details>
#
# 2. Rank 0 holds 30 completion tokens and rank 1 holds 81. With `bnpo` and each rank's own
#    counts, how much more does a token of rank 0 weigh than a token of rank 1?
#
#    <details><summary>Answer</summary>
#
#    81 / 30 = 2.7 times: each rank's mean weighs half, and rank 0's half is spread over
#    fewer tokens. The loss comes out 2.6 times the 1-process loss.
#
#    </details>
#
# 3. Why do `grpo` and `dr_grpo` come out right with each rank's own counts in the first
#    batch, but not after the zero-std filter?
#
#    <details><summary>Answer</summary>
#
#    They divide by completions. In the first batch both ranks hold 8, and an average of
#    equal-sized means is the mean. After the filter, rank 0 holds 8 and rank 1 holds 4.
#
#    </details>
#
# 4. With the whole mini-batch's counts, why must each rank still multiply its loss by N?
#
#    <details><summary>Answer</summary>
#
#    With the global counts, the ranks' losses add up to the 1-process loss. DDP averages the
#    gradients over the N ranks; multiplying each part by N turns that average into the sum.
#
#    </details>
#
# 5. A policy of 7 billion parameters, trained with AdamW in float32 on 8 GPUs of 80 GB: does
#    DDP fit? Does FSDP2?
#
#    <details><summary>Answer</summary>
#
#    DDP needs 16 bytes per parameter on every rank, 112 GB: it does not fit. FSDP2 needs
#    14 GB per rank, or 45.5 GB with the reference's shard and the sampler's whole copy: it
#    fits.
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Each checker in `grpo_edu.exercises.ch10` runs your answer on several cases and names each
# case that fails and what is wrong there, never the right answer. Each exercise has a hint
# and a worked solution, folded: open them when you want them.
#
# **10.1 Which rows a rank owns.** Write `my_rank_rows(B, G, world_size, rank)`: the rows of
# the prompt-major (B x G)-row batch that rank `rank` owns (completion j of prompt i is row
# i G + j). The first attempt below splits the rows evenly; run the checker and read which
# cases it gets wrong, and why a group must not be split.
#
# <details><summary>Hint</summary>
#
# Deal out *prompts*, not rows: each rank owns B / world_size consecutive prompts and all G
# rows of each. A B that does not divide cannot be dealt without splitting a group, so
# refuse it.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# def my_rank_rows(B, G, world_size, rank):
#     if B % world_size:
#         raise ValueError(f"B = {B} prompts do not divide over {world_size} ranks")
#     prompts = B // world_size
#     return list(range(rank * prompts * G, (rank + 1) * prompts * G))
#
#
# ch10.check_rank_rows(my_rank_rows)
# ```
#
# </details>

# %%
from grpo_edu.exercises import ch10


def my_rank_rows(B, G, world_size, rank):
    rows = B * G // world_size                     # an even split of the rows: fix me
    return list(range(rank * rows, (rank + 1) * rows))


ch10.check_rank_rows(my_rank_rows)

# %% [markdown]
# **10.2 A rank's loss.** Write `my_rank_loss(logp, old_logp, advantages, completion_mask,
# token_counts, completion_counts, loss_type, max_completion_length)`. It returns the loss
# one rank backpropagates under DDP. It is given the rank's share of a mini-batch ((b, G, S)
# tensors) and every rank's token and completion counts (gathered: one number per rank).
# The checker averages the ranks' gradients, as DDP does, and compares with the 1-process
# gradient for every loss type, on ranks with equal and with unequal shares. The first
# attempt is the per-rank mean of this chapter.
#
# <details><summary>Hint</summary>
#
# Two things: each rank must divide by the *whole* mini-batch's counts (`grpo_loss` takes
# them as `num_items` and `num_completions`), so that the ranks' losses add up to the
# 1-process loss; and DDP *averages* the ranks' gradients, so each rank's part must be
# multiplied by the number of ranks to make that average a sum.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# from grpo_edu.algorithm.loss import grpo_loss
#
#
# def my_rank_loss(logp, old_logp, advantages, completion_mask, token_counts, completion_counts, loss_type,
#                  max_completion_length):
#     part = grpo_loss(logp, old_logp, advantages, completion_mask, loss_type=loss_type,
#                      max_completion_length=max_completion_length,
#                      num_items=sum(token_counts), num_completions=sum(completion_counts)).loss
#     return part * len(token_counts)          # DDP divides the summed gradients by the world size
#
#
# ch10.check_rank_loss(my_rank_loss)
# ```
#
# </details>

# %%
def my_rank_loss(logp, old_logp, advantages, completion_mask, token_counts, completion_counts, loss_type,
                 max_completion_length):
    return grpo_loss(logp, old_logp, advantages, completion_mask, loss_type=loss_type,
                     max_completion_length=max_completion_length).loss    # this rank's own counts: fix me


ch10.check_rank_loss(my_rank_loss)

# %% [markdown]
# **10.3 A step on N GPUs.** Write `my_step_numbers(quiz)`. Its argument is a config like
# `ch10.SCALE_QUIZ`: a dict of world_size, prompts_per_step, num_generations,
# max_completion_length, num_iterations, num_mini_batches and parameters. It returns a dict
# with one number for each key of `ch10.QUANTITIES`, which says what each counts. The checker asks
# about `SCALE_QUIZ` and about two quizzes it draws anew at every call, so the numbers must
# be computed from the quiz. Bonus: with `SCALE_QUIZ`'s 4 mini-batches dealt out, how many of
# each rank's prompts does each optimizer step train?
#
# <details><summary>Hint</summary>
#
# The chapter computed every one of these for its own configs: the step arithmetic table
# (prompts and completions per rank and per step, tokens at the length limit, optimizer
# steps per rollout) and the memory cell (AdamW in float32 holds 4 bytes of weights, 4 of
# gradients and 8 of moments per parameter; FSDP2 shards all of it over the ranks).
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# def my_step_numbers(quiz):
#     N, B, G = quiz["world_size"], quiz["prompts_per_step"], quiz["num_generations"]
#     return {
#         "prompts_per_rank": B // N,                                        # SCALE_QUIZ: 32
#         "completions_per_rank": B // N * G,                                # 512
#         "completions_per_step": B * G,                                     # 4,096
#         "max_tokens_per_step": B * G * quiz["max_completion_length"],      # 4,194,304
#         "optimizer_steps_per_rollout": quiz["num_iterations"] * quiz["num_mini_batches"],   # 4
#         "fsdp2_bytes_per_rank": quiz["parameters"] * (4 + 4 + 8) // N,     # 3,000,000,000: 3 GB
#     }
#
#
# ch10.check_scale_answers(my_step_numbers)
# ```
#
# Bonus: each mini-batch holds a quarter of the step's prompts, dealt so that every rank
# keeps its share, so each optimizer step trains 8 of each rank's 32 prompts.
#
# </details>

# %%
print(ch10.SCALE_QUIZ)


def my_step_numbers(quiz):
    N, B, G = quiz["world_size"], quiz["prompts_per_step"], quiz["num_generations"]
    return {"prompts_per_rank": B // N,
            "completions_per_rank": B // N}                # counts prompts: fix me, then add the other four


ch10.check_scale_answers(my_step_numbers)
