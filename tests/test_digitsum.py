"""The digitsum task (grpo_edu.environment.digitsum): its problems and depth key, its pretraining
mixtures, and what a completion does (its format and its checks), on hand-written completions,
including ones written to fool a lazy pattern."""

import random
from collections import Counter

import pytest

from grpo_edu.config import TrainConfig
from grpo_edu.environment import digitsum, tasks
from grpo_edu.environment.digitsum import (Mixture, check_completion, check_events, completion_metrics,
                                           digitsum_sample, headroom_weights, held_out_by_depth, read_format)
from grpo_edu.environment.rewards import accuracy_reward
from grpo_edu.policy.models import char_tokenizer

DIGITS = [3, 8, 5, 1, 9]   # running values 3 1 6 7 6: the answer 6


def test_a_sample_has_its_prompt_answer_and_both_solutions():
    sample = digitsum_sample(DIGITS)
    assert sample["prompt"] == "a3b8c5d1e9=" and sample["answer"] == "6" and sample["depth"] == 5
    assert sample["solution"] == "<think>a33b81c56d17e96</think>\\boxed{6}"
    assert sample["direct_solution"] == "<think></think>\\boxed{6}"
    assert accuracy_reward([sample["solution"], sample["direct_solution"], "<think></think>\\boxed{7}"],
                           answer="6", task="digitsum") == [1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="digits must be 1 to 26 digits 0..9"):
        digitsum_sample([3, 10])


def test_the_depth_key_changes_a_runs_problems():
    tokenizer = char_tokenizer(128)
    for depths in ([3, 3], [7, 9]):
        config = TrainConfig(task="digitsum", digitsum_depths=depths, eval_size=64, model="start")
        train, held_out = tasks.task_pools(config, tokenizer)
        for pool, split in ((train, "train"), (held_out, "test")):
            seen = {s["depth"] for s in pool}
            assert seen == set(range(depths[0], depths[1] + 1)), (depths, split, seen)
            assert all(tasks.split_of(s["prompt"]) == split for s in pool)
    # the key's default: 3 to 12
    default = tasks.make_dataset("digitsum", 500, "test", seed=0)
    assert {s["depth"] for s in default} == set(range(3, 13))


@pytest.mark.parametrize("depths, message", [([0, 3], "1 <= lowest"), ([5, 4], "lowest <= highest"),
                                             ([3, 27], "<= 26"), ([3], "lowest, highest"), ([3.0, 5], "")])
def test_bad_depths_are_refused_naming_the_key(depths, message):
    with pytest.raises(ValueError, match=r"config key 'digitsum_depths' must be \[lowest, highest\]"):
        TrainConfig(task="digitsum", digitsum_depths=depths)


def test_the_depth_key_is_refused_for_another_task():
    with pytest.raises(ValueError, match="'digitsum_depths' configures the task 'digitsum', not task = 'arithmetic'"):
        TrainConfig(digitsum_depths=[3, 5])


def test_held_out_problems_by_depth_are_distinct_held_out_and_of_their_depth():
    found = held_out_by_depth([3, 6, 13], 50)
    assert len(found[3]) == 50 and len(found[6]) == 50 and len(found[13]) == 50
    for depth, problems in found.items():
        assert len({p["prompt"] for p in problems}) == len(problems)
        assert all(p["depth"] == depth and tasks.split_of(p["prompt"]) == "test" for p in problems)
    # depth 3's space is listed: all of its held-out problems when asked for more
    assert len(held_out_by_depth([3], 1000)[3]) == sum(
        tasks.split_of(digitsum.prompt_of([int(c) for c in f"{i:03d}"])) == "test" for i in range(1000))


# --------------------------------------------------------------------------- formats

@pytest.mark.parametrize("text, expected", [
    ("<think></think>\\boxed{6}", "direct"),
    ("<think>a33b81c56d17e96</think>\\boxed{6}", "worked"),
    ("<think>a33b81</think>\\boxed{6}", "worked"),            # a chain cut short is still worked (and wrong)
    ("<think>a33b81c57!c56d17e96</think>\\boxed{6}", "check"),
    ("<think>a33b81c56!c56</think>\\boxed{6}", "check"),      # a check of a right value is a check
    ("<think>a33</think>\\boxed{!}", "worked"),               # a "!" outside the reasoning is no check
    ("<think>a3b8c5</think>\\boxed{6}", "other"),             # the digits without running values
    ("<think>a33 b81</think>\\boxed{6}", "other"),            # a space between steps
    ("<think>A33B81</think>\\boxed{6}", "other"),             # capital letters
    ("<think>a3!3</think>\\boxed{6}", "other"),               # "!" inside a step
    ("<think>!a33</think>\\boxed{6}", "other"),               # "!" before any step
    ("<think>6</think>\\boxed{6}", "other"),                  # an answer in the reasoning
    ("<think></think>\\boxed{6}}", "other"),                  # text after the answer
    ("<think></think>\\boxed{6} ", "other"),
    ("<think></think>6", "other"),                            # no boxed answer
    ("<think>a33</think><think></think>\\boxed{6}", "other"),  # a second reasoning block
    ("a33b81</think>\\boxed{6}", "other"),                    # no opening tag
    ("<think>a33b81c56", "other"),                            # cut at the length limit
    ("", "other"),
])
def test_each_format_is_recognised(text, expected):
    assert read_format(text) == expected


