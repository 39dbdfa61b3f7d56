# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 8. Graduating to a GPU
#
# Everything so far ran on a laptop CPU. This chapter is about what changes when the same
# trainer runs on GPUs, and it runs on a CPU too: the parts a CPU can compute are computed
# here (the configs, the rollout's calls, what bf16 rounds away, the sampler/trainer mismatch
# and its correction, the memory an H100 has for `Qwen2.5-0.5B`, `-1.5B` and `-7B`). The cells that
# need a GPU are tagged `gpu`; where there is none they are not run, and their output says so
# and on what machine the chapter was built.
#
# Five things change: **the engine** that samples (vLLM instead of the CPU's fused sampler),
# **sleep mode and weight sync** (the engine shares the GPU with the trainer and must sample
# from the trainer's newest weights), **bf16**, the **mismatch** between the sampler's
# log-probabilities and the trainer's (and its correction), and the **memory budget**. Then
# the last mile: your exercise solution, in a GPU run's config.

# %%
import contextlib
import inspect
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from grpo_edu import tasks, trainer, vllm_engine
from grpo_edu.config import TrainConfig
from grpo_edu.distributed import World
from grpo_edu.fused_llama import FusedEngine
from grpo_edu.logprobs import completion_logprobs
from grpo_edu.loss import grpo_loss
from grpo_edu.models import STARTING_POLICY, load_policy
from grpo_edu.rollout import SamplingParams

torch.set_num_threads(1)
configs = {name: TrainConfig.from_toml(f"../configs/{name}.toml")
           for name in ("cpu-tiny", "gpu-1x", "h100-8x", "qwen2.5-0.5b-gsm8k-8x")}

# %% [markdown]
# ## What changes, key by key
#
# The CPU tier's config and the GPU tier's differ in a handful of keys; the rest (the task,
# the loss, the rewards) carry over unchanged. Here they are, read from the files:

# %%
keys = ["device", "engine", "precision", "parallelism", "vllm_mode", "vllm_gpu_memory_utilization",
        "vllm_sleep_mode", "tis_cap", "prompts_per_step", "num_mini_batches", "model", "task", "chat_template",
        "max_completion_length", "learning_rate"]
print(f"{'key':<29}" + "".join(f"{name:>28}" for name in configs))
for key in keys:
    print(f"{key:<29}" + "".join(f"{str(getattr(c, key)):>28}" for c in configs.values()))
different = [k for k in keys if getattr(configs["cpu-tiny"], k) != getattr(configs["gpu-1x"], k)]
print(f"\ncpu-tiny -> gpu-1x changes: {', '.join(different)}")

# %% [markdown]
# ## The engine, and why it sleeps
#
# On the CPU the fused engine samples with the policy module itself: there is one copy of the
# weights, and nothing to synchronise. vLLM is a separate inference engine with its own copy
# of the weights (in bf16), its own kernels and a KV cache that takes most of the memory it is
# given. Colocated, every training process holds one on its GPU, and the two take turns: vLLM
# sleeps while the trainer updates (level 2 releases its weights and KV cache), and before
# each rollout the trainer's new weights are loaded into it. This is the whole weight sync:

# %%
print(inspect.getsource(vllm_engine.VLLMEngine.sync_weights))
print(inspect.getsource(vllm_engine.named_weights))

# %% [markdown]
# One parameter at a time, so that under FSDP2 only one whole tensor is gathered at once
# (`full_tensor` is the all-gather of its shards). The prefix cache is reset after the load:
# vLLM caches the KV of prompt prefixes it has seen, and those were computed with the old
# weights. The order of one rollout's calls, recorded by the test suite's stand-in for vLLM
# (`tests/fake_vllm`: exactly the API the engine uses, sampling with the policy itself on the
# CPU, and refusing any call out of order):

# %%
sys.path.insert(0, str(Path("../tests/fake_vllm").resolve()))
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

# %% [markdown]
# Each completion is sampled with its own seed, the step's seed plus its index in the whole
# batch, so the rollout does not depend on how the prompts are split over GPUs (chapter 7's
# promise, kept on the GPU path up to vLLM's kernels).
#
# ## bf16: why the master weights stay float32
#
# On a GPU the forward passes run in bf16 (`precision = "bf16"`, autocast). bf16 keeps 8
# bits of mantissa: around 1.0 its spacing is 2^-7, so adding to a weight anything smaller
# than half of that, 1/256 of it, changes nothing. An AdamW update is lr-sized, 1e-6 for the
# hub recipes:

# %%
weight = torch.tensor(1.0)
for update in (1e-2, 1 / 256, 1e-3, 1e-6):
    in_bf16 = (weight.bfloat16() + torch.tensor(update).bfloat16()).float().item()
    in_fp32 = (weight + update).item()
    print(f"1 + {update:<9.3g} bf16 -> {in_bf16:.8f}   float32 -> {in_fp32:.8f}")
print(f"\ncompute dtype on cuda with precision 'auto': {trainer.compute_dtype(configs['gpu-1x'], torch.device('cuda'))}")

