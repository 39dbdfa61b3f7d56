"""grpo_edu.algorithm.reference against hand-worked values, finite differences and invariants."""

from fractions import Fraction
from math import exp, log, sqrt

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from grpo_edu.algorithm import reference

REWARDS = [0.9, 0.3, -0.1, 0.7]


def test_group_statistics_by_hand_in_fractions():
    r = [Fraction(9, 10), Fraction(3, 10), Fraction(-1, 10), Fraction(7, 10)]
    mean = sum(r) / 4
    assert mean == Fraction(9, 20)
    variance_population = sum((x - mean) ** 2 for x in r) / 4
    variance_sample = sum((x - mean) ** 2 for x in r) / 3
    assert variance_population == Fraction(59, 400)  # 0.1475
    expected_population = [float(x - mean) / sqrt(float(variance_population)) for x in r]
    expected_sample = [float(x - mean) / sqrt(float(variance_sample)) for x in r]
    np.testing.assert_allclose(reference.group_advantages(REWARDS, std="population", eps=0.0),
                               expected_population, rtol=0, atol=1e-15)
    np.testing.assert_allclose(reference.group_advantages(REWARDS, std="sample", eps=0.0),
                               expected_sample, rtol=0, atol=1e-15)
    assert reference.group_std(REWARDS, "population") == pytest.approx(sqrt(0.1475), abs=1e-15)


def test_advantages_without_std_scaling_are_centred_rewards():
    np.testing.assert_allclose(reference.group_advantages(REWARDS, scale_by_std=False),
                               [0.45, -0.15, -0.55, 0.25], atol=1e-15)


def test_log_softmax_by_hand_and_stable_for_huge_logits():
    row = [1.10, -0.20, 0.30]
    lse = log(exp(1.10) + exp(-0.20) + exp(0.30))
    np.testing.assert_allclose(reference.log_softmax([row])[0], [x - lse for x in row], atol=1e-15)
    huge = reference.log_softmax([[1000.0, 999.0, -1000.0]])
    assert np.isfinite(huge).all()
    np.testing.assert_allclose(np.exp(huge).sum(), 1.0, atol=1e-15)
    np.testing.assert_allclose(huge[0, 0], -log(1 + exp(-1.0)), atol=1e-12)


def test_k3_by_hand():
    d = -0.124
    assert reference.k3(-0.600, -0.476) == pytest.approx(exp(d) - d - 1, abs=1e-15)
    assert reference.k3(-0.3, -0.3) == 0.0
    assert (reference.k3(np.linspace(-5, 0, 7), np.linspace(0, -5, 7)) >= 0).all()


def test_one_token_group_by_hand():
    """G = 2 responses of one token over V = 2; every term worked out by hand."""
    logits = [np.array([[0.0, log(3.0)]]), np.array([[log(3.0), 0.0]])]  # p(1) = 3/4, p(0) = 3/4
    token_ids = [[1], [1]]                                                # second gets p = 1/4
    old = [[log(0.5)], [log(0.5)]]
    ref = [[log(0.5)], [log(0.5)]]
    update = reference.grpo_update(token_ids, logits, old, ref, [1.0, 0.0], epsilon=0.2, beta=0.1, eps=0.0)
    # advantages +1, -1; ratios 1.5 and 0.5
    np.testing.assert_allclose(update.advantages, [1.0, -1.0])
    r0, r1 = update.responses
    assert r0.ratio[0] == pytest.approx(1.5) and r1.ratio[0] == pytest.approx(0.5)
    # response 0: A > 0, ratio 1.5 > 1.2: clipped at 1.2
    assert r0.objective[0] == pytest.approx(1.2) and r0.clipped[0]
    # response 1: A < 0, ratio 0.5 < 0.8: clipped at -0.8
    assert r1.objective[0] == pytest.approx(-0.8) and r1.clipped[0]
    kl0 = 0.5 / 0.75 - log(0.5 / 0.75) - 1
    kl1 = 0.5 / 0.25 - log(0.5 / 0.25) - 1
    assert r0.kl[0] == pytest.approx(kl0) and r1.kl[0] == pytest.approx(kl1)
    assert update.loss == pytest.approx(((-1.2 + 0.1 * kl0) + (0.8 + 0.1 * kl1)) / 2)


