"""grpo_edu's trainer against TRL's GRPOTrainer: same policy, task, rewards, settings.

    python benchmarks/vs_trl.py [--steps 200] [--seeds 0 1 2] [--threads 2] [--beta 0.04] [--out FILE]
    python benchmarks/vs_trl.py --config configs/cpu-reasoning.toml [--steps 150] [--out FILE]

With --config the three trainers take every setting from the config file (its task, policy,
rewards, sizes, learning rate, loss), TRL's through grpo_edu.commands.trl_bridge, which refuses a
setting TRL cannot reproduce; --steps, --seeds, --threads (and --beta, --learning-rate if given)
override the file, and advantages divide by the sample std (TRL's convention) in both. Without it, the settings below.

Both start from the committed tiny policy and train on the arithmetic task with
the same reward functions (grpo_edu.environment.rewards, which have TRL's signature), B = 16
prompts x G = 8 completions per optimizer step, lr 3e-4 (--learning-rate) with cosine decay to 0
over the run, beta 0.04 (--beta; 0 is TRL 1.16's default and make train's, and then neither trainer has
a reference model) (k3, without TRL's bias-corrected KL, so both minimise the
same loss), epsilon 0.2, loss_type "grpo", temperature 1, sample-std advantages
(TRL's convention), on the CPU with the same thread count. Three trainers:
grpo_edu's default (the fused forward and sampler, grpo_edu.sampling.fused_llama),
grpo_edu with transformers' forward and generate (engine = "hf": TRL's
model code), and TRL.

Order. For each seed the three run one after the other, and the order rotates
from seed to seed (seed index 0: A B C, 1: B C A, 2: C A B, 3: A B C, ...), so
that neither a slow drift of a shared machine nor running first or last (a warm
or cold cache, a heated CPU) favours one trainer.

What is timed, the same way for all: the wall-clock of a whole iteration of
the training loop, from the start of one step to the start of the next.
  grpo_edu  a timestamp each time the loop calls grpo_edu.training.rollouts.sample_prompts,
            which it does exactly once per step, first thing in the step (checked:
            the benchmark fails if the count differs from the steps). An iteration
            holds sampling, scoring, the update, its metrics and their line in
            metrics.jsonl.
  TRL       a timestamp at each on_step_begin callback. transformers' Trainer
            calls it once per optimizer step, before training_step, in which
            GRPOTrainer._prepare_inputs generates and scores the completions; the
            interval to the next on_step_begin adds the optimizer step, the
            on_step_end bookkeeping and fetching the next step's prompts.
The last step has no next start; its interval would hold different end-of-run
work for each trainer (our final held-out evaluation and checkpoint, TRL's
end of train()), so it is dropped for every trainer: N steps give N - 1 step
times per seed. The table prints their median, pooled over seeds, and held-out
greedy accuracy after N steps per seed, measured by the same function on the
same problems. Beside it, each trainer's speed against TRL with its 95% interval over seeds:
per seed the ratio of TRL's median step to the trainer's, their geometric mean, and the paired
t interval of the log ratios (grpo_edu.algorithm.statistics.paired_seeds) turned back into a
ratio. --out writes every step time, accuracy and interval as JSON (benchmarks/results/vs_trl*.json).

For transparency a second table shows how much of a step the earlier version
of this benchmark left out: grpo_edu's three logged phases (time/rollout +
time/scoring + time/update) and TRL's on_step_begin -> on_step_end, and the
median of (whole iteration - that span) per step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass

import torch


@dataclass
class Run:
    """One trainer's run on one seed; the lists hold one entry per timed step (all but the last)."""

    step_seconds: list[float]       # start of a step to the start of the next
    old_span_seconds: list[float]   # the part of each step the earlier benchmark timed
    accuracy: float                 # held-out greedy accuracy after training

    @property
    def outside_seconds(self) -> list[float]:
        return [whole - span for whole, span in zip(self.step_seconds, self.old_span_seconds)]


def intervals(starts: list[float], steps: int, where: str) -> list[float]:
    """Step times from the starts of `steps` steps: the N - 1 gaps between consecutive starts."""
    if len(starts) != steps:
        raise RuntimeError(f"{where} marked {len(starts)} step starts in {steps} steps: it no longer marks "
                           f"each step's start once; fix benchmarks/vs_trl.py's step clock")
    return [later - earlier for earlier, later in zip(starts, starts[1:])]


@contextlib.contextmanager
def stamped(module, name: str, starts: list[float]):
    """Replace module.name with a wrapper that appends a timestamp to `starts` on each call."""
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
        starts.append(time.perf_counter())
        return original(*args, **kwargs)

    setattr(module, name, wrapper)
    try:
        yield
    finally:
        setattr(module, name, original)


