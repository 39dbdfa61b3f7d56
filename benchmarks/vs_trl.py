"""grpo_edu's trainer against TRL's GRPOTrainer: same policy, task, rewards, settings.

    python benchmarks/vs_trl.py [--steps 200] [--seeds 0 1 2] [--threads 2] [--beta 0.04]

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
same problems.

For transparency a second table shows how much of a step the earlier version
of this benchmark left out: grpo_edu's three logged phases (time/rollout +
time/scoring + time/update) and TRL's on_step_begin -> on_step_end, and the
median of (whole iteration - that span) per step.
"""

from __future__ import annotations

import argparse
import contextlib
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


def run_grpo_edu(seed: int, args, held_out, engine: str = "fused") -> Run:
    from grpo_edu.training import metrics, rollouts, trainer
    from grpo_edu.config import TrainConfig
    from grpo_edu.training.evaluation import evaluate

    starts: list[float] = []
    with tempfile.TemporaryDirectory() as directory, stamped(rollouts, "sample_prompts", starts):
        config = TrainConfig(steps=args.steps, seed=seed, threads=args.threads, advantage_std="sample",
                             eval_every=args.steps, eval_size=len(held_out), checkpoint_every=0,
                             progress=False, output_dir=directory, engine=engine, beta=args.beta,
                             learning_rate=args.learning_rate)
        result = trainer.train(config, log=lambda _: None)
    step_seconds = intervals(starts, args.steps, "grpo_edu.training.trainer.train (rollouts.sample_prompts)")
    phases = [sum(m[f"time/{key}"] for key in metrics.TIME_SPLIT) for m in result.history]
    accuracy = evaluate(result.policy.eval(), result.tokenizer, held_out)["greedy_accuracy"]
    return Run(step_seconds, phases[:len(step_seconds)], accuracy)


def run_trl(seed: int, args, held_out) -> Run:
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo_edu.environment import tasks
    from grpo_edu.policy.models import load_policy
    from grpo_edu.training.evaluation import evaluate
    from grpo_edu.environment.rewards import accuracy_reward, format_reward

    policy, tokenizer = load_policy()
    train = tasks.make_dataset("arithmetic", n=10000, split="train", seed=0)
    dataset = Dataset.from_list([{"prompt": s["prompt"], "answer": s["answer"], "task": s["task"]} for s in train])

    class StepClock(TrainerCallback):
        def __init__(self):
            self.starts, self.ends = [], []

        def on_step_begin(self, *_, **__):
            self.starts.append(time.perf_counter())

        def on_step_end(self, *_, **__):
            self.ends.append(time.perf_counter())

    clock = StepClock()
    with tempfile.TemporaryDirectory() as directory:
        config = GRPOConfig(
            output_dir=directory, max_steps=args.steps, seed=seed, use_cpu=True, bf16=False,
            per_device_train_batch_size=16 * 8, num_generations=8, max_completion_length=16,
            learning_rate=args.learning_rate, lr_scheduler_type="cosine", warmup_steps=0, weight_decay=0.0,
            adam_beta1=0.9, adam_beta2=0.99, max_grad_norm=1.0, beta=args.beta, epsilon=0.2,
            loss_type="grpo", scale_rewards="group", temperature=1.0, top_k=0, top_p=1.0,
            use_bias_correction_kl=False,    # TRL 1.16's default True weights the KL by the ratio: not R1's loss
            reward_weights=[1.0, 0.5], report_to="none", save_strategy="no", logging_strategy="no",
            disable_tqdm=True, dataloader_num_workers=0)
        trl_trainer = GRPOTrainer(model=policy, reward_funcs=[accuracy_reward, format_reward],
                                  args=config, train_dataset=dataset, processing_class=tokenizer,
                                  callbacks=[clock])
        trl_trainer.remove_callback(PrinterCallback)   # it prints train()'s closing metrics into our table
        trl_trainer.train()
    step_seconds = intervals(clock.starts, args.steps, "TRL's on_step_begin")
    old_spans = [end - start for start, end in zip(clock.starts, clock.ends)]
    accuracy = evaluate(policy.eval(), tokenizer, held_out)["greedy_accuracy"]
    return Run(step_seconds, old_spans[:len(step_seconds)], accuracy)


TRAINERS = {
    "grpo_edu": run_grpo_edu,
    "grpo_edu (transformers forward)": lambda seed, args, held_out: run_grpo_edu(seed, args, held_out,
                                                                                engine="hf"),
    "TRL GRPOTrainer": run_trl,
}
OLD_SPANS = {"grpo_edu": "rollout + scoring + update", "grpo_edu (transformers forward)": "rollout + scoring + update",
             "TRL GRPOTrainer": "on_step_begin -> on_step_end"}


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
    parser.add_argument("--beta", type=float, default=0.04, help="the KL coefficient of both trainers")
    parser.add_argument("--learning-rate", type=float, default=3e-4, help="both trainers' peak learning rate "
                        "(make train's configs/cpu-first-run.toml: --beta 0 --learning-rate 2.5e-4)")
    args = parser.parse_args(argv)
    if not args.learning_rate > 0:
        parser.error(f"--learning-rate: expected a rate > 0, got {args.learning_rate}")
    if args.beta < 0:
        parser.error(f"--beta: expected a coefficient >= 0, got {args.beta}")
    if args.steps < 2:
        parser.error(f"--steps must be >= 2 (a step is timed to the start of the next), got {args.steps}")
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)

    from grpo_edu.environment import tasks
    from grpo_edu.policy.models import load_policy
    from grpo_edu.training.evaluation import evaluate

    held_out = tasks.make_dataset("arithmetic", n=args.eval_size, split="test", seed=0)
    policy, tokenizer = load_policy()
    start = evaluate(policy, tokenizer, held_out)["greedy_accuracy"]
    names = list(TRAINERS)
    print(f"{args.steps} steps, seeds {args.seeds}, {args.threads} threads, beta {args.beta}, "
          f"lr {args.learning_rate:g}; held-out greedy "
          f"accuracy at start "
          f"{start:.4f} ({len(held_out)} problems)")
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
    print(f"\n{'trainer':<32}{'s/step (median)':>17}{'steps/s':>9}{'vs TRL':>8}   held-out accuracy per seed (mean)")
    for name in names:
        median = statistics.median(pooled(name, "step_seconds"))
        accuracies = [run.accuracy for run in runs[name]]
        per_seed = " ".join(f"{a:.4f}" for a in accuracies)
        print(f"{name:<32}{median:>17.3f}{1 / median:>9.2f}{trl / median:>7.2f}x   {per_seed} "
              f"({statistics.mean(accuracies):.4f})")

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
