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

import torch

from grpo_edu.environment import rewards
from grpo_edu.runtime.distributed import World
from grpo_edu.policy.models import generate_completions

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


def played_episodes(model, tokenizer, samples: list[dict], environment: str, max_turns: int,
                    max_new_tokens: int, *, k: int = 1, seed: int | None = None) -> dict[str, list]:
    """Each problem's episodes with `environment` (transformers' generate, one request per
    turn): greedy (seed None, k = 1), or k sampled at temperature 1 from torch's generator
    seeded with `seed` (the caller's stream untouched). Per episode, problem-major (problem
    i's are [i k, (i + 1) k)): "texts", both writers'; "called", whether the environment
    answered in it; "turns", the policy's turns."""
    from grpo_edu.training.episodes import roll_out_episodes
    from grpo_edu.sampling.rollout import HFEngine, SamplingParams
    if seed is None and k != 1:
        raise ValueError(f"k must be 1 for greedy episodes (seed None), got {k}")
    engine = HFEngine(model, tokenizer)
    played: dict[str, list] = {"texts": [], "called": [], "turns": []}
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        for start in range(0, len(samples), 256):
            chunk = samples[start:start + 256]
            batch = tokenizer([s["prompt"] for s in chunk], return_tensors="pt", padding=True,
                              add_special_tokens=False)
            batch = {key: value.to(model.device) for key, value in batch.items()}
            rollout = roll_out_episodes(
                lambda turn, ids, mask, sampling, rows: engine.generate(ids, mask, sampling, greedy=seed is None),
                chunk, batch["input_ids"], batch["attention_mask"], SamplingParams(k, max_new_tokens), tokenizer,
                environment, max_turns)
            written = rollout.completion_mask | rollout.env_mask
            played["texts"] += tokenizer.batch_decode(
                rollout.completion_ids.masked_fill(~written, tokenizer.pad_token_id), skip_special_tokens=True)
            played["called"] += rollout.env_mask.any(-1).tolist()
            played["turns"] += [int(t) for t in rollout.episode["turns"].tolist()]
    return played


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
        played = played_episodes(model, tokenizer, share, environment, max_turns, max_new_tokens)
        greedy, called = _scored(played["texts"], share), played["called"]
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


def samples_table(model, tokenizer, samples: list[dict], config) -> str:
    """One line per problem: its prompt, the greedy completion (with config.rollout.environment the
    greedy episode, both writers' text) and whether it is right (a run's samples_before.txt
    and samples_after.txt)."""
    model.eval()
    if config.rollout.environment:
        completions = [[text] for text in played_episodes(model, tokenizer, samples, config.rollout.environment,
                                                          config.rollout.max_turns, config.rollout.max_completion_length)["texts"]]
    else:
        completions = generate_completions(model, tokenizer, [s["prompt"] for s in samples],
                                           max_new_tokens=config.rollout.max_completion_length)
    model.train()
    lines = []
    for sample, (completion,) in zip(samples, completions):
        correct = rewards.accuracy_reward([completion], answer=[sample["answer"]], task=[sample.get("task")],
                                          numbers=[sample.get("numbers")])[0]
        lines.append(f"{sample['prompt']}{completion}   ({'right' if correct else 'wrong'}, answer {sample['answer']})")
    return "\n".join(lines) + "\n"


def evaluate(model, tokenizer, samples: list[dict], *, pass_k: int = 0, max_new_tokens: int = 16,
             seed: int = SAMPLE_SEED, environment: str = "", max_turns: int = 4,
             per_problem: bool = False) -> dict:
    """Held-out metrics of a policy on `samples`.

    greedy_accuracy, greedy_format: share of problems whose greedy completion is
        correct / well formatted (`rewards.accuracy_reward`, `rewards.format_reward`).
    With pass_k > 0, also from pass_k samples per problem at temperature 1:
    sample_accuracy (pass@1 estimated from the samples), pass_at_k (at least one
        correct), mixed_groups (share of problems whose samples are neither all
        right nor all wrong: the groups that give GRPO a signal).
    With an environment ("module:Class", grpo_edu.training.episodes) every completion is an episode
    of at most max_turns policy turns, scored on its whole text, and also:
    tool_call_rate, mean_turns: share of greedy episodes the environment answered in, and
        their mean policy turns; sample_tool_call_rate: the same share of the samples.
    With per_problem, also each problem's outcomes, in order, for paired comparisons over the
    same problems (grpo_edu.algorithm.statistics): greedy_correct (1 right, 0 wrong) and, with
    pass_k > 0, sample_correct (how many of its pass_k samples are right).
    """
    prompts = [s["prompt"] for s in samples]
    columns = {key: [s.get(key) for s in samples] for key in ("answer", "task", "numbers")}
    if environment:
        played = played_episodes(model, tokenizer, samples, environment, max_turns, max_new_tokens)
        scores = _scored(played["texts"], samples)
    else:
        scores = greedy_scores(model, tokenizer, samples, max_new_tokens=max_new_tokens)
    metrics = {
        "problems": len(samples),
        "greedy_accuracy": _mean(accuracy for accuracy, _ in scores),
        "greedy_format": _mean(formatted for _, formatted in scores),
    }
    if environment:
        metrics.update(tool_call_rate=_mean(played["called"]), mean_turns=_mean(played["turns"]))
    if pass_k > 0:
        if environment:
            sampled = played_episodes(model, tokenizer, samples, environment, max_turns, max_new_tokens,
                                      k=pass_k, seed=seed)
            flat = sampled["texts"]
            metrics["sample_tool_call_rate"] = _mean(sampled["called"])
        else:
            groups = generate_completions(model, tokenizer, prompts, num_samples=pass_k, temperature=1.0,
                                          max_new_tokens=max_new_tokens, seed=seed)
            flat = [c for group in groups for c in group]
        repeated = {key: [v for v in values for _ in range(pass_k)] for key, values in columns.items()}
        correct = rewards.accuracy_reward(flat, **repeated)
        groups = [correct[i * pass_k:(i + 1) * pass_k] for i in range(len(samples))]
        metrics.update({
            "sample_accuracy": _mean(correct),
            "sample_format": _mean(rewards.format_reward(flat)),
            f"pass_at_{pass_k}": _mean([float(any(group)) for group in groups]),
            "mixed_groups": _mean([float(0 < sum(group) < pass_k) for group in groups]),
        })
        if per_problem:
            metrics["sample_correct"] = [int(sum(group)) for group in groups]
    if per_problem:
        metrics["greedy_correct"] = [int(accuracy) for accuracy, _ in scores]
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
