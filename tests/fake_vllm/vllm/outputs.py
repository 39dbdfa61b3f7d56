"""vllm.outputs: what LLM.generate returns (the fields vllm_engine reads, and their neighbours)."""

from dataclasses import dataclass


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list | None
    finish_reason: str | None = None


class RequestOutput:
    def __init__(self, request_id: str, prompt_token_ids: list[int], outputs: list[CompletionOutput]):
        self.request_id, self.prompt_token_ids, self.outputs = request_id, prompt_token_ids, outputs
