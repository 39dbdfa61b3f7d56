"""Problems with answers a program can check: the prompts GRPO learns from.

Every sample is a plain dict (so a list of them is also a `datasets.Dataset`
for TRL) with at least

    prompt    the text the policy continues
    answer    the reference final answer, as a string ("132")
    task      the registered task's name, "arithmetic" | "multiply" | "countdown" | "chain" |
              "gsm8k" (grpo_edu.environment.registry: tells the accuracy reward how to check
              an answer)

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

Each task here is registered whole where it is written (`register_task`, at the end of its
section): its problems, its instruction, its answer check and its pretraining card.
"""

from __future__ import annotations

import functools
import json
import random
import re
import zlib
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterator, Sequence

from grpo_edu.environment.registry import TASKS, Pretraining, Task, generated_tasks, register_task, task_named
from grpo_edu.environment.rewards import answers_match
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


def numbers_match(predicted: str | None, row) -> bool:
    """The answer check of the tasks with a numeric answer: equal to the row's "answer" as
    numbers (grpo_edu.environment.rewards.answers_match)."""
    return answers_match(predicted, row.get("answer"))


_CHARACTER_LLAMA = """A {layers}-layer, {width}-wide Llama ({parameters:,} parameters, float32)
with a character-level tokenizer (`grpo_edu.policy.models.char_tokenizer`), trained by"""

register_task(Task(
    "arithmetic", "two-digit addition and subtraction, '47+85=' (the CPU tier's task)",
    instruction=("Compute the result. Think step by step inside <think> and </think>, then give the final answer "
                 "as \\boxed{number}."),
    check=numbers_match, pool=_arithmetic_pool,
    pretraining=Pretraining(
        card="""# tiny-arithmetic-start: grpo-edu's starting policy

""" + _CHARACTER_LLAMA + """
supervised fine-tuning on two-digit addition and subtraction (`grpo_edu.environment.tasks`,
e.g. `47+85=` -> `<think>12</think>\\boxed{{132}}`, the reasoning being the units
column) and stopped on purpose while it is still often wrong: it is the policy
GRPO starts from in chapters 5 and 6.""",
        report=('`grpo_edu.environment.tasks.arithmetic_problems("test")`', lambda: arithmetic_problems("test")),
        use="from grpo_edu.policy.models import load_policy\nmodel, tokenizer = load_policy()  # this directory")))


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


def tool_share_stream(config) -> Iterator[dict]:
    """multiply's pretraining samples: each draw's solution calls the calculator with probability
    config.tool_share (its own seeded coin), else it is the direct one, so the policy learns both
    and GRPO has something to choose between."""
    stream = iterate_samples("multiply", "train", seed=config.seed)
    coin = random.Random(f"tool-share/{config.seed}")
    return ({**sample, "solution": sample["solution"] if coin.random() < config.tool_share
             else sample["direct_solution"]} for sample in stream)


register_task(Task(
    "multiply", "two-digit multiplication, '47*85=', with a calculator to call (needs environment = "
                "'grpo_edu.training.episodes:Calculator')",
    instruction=("Compute the product. You may call a calculator: write [expression] and it answers =value. Think "
                 "step by step inside <think> and </think>, then give the final answer as \\boxed{number}."),
    check=numbers_match, pool=_multiply_pool,
    pretraining=Pretraining(
        card="""# {name}: a starting policy that calls a calculator sometimes

""" + _CHARACTER_LLAMA + """
supervised fine-tuning on two-digit multiplication (`grpo_edu.environment.tasks`, task "multiply"),
{tool_percent:.0f}% of its solutions calling the calculator (`47*85=` ->
`<think>[47*85]=3995</think>\\boxed{{3995}}`, the `=3995` written by
`grpo_edu.training.episodes.Calculator` and kept out of the loss), the rest answering in the head
(`<think>35</think>\\boxed{{3995}}`): the policy chapter 13's GRPO runs start from,
able to call the tool and to skip it.""",
        report=('`grpo_edu.environment.tasks.make_dataset("multiply", 816, "test", seed=0)`, every held-out one',
                lambda: make_dataset("multiply", 816, "test", seed=0)),
        use=("from grpo_edu.policy.models import TOOL_POLICY, load_policy\nmodel, tokenizer = load_policy(TOOL_POLICY)  "
             "# this directory; in a run's config: model = \"multiply-start\" (configs/cpu-tools.toml)"),
        environment="grpo_edu.training.episodes:Calculator", stream=tool_share_stream)))


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


