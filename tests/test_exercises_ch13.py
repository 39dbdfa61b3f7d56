"""The chapter-13 checkers accept the worked solutions, name what a wrong answer got wrong,
report an answer that raises, and check against the library's episodes."""

import re

import torch

from grpo_edu.exercises import ch13
from grpo_edu.policy.models import char_tokenizer
from grpo_edu.training.episodes import Reply, writers

# ----------------------------------------------------------------- 12.1


class StrictCalculator:
    """The worked solution."""

    stop = "]"

    def reset(self, sample):
        self.factors = sorted(int(x) for x in sample["prompt"].rstrip("=").split("*"))
        self.calls = 0

    def step(self, action):
        self.calls += 1
        if self.calls > ch13.MAX_CALLS:
            return Reply("=!", ch13.INVALID_CALL, done=True)
        call = re.search(r"\[([^\[\]]*)\]$", action)
        parts = call.group(1).replace(" ", "").split("*") if call else []
        if len(parts) == 2 and all(p.isdigit() for p in parts) and sorted(map(int, parts)) == self.factors:
            return Reply(f"={self.factors[0] * self.factors[1]}")
        return Reply("=?", ch13.INVALID_CALL)


def test_strict_calculator_solution_passes():
    result = ch13.check_strict_calculator(StrictCalculator)
    assert result and result.passed == len(ch13.strict_cases())


def test_strict_calculator_reports_a_case_once_and_its_first_failing_play():
    class NoSpaces(StrictCalculator):
        def step(self, action):
            return super().step(action.replace(" ", "#"))
    result = ch13.check_strict_calculator(NoSpaces)
    assert len(result.failures) == 1
    assert result.failures[0].startswith("spaces inside the call: call 1 '[ 12 * 30 ]': its text is not the product")


def test_strict_calculator_reports_an_answer_that_raises():
    class Unwritten(StrictCalculator):
        def step(self, action):
            raise NotImplementedError("your step here")
    result = ch13.check_strict_calculator(Unwritten)
    assert len(result.failures) == len(ch13.strict_cases())
    assert all(f.endswith("raised NotImplementedError: your step here") for f in result.failures)

    class NoInit(StrictCalculator):
        def __init__(self, tool):
            pass
    result = ch13.check_strict_calculator(NoInit)
    assert "raised TypeError" in result.failures[0]


# ----------------------------------------------------------------- 12.2


def loss_masks(pieces, tokenizer, length):
    """The worked solution."""
    loss_mask, env_mask = [], []
    for text, by_env in pieces:
        n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        loss_mask += [not by_env] * n
        env_mask += [by_env] * n
    padding = [False] * max(0, length - len(loss_mask))
    return torch.tensor(loss_mask[:length] + padding), torch.tensor(env_mask[:length] + padding)


def test_loss_masks_solution_passes():
    result = ch13.check_loss_masks(loss_masks)
    assert result and result.passed == len(ch13.loss_mask_cases())


def test_the_cases_are_the_episodes_the_exercise_names():
    """Several spans of the calculator's, an answer that ends the episode, and both cuts: the
    reference masks are roll_out_episodes' and say so."""
    tokenizer = char_tokenizer()
    spans = {}
    for name, sample, text, length in ch13.loss_mask_cases():
        policy, env = ch13.episode_masks(sample, text, length)
        assert not (policy & env).any()
        spans[name] = int((env[1:] & ~env[:-1]).sum() + env[0])
        tokens = sum(len(tokenizer(piece, add_special_tokens=False)["input_ids"])
                     for piece, _ in writers(text, ch13.CALCULATOR, sample))
        assert int((policy | env).sum()) == min(tokens, length)
        if "cut" in name:
            assert tokens > length
    assert list(spans.values()) == [0, 1, 2, 2, 5, 1, 0]
    assert bool(ch13.episode_masks(*ch13.loss_mask_cases()[4][1:])[1][-2])   # '=!' is the episode's end


def test_loss_masks_reports_an_answer_that_raises_or_returns_one_mask():
    def raises(pieces, tokenizer, length):
        raise NotImplementedError("your masks here")
    result = ch13.check_loss_masks(raises)
    assert len(result.failures) == len(ch13.loss_mask_cases())
    assert all(f.endswith("raised NotImplementedError: your masks here") for f in result.failures)
    result = ch13.check_loss_masks(lambda pieces, tokenizer, length: loss_masks(pieces, tokenizer, length)[0])
    assert result.failures[0].endswith("returned Tensor; return two masks: (loss_mask, env_mask)")


def test_loss_masks_with_a_token_in_both():
    def both(pieces, tokenizer, length):
        policy, env = loss_masks(pieces, tokenizer, length)
        return policy | env, env
    result = ch13.check_loss_masks(both)
    assert "one call: the loss mask marks the environment's tokens too" in str(result)

    def shifted(pieces, tokenizer, length):
        policy, env = loss_masks(pieces, tokenizer, length)
        return policy, env.roll(1)
    result = ch13.check_loss_masks(shifted)
    assert "one call: a token is in both masks: each token has one writer" in str(result)
