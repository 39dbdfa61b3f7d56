"""The GPU tier, measured on one CUDA GPU: the recipes' times to their targets, and Qwen-shaped
models' step time, throughput and memory. Writes one results file for docs/gpu.md and chapter 11.

    python benchmarks/gpu.py [--part PART ...] [--out FILE] [--work-dir DIR] [--budget-seconds S]
    python benchmarks/gpu.py --toy          # every part at toy size on the CPU (what CI runs)
    python benchmarks/gpu.py --report       # the results file as Markdown tables; runs nothing

Parts (--part, repeatable; default all):

  tiny                the tiny policy: configs/gpu-1x.toml with engine = "hf" (transformers'
                      generate samples; no vLLM) in bf16; wall-clock time to the first held-out
                      greedy accuracy >= 0.90 (the same recipe on the CPU, with the fused engine,
                      is at 0.910 at rollout 100; docs/gpu.md, "GPUs"). The run stops there.
  countdown-pretrain  step 1 of the download-free recipe: the `python -m grpo_edu.commands.pretrain` command
                      written in configs/gpu-countdown-from-scratch.toml, as written but for its
                      output directory (WORK_DIR/countdown-start): time to its target, held-out
                      greedy accuracy 0.3, and the model card's figures.
  countdown-grpo      step 2: that config with engine = "hf", from step 1's model. The recipe
                      names no accuracy target for this step: its target is its end (300
                      rollouts); the evaluation curve is recorded with the time of each point.
  qwen2.5-0.5b        Qwen2.5-0.5B- and 1.5B-Instruct-shaped models (the values of Qwen's
  qwen2.5-1.5b        published config.json, below; random weights, nothing downloaded) through
                      full GRPO steps with engine = "hf", bf16: median step time, completion
                      tokens per second, peak memory, beside chapter 11's memory table.
  qwen2.5-1.5b-lora   the same steps training LoRA adapters (rank 16, alpha 32, every linear layer
  qwen2.5-7b-lora     of every decoder layer; the reference is the base with the adapters off), for
                      the 1.5B shape and for Qwen2.5-7B's, which chapter 11 finds too large to
                      train whole on one H100.
  qwen2.5-7b-lora-mb8 the 7B LoRA steps with micro-batches of 8 completions instead of 16 (the
                      activations of a 16-completion micro-batch take more than an H100 has).
  countdown = both countdown parts; qwen = every Qwen part; lora = the three LoRA parts; all = every
  part, in this order.

A lent GPU machine runs a command for at most 10 minutes, so run one part per command:

    python benchmarks/gpu.py --part tiny
    python benchmarks/gpu.py --part countdown-pretrain
    python benchmarks/gpu.py --part countdown-grpo     # again while its status is "interrupted"
    python benchmarks/gpu.py --part qwen2.5-0.5b
    python benchmarks/gpu.py --part qwen2.5-1.5b
    python benchmarks/gpu.py --part lora               # the three LoRA parts (85, 135, 179 s on an H200)

Each part stops itself after --budget-seconds (default 480) of wall-clock. A GRPO part
(tiny, countdown-grpo) checkpoints at every evaluation and stops after the first checkpoint
past the budget, with status "interrupted"; the same command run again (on the same machine:
the run directory is in WORK_DIR) resumes from that checkpoint and adds up the time. Pretraining
cannot resume (grpo_edu.commands.pretrain keeps no checkpoints): past the budget it stops at its next
evaluation, "not_reached". Each part merges its entry into --out as soon as it ends, so a later
part's failure loses nothing; a failed part is recorded with its error, and the command exits 1.
Without CUDA the command refuses to run, unless --toy: toy sizes, on the CPU by default (in
float32, one thread; about 30 s), or --toy --device cuda, a quick smoke test of a GPU machine (bf16).

How the runs are watched: grpo_edu.training.trainer.record (called once per step) and
grpo_edu.training.checkpoint.save_checkpoint are wrapped while a part runs, to time each step and
evaluation, to stop a run at its target, and to stop it after a checkpoint past the budget;
grpo_edu.commands.pretrain is followed through its `log` callback. Nothing else of the trainer changes.
Times are wall-clock from the part's start: they include set-up (building the models, the first
held-out evaluation, or restoring a checkpoint; once per command), the evaluations and the
checkpoints. A step's own time is the trainer's time/rollout + time/scoring + time/update.

The Qwen-shaped steps. The tokenizer is the tiny policy's character tokenizer, extended with
filler tokens to the model's vocabulary (151,936), so every id the random model samples decodes.
Prompts are Countdown's (about 25 characters, so 25 tokens); a random model rarely samples <eos>,
so completions run to the full length L. The task's rewards would give a random model 0
everywhere (every group equal, no policy gradient), so a stand-in reward scores each completion 0
or 1 by a hash of its text: groups disagree and the update has a gradient, as in a real run. The
loss and optimisation are configs/qwen2.5-0.5b-countdown-1x.toml's (DAPO, clip-higher, lr 1e-6,
2 mini-batches, micro-batches of 16), with B = 8 prompts x G = 8 completions of L = 256 tokens
per step (the recipe's 32 prompts: `generate` keeps N x L x V float32 logits for the sampler's
log-probs, 10 GB at 64 x 256 over 151,936 entries, 40 GB at 256; vLLM is what the recipe samples
with). One step warms up, then --qwen-steps are timed. Peak memory is torch.cuda.max_memory_allocated
over the timed steps; chapter 11's table predicts what the trainer holds between steps, 20 bytes
per parameter with one GPU (float32 weights 4, gradients 4, AdamW 8, the float32 reference 4; no
vLLM share here). The tensors the trainer holds are also counted (device-independent, so the toy
run checks the 20P too); the peak adds activations, the rollout's logits and the KV cache.

Qwen's published config.json values (Qwen/Qwen2.5-0.5B-Instruct and Qwen/Qwen2.5-1.5B-Instruct on
the Hugging Face hub; the same dimensions as chapter 11's table): see QWEN_SHAPES.

Results file (JSON): {"format": 1, "written_by", "updated_utc", "parts": {PART: entry}}. Every
entry has "status" ("done", "not_reached", "interrupted" or "failed"), "toy", "measured_utc",
"environment" (device and GPU name, GPU memory, torch, CUDA, transformers, Python, CPU count,
git commit), "wall_seconds", "commands" (how many runs added to it), "peak_memory_allocated_bytes"
and "peak_memory_reserved_bytes" (torch.cuda's max_memory_allocated and max_memory_reserved; null on
the CPU, with "peak_memory_note"); a failed one "error" and "traceback". Then, by kind:
  GRPO recipe (tiny, countdown-grpo): config, overrides, target, reached, time_to_target_s,
    steps_to_target, start_accuracy, final_accuracy, best_accuracy, eval_curve [{step,
    accuracy, seconds}], steps, recipe_steps, step_seconds_median, time_split_median_s,
    completion_tokens_per_second, run_dir
  pretraining (countdown-pretrain): command, target, reached, time_to_target_s, steps,
    eval_curve [{step, loss, accuracy, seconds}], parameters, held_out (the model card's
    figures), output_dir
  Qwen-shaped (qwen2.5-*): shape, parameters, workload {B, G, L, micro_batch_size, ...},
    warmup_steps, timed_steps, step_seconds [..], step_seconds_median, time_split_median_s,
    completion_tokens_per_step, completion_tokens_per_second, sampled_tokens_per_second,
    trained_tokens_per_second, chapter9_prediction_bytes {weights_gradients_adamw, reference,
    total}, state_bytes {parameters, gradients, optimizer, reference, total}, rollout_logits_bytes,
    allocated_after_step_bytes, peak_memory_allocated_bytes
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.metadata
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
import traceback
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # grpo_edu from this checkout, installed or not (a lent GPU machine)

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from grpo_edu.commands import pretrain  # noqa: E402
from grpo_edu.policy import lora
from grpo_edu.runtime import distributed
from grpo_edu.training import checkpoint, trainer
from grpo_edu.config import TrainConfig  # noqa: E402
from grpo_edu.runtime.durable import replace as write_atomically  # noqa: E402
from grpo_edu.policy.models import char_tokenizer, save_policy  # noqa: E402
from grpo_edu.runtime.runlog import MetricsLog  # noqa: E402
from grpo_edu.training.plan import optimizer_steps_per_rollout  # noqa: E402

PARTS = ("tiny", "countdown-pretrain", "countdown-grpo", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-1.5b-lora",
         "qwen2.5-7b-lora", "qwen2.5-7b-lora-mb8")
GROUPS = {"all": PARTS, "countdown": PARTS[1:3], "qwen": PARTS[3:], "lora": PARTS[5:]}
STATUSES = ("done", "not_reached", "interrupted", "failed")
TINY_TARGET = 0.90
COUNTDOWN_RECIPE = "configs/gpu-countdown-from-scratch.toml"
QWEN_RECIPE = "configs/qwen2.5-0.5b-countdown-1x.toml"

# Qwen's published config.json of Qwen/Qwen2.5-0.5B-Instruct and Qwen/Qwen2.5-1.5B-Instruct.
QWEN_COMMON = dict(vocab_size=151936, hidden_act="silu", max_position_embeddings=32768, rope_theta=1000000.0,
                   rms_norm_eps=1e-6, tie_word_embeddings=True, attention_dropout=0.0, use_sliding_window=False)
QWEN_SHAPES = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, **QWEN_COMMON),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, **QWEN_COMMON),
}
# Qwen/Qwen2.5-7B-Instruct's config.json: the model chapter 11 finds too large to train whole on one H100.
QWEN_7B = dict(QWEN_COMMON, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False)
# The LoRA parts: the same steps with adapters of rank 16 (alpha 32) on every linear layer of every decoder layer.
LORA = {"lora_rank": 16, "lora_alpha": 32.0}
QWEN_PARTS = {"qwen2.5-0.5b": (QWEN_SHAPES["qwen2.5-0.5b"], {}), "qwen2.5-1.5b": (QWEN_SHAPES["qwen2.5-1.5b"], {}),
              "qwen2.5-1.5b-lora": (QWEN_SHAPES["qwen2.5-1.5b"], LORA), "qwen2.5-7b-lora": (QWEN_7B, LORA),
              "qwen2.5-7b-lora-mb8": (QWEN_7B, dict(LORA, micro_batch_size=8))}
# --toy: a Qwen2 of the same kind (GQA, tied embeddings, QKV bias), small enough for a CPU.
TOY_QWEN_SHAPE = dict(QWEN_COMMON, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=1024, max_position_embeddings=512)
QWEN_WORKLOAD = {"prompts_per_step": 8, "num_generations": 8, "max_completion_length": 256}
TOY_QWEN_WORKLOAD = {"prompts_per_step": 2, "num_generations": 4, "max_completion_length": 16, "micro_batch_size": 4,
                     "threads": 1}

# What each part changes in its recipe (the output directory aside). A GRPO recipe checkpoints at
# every evaluation, so that a part stopped by its budget resumes from its last evaluation.
FULL = {
    "tiny": ["engine=hf", "progress=false", "checkpoint_every=25"],
    "countdown-grpo": ["engine=hf", "progress=false", "checkpoint_every=25"],
}
TOY = {
    "tiny": ["prompts_per_step=8", "steps=4", "eval_every=2", "eval_size=16", "checkpoint_every=2", "threads=1"],
    "countdown-grpo": ["prompts_per_step=4", "num_generations=4", "micro_batch_size=16", "steps=2", "eval_every=1",
                       "eval_size=4", "checkpoint_every=1", "threads=1"],
}
TOY_PRETRAIN = ["--hidden-size", "32", "--num-layers", "1", "--num-heads", "2", "--intermediate-size", "64",
                "--batch-size", "8", "--max-steps", "4", "--eval-every", "2", "--eval-problems", "8",
                "--threads", "1"]


class Stop(Exception):
    """Raised from a watched run to end it: at its target, or after a checkpoint past the budget."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Watch:
    """While open, grpo_edu.training.trainer.record calls on_step(run, metrics) after recording each step,
    and grpo_edu.training.checkpoint.save_checkpoint calls on_checkpoint() after each save; either may
    raise Stop."""

    def __init__(self, on_step, on_checkpoint=lambda: None):
        self.on_step, self.on_checkpoint = on_step, on_checkpoint

    def __enter__(self):
        self.record, self.save = trainer.record, checkpoint.save_checkpoint

        def record(run, metrics, accuracy):
            self.record(run, metrics, accuracy)
            self.on_step(run, metrics)

        def save(*args, **kwargs):
            self.save(*args, **kwargs)
            self.on_checkpoint()
        trainer.record, checkpoint.save_checkpoint = record, save
        return self

    def __exit__(self, *exc):
        trainer.record, checkpoint.save_checkpoint = self.record, self.save
        return False


