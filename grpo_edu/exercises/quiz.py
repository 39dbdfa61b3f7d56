"""The "Check yourself" questions whose answer is a number: check yours before you open the answer.

    >>> from grpo_edu.exercises import quiz
    >>> quiz.ask(1)                                       # what each question of chapter 1 takes
    >>> quiz.check(1, 1, population=-1.4321, sample=-1.2402)

Each question is registered with the chapter and its number, a one-line prompt, the numbers it
takes, and a function that computes the right numbers with the library's own code (the
advantages, the loss's weights, the corrections, the bandit, the memory accounting): no answer
is typed in here. The folded answer under each question prints the same numbers, and
tests/test_quiz.py holds them to it.

A reader types a rounded number, so each one is accepted within half a unit of the last decimal
the folded answer shows (-1.4321: within 5e-5). An answer the folded text writes as a whole
number that is not a count (an advantage of +1, a slope of 0) is exact, and asked to 4 decimals.
The feedback says how a number is wrong (its sign, too large or too small, a whole factor off)
and how many decimals to give, never the right value (`describe`).

Questions left out: those whose answer is a reason, not a number, and those whose numbers come
from the chapter's own run (a trained policy, a sampled episode, a benchmark's timings).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import numpy as np
import torch

from grpo_edu.algorithm import baselines, worked_example
from grpo_edu.algorithm.advantages import group_advantages
from grpo_edu.algorithm.aggregation import aggregation_weights
from grpo_edu.algorithm.bandit import Bandit, moments
from grpo_edu.algorithm.estimators import clipped_objective, response_token_weights
from grpo_edu.algorithm.logprobs import completion_logprobs
from grpo_edu.algorithm.loss import grpo_loss
from grpo_edu.algorithm.offpolicy import Correction, correction_weights
from grpo_edu.environment import rewards, tasks
from grpo_edu.exercises import ch05, ch11
from grpo_edu.exercises.checking import CheckResult
from grpo_edu.config import TrainConfig
from grpo_edu.environment.rewards import soft_overlong_punishment

F64 = torch.float64
GB = 1e9
WORDS = ("None", "One", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight", "Nine")


# --------------------------------------------------------------------------- how an answer is written

def fixed(decimals: int, template: str = "{}", sign: bool = False) -> Callable[[np.ndarray], str]:
    """One number as the folded answer writes it: `decimals` places, in `template`'s words."""
    form = f"{{:{'+' if sign else ''}.{decimals}f}}"
    return lambda value: template.format(form.format(float(value) + 0.0))


def listed(decimals: int, sign: bool = False, joined: str = ", ", last: str = ", ",
           distinct: bool = False) -> Callable[[np.ndarray], str]:
    """Several numbers as the folded answer lists them ("-2.00, +0.00 and +2.00"); `distinct`:
    each value once, in order ("+0.05 and -0.05" for +0.05, -0.05, +0.05, -0.05)."""
    form = f"{{:{'+' if sign else ''}.{decimals}f}}"

    def write(values: np.ndarray) -> str:
        texts = [form.format(float(v) + 0.0) for v in np.ravel(values)]
        if distinct:
            texts = list(dict.fromkeys(texts))
        return texts[0] if len(texts) == 1 else joined.join(texts[:-1]) + last + texts[-1]
    return write


def spelled(template: str = "{}") -> Callable[[np.ndarray], str]:
    """A count written as a word: 0 is "None", 5 is "Five"."""
    return lambda value: template.format(WORDS[int(round(float(value)))])


def times_or_same(value: np.ndarray) -> str:
    """A ratio of weights: "20.00 times", or "the same" for 1."""
    return "the same" if math.isclose(float(value), 1.0, abs_tol=1e-12) else f"{float(value):.2f} times"


# --------------------------------------------------------------------------- the registry