# %% [markdown]
# In bf16 the 1e-6 update disappears, and so would every update of a run. So the trainer
# keeps its master weights and AdamW's moments in float32 and only the forward passes use
# bf16; vLLM holds its own bf16 copy for sampling.
#
# ## The mismatch, measured with the CPU's engines
#
# vLLM's log-probabilities of the sampled tokens are not the trainer's: other kernels, another
# precision. The trainer logs the difference every step (`sampler_gap/mean_abs`, the mean
# absolute log-prob difference per token, and `sampler_gap/max_ratio`, the worst token's
# importance weight). Here is its size on this CPU: one rollout of the fused engine in
# float32, its log-probs recomputed by transformers' forward in float32, in bf16, and at a
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
        gaps[label] = trainer.sampler_gap(recomputed.float(), batch.sampler_logp, batch.completion_mask)
for label, gap in gaps.items():
    print(f"{label:<20} mean |gap| {gap['sampler_gap/mean_abs']:.2e}   max ratio {gap['sampler_gap/max_ratio']:.4f}")

# %%
# Claims (compared on every machine): the orders of magnitude the prose below states.
print("float32 gap below 1e-5:", gaps["float32"]["sampler_gap/mean_abs"] < 1e-5)
print("bf16 gap above 1e-3:", gaps["bf16 autocast"]["sampler_gap/mean_abs"] > 1e-3)
print("bf16 gap at least 1000 x the float32 gap:",
      gaps["bf16 autocast"]["sampler_gap/mean_abs"] > 1000 * gaps["float32"]["sampler_gap/mean_abs"])

# %% [markdown]
# In float32 the two computations agree to rounding; in bf16 the gap is thousands of times
# larger. That is the gap a vLLM run lives with. It biases the gradient: the tokens were drawn
# by the sampler, but the loss treats them as drawn by pi_old. **Truncated importance
# sampling** (`tis_cap`, 2 in the GPU configs) weighs each token's loss by
# min(pi_old / pi_sampler, tis_cap), which makes the expected gradient pi_old's again (up to
# the cap). Measured on a small categorical policy whose sampler runs at temperature 1.6:
# the gradient of the loss over many samples, against the exact on-policy expectation, in
# Monte-Carlo standard errors.

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

# %%
# Claims (compared on every machine).
print("without the correction, more than 20 standard errors off:", errors["without correction"] > 20)
print("with it, within 3 standard errors:", errors["tis_cap = 1e6"] < 3 and errors["tis_cap = 2"] < 3)

# %% [markdown]
# Without the correction the gradient is far outside its Monte-Carlo noise; with it, inside.
# A finite cap trades a little bias for bounded variance (a token the sampler found much less
# likely than pi_old would otherwise weigh without limit).
#
# ## The memory budget of one H100
#
# What a colocated run holds per GPU, for three real policies. Their architectures are
# Qwen2.5's published dimensions, built here on the meta device (no weights, no download)
# so that the parameter counts are exact:

# %%
ARCHITECTURES = {
    "Qwen2.5-0.5B": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True),
    "Qwen2.5-1.5B": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True),
    "Qwen2.5-7B": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False),
}
sizes = {}
for name, dims in ARCHITECTURES.items():
    config = Qwen2Config(**dims)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    head_dim = dims["hidden_size"] // dims["num_attention_heads"]
    sizes[name] = dict(parameters=sum(p.numel() for p in model.parameters()),
                       kv_bytes_per_token=2 * dims["num_hidden_layers"] * dims["num_key_value_heads"] * head_dim * 2)
    print(f"{name:<14} {sizes[name]['parameters']:>14,} parameters   "
          f"KV cache {sizes[name]['kv_bytes_per_token']:,} bytes per token (bf16)")

# %% [markdown]
# Per parameter, the trainer holds float32 weights (4 bytes), gradients (4) and AdamW's two
# moments (8): 16 bytes, 1/N of them per GPU under FSDP2. Beside them, a whole float32 copy of
# the policy that evaluation reads (4, on every GPU), and with beta > 0 the frozen reference
# (4; 1/N under FSDP2). vLLM, while awake, takes `vllm_gpu_memory_utilization` of the GPU:
# its bf16 weights (2 bytes per parameter) and, in the rest of that share, the KV cache. The
# table leaves out activations, which grow with micro_batch_size and the completion length,
# and must fit in what is left.

# %%
GPU_BYTES, SHARE = 80e9, configs["gpu-1x"].vllm_gpu_memory_utilization
print(f"one H100: {GPU_BYTES / 1e9:.0f} GB; vLLM's share while awake: {SHARE} = {SHARE * GPU_BYTES / 1e9:.0f} GB\n")
print(f"{'policy':<14}{'GPUs':>5}{'training state':>16}{'eval copy':>11}{'reference':>11}{'vLLM weights':>14}"
      f"{'KV tokens':>11}{'left':>11}")