def _config(seed: int, args, directory: str, eval_size: int, engine: str | None = None):
    """The run's TrainConfig: --config's file with the benchmark's overrides, or the built-in settings."""
    from grpo_edu.config import TrainConfig

    overrides = [f"steps={args.steps}", f"seed={seed}", f"threads={args.threads}", f"eval_every={args.steps}",
                 f"eval_size={eval_size}", "checkpoint_every=0", "progress=false", f"output_dir={directory!r}"]
    beta, learning_rate = (args.beta, args.learning_rate) if args.config else (
        0.04 if args.beta is None else args.beta, 3e-4 if args.learning_rate is None else args.learning_rate)
    overrides += [f"beta={beta}"] if beta is not None else []
    overrides += [f"learning_rate={learning_rate}"] if learning_rate is not None else []
    overrides += [f"engine={engine!r}"] if engine else []
    overrides.append("advantage_std='sample'")    # TRL's convention (the bridge refuses the population std)
    return TrainConfig.from_toml(args.config or None, overrides)


def run_grpo_edu(seed: int, args, held_out, engine: str = "fused") -> Run:
    from grpo_edu.training import metrics, rollouts, trainer
    from grpo_edu.training.evaluation import evaluate

    starts: list[float] = []
    with tempfile.TemporaryDirectory() as directory, stamped(rollouts, "sample_prompts", starts):
        config = _config(seed, args, directory, len(held_out), engine)
        result = trainer.train(config, log=lambda _: None)
    step_seconds = intervals(starts, args.steps, "grpo_edu.training.trainer.train (rollouts.sample_prompts)")
    phases = [sum(m[f"time/{key}"] for key in metrics.TIME_SPLIT) for m in result.history]
    accuracy = evaluate(result.policy.eval(), result.tokenizer, held_out,
                        max_new_tokens=config.rollout.max_completion_length)["greedy_accuracy"]
    return Run(step_seconds, phases[:len(step_seconds)], accuracy)


def _step_clock():
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self):
            self.starts, self.ends = [], []

        def on_step_begin(self, *_, **__):
            self.starts.append(time.perf_counter())

        def on_step_end(self, *_, **__):
            self.ends.append(time.perf_counter())

    return StepClock()


def _trl_run(clock, args, policy, tokenizer, held_out, max_new_tokens: int) -> Run:
    from grpo_edu.training.evaluation import evaluate

    step_seconds = intervals(clock.starts, args.steps, "TRL's on_step_begin")
    old_spans = [end - start for start, end in zip(clock.starts, clock.ends)]
    accuracy = evaluate(policy.eval(), tokenizer, held_out, max_new_tokens=max_new_tokens)["greedy_accuracy"]
    return Run(step_seconds, old_spans[:len(step_seconds)], accuracy)


def run_trl(seed: int, args, held_out) -> Run:
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo_edu.environment import tasks
    from grpo_edu.policy.models import load_policy
    from grpo_edu.environment.rewards import accuracy_reward, format_reward

    clock = _step_clock()
    if args.config:   # every setting from the file, through the bridge (it refuses what TRL cannot reproduce)
        from grpo_edu.commands.trl_bridge import grpo_trainer
        with tempfile.TemporaryDirectory() as directory:
            config = _config(seed, args, directory, len(held_out))
            trl_trainer = grpo_trainer(config, callbacks=[clock])
            trl_trainer.remove_callback(PrinterCallback)
            trl_trainer.train()
        policy, tokenizer = trl_trainer.model, trl_trainer.processing_class
        return _trl_run(clock, args, policy, tokenizer, held_out, config.rollout.max_completion_length)

    policy, tokenizer = load_policy()
    train = tasks.make_dataset("arithmetic", n=10000, split="train", seed=0)
    dataset = Dataset.from_list([{"prompt": s["prompt"], "answer": s["answer"], "task": s["task"]} for s in train])

    with tempfile.TemporaryDirectory() as directory:
        config = GRPOConfig(
            output_dir=directory, max_steps=args.steps, seed=seed, use_cpu=True, bf16=False,
            per_device_train_batch_size=16 * 8, num_generations=8, max_completion_length=16,
            learning_rate=3e-4 if args.learning_rate is None else args.learning_rate, lr_scheduler_type="cosine", warmup_steps=0, weight_decay=0.0,
            adam_beta1=0.9, adam_beta2=0.99, max_grad_norm=1.0, beta=0.04 if args.beta is None else args.beta, epsilon=0.2,
            loss_type="grpo", scale_rewards="group", temperature=1.0, top_k=0, top_p=1.0,
            use_bias_correction_kl=False,    # TRL 1.16's default True weights the KL by the ratio: not R1's loss
            reward_weights=[1.0, 0.5], report_to="none", save_strategy="no", logging_strategy="no",
            disable_tqdm=True, dataloader_num_workers=0)
        trl_trainer = GRPOTrainer(model=policy, reward_funcs=[accuracy_reward, format_reward],
                                  args=config, train_dataset=dataset, processing_class=tokenizer,
                                  callbacks=[clock])
        trl_trainer.remove_callback(PrinterCallback)   # it prints train()'s closing metrics into our table
        trl_trainer.train()
    return _trl_run(clock, args, policy, tokenizer, held_out, 16)