@dataclass(frozen=True)
class Number:
    """One number a question takes: its keyword, what it is, how the folded answer writes it."""

    name: str             # the keyword of quiz.check
    means: str            # what it is, in a few words (quiz.ask prints it)
    shown: Callable       # value -> the text the folded answer writes it as
    decimals: int         # the precision asked: accepted within half a unit of the last decimal
    count: int = 1        # how many numbers it takes: 1, or a list of `count`

    @property
    def tolerance(self) -> float:
        return 0.5 * 10.0 ** -self.decimals

    @property
    def precision(self) -> str:
        places = "a whole number" if self.decimals == 0 else f"{self.decimals} decimal{'s' * (self.decimals > 1)}"
        return f"give {places}" + (" each" if self.count > 1 and self.decimals else "")


@dataclass(frozen=True)
class Question:
    chapter: int
    number: int
    prompt: str                       # what the question asks, in one line
    numbers: tuple[Number, ...]
    compute: Callable[[], dict]       # -> {name: the right value}, from the library's code

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.numbers)

    def expected(self) -> dict[str, np.ndarray]:
        return _expected(self.chapter, self.number)


QUESTIONS: dict[tuple[int, int], Question] = {}


def question(chapter: int, number: int, prompt: str, *numbers: Number):
    """Register a function computing question `number` of chapter `chapter`'s Check yourself."""
    def register(compute: Callable[[], dict]) -> Callable[[], dict]:
        QUESTIONS[chapter, number] = Question(chapter, number, prompt, numbers, compute)
        return compute
    return register


@functools.lru_cache(maxsize=None)
def _expected(chapter: int, number: int) -> dict[str, np.ndarray]:
    entry = QUESTIONS[chapter, number]
    values = {name: np.asarray(value, dtype=np.float64) for name, value in entry.compute().items()}
    assert list(values) == list(entry.names), f"{chapter}.{number} computes {list(values)}, takes {entry.names}"
    return values


# --------------------------------------------------------------------------- chapter 0

CHAPTER0_BANDIT = Bandit(logits=[0.0, 0.5, 1.0, -0.5], rewards=[1.0, 0.0, 0.0, 0.5])   # the chapter's own


@question(0, 1, "REINFORCE's variance on the chapter's bandit (G = 4) after adding 10 to every reward",
          Number("variance", "E||g_hat - grad J||^2 with every reward + 10", fixed(4), 4))
def _shifted_variance():
    shifted = Bandit(CHAPTER0_BANDIT.logits, CHAPTER0_BANDIT.rewards + 10.0)
    return {"variance": moments(shifted, 4).variance}


@question(0, 3, "the share of grad J the group-mean estimator gives on average at G = 4, and its cosine with grad J",
          Number("share", "E[g_hat] / grad J, on every logit", fixed(2), 2),
          Number("cosine", "the cosine of E[g_hat] and grad J", fixed(0, "cosine {}"), 4))
def _group_mean_share():
    mean, gradient = moments(CHAPTER0_BANDIT, 4, baselines.group_mean).mean, CHAPTER0_BANDIT.gradient()
    share = mean / gradient
    assert np.allclose(share, share[0]), "the group mean scales every logit alike"
    return {"share": share[0], "cosine": mean @ gradient / np.linalg.norm(mean) / np.linalg.norm(gradient)}


@question(0, 4, "the clipped objective's slope in rho at A = -1, rho = 0.7, epsilon = 0.2",
          Number("slope", "d objective / d rho", fixed(0, "slope is {}"), 4))
def _clip_slope():
    return {"slope": clipped_objective([0.7], -1.0, epsilon=0.2).gradient[0]}


# --------------------------------------------------------------------------- chapter 1

@question(1, 1, "A_3 of the worked example's rewards, with the population std and with the sample std",
          Number("population", "A_3 with the population std", fixed(4, "{} with the population"), 4),
          Number("sample", "A_3 with the sample std", fixed(4, "{} with the sample"), 4))
def _worked_advantage():
    rewards_ = torch.tensor([worked_example.REWARDS], dtype=F64)
    return {std: group_advantages(rewards_, std=std)[0, 2].item() for std in ("population", "sample")}


# --------------------------------------------------------------------------- chapter 2

PROMPT_2 = (1.0, 0.9, 1.0, 0.9)   # the question's rewards; the explorer's prompt 1 is the worked example's


