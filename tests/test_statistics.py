"""grpo_edu.algorithm.statistics: paired comparisons, against hand-computed cases and SciPy."""

import math

import numpy as np
import pytest
from scipy import stats

from grpo_edu.algorithm import statistics
from grpo_edu.algorithm.statistics import (Verdict, compare_variants, mcnemar, paired_medians, paired_problems,
                                          paired_seeds, t_cdf, t_quantile)


@pytest.mark.parametrize("df", [1, 2, 3, 4, 7, 10, 29, 100, 10_000])
@pytest.mark.parametrize("p", [0.5, 0.6, 0.8, 0.9, 0.95, 0.975, 0.99, 0.995, 0.9995, 0.025, 0.001])
def test_t_quantile_is_scipys(p, df):
    # at df = 10,000 the Beta function's log-gammas (about 37,000 each) cancel to about 4: 1e-12 of them is lost
    assert t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-11 if df <= 100 else 1e-9, abs=1e-12)


@pytest.mark.parametrize("df", [1, 2, 5, 50])
@pytest.mark.parametrize("t", [-40.0, -4.3, -1.0, 0.0, 0.3, 2.0, 12.7, 400.0])
def test_t_cdf_is_scipys(t, df):
    assert t_cdf(t, df) == pytest.approx(stats.t.cdf(t, df), rel=1e-11, abs=1e-14)


def test_t_quantiles_by_hand():
    """df = 1 is Cauchy: tan(pi (p - 1/2)); df = 2 has a closed form, (2p - 1) / sqrt(2 p (1 - p))."""
    for p in (0.6, 0.9, 0.975):
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-12)
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-12)
    assert t_quantile(0.5, 7) == 0.0


def test_paired_seeds_by_hand_and_as_scipys_paired_t():
    """Chapter 5's process against outcome supervision, paired by seed: differences +0.063,
    +0.066, +0.012; mean 0.047, sd 0.030348, t(2) = 4.302653: [-0.0284, +0.1224]."""
    process, outcome = [0.563, 0.566, 0.512], [0.5, 0.5, 0.5]
    verdict = paired_seeds(process, outcome)
    mean = (0.063 + 0.066 + 0.012) / 3
    sd = math.sqrt(((0.063 - mean) ** 2 + (0.066 - mean) ** 2 + (0.012 - mean) ** 2) / 2)
    half = 4.302652729749464 * sd / math.sqrt(3)
    assert verdict.difference == pytest.approx(mean, abs=1e-15)
    assert (verdict.low, verdict.high) == pytest.approx((mean - half, mean + half), abs=1e-12)
    interval = stats.ttest_rel(process, outcome).confidence_interval(0.95)
    assert (verdict.low, verdict.high) == pytest.approx((interval.low, interval.high), abs=1e-12)
    assert not verdict.separated
    assert verdict.words("process", "outcome") == \
        "process and outcome are not separated at this size: process - outcome = +0.047 [-0.028, +0.122]"
    assert verdict.method == "paired t interval over 3 seeds (2 degrees of freedom)"


def test_a_separated_pair_names_the_winner_either_way():
    verdict = paired_seeds([0.80, 0.82, 0.81, 0.83], [0.70, 0.71, 0.69, 0.72])
    assert verdict.separated and verdict.low > 0
    assert verdict.words("tool", "no tool").startswith("tool beats no tool: tool - no tool = +0.110 [")
    flipped = paired_seeds([0.70, 0.71, 0.69, 0.72], [0.80, 0.82, 0.81, 0.83])
    assert flipped.words("A", "B").startswith("B beats A: A - B = -0.110 [")


def test_pairing_is_what_separates():
    """Seeds that move together: unpaired, the ranges overlap; paired, A is ahead every seed by
    about the same amount and the interval excludes zero."""
    b = [0.60, 0.70, 0.80, 0.65]
    a = [x + 0.02 + e for x, e in zip(b, (0.001, -0.002, 0.0015, 0.0))]
    assert max(b) > min(a)
    assert paired_seeds(a, b).low > 0


@pytest.mark.parametrize("make, message", [
    (lambda: paired_seeds([1.0], [0.5]), "a t interval needs at least 2 paired seeds, got 1"),
    (lambda: paired_seeds([1.0, 2.0], [0.5]), "expected one value per pair in each, got 2 and 1"),
    (lambda: paired_seeds([1.0, math.nan], [0.5, 0.5]), "a: expected finite numbers, got nan"),
    (lambda: paired_seeds([1.0, 2.0], [0.5, 0.6], confidence=95), "confidence: expected a float in (0, 1)"),
    (lambda: paired_problems([1, 0], [1]), "the same problems"),
    (lambda: paired_problems([1, 2], [1, 0]), "a: expected outcomes 0 (wrong) or 1 (right), got 2"),
    (lambda: paired_problems([1, 0], [1, 0], resamples=10), "resamples: expected an int >= 100, got 10"),
    (lambda: t_quantile(1.0, 3), "p: expected a probability in (0, 1), got 1.0"),
    (lambda: t_quantile(0.9, 0), "df: expected an int >= 1, got 0"),
])
def test_bad_input_is_one_line_naming_the_argument(make, message):
    with pytest.raises(ValueError) as error:
        make()
    assert message in str(error.value) and "\n" not in str(error.value)


