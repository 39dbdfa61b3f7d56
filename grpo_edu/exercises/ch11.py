"""Checkers for chapter 11, "Tools and multi-turn episodes"."""

from __future__ import annotations

import re

from grpo_edu.environment import tasks
from grpo_edu.training.episodes import Reply, _checked_reply
from grpo_edu.exercises.checking import CheckResult, compare
from grpo_edu.policy.models import char_tokenizer

INVALID_CALL = -0.1   # exercise 11.1: the reward of a call that is not the problem's own product
MAX_CALLS = 2         # exercise 11.1: the calls an episode may make; the next one ends it


# --------------------------------------------------------------------------- 11.1

class _StrictCalculator:
    """The reference of exercise 11.1 (read the exercise, not this)."""

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
    """Exercise 11.1: `environment`, a class (stop, reset(sample), step(action) -> Reply), plays
    each case's actions in a fresh instance, and once more in an instance reset from another
    episode; each reply is compared with the exercise's rules (text, reward, done)."""
    result = CheckResult("exercise 11.1 a strict calculator")
    stop = getattr(environment, "stop", None)
    if stop != "]" or len(char_tokenizer()(stop, add_special_tokens=False)["input_ids"]) != 1:
        result.record("the class", [f"its stop is {stop!r}: the turn must be handed over at the call's closing "
                                    f"bracket, one token of the policy's tokenizer"])
        return result
    previous = None
    for name, sample, actions in strict_cases():
        for fresh in (True, False):
            problems = []
            try:
                if fresh or previous is None:
                    mine = environment()
                else:   # the instance of the last case, reset: nothing of its episode may remain
                    mine = previous
                mine.reset(dict(sample))
                reference = _StrictCalculator()
                reference.reset(dict(sample))
                for turn, action in enumerate(actions, 1):
                    want = reference.step(action)
                    got = _checked_reply("exercise 11.1", mine.step(action), action)
                    problems += _reply_problems(turn, action, want, got)
                    if want.done:
                        break
                previous = mine
            except Exception as error:  # noqa: BLE001 - the reader's code: report, do not crash
                problems.append(f"raised {type(error).__name__}: {error}")
            result.record(f"{name}{'' if fresh else ' (the instance reset from another episode)'}", problems)
    return result


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