@question(2, 1, "prompt 2's four advantages under group scaling, no scaling and batch scaling",
          Number("group", "its 4 advantages, each divided by its group's std", listed(0, sign=True), 4, count=4),
          Number("none", "its 4 advantages, not divided", listed(2, sign=True, last=" and ", distinct=True), 2,
                 count=4),
          Number("batch", "its 4 advantages, divided by the std of both prompts' 8 rewards",
                 listed(4, last=" and ", distinct=True), 4, count=4))
def _scaled_advantages():
    batch = torch.tensor([worked_example.REWARDS, PROMPT_2], dtype=F64)
    return {scale: group_advantages(batch, scale=scale)[1].numpy() for scale in ("group", "none", "batch")}


@question(2, 2, "how many of chapter 1's nine tokens get no gradient at A = +1, and at A = -1 (epsilon = 0.2)",
          Number("plus_one", "tokens with no gradient at A = +1", spelled("{} with $A = +1$"), 0),
          Number("minus_one", "tokens with no gradient at A = -1", spelled("{} with $A = -1$"), 0))
def _clipped_counts():
    ratios = worked_example.token_ratios()
    return {name: int(clipped_objective(ratios, advantage, epsilon=0.2).clipped.sum())
            for name, advantage in (("plus_one", 1.0), ("minus_one", -1.0))}


@question(2, 5, "how many times one token of a 20-token response counts one of a 400-token response",
          Number("grpo", "the short token's weight over the long one's, under grpo", times_or_same, 2),
          Number("dr_grpo", "the same ratio under dr_grpo", times_or_same, 2))
def _token_weight_ratio():
    ratios = {}
    for loss_type in ("grpo", "dr_grpo"):
        short, long = response_token_weights([20, 400], loss_type, max_completion_length=512)
        ratios[loss_type] = short / long
    return ratios


# --------------------------------------------------------------------------- chapter 3

@question(3, 1, "the columns of the first completion token of `3*4=` (4 tokens, P = 5) and of the logits that score it",
          Number("token_column", "the column its completion's first token sits in", fixed(0, "column {} (= P)"), 0),
          Number("logits_column", "the column whose logits score that token", fixed(0, "logits at column {}"), 0))
def _columns():
    P, S = 5, 2                         # the prompt's columns (1 pad + 4 tokens); the completion "7" + EOS
    T = P + S

    def probe(input_ids, logits_to_keep, **_):   # a model whose logits at column c favour token id c
        logits = 50.0 * torch.eye(T).expand(input_ids.shape[0], T, T)
        return SimpleNamespace(logits=logits[:, -logits_to_keep:])

    def first_token_logp(token_id: int) -> float:
        ids = torch.tensor([[0, 1, 2, 3, 4, token_id, 6]])
        attention = torch.tensor([[0, 1, 1, 1, 1, 1, 1]])
        return completion_logprobs(probe, ids, attention, torch.ones(1, S, dtype=torch.bool))[0, 0].item()

    scoring = max(range(T), key=first_token_logp)
    return {"token_column": T - S, "logits_column": scoring}


@question(3, 3, "d loss / d logp on each token of a 2-token completion with A = -1.2247, N = 6 (grpo, first step)",
          Number("gradient", "d loss / d logp on each of its 2 tokens", fixed(4, "= {}", sign=True), 4))
def _first_step_gradient():
    lengths = torch.tensor([2, 3, 5, 4, 6, 7])          # the others' lengths do not matter under grpo
    mask = torch.arange(7) < lengths[:, None]
    logp = torch.full((6, 7), -1.0, dtype=F64, requires_grad=True)
    advantages = torch.tensor([-1.2247, 1.0, -0.5, 0.5, 0.0, -1.0], dtype=F64)
    loss = grpo_loss(logp, logp.detach(), advantages, mask, loss_type="grpo", beta=0.0).loss
    (gradient,) = torch.autograd.grad(loss, logp)
    assert torch.allclose(gradient[0, 0], gradient[0, 1])
    return {"gradient": gradient[0, 0].item()}


# --------------------------------------------------------------------------- chapter 4

