"""What a digitsum policy does, depth by depth (chapter 9, benchmarks/reasoning.py): the
measurements behind "what GRPO teaches a model".

    complete            completions of prompts with the fused sampler: greedy, or k sampled at
                        temperature 1 from a seeded stream (the caller's untouched)
    behaviour           per depth: accuracy with the format forced (direct, worked) and free,
                        greedy and sampled; the free completions' format shares, length (mean,
                        spread) and checks (written, on a wrong value, fixed to a right answer)
    pass_at_k_curve     pass@k for k = 1..n from n samples per problem (Chen et al., 2021's
                        unbiased estimator, grpo_edu.training.evaluation.pass_at_k), per problem
                        counts kept
    precondition_table  the behaviour as a markdown table (a model card's, the results file's)

Forcing a format writes its first tokens after the prompt and lets the policy go on: direct is
"<think></think>" (no working), worked is "<think>a" (the first step's letter). The free
completions are the policy's own choice of format.
"""

from __future__ import annotations

import statistics

import torch

from grpo_edu.environment.digitsum import FORMATS, LETTERS, check_events, held_out_by_depth, mixture_of, read_format
from grpo_edu.environment.rewards import accuracy_reward
from grpo_edu.policy.models import THINK_CLOSE, THINK_OPEN
from grpo_edu.sampling.fused_llama import FusedEngine
from grpo_edu.sampling.rollout import SamplingParams
from grpo_edu.training.evaluation import pass_at_k

FORCED = {"direct": THINK_OPEN + THINK_CLOSE, "worked": THINK_OPEN + LETTERS[0], "free": ""}
MAX_NEW_TOKENS = 56   # a worked chain of depth 13: <think>, 39, </think>, \boxed{, digit, }, end = 45 tokens


