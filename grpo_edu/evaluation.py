"""Held-out evaluation of a policy: greedy accuracy and format, pass@k from samples, and the
uncertainty of each: a held-out accuracy is an estimate from a finite set of problems.

Used by the trainer (`held_out_metrics`: held-out greedy accuracy and pass@k, each process
scoring its share of the problems, gathered; `samples_table`: a run's sample completions),
by the pretraining script, the benchmarks and the chapters.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from statistics import NormalDist

from grpo_edu import rewards
from grpo_edu.distributed import World
from grpo_edu.models import generate_completions

SAMPLE_SEED = 2   # the seed of evaluate's pass@k samples


def greedy_scores(model, tokenizer, samples: list[dict], *, max_new_tokens: int = 16) -> list[tuple[float, float]]:
    """(accuracy, format) of the greedy completion of each problem, in order: per-problem
    scores that processes evaluating shares of a held-out set can gather."""
    if not samples:
        return []
    greedy = [group[0] for group in generate_completions(model, tokenizer, [s["prompt"] for s in samples],
                                                         max_new_tokens=max_new_tokens)]
    return _scored(greedy, samples)


def _scored(texts: list[str], samples: list[dict]) -> list[tuple[float, float]]:
    """(accuracy, format) of each problem's completion text."""
    if not samples:
        return []
    columns = {key: [s.get(key) for s in samples] for key in ("answer", "task", "numbers")}
    return list(zip(rewards.accuracy_reward(texts, **columns), rewards.format_reward(texts)))


def greedy_episodes(model, tokenizer, samples: list[dict], environment: str, max_turns: int,
                    max_new_tokens: int) -> tuple[list[str], list[bool]]:
    """The greedy episode of each problem with `environment` (transformers' generate, one
    request per turn): its text, both writers', and whether the environment answered in it."""
    from grpo_edu.episodes import roll_out_episodes
    from grpo_edu.rollout import HFEngine, SamplingParams
    engine = HFEngine(model, tokenizer)
    texts, answered = [], []
    for start in range(0, len(samples), 256):
        chunk = samples[start:start + 256]
        batch = tokenizer([s["prompt"] for s in chunk], return_tensors="pt", padding=True, add_special_tokens=False)
        batch = {k: v.to(model.device) for k, v in batch.items()}
        rollout = roll_out_episodes(
            lambda turn, ids, mask, sampling, rows: engine.generate(ids, mask, sampling, greedy=True),
            chunk, batch["input_ids"], batch["attention_mask"], SamplingParams(1, max_new_tokens), tokenizer,
            environment, max_turns)
        written = rollout.completion_mask | rollout.env_mask
        texts += tokenizer.batch_decode(rollout.completion_ids.masked_fill(~written, tokenizer.pad_token_id),
                                        skip_special_tokens=True)
        answered += rollout.env_mask.any(-1).tolist()
    return texts, answered


def sampled_scores(model, tokenizer, samples: list[dict], *, k: int, max_new_tokens: int = 16,
                   seed: int = SAMPLE_SEED) -> list[tuple[int, bool]]:
    """For each problem, from k samples at temperature 1 (seeded: the same draws at every
    evaluation of the same policy): how many are right, and whether the majority answer is
    (maj@k: the answer given most often, as numbers where they parse, ties to the first
    given; no answer at all is wrong). Per problem, so processes can share the problems."""
    if not samples:
        return []
    prompts = [s["prompt"] for s in samples]
    groups = generate_completions(model, tokenizer, prompts, num_samples=k, temperature=1.0,
                                  max_new_tokens=max_new_tokens, seed=seed)
    out = []
    for sample, group in zip(samples, groups):
        columns = {key: [sample.get(key)] * k for key in ("answer", "task", "numbers")}
        correct = rewards.accuracy_reward(group, **columns)
        keys = [_answer_key(rewards.extract_answer(rewards.completion_text(c))) for c in group]
        votes = Counter(key for key in keys if key is not None)
        majority = votes.most_common(1)[0][0] if votes else None
        out.append((int(sum(correct)), majority is not None and bool(correct[keys.index(majority)])))
    return out


def _answer_key(answer: str | None) -> str | None:
    if answer is None:
        return None
    number = rewards.parse_number(answer)
    return str(number) if number is not None else " ".join(answer.split())


def sampled_metrics(scores: list[tuple[int, bool]], k: int) -> dict[str, object]:
    """pass@1 (mean share right, bootstrap interval), pass@k (unbiased; with k samples of k it
    is the share of problems with one right, Wilson interval) and maj@k (Wilson interval)."""
    n = len(scores)
    per_problem = [c / k for c, _ in scores]
    any_right = sum(c > 0 for c, _ in scores)
    majority = sum(m for _, m in scores)
    return {
        "pass_at_1": sum(per_problem) / n, "pass_at_1_interval_95": list(bootstrap_interval(per_problem)),
        f"pass_at_{k}": sum(pass_at_k(k, c, k) for c, _ in scores) / n,
        f"pass_at_{k}_interval_95": list(wilson_interval(any_right, n)),
        f"maj_at_{k}": majority / n, f"maj_at_{k}_interval_95": list(wilson_interval(majority, n)),
    }