def test_check_events_judge_each_flag_against_the_completions_own_chain():
    # c's value 7 is wrong (1 + 5 = 6): flagged, then redone right
    assert check_events("<think>a33b81c57!c56d17e96</think>\\boxed{6}", DIGITS) == [
        {"flagged_wrong": True, "redo_right": True}]
    # a re-check of a right value: flagged, not wrong
    assert check_events("<think>a33b81c56!c56d17e96</think>\\boxed{6}", DIGITS) == [
        {"flagged_wrong": False, "redo_right": True}]
    # wrong, flagged, and redone wrong
    assert check_events("<think>a33b81c57!c58</think>\\boxed{8}", DIGITS) == [
        {"flagged_wrong": True, "redo_right": False}]
    # judged against the value the completion last accepted: b's 2 was wrong and not flagged, so
    # c's 7 (2 + 5) follows from it, and flagging it flags no error of its own
    assert check_events("<think>a33b82c57!c57</think>\\boxed{7}", DIGITS) == [
        {"flagged_wrong": False, "redo_right": True}]
    # a flag with no step after it; a redo under another letter
    assert check_events("<think>a33b80!</think>\\boxed{0}", DIGITS) == [{"flagged_wrong": True, "redo_right": False}]
    assert check_events("<think>a33b80!c56</think>\\boxed{6}", DIGITS) == [{"flagged_wrong": True, "redo_right": False}]
    assert check_events("<think></think>\\boxed{6}", DIGITS) == [] == check_events("no markup!", DIGITS)


def test_completion_metrics_count_formats_and_checks_per_completion():
    rows = [{"digits": DIGITS}] * 4
    texts = ["<think></think>\\boxed{6}", "<think>a33b81c56d17e96</think>\\boxed{6}",
             "<think>a33b81c57!c56d17e96</think>\\boxed{6}", "<think>a33b81c56!c56d17e90!e96</think>\\boxed{6}"]
    got = completion_metrics(texts, rows)
    assert got["format/direct"] == [1, 0, 0, 0] and got["format/worked"] == [0, 1, 0, 0]
    assert got["format/check"] == [0, 0, 1, 1] and got["format/other"] == [0, 0, 0, 0]
    assert got["checks/written"] == [0, 0, 1, 2]
    assert got["checks/on_wrong"] == [0, 0, 1, 1]
    assert got["checks/fixed"] == [0, 0, 1, 1]
    # called with none, it names every metric (a run's summary lists them)
    assert set(completion_metrics([], [])) == set(got) and all(v == [] for v in completion_metrics([], []).values())


# --------------------------------------------------------------------------- pretraining mixtures

def test_headroom_weights_favour_short_chains_and_stop_at_the_top_depth():
    weights = headroom_weights(3, 12)
    assert list(weights) == list(range(3, 13)) and sum(weights.values()) == pytest.approx(1.0, abs=1e-12)
    assert weights[3] == pytest.approx(10 / 56) and weights[12] == pytest.approx(2 / 56) == weights[11]


def test_a_mixture_draws_its_formats_in_its_shares_and_each_trace_is_what_it_says():
    samples = [s for s, _ in zip(Mixture(0.5, 0.4, 0.1).stream(seed=0), range(4000))]
    shares = Counter(s["format"] for s in samples)
    assert abs(shares["direct"] / 4000 - 0.5) < 0.03 and abs(shares["check"] / 4000 - 0.1) < 0.02
    wrong_ends = 0
    for s in samples:
        assert read_format(s["solution"]) == s["format"] and tasks.split_of(s["prompt"]) == "train"
        right = accuracy_reward([s["solution"]], answer=s["answer"], task="digitsum")[0] == 1.0
        if s["format"] != "check":
            assert right
            continue
        events = check_events(s["solution"], s["digits"])
        assert len(events) == 1 and events[0] == {"flagged_wrong": True, "redo_right": True}
        wrong_ends += not right
    assert 0.15 < wrong_ends / shares["check"] < 0.35   # check_wrong_share 0.25: these end wrong


def test_worked_max_depth_leaves_only_direct_answers_above_it():
    mixture = Mixture(0.5, 0.4, 0.1, worked_max_depth=11)
    samples = [s for s, _ in zip(mixture.stream(seed=1), range(3000))]
    top = [s for s in samples if s["depth"] == 12]
    assert top and all(s["format"] == "direct" for s in top)
    assert {s["format"] for s in samples if s["depth"] == 11} == {"direct", "worked", "check"}


def test_check_completion_ending_wrong_flags_one_error_and_keeps_another():
    rng = random.Random(0)
    for _ in range(200):
        digits = [rng.randrange(10) for _ in range(rng.randint(3, 12))]
        text = check_completion(digits, rng, end_wrong=True)
        assert read_format(text) == "check"
        assert accuracy_reward([text], answer=digitsum_sample(digits)["answer"], task="digitsum") == [0.0]
    with pytest.raises(ValueError, match="at least 2 digits"):
        check_completion([3], rng)


@pytest.mark.parametrize("text, message", [("direct=0.5,worked=0.6", "sum to 1"), ("direct=0.5,proof=0.5", "name=share"),
                                           ("direct=x", "name=share"), ("direct=0.5,direct=0.5", "at most once")])
def test_bad_mixtures_name_the_flag(text, message):
    with pytest.raises(ValueError, match=message):
        Mixture.parse(text)


def test_a_mixture_is_described_for_its_card():
    text = Mixture.parse("direct=0.5,worked=0.4,check=0.1", worked_max_depth=11).describe()
    assert text.startswith("direct 50%, worked 40%, check 10%; depths 3 to 12")
    assert "up to depth 11, direct answers only above it" in text and "25% of the check traces end wrong" in text
