"""digitsum: the sum mod 10 of n digits, a task whose depth n is a setting (chapter 9).

The prompt puts a letter before each digit, an index hint (Zhou et al., 2024, "What Algorithms
can Transformers Learn? A Study in Length Generalization"):

    prompt  "a3b8c5d1e9="        answer "6"   (3 + 8 + 5 + 1 + 9 = 26)

A completion answers in one of three formats, all in the markup the accuracy reward reads:

    direct   "<think></think>\\boxed{6}"                   no working: the answer in one go
    worked   "<think>a33b81c56d17e96</think>\\boxed{6}"    each step: the letter, the digit it
                                                           reads, the running value
    check    "<think>a33b81c57!c56d17e96</think>\\boxed{6}"  a running value wrong, "!", the
                                                           step redone

A written step finds its digit by its letter (a lookup in the prompt by content) and the
previous running value three tokens back, at every depth; a direct answer needs all n digits in
one forward pass. So working is worth it for a small model exactly where n is large. The
precondition (chapter 9), measured: with a 2-layer Llama, worked chains are right at every
depth it was taught, direct answers no better than chance past the shortest.

    draw, digitsum_sample     problems; the held-out split by problem (tasks.split_of)
    held_out_by_depth         held-out problems of each depth
    Mixture                   a pretraining mixture: format shares, depths, the checks' errors
    read_format, check_events what a completion does: its format, and what each "!" did
    completion_metrics        per completion, for a run's metrics (format shares, checks)
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass
from typing import Iterator, Sequence

from grpo_edu.environment.registry import Pretraining, Task, register_task
from grpo_edu.environment.tasks import make_dataset, numbers_match, split_of
from grpo_edu.policy.models import BOXED_OPEN, THINK_CLOSE, THINK_OPEN, completion_text
from grpo_edu.runtime.settings import Section, setting

LETTERS = string.ascii_lowercase
FORMATS = ("direct", "worked", "check")
CHECK = "!"


def check_depths(depths, name: str = "digitsum_depths") -> None:
    if (not isinstance(depths, (list, tuple)) or len(depths) != 2
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in depths)
            or not 1 <= depths[0] <= depths[1] <= len(LETTERS)):
        raise ValueError(f"{name} must be [lowest, highest] depths (digit counts) with 1 <= lowest <= highest <= "
                         f"{len(LETTERS)}, got {depths!r}")


@dataclass
class DigitSumSettings(Section):
    """[digitsum]: the task's own keys (task = 'digitsum')."""

    title = "digitsum"

    digitsum_depths: list = setting("task = 'digitsum': [lowest, highest]: a run's problems have a depth (digit "
                                    "count) drawn uniformly from this range", [3, 12], check=check_depths,
                                    trl_note="train_dataset draws the task's problems with it")


# --------------------------------------------------------------------------- problems

def prompt_of(digits: Sequence[int]) -> str:
    return "".join(f"{LETTERS[i]}{d}" for i, d in enumerate(digits)) + "="


def running_values(digits: Sequence[int]) -> list[int]:
    values, total = [], 0
    for digit in digits:
        total = (total + digit) % 10
        values.append(total)
    return values


def step_text(i: int, digit: int, value: int) -> str:
    """One written step: the letter, the digit read, the running value ("c56")."""
    return f"{LETTERS[i]}{digit}{value}"


def digitsum_sample(digits: Sequence[int]) -> dict:
    """The sample for `digits`: prompt, answer, depth, the worked `solution` and the
    `direct_solution`."""
    digits = [int(d) for d in digits]
    if not 1 <= len(digits) <= len(LETTERS) or not all(0 <= d <= 9 for d in digits):
        raise ValueError(f"digits must be 1 to {len(LETTERS)} digits 0..9, got {digits!r}")
    values = running_values(digits)
    answer = str(values[-1])
    worked = "".join(step_text(i, d, v) for i, (d, v) in enumerate(zip(digits, values)))
    return {"prompt": prompt_of(digits), "answer": answer, "task": "digitsum", "digits": digits,
            "depth": len(digits), "solution": completion_text(worked, answer),
            "direct_solution": completion_text("", answer)}