def held_out_metrics(model, tokenizer, problems: list[dict], world: World = World(), *, max_new_tokens: int,
                     samples: int = 0, environment: str = "", max_turns: int = 1) -> dict[str, object]:
    """A training run's evaluation of `model` (whole weights) on its held-out problems, each
    rank scoring its share (world.split) and the scores gathered, so every rank returns
    the same:

      eval/greedy_accuracy        share of problems whose greedy completion is right
      eval/pass_at_1, ...         with samples = k > 0, from k samples per problem at
                                  temperature 1: sampled_metrics' pass@1, pass@k and maj@k
                                  with their 95% intervals (config key eval_samples)
      eval/tool_call_rate         with an environment: share of greedy episodes it answered in
    """
    share = problems[world.split(len(problems))]
    model.eval()
    called = []
    if environment:
        texts, called = greedy_episodes(model, tokenizer, share, environment, max_turns, max_new_tokens)
        greedy = _scored(texts, share)
    else:
        greedy = greedy_scores(model, tokenizer, share, max_new_tokens=max_new_tokens)
    sampled = sampled_scores(model, tokenizer, share, k=samples, max_new_tokens=max_new_tokens) if samples else []
    model.train()
    correct = world.gather_objects([accuracy for accuracy, _ in greedy])
    metrics: dict[str, object] = {"eval/greedy_accuracy": sum(correct) / len(correct)}
    if environment:
        calls = world.gather_objects(called)
        metrics["eval/tool_call_rate"] = sum(calls) / len(calls)
    if samples:
        metrics.update({f"eval/{key}": value
                        for key, value in sampled_metrics(world.gather_objects(sampled), samples).items()})
    return metrics


def samples_table(model, tokenizer, samples: list[dict], max_new_tokens: int) -> str:
    """One line per problem: its prompt, the greedy completion and whether it is right (a run's
    samples_before.txt and samples_after.txt)."""
    model.eval()
    completions = generate_completions(model, tokenizer, [s["prompt"] for s in samples],
                                       max_new_tokens=max_new_tokens)
    model.train()
    lines = []
    for sample, (completion,) in zip(samples, completions):
        correct = rewards.accuracy_reward([completion], answer=[sample["answer"]], task=[sample.get("task")],
                                          numbers=[sample.get("numbers")])[0]
        lines.append(f"{sample['prompt']}{completion}   ({'right' if correct else 'wrong'}, answer {sample['answer']})")
    return "\n".join(lines) + "\n"


def evaluate(model, tokenizer, samples: list[dict], *, pass_k: int = 0, max_new_tokens: int = 16,
             seed: int = SAMPLE_SEED) -> dict[str, float]:
    """Held-out metrics of a policy on `samples`.

    greedy_accuracy, greedy_format: share of problems whose greedy completion is
        correct / well formatted (`rewards.accuracy_reward`, `rewards.format_reward`).
    With pass_k > 0, also from pass_k samples per problem at temperature 1:
    sample_accuracy (pass@1 estimated from the samples), pass_at_k (at least one
        correct), mixed_groups (share of problems whose samples are neither all
        right nor all wrong: the groups that give GRPO a signal).
    """
    prompts = [s["prompt"] for s in samples]
    columns = {key: [s.get(key) for s in samples] for key in ("answer", "task", "numbers")}
    scores = greedy_scores(model, tokenizer, samples, max_new_tokens=max_new_tokens)
    metrics = {
        "problems": len(samples),
        "greedy_accuracy": _mean(accuracy for accuracy, _ in scores),
        "greedy_format": _mean(formatted for _, formatted in scores),
    }
    if pass_k > 0:
        groups = generate_completions(model, tokenizer, prompts, num_samples=pass_k, temperature=1.0,
                                      max_new_tokens=max_new_tokens, seed=seed)
        flat = [c for group in groups for c in group]
        repeated = {key: [v for v in values for _ in range(pass_k)] for key, values in columns.items()}
        correct = rewards.accuracy_reward(flat, **repeated)
        per_problem = [correct[i * pass_k:(i + 1) * pass_k] for i in range(len(samples))]
        metrics.update({
            "sample_accuracy": _mean(correct),
            "sample_format": _mean(rewards.format_reward(flat)),
            f"pass_at_{pass_k}": _mean([float(any(group)) for group in per_problem]),
            "mixed_groups": _mean([float(0 < sum(group) < pass_k) for group in per_problem]),
        })
    return metrics


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


# --------------------------------------------------------------------------- estimators

def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a proportion: `successes` of `n` problems right, e.g.
    held-out greedy accuracy. Chosen over the normal approximation because it stays inside
    [0, 1] and keeps its coverage near 0 and 1 (a policy at 98% on 256 problems)."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval needs 0 <= successes <= n and n >= 1, got {successes} of {n}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low = 0.0 if successes == 0 else max(0.0, centre - half)   # exactly 0 and 1 at the ends, not rounding
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from n samples of which c are right (Chen et al. 2021):
    the probability that k of the n, drawn without replacement, hold at least one right one,
    1 - C(n - c, k) / C(n, k), computed as a product (no huge binomials)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def bootstrap_interval(values: list[float], confidence: float = 0.95, resamples: int = 2000,
                       seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap interval of the mean of per-problem values (pass@k, which is not
    a 0/1 proportion): resample the problems with replacement, seeded, so it is reproducible."""
    if not values:
        raise ValueError("bootstrap_interval needs at least one value")
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    low = means[int((1 - confidence) / 2 * resamples)]
    high = means[min(resamples - 1, int((1 + confidence) / 2 * resamples))]
    return low, high
