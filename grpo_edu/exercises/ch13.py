"""Checkers for chapter 13, "Tools and multi-turn episodes"."""

from __future__ import annotations

import re

import torch

from grpo_edu.environment import tasks
from grpo_edu.sampling.rollout import Rollout, SamplingParams
from grpo_edu.training.episodes import Reply, _checked_reply, roll_out_episodes, writers
from grpo_edu.exercises.checking import CheckResult, compare
from grpo_edu.policy.models import char_tokenizer

INVALID_CALL = -0.1   # exercise 13.1: the reward of a call that is not the problem's own product
MAX_CALLS = 2         # exercise 13.1: the calls an episode may make; the next one ends it


# --------------------------------------------------------------------------- 12.1

class _StrictCalculator:
    """The reference of exercise 13.1 (read the exercise, not this)."""

    stop = "]"

    def reset(self, sample: dict) -> None:
        self.factors = sorted(int(x) for x in sample["prompt"].rstrip("=").split("*"))
        self.calls = 0

    def step(self, action: str) -> Reply:
        self.calls += 1
        if self.calls > MAX_CALLS:
            return Reply("=!", INVALID_CALL, True)
        call = re.search(r"\[([^\[\]]*)\]$", action)
        parts = call.group(1).replace(" ", "").split("*") if call else []
        if len(parts) == 2 and all(p.isdigit() for p in parts) and sorted(map(int, parts)) == self.factors:
            return Reply(f"={self.factors[0] * self.factors[1]}")
        return Reply("=?", INVALID_CALL)


def strict_cases() -> list[tuple[str, dict, list[str]]]:
    """(name, sample, the policy's actions of one episode, each ending with ']')."""
    a, b = tasks.multiply_sample(47, 85), tasks.multiply_sample(12, 30)
    return [
        ("the problem's own product", a, ["<think>[47*85]"]),
        ("its factors the other way round", a, ["<think>[85*47]"]),
        ("spaces inside the call", b, ["<think>[ 12 * 30 ]"]),
        ("another product, then the right one", a, ["<think>[47*58]", "[47*85]"]),
        ("a sum of the factors", b, ["<think>[12+30]"]),
        ("not a call at all", a, ["<think>47 times 85]"]),
        ("three factors", b, ["<think>[12*30*1]"]),
        ("one call too many", a, ["<think>[47*85]", "[47*85]", "[47*85]"]),
        ("wrong calls up to the limit", b, ["<think>[1*1]", "[2*2]", "[12*30]"]),
    ]


def check_strict_calculator(environment: type) -> CheckResult:
    """Exercise 13.1: `environment`, a class (stop, reset(sample), step(action) -> Reply), plays
    each case's actions in a fresh instance; where that passes, once more in the instance of the
    case before, reset (nothing of its episode may remain). Each reply is compared with the
    exercise's rules (text, reward, done); a case reports its first failing play only."""
    result = CheckResult("exercise 13.1 a strict calculator")
    stop = getattr(environment, "stop", None)
    if stop != "]" or len(char_tokenizer()(stop, add_special_tokens=False)["input_ids"]) != 1:
        result.record("the class", [f"its stop is {stop!r}: the turn must be handed over at the call's closing "
                                    f"bracket, one token of the policy's tokenizer"])
        return result
    previous = None
    for name, sample, actions in strict_cases():
        try:
            mine = environment()
        except Exception as error:  # noqa: BLE001 - the reader's code: report, do not crash
            result.record_raised(name, error)
            continue
        problems = _play(mine, sample, actions)
        if not problems:
            reused = previous if previous is not None else mine
            problems = _play(reused, sample, actions)
            name += " (the instance reset from another episode)" if problems else ""
        previous = mine
        result.record(name, problems)
    return result


def _play(mine, sample: dict, actions: list[str]) -> list[str]:
    """One episode of `actions` in `mine`, reset on `sample`: what its replies get wrong."""
    problems = []
    try:
        mine.reset(dict(sample))
        reference = _StrictCalculator()
        reference.reset(dict(sample))
        for turn, action in enumerate(actions, 1):
            want = reference.step(action)
            got = _checked_reply("exercise 13.1", mine.step(action), action)
            problems += _reply_problems(turn, action, want, got)
            if want.done:
                break
    except Exception as error:  # noqa: BLE001 - the reader's code: report, do not crash
        problems.append(f"raised {type(error).__name__}: {error}")
    return problems


def _reply_problems(turn: int, action: str, want: Reply, got: Reply) -> list[str]:
    problems = []
    where = f"call {turn} {action[action.rfind('['):] if '[' in action else action!r}"
    if got.text != want.text:
        kind = ("the product of the problem's two factors" if want.text[1:].isdigit() else
                "the invalid call's answer" if want.text == "=?" else "the answer to a call over the limit")
        problems.append(f"{where}: its text is not {kind}")
    reward = compare(want.reward, got.reward, 1e-12)
    if reward:
        problems.append(f"{where}: the reward {reward}")
    if got.done != want.done:
        problems.append(f"{where}: done is {got.done}, " + ("the episode must end here" if want.done else
                                                            "the episode must go on"))
    return problems




