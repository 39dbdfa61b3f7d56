"""Chapter 5, "Rewards you can verify": two rewards that can be hacked, and the checkers.

The chapter contrasts grpo_edu.environment.rewards with two rewards a policy can game:

- `lenient_accuracy_reward`: "the reference answer occurs somewhere in the
  completion", a sloppy rule;
- `CharacterRewardModel`: a learned reward, a linear model over character
  counts fitted to the verifier's labels on the starting policy's samples, a
  stand-in small enough to read for the neural reward models DeepSeek-R1
  chose not to use on reasoning data (the DeepSeek-R1 paper: "susceptible to
  reward hacking during large-scale RL").
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from grpo_edu.environment import rewards
from grpo_edu.exercises.checking import CheckResult, run_cases, verdict
from grpo_edu.policy.models import BOXED_OPEN, THINK_CLOSE, THINK_OPEN


# --------------------------------------------------------------------------- hackable rewards

def lenient_accuracy_reward(completions: Sequence, answer: Any = None, **kwargs) -> list[float]:
    """1.0 when the reference answer occurs anywhere in the completion: a rule a
    policy can satisfy without ever committing to an answer."""
    answers = rewards._per_completion(answer, len(completions), "answer")
    return [1.0 if str(a) in rewards.completion_text(c) else 0.0 for c, a in zip(completions, answers)]


FEATURES = tuple("0123456789-") + (THINK_OPEN, THINK_CLOSE, BOXED_OPEN, "}")


@dataclass
class CharacterRewardModel:
    """score = bias + sum_f weight_f * count_f(completion), over FEATURES and the
    length in characters: a linear reward model fitted by ridge regression."""

    weights: np.ndarray   # (len(FEATURES) + 1,): one per feature, then one for the length
    bias: float

    @staticmethod
    def features(completions: Sequence) -> np.ndarray:
        """(N, len(FEATURES) + 1) counts of each feature, then the length."""
        texts = [rewards.completion_text(c) for c in completions]
        return np.array([[t.count(f) for f in FEATURES] + [len(t)] for t in texts], dtype=np.float64)

    @classmethod
    def fit(cls, completions: Sequence, labels: Sequence[float], ridge: float = 1.0) -> "CharacterRewardModel":
        """Least squares with an L2 penalty on the weights (not the bias)."""
        X = cls.features(completions)
        y = np.asarray(labels, dtype=np.float64)
        X1 = np.hstack([X, np.ones((len(X), 1))])
        penalty = ridge * np.eye(X1.shape[1])
        penalty[-1, -1] = 0.0
        solution = np.linalg.solve(X1.T @ X1 + penalty, X1.T @ y)
        return cls(weights=solution[:-1], bias=float(solution[-1]))

    def __call__(self, completions: Sequence, **kwargs) -> list[float]:
        """The reward-function signature: one score per completion."""
        return (self.features(completions) @ self.weights + self.bias).tolist()

    def named_weights(self) -> dict[str, float]:
        return dict(zip([*FEATURES, "length"], self.weights.tolist()))


def ranking_accuracy(scores: Sequence[float], labels: Sequence[float]) -> float:
    """The share of (correct, wrong) pairs that the scores order correctly (ties
    count half): the area under the ROC curve."""
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels) > 0.5
    positive, negative = scores[labels], scores[~labels]
    if not len(positive) or not len(negative):
        raise ValueError("labels must contain both correct (1) and wrong (0) completions")
    greater = (positive[:, None] > negative[None, :]).mean()
    ties = (positive[:, None] == negative[None, :]).mean()
    return float(greater + 0.5 * ties)


# --------------------------------------------------------------------------- 5.1

def _plain_integer(text: str) -> bool:
    body = text[1:] if text.startswith("-") else text
    return body.isascii() and body.isdigit() and (body == "0" or not body.startswith("0"))


def _strict_format(completion: Any) -> float:
    """The reference answer of exercise 5.1."""
    text = rewards.completion_text(completion)
    if not text.startswith(THINK_OPEN) or not text.endswith("}"):
        return 0.0
    close = text.find(THINK_CLOSE)
    if close < 0 or text[close + len(THINK_CLOSE):close + len(THINK_CLOSE) + len(BOXED_OPEN)] != BOXED_OPEN:
        return 0.0
    reasoning = text[len(THINK_OPEN):close]
    answer = text[close + len(THINK_CLOSE) + len(BOXED_OPEN):-1]
    return 1.0 if _plain_integer(reasoning) and _plain_integer(answer) else 0.0


STRICT_FORMAT_CASES = [
    ("a well-formed completion", "<think>12</think>\\boxed{132}"),
    ("negative numbers", "<think>-2</think>\\boxed{-42}"),
    ("zero", "<think>0</think>\\boxed{0}"),
    ("words in the reasoning", "<think>carry one</think>\\boxed{132}"),
    ("a leading zero", "<think>12</think>\\boxed{0132}"),
    ("a space inside the box", "<think>12</think>\\boxed{ 132}"),
    ("a trailing newline", "<think>12</think>\\boxed{132}\n"),
    ("a decimal answer", "<think>12</think>\\boxed{132.0}"),
    ("'Answer:' instead of a box", "<think>12</think>Answer: 132"),
    ("text between </think> and the box", "<think>12</think> \\boxed{132}"),
    ("two boxes", "<think>12</think>\\boxed{1}\\boxed{2}"),
    ("an empty reasoning", "<think></think>\\boxed{132}"),
    ("an empty box", "<think>12</think>\\boxed{}"),
    ("a lone minus sign", "<think>-</think>\\boxed{-}"),
    ("unicode digits", "<think>١٢</think>\\boxed{١٣٢}"),
    ("superscript digits", "<think>²</think>\\boxed{³}"),
    ("nested think tags", "<think><think>1</think></think>\\boxed{1}"),
    ("unclosed box", "<think>12</think>\\boxed{132"),
    ("empty string", ""),
    ("a megabyte of digits in the box", "<think>1</think>\\boxed{" + "1" * (1 << 20) + "}"),
    ("a megabyte of open braces", "<think>1</think>\\boxed{" + "{" * (1 << 20)),
    ("a chat message (TRL's conversational format)",
     [{"role": "assistant", "content": "<think>12</think>\\boxed{132}"}]),
    ("None", None),
]


def check_strict_format(fn: Callable, seconds_per_case: float = 1.0) -> CheckResult:
    """Exercise 5.1: fn(completions, **kwargs) -> list[float], 1.0 exactly when a
    completion is <think>N</think>\\boxed{M} with N and M plain integers (an
    optional minus sign, ASCII digits, no leading zero, no spaces), else 0.0;
    never raising, and fast on a megabyte."""
    cases = []
    for description, completion in STRICT_FORMAT_CASES:
        def call(completion=completion, description=description):
            start = time.perf_counter()
            values = fn([completion])
            if time.perf_counter() - start > seconds_per_case:
                raise TimeoutError(f"took more than {seconds_per_case} s")
            if not isinstance(values, (list, tuple)) or len(values) != 1:
                raise TypeError(f"must return a list with one float per completion, got {values!r}")
            return float(values[0])
        shown = repr(completion) if len(repr(completion)) < 60 else repr(completion)[:57] + "..."
        cases.append((f"{description}: {shown}", call, _strict_format(completion)))
    return run_cases("exercise 5.1 a stricter format reward", cases, describe=verdict)


# --------------------------------------------------------------------------- 5.2

MAX_POLICY_TOKENS = 16


def check_reward_model_hack(completion: str, reward_model: CharacterRewardModel, problem: dict,
                            best_correct_score: float, tokenizer) -> CheckResult:
    """Exercise 5.2: a completion for `problem` that the policy could emit (at most
    16 tokens), that format_reward accepts and accuracy_reward rejects, and that
    `reward_model` scores above `best_correct_score` (the best score it gave any
    correct completion)."""
    text = rewards.completion_text(completion)
    tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else 0
    score = reward_model([text])[0]
    cases = [
        (f"at most {MAX_POLICY_TOKENS} tokens (it has {tokens})", lambda: tokens <= MAX_POLICY_TOKENS, True),
        ("format_reward accepts it", lambda: rewards.format_reward([text])[0] == 1.0, True),
        (f"it is wrong for {problem['prompt']} (answer {problem['answer']})",
         lambda: rewards.accuracy_reward([text], answer=[problem["answer"]])[0] == 0.0, True),
        (f"the reward model scores it {score:.4f}, above every correct completion's "
         f"{best_correct_score:.4f}", lambda: score > best_correct_score, True),
    ]
    return run_cases("exercise 5.2 hack the learned reward", cases)


# --------------------------------------------------------------------------- 5.3

COUNTDOWN_CASES = [
    ("each number once, right value", "<think>3*5=15 15+7=22</think>\\boxed{3*5+7}", [3, 5, 7], 22),
    ("another order", "<think>x</think>\\boxed{7+5*3}", [3, 5, 7], 22),
    ("parentheses", "<think>x</think>\\boxed{(7-5)*3}", [3, 5, 7], 6),
    ("exact division", "<think>x</think>\\boxed{(7+5)/3}", [3, 5, 7], 4),
    ("a fraction is not the target", "<think>x</think>\\boxed{7/3+5}", [3, 5, 7], 7),
    ("wrong value", "<think>x</think>\\boxed{3+5+7}", [3, 5, 7], 22),
    ("a number used twice", "<think>x</think>\\boxed{5*5-3}", [3, 5, 7], 22),
    ("a number left out", "<think>x</think>\\boxed{3*7+1}", [3, 5, 7], 22),
    ("a number not given", "<think>x</think>\\boxed{22}", [3, 5, 7], 22),
    ("the same numbers repeated in the pool", "<think>x</think>\\boxed{5*5-3}", [5, 5, 3], 22),
    ("division by zero", "<think>x</think>\\boxed{3/(5-5)+7}", [3, 5, 5, 7], 22),
    ("code instead of arithmetic", "<think>x</think>\\boxed{__import__('os').getpid()}", [3, 5, 7], 22),
    ("exponentiation is not allowed", "<think>x</think>\\boxed{3**2+5+7}", [3, 5, 7], 21),
    ("unicode digits", "<think>x</think>\\boxed{٣*٥+٧}", [3, 5, 7], 22),
    ("no box", "<think>3*5+7</think>", [3, 5, 7], 22),
    ("a megabyte of parentheses", "\\boxed{" + "(" * (1 << 20) + "}", [3, 5, 7], 22),
]


def check_countdown_reward(fn: Callable) -> CheckResult:
    """Exercise 5.3: fn(completions, numbers, target, **kwargs) -> list[float]: 1.0
    when the boxed expression uses each of `numbers` exactly once and equals
    `target`, else 0.0. Use grpo_edu.environment.tasks.evaluate_expression, never eval."""
    cases = []
    for description, completion, numbers, target in COUNTDOWN_CASES:
        expected = rewards.accuracy_reward([completion], answer=[str(target)], task=["countdown"],
                                           numbers=[numbers])[0]
        shown = completion if len(completion) < 60 else completion[:57] + "..."
        cases.append((f"{description}: {shown!r}, numbers={numbers}, target={target}",
                      lambda c=completion, n=numbers, t=target: float(fn([c], numbers=[n], target=[t])[0]),
                      expected))
    return run_cases("exercise 5.3 a countdown verifier", cases, describe=verdict)



def reward_model_exercise(policy=None, tokenizer=None):
    """Exercise 5.2's inputs, built exactly as chapter 5 builds them: (reward_model, target_problem,
    best_correct, tokenizer). The fitted model, the held-out problem of the exercise and the best
    score the model gives a correct sample of the starting policy, so that a solution can run
    outside the chapter (tests/test_solutions.py) and the chapter can show it is the same model."""
    from grpo_edu.environment import tasks
    from grpo_edu.policy.models import generate_completions, load_policy
    if policy is None or tokenizer is None:
        policy, tokenizer = load_policy()
    held_out = tasks.arithmetic_problems("test")
    pool_problems = held_out[::24][:64]
    pool = generate_completions(policy, tokenizer, [s["prompt"] for s in pool_problems], num_samples=8,
                                temperature=1.0, seed=1)
    flat = [(s, c) for s, group in zip(pool_problems, pool) for c in group]
    strict = rewards.accuracy_reward([c for _, c in flat], answer=[s["answer"] for s, _ in flat])
    fit_problems = tasks.make_dataset("arithmetic", 300, "train", seed=7)
    fit_groups = generate_completions(policy, tokenizer, [s["prompt"] for s in fit_problems],
                                      num_samples=8, temperature=1.0, seed=2)
    fit_texts = [c for group in fit_groups for c in group]
    fit_labels = rewards.accuracy_reward(fit_texts, answer=[s["answer"] for s in fit_problems for _ in range(8)])
    reward_model = CharacterRewardModel.fit(fit_texts, fit_labels)
    scores = reward_model([c for _, c in flat])
    best_correct = max(s for s, right in zip(scores, strict) if right)
    return reward_model, held_out[0], best_correct, tokenizer