def draw(rng: random.Random, settings: DigitSumSettings | None = None) -> dict:
    """A problem: a depth drawn uniformly from settings.digitsum_depths, then that many digits."""
    low, high = (settings or DigitSumSettings()).digitsum_depths
    n = rng.randint(low, high)
    return digitsum_sample([rng.randrange(10) for _ in range(n)])


def held_out_by_depth(depths: Sequence[int], per_depth: int, seed: int = 0) -> dict[int, list[dict]]:
    """Up to `per_depth` distinct held-out problems of each depth (a depth whose space is small,
    all of its held-out problems: depth 3 has 88)."""
    out = {}
    for n in depths:
        rng = random.Random(f"digitsum-held-out/{n}/{seed}")
        if 10 ** n <= 20 * per_depth:   # small: list the space
            pool = [digitsum_sample([int(c) for c in f"{i:0{n}d}"]) for i in range(10 ** n)]
            pool = [s for s in pool if split_of(s["prompt"]) == "test"]
            rng.shuffle(pool)
            out[n] = pool[:per_depth]
            continue
        seen, chosen = set(), []
        while len(chosen) < per_depth:
            sample = digitsum_sample([rng.randrange(10) for _ in range(n)])
            if sample["prompt"] not in seen and split_of(sample["prompt"]) == "test":
                seen.add(sample["prompt"])
                chosen.append(sample)
        out[n] = chosen
    return out


# --------------------------------------------------------------------------- pretraining mixtures

def headroom_weights(low: int, high: int) -> dict[int, float]:
    """Mostly short chains, few at the top depth, none beyond it: weight max(2, high + 1 - n),
    normalised (3..12: 10 9 8 7 6 5 4 3 2 2 of 56, the top depth 3.6%)."""
    raw = {n: float(max(2, high + 1 - n)) for n in range(low, high + 1)}
    total = sum(raw.values())
    return {n: weight / total for n, weight in raw.items()}


def check_completion(digits: Sequence[int], rng: random.Random, end_wrong: bool = False) -> str:
    """A check trace: one step (not the first) written wrong, "!", the step redone right. With
    end_wrong, a later step is also wrong, not flagged, and the chain goes on from it: the answer
    is wrong (Gandhi et al., 2025: priming with checks that fail too)."""
    n = len(digits)
    if n < 2:
        raise ValueError(f"a check needs at least 2 digits, got {n}")
    flagged = rng.randrange(1, n - 1 if end_wrong and n > 2 else n)
    unflagged = rng.randrange(flagged + 1, n) if end_wrong and flagged + 1 < n else None
    parts, total = [], 0
    for i, digit in enumerate(digits):
        right = (total + digit) % 10
        if i == flagged:
            parts.append(step_text(i, digit, rng.choice([v for v in range(10) if v != right])) + CHECK)
        if i == unflagged:
            right = rng.choice([v for v in range(10) if v != right])
        parts.append(step_text(i, digit, right))
        total = right
    return completion_text("".join(parts), str(total))


