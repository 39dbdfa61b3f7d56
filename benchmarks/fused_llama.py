"""The fused path against transformers, phase by phase, on one training step's data.

    python benchmarks/fused_llama.py [--repeats 30] [--threads 2]

From the committed starting policy: 16 prompts of the arithmetic task, G = 8
completions each (at most 16 tokens), as one trainer step. Times, as medians over
`repeats` rounds; in each round every phase runs once with each implementation,
one right after the other, and which goes first alternates from round to round
(so that a shared machine's drift, and going first after another phase, fall
on both alike). Each time spans the same call for both:

    sample       128 completions: transformers' generate (HFEngine) vs FusedEngine
    reference    completion log-probs without gradients (the reference's pass)
    policy       completion log-probs, forward and backward (the update's pass)

and the token positions each forward computes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from grpo_edu.environment import tasks
    from grpo_edu.sampling import fused_llama
    from grpo_edu.algorithm.logprobs import completion_logprobs
    from grpo_edu.policy.models import load_policy
    from grpo_edu.sampling.rollout import HFEngine, SamplingParams

    policy, tokenizer = load_policy()
    samples = tasks.make_dataset("arithmetic", n=16, split="train", seed=0)
    prompts = tokenizer([s["prompt"] for s in samples], return_tensors="pt", padding=True, add_special_tokens=False)
    sampling = SamplingParams(num_generations=8, max_new_tokens=16)
    torch.manual_seed(0)
    rollout = fused_llama.FusedEngine(policy, tokenizer).generate(prompts["input_ids"], prompts["attention_mask"],
                                                                  sampling)
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
    mask = torch.cat([rollout.prompt_mask, rollout.completion_mask.long()], 1)
    completion_mask = rollout.completion_mask

    def logprobs(fused: bool):
        if fused:
            return fused_llama.completion_logprobs(policy, ids, mask, completion_mask, group_size=8)
        return completion_logprobs(policy, ids, mask, completion_mask)

    def reference(fused):
        with torch.no_grad():
            logprobs(fused)

    def update(fused):
        policy.zero_grad(set_to_none=True)
        logprobs(fused).sum().backward()

    engines = {False: HFEngine(policy, tokenizer), True: fused_llama.FusedEngine(policy, tokenizer)}
    phases = {
        "sample": lambda fused: engines[fused].generate(prompts["input_ids"], prompts["attention_mask"], sampling),
        "reference": reference,
        "policy": update,
    }
    times = {(phase, fused): [] for phase in phases for fused in (False, True)}
    for _ in range(3):                                      # warm-up
        for phase, run in phases.items():
            run(False), run(True)
    for repeat in range(args.repeats):
        order = (False, True) if repeat % 2 == 0 else (True, False)
        for phase, run in phases.items():
            for fused in order:
                times[phase, fused].append(timed(lambda: run(fused)))

    print(f"one step's data: {ids.shape[0]} completions, {int(completion_mask.sum())} completion tokens; "
          f"{args.threads} threads, median of {args.repeats} rounds (which goes first alternates)")
    packed = int(prompts["attention_mask"].sum() + completion_mask.sum())
    print(f"token positions per forward: transformers {ids.numel()} ({ids.shape[0]} x {ids.shape[1]}), "
          f"fused {packed}\n")
    print(f"{'phase':<12}{'transformers ms':>17}{'fused ms':>10}{'speed-up':>10}")
    total = {False: 0.0, True: 0.0}
    for phase in phases:
        plain, fused = (1000 * statistics.median(times[phase, f]) for f in (False, True))
        total[False] += plain
        total[True] += fused
        print(f"{phase:<12}{plain:>17.1f}{fused:>10.1f}{plain / fused:>9.2f}x")
    print(f"{'sum':<12}{total[False]:>17.1f}{total[True]:>10.1f}{total[False] / total[True]:>9.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
