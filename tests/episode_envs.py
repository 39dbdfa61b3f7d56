"""Environments for tests/test_episodes.py (importable by path, also from torchrun's processes:
"tests.episode_envs:Echo")."""

from grpo_edu.training.episodes import Reply


class Echo:
    """Hands over at the digit 1 (frequent in a random tiny policy's text); answers with the
    number of 1s the action holds and a reward of 0.25 per answer; done when the action holds an x."""

    stop = "1"

    def reset(self, sample: dict) -> None:
        self.answers = 0

    def step(self, action: str) -> Reply:
        self.answers += 1
        return Reply(f"<{action.count('1')}>", reward=0.25, done="x" in action)


class Raises(Echo):
    def step(self, action: str) -> Reply:
        raise KeyError("no such tool")


class WrongType(Echo):
    def step(self, action: str):
        return "=408"


class NanReward(Echo):
    def step(self, action: str) -> Reply:
        return Reply("=1", reward=float("nan"))


class Verbose(Echo):
    """Answers with more text than any episode has room for."""

    def step(self, action: str) -> Reply:
        return Reply("x" * 100)


class NoStop:
    def reset(self, sample: dict) -> None: ...

    def step(self, action: str) -> Reply: ...


class TwoTokenStop(Echo):
    stop = "]]"