@dataclass(frozen=True)
class Mixture:
    """A pretraining mixture: the share of each format, the depths and their weights (headroom:
    mostly short), the top depth with worked chains (above it: direct answers only), and the
    share of check traces that end wrong."""

    direct: float = 0.5
    worked: float = 0.4
    check: float = 0.1
    depths: tuple[int, int] = (3, 12)
    worked_max_depth: int = 0       # 0: worked chains at every depth
    check_wrong_share: float = 0.25

    def __post_init__(self):
        shares = (self.direct, self.worked, self.check)
        if min(shares) < 0 or abs(sum(shares) - 1) > 1e-9:
            raise ValueError(f"mixture: the format shares (direct, worked, check) must be >= 0 and sum to 1, got "
                             f"{shares}")
        check_depths(list(self.depths), "mixture depths")
        if not 0 <= self.check_wrong_share <= 1:
            raise ValueError(f"mixture: check_wrong_share must be in [0, 1], got {self.check_wrong_share}")

    def describe(self) -> str:
        """The mixture in words, for a model card."""
        shares = ", ".join(f"{name} {getattr(self, name):.0%}" for name in FORMATS)
        worked = (f"worked and check traces up to depth {self.worked_max_depth}, direct answers only above it"
                  if self.worked_max_depth else "every format at every depth")
        low, high = self.depths
        weights = headroom_weights(low, high)
        return (f"{shares}; depths {low} to {high}, mostly short (depth {low} {weights[low]:.1%} of the problems, "
                f"depth {high} {weights[high]:.1%}, none beyond); {worked}; {self.check_wrong_share:.0%} of the "
                f"check traces end wrong (a second wrong value, not flagged)")

    @classmethod
    def parse(cls, text: str, **options) -> "Mixture":
        """'direct=0.5,worked=0.4,check=0.1' -> Mixture (the other fields from options)."""
        shares = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, _, value = part.partition("=")
            try:
                if name not in FORMATS or name in shares:
                    raise ValueError
                shares[name] = float(value)
            except ValueError:
                raise ValueError(f"--mixture: expected each of {FORMATS} at most once as name=share, got {part!r} "
                                 f"in {text!r}") from None
        return cls(**{**{f: 0.0 for f in FORMATS}, **shares}, **options)

    def stream(self, seed: int = 0) -> Iterator[dict]:
        """Endless training samples, each with its `solution` in the format drawn and `format`."""
        rng = random.Random(f"digitsum-mixture/{seed}")
        depths, weights = zip(*sorted(headroom_weights(*self.depths).items()))
        while True:
            n = rng.choices(depths, weights)[0]
            digits = [rng.randrange(10) for _ in range(n)]
            sample = digitsum_sample(digits)
            if split_of(sample["prompt"]) != "train":
                continue
            chosen = rng.choices(FORMATS, (self.direct, self.worked, self.check))[0]
            if self.worked_max_depth and n > self.worked_max_depth or (chosen == "check" and n < 2):
                chosen = "direct" if self.worked_max_depth and n > self.worked_max_depth else "worked"
            if chosen == "direct":
                sample["solution"] = sample["direct_solution"]
            elif chosen == "check":
                sample["solution"] = check_completion(digits, rng, rng.random() < self.check_wrong_share)
            yield {**sample, "format": chosen}


MAIN_MIXTURE = "direct=0.5,worked=0.4,check=0.1"


def parse_depths(text: str) -> tuple[int, int]:
    """'3-12' -> (3, 12)."""
    low, dash, high = text.partition("-")
    if not (dash and low.strip().isdigit() and high.strip().isdigit()):
        raise ValueError(f"--depths: expected 'lowest-highest' such as '3-12', got {text!r}")
    depths = (int(low), int(high))
    check_depths(list(depths), "--depths")
    return depths


def mixture_of(config) -> Mixture:
    """The pretraining config's mixture (python -m grpo_edu.commands.pretrain --mixture ...)."""
    return Mixture.parse(config.mixture or MAIN_MIXTURE, depths=parse_depths(config.depths),
                         worked_max_depth=config.worked_max_depth, check_wrong_share=config.check_wrong_share)


def pretraining_stream(config) -> Iterator[dict]:
    return mixture_of(config).stream(config.seed)


# --------------------------------------------------------------------------- reading completions

_REASONING = re.compile(r"(?:[a-z]\d\d!?)+")
_STEP = re.compile(r"([a-z])(\d)(\d)(!?)")


def _parts(text: str) -> tuple[str, str] | None:
    """(reasoning, what follows </think>) of a completion in the markup, else None (nothing may
    come before <think>)."""
    if not text.startswith(THINK_OPEN) or THINK_CLOSE not in text:
        return None
    reasoning, _, rest = text[len(THINK_OPEN):].partition(THINK_CLOSE)
    return reasoning, rest


