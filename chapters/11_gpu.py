# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 11. Graduating to a GPU
#
# > **You will learn**
# > - what changes from the CPU tier to one GPU and to eight, key by key
# > - how vLLM shares a GPU with the trainer (sleep mode and weight sync), which of five engines to choose, and in which order a sync talks to a server
# > - why the master weights stay float32 when the forward passes run in bf16
# > - how truncated importance sampling corrects a sampler that differs from the trainer
# > - what a GPU must hold for a 0.5B, 1.5B and 7B policy, what a step's activations add, and what LoRA (Low-Rank Adaptation) saves
# >
# > **You need first**: chapter 6 (training the tiny reasoner), chapter 10 (scaling out: processes and FSDP2).
# >
# > **Reading time**: about 36 minutes. **Compute**: at most 60 s on a 2-core CPU. [Glossary](../docs/glossary.md) · [Notation](../docs/notation.md)
#
# Everything so far ran on a laptop CPU. This chapter moves the same GRPO (Group Relative
# Policy Optimization) trainer to GPUs, and it runs on a CPU too: what a CPU can compute is
# computed here. It covers what changes and why: the configs key by key, the vLLM engine and
# its weight sync, bf16, the sampler mismatch, the memory budget with its activations, and
# LoRA. The runbook that goes with it is [chapter 14](14_gpu_runbook.ipynb), the appendix:
# setting up a GPU machine, the recipes' batch arithmetic, your own functions in a GPU run, the
# trained model, and the checks and measurements to run on a GPU.
#
# > **What has run where.** Which parts of this chapter have run on a GPU, on which machine and
# > with which engine, is kept in one place: [docs/gpu.md, "What has run where"](../docs/gpu.md#what-has-run-where).

# %%
import contextlib
import dataclasses
import inspect
import json
import sys

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from grpo_edu.environment import tasks
from grpo_edu.sampling import vllm_engine
from grpo_edu.runtime import precision
from grpo_edu.training import metrics, placement
from grpo_edu.config import TrainConfig
from grpo_edu.runtime.distributed import World
from grpo_edu.sampling.fused_llama import FusedEngine
from grpo_edu.algorithm.logprobs import completion_logprobs
from grpo_edu.algorithm.loss import grpo_loss
from grpo_edu.policy.models import STARTING_POLICY, load_policy
from grpo_edu.sampling.rollout import SamplingParams
from grpo_edu.book import home
from grpo_edu.book.claims import Claims

home.enter()   # the book's folder: its files are read and its runs written from there

torch.set_num_threads(1)
torch.set_printoptions(precision=4, sci_mode=False)
configs = {name: TrainConfig.from_toml(home.path(f"configs/{name}.toml"))
           for name in ("cpu-tiny", "gpu-1x", "h100-8x", "qwen2.5-0.5b-gsm8k-8x")}



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
keys = [key for key in TrainConfig.keys() if key in SHOWN_ALWAYS or (
    key not in BOOKKEEPING and len({repr(c.value(key)) for c in configs.values()}) > 1)]
widths = [2 + max(len(name), *(len(str(c.value(key))) for key in keys)) for name, c in configs.items()]
print(f"{'key':<29}" + "".join(f"{name:>{width}}" for name, width in zip(configs, widths)))
for key in keys:
    print(f"{key:<29}" + "".join(f"{str(c.value(key)):>{width}}" for c, width in zip(configs.values(), widths)))
different = [k for k in keys if configs["cpu-tiny"].value(k) != configs["gpu-1x"].value(k)]
print(f"\ncpu-tiny -> gpu-1x changes: {', '.join(different)}")
print(f"gpu-1x -> h100-8x changes: "
      f"{', '.join(k for k in keys if configs['gpu-1x'].value(k) != configs['h100-8x'].value(k))}")

