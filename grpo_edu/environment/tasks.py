"""Problems with answers a program can check: the prompts GRPO learns from.

Every sample is a plain dict (so a list of them is also a `datasets.Dataset`
for TRL) with at least

    prompt    the text the policy continues
    answer    the reference final answer, as a string ("132")
    task      "arithmetic" | "multiply" | "countdown" | "chain" | "gsm8k" (tells the
              accuracy reward how to check an answer)

and, for the generated tasks, `solution`: a correct completion in the format the
rewards expect, used for supervised pretraining and as an example:

    arithmetic   prompt "47+85="                solution "<think>12</think>\\boxed{132}"
    countdown    prompt "Use 3 5 7 to make 22:" solution "<think>3*5=15 15+7=22</think>\\boxed{3*5+7}"
    multiply     prompt "47*85="                solution "<think>[47*85]=3995</think>\\boxed{3995}"
                                                direct_solution "<think>35</think>\\boxed{3995}"
    chain        prompt "12+7+30="              solution "<think>12+7=19,19+30=49</think>\\boxed{49}"
                 (grpo_edu.environment.process: the task whose every step a rule checks, for process supervision)

Multiply is the task that needs a tool: a two-digit product is beyond what the tiny
policy does reliably in its head, and `[47*85]` is a call of grpo_edu.training.episodes'
Calculator, whose answer `=3995` the environment writes, not the policy.

Arithmetic is the CPU tier's task: completions are at most ten tokens, so a tiny
model can roll out hundreds of them a second. The reasoning is the units
column (7+5=12 for 47+85: a carry), the boxed answer the result.

Train and held-out problems never overlap: a problem's split is a hash of its
text (`split_of`), so the held-out set is the same for every seed, every
generator and every machine, and a train sampler can never draw a test problem.
"""

from __future__ import annotations

import functools
import json
import random
import re
import zlib
from fractions import Fraction
from pathlib import Path
from typing import Iterator

from grpo_edu.environment import process
from grpo_edu.policy.models import completion_text


SPLITS = ("train", "test")
HELD_OUT_PERCENT = 10  # share of each task's problem space reserved for evaluation


def split_of(prompt: str) -> str:
    """"test" for a fixed HELD_OUT_PERCENT of prompts (by CRC-32 of the text), else "train"."""
    return "test" if zlib.crc32(prompt.encode("utf-8")) % 100 < HELD_OUT_PERCENT else "train"


# --------------------------------------------------------------------------- arithmetic

ARITHMETIC_OPERAND_RANGE = (10, 99)  # two-digit operands: 90 * 90 * 2 = 16,200 problems


