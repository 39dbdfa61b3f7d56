"""The character tokenizer, the tiny Llama, loading and generation."""

import json

import pytest
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from grpo_edu.policy import models
from grpo_edu.policy.models import (BOXED_OPEN, CHARACTERS, THINK_CLOSE, THINK_OPEN, char_tokenizer,
                             generate_completions, load_policy, save_policy, tiny_llama)


@pytest.fixture(scope="module")
def tokenizer():
    return char_tokenizer()


def test_tokenizer_is_a_transformers_fast_tokenizer(tokenizer):
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    assert len(tokenizer) == 3 + 3 + len(CHARACTERS)
    assert (tokenizer.pad_token, tokenizer.eos_token, tokenizer.unk_token) == ("<pad>", "<eos>", "<unk>")
    assert tokenizer.padding_side == "left"


def test_one_token_per_character_and_per_markup_tag(tokenizer):
    text = "47+85=<think>12</think>\\boxed{132}"
    tokens = tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"])
    assert tokens == list("47+85=") + [THINK_OPEN, "1", "2", THINK_CLOSE, BOXED_OPEN, "1", "3", "2", "}"]


@pytest.mark.parametrize("text", [CHARACTERS, "a  b\n\nc", "\\boxed{\\boxed{}}", "<think", "</thinking>",
                                  " <think> x </think> "])
def test_round_trip(tokenizer, text):
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_markup_survives_skip_special_tokens_but_eos_and_pad_do_not(tokenizer):
    ids = tokenizer("<think>1</think>\\boxed{1}")["input_ids"] + [tokenizer.eos_token_id, tokenizer.pad_token_id]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<think>1</think>\\boxed{1}"


def test_unknown_characters_become_unk(tokenizer):
    ids = tokenizer("é中")["input_ids"]
    assert ids == [tokenizer.unk_token_id] * 2


def test_left_padding_for_generation(tokenizer):
    batch = tokenizer(["1+2=", "10+20="], padding=True)
    assert batch["input_ids"][0][:2] == [tokenizer.pad_token_id] * 2
    assert batch["attention_mask"][0] == [0, 0, 1, 1, 1, 1]


def test_save_and_load_round_trip(tmp_path, tokenizer):
    model = tiny_llama(tokenizer, seed=3)
    save_policy(model, tokenizer, tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    loaded, loaded_tokenizer = load_policy(tmp_path)
    assert not loaded.training
    assert loaded_tokenizer("<think>7</think>")["input_ids"] == tokenizer("<think>7</think>")["input_ids"]
    assert AutoTokenizer.from_pretrained(tmp_path).padding_side == "left"
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 2


def test_load_policy_names_a_bad_local_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no config.json"):
        load_policy(tmp_path)


def test_tiny_llama_is_seeded_and_small(tokenizer):
    a, b, c = tiny_llama(tokenizer, seed=0), tiny_llama(tokenizer, seed=0), tiny_llama(tokenizer, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not all(torch.equal(x, y) for x, y in zip(a.parameters(), c.parameters()))
    assert sum(p.numel() for p in a.parameters()) < 500_000
    assert a.config.tie_word_embeddings and a.config.vocab_size == len(tokenizer)
    with pytest.raises(ValueError, match="hidden_size must be divisible by num_heads"):
        models.tiny_llama_config(tokenizer, hidden_size=100, num_heads=3)


def test_generate_completions_shapes_determinism_and_rng_isolation(tokenizer):
    model = tiny_llama(tokenizer, seed=0)
    prompts = ["47+85=", "12-3="]
    state = torch.random.get_rng_state()
    greedy = generate_completions(model, tokenizer, prompts, max_new_tokens=5)
    sampled = generate_completions(model, tokenizer, prompts, num_samples=3, temperature=1.0,
                                   max_new_tokens=5, seed=7)
    assert torch.equal(state, torch.random.get_rng_state())   # the caller's RNG is untouched
    assert [len(g) for g in greedy] == [1, 1] and [len(g) for g in sampled] == [3, 3]
    assert sampled == generate_completions(model, tokenizer, prompts, num_samples=3, temperature=1.0,
                                           max_new_tokens=5, seed=7)
    assert greedy == generate_completions(model, tokenizer, prompts, max_new_tokens=5, batch_size=1)
    with pytest.raises(ValueError, match="greedy decoding"):
        generate_completions(model, tokenizer, prompts, num_samples=2)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        generate_completions(model, tokenizer, prompts, temperature=-1.0)


def test_eos_token_ids_are_the_union_of_the_models_files_and_the_tokenizers():
    """config.json's eos_token_id, generation_config.json's (each an int or a list) and the
    tokenizer's, the tokenizer's first; a wrapped model's (.module) too; a malformed one is
    one line naming the file."""
    from types import SimpleNamespace
    from grpo_edu.policy.models import eos_token_ids
    tokenizer = SimpleNamespace(eos_token_id=7)
    model = SimpleNamespace(config=SimpleNamespace(eos_token_id=[9, 7]),
                            generation_config=SimpleNamespace(eos_token_id=3))
    assert eos_token_ids(model, tokenizer) == (7, 3, 9)
    assert eos_token_ids(SimpleNamespace(module=model), tokenizer) == (7, 3, 9)
    assert eos_token_ids(SimpleNamespace(config=SimpleNamespace(eos_token_id=None)), tokenizer) == (7,)
    bad = SimpleNamespace(config=SimpleNamespace(eos_token_id=7), generation_config=SimpleNamespace(eos_token_id="7"))
    with pytest.raises(ValueError) as error:
        eos_token_ids(bad, tokenizer)
    assert str(error.value) == "the model's generation_config.json: eos_token_id must be a token id or a list of them, got '7'"
    with pytest.raises(ValueError, match="the tokenizer has no eos token"):
        eos_token_ids(model, SimpleNamespace(eos_token_id=None))