TRAINERS = {
    "grpo_edu": run_grpo_edu,
    "grpo_edu (transformers forward)": lambda seed, args, held_out: run_grpo_edu(seed, args, held_out,
                                                                                engine="hf"),
    "TRL GRPOTrainer": run_trl,
}
OLD_SPANS = {"grpo_edu": "rollout + scoring + update", "grpo_edu (transformers forward)": "rollout + scoring + update",
             "TRL GRPOTrainer": "on_step_begin -> on_step_end"}


def speed_vs_trl(runs: list[Run], trl: list[Run], confidence: float = 0.95) -> dict:
    """A trainer's steps per second as a multiple of TRL's, paired by seed: per seed the ratio of
    TRL's median step time to the trainer's; their geometric mean and the paired t interval of the
    log ratios (paired_seeds on log medians), turned back into ratios."""
    from grpo_edu.algorithm.statistics import paired_seeds

    ours = [math.log(statistics.median(run.step_seconds)) for run in runs]
    theirs = [math.log(statistics.median(run.step_seconds)) for run in trl]
    per_seed = [math.exp(t - o) for t, o in zip(theirs, ours)]
    if len(runs) < 2:   # one seed: its ratio, and no interval
        return {"ratio": per_seed[0], "low": None, "high": None, "per_seed": per_seed, "method": "one seed: no interval"}
    verdict = paired_seeds(theirs, ours, confidence)
    return {"ratio": math.exp(verdict.difference), "low": math.exp(verdict.low), "high": math.exp(verdict.high),
            "per_seed": per_seed, "method": verdict.method}


def machine() -> dict:
    """What ran the benchmark: torch, the kernels it chose, and the CPU (its model and whether it has
    AVX-512, from /proc/cpuinfo where there is one)."""
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        info = ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), None)
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu": model, "avx512": " avx512f" in info, "cores": os.cpu_count()}


def markdown_rows(record: dict, setting: str) -> list[str]:
    """docs/training.md's rows for one results file (--out): per trainer, its median s/step pooled over
    seeds, its speed against TRL with the 95% interval over seeds, and its held-out accuracy per seed."""
    rows = []
    for name, runs in record["runs"].items():
        median = statistics.median(value for run in runs for value in run["step_seconds"])
        speed = record["speed_vs_trl"][name]
        interval = f"[{speed['low']:.2f}, {speed['high']:.2f}]" if speed["low"] is not None else "(one seed)"
        accuracies = [run["accuracy"] for run in runs]
        rows.append(f"| {setting} | {name} | {median:.3f} | {speed['ratio']:.2f}x {interval} | "
                    f"{' / '.join(f'{a:.3f}' for a in accuracies)} ({statistics.mean(accuracies):.3f}) |")
    return rows


