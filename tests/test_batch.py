"""RolloutBatch: a good batch passes and behaves; each bad one names what is wrong."""

import math

import pytest
import torch

from grpo_edu.algorithm.advantages import group_advantages, zero_std_groups
from grpo_edu.training.batch import RolloutBatch, pad_rollouts

PAD = 0
PROMPTS = [[5, 6, 7], [8, 9]]
COMPLETIONS = [[[11, 1], [12, 13, 1], [14]], [[15, 16, 17, 1], [1], [18, 1]]]


def good(**changes):
    input_ids, attention_mask, completion_mask = pad_rollouts(PROMPTS, COMPLETIONS, PAD)
    B, G, S = completion_mask.shape
    gen = torch.Generator().manual_seed(0)
    old_logp = (-torch.rand(B, G, S, generator=gen)) * completion_mask
    rewards = torch.tensor([[1.0, 0.0, 1.0], [0.5, 0.5, 0.5]])
    fields = dict(input_ids=input_ids, attention_mask=attention_mask, completion_mask=completion_mask,
                  old_logp=old_logp, ref_logp=old_logp - 0.1 * completion_mask, rewards=rewards,
                  advantages=group_advantages(rewards))
    fields.update(changes)
    return fields


def test_pad_rollouts_layout():
    input_ids, attention_mask, completion_mask = pad_rollouts(PROMPTS, COMPLETIONS, PAD)
    assert input_ids.shape == (2, 3, 3 + 4) and completion_mask.shape == (2, 3, 4)
    # prompt 1 ([8, 9]) is left-padded; its completion [1] (an immediate EOS) is right-padded
    assert input_ids[1, 1].tolist() == [PAD, 8, 9, 1, PAD, PAD, PAD]
    assert attention_mask[1, 1].tolist() == [0, 1, 1, 1, 0, 0, 0]
    assert completion_mask[1, 1].tolist() == [1, 0, 0, 0]
    # the prompt is shared by the group: G identical prompt rows
    assert (input_ids[0, :, :3] == torch.tensor([5, 6, 7])).all()


def test_good_batch_and_its_views():
    batch = RolloutBatch(**good())
    assert (batch.num_prompts, batch.group_size, batch.prompt_length, batch.completion_length) == (2, 3, 3, 4)
    assert batch.num_tokens == 2 + 3 + 1 + 4 + 1 + 2
    assert batch.completion_ids[0, 1].tolist() == [12, 13, 1, PAD]
    flat = batch.flat()
    assert flat["input_ids"].shape == (6, 7) and flat["rewards"].shape == (6,)
    assert flat["input_ids"].data_ptr() == batch.input_ids.data_ptr()  # views, not copies
    assert RolloutBatch(**good(ref_logp=None)).flat()["ref_logp"] is None


def test_select_drops_zero_std_groups():
    batch = RolloutBatch(**good())
    kept = batch.select(~zero_std_groups(batch.rewards))
    assert kept.num_prompts == 1
    assert kept.rewards.tolist() == [[1.0, 0.0, 1.0]]
    torch.testing.assert_close(kept.input_ids, batch.input_ids[:1])
    with pytest.raises(ValueError, match="keep selects no group"):
        batch.select(torch.tensor([False, False]))
    with pytest.raises(ValueError, match=r"keep must be a bool tensor of shape \(B,\) = \(2,\)"):
        batch.select(torch.tensor([1, 0]))


def test_is_frozen():
    batch = RolloutBatch(**good())
    with pytest.raises(AttributeError):
        batch.rewards = torch.zeros(2, 3)


def shifted_mask():
    # The classic off-by-one: the completion mask taken one column too early.
    mask = good()["completion_mask"]
    return torch.cat([torch.ones(2, 3, 1, dtype=mask.dtype), mask], -1)


def with_value(name, index, value):
    tensor = good()[name].clone().float() if name != "input_ids" else good()[name].clone()
    tensor[index] = value
    return tensor


