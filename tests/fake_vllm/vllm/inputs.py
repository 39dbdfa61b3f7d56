"""vllm.inputs: TokensPrompt, a prompt given as token ids (a TypedDict in vLLM)."""

from typing import TypedDict


class TokensPrompt(TypedDict):
    prompt_token_ids: list[int]