@question(4, 1, "under grpo with N = 8: one token's weight in a 10-token and in a 100-token completion, and a "
                "whole completion's",
          Number("short_token", "one token of the 10-token completion", fixed(6), 6),
          Number("long_token", "one token of the 100-token completion", fixed(6), 6),
          Number("completion", "a whole completion, whatever its length", fixed(4), 4))
def _grpo_weights():
    lengths = torch.tensor([10, 100, 20, 30, 40, 50, 60, 70])
    weights = aggregation_weights(torch.arange(100) < lengths[:, None], "grpo")
    totals = weights.sum(-1)
    assert torch.allclose(totals, totals[0])
    return {"short_token": weights[0, 0].item(), "long_token": weights[1, 0].item(), "completion": totals[0].item()}


@question(4, 2, "the advantage of the one right answer among G = 8 binary rewards, with the group std and without",
          Number("with_std", "its advantage divided by the group's std", fixed(4, "{} with the std", sign=True), 4),
          Number("without_std", "its advantage, not divided", fixed(4, "{} without", sign=True), 4))
def _lone_success():
    group = torch.tensor([[1.0] + [0.0] * 7], dtype=F64)
    return {"with_std": group_advantages(group)[0, 0].item(),
            "without_std": group_advantages(group, scale="none")[0, 0].item()}


# --------------------------------------------------------------------------- chapter 5

@question(5, 1, "the advantages of the first three samples of the group 0 1 2 1 1 1 1 1",
          Number("advantages", "the first three samples' advantages", listed(2, sign=True, last=" and "), 2,
                 count=3))
def _first_three():
    group = torch.tensor([[0.0, 1.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0]], dtype=F64)
    return {"advantages": group_advantages(group)[0, :3].numpy()}


@question(5, 3, "the held-out score of a completion listing every integer from -89 to 198, lenient and verified",
          Number("lenient", "its mean reward under the lenient rule", fixed(4, "{} under the lenient"), 4),
          Number("verifier", "its mean reward under the verifier", fixed(4, "{} under the verifier"), 4))
def _every_number():
    answers = [sample["answer"] for sample in tasks.arithmetic_problems("test")]
    completions = ["<think>" + " ".join(str(n) for n in range(-89, 199)) + "</think>"] * len(answers)
    return {"lenient": np.mean(ch05.lenient_accuracy_reward(completions, answer=answers)),
            "verifier": np.mean(rewards.accuracy_reward(completions, answer=answers))}


# --------------------------------------------------------------------------- chapter 6

@question(6, 3, "how many of B = 16 groups gave a gradient when the share of zero-std groups is 0.125",
          Number("groups", "the groups with a gradient", fixed(0, "other {} gave"), 0))
def _groups_with_gradient():
    B, zero_std_share = 16, 0.125
    return {"groups": B - round(zero_std_share * B)}


# --------------------------------------------------------------------------- chapter 7

@question(7, 2, "a wrong completion's advantage in a half of 4 that holds no right one (rewards 1.5 right, 0.5 wrong)",
          Number("advantage", "its advantage", fixed(0, "{}: all four rewards"), 4))
def _half_without_right():
    return {"advantage": group_advantages(torch.tensor([[0.5, 0.5, 0.5, 0.5]], dtype=F64))[0, 0].item()}


# --------------------------------------------------------------------------- chapter 8

@question(8, 1, "the weight the starting policy keeps in a reference synced 5 times by Polyak averaging, alpha = 0.6",
          Number("weight", "the starting policy's weight", fixed(5, "= {}"), 5))
def _polyak_start():
    from grpo_edu.training.placement import Models
    reference, policy = torch.nn.Linear(1, 1, bias=False), torch.nn.Linear(1, 1, bias=False)
    models = Models(policy, reference, policy, None, None)
    with torch.no_grad():
        reference.weight.fill_(1.0)   # the start: 1; every policy it is synced with: 0
        policy.weight.fill_(0.0)
    for _ in range(5):
        models.sync_reference(0.6)
    return {"weight": reference.weight.item()}