# --------------------------------------------------------------------------- 12.2

CALCULATOR = "grpo_edu.training.episodes:Calculator"


def loss_mask_cases() -> list[tuple[str, dict, str, int]]:
    """(name, sample, the episode's whole text, max_completion_length): episodes the calculator
    plays (grpo_edu.training.episodes.writers splits each into its writers' pieces)."""
    a, b = tasks.multiply_sample(47, 85), tasks.multiply_sample(12, 30)
    return [
        ("answered in the head, no call", a, a["direct_solution"], 24),
        ("one call", a, a["solution"], 24),
        ("two calls: the calculator writes two spans", a, "<think>[47*85]=3995[3995-0]=3995</think>\\boxed{3995}",
         40),
        ("a call it cannot read, then one it can", b, "<think>[12 times 30]=?[12*30]=360</think>\\boxed{360}", 40),
        ("five calls: the calculator's last answer ends the episode", b,
         "<think>[1*1]=1[2*2]=4[3*3]=9[4*4]=16[12*30]=!", 40),
        ("cut at max_completion_length inside the calculator's answer", a, a["solution"], 10),
        ("cut at max_completion_length inside the policy's first turn", a, a["solution"], 5),
    ]


def episode_masks(sample: dict, text: str, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference of exercise 13.2 (read the exercise, not this): the episode of `text` rolled
    out by grpo_edu.training.episodes.roll_out_episodes, its policy turns scripted, with the
    calculator answering; its (completion_mask, env_mask), each (length,) bool."""
    tokenizer = char_tokenizer()
    turns = [piece for piece, by_env in writers(text, CALCULATOR, sample) if not by_env]

    def generate(turn, prompt_ids, prompt_mask, sampling, rows):
        ids = tokenizer(turns[turn], add_special_tokens=False)["input_ids"][:sampling.max_new_tokens]
        ids_t = torch.tensor([ids])
        mask = torch.ones(1, len(ids), dtype=torch.bool)
        return Rollout(prompt_ids, prompt_mask, ids_t, mask, torch.zeros(1, len(ids)), torch.tensor([False]), 1)

    prompt = tokenizer([sample["prompt"]], return_tensors="pt", add_special_tokens=False)
    rollout = roll_out_episodes(generate, [sample], prompt["input_ids"], prompt["attention_mask"],
                                SamplingParams(1, length, 1.0), tokenizer, CALCULATOR, max_turns=len(turns) + 1)
    policy, env = (torch.zeros(length, dtype=torch.bool) for _ in range(2))
    n = rollout.completion_mask.shape[1]
    policy[:n], env[:n] = rollout.completion_mask[0].bool(), rollout.env_mask[0].bool()
    return policy, env


def check_loss_masks(fn) -> CheckResult:
    """Exercise 13.2: fn(pieces, tokenizer, length) -> (loss_mask, env_mask), each `length`
    True/False values: pieces are an episode's (text, by the environment) as
    grpo_edu.training.episodes.writers splits it; compared with roll_out_episodes' masks."""
    result = CheckResult("exercise 13.2 who trains on what")
    tokenizer = char_tokenizer()
    for name, sample, text, length in loss_mask_cases():
        policy, env = episode_masks(sample, text, length)
        pieces = writers(text, CALCULATOR, sample)
        try:
            got = fn([tuple(p) for p in pieces], tokenizer, length)
            if not isinstance(got, (tuple, list)) or len(got) != 2:
                result.record(name, [f"returned {type(got).__name__}; return two masks: (loss_mask, env_mask)"])
                continue
            got_policy, got_env = (torch.as_tensor(x).detach().cpu() for x in got)
        except Exception as error:  # noqa: BLE001 - the reader's code: report, do not crash
            result.record_raised(name, error)
            continue
        result.record(name, _mask_problems(policy, env, got_policy, got_env, length))
    return result


def _mask_problems(policy, env, got_policy, got_env, length: int) -> list[str]:
    for which, got in (("loss_mask", got_policy), ("env_mask", got_env)):
        if got.shape != (length,):
            return [f"{which} has shape {tuple(got.shape)}; the case needs {length} values, the episode's tokens "
                    f"cut at max_completion_length, then padding"]
    try:
        got_policy, got_env = got_policy.to(torch.bool), got_env.to(torch.bool)
    except (TypeError, RuntimeError):
        return ["the masks are not True/False values"]
    written = policy | env
    if env.any() and torch.equal(got_policy, written):
        return ["the loss mask marks the environment's tokens too: it masks only the padding"]
    if not torch.equal(policy, env) and torch.equal(got_policy, env) and torch.equal(got_env, policy):
        return ["the two masks are swapped"]
    problems = []
    if (got_policy & got_env).any():
        problems.append("a token is in both masks: each token has one writer")
    if ((got_policy | got_env) & ~written).any():
        problems.append("a mask marks padding after the episode's last token")
    if not problems:
        for which, want, got in (("loss_mask", policy, got_policy), ("env_mask", env, got_env)):
            if problem := compare(want.numpy(), got.numpy(), 0):
                problems.append(f"{which}: {problem}")
    return problems