def test_paired_problems_bootstrap():
    rng = np.random.default_rng(1)
    a = (rng.random(256) < 0.75).astype(int).tolist()
    b = [x if rng.random() < 0.9 else 1 - x for x in a]   # the same problems, mostly the same outcomes
    verdict = paired_problems(a, b, resamples=4000, seed=3)
    assert verdict.difference == pytest.approx((sum(a) - sum(b)) / 256, abs=1e-15)
    assert verdict.low <= verdict.difference <= verdict.high
    assert verdict == paired_problems(a, b, resamples=4000, seed=3)           # seeded: the same interval
    # the paired bootstrap's spread is the discordant problems' (a normal check of its width)
    d = np.array(a) - np.array(b)
    assert verdict.high - verdict.low == pytest.approx(2 * 1.96 * d.std() / math.sqrt(256), rel=0.1)
    same = paired_problems(a, a, resamples=200)
    assert (same.difference, same.low, same.high, same.separated) == (0.0, 0.0, 0.0, False)
    assert verdict.method == "paired bootstrap over 256 problems (4000 resamples, percentile)"


def test_paired_medians_by_hand():
    # n = 6: P(Binomial(6, 1/2) = 0) = 1/64 <= 0.025 < 7/64, so k = 1: the smallest and the largest
    # difference (coverage 1 - 2/64); n = 60: ranks 22 and 39 (P(X <= 21) = 0.0137, P(X <= 22) = 0.0259).
    verdict = paired_medians([5.0, 1.0, 4.0, 2.0, 6.0, 3.0], [0.0] * 6)
    assert (verdict.difference, verdict.low, verdict.high, verdict.n) == (3.5, 1.0, 6.0, 6)
    assert verdict.method == "sign-test interval of the median over 6 pairs (order statistics 1 and 6)"
    sixty = paired_medians([float(i) + 10 for i in range(60)], [10.0] * 60)
    assert (sixty.low, sixty.high, sixty.difference) == (21.0, 38.0, 29.5)
    assert sixty.separated and not paired_medians([-1.0, 1.0] * 30, [0.0] * 60).separated
    with pytest.raises(ValueError, match="a, b: a 95% sign-test interval needs more pairs, got 5"):
        paired_medians([1.0] * 5, [0.0] * 5)   # 2 / 32 > 0.05: even the extremes cover less than 95%


def test_paired_medians_order_statistics_are_scipys_binomial_quantiles():
    """k - 1 is the largest count whose lower tail is within (1 - confidence) / 2: Binomial(n, 1/2)'s
    quantile, by SciPy, for many n and levels; and the interval holds the median."""
    rng = np.random.default_rng(0)
    for n in (6, 7, 10, 25, 60, 101):
        for confidence in (0.8, 0.9, 0.95, 0.99):
            if stats.binom.cdf(0, n, 0.5) > (1 - confidence) / 2:
                continue
            k = int(stats.binom.ppf((1 - confidence) / 2, n, 0.5))
            k += stats.binom.cdf(k, n, 0.5) <= (1 - confidence) / 2   # ppf is the smallest with cdf >= tail
            values = sorted(rng.standard_normal(n).tolist())
            verdict = paired_medians(values, [0.0] * n, confidence)
            assert (verdict.low, verdict.high) == (values[k - 1], values[n - k]), (n, confidence)
            assert verdict.low <= verdict.difference <= verdict.high


def test_mcnemar_by_hand_and_as_scipys_exact_binomial():
    """A right and B wrong on 9 problems, the reverse on 2, both alike on the rest:
    p = 2 P(X <= 2), X ~ Binomial(11, 1/2) = 2 (1 + 11 + 55) / 2048 = 0.0654296875."""
    a = [1] * 9 + [0] * 2 + [1] * 30 + [0] * 10
    b = [0] * 9 + [1] * 2 + [1] * 30 + [0] * 10
    result = mcnemar(a, b)
    assert result == {"a_only": 9.0, "b_only": 2.0, "p_value": 0.0654296875}
    assert result["p_value"] == pytest.approx(stats.binomtest(9, 11, 0.5).pvalue, rel=1e-12)
    assert mcnemar([1, 0], [1, 0])["p_value"] == 1.0   # no discordant problem: nothing to test
    assert mcnemar([1, 0, 1], [0, 1, 0])["p_value"] == 1.0


def test_verdict_is_separated_only_when_the_interval_excludes_zero():
    assert not Verdict(0.1, 0.0, 0.2, 0.95, "", 3).separated
    assert Verdict(0.1, 0.01, 0.2, 0.95, "", 3).separated
    assert Verdict(-0.1, -0.2, -1e-9, 0.95, "", 3).separated


