"""Task generators: correct answers, disjoint splits, determinism, a safe parser."""

import itertools
import re
from fractions import Fraction

import pytest
from hypothesis import given, settings, strategies as st

from grpo_edu.environment import tasks
from grpo_edu.environment.rewards import accuracy_reward, format_reward, last_boxed
from grpo_edu.environment.tasks import (ExpressionError, arithmetic_sample, evaluate_expression,
                            gsm8k_final_answer, gsm8k_sample, make_dataset, split_of)


def test_arithmetic_sample_is_right_and_shows_the_units_column():
    assert arithmetic_sample(47, "+", 85) == {
        "prompt": "47+85=", "answer": "132", "task": "arithmetic",
        "solution": "<think>12</think>\\boxed{132}"}
    assert arithmetic_sample(43, "-", 85)["solution"] == "<think>-2</think>\\boxed{-42}"
    with pytest.raises(ValueError, match="op must be"):
        arithmetic_sample(1, "*", 2)


@pytest.mark.parametrize("task", ["arithmetic", "multiply", "countdown"])
def test_solutions_earn_full_accuracy_and_format(task):
    samples = make_dataset(task, 300, "train", seed=3)
    columns = {key: [s.get(key) for s in samples] for key in ("answer", "task", "numbers")}
    solutions = [s["solution"] for s in samples]
    assert accuracy_reward(solutions, **columns) == [1.0] * len(samples)
    assert format_reward(solutions) == [1.0] * len(samples)


def test_countdown_solution_uses_every_number_once_and_reaches_the_target():
    for sample in make_dataset("countdown", 200, "test", seed=0):
        expression = last_boxed(sample["solution"])
        assert evaluate_expression(expression) == sample["target"]
        assert sorted(tasks.expression_numbers(expression)) == sorted(sample["numbers"])
        assert sample["prompt"] == f"Use {' '.join(map(str, sample['numbers']))} to make {sample['target']}:"


@pytest.mark.parametrize("task", ["arithmetic", "multiply", "countdown"])
def test_splits_are_disjoint_and_seeded(task):
    train = make_dataset(task, 500, "train", seed=0)
    test = make_dataset(task, 200, "test", seed=0)
    assert all(split_of(s["prompt"]) == "train" for s in train)
    assert all(split_of(s["prompt"]) == "test" for s in test)
    assert not {s["prompt"] for s in train} & {s["prompt"] for s in test}
    assert make_dataset(task, 50, "train", seed=0) == train[:50]       # same seed, same list
    assert make_dataset(task, 50, "train", seed=1) != train[:50]
    assert len({s["prompt"] for s in test}) == 200                      # unique by default


def test_held_out_share_of_the_arithmetic_space():
    low, high = tasks.ARITHMETIC_OPERAND_RANGE
    prompts = [f"{a}{op}{b}=" for a, op, b in itertools.product(range(low, high + 1), "+-",
                                                                   range(low, high + 1))]
    share = sum(split_of(p) == "test" for p in prompts) / len(prompts)
    assert len(prompts) == 16200
    assert 0.08 < share < 0.12, share


def test_arithmetic_problems_enumerates_each_split_exactly():
    test, train = tasks.arithmetic_problems("test"), tasks.arithmetic_problems("train")
    assert len(test) + len(train) == 16200
    assert {s["prompt"] for s in make_dataset("arithmetic", 300, "test", seed=5)} <= {s["prompt"] for s in test}
    assert test[0] == arithmetic_sample(*_parse(test[0]["prompt"]))


def _parse(prompt):
    for op in "+-":
        if op in prompt:
            a, b = prompt.rstrip("=").split(op)
            return int(a), op, int(b)


def test_asking_for_more_distinct_problems_than_a_split_holds_is_an_error():
    with pytest.raises(ValueError, match="n = 1600 distinct arithmetic problems requested from split .test., which holds 1,576"):
        make_dataset("arithmetic", 1600, "test")
    assert len(make_dataset("arithmetic", 1600, "test", unique=False)) == 1600


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match=r"task must be one of \('arithmetic', 'multiply', 'countdown', 'digitsum', 'chain'\)"):
        next(tasks.iterate_samples("chess"))
    with pytest.raises(ValueError, match="split must be one of"):
        next(tasks.iterate_samples("arithmetic", "validation"))
    with pytest.raises(ValueError, match="n must be >= 0"):
        make_dataset("arithmetic", -1)
    with pytest.raises(ValueError, match="split must be one of"):
        make_dataset("arithmetic", 5, "validation")
    with pytest.raises(ValueError, match="a task read from files: use its loader, e.g. load_gsm8k"):
        make_dataset("gsm8k", 5)


@pytest.mark.parametrize("text, value", [
    ("1+2*3", 7), ("(1+2)*3", 9), ("7-2-1", 4), ("8/2/2", 2), ("1/3", Fraction(1, 3)),
    (" ( 4 + 4 ) / 8 ", 1), ("((((5))))", 5), ("2*3-4/2", 4),
])
def test_evaluate_expression(text, value):
    assert evaluate_expression(text) == value


@pytest.mark.parametrize("text, message", [
    ("1/0", "division by zero"), ("1/(2-2)", "division by zero"), ("-1+2", "unexpected '-'"),
    ("2**3", "unexpected '\\*'"), ("(1+2", "unbalanced"), ("1+2)", "after a complete expression"),
    ("1 2", "after a complete expression"), ("", "ends early"), ("1+", "ends early"),
    ("__import__('os')", "unexpected '_'"), ("1.5*2", "unexpected '.'"), ("١+٢", "unexpected"),
    ("(" * 17 + "1" + ")" * 17, "nested parentheses"), ("1+" * 101 + "1", "longer than"),
    ("1234567890", "after a complete expression"),
])
def test_evaluate_expression_rejects(text, message):
    with pytest.raises(ExpressionError, match=message):
        evaluate_expression(text)