# --------------------------------------------------------------------------- the machine

def environment(device: str) -> dict:
    """What the figures were measured on."""
    env = {"device": device, "python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "cuda": torch.version.cuda, "platform": platform.platform(),
           "cpu_count": os.cpu_count(), "gpu": None, "gpu_memory_bytes": None, "gpu_count": 0}
    if device == "cuda":
        properties = torch.cuda.get_device_properties(0)
        env.update(gpu=properties.name, gpu_memory_bytes=properties.total_memory, gpu_count=torch.cuda.device_count(),
                   cudnn=torch.backends.cudnn.version())
    try:
        env["vllm"] = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:   # the lent GPU machines have none
        env["vllm"] = None
    env.update(git_commit=None, git_dirty=None)
    try:
        git = ["git", "-C", str(ROOT)]
        env["git_commit"] = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                                           check=True, timeout=30).stdout.strip()
        env["git_dirty"] = bool(subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"],
                                               capture_output=True, text=True, timeout=30).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass   # no git, or a copy of the working tree without .git
    return env


class Memory:
    """torch.cuda's peak allocation over a part (None on the CPU, with the reason)."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def peak(self) -> int | None:
        return torch.cuda.max_memory_allocated() if self.cuda else None

    def peak_reserved(self) -> int | None:
        """What the caching allocator held at most: the GPU memory the part took from others."""
        return torch.cuda.max_memory_reserved() if self.cuda else None

    def note(self) -> str:
        return ("torch.cuda.max_memory_allocated(): tensors only, not the allocator's cache or the CUDA context"
                if self.cuda else "no CUDA: torch.cuda.max_memory_allocated needs a GPU (the CPU has no counterpart "
                                  "that separates this part's tensors from the process's)")


def _max(*values):
    values = [v for v in values if v is not None]
    return max(values) if values else None


# --------------------------------------------------------------------------- GRPO recipes

def on_device(device: str) -> list[str]:
    """The recipes' device and precision keys for this run: on a GPU their own bf16; on the CPU
    (--toy) float32 (precision = "auto"), since the CPU's bf16 autocast is slow and says nothing
    about a GPU's."""
    return ["device=cuda"] if device == "cuda" else ["device=cpu", "precision=auto"]