@question(8, 3, "at L = 9, c = 2 (weights: accuracy 1, format 0.5): the reward of a right 10-token answer and of a "
                "well-formed wrong 7-token one",
          Number("right", "the right answer's reward", fixed(1, "= {}"), 1),
          Number("wrong", "the wrong answer's reward", fixed(1, "= {}"), 1))
def _overlong_rewards():
    punishment = soft_overlong_punishment(torch.tensor([10, 7]), 9, 2)
    return {"right": 1.0 * 1.0 + 0.5 * 1.0 + punishment[0].item(),
            "wrong": 1.0 * 0.0 + 0.5 * 1.0 + punishment[1].item()}


# --------------------------------------------------------------------------- chapter 10

@question(10, 2, "how much more a token of rank 0 (30 tokens) weighs than one of rank 1 (81) under bnpo, each "
                "rank's own counts",
          Number("times", "rank 0's token weight over rank 1's", fixed(1, "{} times"), 1))
def _rank_token_weights():
    ranks = 2
    weights = [aggregation_weights(torch.ones(1, tokens, dtype=torch.bool), "bnpo")[0, 0].item() / ranks
               for tokens in (30, 81)]   # each rank's own token mean; DDP averages the ranks
    return {"times": weights[0] / weights[1]}


def _policy_of(parameters: float) -> torch.nn.Module:
    """A stand-in policy of `parameters` parameters on the meta device: no memory."""
    with torch.device("meta"):
        model = torch.nn.Module()
        model.weight = torch.nn.Parameter(torch.empty(int(parameters)))
    return model


@question(10, 5, "the GB per GPU of a 7-billion-parameter policy with AdamW in float32 on 8 GPUs: DDP, FSDP2, and "
                "FSDP2 with the reference's shard and the sampler's whole copy",
          Number("ddp_gb", "DDP, per rank", fixed(0, "{} GB"), 0),
          Number("fsdp2_gb", "FSDP2, per rank", fixed(0, "{} GB per rank"), 0),
          Number("fsdp2_with_reference_and_sampler_gb", "FSDP2 with the reference's shard and the sampler's copy",
                 fixed(1, "{} GB with"), 1))
def _ddp_and_fsdp2():
    P, gpus = 7e9, 8
    policy = _policy_of(P)
    return {"ddp_gb": ch11.state_bytes(policy, TrainConfig(beta=0.0), 1) / GB,
            "fsdp2_gb": ch11.state_bytes(policy, TrainConfig(beta=0.0), gpus) / GB,
            "fsdp2_with_reference_and_sampler_gb": (ch11.state_bytes(policy, TrainConfig(beta=0.04), gpus)
                                                    + 4 * P) / GB}


# --------------------------------------------------------------------------- chapter 11

@question(11, 1, "a weight of 1 after an update of 1e-6, in bf16 and in float32",
          Number("bf16", "the weight in bf16", fixed(8, "{} in bf16"), 8),
          Number("float32", "the weight in float32", fixed(8, "{} in float32"), 8))
def _rounded_update():
    in_bf16 = torch.tensor(1.0).bfloat16() + torch.tensor(1e-6).bfloat16()
    return {"bf16": in_bf16.float().item(), "float32": (torch.tensor(1.0) + 1e-6).item()}


@question(11, 2, "the weight TIS gives a token's loss with tis_cap = 2 and pi_old / pi_sampler = 3",
          Number("weight", "its weight", fixed(0, "weight is {}"), 4))
def _tis_weight():
    weight, _ = correction_weights(torch.tensor([[math.log(3.0)]], dtype=F64), torch.zeros(1, 1, dtype=F64),
                                   torch.ones(1, 1, dtype=torch.bool), Correction(tis_cap=2.0))
    return {"weight": weight.item()}


@question(11, 3, "the GB one GPU holds to train Qwen2.5-7B: full fine-tuning, with the reference, and LoRA at rank 16",
          Number("full_gb", "weights, gradients and AdamW's two moments, float32", fixed(1, "are {} GB"), 1),
          Number("full_with_reference_gb", "the same with the reference", fixed(1, "reference, {} GB"), 1),
          Number("lora_gb", "LoRA at rank 16 on the seven projections", fixed(1, "copy: {} GB"), 1))