BAD = [
    ("flat ids", dict(input_ids=torch.zeros(6, 7, dtype=torch.long)), ValueError,
     r"input_ids must have shape \(B, G, T\), got \(6, 7\).*view\(B, G, T\)"),
    ("G = 1", dict(input_ids=torch.zeros(2, 1, 7, dtype=torch.long)), ValueError, "G >= 2.*got G = 1"),
    ("attention shape", dict(attention_mask=torch.ones(2, 3, 6)), ValueError,
     r"attention_mask must have the shape of input_ids \(2, 3, 7\), got \(2, 3, 6\)"),
    ("mask over the whole sequence", dict(completion_mask=torch.ones(2, 3, 7)), ValueError,
     r"completion_mask has 7 columns but old_logp has S = 4: the first 3 would cover prompt tokens "
     r"\(it spans the whole sequence\); pass completion_mask\[..., -4:\]"),
    ("mask one column too wide", dict(completion_mask=shifted_mask()), ValueError,
     r"completion_mask has 5 columns but old_logp has S = 4: the first 1 would cover prompt tokens"),
    ("no prompt columns", dict(old_logp=torch.zeros(2, 3, 7), completion_mask=torch.ones(2, 3, 7),
                               ref_logp=None), ValueError, "the prompt needs at least one column"),
    ("rewards flat", dict(rewards=torch.zeros(6)), ValueError, r"rewards must have shape \(B, G\) = \(2, 3\), got \(6,\)"),
    ("advantages shape", dict(advantages=torch.zeros(2, 4)), ValueError, r"advantages must have shape \(B, G\)"),
    ("ref shape", dict(ref_logp=torch.zeros(2, 3, 5)), ValueError, "ref_logp must have the shape of old_logp"),
    ("float ids", dict(input_ids=torch.zeros(2, 3, 7)), TypeError, "input_ids must be an integer tensor"),
    ("integer rewards", dict(rewards=torch.ones(2, 3, dtype=torch.long)), TypeError,
     "rewards must be a floating-point tensor"),
    ("mask values", dict(completion_mask=torch.full((2, 3, 4), 2)), ValueError,
     "completion_mask must be bool or hold only 0 and 1"),
    ("list", dict(rewards=[[1.0, 0.0, 1.0]]), TypeError, "rewards must be a torch.Tensor, got list"),
    ("empty completion", dict(completion_mask=with_value("completion_mask", (1, 2), 0)), ValueError,
     "every completion needs at least one token in completion_mask; prompt 1, completion 2 has none"),
    ("mask with a hole", dict(completion_mask=with_value("completion_mask", (0, 1, 1), 0)), ValueError,
     "must be right-padded.*prompt 0, completion 1, completion column 2"),
    ("right-padded prompt", dict(attention_mask=with_value("attention_mask", (1, 0, 2), 0)), ValueError,
     r"every prompt must end at column P - 1 = 2.*prompt 1, completion 0 has padding there"),
    ("gap in a prompt", dict(attention_mask=with_value("attention_mask", (0, 2, 1), 0)), ValueError,
     "prompts must be left-padded.*prompt 0, completion 2, column 0"),
    ("mask covers padding", dict(attention_mask=with_value("attention_mask", (0, 0, 4), 0)), ValueError,
     "completion_mask marks a token that attention_mask marks as padding: prompt 0, completion 0, "
     "completion column 1"),
    ("attended token outside the mask", dict(attention_mask=with_value("attention_mask", (0, 0, 6), 1)),
     ValueError, "attention_mask marks a real token in the completion columns that completion_mask leaves out"),
    ("NaN reward", dict(rewards=with_value("rewards", (1, 1), math.nan)), ValueError,
     "rewards must be finite, got nan at prompt 1, completion 1"),
    ("NaN advantage", dict(advantages=with_value("advantages", (0, 2), math.nan)), ValueError,
     "advantages must be finite, got nan at prompt 0, completion 2"),
    ("inf old_logp on a real token", dict(old_logp=with_value("old_logp", (1, 0, 3), -math.inf)), ValueError,
     "old_logp must be finite on completion tokens, got -inf at prompt 1, completion 0, column 3"),
    ("probabilities for ref_logp", dict(ref_logp=with_value("ref_logp", (0, 0, 0), 0.9)), ValueError,
     "ref_logp must hold log-probabilities"),
]


@pytest.mark.parametrize("name, changes, error, message", BAD, ids=[case[0] for case in BAD])
def test_bad_batch(name, changes, error, message):
    with pytest.raises(error, match=message):
        RolloutBatch(**good(**changes))


def test_padding_may_hold_anything():
    """Values in padding are never read: NaN there is fine (a sampler may put it there)."""
    old = good()["old_logp"].clone()
    old[good()["completion_mask"] == 0] = math.nan
    RolloutBatch(**good(old_logp=old))