def _expressions():
    leaf = st.integers(0, 99).map(lambda n: (str(n), Fraction(n)))

    def combine(children):
        def build(pair_op):
            (left, lv), op, (right, rv) = pair_op
            if op == "/" and rv == 0:
                return None
            value = {"+": lv + rv, "-": lv - rv, "*": lv * rv, "/": lv / rv if rv else None}[op]
            return f"({left}{op}{right})", value
        return st.tuples(children, st.sampled_from("+-*/"), children).map(build).filter(bool)

    return st.recursive(leaf, combine, max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(_expressions())
def test_parser_agrees_with_exact_arithmetic(pair):
    text, value = pair
    assert evaluate_expression(text) == value


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=st.sampled_from("0123456789+-*/() x."), max_size=60) | st.text(max_size=60))
def test_parser_only_ever_raises_expression_error(text):
    try:
        value = evaluate_expression(text)
    except ExpressionError:
        return
    assert isinstance(value, Fraction)


@pytest.mark.parametrize("solution, answer", [
    ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72", "72"),
    ("He pays 1,000 + 200 = 1,200 dollars.\n#### 1,200", "1200"),
    ("#### $18.", "18"),
    ("first #### 3\nthen\n#### -4", "-4"),
    ("####5", "5"),
])
def test_gsm8k_final_answer(solution, answer):
    assert gsm8k_final_answer(solution) == answer


def test_gsm8k_final_answer_without_marker_is_an_error():
    with pytest.raises(ValueError, match="no '#### answer' line"):
        gsm8k_final_answer("The answer is 72.")


def test_gsm8k_sample_asks_for_a_boxed_answer_and_is_scored_by_the_rewards():
    sample = gsm8k_sample("  How many legs do 3 cats have? ", "3 * 4 = 12\n#### 12")
    assert sample["prompt"].startswith("How many legs do 3 cats have?\n")
    assert "\\boxed{" in sample["prompt"] and sample["answer"] == "12" and sample["task"] == "gsm8k"
    completion = "<think>3 cats, 4 legs each: 3 * 4 = 12</think>\\boxed{12}"
    assert accuracy_reward([completion], answer=[sample["answer"]], task=[sample["task"]]) == [1.0]


# --------------------------------------------------------------------------- task_instruction

def pools(**keys):
    from grpo_edu.config import TrainConfig
    return tasks.task_pools(TrainConfig(eval_size=8, **keys), tokenizer=None)


@pytest.mark.parametrize("task", ["arithmetic", "countdown"])
def test_task_instruction_adds_the_tasks_instruction_after_each_problem_and_changes_nothing_else(task):
    bare_pool, bare_held_out = pools(task=task)
    pool, held_out = pools(task=task, task_instruction=True)
    for plain, told in zip(bare_pool + bare_held_out, pool + held_out):
        assert told["prompt"] == f"{plain['prompt']}\n{tasks.TASKS[task].instruction}\n"
        assert {k: v for k, v in told.items() if k != "prompt"} == {k: v for k, v in plain.items() if k != "prompt"}
    assert "\\boxed{" in tasks.TASKS[task].instruction and "<think>" in tasks.TASKS[task].instruction


def test_the_cpu_tiers_prompts_stay_bare():
    """The committed policy was pretrained on bare prompts, and the book's runs read them: the
    default config adds nothing."""
    from grpo_edu.config import DEFAULT_CONFIG, TrainConfig
    assert TrainConfig.from_toml(DEFAULT_CONFIG).data.task_instruction is False
    for task, bare in (("arithmetic", r"\d\d[+-]\d\d="), ("countdown", r"Use \d+ \d+ \d+ to make \d+:")):
        pool, held_out = pools(task=task)
        assert all(re.fullmatch(bare, s["prompt"]) for s in pool + held_out), task


def test_a_gsm8k_prompt_carries_its_instruction_either_way():
    sample = gsm8k_sample("How many legs do 3 cats have?", "3 * 4 = 12\n#### 12")
    assert tasks.with_instruction(sample) == sample and sample["prompt"].endswith(f"{tasks.GSM8K_INSTRUCTION}\n")
    with pytest.raises(ValueError, match=r"sample\['task'\] must be one of \('arithmetic', 'multiply', 'countdown', 'gsm8k', 'digitsum', 'chain'\), "
                                         r"got 'sudoku'"):
        tasks.with_instruction({"prompt": "?", "task": "sudoku"})


def test_the_countdown_instruction_states_what_the_accuracy_reward_checks():
    """Each number once, the expression (not its value) boxed, nothing after it: a completion that
    breaks one of the three loses what the instruction says it would."""
    sample = tasks.make_dataset("countdown", 1, "test")[0]
    instruction = tasks.TASKS["countdown"].instruction
    assert "each of the numbers exactly once" in instruction and "(not its value)" in instruction
    assert "nothing after it" in instruction
    expression = last_boxed(sample["solution"])
    columns = dict(answer=[sample["answer"]] * 4, task=["countdown"] * 4, numbers=[sample["numbers"]] * 4)
    completions = [sample["solution"],                                        # as instructed
                   sample["solution"].replace(f"{{{expression}}}", f"{{{sample['answer']}}}"),  # its value
                   sample["solution"] + " Done.",                              # text after the answer
                   sample["solution"].replace(f"{{{expression}}}", f"{{{expression}+0}}")]  # a number not given
    assert accuracy_reward(completions, **columns) == [1.0, 0.0, 1.0, 0.0]
    assert format_reward(completions) == [1.0, 1.0, 0.0, 1.0]