def countdown_correct(predicted: str | None, numbers: Sequence[int], target: Any) -> bool:
    """True when `predicted` is an expression that uses each of `numbers` exactly
    once and evaluates to `target` (checked by this module's parser, not eval)."""
    if predicted is None or numbers is None or target is None:
        return False
    try:
        value = evaluate_expression(predicted)
        used = expression_numbers(predicted)
        return sorted(used) == sorted(int(n) for n in numbers) and value == Fraction(str(target))
    except (ExpressionError, ValueError, TypeError):
        return False


def countdown_check(predicted: str | None, row) -> bool:
    """Countdown's answer check: the row's "answer" is the target, and the answer must be an
    expression over the row's "numbers" (each used once) that reaches it."""
    if row.get("numbers") is None:
        raise ValueError("a countdown problem has no `numbers` column")
    return countdown_correct(predicted, row["numbers"], row.get("answer"))


register_task(Task(
    "countdown", "reach a target from three numbers, 'Use 3 5 7 to make 22:' (generated)",
    instruction=("Write an expression that uses each of the numbers exactly once, with + - * / and parentheses, and "
                 "equals the target. Think step by step inside <think> and </think>, then give the expression "
                 "itself (not its value) as \\boxed{expression}, for example \\boxed{(1+2)*3}, and nothing after "
                 "it."),
    check=countdown_check, draw=_draw_countdown,
    pretraining=Pretraining(
        card="""# {name}: a Countdown starting policy

""" + _CHARACTER_LLAMA + """
supervised fine-tuning on Countdown (`grpo_edu.environment.tasks`: reach a target from three numbers,
e.g. `Use 15 10 9 to make 34:` -> `<think>10+9=19 19+15=34</think>\\boxed{{10+9+15}}`) and
stopped while it is still often wrong: the starting policy of the GPU tier's download-free
recipe (configs/gpu-countdown-from-scratch.toml).""",
        report=('`grpo_edu.environment.tasks.make_dataset("countdown", 1000, "test", seed=0)`',
                lambda: make_dataset("countdown", 1000, "test", seed=0)))))


# --------------------------------------------------------------------------- datasets