for name, size in sizes.items():
    P = size["parameters"]
    for gpus in (1, 8):
        training, evaluation, reference = 16 * P / gpus, 4 * P, 4 * P / gpus
        vllm_weights = 2 * P
        kv_tokens = max(0, SHARE * GPU_BYTES - vllm_weights) // size["kv_bytes_per_token"]
        left = GPU_BYTES * (1 - SHARE) - training - evaluation - reference
        print(f"{name:<14}{gpus:>5}{training / 1e9:>13.1f} GB{evaluation / 1e9:>8.1f} GB{reference / 1e9:>8.1f} GB"
              f"{vllm_weights / 1e9:>11.1f} GB{int(kv_tokens):>11,}{left / 1e9:>8.1f} GB")

# %% [markdown]
# Read the last column: what is left for activations once vLLM's share is set aside. The
# `Qwen2.5-0.5B` and `Qwen2.5-1.5B` fit on one GPU with room to spare. `Qwen2.5-7B` does not fit on one
# H100 at all (the column goes negative); on 8 it fits with 6.5 GB left, and the largest item
# on each GPU is then no longer the sharded training state but the whole float32 evaluation
# copy (30.5 GB), which every GPU keeps: the next memory to cut. The KV-cache column is how
# many tokens of completions vLLM can hold at once; a rollout with more is sampled in waves.
#
# ## The batch arithmetic of the recipes
#
# Chapter 7 worked out what a step is on N ranks. With vLLM colocated, each rank's engine
# samples that rank's share of the rollout; the completions and tokens per engine and per
# optimizer step of the GPU configs and recipes:

# %%
recipes = ["gpu-1x", "h100-8x", "gpu-countdown-from-scratch", "qwen2.5-0.5b-gsm8k-1x", "qwen2.5-0.5b-gsm8k-8x",
           "qwen2.5-0.5b-countdown-8x"]
print(f"{'config':<28}{'GPUs':>5}{'prompts/engine':>16}{'completions/engine':>20}{'tokens/engine, max':>20}"
      f"{'optimizer steps':>17}{'completions/step':>18}")
for name in recipes:
    c = TrainConfig.from_toml(f"../configs/{name}.toml")
    gpus = 8 if name.endswith("8x") else 1
    per_engine = c.prompts_per_step // gpus * c.num_generations
    print(f"{name:<28}{gpus:>5}{c.prompts_per_step // gpus:>16,}{per_engine:>20,}"
          f"{per_engine * c.max_completion_length:>20,}{trainer.optimizer_steps_per_rollout(c):>17}"
          f"{c.prompts_per_step * c.num_generations // c.num_mini_batches:>18,}")

# %% [markdown]
# ## Your exercise solution, in a GPU run
#
# Chapter 6 trained with your advantage function from Python. On a GPU you launch with a
# command, so the config names the function by import path, and every process imports it:
# `advantage_fn = "my_solutions:group_advantages"` (reward functions likewise, by a name
# "module:function" in `[rewards]`). The trainer checks each one at start-up on a probe
# batch, so a function that breaks fails in one line, before the first rollout:

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
'''))
sys.path.insert(0, str(folder))
for function in ("group_advantages", "forgot_the_epsilon"):
    config = TrainConfig.from_toml("../configs/gpu-1x.toml", [f"advantage_fn=my_solutions:{function}"])
    try:
        trainer.functions_from_config(config)
        print(f"my_solutions:{function}: passes the probe")
    except ValueError as error:
        print(error)

# %% [markdown]
# The probe includes a group whose rewards are all equal, which is where a missing epsilon
# divides by zero. The commands that train with the solution, from the folder that holds
# `my_solutions.py`, on one GPU and on eight:

# %%
for name in ("gpu-1x", "h100-8x"):
    launch = "grpo-edu train" if name == "gpu-1x" else "torchrun --standalone --nproc-per-node 8 -m grpo_edu train"
    print(f"{launch} --config configs/{name}.toml --set advantage_fn=my_solutions:group_advantages")

# %% [markdown]
# ## On a GPU
#
# The cells below need a CUDA GPU and vLLM (`pip install -e '.[gpu]'`). First the machine's
# check, then a short run of the one-GPU config with its step time and peak memory.

# %% tags=["gpu"]
print(subprocess.run([sys.executable, "-m", "grpo_edu", "doctor", "--gpu"], capture_output=True, text=True).stdout)

# %% tags=["gpu"]
gpu_run = Path(tempfile.mkdtemp()) / "run"
torch.cuda.reset_peak_memory_stats()
result = trainer.train(TrainConfig.from_toml("../configs/gpu-1x.toml", ["steps=20", "eval_every=20",
                                                                         f"output_dir={gpu_run}", "progress=false"]))
print(f"{torch.cuda.get_device_name(0)}: {result.summary['median_steps_per_second']:.2f} steps/s, "
      f"peak {torch.cuda.max_memory_allocated() / 1e9:.1f} GB, held-out accuracy "
      f"{result.summary['start_accuracy']:.3f} -> {result.summary['final_accuracy']:.3f}")

# %% [markdown]
# From here the recipes take over: `configs/qwen2.5-0.5b-gsm8k-1x.toml` and its siblings
# train Qwen2.5-0.5B-Instruct on GSM8K and on Countdown, on one GPU and on eight, with their
# batch arithmetic in their comments; and `grpo_edu.trl_bridge` turns the same config into
# TRL's GRPOTrainer for its production features.
