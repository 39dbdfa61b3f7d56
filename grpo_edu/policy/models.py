"""The tiny policy's tokenizer and architecture, and one loader for any causal LM.

The CPU tier trains a model small enough to run hundreds of rollouts a second on
a laptop, so everything is minimal but real:

- `char_tokenizer()`: one token per character, built with the `tokenizers`
  library and wrapped as a transformers `PreTrainedTokenizerFast`, so it saves,
  loads, pads and decodes like any Hugging Face tokenizer (and TRL accepts it).
  The markup the rewards parse is one token each: `<think>`, `</think>` and
  `\\boxed{` (spelled out in characters they would add 19 tokens to an
  arithmetic completion that is now at most 10, and 19 more places to break
  the format).
  They are *added* tokens, not *special* ones, so `decode(...,
  skip_special_tokens=True)` (what TRL does before calling reward functions)
  keeps them; only `<pad>`, `<eos>` and `<unk>` are special.
- `tiny_llama_config()`: a 2-layer, 128-wide Llama (341,376 parameters with this
  tokenizer).
- `load_policy(name_or_path)`: model + tokenizer from a local directory or, on a
  reader's machine with network, a Hugging Face hub id.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM,
                          PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast)
from transformers.utils import logging as transformers_logging

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
THINK_OPEN, THINK_CLOSE, BOXED_OPEN = "<think>", "</think>", "\\boxed{"
SPECIAL_TOKENS = (PAD, EOS, UNK)
MARKUP_TOKENS = (THINK_OPEN, THINK_CLOSE, BOXED_OPEN)


def completion_text(reasoning: str, answer: str) -> str:
    """The completion format every reward checks: <think>reasoning</think>\\boxed{answer}."""
    return f"{THINK_OPEN}{reasoning}{THINK_CLOSE}{BOXED_OPEN}{answer}}}"


# Printable ASCII (space to tilde) and newline: enough for arithmetic, countdown
# and English reasoning. Any other character encodes as <unk>.
CHARACTERS = "\n" + "".join(chr(c) for c in range(32, 127))

# The starting policies committed with the package (see grpo_edu/commands/pretrain.py), by the names a
# config's `model` key gives them: "start" (arithmetic), "multiply-start" (calls a calculator),
# "chain-start" (sums chains step by step: process supervision) and the digitsum bases (chapter 9:
# "digitsum-start", pretrained on the main mixture, and its two controls).
ASSETS = Path(__file__).resolve().parent.parent / "assets"
STARTING_POLICY = ASSETS / "tiny-arithmetic-start"
TOOL_POLICY = ASSETS / "tiny-multiply-start"
CHAIN_POLICY = ASSETS / "tiny-chain-start"   # sums three numbers step by step (grpo_edu.environment.process)
# the default run's policy (configs/cpu-tiny.toml, seed 0): where most groups are all right
# (benchmarks/dynamic_sampling.py --trained-policy makes it; chapter 8 trains from it)
TRAINED_POLICY = ASSETS / "tiny-arithmetic-trained"
# digitsum (grpo_edu.environment.digitsum): direct answers, worked chains and checks, in known shares
DIGITSUM_POLICIES = {"digitsum-start": ASSETS / "tiny-digitsum-start",                  # 50/40/10
                     "digitsum-no-check": ASSETS / "tiny-digitsum-no-check",            # 50/50/0: never a check
                     "digitsum-no-top-worked": ASSETS / "tiny-digitsum-no-top-worked"}  # no working at the top depth
COMMITTED_POLICIES = {"start": STARTING_POLICY, "multiply-start": TOOL_POLICY, "chain-start": CHAIN_POLICY,
                      "trained": TRAINED_POLICY, **DIGITSUM_POLICIES}


def policy_source(model: str) -> str | Path:
    """A config's `model`: a committed policy's name -> its folder; anything else as it is."""
    return COMMITTED_POLICIES.get(model, model)


def char_tokenizer(max_length: int = 64) -> PreTrainedTokenizerFast:
    """The character-level tokenizer: ids 0-2 special, 3-5 markup, then characters.

    Padding is on the left (decoder-only generation continues from the right end
    of every row); `max_length` is the model's context, stored as
    `model_max_length`.
    """
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + MARKUP_TOKENS)}
    for character in CHARACTERS:
        vocab[character] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    # Every character is its own pre-token; [\s\S] also matches newline.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()  # join tokens with nothing in between
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=PAD, eos_token=EOS, unk_token=UNK,
        padding_side="left", model_max_length=max_length, clean_up_tokenization_spaces=False)


def tiny_llama_config(tokenizer: PreTrainedTokenizerBase, *, hidden_size: int = 128,
                      num_layers: int = 2, num_heads: int = 4, intermediate_size: int = 256,
                      max_position_embeddings: int = 64) -> LlamaConfig:
    """A Llama small enough to train and sample on a laptop CPU.

    Defaults: 2 layers, width 128, 4 heads of 32, SwiGLU width 256, tied input
    and output embeddings, 64 positions (prompt + completion never exceed it).
    """
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size must be divisible by num_heads, got {hidden_size} and {num_heads}")
    return LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads,
        num_key_value_heads=num_heads, max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-5, tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None)


def tiny_llama(tokenizer: PreTrainedTokenizerBase, seed: int = 0, **config_overrides) -> LlamaForCausalLM:
    """A freshly initialised tiny Llama (float32, eval mode), the same for the same seed."""
    config = tiny_llama_config(tokenizer, **config_overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    _set_generation_defaults(model, tokenizer)
    return model.eval()


def _set_generation_defaults(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    generation = model.generation_config
    generation.pad_token_id = tokenizer.pad_token_id
    generation.eos_token_id = tokenizer.eos_token_id
    generation.bos_token_id = None


@contextlib.contextmanager
def _quiet_progress():
    """No "Loading weights" bars for a megabyte: they go to stderr with a
    varying rate, which notebooks would record and compare."""
    enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            transformers_logging.enable_progress_bar()


def load_policy(name_or_path: str | Path = STARTING_POLICY, *, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu"
                ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A causal LM and its tokenizer, in eval mode, from a local directory or a hub id.

    name_or_path: a directory holding config.json, model.safetensors and the
        tokenizer files (the committed starting policy by default), or a hub id
        such as "Qwen/Qwen2.5-0.5B-Instruct" (downloads unless HF_HUB_OFFLINE=1).
    A tokenizer without a pad token gets its EOS token as pad; generation pads
    on the left.
    """
    path = Path(name_or_path).expanduser()
    looks_local = path.exists() or str(name_or_path).startswith((".", "/", "~"))
    if looks_local and not path.exists():
        raise FileNotFoundError(f"name_or_path {str(name_or_path)!r} is a local path, and no such folder exists "
                                f"(if an earlier step writes it, such as python -m grpo_edu.commands.pretrain, run that "
                                f"step first)")
    if looks_local and not (path / "config.json").is_file():
        raise FileNotFoundError(f"name_or_path {str(name_or_path)!r} is a local path but holds no "
                                f"config.json (expected a saved model directory)")
    source = str(path) if looks_local else str(name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    with _quiet_progress():
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype).to(device)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval(), tokenizer