def _random_group(seed, G=4, V=5):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 5, size=G)
    token_ids = [rng.integers(0, V, size=T).tolist() for T in lengths]
    logits = [rng.normal(size=(T, V)) for T in lengths]
    old = [reference.log_softmax(lg)[np.arange(T), ids] + rng.normal(0, 0.3, size=T)
           for lg, ids, T in zip(logits, token_ids, lengths)]
    ref = [o + rng.normal(0, 0.3, size=len(o)) for o in old]
    rewards = rng.normal(size=G)
    return token_ids, logits, old, ref, rewards


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("epsilon, epsilon_high", [(0.2, None), (0.2, 0.28), (0.1, 0.5)])
def test_gradient_matches_finite_differences(seed, epsilon, epsilon_high):
    token_ids, logits, old, ref, rewards = _random_group(seed)
    update = reference.grpo_update(token_ids, logits, old, ref, rewards, epsilon=epsilon,
                                   epsilon_high=epsilon_high, beta=0.04)
    h = 1e-6
    for i, response in enumerate(update.responses):
        for index in np.ndindex(logits[i].shape):
            plus = [lg.copy() for lg in logits]
            minus = [lg.copy() for lg in logits]
            plus[i][index] += h
            minus[i][index] -= h
            numeric = (reference.grpo_update(token_ids, plus, old, ref, rewards, epsilon=epsilon,
                                             epsilon_high=epsilon_high, beta=0.04).loss
                       - reference.grpo_update(token_ids, minus, old, ref, rewards, epsilon=epsilon,
                                               epsilon_high=epsilon_high, beta=0.04).loss) / (2 * h)
            assert response.grad_logits[index] == pytest.approx(numeric, abs=1e-7)


def test_clip_higher_widens_only_the_upper_bound():
    token_ids, logits, old, ref, rewards = [[0]], None, None, None, None
    logits = [np.array([[0.0, 0.0]]), np.array([[0.0, 0.0]])]
    token_ids = [[0], [0]]
    old = [[log(0.5) - 0.2], [log(0.5) - 0.2]]   # ratio exp(0.2) = 1.2214 for both
    update = reference.grpo_update(token_ids, logits, old, old, [1.0, 0.0], epsilon=0.2, epsilon_high=0.28)
    assert not update.responses[0].clipped[0]    # 1.2214 < 1.28: no longer clipped for A > 0
    symmetric = reference.grpo_update(token_ids, logits, old, old, [1.0, 0.0], epsilon=0.2)
    assert symmetric.responses[0].clipped[0]


def test_fresh_rollout_has_zero_loss_and_nonzero_gradient():
    token_ids, logits, _, _, rewards = _random_group(7)
    fresh = [reference.log_softmax(lg)[np.arange(len(ids)), ids] for lg, ids in zip(logits, token_ids)]
    update = reference.grpo_update(token_ids, logits, fresh, fresh, rewards)
    assert abs(update.loss) < 1e-12
    assert sum(np.abs(r.grad_logits).sum() for r in update.responses) > 1e-3


# ----------------------------------------------------------------- properties

rewards_strategy = st.lists(st.floats(-100, 100, allow_nan=False), min_size=2, max_size=16)


@settings(max_examples=200, deadline=None)
@given(rewards_strategy, st.sampled_from(["population", "sample"]))
@example([100.0, 99.99999999999999], "population")   # found by CI: the mean's rounding, over std + eps
def test_advantages_sum_to_zero(rewards, std):
    """Up to rounding: the mean itself is rounded (by at most half an ulp of the largest reward), so
    the centred rewards sum to at most G such errors, which the division by std + eps magnifies. For
    rewards [100.0, 99.99999999999999] (std 1e-14, below eps = 1e-8) that is 1.42e-6, not a bug."""
    advantages = reference.group_advantages(rewards, std=std)
    rounding = len(rewards) * np.spacing(max(abs(r) for r in rewards)) / (reference.group_std(rewards, std) + 1e-8)
    assert abs(advantages.sum()) <= 1e-9 * max(1.0, np.abs(advantages).max()) + rounding