def _qwen_7b_state():
    model = ch11.base_model("Qwen2.5-7B")
    return {"full_gb": ch11.state_bytes(model, TrainConfig(beta=0.0), 1) / GB,
            "full_with_reference_gb": ch11.state_bytes(model, TrainConfig(beta=0.04), 1) / GB,
            "lora_gb": ch11.state_bytes(model, TrainConfig(lora_rank=16, lora_alpha=32.0), 1) / GB}


# --------------------------------------------------------------------------- chapter 12

@question(12, 1, "the weight of a token's policy term at r = 0.256: TIS with cap 2, and the token mask with band "
                 "[0.5, 2]",
          Number("tis", "TIS's weight", fixed(3, "TIS gives {}"), 3),
          Number("token_mask", "the token mask's weight", fixed(0, "token mask gives {}"), 4))
def _lagging_token_weights():
    old, sampler, mask = torch.tensor([[math.log(0.256)]], dtype=F64), torch.zeros(1, 1, dtype=F64), \
        torch.ones(1, 1, dtype=torch.bool)
    return {"tis": correction_weights(old, sampler, mask, Correction(tis_cap=2.0))[0].item(),
            "token_mask": correction_weights(old, sampler, mask,
                                             Correction(is_mask="token", is_mask_band=(0.5, 2.0)))[0].item()}


# --------------------------------------------------------------------------- check and ask

class QuizResult(CheckResult):
    """A CheckResult whose report counts numbers, not cases."""

    def __repr__(self) -> str:
        total = self.passed + len(self.failures)
        if not self.failures:
            return f"{self.exercise}: {'right' if total == 1 else 'both right' if total == 2 else f'all {total} right'}"
        head = "wrong" if total == 1 else f"{len(self.failures)} of {total} numbers wrong"
        return "\n".join([f"{self.exercise}: {head}"] + [f"  - {failure}" for failure in self.failures])

    __str__ = __repr__


def _clean_factor(ratio: float) -> str | None:
    """A whole factor (about 8 times, about 1/8 of the right value): the trace of a systematic slip."""
    for n in range(2, 1001):
        if abs(ratio - n) <= 0.02 * n:
            return f"about {n} times the right value"
        if abs(ratio - 1 / n) <= 0.02 / n:
            return f"about 1/{n} of the right value"
    return None


def _how_wrong(right: float, got: float, tolerance: float) -> str:
    if abs(got) <= tolerance:
        return "is 0 where it should not be"
    if abs(right) > tolerance and math.copysign(1, got) != math.copysign(1, right):
        return "has the wrong sign"
    side = "is too large" if got > right else "is too small"
    return side + (", by less than 0.1% (a rounding slip?)" if abs(got - right) < 1e-3 * abs(right) else "")


def describe(right: np.ndarray, got: np.ndarray, tolerance: float) -> str | None:
    """None if every number of `got` is within `tolerance` of `right`, else how it is wrong: its sign,
    too large or too small, a whole factor off. Unlike checking.compare it never prints a factor
    such as "about 1.8 times": on a short rounded answer (a count, 2.7) that gives the answer away."""
    wrong = np.abs(got - right) > tolerance
    if not wrong.any():
        return None
    many = right.ndim > 0
    if not np.isfinite(got).all():
        return "holds NaN or inf" if many else "is NaN or inf"
    if np.any(np.abs(right) > tolerance) and np.all(np.abs(-got - right) <= tolerance):
        return ("every one has the wrong sign: they are minus the right values" if many
                else "has the wrong sign: it is minus the right value")
    nonzero = np.abs(right) > tolerance
    if nonzero.any() and np.all(np.abs(got[~nonzero]) <= tolerance) and np.all(np.abs(got[nonzero]) > tolerance):
        ratios = got[nonzero] / right[nonzero]
        factor = _clean_factor(float(ratios.mean())) if np.ptp(ratios) <= 0.02 * abs(ratios.mean()) else None
        if factor:
            return ("every one is " if many else "is ") + factor
    if not many:
        return _how_wrong(float(right), float(got), tolerance)
    shown = [f"number {i + 1} {_how_wrong(right[i], got[i], tolerance)}" for i in np.flatnonzero(wrong)]
    return f"{int(wrong.sum())} of {right.size} {'is' if wrong.sum() == 1 else 'are'} wrong: " + ", ".join(shown)


