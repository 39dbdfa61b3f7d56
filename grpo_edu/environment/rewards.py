"""Rule-based rewards: one scalar per completion, computed by a program, not a model.

The DeepSeek-R1 paper scores reasoning data with two rules, accuracy and
format, added with equal weight (eq. 4), plus a language-consistency reward
(eq. 7) against language mixing. Each function here has TRL's reward signature

    fn(completions, **kwargs) -> list[float]

where `completions` is a list of strings (or of chat message lists, whose last
message is used) and dataset columns such as `answer` arrive as keyword
arguments with one entry per completion. They therefore work unchanged as
`reward_funcs` of TRL's GRPOTrainer and in grpo_edu's own trainer.

Robustness is part of the contract: every function returns a finite float for
any string (empty, a megabyte long, unicode digits, unbalanced or deeply nested
braces, ...) in time linear in its length, and never raises on a completion.
Text is only ever scanned with `str.find` / `str.rfind`, bounded loops and
regular expressions without nested quantifiers.

The format a completion must have (`format_reward`):

    <think>REASONING</think>\\boxed{ANSWER}      or      <think>REASONING</think>Answer: ANSWER

with a non-empty reasoning, no other think tags, and nothing after the answer
(surrounding whitespace is ignored).
"""

from __future__ import annotations

import functools
import math
import re
from fractions import Fraction
from typing import Any, Callable, Mapping, Sequence

from grpo_edu.environment.registry import TASKS
from grpo_edu.policy.models import BOXED_OPEN, THINK_CLOSE, THINK_OPEN

MAX_ANSWER_CHARS = 200  # a final answer longer than this is not an answer


def completion_text(completion: Any) -> str:
    """The text of one completion: a string as is; a chat (list of {"role",
    "content"} messages, TRL's conversational format) its last message's content;
    anything else (None, numbers) the empty string."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and completion:
        last = completion[-1]
        if isinstance(last, Mapping) and isinstance(last.get("content"), str):
            return last["content"]
    return ""


def _per_completion(value: Any, n: int, name: str) -> list:
    """A keyword argument as a list of n values: a scalar is broadcast."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{name} must have one entry per completion ({n}), got {len(value)}")
        return list(value)
    return [value] * n


# --------------------------------------------------------------------------- answers

