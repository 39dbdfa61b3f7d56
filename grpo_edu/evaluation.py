"""Held-out evaluation of a policy: greedy accuracy and format, and pass@k from samples.

Used by the trainer (held-out greedy accuracy, each process scoring its share of the
problems: `greedy_scores` per problem, gathered), by the pretraining script, the
benchmarks and the chapters.
"""

from __future__ import annotations

from grpo_edu import rewards
from grpo_edu.models import generate_completions

SAMPLE_SEED = 2   # the seed of evaluate's pass@k samples


def greedy_scores(model, tokenizer, samples: list[dict], *, max_new_tokens: int = 16) -> list[tuple[float, float]]:
    """(accuracy, format) of the greedy completion of each problem, in order: per-problem
    scores that processes evaluating shares of a held-out set can gather."""
    if not samples:
        return []
    prompts = [s["prompt"] for s in samples]
    columns = {key: [s.get(key) for s in samples] for key in ("answer", "task", "numbers")}
    greedy = [group[0] for group in generate_completions(model, tokenizer, prompts, max_new_tokens=max_new_tokens)]
    return list(zip(rewards.accuracy_reward(greedy, **columns), rewards.format_reward(greedy)))


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