def arithmetic_sample(a: int, op: str, b: int) -> dict:
    """The sample for `a op b` with op "+" or "-".

    The reasoning is the units column, (a mod 10) op (b mod 10): its carry (a
    result >= 10) or borrow (a result < 0) is the one step of two-digit
    arithmetic that needs more than a lookup, so writing it down first helps.
    """
    if op not in ("+", "-"):
        raise ValueError(f"op must be '+' or '-', got {op!r}")
    for name, value in (("a", a), ("b", b)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    result = a + b if op == "+" else a - b
    units = a % 10 + b % 10 if op == "+" else a % 10 - b % 10
    return {"prompt": f"{a}{op}{b}=", "answer": str(result), "task": "arithmetic",
            "solution": completion_text(str(units), str(result))}


def arithmetic_problems(split: str = "test") -> list[dict]:
    """Every arithmetic problem of one split, ordered by (a, op, b): 1,576
    held-out and 14,624 train problems, so the held-out set can be evaluated
    exactly."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return [dict(sample) for sample in _arithmetic_pool(split)]


@functools.lru_cache(maxsize=None)
def _arithmetic_pool(split: str) -> tuple[dict, ...]:
    low, high = ARITHMETIC_OPERAND_RANGE
    samples = (arithmetic_sample(a, op, b) for a in range(low, high + 1) for op in "+-"
               for b in range(low, high + 1))
    return tuple(s for s in samples if split_of(s["prompt"]) == split)


# --------------------------------------------------------------------------- multiply (with a calculator)

MULTIPLY_OPERAND_RANGE = (10, 99)  # two-digit factors: 90 * 90 = 8,100 problems


def multiply_sample(a: int, b: int) -> dict:
    """The sample for `a*b`, with two solutions:

        solution          "<think>[47*85]=3995</think>\\boxed{3995}": a call of the calculator
                          (grpo_edu.training.episodes.Calculator), its answer "=3995" written by the
                          environment, then the boxed answer copied from it
        direct_solution   "<think>35</think>\\boxed{3995}": in the head, the reasoning being the
                          units digits' product (7*5 = 35), as arithmetic's is the units column
    """
    for name, value in (("a", a), ("b", b)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    product = a * b
    return {"prompt": f"{a}*{b}=", "answer": str(product), "task": "multiply",
            "solution": completion_text(f"[{a}*{b}]={product}", str(product)),
            "direct_solution": completion_text(str(a % 10 * (b % 10)), str(product))}


@functools.lru_cache(maxsize=None)
def _multiply_pool(split: str) -> tuple[dict, ...]:
    low, high = MULTIPLY_OPERAND_RANGE
    samples = (multiply_sample(a, b) for a in range(low, high + 1) for b in range(low, high + 1))
    return tuple(s for s in samples if split_of(s["prompt"]) == split)


# --------------------------------------------------------------------------- countdown

COUNTDOWN_NUMBER_RANGE = (1, 25)


def _draw_countdown(rng: random.Random, count: int = 3) -> dict:
    """Numbers drawn at random, combined left to right with random operations; the
    result (a positive integer, every division exact) is the target."""
    low, high = COUNTDOWN_NUMBER_RANGE
    while True:
        numbers = [rng.randint(low, high) for _ in range(count)]
        order = rng.sample(numbers, count)
        value, expression, steps = Fraction(order[0]), str(order[0]), []
        for number in order[1:]:
            op = rng.choice("+-*/")
            new = {"+": value + number, "-": value - number, "*": value * number,
                   "/": value / number}[op]
            if new.denominator != 1 or new <= 0:
                break
            steps.append(f"{value}{op}{number}={new}")
            # Parenthesise the running expression when precedence would change it.
            expression = f"({expression})" if op in "*/" and any(s in expression for s in "+-") else expression
            value, expression = new, f"{expression}{op}{number}"
        else:
            if evaluate_expression(expression) != value:  # the parser is the judge; agree with it
                raise AssertionError(f"countdown generator built {expression!r} != {value}")
            prompt = f"Use {' '.join(map(str, numbers))} to make {value}:"
            return {"prompt": prompt, "answer": str(value), "task": "countdown",
                    "numbers": numbers, "target": int(value),
                    "solution": completion_text(" ".join(steps), expression)}


class ExpressionError(ValueError):
    """An expression that is not plain integer arithmetic."""


MAX_EXPRESSION_CHARS = 200
MAX_EXPRESSION_DEPTH = 16
_EXPRESSION_TOKEN = re.compile(r"\s*(?:(\d{1,9})|([-+*/()]))", re.ASCII)


def _tokens(text: str) -> list[str]:
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    tokens, position = [], 0
    text = text.rstrip()
    while position < len(text):
        match = _EXPRESSION_TOKEN.match(text, position)
        if not match:
            raise ExpressionError(f"unexpected {text[position]!r} at {position}")
        tokens.append(match.group(1) or match.group(2))
        position = match.end()
    return tokens


def evaluate_expression(text: str) -> Fraction:
    """The exact value of an integer expression with + - * / and parentheses.

    A recursive-descent parser, never `eval`: only ASCII integer literals (at
    most 9 digits), the four operations, parentheses and spaces; no unary
    signs; at most MAX_EXPRESSION_CHARS characters and MAX_EXPRESSION_DEPTH
    nested parentheses. Raises ExpressionError on anything else, including
    division by zero.
    """
    tokens = _tokens(text)
    position = 0

    def peek() -> str | None:
        return tokens[position] if position < len(tokens) else None

    def take() -> str:
        nonlocal position
        position += 1
        return tokens[position - 1]

    def expression(depth: int) -> Fraction:  # term (("+" | "-") term)*
        value = term(depth)
        while peek() in ("+", "-"):
            value = value + term(depth) if take() == "+" else value - term(depth)
        return value

    def term(depth: int) -> Fraction:  # factor (("*" | "/") factor)*
        value = factor(depth)
        while peek() in ("*", "/"):
            op, right = take(), factor(depth)
            if op == "/" and right == 0:
                raise ExpressionError("division by zero")
            value = value * right if op == "*" else value / right
        return value

    def factor(depth: int) -> Fraction:  # integer | "(" expression ")"
        token = peek()
        if token is None:
            raise ExpressionError("expression ends early")
        take()
        if token == "(":
            if depth >= MAX_EXPRESSION_DEPTH:
                raise ExpressionError(f"more than {MAX_EXPRESSION_DEPTH} nested parentheses")
            value = expression(depth + 1)
            if peek() != ")":
                raise ExpressionError("unbalanced parentheses")
            take()
            return value
        if token.isdigit():
            return Fraction(int(token))
        raise ExpressionError(f"unexpected {token!r}")

    value = expression(0)
    if position != len(tokens):
        raise ExpressionError(f"unexpected {tokens[position]!r} after a complete expression")
    return value


def expression_numbers(text: str) -> list[int]:
    """The integer literals of an expression, in order (call after evaluate_expression)."""
    return [int(token) for token in _tokens(text) if token.isdigit()]


# --------------------------------------------------------------------------- datasets

GENERATED_TASKS = ("arithmetic", "multiply", "countdown", "chain")
TASKS = (*GENERATED_TASKS, "gsm8k")   # config key task: the generated ones, and GSM8K read from a file or the hub
_POOLS = {"arithmetic": _arithmetic_pool, "multiply": _multiply_pool}   # small spaces, listed whole


def _check_task_and_split(task: str, split: str) -> None:
    if task not in GENERATED_TASKS:
        raise ValueError(f"task must be one of {GENERATED_TASKS} (gsm8k: use load_gsm8k), got {task!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def iterate_samples(task: str = "arithmetic", split: str = "train", seed: int = 0) -> Iterator[dict]:
    """An endless, seeded stream of samples of one split, uniform over its
    problems (duplicates possible)."""
    _check_task_and_split(task, split)
    rng = random.Random(f"{task}/{split}/{seed}")
    if task in _POOLS:  # small space: draw from the split's list
        pool = _POOLS[task](split)
        while True:
            yield dict(rng.choice(pool))
    draw = process.draw_chain if task == "chain" else _draw_countdown
    while True:  # countdown, chain: draw, keep the split's (their spaces are too big to list)
        sample = draw(rng)
        if split_of(sample["prompt"]) == split:
            yield sample


MAX_REPEATED_DRAWS = 200_000  # give up on finding a new distinct problem after this many


def make_dataset(task: str = "arithmetic", n: int = 1000, split: str = "train", seed: int = 0,
                 unique: bool = True) -> list[dict]:
    """`n` samples of one split, distinct prompts unless unique=False. Same arguments,
    same list.

    The arithmetic and multiply spaces are small (16,200 problems: 14,624 train and
    1,576 held-out; 8,100), so asking for more distinct problems than a split holds is
    an error, not an endless loop.
    """
    _check_task_and_split(task, split)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if task in _POOLS and unique and n > len(_POOLS[task](split)):
        raise ValueError(f"n = {n} distinct {task} problems requested from split {split!r}, which "
                         f"holds {len(_POOLS[task](split)):,}; ask for fewer or pass unique=False")
    samples, seen, misses = [], set(), 0
    stream = iterate_samples(task, split, seed)
    while len(samples) < n:
        sample = next(stream)
        if unique:
            if sample["prompt"] in seen:
                misses += 1
                if misses > MAX_REPEATED_DRAWS:
                    raise ValueError(
                        f"n = {n} distinct {task} problems requested from split {split!r}, but "
                        f"{MAX_REPEATED_DRAWS:,} draws in a row found none beyond the {len(samples):,} "
                        f"already drawn (the split is about that large); ask for fewer or pass unique=False")
                continue
            seen.add(sample["prompt"])
            misses = 0
        samples.append(sample)
    return samples


# --------------------------------------------------------------------------- GSM8K (GPU tiers)

GSM8K_INSTRUCTION = ("Think step by step inside <think> and </think>, then give the final "
                     "answer as \\boxed{number}.")
_GSM8K_FINAL = re.compile(r"####\s*([^\n]*)")


def gsm8k_final_answer(solution: str) -> str:
    """The final answer of a GSM8K reference solution: the text after its last
    "####", without thousands separators or a trailing period ("1,000." -> "1000").
    Raises ValueError when there is no "####" line."""
    matches = _GSM8K_FINAL.findall(solution)
    if not matches:
        raise ValueError(f"solution has no '#### answer' line: {solution[-80:]!r}")
    return matches[-1].strip().replace(",", "").replace("$", "").rstrip(".").strip()


def gsm8k_sample(question: str, solution: str) -> dict:
    """One GSM8K row ({"question", "answer"} in the dataset) as a sample."""
    return {"prompt": f"{question.strip()}\n{GSM8K_INSTRUCTION}\n", "answer": gsm8k_final_answer(solution),
            "task": "gsm8k"}


def load_gsm8k(split: str = "train", dataset: str = "openai/gsm8k") -> list[dict]:
    """GSM8K's rows of one split as samples, in the dataset's order.

    dataset: a local folder holding train.jsonl and test.jsonl (one {"question", "answer"}
    object a line: the layout of GSM8K's own repository, grade_school_math/data/), read with
    no download; else a hub id read through the `datasets` library (downloads on first use)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    folder = Path(dataset).expanduser()
    if folder.is_dir():
        path = folder / f"{split}.jsonl"
        if not path.is_file():
            raise ValueError(f"dataset {dataset!r} is a folder without {split}.jsonl (GSM8K's layout: train.jsonl, "
                             f"test.jsonl)")
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    else:
        from datasets import load_dataset
        rows = load_dataset(dataset, "main", split=split)
    return [gsm8k_sample(row["question"], row["answer"]) for row in rows]


# --------------------------------------------------------------------------- instructions

# What a model that was not trained on the bare prompts must be told: the answer format both
# rewards score (grpo_edu.environment.rewards: <think>reasoning</think>\\boxed{answer}, nothing after it)
# and, for Countdown, the rules (each number once; the expression, not its value, is the
# answer). GSM8K's prompts always carry GSM8K_INSTRUCTION.
INSTRUCTIONS = {
    "arithmetic": ("Compute the result. Think step by step inside <think> and </think>, then give the "
                   "final answer as \\boxed{number}."),
    "multiply": ("Compute the product. You may call a calculator: write [expression] and it answers "
                 "=value. Think step by step inside <think> and </think>, then give the final answer as "
                 "\\boxed{number}."),
    "countdown": ("Write an expression that uses each of the numbers exactly once, with + - * / and "
                  "parentheses, and equals the target. Think step by step inside <think> and </think>, "
                  "then give the expression itself (not its value) as \\boxed{expression}, for example "
                  "\\boxed{(1+2)*3}, and nothing after it."),
    "chain": ("Add the numbers left to right, writing each partial sum as a+b=c inside <think> and </think> "
              "(separated by commas), then give the total as \\boxed{number}."),
    "gsm8k": GSM8K_INSTRUCTION,
}


def with_instruction(sample: dict) -> dict:
    """The sample with its task's instruction on a line after the problem (INSTRUCTIONS):
    "Use 3 5 7 to make 22:" -> "Use 3 5 7 to make 22:\\n" + INSTRUCTIONS["countdown"] + "\\n".
    A GSM8K sample is returned as it is (its prompt already ends with the instruction)."""
    task = sample.get("task")
    if task not in INSTRUCTIONS:
        raise ValueError(f"sample['task'] must be one of {tuple(INSTRUCTIONS)}, got {task!r}")
    if task == "gsm8k":
        return dict(sample)
    return {**sample, "prompt": f"{sample['prompt']}\n{INSTRUCTIONS[task]}\n"}


# --------------------------------------------------------------------------- a run's problems

TRAIN_POOL = 10_000  # distinct training problems a run's prompts are drawn from (with replacement; multiply: all 7,284)


def training_pool_size(task: str, size: int = TRAIN_POOL) -> int:
    """How many distinct training problems a run draws from: `size`, or all of a smaller
    task's train split (multiply: 7,284)."""
    return min(size, len(_POOLS[task]("train"))) if task in _POOLS else size


def task_pools(config, tokenizer) -> tuple[list[dict], list[dict]]:
    """A training run's problems (config: a grpo_edu.training.config.TrainConfig, of which its
    task, dataset, eval_size, task_instruction and chat_template are read): the pool prompts are drawn from, and the held-out problems (the first
    eval_size of the test split), with their prompts as the policy reads them (the task's
    instruction added when task_instruction, then inside the tokenizer's chat template when
    chat_template)."""
    if config.task == "gsm8k":
        train_pool = load_gsm8k("train", config.dataset)
        held_out = load_gsm8k("test", config.dataset)[:config.eval_size]
    else:
        train_pool = make_dataset(config.task, n=training_pool_size(config.task), split="train", seed=0)
        held_out = make_dataset(config.task, n=config.eval_size, split="test", seed=0)
    if config.task_instruction:
        train_pool, held_out = [with_instruction(s) for s in train_pool], [with_instruction(s) for s in held_out]
    if config.chat_template:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("config key 'chat_template' is true, but the tokenizer has no chat template "
                             "(not an instruct model?); set chat_template = false")

        def as_chat(sample: dict) -> dict:
            text = tokenizer.apply_chat_template([{"role": "user", "content": sample["prompt"]}],
                                                 add_generation_prompt=True, tokenize=False)
            return {**sample, "prompt": text}
        train_pool, held_out = [as_chat(s) for s in train_pool], [as_chat(s) for s in held_out]
    return train_pool, held_out
