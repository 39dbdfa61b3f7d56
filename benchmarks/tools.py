"""Chapter 13's measurement: does a policy that may call a calculator learn to, and does it beat
one that may not? configs/cpu-tools.toml (two-digit products, the committed tool policy
grpo_edu/assets/tiny-multiply-start, max_turns 2, 100 steps), three ways, 3 seeds each:

    tool      the config as it is: the policy's `[47*85]` is answered `=3995` by
              grpo_edu.training.episodes.Calculator, and the answer is context, never trained on
    no_tool   environment = "": the same policy, single-turn; a call is answered by nobody (the
              policy writes what follows itself), so only products in the head earn reward
    leak      the tool, with the environment's tokens in the loss, the KL and the ratio
              (grpo_edu.lab.faults.Faults(env_tokens_in_loss=True)): the failure on purpose

    .venv/bin/python benchmarks/tools.py [--variants tool no_tool leak] [--seeds 0 1 2]
                                         [--steps 100] [--out FILE]
    .venv/bin/python benchmarks/tools.py --check FILE [--steps 10] [--runs tool:0 ...]

Each run's policy is measured before (once: the same starting policy for all) and after, on
all 816 held-out problems (HELD_OUT), the way the run itself plays them (episodes with the
calculator where it has one, single-turn where not):
    greedy_accuracy, tool_call_rate, mean_turns   greedy decoding
    sample_accuracy, sample_tool_call_rate         4 samples per problem at temperature 1
and once more with the tool taken away (single-turn greedy, "unaided"): its accuracy, and the
share of completions in which the policy writes a result itself between its call's `]` and
`</think>`, where the calculator's answer would stand ("self_answer_rate": a number of three
or more digits, the size of every product of two two-digit numbers; a stray digit among
repeated brackets, `[51*96]]]]]]5`, is not a result), with the share of those results that
are the product; and "answer_logp", the mean log-prob per token the policy gives the
calculator's answer (`=3995` after `<think>[47*85]`, teacher-forced): what a leak teaches.
Each measurement also keeps every held-out problem's outcomes, in order ("greedy_correct":
1 right, 0 wrong; "sample_correct": right samples of 4), for comparisons paired over the same
problems, and the first 3 unaided completions as text ("unaided_examples"). The file's
"verdicts" are the paired comparisons chapter 13 prints (`verdicts`).
From the run's own metrics: its training accuracy, KL, sampler gap and environment tokens per
step, and the doctor's findings on them.

The first form writes FILE (default benchmarks/results/tools.json), after every run. Run it
under the book's pinned kernels (grpo_edu.runtime.numerics), as `grpo-edu book run` runs chapters:
chapter 13 reads the file. The second re-trains the named runs (variant:seed; all when not
given) for the first --steps steps and compares every kept per-step number with FILE's,
exactly (tests/test_tools.py runs it, pinned, for one run).
"""

from __future__ import annotations

import json
import platform
import re
import tempfile
import time
from pathlib import Path

import torch
import variant_grid

from grpo_edu.algorithm.statistics import by_seed, mcnemar, paired_seeds
from grpo_edu.environment import rewards, tasks
from grpo_edu.config import TrainConfig
from grpo_edu.doctor.diagnose import diagnose
from grpo_edu.training.episodes import writers
from grpo_edu.training.evaluation import evaluate
from grpo_edu.lab.faults import NONE, Faults
from grpo_edu.policy.models import generate_completions, load_policy, policy_source

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "cpu-tools.toml"
CALCULATOR = "grpo_edu.training.episodes:Calculator"
OUT = Path(__file__).parent / "results" / "tools.json"
SETTINGS = {"checkpoint_every": 0, "progress": False}
VARIANTS = {"tool": {}, "no_tool": {"environment": ""}, "leak": {}}
FAULTS = {"leak": Faults(env_tokens_in_loss=True)}
HELD_OUT = 816          # every held-out multiply problem
SAMPLES = 4             # per problem at temperature 1
EXAMPLES = 3            # unaided completions kept as text (the first held-out problems'), for the eye
# What the file keeps of each step (absent from a step: None).
KEPT = ("reward/accuracy", "reward/mean", "kl", "entropy", "grad_norm", "sampler_gap/mean_abs",
        "episode/turns", "episode/env_tokens", "completion_length/mean", "zero_std_groups")