def matching_brace(text: str, open_index: int, limit: int = MAX_ANSWER_CHARS) -> int:
    """Index of the "}" closing the "{" at text[open_index], or -1 if it is not
    closed within `limit` characters (nested pairs are skipped)."""
    depth = 0
    for index in range(open_index, min(len(text), open_index + limit + 2)):
        character = text[index]
        if character == "{":
            depth += 1
        elif character == "}":
            depth -= 1
            if depth == 0:
                return index
    return -1


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (nested braces allowed), or None when
    there is none or it is not closed within MAX_ANSWER_CHARS characters."""
    start = text.rfind(BOXED_OPEN)
    if start < 0:
        return None
    open_index = start + len(BOXED_OPEN) - 1
    close = matching_brace(text, open_index)
    return None if close < 0 else text[open_index + 1:close]


_ANSWER_LINE = re.compile(r"(?:^|</think>)[ \t]*(?:final[ \t]+)?answer[ \t]*[:：]",
                          re.IGNORECASE | re.MULTILINE)
_GSM8K_LINE = re.compile(r"^[ \t]*####", re.MULTILINE)
_ANSWER_SENTENCE = re.compile(r"\bthe[ \t]+(?:final[ \t]+)?answer[ \t]+is[ \t]*:?", re.IGNORECASE)


def _rest_of_line(text: str, start: int) -> str:
    end = text.find("\n", start)
    return text[start:] if end < 0 else text[start:end]


def extract_answer(text: str, unboxed: bool = False) -> str | None:
    """The final answer of a completion, or None.

    In order: the last \\boxed{...}; else the last line starting with
    "Answer:" (or "Final answer:", any case; right after </think> counts as a
    line start); else the last GSM8K-style
    "#### ..." line; else, only with unboxed=True, the rest of the line after the last
    "the answer is" (any case; "The answer is 18." gives "18."). Off by default: R1's rule
    asks for a marked answer, and a sentence is easy to write by accident. The answer is
    stripped of surrounding whitespace.
    """
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    for pattern in (_ANSWER_LINE, _GSM8K_LINE) + ((_ANSWER_SENTENCE,) if unboxed else ()):
        last = None
        for last in pattern.finditer(text):
            pass
        if last is not None:
            line = _rest_of_line(text, last.end()).strip()
            return line if len(line) <= MAX_ANSWER_CHARS else None
    return None


_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)", re.ASCII)
_GROUPED = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?", re.ASCII)
_FRACTION = re.compile(r"([+-]?\d+)/(\d+)", re.ASCII)
_LATEX_FRACTION = re.compile(r"([+-]?)\\[dt]?frac\{(\d+)\}\{(\d+)\}", re.ASCII)
# m x 10^e, m \times 10^{e}, m \cdot 10^e, and 10^e alone (e: at most 3 digits, a sign allowed).
_POWER_OF_TEN = re.compile(r"(?:([+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*(?:\\times|\\cdot|\*|x|×)\s*)?10\^\{?([+-]?\d{1,3})\}?",
                           re.ASCII)
_WRAPPER = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_VARIABLE = re.compile(r"(?:[A-Za-z]\s*=\s*)+")
MAX_EXPONENT = 100   # 10^e with |e| above this is not read as a number (no huge integers built)


def normalise_answer(text: str) -> str:
    """The LaTeX and typography a model wraps a number in, removed: \\text{...} and its
    kin (their content kept), "$" and "\\$", "%" and "\\%" (25% is read as 25, the form
    GSM8K's answers take), thin spaces and "{,}" in 1{,}000, \\left / \\right, a leading
    "x =", a trailing period. Repeated until nothing changes, at most 4 times: linear in
    the length."""
    for _ in range(4):
        normalised = _normalise_once(text)
        if normalised == text:
            break
        text = normalised
    return text


def _normalise_once(text: str) -> str:
    text = text.replace("\u2212", "-")
    for _ in range(3):   # nested wrappers: \text{\textbf{18}}
        text = _WRAPPER.sub(r"\1", text)
    for old, new in (("\\$", ""), ("$", ""), ("\\%", ""), ("%", ""), ("{,}", ","), ("\\,", ""), ("\\!", ""),
                     ("\\left", ""), ("\\right", ""), ("\\ ", " ")):
        text = text.replace(old, new)
    text = text.strip()
    variable = _VARIABLE.match(text)
    if variable and len(text) > variable.end():
        text = text[variable.end():]
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1]
    return text.strip()


def parse_number(text: str) -> Fraction | None:
    """An answer string as an exact number, or None if it is not one.

    Accepted, after `normalise_answer`: "3", "03", "3.0", "+3", "-3", "1,000" (thousands
    separators), "3/4", "\\frac{3}{4}" (\\dfrac, \\tfrac), powers of ten ("10^6",
    "2 \\times 10^{3}", exponents up to MAX_EXPONENT), with the currency, percent and
    \\text{} wrappers removed. A unit word ("18 apples") is not a number here: R1's rule
    asks for the number. Only ASCII digits count: "٣" (Arabic-Indic three) and "３"
    (full-width) are not numbers here, although Python's int() accepts them, so a policy
    cannot be paid for an answer a reader would not read as 3.
    """
    if len(text) > 2 * MAX_ANSWER_CHARS:
        return None
    return _parse_number(text)


# Answers repeat, within a step (G completions of one prompt, its reference answer for each) and across
# steps. Remembered, a step of make train's run scores in 1.5 ms instead of 2.7 (the same numbers to the
# bit; this project's 2-core CPU, medians of 200 steps, two runs each). A Fraction is immutable, so
# sharing one is safe; keys are at most 2 x MAX_ANSWER_CHARS characters: the cache holds a few MB at most.
@functools.lru_cache(maxsize=1 << 14)
def _parse_number(text: str) -> Fraction | None:
    text = normalise_answer(text)
    if not text or len(text) > 64:
        return None
    if _GROUPED.fullmatch(text):
        text = text.replace(",", "")
    if _DECIMAL.fullmatch(text):
        return Fraction(text)
    power = _POWER_OF_TEN.fullmatch(text)
    if power:
        mantissa, exponent = power.groups()
        if abs(int(exponent)) > MAX_EXPONENT:
            return None
        return Fraction(mantissa or 1) * Fraction(10) ** int(exponent)
    for pattern in (_FRACTION, _LATEX_FRACTION):
        match = pattern.fullmatch(text)
        if match:
            sign, numerator, denominator = (("", *match.groups()) if pattern is _FRACTION
                                            else match.groups())
            if int(denominator) == 0:
                return None
            return Fraction(int(sign + numerator), int(denominator))
    return None


def answers_match(predicted: str | None, reference: Any) -> bool:
    """Exact match after normalisation: equal as numbers when both parse as
    numbers (3 == 3.0 == 03), else equal as whitespace-collapsed strings."""
    if predicted is None or reference is None:
        return False
    reference = str(reference)
    predicted_number, reference_number = parse_number(predicted), parse_number(reference)
    if reference_number is not None:
        return predicted_number == reference_number
    return " ".join(predicted.split()) == " ".join(reference.split()) != ""


def accuracy_reward(completions: Sequence, answer: Any = None, task: Any = None,
                    numbers: Any = None, unboxed: bool = False, **kwargs) -> list[float]:
    """1.0 when the completion's final answer (`extract_answer`) is right, else 0.0.

    answer: the reference answer per completion (a dataset column; a scalar is
        broadcast). For task "countdown" it is the target, and the answer must be
        an expression over `numbers` (each used once) that reaches it.
    task: per-completion task name (optional): its registered answer check
        (grpo_edu.environment.registry.Task.check) judges; no task, or one not registered,
        compares answers with `answers_match`.
    unboxed: also read an answer given as a sentence, "The answer is 18." (extract_answer;
        off by default, as R1's rule; config key unboxed_answers).
    """
    if answer is None:
        raise ValueError("accuracy_reward needs `answer`: the reference answer per completion "
                         "(a dataset column named 'answer', or a scalar for all)")
    n = len(completions)
    answers = _per_completion(answer, n, "answer")
    tasks = _per_completion(task, n, "task")
    numbers_per = _per_completion(numbers, n, "numbers")
    scores = []
    for index, (completion, reference, kind, pool) in enumerate(zip(completions, answers, tasks, numbers_per)):
        predicted = extract_answer(completion_text(completion), unboxed=unboxed)
        registered = TASKS.get(kind) if isinstance(kind, str) else None
        if registered is None:
            correct = answers_match(predicted, reference)
        else:
            try:
                correct = registered.check(predicted, {"answer": reference, "task": kind, "numbers": pool})
            except ValueError as error:
                raise ValueError(f"completion {index}: {error}") from error
        scores.append(1.0 if correct else 0.0)
    return scores


# --------------------------------------------------------------------------- format

_ANSWER_TAIL = re.compile(r"(?:final[ \t]+)?answer[ \t]*[:：][ \t]*\S[^\n]*", re.IGNORECASE)


def _is_final_answer(rest: str) -> bool:
    if len(rest) > MAX_ANSWER_CHARS + len(BOXED_OPEN) + 1:
        return False
    if rest.startswith(BOXED_OPEN):
        close = matching_brace(rest, len(BOXED_OPEN) - 1)
        return close == len(rest) - 1 and rest[len(BOXED_OPEN):close].strip() != ""
    return _ANSWER_TAIL.fullmatch(rest) is not None


def has_format(text: str) -> bool:
    """<think>non-empty reasoning</think> then one final answer, nothing after."""
    text = text.strip()
    if not text.startswith(THINK_OPEN):
        return False
    close = text.find(THINK_CLOSE)
    if close < 0:
        return False
    reasoning = text[len(THINK_OPEN):close]
    if not reasoning.strip() or THINK_OPEN in reasoning:
        return False
    rest = text[close + len(THINK_CLOSE):].strip()
    if THINK_OPEN in rest or THINK_CLOSE in rest:
        return False
    return _is_final_answer(rest)


def format_reward(completions: Sequence, **kwargs) -> list[float]:
    """1.0 when the completion is exactly <think>reasoning</think> followed by a
    final answer (\\boxed{...} or an "Answer: ..." line) and nothing else, else 0.0."""
    return [1.0 if has_format(completion_text(c)) else 0.0 for c in completions]


# --------------------------------------------------------------------------- language

# A "word" is a maximal run of letters (Unicode categories L*, so digits,
# symbols and markup separate words), except that each CJK ideograph is a word
# on its own (Chinese is written without spaces). A word is in the target
# language when its letters are in that language's script: English = ASCII
# letters only ("café" is not English), Chinese = a CJK ideograph.
_IDEOGRAPHS = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_LETTER = rf"[^\W\d_{_IDEOGRAPHS}]"  # a letter that is not an ideograph
_WORD = re.compile(rf"[{_IDEOGRAPHS}]|{_LETTER}+")
# Lookarounds pin matches to whole words: a match can only start where a word
# starts, so the scan stays linear.
LANGUAGES: dict[str, re.Pattern] = {
    "en": re.compile(rf"(?<!{_LETTER})[A-Za-z]+(?!{_LETTER})"),
    "zh": re.compile(f"[{_IDEOGRAPHS}]"),
}


def _count(pattern: re.Pattern, text: str) -> int:
    return pattern.subn("", text)[1]  # counts in C, without a list of a million matches


def reasoning_text(text: str) -> str | None:
    """The text between the first <think> and the next </think> (to the end when
    unclosed), or None when there is no <think>."""
    start = text.find(THINK_OPEN)
    if start < 0:
        return None
    start += len(THINK_OPEN)
    end = text.find(THINK_CLOSE, start)
    return text[start:] if end < 0 else text[start:end]


def language_consistency(text: str, language: str = "en") -> float:
    """Num(target-language words) / Num(words) in the reasoning (R1, eq. 7).

    1.0 when the reasoning has no words at all (digits and symbols only:
    nothing is mixed); 0.0 when there is no reasoning (no <think>).
    """
    if language not in LANGUAGES:
        raise ValueError(f"language must be one of {tuple(LANGUAGES)}, got {language!r}")
    reasoning = reasoning_text(text)
    if reasoning is None:
        return 0.0
    words = _count(_WORD, reasoning)
    if not words:
        return 1.0
    return _count(LANGUAGES[language], reasoning) / words


def language_consistency_reward(completions: Sequence, language: Any = "en", **kwargs) -> list[float]:
    """The share of reasoning words in the target `language` ("en" or "zh"; a
    scalar, or a dataset column with one language per completion)."""
    languages = _per_completion(language, len(completions), "language")
    return [language_consistency(completion_text(c), lang) for c, lang in zip(completions, languages)]


# --------------------------------------------------------------------------- weighted sum

REWARD_FUNCTIONS: dict[str, Callable[..., list[float]]] = {
    "accuracy": accuracy_reward,
    "format": format_reward,
    "language_consistency": language_consistency_reward,
}
R1_WEIGHTS = {"accuracy": 1.0, "format": 1.0}  # the DeepSeek-R1 paper's eq. 4: same weight


class CombinedReward:
    """sum_k weight_k * reward_k, callable like any reward function; `components`
    also returns each reward (unweighted) for logging."""

    def __init__(self, weights: Mapping[str, float],
                 functions: Mapping[str, Callable[..., list[float]]] | None = None):
        functions = dict(REWARD_FUNCTIONS if functions is None else functions)
        if not weights:
            raise ValueError("weights must name at least one reward")
        for name, weight in weights.items():
            if name not in functions:
                raise ValueError(f"weights has unknown reward {name!r}; known: {sorted(functions)}")
            if not isinstance(weight, (int, float)) or not math.isfinite(weight):
                raise ValueError(f"weights[{name!r}] must be a finite number, got {weight!r}")
        self.weights = {name: float(weight) for name, weight in weights.items()}
        self.functions = {name: functions[name] for name in self.weights}
        self.__name__ = "combined_reward"  # TRL names logged rewards after __name__

    def components(self, completions: Sequence, **kwargs) -> dict[str, list[float]]:
        """{name: that reward per completion, ..., "reward": the weighted sum}."""
        scores = {}
        for name, function in self.functions.items():
            values = [float(v) for v in function(completions, **kwargs)]
            if len(values) != len(completions):
                raise ValueError(f"reward {name!r} returned {len(values)} values for "
                                 f"{len(completions)} completions")
            bad = [v for v in values if not math.isfinite(v)]
            if bad:
                raise ValueError(f"reward {name!r} returned a non-finite value {bad[0]}")
            scores[name] = values
        scores["reward"] = [sum(self.weights[name] * scores[name][i] for name in self.functions)
                            for i in range(len(completions))]
        return scores

    def __call__(self, completions: Sequence, **kwargs) -> list[float]:
        return self.components(completions, **kwargs)["reward"]

    def __repr__(self) -> str:
        terms = " + ".join(f"{w:g}*{name}" for name, w in self.weights.items())
        return f"CombinedReward({terms})"


def combined_reward(weights: Mapping[str, float] | None = None) -> CombinedReward:
    """The weighted sum of named rewards; default R1's accuracy + format."""
    return CombinedReward(R1_WEIGHTS if weights is None else weights)


# --------------------------------------------------------------------------- length

def check_overlong_cache(cache, max_completion_length: int, name: str = "cache", allow_off: bool = False) -> None:
    """The soft overlong punishment's stretch: an int in [1, L) (allow_off: [0, L), 0 = off)."""
    low = 0 if allow_off else 1
    if isinstance(cache, bool) or not isinstance(cache, int) or not low <= cache < max_completion_length:
        raise ValueError(f"{name} must be an int in [{low}, max_completion_length = {max_completion_length}) (the "
                         f"stretch before the limit where the punishment falls from 0 to -1{'; 0 = off' if allow_off else ''}), "
                         f"got {cache!r}")


def soft_overlong_punishment(lengths, max_completion_length: int, cache: int):
    """DAPO's soft overlong punishment (config key overlong_cache), a reward term from token counts:
    0 up to L - cache tokens, then falling linearly to -1 at the limit L (= max_completion_length,
    where a completion is cut): ((L - cache) - |o|) / cache. (N,) tensor -> (N,) float64; TRL 1.16's
    trl.rewards.get_soft_overlong_punishment(L, cache) to the bit (tests/test_overlong.py)."""
    import torch
    check_overlong_cache(cache, max_completion_length)
    expected = max_completion_length - cache
    over = lengths.to(torch.float64) - expected
    return torch.where(over <= 0, 0.0, torch.where(lengths <= max_completion_length, -over / cache, -1.0))