def eos_token_ids(model, tokenizer) -> tuple[int, ...]:
    """Every token id that ends a completion, from the model's own files: the eos_token_id of
    config.json (model.config) and of generation_config.json (model.generation_config), each an
    int or a list, and the tokenizer's; the tokenizer's first, then the others ascending.

    SGLang 0.5.23 and vLLM 0.31.0 stop at these by themselves (docs/gpu.md, "Where a completion
    ends"), so every engine stops at them too, and marks a completion finished where it does:
    a Qwen2.5 instruct model names two (<|im_end|> and <|endoftext|>). `model` may be wrapped
    (DistributedDataParallel's .module, PEFT's LoRA model)."""
    while not hasattr(model, "config") and hasattr(model, "module"):
        model = model.module
    found = [tokenizer.eos_token_id]
    for where, source in (("config.json", getattr(model, "config", None)),
                          ("generation_config.json", getattr(model, "generation_config", None))):
        value = getattr(source, "eos_token_id", None)
        values = [] if value is None else [value] if isinstance(value, int) else value
        if not isinstance(values, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                           for v in values):
            raise ValueError(f"the model's {where}: eos_token_id must be a token id or a list of them, got {value!r}")
        found += values
    if found[0] is None:
        raise ValueError("the tokenizer has no eos token (eos_token_id is None): every engine needs one")
    return (found[0], *sorted(set(found[1:]) - {found[0]}))


def save_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: str | Path) -> Path:
    """Write model (safetensors + config + generation config) and tokenizer to `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with _quiet_progress():
        model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory


@torch.no_grad()
def generate_completions(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                         prompts: list[str], *, num_samples: int = 1, temperature: float = 0.0,
                         max_new_tokens: int = 16, seed: int = 0, batch_size: int = 512
                         ) -> list[list[str]]:
    """Decoded completions, `num_samples` per prompt: (len(prompts), num_samples) strings.

    temperature 0 is greedy decoding; otherwise plain sampling from
    softmax(logits / temperature) (no top-k, no top-p), seeded by `seed` without
    touching the global RNG. Special tokens (<eos>, <pad>) are dropped from the
    text; the markup tokens stay.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0 and num_samples != 1:
        raise ValueError(f"greedy decoding (temperature 0) gives one completion per prompt, "
                         f"got num_samples={num_samples}")
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 \
        else dict(do_sample=False, temperature=None, top_k=None, top_p=None)
    texts: list[str] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in range(0, len(prompts), max(1, batch_size // num_samples)):
            chunk = prompts[start:start + max(1, batch_size // num_samples)]
            batch = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
            batch = {k: v.to(model.device) for k, v in batch.items()}
            output = model.generate(**batch, max_new_tokens=max_new_tokens,
                                    num_return_sequences=num_samples,
                                    pad_token_id=tokenizer.pad_token_id,
                                    eos_token_id=list(eos_token_ids(model, tokenizer)), **sampling)
            new_tokens = output[:, batch["input_ids"].shape[1]:]
            texts += tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
    return [texts[i * num_samples:(i + 1) * num_samples] for i in range(len(prompts))]