@settings(max_examples=200, deadline=None)
@given(rewards_strategy, st.floats(-1e3, 1e3), st.sampled_from(["population", "sample"]))
def test_advantages_unchanged_by_a_constant_shift(rewards, shift, std):
    rewards = np.array(rewards)
    spread = rewards.max() - rewards.min()
    if spread < 1e-3:  # an (almost) constant group: covered by the all-equal test
        return
    np.testing.assert_allclose(reference.group_advantages(rewards + shift, std=std),
                               reference.group_advantages(rewards, std=std), atol=1e-6)


@settings(max_examples=200, deadline=None)
@given(rewards_strategy, st.floats(0.01, 100), st.sampled_from(["population", "sample"]))
def test_advantages_scale_correctly(rewards, scale, std):
    rewards = np.array(rewards)
    if rewards.max() - rewards.min() < 1e-3:
        return
    # std scaling: invariant to scaling the rewards (exactly so with eps = 0; eps
    # only matters for spreads near it); without std scaling: linear.
    np.testing.assert_allclose(reference.group_advantages(scale * rewards, std=std, eps=0.0),
                               reference.group_advantages(rewards, std=std, eps=0.0), atol=1e-9)
    np.testing.assert_allclose(reference.group_advantages(scale * rewards, scale_by_std=False),
                               scale * reference.group_advantages(rewards, scale_by_std=False),
                               atol=1e-9 * scale * max(1.0, np.abs(rewards).max()))
    np.testing.assert_allclose(reference.group_advantages(-rewards, std=std),
                               -reference.group_advantages(rewards, std=std), atol=1e-9)


@settings(max_examples=100, deadline=None)
@given(st.floats(-1e6, 1e6, allow_nan=False), st.integers(2, 64), st.sampled_from(["population", "sample"]),
       st.booleans())
def test_all_equal_rewards_give_exact_zeros(value, G, std, scale_by_std):
    advantages = reference.group_advantages([value] * G, std=std, scale_by_std=scale_by_std)
    assert not np.isnan(advantages).any()
    assert (advantages == 0.0).all()


# ----------------------------------------------------------------- errors

@pytest.mark.parametrize("rewards, message", [
    ([1.0], "G >= 2"),
    ([], "G >= 2"),
    ([1.0, float("nan")], "rewards must be finite, got nan at index 1"),
    ([float("inf"), 1.0], "rewards must be finite, got inf at index 0"),
    ([[1.0, 2.0]], r"one-dimensional \(G,\), got shape \(1, 2\)"),
])
def test_bad_rewards_are_named(rewards, message):
    with pytest.raises(ValueError, match=message):
        reference.group_advantages(rewards)


def test_bad_std_kind_is_named():
    with pytest.raises(ValueError, match=r"std must be one of \('population', 'sample'\), got 'bessel'"):
        reference.group_advantages(REWARDS, std="bessel")


def test_mismatched_lengths_are_named():
    token_ids, logits, old, ref, rewards = _random_group(0)
    with pytest.raises(ValueError, match=r"rewards must have one entry per response \(G = 4"):
        reference.grpo_update(token_ids, logits, old, ref, rewards[:3])
    with pytest.raises(ValueError, match=r"old_logp must have one entry per response"):
        reference.grpo_update(token_ids, logits, old[:2], ref, rewards)
    short = [o[:-1] if len(o) > 1 else o for o in old]
    if any(len(a) != len(b) for a, b in zip(short, old)):
        with pytest.raises(ValueError, match=r"old_logp\[\d\] and ref_logp\[\d\] must have T_i"):
            reference.grpo_update(token_ids, logits, short, ref, rewards)
    with pytest.raises(ValueError, match=r"new_logits\[0\] must have shape \(T_i, V\)"):
        reference.grpo_update(token_ids, [lg[:, None] for lg in logits], old, ref, rewards)


def test_empty_response_and_bad_token_ids_are_named():
    logits = [np.zeros((1, 3)), np.zeros((0, 3))]
    with pytest.raises(ValueError, match=r"token_ids\[1\] is empty"):
        reference.grpo_update([[0], []], logits, [[-1.0], []], [[-1.0], []], [1.0, 0.0])
    with pytest.raises(ValueError, match=r"token_ids\[0\] must lie in \[0, V = 3\), got \[3\]"):
        reference.grpo_update([[3], [0]], [np.zeros((1, 3))] * 2, [[-1.0]] * 2, [[-1.0]] * 2, [1.0, 0.0])
