"""vllm.logprobs: one position's log-prob of a token."""

from dataclasses import dataclass


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None