def _check_task_and_split(task: str, split: str) -> None:
    if task not in generated_tasks():
        raise ValueError(f"task must be one of {generated_tasks()} (a task read from files: use its loader, e.g. "
                         f"load_gsm8k), got {task!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def _check_settings(task: str, settings) -> None:
    expected = TASKS[task].settings
    if settings is not None and (expected is None or not isinstance(settings, expected)):
        raise ValueError(f"settings: task {task!r} " + (f"takes a {expected.__name__}" if expected else "has none")
                         + f", got {type(settings).__name__}")


def iterate_samples(task: str = "arithmetic", split: str = "train", seed: int = 0, settings=None) -> Iterator[dict]:
    """An endless, seeded stream of samples of one split, uniform over its
    problems (duplicates possible). settings: the task's own section (digitsum's depths), for a
    task that has one; None, its defaults."""
    _check_task_and_split(task, split)
    _check_settings(task, settings)
    rng = random.Random(f"{task}/{split}/{seed}")
    registered = TASKS[task]
    if registered.pool is not None:  # small space: draw from the split's list
        pool = registered.pool(split)
        while True:
            yield dict(rng.choice(pool))
    while True:  # a space too big to list: draw, keep the split's
        sample = registered.draw_with(rng, settings)
        if split_of(sample["prompt"]) == split:
            yield sample


MAX_REPEATED_DRAWS = 200_000  # give up on finding a new distinct problem after this many


def make_dataset(task: str = "arithmetic", n: int = 1000, split: str = "train", seed: int = 0,
                 unique: bool = True, settings=None) -> list[dict]:
    """`n` samples of one split, distinct prompts unless unique=False. Same arguments,
    same list. settings: the task's own section, as iterate_samples takes it.

    The arithmetic and multiply spaces are small (16,200 problems: 14,624 train and
    1,576 held-out; 8,100), so asking for more distinct problems than a split holds is
    an error, not an endless loop.
    """
    _check_task_and_split(task, split)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    pool = TASKS[task].pool
    if pool is not None and unique and n > len(pool(split)):
        raise ValueError(f"n = {n} distinct {task} problems requested from split {split!r}, which "
                         f"holds {len(pool(split)):,}; ask for fewer or pass unique=False")
    samples, seen, misses = [], set(), 0
    stream = iterate_samples(task, split, seed, settings)
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


register_task(Task(
    "gsm8k", "grade-school maths word problems (Cobbe et al., 2021), read from `dataset` (the GPU recipes)",
    instruction=GSM8K_INSTRUCTION, instruction_in_prompt=True, check=numbers_match, load=load_gsm8k,
    example=gsm8k_sample("How many legs do 3 cats have?", "3 * 4 = 12\n#### 12")))


# --------------------------------------------------------------------------- instructions

def with_instruction(sample: dict) -> dict:
    """The sample with its task's instruction on a line after the problem (the registered
    task's instruction: the answer format both rewards score, grpo_edu.environment.rewards'
    <think>reasoning</think>\\boxed{answer} with nothing after it, and the task's rules):
    "Use 3 5 7 to make 22:" -> "Use 3 5 7 to make 22:\\n" + its instruction + "\\n".
    A sample whose prompt ends with it already (GSM8K's) is returned as it is."""
    task = task_named(sample.get("task"), "sample['task']")
    if task.instruction_in_prompt:
        return dict(sample)
    return {**sample, "prompt": f"{sample['prompt']}\n{task.instruction}\n"}


# --------------------------------------------------------------------------- a run's problems

TRAIN_POOL = 10_000  # distinct training problems a run's prompts are drawn from (with replacement; multiply: all 7,284)


def training_pool_size(task: str, size: int = TRAIN_POOL) -> int:
    """How many distinct training problems a run draws from: `size`, or all of a smaller
    task's train split (multiply: 7,284)."""
    pool = TASKS[task].pool
    return min(size, len(pool("train"))) if pool is not None else size


def training_problems(task: str, dataset: str, size: int = TRAIN_POOL, settings=None) -> list[dict]:
    """The problems a run's prompts are drawn from: a task read from files, its train split (from
    `dataset`); a generated one, training_pool_size(task, size) distinct train problems (a task with
    its own settings: drawn with them, repeats allowed)."""
    registered = task_named(task)
    if registered.load is not None:
        return registered.load("train", dataset)
    # A task's own settings can make its space small (digitsum at depth 3 has 912 train problems):
    # its pool is drawn with repeats, as the prompts are drawn from it.
    return make_dataset(task, n=training_pool_size(task, size), split="train", seed=0, settings=settings,
                        unique=registered.settings is None)


def task_settings(config):
    """The config's section of its task's own keys ([digitsum]), or None for a task without one."""
    return config.sections().get(config.run.task) if TASKS[config.run.task].settings is not None else None


def task_pools(config, tokenizer) -> tuple[list[dict], list[dict]]:
    """A training run's problems (config: a grpo_edu.config.TrainConfig, of which its task, its
    data section and eval_size are read): the registered task's pool the prompts are drawn from,
    and its held-out problems (the first eval_size of the test split), with their prompts as the
    policy reads them (the task's instruction added when task_instruction, then inside the
    tokenizer's chat template when chat_template). A task read from files reads `dataset`; a task
    with its own keys ([digitsum]) draws both with them."""
    task, data, eval_size = config.run.task, config.data, config.logging.eval_size
    settings = task_settings(config)
    train_pool = training_problems(task, data.dataset, settings=settings)
    if task_named(task).load is not None:
        held_out = task_named(task).load("test", data.dataset)[:eval_size]
    else:
        held_out = make_dataset(task, n=eval_size, split="test", seed=0, settings=settings)
    if data.task_instruction:
        train_pool, held_out = [with_instruction(s) for s in train_pool], [with_instruction(s) for s in held_out]
    if data.chat_template:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("config key 'chat_template' is true, but the tokenizer has no chat template "
                             "(not an instruct model?); set chat_template = false")

        def as_chat(sample: dict) -> dict:
            text = tokenizer.apply_chat_template([{"role": "user", "content": sample["prompt"]}],
                                                 add_generation_prompt=True, tokenize=False)
            return {**sample, "prompt": text}
        train_pool, held_out = [as_chat(s) for s in train_pool], [as_chat(s) for s in held_out]
    return train_pool, held_out