@torch.inference_mode()
def complete(model, tokenizer, prompts: list[str], *, k: int = 1, greedy: bool = True,
             max_new_tokens: int = MAX_NEW_TOKENS, seed: int = 0, rows_per_call: int = 512
             ) -> tuple[list[list[str]], list[list[int]]]:
    """(texts, token counts), each (len(prompts), k) problem-major: greedy (k = 1) or k samples at
    temperature 1, the uniforms drawn from torch.Generator(seed), so the same call gives the same
    completions whatever else ran before it. A count is the completion's tokens, its end included."""
    if greedy and k != 1:
        raise ValueError(f"k must be 1 for greedy completions, got {k}")
    engine = FusedEngine(model, tokenizer)
    generator = torch.Generator().manual_seed(seed)
    texts, counts = [], []
    per_call = max(1, rows_per_call // k)
    for start in range(0, len(prompts), per_call):
        chunk = prompts[start:start + per_call]
        encoded = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
        uniforms = None if greedy else torch.rand(len(chunk) * k, max_new_tokens, generator=generator)
        rollout = engine.generate(encoded["input_ids"], encoded["attention_mask"], SamplingParams(k, max_new_tokens),
                                  greedy=greedy, uniforms=uniforms)
        decoded = tokenizer.batch_decode(rollout.completion_ids, skip_special_tokens=True)
        lengths = rollout.completion_mask.sum(-1).tolist()
        for i in range(len(chunk)):
            texts.append(decoded[i * k:(i + 1) * k])
            counts.append([int(n) for n in lengths[i * k:(i + 1) * k]])
    return texts, counts


def _correct(texts: list[str], problems: list[dict], k: int) -> list[float]:
    return accuracy_reward(texts, answer=[p["answer"] for p in problems for _ in range(k)],
                           task=["digitsum"] * (len(problems) * k))


def _free_figures(texts: list[str], counts: list[int], problems: list[dict], k: int) -> dict:
    """Format shares, length and checks of free completions (problem-major, k per problem)."""
    right = _correct(texts, problems, k)
    formats = [read_format(t) for t in texts]
    out = {f"format/{name}": formats.count(name) / len(texts) for name in (*FORMATS, "other")}
    for name in FORMATS:
        scores = [r for r, f in zip(right, formats) if f == name]
        out[f"accuracy/{name}"] = sum(scores) / len(scores) if scores else None
    out["length/mean"] = statistics.fmean(counts)
    out["length/std"] = statistics.pstdev(counts)
    written = on_wrong = fixed = 0
    for i, text in enumerate(texts):
        events = check_events(text, problems[i // k]["digits"])
        written += len(events)
        on_wrong += sum(e["flagged_wrong"] for e in events)
        fixed += sum(e["flagged_wrong"] and e["redo_right"] for e in events) if right[i] else 0
    out.update({"checks/written": written, "checks/on_wrong": on_wrong, "checks/fixed_to_right_answer": fixed})
    return out


def behaviour(model, tokenizer, problems_by_depth: dict[int, list[dict]], *, samples: int = 4,
              seed: int = 0, modes: tuple[str, ...] = tuple(FORCED)) -> dict[int, dict]:
    """Per depth: "problems"; "{direct,worked,free}/greedy" and ".../sampled" accuracy (samples per
    problem at temperature 1); the free sampled completions' format shares, accuracy by format,
    length (tokens, mean and population spread) and checks (each "!": written, on a value that
    was wrong, and fixed in a completion whose answer is right); "free/greedy_format", the greedy
    completions' most common format. modes: which of FORCED to measure (("free",): the policy's own
    choice only, as a run's probes do)."""
    out = {}
    for depth, problems in problems_by_depth.items():
        row = {"problems": len(problems)}
        for mode in modes:
            prefix = FORCED[mode]
            prompts = [p["prompt"] + prefix for p in problems]
            for kind, k, greedy in (("greedy", 1, True), ("sampled", samples, False)):
                texts, counts = complete(model, tokenizer, prompts, k=k, greedy=greedy, seed=seed + 1000 * depth)
                full = [prefix + t for group in texts for t in group]
                right = _correct(full, problems, k)
                row[f"{mode}/{kind}"] = sum(right) / len(right)
                if mode == "free" and kind == "sampled":
                    row.update({f"free/{name}": value for name, value in
                                _free_figures(full, [n for group in counts for n in group], problems, k).items()})
                if mode == "free" and kind == "greedy":
                    formats = [read_format(t) for t in full]
                    row["free/greedy_format"] = max(set(formats), key=formats.count)
        out[depth] = row
    return out


def pass_at_k_curve(model, tokenizer, problems: list[dict], *, n: int = 256, ks=None, seed: int = 0) -> dict:
    """pass@k for each k in ks (default 1, 2, 4, ..., n) from n samples per problem at temperature
    1: "correct", each problem's count of right samples (in order), and "pass_at_k" {k: mean over
    the problems of pass_at_k(n, c, k)}."""
    ks = ks or [2 ** i for i in range(n.bit_length()) if 2 ** i <= n]
    texts, _ = complete(model, tokenizer, [p["prompt"] for p in problems], k=n, greedy=False, seed=seed)
    right = _correct([t for group in texts for t in group], problems, n)
    correct = [int(sum(right[i * n:(i + 1) * n])) for i in range(len(problems))]
    return {"n": n, "correct": correct,
            "pass_at_k": {k: statistics.fmean(pass_at_k(n, c, k) for c in correct) for k in ks}}


def precondition_table(result: dict[int, dict]) -> str:
    """behaviour()'s result as a markdown table, one row per depth."""
    columns = [("direct greedy", "direct/greedy"), ("direct sampled", "direct/sampled"),
               ("worked greedy", "worked/greedy"), ("worked sampled", "worked/sampled"),
               ("free greedy", "free/greedy"), ("free sampled", "free/sampled"),
               ("direct share", "free/format/direct"), ("worked share", "free/format/worked"),
               ("check share", "free/format/check"), ("length", "free/length/mean")]
    lines = ["| depth | problems | " + " | ".join(name for name, _ in columns) + " | greedy format | checks "
             "(on a wrong value, fixed) |",
             "|" + "---|" * (len(columns) + 4)]
    for depth, row in result.items():
        cells = " | ".join(f"{row[key]:.3f}" if key != "free/length/mean" else f"{row[key]:.1f}" for _, key in columns)
        lines.append(f"| {depth} | {row['problems']} | {cells} | {row['free/greedy_format']} | "
                     f"{row['free/checks/written']} ({row['free/checks/on_wrong']}, "
                     f"{row['free/checks/fixed_to_right_answer']}) |")
    return "\n".join(lines)


def precondition_card(model, tokenizer, config) -> str:
    """The pretraining card's section (grpo_edu.environment.registry.Pretraining.extra): the
    precondition table over the mixture's depths and one beyond, 100 held-out problems a depth."""
    low, high = mixture_of(config).depths
    depths = list(range(low, min(high + 1, len(LETTERS)) + 1))
    result = behaviour(model, tokenizer, held_out_by_depth(depths, 100), samples=4)
    return f"""## Before any RL: what the base does at each depth

100 held-out problems a depth (`grpo_edu.environment.digitsum.held_out_by_depth`), {high + 1} one beyond
the deepest it was taught. Accuracy with the format forced (direct: `<think></think>` written for it;
worked: `<think>a`), and free; greedy, and 4 samples a problem at temperature 1. The shares, length
(tokens) and checks are of the free samples (`grpo_edu.training.reasoning.behaviour`).

{precondition_table(result)}
"""