# %% [markdown]
# From the CPU tier to one GPU, the policy, the task, the loss and G stay. The device, the
# engine and the precision change, and `tis_cap` turns on (the mismatch below). B goes from 16
# prompts to 64, cut into 4 mini-batches, so that each optimizer step still sees what a
# CPU-tier step sees. From one GPU to eight, B goes to 512, 64 per GPU, in one mini-batch, and
# the sharding becomes FSDP2's (Fully Sharded Data Parallel, chapter 10). The `vllm_*` keys are
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
# split over GPUs: chapter 10's promise, kept on the GPU path up to vLLM's kernels (which are
# not bitwise the same for every batch shape).
#
# ## Which engine
#
# Five engines can sample the rollouts (config key `engine`, and `vllm_mode` for vLLM). They
# differ in where the sampler's weights live, and so in what must be synchronised.
#
# | engine | the sampler's weights | the weight sync | choose it when |
# |---|---|---|---|
# | `fused` | the policy module itself | none | a Llama-family model on a CPU |
# | `hf` | the policy module itself | none | another model, or a GPU without vLLM |
# | `vllm`, colocate | a bf16 copy in each training process, on its GPU | every parameter before each rollout; the engine sleeps during the update | one GPU, or N GPUs that each train and sample |
# | `vllm`, server | a separate vLLM server on GPUs of its own | streamed to the server before each rollout | GPUs to spare for sampling |
# | `sglang` | a separate SGLang server, started by grpo-edu or already running | safetensors from disk, or tensors to a server on the same machine; the cache flushed after | you run SGLang already, or want its server beside the trainer |
#
# The two servers cost a second process and a hop over the network per rollout. They buy a
# sampler that lives on its own GPUs, in an environment of its own: SGLang 0.5.23 pins
# torch 2.14.1, and vLLM 0.31.0 pins torch 2.13.0. A colocated engine shares the trainer's GPU
# and takes turns with it. The fused and `hf` engines need no copy at all: they sample with the
# policy module itself. Of the two, only `hf` runs on a GPU. The fused engine is the CPU's
# float32 fast path, and the trainer refuses it on any other device.
#
# <details><summary>How we know</summary>
#
# Each engine is `grpo_edu/sampling/` (`fused_llama.py`, `rollout.py`, `vllm_engine.py`,
# `sglang_engine.py`), and `tests/test_engines.py` runs the same contract on each: seeds,
# log-probs against the trainer's, weights reaching the sampler, episodes. SGLang's routes,
# fields and pins are read from sglang 0.5.23's released source (`tests/freeze_sglang_api.py`),
# and where its server stopped on this CPU is in [docs/gpu.md](../docs/gpu.md), "SGLang".
#
# </details>
#
# ## The sync sequence of the two servers
#
# A server keeps state between the trainer's calls. So the order of the calls matters, not only
# their fields. The colocated engine's order is the one printed above. The two servers' are
# these, once per rollout, top to bottom.
#
# vLLM as a server (`vllm_mode = "server"`), through the client of Transformer Reinforcement
# Learning (TRL, Hugging Face's library):
#
# | call | when | what it carries |
# |---|---|---|
# | `/start_weight_update` | rank 0, before the weights | nothing: it opens a weight-update session |
# | `/update_weights` | rank 0, beside the stream | each tensor's name, dtype and shape; the tensors themselves go over NCCL |
# | `/finish_weight_update` | rank 0, after the stream | nothing: it closes the session |
# | `/reset_prefix_cache` | rank 0 | nothing: prefixes cached with the old weights are dropped |
# | `/v1/completions` | every rank, a request per prompt | token ids, the prompt's seed, the stop ids |
#
# SGLang (`engine = "sglang"`), with `sglang_weight_sync = "tensor"` and `sglang_sleep`:
#
# | call | when | what it carries |
# |---|---|---|
# | `/resume_memory_occupation` | rank 0, before the sync | the tag `weights`: memory for the weights again |
# | `/begin_weight_update` | rank 0 | nothing: it opens a weight-update session |
# | `/update_weights_from_tensor` | rank 0, once per chunk of the weights | the tensors, serialised, and the weight version |
# | `/end_weight_update` | rank 0, after the last chunk | nothing: it closes the session |
# | `/flush_cache` | rank 0 | nothing: prefixes cached with the old weights are dropped |
# | `/resume_memory_occupation` | rank 0 | the tags `kv_cache` and `cuda_graph` |
# | `/generate` | every rank, one request a rollout | token ids, a seed per completion, the stop ids |
# | `/release_memory_occupation` | rank 0, once every rank has its answer | every tag: the update gets the GPU |
#
# Both servers refuse a weight update outside a session, a second session, and closing none.
# SGLang's disk sync (`/update_weights_from_disk`) is one call and needs no session. SGLang
# releases memory only when it is idle, and resumes only a tag it released. A broken rule
# there is worse than a refusal: its scheduler raises, and the whole server ends.
#
# Both servers also stop a completion at the model's own end-of-sequence (EOS) ids, from its
# `config.json` and `generation_config.json`. A Qwen2.5 instruct model names two. Every engine
# here stops at the same ids and sends them, so "finished" means the same thing whichever
# engine sampled.
#
# <details><summary>How we know</summary>
#
# Each rule is read from the pinned release: SGLang 0.5.23's wheel by
# `tests/freeze_sglang_api.py`, vLLM 0.31.0's installed source by
# `tests/real_vllm/test_real_vllm_protocol.py`, TRL 1.16's client by `tests/test_vllm_engine.py`.
# The stand-ins keep the same state, and tests hold each rule on them; vLLM's CPU build runs its
# sleep rules for real. The rules with their files and lines are in
# [docs/gpu.md](../docs/gpu.md) ("The sync sequence", in the vLLM and SGLang sections).
#
# </details>
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
    print(f"  precision = {setting!r:<7} on cuda: {str(precision.compute_dtype(config.run.precision, torch.device('cuda'))):<15}"
          f"on the CPU: {precision.compute_dtype(config.run.precision, torch.device('cpu'))}")