def _and(items) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _chapters() -> list[int]:
    return sorted({chapter for chapter, _ in QUESTIONS})


def _entries(chapter) -> list[Question]:
    entries = [entry for (c, _), entry in sorted(QUESTIONS.items()) if c == chapter and type(chapter) is int]
    if not entries:
        raise ValueError(f"chapter: expected a chapter with a question to check "
                         f"({_and(map(str, _chapters()))}), got {chapter!r}")
    return entries


def _question(chapter, number) -> Question:
    entries = _entries(chapter)
    entry = next((e for e in entries if e.number == number and type(number) is int), None)
    if entry is None:
        raise ValueError(f"question: chapter {chapter}'s questions with a number to check are "
                         f"{_and(str(e.number) for e in entries)}, got {number!r}")
    return entry


def _call(entry: Question) -> str:
    return f"quiz.check({entry.chapter}, {entry.number}, " + ", ".join(f"{n}=..." for n in entry.names) + ")"


def _numbers(spec: Number, value) -> np.ndarray:
    """The reader's value as floats of spec's shape, else a one-line ValueError."""
    try:
        array = np.asarray(value.detach().cpu() if hasattr(value, "detach") else value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{spec.name}: expected {'a number' if spec.count == 1 else f'{spec.count} numbers'}, "
                         f"got {value!r}") from None
    if spec.count == 1 and array.size == 1:
        return array.reshape(())
    if spec.count > 1 and array.ndim == 1 and array.size == spec.count:
        return array
    want = "one number" if spec.count == 1 else f"a list of {spec.count} numbers ({spec.means})"
    raise ValueError(f"{spec.name}: expected {want}, got {array.size} number{'s' * (array.size != 1)} "
                     f"(shape {array.shape})")


def check(chapter: int, question: int, **answers) -> QuizResult:
    """Check your numbers for `question` of chapter `chapter`'s Check yourself.

    quiz.check(1, 1, population=..., sample=...): each keyword a number the question asks for
    (quiz.ask(chapter) lists them). Truthy when every number is right; prints as a report that
    says how each wrong one is wrong, never the right value. A missing or unknown keyword, a
    list of the wrong length or a value that is not a number is a ValueError."""
    entry = _question(chapter, question)
    missing = [name for name in entry.names if name not in answers]
    unknown = [name for name in answers if name not in entry.names]
    if missing or unknown:
        wrong = "; ".join(part for part in (f"missing {_and(missing)}" if missing else "",
                                            f"unknown {_and(unknown)}" if unknown else "") if part)
        raise ValueError(f"answers: {wrong}. Question {chapter}.{question} takes {_and(entry.names)}, got "
                         f"{_and(answers) if answers else 'none'}: {_call(entry)}")
    given = {spec.name: _numbers(spec, answers[spec.name]) for spec in entry.numbers}
    expected = entry.expected()
    result = QuizResult(f"chapter {chapter}, question {question}")
    for spec in entry.numbers:
        # a hair over half a unit: a correctly rounded answer passes whatever the float error
        problem = describe(expected[spec.name], given[spec.name], spec.tolerance * (1 + 1e-9))
        result.record(spec.name, [f"{problem} ({spec.precision})"] if problem else [])
    return result


def ask(chapter: int) -> None:
    """Print the questions of chapter `chapter`'s Check yourself that quiz.check checks: the
    number, what it asks, and the numbers it takes."""
    lines = [f"Chapter {chapter}, Check yourself: the questions with a number to check"]
    for entry in _entries(chapter):
        lines += [f"  {entry.number}. {entry.prompt}", f"     {_call(entry)}"]
        for spec in entry.numbers:
            many = "" if spec.count == 1 else f"a list of {spec.count}: "
            lines.append(f"       {spec.name}: {many}{spec.means} ({spec.precision})")
    print("\n".join(lines))
