"""Paired comparisons: how the book decides whether run A beats run B.

Two training set-ups compared on the same seeds and the same held-out problems are paired:
seed s of A and seed s of B share their prompts and their starting policy, and problem j is
the same problem for both. A pooled interval over "3 seeds x 256 problems" treats the same
problems as independent evaluations and ignores the variance between training runs; the
paired difference does neither. The book's rule: "A beats B" only where the paired interval
of the difference excludes zero; otherwise "not separated at this size", with the interval.

    by_seed          one number per seed, in seed order, from a results file's runs
    paired_seeds     the mean over seeds of (A - B), a seed's number each (its final accuracy,
                     say), with Student's t interval on n - 1 degrees of freedom (where every
                     seed's difference is the same, the interval has no width: the sign test decides)
    paired_medians   paired measurements (the times of two ways of computing one thing, called
                     in turns): the median of the differences, with the sign test's interval
    paired_problems  per-problem outcomes of one pair of runs: the difference in accuracy with
                     a paired bootstrap over problems (Efron and Tibshirani, 1993), and
                     McNemar's exact test (McNemar, 1947) on the discordant problems
    Verdict          the difference, its interval, which test, and the words the book may use
    compare_variants a results file's verdicts: for each pair of variants, paired over seeds,
                     and within each seed over the same problems where the runs kept them
    t_quantile       Student's t quantile (no SciPy needed; tests hold it to scipy.stats.t)

Every function takes plain numbers or 0/1 outcomes and returns plain floats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

SEPARATED, NOT_SEPARATED = "beats", "not separated at this size"


@dataclass(frozen=True)
class Verdict:
    """A paired comparison of A with B: the mean difference A - B and its interval."""

    difference: float
    low: float
    high: float
    confidence: float
    method: str      # how the interval was made, in words a reader can look up
    n: int           # the pairs: seeds, or problems
    # Only for a t interval of zero width (every seed's difference the same): the exact sign
    # test's two-sided p-value, 2 ** (1 - n), which then decides instead of the empty interval.
    sign_p: float | None = None

    @property
    def separated(self) -> bool:
        """The interval excludes zero; for a t interval of zero width, the sign test also rejects
        "no difference" at 1 - confidence (see `paired_seeds`)."""
        excludes = self.low > 0 or self.high < 0
        return excludes and (self.sign_p is None or self.sign_p <= 1 - self.confidence)

    def words(self, a: str = "A", b: str = "B") -> str:
        """What the book may say: "A beats B", "B beats A", or "not separated at this size"."""
        interval = f"{self.difference:+.3f} [{self.low:+.3f}, {self.high:+.3f}]"
        if not self.separated:
            why = (f" (every seed's difference is the same; sign test p = {self.sign_p:.3g})"
                   if self.sign_p is not None and self.difference != 0 else "")
            return f"{a} and {b} are {NOT_SEPARATED}: {a} - {b} = {interval}{why}"
        winner, loser = (a, b) if self.low > 0 else (b, a)
        return f"{winner} {SEPARATED} {loser}: {a} - {b} = {interval}"


# --------------------------------------------------------------------------- over seeds

def by_seed(runs: Sequence[dict], value="final_accuracy", **where) -> list[float]:
    """One number per seed, in seed order: `value` (a key of the run, or a function of it) of each
    run (a dict with a "seed") whose keys equal `where`, as the benchmarks' results files hold them.
    Two runs of one seed are an error: pairing needs one number per seed."""
    chosen = sorted((run for run in runs if all(run.get(key) == wanted for key, wanted in where.items())),
                    key=lambda run: run["seed"])
    seeds = [run["seed"] for run in chosen]
    if not chosen or len(set(seeds)) != len(seeds):
        raise ValueError(f"runs: expected one run per seed where {where}, got seeds {seeds}")
    return [value(run) if callable(value) else run[value] for run in chosen]


def paired_seeds(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Verdict:
    """a[s], b[s]: one number per seed for each set-up, seed s paired. The mean of the
    differences d_s = a_s - b_s and its t interval, mean(d) +- t(n - 1) sd(d) / sqrt(n)."""
    differences = _paired(a, b, "a", "b")
    n = len(differences)
    if n < 2:
        raise ValueError(f"a, b: a t interval needs at least 2 paired seeds, got {n}")
    _check_confidence(confidence)
    mean = math.fsum(differences) / n
    sd = math.sqrt(math.fsum((d - mean) ** 2 for d in differences) / (n - 1))
    half = t_quantile(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)
    method = f"paired t interval over {n} seeds ({n - 1} degrees of freedom)"
    if sd <= 1e-12 * max(1.0, abs(mean)) and mean != 0:   # no spread, up to rounding
        # Every seed moved by exactly the same amount: the t interval has zero width, which
        # measures no seed-to-seed variance, not certainty. Then n differences of one sign
        # are what the sign test sees: separated only where 2 ** (1 - n) <= 1 - confidence
        # (6 seeds at 95%), never on 3 seeds.
        p = 2.0 ** (1 - n)
        return Verdict(mean, mean, mean, confidence, method + f"; every seed's difference is the same, "
                       f"so the sign test decides (p = {p:.3g})", n, sign_p=p)
    return Verdict(mean, mean - half, mean + half, confidence, method, n)


def paired_medians(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Verdict:
    """a[i], b[i]: paired measurements, such as the times of two ways of computing one thing,
    called in turns. The median of the differences d_i = a_i - b_i and the sign test's interval
    for it, which assumes nothing of their distribution (times on a shared machine have a long
    tail, which a t interval's mean would follow): the order statistics k and n + 1 - k of the
    sorted differences, k the largest with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2
    (Conover, Practical Nonparametric Statistics, 3.2). Its coverage is at least `confidence`."""
    differences = sorted(_paired(a, b, "a", "b"))
    _check_confidence(confidence)
    n, tail = len(differences), (1 - confidence) / 2
    k, below = 0, 0.0
    while k < n and below + math.comb(n, k) / 2 ** n <= tail:
        below += math.comb(n, k) / 2 ** n
        k += 1
    if k == 0:
        raise ValueError(f"a, b: a {confidence:.0%} sign-test interval needs more pairs, got {n}")
    median = differences[n // 2] if n % 2 else (differences[n // 2 - 1] + differences[n // 2]) / 2
    return Verdict(median, differences[k - 1], differences[n - k], confidence,
                   f"sign-test interval of the median over {n} pairs (order statistics {k} and {n + 1 - k})", n)


# --------------------------------------------------------------------------- over problems

def paired_problems(a: Sequence[int], b: Sequence[int], confidence: float = 0.95, resamples: int = 10_000,
                    seed: int = 0) -> Verdict:
    """a[j], b[j]: 1 if problem j was solved (greedy, say) by each run, problem j paired. The
    difference in accuracy and its paired percentile bootstrap interval: `resamples` draws of
    the problems with replacement, each problem carrying both outcomes."""
    outcomes = _outcomes(a, b)
    _check_confidence(confidence)
    if not (isinstance(resamples, int) and resamples >= 100):
        raise ValueError(f"resamples: expected an int >= 100, got {resamples!r}")
    n = len(outcomes)
    differences = np.array([x - y for x, y in outcomes], dtype=np.float64)
    draws = np.random.default_rng(seed).integers(0, n, size=(resamples, n))   # problems, with replacement
    means = differences[draws].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = (float(v) for v in np.quantile(means, [tail, 1 - tail]))   # linear between neighbours
    return Verdict(float(differences.mean()), low, high, confidence,
                   f"paired bootstrap over {n} problems ({resamples} resamples, percentile)", n)


def mcnemar(a: Sequence[int], b: Sequence[int]) -> dict[str, float]:
    """McNemar's exact test of paired right/wrong outcomes: only the discordant problems count,
    a_only (A right, B wrong) and b_only. Under "A and B are equally good" a_only is
    Binomial(a_only + b_only, 1/2); the two-sided p-value doubles the smaller tail (at most 1)."""
    outcomes = _outcomes(a, b)
    a_only = sum(1 for x, y in outcomes if x and not y)
    b_only = sum(1 for x, y in outcomes if y and not x)
    discordant = a_only + b_only
    tail = sum(math.comb(discordant, k) for k in range(min(a_only, b_only) + 1)) / 2 ** discordant
    return {"a_only": float(a_only), "b_only": float(b_only), "p_value": min(1.0, 2 * tail)}


# --------------------------------------------------------------------------- a results file

def compare_variants(runs: Sequence[dict], pairs: Sequence[tuple[str, str]], key: str = "variant",
                     value="final_accuracy", outcomes: str = "greedy_correct") -> dict[str, dict]:
    """The verdicts a benchmark stores beside its runs (each a dict with `key`, "seed", `value`
    and, where kept, `outcomes`: 0/1 per held-out problem, in the file's problem order).

    For each pair (a, b), under "a - b": the seeds both have, the paired-over-seeds verdict on
    `value` (difference, low, high, method, and the words the book may use), and, where both
    runs of a seed kept their outcomes, that seed's comparison over the same problems: McNemar's
    exact test (a_only, b_only, p_value) and the paired bootstrap interval of the difference in
    accuracy."""
    out = {}
    for a, b in pairs:
        runs_of = {name: {run["seed"]: run for run in runs if run.get(key) == name} for name in (a, b)}
        for name, found in runs_of.items():
            if not found:
                raise ValueError(f"pairs: no run has {key} = {name!r}")
        seeds = sorted(set(runs_of[a]) & set(runs_of[b]))
        verdict = paired_seeds([_value(runs_of[a][s], value) for s in seeds],
                               [_value(runs_of[b][s], value) for s in seeds])
        entry = {"seeds": seeds, "difference": verdict.difference, "low": verdict.low, "high": verdict.high,
                 "method": verdict.method, "words": verdict.words(a, b)}
        per_seed = {}
        for s in seeds:
            x, y = runs_of[a][s].get(outcomes), runs_of[b][s].get(outcomes)
            if x is not None and y is not None:
                problems = paired_problems(x, y)
                per_seed[str(s)] = {**mcnemar(x, y), "difference": problems.difference, "low": problems.low,
                                    "high": problems.high, "method": f"McNemar's exact test; {problems.method}"}
        if per_seed:
            entry["per_seed"] = per_seed
        out[f"{a} - {b}"] = entry
    return out


def _value(run: dict, value) -> float:
    return value(run) if callable(value) else run[value]


# --------------------------------------------------------------------------- Student's t

def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom: bisection on its CDF."""
    if not 0 < p < 1:
        raise ValueError(f"p: expected a probability in (0, 1), got {p!r}")
    if not (isinstance(df, int) and df >= 1):
        raise ValueError(f"df: expected an int >= 1, got {df!r}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2
    for _ in range(200):   # to the last bit of a double
        middle = (low + high) / 2
        if middle in (low, high):
            break
        low, high = (middle, high) if t_cdf(middle, df) < p else (low, middle)
    return (low + high) / 2


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t: the tail beyond |t| is I_x(df / 2, 1 / 2) / 2 at
    x = df / (df + t^2) (1 - x passed as t^2 / (df + t^2), exact where x is near 1)."""
    tail = 0.5 * _regularized_beta(df / (df + t * t), t * t / (df + t * t), df / 2, 0.5)
    return 1 - tail if t >= 0 else tail


def _regularized_beta(x: float, y: float, a: float, b: float) -> float:
    """I_x(a, b), y = 1 - x, by its continued fraction (modified Lentz; Press et al., Numerical
    Recipes, section 6.4)."""
    if x <= 0:
        return 0.0
    if y <= 0:
        return 1.0
    if x > (a + 1) / (a + b + 2):   # the fraction converges fast below this point: use the symmetry
        return 1 - _regularized_beta(y, x, b, a)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y)) / a
    tiny = 1e-300
    f, c, d = 1.0, 1.0, 0.0
    for i in range(10_000):
        m = i // 2
        if i == 0:
            numerator = 1.0
        elif i % 2 == 0:
            numerator = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            numerator = -((a + m) * (a + b + m) * x) / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1 + numerator * d
        d = 1 / (d if abs(d) > tiny else tiny)
        c = 1 + numerator / c
        c = c if abs(c) > tiny else tiny
        f *= c * d
        if abs(1 - c * d) < 1e-15:
            return front * (f - 1)
    raise ArithmeticError(f"the incomplete beta's continued fraction did not converge at x={x}, a={a}, b={b}")


# --------------------------------------------------------------------------- checks

def _paired(a: Sequence[float], b: Sequence[float], name_a: str, name_b: str) -> list[float]:
    a, b = list(a), list(b)
    if len(a) != len(b):
        raise ValueError(f"{name_a}, {name_b}: expected one value per pair in each, got {len(a)} and {len(b)}")
    for name, values in ((name_a, a), (name_b, b)):
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)]
        if bad:
            raise ValueError(f"{name}: expected finite numbers, got {bad[0]!r}")
    return [x - y for x, y in zip(a, b)]


def _outcomes(a: Sequence[int], b: Sequence[int]) -> list[tuple[int, int]]:
    a, b = list(a), list(b)
    if len(a) != len(b) or not a:
        raise ValueError(f"a, b: expected one outcome per problem in each (the same problems), got {len(a)} "
                         f"and {len(b)}")
    for name, values in (("a", a), ("b", b)):
        bad = [v for v in values if v not in (0, 1)]
        if bad:
            raise ValueError(f"{name}: expected outcomes 0 (wrong) or 1 (right), got {bad[0]!r}")
    return [(int(x), int(y)) for x, y in zip(a, b)]


def _check_confidence(confidence: float) -> None:
    if not (isinstance(confidence, float) and 0 < confidence < 1):
        raise ValueError(f"confidence: expected a float in (0, 1), got {confidence!r}")