def rotated(names: list[str], turn: int) -> list[str]:
    """The trainers' order for the seed at index `turn`: A B C, then B C A, then C A B, ..."""
    shift = turn % len(names)
    return names[shift:] + names[:shift]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200, help="training steps per run (>= 2: the last is not timed)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--eval-size", type=int, default=256)
    parser.add_argument("--beta", type=float, default=None,
                        help="the KL coefficient of both trainers (default 0.04, or the --config file's)")
    parser.add_argument("--learning-rate", type=float, default=None, help="both trainers' peak learning rate "
                        "(default 3e-4, or the --config file's; make train's configs/cpu-first-run.toml: "
                        "--beta 0 --learning-rate 2.5e-4)")
    parser.add_argument("--config", default=None, help="a config file: every setting from it (see above)")
    parser.add_argument("--out", default=None, help="write every step time, accuracy and interval here (JSON)")
    args = parser.parse_args(argv)
    if args.learning_rate is not None and not args.learning_rate > 0:
        parser.error(f"--learning-rate: expected a rate > 0, got {args.learning_rate}")
    if args.beta is not None and args.beta < 0:
        parser.error(f"--beta: expected a coefficient >= 0, got {args.beta}")
    if args.steps < 2:
        parser.error(f"--steps must be >= 2 (a step is timed to the start of the next), got {args.steps}")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds: expected distinct seeds (each pairs the three trainers), got {args.seeds}")
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)

    from grpo_edu.environment import tasks
    from grpo_edu.policy.models import load_policy, policy_source
    from grpo_edu.training.evaluation import evaluate

    with tempfile.TemporaryDirectory() as directory:
        settings = _config(args.seeds[0], args, directory, args.eval_size)
    task, model, length = settings.run.task, settings.run.model, settings.rollout.max_completion_length
    held_out = tasks.make_dataset(task, n=args.eval_size, split="test", seed=0)
    policy, tokenizer = load_policy(policy_source(model))
    start = evaluate(policy, tokenizer, held_out, max_new_tokens=length)["greedy_accuracy"]
    names = list(TRAINERS)
    print(f"{args.config or 'built-in settings'}: task {task}, policy {model}; {args.steps} steps, seeds {args.seeds}, "
          f"{args.threads} threads, beta {settings.loss.beta}, lr {settings.optimisation.learning_rate:g}; "
          f"held-out greedy accuracy at start {start:.4f} ({len(held_out)} problems)")
    print("order rotates from seed to seed: " + "; ".join(
        f"seed {seed}: {', '.join(rotated(names, turn))}" for turn, seed in enumerate(args.seeds)))
    print(f"s/step: start of a step to the start of the next (the last step of each run is not timed), "
          f"median of {args.steps - 1} x {len(args.seeds)} steps")

    runs: dict[str, list[Run]] = {name: [] for name in names}
    for turn, seed in enumerate(args.seeds):
        for name in rotated(names, turn):
            torch.manual_seed(seed)
            run = TRAINERS[name](seed, args, held_out)
            runs[name].append(run)
            print(f"  seed {seed}, {name}: {statistics.median(run.step_seconds):.3f} s/step, "
                  f"accuracy {run.accuracy:.4f}", file=sys.stderr)

    def pooled(name: str, attribute: str) -> list[float]:
        return [value for run in runs[name] for value in getattr(run, attribute)]

    trl = statistics.median(pooled("TRL GRPOTrainer", "step_seconds"))
    speed = {name: speed_vs_trl(runs[name], runs["TRL GRPOTrainer"]) for name in names}
    print(f"\n{'trainer':<32}{'s/step (median)':>17}{'steps/s':>9}{'vs TRL':>8}  {'95% over seeds':<16} "
          f"held-out accuracy per seed (mean)")
    for name in names:
        median = statistics.median(pooled(name, "step_seconds"))
        accuracies = [run.accuracy for run in runs[name]]
        per_seed = " ".join(f"{a:.4f}" for a in accuracies)
        low, high = speed[name]["low"], speed[name]["high"]
        print(f"{name:<32}{median:>17.3f}{1 / median:>9.2f}{trl / median:>7.2f}x  {f'[{low:.2f}, {high:.2f}]' if low is not None else '(one seed)':<16} "
              f"{per_seed} ({statistics.mean(accuracies):.4f})")
    if args.out:
        record = {"settings": {"config": args.config, "task": task, "model": model, "steps": args.steps,
                               "seeds": args.seeds, "threads": args.threads, "beta": settings.loss.beta,
                               "learning_rate": settings.optimisation.learning_rate,
                               "eval_size": len(held_out), "start_accuracy": start},
                  "machine": machine(),
                  "speed_vs_trl": speed,
                  "runs": {name: [{"seed": seed, "accuracy": run.accuracy, "step_seconds": run.step_seconds}
                                  for seed, run in zip(args.seeds, runs[name])] for name in names}}
        with open(args.out, "w") as file:
            json.dump(record, file, indent=1)
        print(f"wrote {args.out}")

    print("\nwhat the earlier span left out, per step (medians)")
    print(f"{'trainer':<32}{'earlier span':<30}{'span s':>8}{'outside s':>11}{'share':>8}")
    for name in names:
        wholes, outside = pooled(name, "step_seconds"), pooled(name, "outside_seconds")
        share = statistics.median(out / whole for out, whole in zip(outside, wholes))
        print(f"{name:<32}{OLD_SPANS[name]:<30}{statistics.median(pooled(name, 'old_span_seconds')):>8.3f}"
              f"{statistics.median(outside):>11.4f}{share:>8.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
