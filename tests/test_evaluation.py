"""Held-out evaluation: per-problem greedy scores that shards can gather, and the
evaluate() figures built from them."""

import pytest
import torch

from grpo_edu.environment import rewards, tasks
from grpo_edu.training.evaluation import evaluate, greedy_scores
from grpo_edu.policy.models import generate_completions, load_policy


@pytest.fixture(scope="module")
def starting_policy():
    torch.set_num_threads(1)
    return load_policy()


@pytest.fixture(scope="module")
def problems():
    return tasks.make_dataset("arithmetic", 64, "test", seed=3)


def test_greedy_scores_are_the_rewards_of_each_greedy_completion(starting_policy, problems):
    model, tokenizer = starting_policy
    scores = greedy_scores(model, tokenizer, problems[:8])
    greedy = [group[0] for group in generate_completions(model, tokenizer, [p["prompt"] for p in problems[:8]])]
    accuracy = rewards.accuracy_reward(greedy, answer=[p["answer"] for p in problems[:8]],
                                       task=[p["task"] for p in problems[:8]],
                                       numbers=[p.get("numbers") for p in problems[:8]])
    assert scores == list(zip(accuracy, rewards.format_reward(greedy)))
    assert greedy_scores(model, tokenizer, []) == []


def test_shards_of_the_problems_score_as_the_whole(starting_policy, problems):
    """What sharding evaluation across processes relies on: a problem's score does not depend
    on which others share its batch (left padding, positions from the attention mask)."""
    model, tokenizer = starting_policy
    whole = greedy_scores(model, tokenizer, problems)
    shards = [greedy_scores(model, tokenizer, problems[i:i + 23]) for i in range(0, len(problems), 23)]
    assert [score for shard in shards for score in shard] == whole
    metrics = evaluate(model, tokenizer, problems)
    assert metrics["greedy_accuracy"] == sum(a for a, _ in whole) / len(whole)
    assert metrics["greedy_format"] == sum(f for _, f in whole) / len(whole)


def test_evaluate_reports_consistent_sampling_figures(starting_policy):
    model, tokenizer = starting_policy
    metrics = evaluate(model, tokenizer, tasks.make_dataset("arithmetic", 40, "test", seed=3), pass_k=4)
    assert metrics["problems"] == 40
    assert 0 <= metrics["mixed_groups"] <= metrics["pass_at_4"] <= 1
    assert metrics["sample_accuracy"] <= metrics["pass_at_4"]


def test_per_problem_outcomes_are_the_figures_they_average(starting_policy):
    """per_problem=True: each problem's greedy outcome (0/1) and its count of right samples, in the
    problems' order, whose means are the greedy and sampled accuracies; without it, neither key."""
    model, tokenizer = starting_policy
    problems = tasks.make_dataset("arithmetic", 40, "test", seed=3)
    plain = evaluate(model, tokenizer, problems, pass_k=4)
    metrics = evaluate(model, tokenizer, problems, pass_k=4, per_problem=True)
    assert "greedy_correct" not in plain and "sample_correct" not in plain
    assert {k: v for k, v in metrics.items() if k not in ("greedy_correct", "sample_correct")} == plain
    assert len(metrics["greedy_correct"]) == len(metrics["sample_correct"]) == 40
    assert set(metrics["greedy_correct"]) <= {0, 1} and set(metrics["sample_correct"]) <= set(range(5))
    assert sum(metrics["greedy_correct"]) / 40 == metrics["greedy_accuracy"]
    assert sum(metrics["sample_correct"]) / 160 == metrics["sample_accuracy"]
    greedy = [int(a) for a, _ in greedy_scores(model, tokenizer, problems)]
    assert metrics["greedy_correct"] == greedy
    assert sum(metrics["sample_correct"]) > 0 and sum(greedy) < 40   # the policy at the start: mixed outcomes
