"""grpo_edu's trainer against TRL's GRPOTrainer: same policy, task, rewards, settings.

    python benchmarks/vs_trl.py [--steps 200] [--seeds 0 1 2] [--threads 2]

Both start from the committed tiny policy and train on the arithmetic task with
the same reward functions (grpo_edu.rewards, which have TRL's signature), B = 16
prompts x G = 8 completions per optimizer step, lr 3e-4 with cosine decay to 0
over the run, beta 0.04 (k3, without TRL's bias-corrected KL, so both minimise the
same loss), epsilon 0.2, loss_type "grpo", temperature 1, sample-std advantages
(TRL's convention), on the CPU with the same thread count.
Three trainers take turns, seed by seed: grpo_edu's default (the fused forward
and sampler, grpo_edu.fused_llama), grpo_edu with transformers' forward and
generate (fused_llama = false: TRL's model code), and TRL. Prints each one's
median seconds per step (over all seeds' steps) and held-out greedy accuracy
after N steps per seed, measured by the same function on the same problems.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings

import torch


def run_grpo_edu(args, held_out, fused_llama: bool = True) -> tuple[list[float], float]:
    from grpo_edu import trainer
    from grpo_edu.config import TrainConfig
    from grpo_edu.pretrain import evaluate

    with tempfile.TemporaryDirectory() as directory:
        config = TrainConfig(steps=args.steps, seed=args.seed, threads=args.threads, advantage_std="sample",
                             eval_every=args.steps, eval_size=len(held_out), checkpoint_every=0,
                             progress=False, output_dir=directory, fused_llama=fused_llama)
        result = trainer.train(config, log=lambda _: None)
    times = [sum(m[f"time/{key}"] for key in trainer.TIME_SPLIT) for m in result.history]
    accuracy = evaluate(result.policy.eval(), result.tokenizer, held_out)["greedy_accuracy"]
    return times, accuracy


def run_trl(args, held_out) -> tuple[list[float], float]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo_edu import tasks
    from grpo_edu.models import load_policy
    from grpo_edu.pretrain import evaluate
    from grpo_edu.rewards import accuracy_reward, format_reward

    policy, tokenizer = load_policy()
    train = tasks.make_dataset("arithmetic", n=10000, split="train", seed=0)
    dataset = Dataset.from_list([{"prompt": s["prompt"], "answer": s["answer"], "task": s["task"]} for s in train])

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times, self.last = [], None

        def on_step_begin(self, *_, **__):
            self.last = time.perf_counter()

        def on_step_end(self, *_, **__):
            self.times.append(time.perf_counter() - self.last)

    timer = StepTimer()
    with tempfile.TemporaryDirectory() as directory:
        config = GRPOConfig(
            output_dir=directory, max_steps=args.steps, seed=args.seed, use_cpu=True, bf16=False,
            per_device_train_batch_size=16 * 8, num_generations=8, max_completion_length=16,
            learning_rate=3e-4, lr_scheduler_type="cosine", warmup_steps=0, weight_decay=0.0,
            adam_beta1=0.9, adam_beta2=0.99, max_grad_norm=1.0, beta=0.04, epsilon=0.2,
            loss_type="grpo", scale_rewards="group", temperature=1.0, top_k=0, top_p=1.0,
            use_bias_correction_kl=False,    # TRL 1.16's default True weights the KL by the ratio: not R1's loss
            reward_weights=[1.0, 0.5], report_to="none", save_strategy="no", logging_strategy="no",
            disable_tqdm=True, dataloader_num_workers=0)
        trl_trainer = GRPOTrainer(model=policy, reward_funcs=[accuracy_reward, format_reward],
                                  args=config, train_dataset=dataset, processing_class=tokenizer,
                                  callbacks=[timer])
        trl_trainer.train()
    accuracy = evaluate(policy.eval(), tokenizer, held_out)["greedy_accuracy"]
    return timer.times, accuracy


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--eval-size", type=int, default=256)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)

    from grpo_edu import tasks
    from grpo_edu.models import load_policy
    from grpo_edu.pretrain import evaluate

    held_out = tasks.make_dataset("arithmetic", n=args.eval_size, split="test", seed=0)
    policy, tokenizer = load_policy()
    start = evaluate(policy, tokenizer, held_out)["greedy_accuracy"]
    print(f"{args.steps} steps, seeds {args.seeds}, {args.threads} threads; held-out greedy accuracy at start "
          f"{start:.4f} ({len(held_out)} problems)")
    runs = {"grpo_edu": run_grpo_edu,
            "grpo_edu (transformers forward)": lambda a, h: run_grpo_edu(a, h, fused_llama=False),
            "TRL GRPOTrainer": run_trl}
    # The trainers take turns seed by seed, so a change in the machine's speed
    # (a shared host) falls on all of them alike; step times are pooled over seeds.
    times = {name: [] for name in runs}
    accuracies = {name: [] for name in runs}
    for seed in args.seeds:
        args.seed = seed
        for name, run in runs.items():
            torch.manual_seed(seed)
            step_times, accuracy = run(args, held_out)
            times[name] += step_times
            accuracies[name].append(accuracy)
            print(f"  seed {seed}, {name}: {statistics.median(step_times):.3f} s/step, accuracy {accuracy:.4f}",
                  file=sys.stderr)
    trl = statistics.median(times["TRL GRPOTrainer"])
    print(f"\n{'trainer':<32}{'s/step (median)':>17}{'steps/s':>9}{'vs TRL':>8}   held-out accuracy per seed (mean)")
    for name in runs:
        median = statistics.median(times[name])
        per_seed = " ".join(f"{a:.4f}" for a in accuracies[name])
        print(f"{name:<32}{median:>17.3f}{1 / median:>9.2f}{trl / median:>7.2f}x   {per_seed} "
              f"({statistics.mean(accuracies[name]):.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