def _step_seconds(metrics: dict) -> float:
    return metrics["time/rollout"] + metrics["time/scoring"] + metrics["time/update"]


def _step_figures(history: list[dict], completions_per_step: int) -> dict:
    """Median step time, its split, and completion tokens per second over a run's steps."""
    if not history:
        return {}
    seconds = [_step_seconds(m) for m in history]
    tokens = [m["completion_length/mean"] * completions_per_step for m in history]
    return {"step_seconds_median": statistics.median(seconds),
            "time_split_median_s": {k: statistics.median(m[f"time/{k}"] for m in history)
                                    for k in ("rollout", "scoring", "update")},
            "completion_tokens_per_second": sum(tokens) / sum(seconds)}


def grpo_recipe(part: str, args, device: str, previous: dict, recipe: str, overrides: list[str],
                target: float | None) -> dict:
    """Train a recipe (configs/...) with trainer.train until its target (held-out greedy accuracy)
    or its end; stopped after a checkpoint past the budget, resumed by the next command."""
    run_dir = args.work_dir / part
    resume = (previous.get("status") == "interrupted" and not args.fresh
              and (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").iterdir()))
    if not resume:
        previous = {}
        shutil.rmtree(run_dir, ignore_errors=True)
    config = TrainConfig.from_toml(ROOT / recipe, [*overrides, *on_device(device), f"output_dir={run_dir}"])
    K = optimizer_steps_per_rollout(config)
    memory, started = Memory(device), time.perf_counter()
    wall_before = previous.get("wall_seconds", 0.0)
    curve = list(previous.get("eval_curve", []))
    seen = {"step": curve[-1]["step"] if curve else 0, "start": previous.get("start_accuracy")}

    def now() -> float:
        return wall_before + time.perf_counter() - started

    def say(message: str) -> None:
        print(f"[{part}] {message}", flush=True)
        if message.startswith("start: held-out greedy accuracy"):   # set-up is over
            seen["start"] = float(message.split()[-1])
            curve.append({"step": 0, "accuracy": seen["start"], "seconds": round(now(), 2)})

    def on_step(run, metrics):
        seen["step"] = metrics["step"]
        if "eval/greedy_accuracy" in metrics:
            accuracy = metrics["eval/greedy_accuracy"]
            curve.append({"step": metrics["step"], "accuracy": accuracy, "seconds": round(now(), 2)})
            say(f"step {metrics['step']}: held-out greedy accuracy {accuracy:.4f} at {now():.1f} s")
            if target is not None and accuracy >= target:
                seen["reached_at"] = curve[-1]["seconds"]   # the evaluation that reached it, not the stop after
                raise Stop("target")

    def on_checkpoint():
        if time.perf_counter() - started > args.budget_seconds and seen["step"] < config.optimisation.steps:
            raise Stop("budget")

    outcome = "end"
    try:
        with Watch(on_step, on_checkpoint):
            trainer.train(config, resume=run_dir if resume else None, log=say)
    except Stop as stop:
        outcome = stop.reason
    history = MetricsLog(run_dir).read()
    reached = outcome == "target"
    status = {"target": "done", "budget": "interrupted"}.get(outcome, "done" if target is None else "not_reached")
    accuracies = [point["accuracy"] for point in curve]
    entry = {
        "status": status, "config": recipe, "overrides": overrides,
        "target": {"held_out_greedy_accuracy": target} if target is not None else
                  {"recipe_end_steps": config.optimisation.steps},
        "reached": reached if target is not None else seen["step"] >= config.optimisation.steps,
        "time_to_target_s": seen["reached_at"] if reached else
        round(now(), 2) if target is None and seen["step"] >= config.optimisation.steps else None,
        "steps_to_target": seen["step"] if reached else None,
        "optimizer_steps_per_rollout": K,
        "start_accuracy": seen["start"], "final_accuracy": accuracies[-1] if accuracies else None,
        "best_accuracy": max(accuracies) if accuracies else None, "eval_problems": config.logging.eval_size,
        "eval_curve": curve, "steps": seen["step"], "recipe_steps": config.optimisation.steps,
        "prompts_per_step": config.rollout.prompts_per_step, "num_generations": config.rollout.num_generations,
        "max_completion_length": config.rollout.max_completion_length,
        **_step_figures(history, config.rollout.prompts_per_step * config.rollout.num_generations),
        "wall_seconds": round(now(), 2), "commands": previous.get("commands", 0) + 1,
        "peak_memory_allocated_bytes": _max(previous.get("peak_memory_allocated_bytes"), memory.peak()),
        "peak_memory_reserved_bytes": _max(previous.get("peak_memory_reserved_bytes"), memory.peak_reserved()),
        "peak_memory_note": memory.note(), "run_dir": str(run_dir),
    }
    return entry


def part_tiny(args, device, previous):
    overrides = FULL["tiny"] + (TOY["tiny"] if args.toy else [])
    return grpo_recipe("tiny", args, device, previous, "configs/gpu-1x.toml", overrides, TINY_TARGET)


def part_countdown_grpo(args, device, previous):
    start = args.work_dir / "countdown-start"
    if not (start / "config.json").is_file():
        raise FileNotFoundError(f"{start} holds no model: run --part countdown-pretrain first, on this machine "
                                f"(step 1 of the recipe writes it)")
    overrides = FULL["countdown-grpo"] + (TOY["countdown-grpo"] if args.toy else []) + [f"model={start}"]
    return grpo_recipe("countdown-grpo", args, device, previous, COUNTDOWN_RECIPE, overrides, None)


# --------------------------------------------------------------------------- pretraining

def recipe_pretrain_flags() -> list[str]:
    """Step 1's command line, read from the recipe's comments (so the benchmark runs what it says)."""
    text = (ROOT / COUNTDOWN_RECIPE).read_text()
    match = re.search(r"^#\s+1\. python -m grpo_edu\.commands\.pretrain (.+)$", text, re.MULTILINE)
    if match is None:
        raise ValueError(f"{COUNTDOWN_RECIPE}: no '1. python -m grpo_edu.commands.pretrain ...' line in its comments")
    flags = match.group(1).split()
    if "--output-dir" in flags:   # ours instead: never the recipe's, never the package's default
        at = flags.index("--output-dir")
        del flags[at:at + 2]
    return flags


LOG_LINE = re.compile(r"step\s+(\d+)\s+loss (\S+)\s+held-out greedy accuracy (\S+)")


def part_countdown_pretrain(args, device, previous):
    output = args.work_dir / "countdown-start"
    shutil.rmtree(output, ignore_errors=True)
    flags = [*recipe_pretrain_flags(), "--device", device, "--output-dir", str(output)]
    flags += TOY_PRETRAIN if args.toy else []
    config = pretrain.parse_args(flags)
    memory = Memory(device)
    started = (time.perf_counter(), time.process_time())
    curve = []

    def log(line: str) -> None:
        print(f"[countdown-pretrain] {line}", flush=True)
        match = LOG_LINE.match(line.strip())
        if match is None:
            raise ValueError(f"grpo_edu.commands.pretrain logged a line this benchmark cannot read: {line!r}")
        seconds = time.perf_counter() - started[0]
        curve.append({"step": int(match[1]), "loss": float(match[2]), "accuracy": float(match[3]),
                      "seconds": round(seconds, 2)})
        if seconds > args.budget_seconds and float(match[3]) < config.target_accuracy:
            raise Stop("budget")

    entry = {"command": "python -m grpo_edu.commands.pretrain " + " ".join(flags), "target":
             {"held_out_greedy_accuracy": config.target_accuracy}, "eval_problems": config.eval_problems,
             "eval_curve": curve, "output_dir": str(output)}
    try:
        result = pretrain.pretrain(config, log=log)
    except Stop:
        entry.update(status="not_reached", reached=False, time_to_target_s=None,
                     steps=curve[-1]["step"] if curve else 0, stopped="budget")
    else:
        entry.update(reached=result.reached, steps=result.steps, parameters=sum(
            p.numel() for p in result.model.parameters()),
            time_to_target_s=round(result.seconds, 2) if result.reached else None)
        entry["status"] = "done" if result.reached else "not_reached"
        if result.reached:    # as the script does: the held-out figures, the model and its card
            entry["held_out"] = pretrain.write_policy(config, result, entry["command"], started)
        elif args.toy:        # a toy never reaches 0.3: its model is written anyway, for step 2
            save_policy(result.model, result.tokenizer, output)
    entry.update(wall_seconds=round(time.perf_counter() - started[0], 2), commands=1,
                 peak_memory_allocated_bytes=memory.peak(), peak_memory_reserved_bytes=memory.peak_reserved(),
                 peak_memory_note=memory.note())
    return entry


# --------------------------------------------------------------------------- Qwen-shaped steps

def filler_tokenizer(vocab_size: int, max_length: int):
    """The character tokenizer, extended with filler tokens <f...> up to vocab_size entries, so that
    every id a model of that vocabulary samples decodes (to its filler's name). Encoding is
    unchanged: text is split into characters before the vocabulary is looked up."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast
    base = char_tokenizer(max_length)
    spec = json.loads(base.backend_tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    size = len(base)
    if vocab_size < size:
        raise ValueError(f"vocab_size must be at least the character tokenizer's {size}, got {vocab_size}")
    vocab.update({f"<f{i}>": i for i in range(size, vocab_size)})
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)), pad_token=base.pad_token, eos_token=base.eos_token,
        unk_token=base.unk_token, padding_side="left", model_max_length=max_length,
        clean_up_tokenization_spaces=False)
    assert len(tokenizer) == vocab_size, (len(tokenizer), vocab_size)
    return tokenizer


def coin_reward(completions, **columns) -> list[float]:
    """A stand-in reward (TRL's signature): 0 or 1 by a hash of the completion's text."""
    return [float(zlib.crc32(str(completion).encode()) & 1) for completion in completions]


def qwen_shaped(shape: dict, tokenizer, device: str) -> Qwen2ForCausalLM:
    config = Qwen2Config(**shape, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=None)
    torch.manual_seed(0)
    with torch.device(device):   # initialised where it trains: 1.5B parameters initialise slowly on a CPU
        model = Qwen2ForCausalLM(config)
    generation = model.generation_config
    generation.pad_token_id, generation.eos_token_id, generation.bos_token_id = (
        tokenizer.pad_token_id, tokenizer.eos_token_id, None)
    return model


def part_qwen(part: str, args, device: str, previous: dict) -> dict:
    shape, lora_keys = QWEN_PARTS[part]
    shape = TOY_QWEN_SHAPE if args.toy else shape
    workload = {**QWEN_WORKLOAD, **lora_keys, **(TOY_QWEN_WORKLOAD if args.toy else {})}
    warmup, timed = 1, (2 if args.toy else args.qwen_steps)
    run_dir = args.work_dir / part
    shutil.rmtree(run_dir, ignore_errors=True)
    memory, started = Memory(device), time.perf_counter()
    tokenizer = filler_tokenizer(shape["vocab_size"], shape["max_position_embeddings"])
    policy = qwen_shaped(shape, tokenizer, device)
    P = sum(p.numel() for p in policy.parameters())   # a tied embedding counts once
    overrides = [f"{k}={v}" for k, v in workload.items()] + [
        "engine=hf", "chat_template=false", "eval_size=8" if not args.toy else "eval_size=2", "eval_every=1000000",
        "checkpoint_every=0", "progress=false", f"steps={warmup + timed + 1}"]
    config = TrainConfig.from_toml(ROOT / QWEN_RECIPE, [*overrides, *on_device(device), f"output_dir={run_dir}"])
    N = config.rollout.prompts_per_step * config.rollout.num_generations
    timed_metrics, seen = [], {}

    def on_step(run, metrics):
        if metrics["step"] == warmup:   # the peak of the timed steps only, from here
            seen["peak_before"] = memory.peak()
            if memory.cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            return
        timed_metrics.append(metrics)
        print(f"[{part}] step {metrics['step']}: {_step_seconds(metrics):.2f} s", flush=True)
        if metrics["step"] == warmup + timed:
            seen["run"] = run
            raise Stop("timed")

    try:
        with Watch(on_step):
            trainer.train(config, policy=policy, tokenizer=tokenizer, reward_functions={"coin": (coin_reward, 1.0)},
                          log=lambda message: print(f"[{part}] {message}", flush=True))
    except Stop:
        pass
    run = seen["run"]
    held = distributed.memory_bytes(run.models.policy, run.optimizer)
    reference = run.models.reference
    held["reference"] = 0 if reference is None else sum(p.numel() * p.element_size() for p in reference.parameters())
    prompt_tokens = [len(tokenizer(s["prompt"], add_special_tokens=False)["input_ids"]) for s in run.sampler.train_pool[:256]]
    held["total"] = sum(held.values())
    tokens = [m["completion_length/mean"] * N for m in timed_metrics]
    seconds = [_step_seconds(m) for m in timed_metrics]
    peak_timed = memory.peak()
    entry = {
        "status": "done", "shape": {k: v for k, v in shape.items()}, "parameters": P,
        "workload": {"prompts_per_step": config.rollout.prompts_per_step, "num_generations": config.rollout.num_generations,
                     "max_completion_length": config.rollout.max_completion_length,
                     "micro_batch_size": config.optimisation.micro_batch_size, "num_mini_batches": config.optimisation.num_mini_batches,
                     "loss_type": config.loss.loss_type, "precision": config.run.precision, "engine": config.run.engine,
                     "lora_rank": config.lora.lora_rank, "lora_alpha": config.lora.lora_alpha,
                     "prompt_tokens_mean": statistics.mean(prompt_tokens),
                     "reward": "stand-in: crc32 of the completion's text & 1"},
        "recipe": QWEN_RECIPE, "warmup_steps": warmup, "timed_steps": len(timed_metrics),
        "step_seconds": [round(s, 4) for s in seconds],
        **_step_figures(timed_metrics, N),
        "completion_tokens_per_step": statistics.mean(tokens),
        "sampled_tokens_per_second": sum(tokens) / sum(m["time/rollout"] for m in timed_metrics),
        "trained_tokens_per_second": sum(tokens) / sum(m["time/update"] for m in timed_metrics),
        "chapter9_prediction_bytes": prediction(P, run.models.policy),
        "state_bytes": held,
        "rollout_logits_bytes": N * config.rollout.max_completion_length * shape["vocab_size"] * 4,
        "allocated_after_step_bytes": torch.cuda.memory_allocated() if memory.cuda else None,
        "peak_memory_allocated_bytes": peak_timed, "peak_memory_reserved_bytes": memory.peak_reserved(),
        "peak_memory_before_timed_bytes": seen.get("peak_before"),
        "peak_memory_note": memory.note() + "; over the timed steps (peak_memory_before_timed_bytes: set-up, "
                                            "the first evaluation and the warm-up step)",
        "wall_seconds": round(time.perf_counter() - started, 2), "commands": 1,
    }
    del run, seen["run"], policy
    return entry


def prediction(P: int, policy: torch.nn.Module) -> dict:
    """Chapter 11's table: full fine-tuning holds 16 bytes a parameter (float32 weights, gradients,
    AdamW's two moments) and the float32 reference 4; LoRA holds the frozen base's float32 weights
    (4 a parameter), 16 a parameter of its adapters, and no reference (the adapters off)."""
    adapters = sum(p.numel() for name, p in policy.named_parameters() if lora.is_adapter(name))
    if not adapters:
        return {"weights_gradients_adamw": 16 * P, "reference": 4 * P, "total": 20 * P}
    return {"base_weights": 4 * P, "adapter_parameters": adapters, "adapters_gradients_adamw": 16 * adapters,
            "reference": 0, "total": 4 * P + 16 * adapters}


RUNNERS = {"tiny": part_tiny, "countdown-pretrain": part_countdown_pretrain, "countdown-grpo": part_countdown_grpo,
           **{name: (lambda name: lambda a, d, p: part_qwen(name, a, d, p))(name) for name in QWEN_PARTS}}


# --------------------------------------------------------------------------- the results file

def read_results(path: Path) -> dict:
    if path.is_file():
        return json.loads(path.read_text())
    return {"format": 1, "written_by": "benchmarks/gpu.py", "parts": {}}


def merge_result(path: Path, part: str, entry: dict) -> None:
    """Put one part's entry into the results file (read again: another command may have written it)."""
    results = read_results(path)
    results["parts"][part] = entry
    results["updated_utc"] = entry["measured_utc"]
    results["parts"] = {name: results["parts"][name] for name in PARTS if name in results["parts"]}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(results, indent=1) + "\n")


def _gb(value) -> str:
    return "-" if value is None else f"{value / 1e9:.2f}"


def _s(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def report(results: dict) -> str:
    """The results file as Markdown tables (GB = 1e9 bytes)."""
    parts = results.get("parts", {})
    lines = []
    for name, entry in parts.items():
        env = entry.get("environment", {})
        lines.append(f"- {name}: {entry['status']}{' (toy)' if entry.get('toy') else ''}, "
                     f"{env.get('gpu') or env.get('device')}, torch {env.get('torch')}, transformers "
                     f"{env.get('transformers')}, {entry.get('measured_utc')}"
                     + (f": {entry['error']}" if entry.get("error") else ""))
    recipes = [(n, e) for n, e in parts.items() if n in ("tiny", "countdown-pretrain", "countdown-grpo")
               and e["status"] != "failed"]
    if recipes:
        lines += ["", "| part | target | reached | time to target, s | steps | accuracy: start -> final (best) "
                      "| median step, s | completion tokens/s | peak memory, GB |", "|---|---|---|---|---|---|---|---|---|"]
        for name, e in recipes:
            target = ", ".join(f"{k} {v}" for k, v in e["target"].items())
            accuracy = (f"{e.get('start_accuracy') if e.get('start_accuracy') is not None else '-'} -> "
                        f"{e['eval_curve'][-1]['accuracy'] if e['eval_curve'] else '-'}"
                        + (f" ({e['best_accuracy']})" if e.get("best_accuracy") is not None else ""))
            lines.append(f"| {name} | {target} | {e['reached']} | {_s(e.get('time_to_target_s'))} | {e['steps']} | "
                         f"{accuracy} | {_s(e.get('step_seconds_median'))} | "
                         f"{_s(e.get('completion_tokens_per_second'))} | {_gb(e.get('peak_memory_allocated_bytes'))} |")
    qwen = [(n, e) for n, e in parts.items() if n.startswith("qwen") and e["status"] == "done"]
    if qwen:
        lines += ["", "| model (random weights) | parameters | B x G x L | median step, s (rollout / scoring / update) "
                      "| completion tokens/s | chapter 11's prediction, GB | tensors held, GB | peak, GB |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, e in qwen:
            w, split = e["workload"], e["time_split_median_s"]
            lines.append(f"| {name} | {e['parameters']:,} | {w['prompts_per_step']} x {w['num_generations']} x "
                         f"{w['max_completion_length']} | {e['step_seconds_median']:.2f} ({split['rollout']:.2f} / "
                         f"{split['scoring']:.2f} / {split['update']:.2f}) | {e['completion_tokens_per_second']:.0f} | "
                         f"{_gb(e['chapter9_prediction_bytes']['total'])} | {_gb(e['state_bytes']['total'])} | "
                         f"{_gb(e['peak_memory_allocated_bytes'])} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- command line

def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python benchmarks/gpu.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", action="append", choices=[*PARTS, *GROUPS],
                        help="what to measure (repeatable; default all)")
    parser.add_argument("--toy", action="store_true", help="every part at toy size, on the CPU unless --device cuda")
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda, or cpu with --toy")
    parser.add_argument("--out", type=Path, help="the results file (default benchmarks/results/gpu.json; with "
                                                 "--toy, WORK_DIR/gpu-toy.json)")
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "gpu-benchmark",
                        help="run directories and step 1's model (default runs/gpu-benchmark)")
    parser.add_argument("--budget-seconds", type=float, default=480.0,
                        help="each part stops itself after this much wall-clock (see above)")
    parser.add_argument("--qwen-steps", type=int, default=5, help="timed GRPO steps per Qwen shape (after 1 warm-up)")
    parser.add_argument("--fresh", action="store_true", help="start an interrupted part again instead of resuming it")
    parser.add_argument("--report", action="store_true", help="print the results file as Markdown tables; run nothing")
    args = parser.parse_args(argv)
    args.work_dir = args.work_dir.resolve()
    if args.out is None:
        args.out = args.work_dir / "gpu-toy.json" if args.toy else ROOT / "benchmarks" / "results" / "gpu.json"
    if args.qwen_steps < 1:
        parser.error(f"--qwen-steps must be >= 1, got {args.qwen_steps}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.report:
        if not Path(args.out).is_file():
            print(f"no results in {args.out} yet: no GPU measurement has been made (python benchmarks/gpu.py "
                  f"--part PART on a CUDA GPU writes it, one part per command)")
            return 0
        print(report(read_results(args.out)))
        return 0
    device = args.device or ("cpu" if args.toy else "cuda")
    if device == "cuda" and not torch.cuda.is_available():
        print("benchmarks/gpu.py measures on a CUDA GPU, and torch sees none (torch.cuda.is_available() is False; "
              f"torch {torch.__version__}). --toy runs every part at toy size on the CPU.", file=sys.stderr)
        return 2
    if device == "cpu" and not args.toy:
        print("--device cpu is for --toy runs only: the figures are the GPU's", file=sys.stderr)
        return 2
    parts = list(dict.fromkeys(p for name in (args.part or ["all"]) for p in GROUPS.get(name, (name,))))
    failed = []
    for part in parts:
        previous = read_results(args.out)["parts"].get(part, {})
        if previous.get("toy") != args.toy:   # never resume a toy run as a real one, or the reverse
            previous = {}
        print(f"[{part}] {'toy size, ' if args.toy else ''}on {device}", flush=True)
        started = time.perf_counter()
        try:
            entry = RUNNERS[part](args, device, previous)
        except Exception as error:   # recorded; the next part still runs
            traceback.print_exc()
            entry = {"status": "failed", "error": f"{type(error).__name__}: {error}"[:2000],
                     "traceback": traceback.format_exc()[-4000:], "wall_seconds": round(time.perf_counter() - started, 2),
                     "commands": 1, "peak_memory_allocated_bytes": torch.cuda.max_memory_allocated()
                     if device == "cuda" else None}
            failed.append(part)
        entry = {"status": entry.pop("status"), "toy": args.toy,
                 "measured_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                 "environment": environment(device), **entry}
        merge_result(args.out, part, entry)
        print(f"[{part}] {entry['status']} in {entry['wall_seconds']:.1f} s; written to {args.out}", flush=True)
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    print(report(read_results(args.out)))
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