def read_format(completion: str) -> str:
    """'direct' (empty reasoning), 'worked' (steps of letter, digit, value), 'check' (such steps
    with a '!'), else 'other': anything else, including a boxed answer missing or followed by text."""
    parts = _parts(completion)
    if parts is None:
        return "other"
    reasoning, rest = parts
    if not (rest.startswith(BOXED_OPEN) and rest.endswith("}") and rest.count("}") == 1):
        return "other"
    if reasoning == "":
        return "direct"
    if not _REASONING.fullmatch(reasoning):
        return "other"
    return "check" if CHECK in reasoning else "worked"


def check_events(completion: str, digits: Sequence[int]) -> list[dict[str, bool]]:
    """Each '!' of a completion: whether the value it flags was wrong (against the running value the
    completion itself last accepted, and the digit of the step's letter), and whether the step
    that follows redoes it right."""
    parts = _parts(completion)
    if parts is None:
        return []
    steps = _STEP.findall(parts[0])
    events, accepted = [], 0
    for k, (letter, _digit, value, flagged) in enumerate(steps):
        i = LETTERS.index(letter)
        expected = (accepted + digits[i]) % 10 if i < len(digits) else None
        if flagged:
            following = steps[k + 1] if k + 1 < len(steps) else None
            events.append({"flagged_wrong": expected is not None and int(value) != expected,
                           "redo_right": following is not None and following[0] == letter
                           and expected is not None and int(following[2]) == expected})
        else:
            accepted = int(value)
    return events


def completion_metrics(completions: Sequence[str], rows: Sequence[dict]) -> dict[str, list[float]]:
    """Per completion, what a run logs of this task (each averaged over the rollout): the format
    (format/direct, /worked, /check, /other: 1 or 0), the checks it wrote (checks/written), those
    on a wrong value (checks/on_wrong) and those whose redo is right (checks/fixed)."""
    out: dict[str, list[float]] = {f"format/{name}": [] for name in (*FORMATS, "other")}
    out.update({"checks/written": [], "checks/on_wrong": [], "checks/fixed": []})
    for text, row in zip(completions, rows, strict=True):
        shape = read_format(text)
        for name in (*FORMATS, "other"):
            out[f"format/{name}"].append(float(shape == name))
        events = check_events(text, row["digits"])
        out["checks/written"].append(float(len(events)))
        out["checks/on_wrong"].append(float(sum(e["flagged_wrong"] for e in events)))
        out["checks/fixed"].append(float(sum(e["flagged_wrong"] and e["redo_right"] for e in events)))
    return out


register_task(Task(
    "digitsum", "the sum mod 10 of n digits with index hints, 'a3b8c5d1e9=': its depth n set by [digitsum] (chapter 9)",
    instruction=("Add the digits mod 10. Think step by step inside <think> and </think>, writing each digit's "
                 "letter, the digit and the running sum mod 10, then give the final digit as \\boxed{digit}."),
    check=numbers_match, draw=draw, settings=DigitSumSettings, completion_metrics=completion_metrics,
    pretraining=Pretraining(
        card="""# {name}: a digitsum base, pretrained on a mixture we wrote

A {layers}-layer, {width}-wide Llama ({parameters:,} parameters, float32)
with a character-level tokenizer (`grpo_edu.policy.models.char_tokenizer`), trained by
supervised fine-tuning from random weights on the digit-sum task (`grpo_edu.environment.digitsum`:
`a3b8c5d1e9=` -> the sum mod 10) with completions in three formats, in the shares of its mixture:
{mixture_text}. A base for chapter 9's question: what GRPO does with the behaviours its
pretraining put there.""",
        report=('`grpo_edu.environment.tasks.make_dataset("digitsum", 1000, "test", seed=0)` (depths 3 to 12)',
                lambda: _report_set()),
        stream=pretraining_stream, mixture=("mixture", "depths", "worked_max_depth", "check_wrong_share"),
        describe=lambda config: mixture_of(config).describe(),
        extra="grpo_edu.training.reasoning:precondition_card")))


def _report_set() -> list[dict]:
    return make_dataset("digitsum", 1000, "test", seed=0)