def config_for(variant: str, seed: int, steps: int, output_dir: str) -> TrainConfig:
    base = TrainConfig.from_toml(CONFIG).to_dict()
    return TrainConfig.from_dict({**base, **SETTINGS, "steps": steps, "seed": seed, "output_dir": output_dir,
                                  **VARIANTS[variant]})


# A result after the call, before </think>: the first number of three or more digits (every
# product of two two-digit numbers has three or four).
SELF_ANSWER = re.compile(r"\][^<\d]*(?:\d{1,2}[^<\d]+)*(\d{3,})[^<]*</think>")


def self_answers(texts: list[str], samples: list[dict]) -> dict[str, float]:
    """Of single-turn completions: the share that write a result themselves after a call
    (a number of three or more digits between its `]` and `</think>`, where the calculator's
    answer would stand), and the share of those whose first such number is the product."""
    written = [(SELF_ANSWER.search(text), sample) for text, sample in zip(texts, samples) if "[" in text]
    written = [(match, sample) for match, sample in written if match]
    right = sum(match.group(1) == sample["answer"] for match, sample in written)
    return {"self_answer_rate": len(written) / len(texts), "self_answers_right": right / len(written) if written else 0.0}


@torch.no_grad()


def answer_logp(model, tokenizer, samples: list[dict]) -> float:
    """The mean log-prob per token the policy gives the calculator's answer in each sample's
    calling solution, teacher-forced (prompt, the call, then the answer's tokens scored)."""
    total, count = 0.0, 0
    for sample in samples:
        pieces = writers(sample["solution"], CALCULATOR, sample)
        context = sample["prompt"] + "".join(piece for piece, _ in pieces[:1])
        answer = pieces[1][0]
        ids = tokenizer(context + answer, return_tensors="pt", add_special_tokens=False)["input_ids"]
        n = len(tokenizer(answer, add_special_tokens=False)["input_ids"])
        logp = model(ids).logits[0, :-1].float().log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
        total, count = total + float(logp[-n:].sum()), count + n
    return total / count


def measure(model, tokenizer, config: TrainConfig) -> dict:
    """The held-out figures of `model` as `config` plays (see the module's docstring)."""
    held_out = tasks.make_dataset("multiply", HELD_OUT, "test", seed=0)
    played = evaluate(model, tokenizer, held_out, pass_k=SAMPLES, max_new_tokens=config.rollout.max_completion_length,
                      environment=config.rollout.environment, max_turns=config.rollout.max_turns, per_problem=True)
    texts = [group[0] for group in generate_completions(model, tokenizer, [s["prompt"] for s in held_out],
                                                        max_new_tokens=config.rollout.max_completion_length)]
    if not config.rollout.environment:   # a call in a single-turn completion: its text holds "["
        played["tool_call_rate"] = sum("[" in text for text in texts) / len(texts)
    figures = {key: played.get(key) for key in ("greedy_accuracy", "tool_call_rate", "mean_turns",
                                                 "sample_accuracy", "sample_tool_call_rate",
                                                 "greedy_correct", "sample_correct")}
    unaided = rewards.accuracy_reward(texts, answer=[s["answer"] for s in held_out], task=["multiply"] * len(texts))
    figures.update(unaided_accuracy=sum(unaided) / len(unaided), **self_answers(texts, held_out),
                   unaided_examples=[held_out[i]["prompt"].splitlines()[-1] + texts[i] for i in range(EXAMPLES)],
                   answer_logp=answer_logp(model, tokenizer, held_out))
    return figures


