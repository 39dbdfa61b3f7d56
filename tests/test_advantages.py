"""grpo_edu.algorithm.advantages against the NumPy reference, by hand, and on bad input."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from grpo_edu.algorithm import reference
from grpo_edu.algorithm.advantages import group_advantages, zero_std_groups

REWARDS = [[0.9, 0.3, -0.1, 0.7], [1.0, 0.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0]]

reward_batches = st.tuples(st.integers(1, 4), st.integers(2, 6)).flatmap(
    lambda shape: arrays(np.float64, shape, elements=st.floats(-10, 10, allow_nan=False, width=32)))


@pytest.mark.parametrize("std", ["population", "sample"])
def test_group_scale_matches_reference_row_by_row(std):
    got = group_advantages(torch.tensor(REWARDS, dtype=torch.float64), std=std)
    for row, expected in zip(REWARDS, got):
        np.testing.assert_allclose(expected.numpy(), reference.group_advantages(row, std=std),
                                   rtol=0, atol=1e-12)


def test_by_hand():
    # mean 0.45, population std sqrt(0.1475); second row: mean 0.25, std sqrt(3)/4.
    got = group_advantages(np.array(REWARDS), eps=0.0)
    np.testing.assert_allclose(got[0], np.array([0.45, -0.15, -0.55, 0.25]) / np.sqrt(0.1475), atol=1e-14)
    np.testing.assert_allclose(got[1], np.array([0.75, -0.25, -0.25, -0.25]) / (np.sqrt(3) / 4), atol=1e-14)
    sample = group_advantages(np.array(REWARDS), std="sample", eps=0.0)
    np.testing.assert_allclose(sample[1], np.array([0.75, -0.25, -0.25, -0.25]) / 0.5, atol=1e-14)


def test_batch_scale_uses_one_std_and_per_group_means():
    rewards = torch.tensor(REWARDS, dtype=torch.float64)
    got = group_advantages(rewards, scale="batch", std="sample", eps=0.0)
    expected = (rewards - rewards.mean(1, keepdim=True)) / rewards.flatten().std()
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-14)
    population = group_advantages(rewards, scale="batch", eps=0.0)
    torch.testing.assert_close(population, (rewards - rewards.mean(1, keepdim=True))
                               / np.std(REWARDS), rtol=0, atol=1e-14)


def test_none_scale_is_centred_rewards():
    got = group_advantages(np.array(REWARDS), scale="none")
    np.testing.assert_allclose(got[0], [0.45, -0.15, -0.55, 0.25], atol=1e-15)
    np.testing.assert_allclose(got[0], reference.group_advantages(REWARDS[0], scale_by_std=False),
                               atol=1e-15)


def test_all_equal_group_is_exactly_zero_even_when_the_mean_rounds():
    # 0.1 * 3 / 3 != 0.1 in floating point: r - mean is ~1e-17, which /(std + eps) would
    # turn into ~1e-9. The group carries no signal, so it must be exactly 0.
    rewards = np.array([[0.1, 0.1, 0.1], [0.7, 0.7, 0.7]])
    assert rewards[0].mean() != 0.1  # the premise: the mean rounds
    for scale in ("group", "batch", "none"):
        for std in ("population", "sample"):
            assert (group_advantages(rewards, scale=scale, std=std) == 0).all()
    assert zero_std_groups(rewards).tolist() == [True, True]


def test_types_dtypes_and_devices_round_trip():
    as_numpy = group_advantages(np.array(REWARDS, dtype=np.float32))
    assert isinstance(as_numpy, np.ndarray) and as_numpy.dtype == np.float32
    as_tensor = group_advantages(torch.tensor(REWARDS, dtype=torch.float32))
    assert isinstance(as_tensor, torch.Tensor) and as_tensor.dtype == torch.float32
    integers = group_advantages(torch.tensor([[1, 0, 0, 1]]))  # 0/1 correctness rewards
    assert integers.dtype == torch.get_default_dtype()
    torch.testing.assert_close(integers, torch.tensor([[1.0, -1.0, -1.0, 1.0]]), rtol=0, atol=1e-7)
    assert group_advantages(np.array([[True, False]])).dtype == np.float64


def test_differentiable_for_tensor_rewards():
    rewards = torch.tensor([REWARDS[0]], dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda r: group_advantages(r), (rewards,))


@settings(max_examples=150, deadline=None)
@given(reward_batches, st.sampled_from(["population", "sample"]))
def test_property_zero_mean_unit_std_and_reference(rewards, std):
    advantages = group_advantages(rewards, std=std, eps=0.0)
    flat = zero_std_groups(rewards)
    assert (advantages[flat] == 0).all()
    for row, adv, is_flat in zip(rewards, advantages, flat):
        if is_flat:
            continue
        assert abs(adv.mean()) < 1e-9
        assert adv.std(ddof=0 if std == "population" else 1) == pytest.approx(1.0, abs=1e-6)
        np.testing.assert_allclose(adv, reference.group_advantages(row, std=std, eps=0.0),
                                   rtol=1e-9, atol=1e-9)


@settings(max_examples=100, deadline=None)
@given(reward_batches, st.floats(-5, 5), st.floats(0.1, 10))
def test_property_invariant_to_reward_shift_and_scale(rewards, shift, scale):
    # Affine maps of the rewards leave group-scaled advantages unchanged (eps = 0).
    base = group_advantages(rewards, eps=0.0)
    moved = group_advantages(rewards * scale + shift, eps=0.0)
    keep = ~zero_std_groups(rewards) & ~zero_std_groups(rewards * scale + shift)
    # where the shifted rewards still resolve the spread: float64 rounds each to ~1e-16 of its
    # size, so a spread of 1e-12 shifted by 1 keeps only 4 digits (hypothesis found that group)
    shifted = rewards * scale + shift
    keep &= (rewards * scale).std(axis=1) > 1e-8 * np.abs(shifted).max(axis=1)
    np.testing.assert_allclose(moved[keep], base[keep], rtol=1e-6, atol=1e-6)


@settings(max_examples=100, deadline=None)
@given(reward_batches, st.randoms(use_true_random=False))
def test_property_permuting_a_group_permutes_its_advantages(rewards, rng):
    order = list(range(rewards.shape[1]))
    rng.shuffle(order)
    for scale in ("group", "batch", "none"):
        np.testing.assert_allclose(group_advantages(rewards[:, order], scale=scale),
                                   group_advantages(rewards, scale=scale)[:, order], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rewards, error, message", [
    (np.zeros(8), ValueError, r"flat shape \(8,\).*reshape\(-1, G\)"),
    (np.zeros((2, 3, 4)), ValueError, r"shape \(B, G\), got shape \(2, 3, 4\)"),
    (np.zeros((3, 1)), ValueError, r"G >= 2.*G = 1"),
    (np.zeros((0, 4)), ValueError, "at least one prompt"),
    (np.array([[1.0, np.nan], [0.0, 1.0]]), ValueError, "finite, got nan at prompt 0, completion 1"),
    (np.array([[1.0, 0.0], [np.inf, 1.0]]), ValueError, "finite, got inf at prompt 1, completion 0"),
    ([[1.0, 0.0]], TypeError, "torch.Tensor or numpy.ndarray.*got list"),
    (np.array([[1j, 0]]), TypeError, "real numbers"),
])
def test_bad_rewards(rewards, error, message):
    with pytest.raises(error, match=message):
        group_advantages(rewards)


@pytest.mark.parametrize("kwargs, message", [
    ({"scale": "prompt"}, "scale must be one of"),
    ({"std": "bessel"}, "std must be one of"),
    ({"eps": -1e-8}, "eps must be a number >= 0"),
])
def test_bad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        group_advantages(np.zeros((1, 2)), **kwargs)


def test_the_scales_are_a_registry_and_a_new_one_is_one_function(monkeypatch):
    from grpo_edu.algorithm import advantages
    assert tuple(advantages.SCALES) == ("group", "batch", "none")
    monkeypatch.setitem(advantages.SCALES, "range", lambda rewards, centred, correction, eps:
                        centred / (rewards.amax(1, keepdim=True) - rewards.amin(1, keepdim=True) + eps))
    rewards = torch.tensor([[0.0, 1.0, 3.0], [2.0, 2.0, 2.0]], dtype=torch.float64)
    got = advantages.group_advantages(rewards, scale="range", eps=0.0)
    expected = torch.tensor([[-4 / 9, -1 / 9, 5 / 9], [0.0, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(got, expected, rtol=0, atol=1e-15) and torch.equal(got[1], expected[1])