def test_by_seed_takes_one_number_per_seed_in_seed_order():
    runs = [{"variant": "a", "seed": 2, "final_accuracy": 0.3}, {"variant": "a", "seed": 0, "final_accuracy": 0.1},
            {"variant": "b", "seed": 0, "final_accuracy": 0.9}, {"variant": "a", "seed": 1, "final_accuracy": 0.2,
                                                                  "after": {"x": 5}}]
    assert statistics.by_seed(runs, variant="a") == [0.1, 0.2, 0.3]
    assert statistics.by_seed(runs, lambda run: run["seed"] * 10, variant="a") == [0, 10, 20]
    with pytest.raises(ValueError, match=r"runs: expected one run per seed where \{'variant': 'c'\}, got seeds \[\]"):
        statistics.by_seed(runs, variant="c")
    with pytest.raises(ValueError, match=r"got seeds \[0, 0, 1, 2\]"):
        statistics.by_seed(runs)


# --------------------------------------------------------------------------- compare_variants

def test_compare_variants_pairs_by_seed_and_within_each_seed_by_problem():
    runs = [{"variant": "a", "seed": s, "final_accuracy": acc, "greedy_correct": out}
            for s, acc, out in ((0, 0.75, [1, 1, 1, 0]), (1, 0.5, [1, 0, 1, 0]), (2, 1.0, [1, 1, 1, 1]))]
    runs += [{"variant": "b", "seed": s, "final_accuracy": acc, "greedy_correct": out}
             for s, acc, out in ((0, 0.5, [1, 0, 0, 1]), (1, 0.5, [0, 1, 1, 0]))]
    runs.append({"variant": "b", "seed": 2, "final_accuracy": 0.25})          # outcomes not kept
    [(key, entry)] = compare_variants(runs, [("a", "b")]).items()
    assert key == "a - b" and entry["seeds"] == [0, 1, 2]
    by_hand = paired_seeds([0.75, 0.5, 1.0], [0.5, 0.5, 0.25])
    assert (entry["difference"], entry["low"], entry["high"]) == (by_hand.difference, by_hand.low, by_hand.high)
    assert entry["words"] == by_hand.words("a", "b")
    assert set(entry["per_seed"]) == {"0", "1"}                              # seed 2's b kept no outcomes
    # seed 0: a right alone on problems 1 and 2, b alone on 3
    assert entry["per_seed"]["0"]["a_only"] == 2 and entry["per_seed"]["0"]["b_only"] == 1
    assert entry["per_seed"]["0"]["p_value"] == mcnemar([1, 1, 1, 0], [1, 0, 0, 1])["p_value"] == 1.0
    assert entry["per_seed"]["0"]["difference"] == 0.25


def test_compare_variants_on_another_value_and_bad_names():
    runs = [{"variant": v, "seed": s, "final_accuracy": 0.0, "x": s + (v == "a")} for v in "ab" for s in range(3)]
    entry = compare_variants(runs, [("a", "b")], value=lambda run: run["x"])["a - b"]
    assert entry["difference"] == 1.0 and entry["low"] == entry["high"] == 1.0 and "per_seed" not in entry
    with pytest.raises(ValueError, match="pairs: no run has variant = 'c'"):
        compare_variants(runs, [("a", "c")])


def test_every_seed_moving_by_the_same_amount_is_not_separated_on_three_seeds():
    # A t interval of zero width measures no spread, not certainty: the sign test decides.
    verdict = paired_seeds([0.51, 0.61, 0.71], [0.50, 0.60, 0.70])
    assert verdict.low == verdict.high == pytest.approx(0.01) and verdict.sign_p == 0.25
    assert not verdict.separated
    assert "not separated" in verdict.words() and "sign test p = 0.25" in verdict.words()
    # Six seeds of one sign: p = 2 ** -5 = 0.03125 <= 0.05, separated; at 99%, not.
    six = paired_seeds([1.0] * 6, [0.0] * 6)
    assert six.separated and six.sign_p == 0.03125 and "beats" in six.words()
    assert not paired_seeds([1.0] * 6, [0.0] * 6, confidence=0.99).separated
    # No difference at all: an empty interval at zero, not separated, no sign test needed.
    same = paired_seeds([0.5, 0.6], [0.5, 0.6])
    assert (same.low, same.high, same.sign_p, same.separated) == (0.0, 0.0, None, False)
    # Any spread at all: the t interval as before.
    assert paired_seeds([0.52, 0.61, 0.71], [0.50, 0.60, 0.70]).sign_p is None


def test_a_spread_that_is_only_rounding_is_no_spread():
    a = [0.1 + 0.2, 0.7 + 0.1, 0.3]
    b = [0.2, 0.7, 0.2]            # differences 0.1 up to float rounding (1e-17)
    assert len({x - y for x, y in zip(a, b)}) > 1
    verdict = paired_seeds(a, b)
    assert verdict.sign_p == 0.25 and not verdict.separated