def run(variant: str, seed: int, steps: int, stop_after: int | None = None) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        config = config_for(variant, seed, steps, directory)
        started = time.perf_counter()
        result = FAULTS.get(variant, NONE).train(config, log=lambda line: None, stop_after=stop_after)
        seconds = time.perf_counter() - started
    history = result.history
    out = {"variant": variant, "seed": seed, "seconds": round(seconds, 1),
           "eval": [[m["step"], m["eval/greedy_accuracy"]] for m in history if "eval/greedy_accuracy" in m],
           "steps": {key: [m.get(key) for m in history] for key in KEPT}}
    if stop_after is None:
        out["after"] = measure(result.policy, result.tokenizer, config)
        out["findings"] = [finding.detector for finding in diagnose(history, config.to_dict())]
    return out


def verdicts(payload: dict) -> dict:
    """The paired comparisons chapter 13 prints, from the file's runs: the tool run against its
    start and against the leak, paired over seeds (Student's t), for greedy and sampled accuracy
    and the sampled tool-call rate; and, within each seed, the tool run against the leak over
    the same held-out problems (McNemar's exact test of the greedy outcomes)."""
    runs, start = payload["runs"], payload["before"]["tool"]
    seeds = sorted({r["seed"] for r in runs if r["variant"] == "tool"} & {r["seed"] for r in runs if r["variant"] == "leak"})
    if len(seeds) < 2:
        return {}
    after = {v: by_seed([r for r in runs if r["seed"] in seeds], "after", variant=v) for v in ("tool", "leak")}
    out = {}
    for key in ("greedy_accuracy", "sample_accuracy", "sample_tool_call_rate"):
        tool = [m[key] for m in after["tool"]]
        for other, values in (("start", [start[key]] * len(tool)), ("leak", [m[key] for m in after["leak"]])):
            verdict = paired_seeds(tool, values)
            out[f"tool - {other}, {key}"] = {"difference": verdict.difference, "low": verdict.low,
                                             "high": verdict.high, "method": verdict.method,
                                             "words": verdict.words("tool", other)}
    for seed, tool, leak in zip(seeds, after["tool"], after["leak"]):
        out[f"tool - leak, greedy_correct, seed {seed}"] = {
            **mcnemar(tool["greedy_correct"], leak["greedy_correct"]), "method": "McNemar's exact test"}
    return out


def parse_runs(values: list[str] | None, variants, seeds) -> list[tuple[str, int]]:
    return variant_grid.parse_runs(values, variants, seeds, VARIANTS)


def write(args) -> None:
    out = Path(args.out)
    model, tokenizer = load_policy(policy_source(TrainConfig.from_toml(CONFIG).run.model))
    before = {variant: measure(model, tokenizer, config_for(variant, 0, args.steps, "unused"))
              for variant in ("tool", "no_tool")}
    runs = []
    for variant, seed in parse_runs(args.runs, args.variants, args.seeds):
        runs.append(run(variant, seed, args.steps))
        last = runs[-1]
        print(f"{variant:<8} seed {seed}: greedy accuracy {last['after']['greedy_accuracy']:.3f}, sampled "
              f"{last['after']['sample_accuracy']:.3f}, tool calls {last['after']['tool_call_rate']:.3f}, "
              f"findings {last['findings']} in {last['seconds']:.0f} s", flush=True)
        payload = {"steps": args.steps, "seeds": args.seeds, "variants": args.variants, "config": CONFIG.name,
                   "held_out": HELD_OUT, "samples": SAMPLES, "machine": platform.machine(),
                   "before": before, "runs": runs}
        payload["verdicts"] = verdicts(payload)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(payload, separators=(",", ":")) + "\n")   # after every run: a stop loses one
    print(f"wrote {out}")


def differences(got: dict, want: dict, n: int) -> list[str]:
    return variant_grid.differences(got, want, n, KEPT)


def main() -> None:
    args = variant_grid.arguments(__doc__, VARIANTS, OUT, steps=100, check_steps=10, example="tool:0")
    if args.check:
        variant_grid.check(args, VARIANTS, KEPT, run)
    else:
        write(args)


if __name__ == "__main__":
    main()