# %% [markdown]
# In bf16 the 1e-6 update disappears, and so do a thousand updates of 1e-4: a weight of 1
# stored in bf16 never moves. So the trainer keeps its master weights in float32, and AdamW's
# moments too. (The second moment holds squared gradients, which bf16's 8 bits of mantissa
# would round as coarsely.) Only the forward passes run in bf16, under autocast, which casts
# each matmul's inputs and leaves the stored weights alone. vLLM keeps its own bf16 copy for
# sampling. (The fused engine is the CPU's float32 fast path: on a GPU the trainer refuses it,
# chapter 10.)
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
Claims({
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
# weight is an approximation: chapter 12.) Truncated importance sampling itself is old. Yao et
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
Claims({
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
from grpo_edu.exercises.ch11 import QWEN_ARCHITECTURES as ARCHITECTURES   # Qwen2.5's published dimensions
from grpo_edu.exercises.ch11 import qwen_sizes

sizes = qwen_sizes()   # each shape built on the meta device: parameters, KV-cache bytes per token
for name, dims in ARCHITECTURES.items():
    head_dim = dims["hidden_size"] // dims["num_attention_heads"]
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
# with vLLM (or an SGLang server) sampling, the whole float32 copy is `lazy`. It lives on the
# meta device, without memory, and `Models.whole()` gathers it from the shards only while the
# trainer evaluates, when vLLM sleeps. (With `engine = "hf"` it is kept all the time: transformers' `generate`
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
GPU_MIB, SHARE = 81_559, configs["gpu-1x"].vllm.vllm_gpu_memory_utilization   # an H100 80GB, as nvidia-smi reports it
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
Claims({
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
# LoRA is from Hu et al. (2021, "LoRA: Low-Rank Adaptation of Large Language Models",
# [`arXiv 2106.09685`](https://arxiv.org/abs/2106.09685)). With `lora_rank = r`
# (`grpo_edu/policy/lora.py`) the trainer trains low-rank adapters instead of the weights.
# Each projection named in `lora_target_modules` computes x W^T +
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
# (the base is `config.run.model`, loaded again on resume).
#
# What a GPU measured: the Qwen-shaped steps above with LoRA, B x G x L = 8 x 8 x 256, with
# random weights and nothing downloaded. The GPU was an NVIDIA H200, with 150.1 GB of memory in
# this book's GB of 1e9 bytes. The rollouts were sampled with `engine = "hf"`, not vLLM:
#
# <details><summary>How we know</summary>
#
# `benchmarks/gpu.py --part lora` wrote these parts into `benchmarks/results/gpu.json`, each
# with the machine it ran on (`environment`) and its engine (`workload.engine`). The cell below
# reads that file; chapter 14 prints its whole report.
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
# from the merged weights instead, so its rollouts carry no such cost.

# %%
lora_7b = lora_budget["Qwen2.5-7B"]
Claims({
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
# ## What the activations take
#
# The tables above leave activations out, and call what remains "left". The GPU measured
# what a step adds beyond the trainer's state: its peak minus the state it held. Call that the
# transient memory. It is an upper bound on what any one phase added, since the file records
# one peak per part, not which phase set it. With `engine = "hf"` it includes the rollout's
# float32 logits (10.0 GB here); vLLM returns log-probs, not logits.

# %%
left_beside = {"qwen2.5-1.5b": budget["Qwen2.5-1.5B", 1]["left"], "qwen2.5-1.5b-lora": lora_budget["Qwen2.5-1.5B"]["left"],
               "qwen2.5-7b-lora": lora_budget["Qwen2.5-7B"]["left"], "qwen2.5-7b-lora-mb8": lora_budget["Qwen2.5-7B"]["left"]}
transient = {}
print(f"{'part':<22}{'micro-batch':>12}{'peak':>7}{'state':>7}{'transient':>11}{'less logits':>13}{'left':>7}  fits")
for part, left in left_beside.items():
    e = measured[part]
    transient[part] = e["peak_memory_allocated_bytes"] - e["state_bytes"]["total"]
    with_vllm = transient[part] - e["rollout_logits_bytes"]
    print(f"{part:<22}{e['workload']['micro_batch_size']:>12}{e['peak_memory_allocated_bytes'] / 1e9:>7.1f}"
          f"{e['state_bytes']['total'] / 1e9:>7.1f}{transient[part] / 1e9:>11.1f}{with_vllm / 1e9:>13.1f}"
          f"{left / 1e9:>7.1f}  {'yes' if with_vllm < left else 'no'}")

# Two micro-batch sizes of one 7B shape: a line through them, a + b x micro-batch
per_completion = (transient["qwen2.5-7b-lora"] - transient["qwen2.5-7b-lora-mb8"]) / 8
fixed = transient["qwen2.5-7b-lora-mb8"] - 8 * per_completion - measured["qwen2.5-7b-lora-mb8"]["rollout_logits_bytes"]
largest = int((lora_budget["Qwen2.5-7B"]["left"] - fixed) // per_completion)
print(f"\n7B LoRA: {per_completion / 1e9:.2f} GB per completion in a micro-batch ({8 * per_completion / 1e9:.1f} GB "
      f"from 16 to 8), {fixed / 1e9:.1f} GB besides "
      f"(logits left out); beside vLLM's share the largest micro-batch that fits: {largest}")

# %% [markdown]
# "fits" in the first tables was necessary, not sufficient. Qwen2.5-1.5B's full fine-tuning
# step took 37.8 GB beyond its state, more than the 29.0 GB left beside vLLM's share. Without
# the logits it would take 27.9 GB and fit, by 1.1 GB. Its LoRA step fits with room: 35.4 GB
# against 53.4 GB left. The 7B LoRA step at micro-batch 8 took 47.4 GB, and 37.4 GB without
# the logits: more than its 28.8 GB left. It does not fit beside vLLM at that micro-batch.
#
# Halving the micro-batch from 16 to 8 saved 32.8 GB, about 4.10 GB per completion of 542
# tokens (286 of prompt on average, 256 of completion). A line through those two points says
# a micro-batch of 5 would fit. It is a line through two measurements, not a third one.
#
# Three more levers shrink a step's memory. This book's trainer offers none of them; each
# number below is computed from the shapes.
#
# - **Gradient checkpointing** keeps only each decoder layer's input in the forward and
#   recomputes the rest during the backward. transformers calls it
#   `gradient_checkpointing_enable()`, and Transformer Reinforcement Learning (TRL, Hugging
#   Face's library) `gradient_checkpointing=True`. It costs one more
#   forward per update: about a third more update compute.
# - **A bf16 frozen base.** Under LoRA the base never trains, so it needs no float32 master
#   copy. Stored in bf16 it takes half the bytes. The adapters and their AdamW moments stay
#   float32.
# - **A 4-bit frozen base**, as QLoRA (quantized low-rank adaptation) does (Dettmers et al. 2023, "QLoRA: Efficient Finetuning
#   of Quantized LLMs"): 4-bit NormalFloat weights, with their scales quantized again, about
#   4.127 bits a parameter. Each layer's weight is turned back into bf16 when it is used.

# %%
P7, dims7 = sizes["Qwen2.5-7B"]["parameters"], ARCHITECTURES["Qwen2.5-7B"]
tokens = measured["qwen2.5-7b-lora-mb8"]["workload"]["prompt_tokens_mean"] + measured["qwen2.5-7b-lora-mb8"]["workload"]["max_completion_length"]
kept_inputs = dims7["num_hidden_layers"] * tokens * dims7["hidden_size"] * 2   # each layer's input, bf16
print(f"gradient checkpointing, 7B: each layer's input kept, {dims7['num_hidden_layers']} x {tokens:.1f} tokens x "
      f"{dims7['hidden_size']} x 2 bytes = {kept_inputs / 1e9:.3f} GB per completion, against "
      f"{per_completion / 1e9:.2f} GB measured without it ({per_completion / kept_inputs:.0f}x less)")
print(f"\nQwen2.5-7B's frozen base, {P7:,} parameters:")
base_bytes = {"float32 (this book)": 4 * P7, "bf16": 2 * P7, "4-bit NF4, scales quantized (QLoRA)": P7 * 4.127 / 8}
for name, size in base_bytes.items():
    total = size + lora_budget["Qwen2.5-7B"]["training"]
    print(f"  {name:<38}{size / 1e9:>6.1f} GB (frees {(4 * P7 - size) / 1e9:.1f}); with the adapters' "
          f"{lora_budget['Qwen2.5-7B']['training'] / 1e9:.2f} GB: {total / 1e9:.1f} GB, "
          f"{(GPU_BYTES * (1 - SHARE) - total) / 1e9:.1f} GB left beside vLLM's share")

# %% [markdown]
# Checkpointing keeps 0.109 GB a completion where the step measured 4.10 GB, and the
# recompute brings back one layer's activations at a time. So at 7B it is the lever that
# matters most. A bf16 base frees 15.2 GB, a 4-bit one 26.5 GB.
#
# Each lever has a price beyond memory. A 4-bit base is not the model vLLM samples from:
# vLLM gets W + (alpha / r) B A in bf16, and the trainer computes with the dequantized W.
# The two then differ by the quantization error, which is the sampler mismatch of the section
# above, made larger on purpose. A bf16 base moves the trainer's base the same way vLLM's
# bf16 copy already does, so the gap does not grow.

# %%
Claims({
    "measured: the full 1.5B step's and the 7B LoRA steps' transient memory is more than what 'left' gave "
    "them beside vLLM's share; the 1.5B LoRA step's is less":
        all(transient[part] > left_beside[part] for part in ("qwen2.5-1.5b", "qwen2.5-7b-lora", "qwen2.5-7b-lora-mb8"))
        and transient["qwen2.5-1.5b-lora"] < left_beside["qwen2.5-1.5b-lora"],
    "without the rollout's logits, the 1.5B full step fits beside vLLM's share and the 7B LoRA steps do not":
        transient["qwen2.5-1.5b"] - measured["qwen2.5-1.5b"]["rollout_logits_bytes"] < left_beside["qwen2.5-1.5b"]
        and all(transient[p] - measured[p]["rollout_logits_bytes"] > left_beside[p]
                for p in ("qwen2.5-7b-lora", "qwen2.5-7b-lora-mb8")),
    "the line through the two 7B micro-batches puts the largest that fits beside vLLM at 5": largest == 5,
    "gradient checkpointing keeps more than 30 times less per completion than the step measured":
        per_completion > 30 * kept_inputs,
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
# A ten times larger learning rate is the usual LoRA setting. "LoRA Without Regret" (John
# Schulman with Thinking Machines Lab, 2025) found LoRA's best learning rate to be about ten
# times full fine-tuning's. It also found that even rank-1 adapters suffice for policy-gradient
# reinforcement learning. The tiny policy is 128 wide, so rank 8 is a sixteenth of each layer.
# At 7B, rank 8 is a 448th of a 3,584-wide layer (the rank 16 measured above, a 224th).

# %%
Claims({
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
# ## What you learned
#
# - From the CPU tier to one GPU the algorithm stays; the device, the engine and the precision
#   change, and `tis_cap` turns on.
# - A colocated vLLM sleeps while the trainer updates, and gets the trainer's weights, one
#   parameter at a time, before each rollout. A server keeps state between calls: a weight
#   update runs inside a session.
# - bf16 forward passes need float32 master weights and moments: in bf16 a small update to a
#   weight of 1 is lost.
# - A sampler whose log-probs differ from pi_old's biases the gradient; truncated importance
#   sampling weighs each token by min(pi_old / pi_sampler, tis_cap).
# - Full fine-tuning holds 20 bytes a parameter, 1/N of them per GPU under FSDP2: a 7B policy
#   fits on 8 GPUs, or on one with LoRA.
# - What the tables leave for activations is necessary, not sufficient: measured, a step can
#   take more. A smaller micro-batch, gradient checkpointing or a lighter frozen base bring it
#   down.
#
# ## Check yourself
#
# Where an answer is a number, check yours before you open it:
# `quiz.check(11, 1, bf16=..., float32=...)` (`from grpo_edu.exercises import quiz`;
# `quiz.ask(11)` lists what each question takes).
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
# Each checker in `grpo_edu.exercises.ch11` runs your answer on several cases and names each
# case that fails and what is wrong there, never the right answer. Each exercise has a hint
# and a worked solution, folded: open them when you want them.
#
# **11.1 What one GPU holds.** Write `my_state_bytes(model, config, gpus)`: the bytes one GPU's
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
#     if not config.lora.lora_rank:                                 # weights, gradients, AdamW: 16 bytes
#         return (16 + (4 if config.loss.beta > 0 else 0)) * P / gpus   # and the reference's 4 if beta > 0
#     adapters = sum(config.lora.lora_rank * (m.in_features + m.out_features)   # A (r, in) and B (out, r)
#                    for name, m in model.named_modules()
#                    if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in config.lora.lora_target_modules)
#     return (4 * P + 16 * adapters) / gpus                    # the frozen base, the adapters; no reference
#
#
# ch11.check_state_bytes(my_state_bytes)
# ```
#
# The LoRA section's cell counted the adapters another way: `lora.add_adapters` on a copy of
# the model. Both give the same count.
#
# </details>

# %%
from grpo_edu.exercises import ch11


def my_state_bytes(model, config, gpus):
    P = sum(p.numel() for p in model.parameters())   # a tied embedding counts once
    return 16 * P / gpus                             # full fine-tuning's 16 bytes, whatever the config: fix me


ch11.check_state_bytes(my_state_bytes)

# %% [markdown]
# **11.2 The weights vLLM receives.** vLLM knows nothing of the adapters: before every rollout
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
# ch11.check_merged_weight(my_merged_weight)
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


ch11.check_merged_weight(my_merged_weight)
