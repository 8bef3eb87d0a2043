"""The weighted flips' test (issue #57): right/wrong items read by an informative design, each
standing for 1/pi items of the task (``results/informative.py``).

The change's estimate is Horvitz-Thompson's: the sum of each read item's change (-1, 0 or +1)
times its weight, over the task's items; unbiased whatever the pattern of flips. The p-value is
McNemar's, weighted: given which of the read items flipped, "no change" makes each flip's
direction a fair coin (what McNemar's exact test assumes of every flip), so the weighted sum of
the directions has a known distribution, computed exactly by convolving one binomial per weight
(the design's weights are integers relative to each other). That holds for any set of items that
flip, however the design weighted them: a propensity that guessed wrong costs power, never the
false-alarm rate. With every weight 1 it is McNemar's exact (or mid-p) test.

The interval is Wald's on the estimate, its variance the weighted squares of the read items'
changes (with every weight 1, the paired mean's: var(d) / n).

Reading until informed (``until_informed``): the design's stages are read one after another
(scale 1, 2, 4, ...: each reads the last one's items and more) and the test is made once, at the
first stage whose read flips hold most of the information reading every item would give. The
choice looks only at *which* items flipped, never which way: given the flips, every direction is
still a fair coin under "no change", so the test at the chosen stage keeps its exact level
whatever the flips, with no share of alpha spent on the stages passed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np

from gatekeeper.compare.stats.result import PairedTest
from gatekeeper.results.informative import SCALES, Design


@dataclass(frozen=True)
class WeightedFlips:
    delta: float  # the whole task's change (candidate - baseline), estimated
    p_worse: float
    p_better: float
    ci_low: float
    ci_high: float
    se: float
    read: int  # items read
    flips: int  # of them, items that flipped
    n: int  # items the estimate stands for
    # (p-values, sizes) given the read flips, as mcnemar.rejection_table: by the wrong-way sum
    # lowest first, the test's p-value there and P(S >= it) under "no change"; last, never (0, 0)
    table: tuple[np.ndarray, np.ndarray] = (np.array([1.0, 0.0]), np.array([1.0, 0.0]))


def relative_weights(weights: np.ndarray) -> np.ndarray:
    """Weights over the smallest, as integers; ValueError when they are not integer multiples."""
    weights = np.asarray(weights, dtype=float)
    if weights.size == 0:
        return weights.astype(np.int64)
    if np.any(~np.isfinite(weights)) or np.any(weights <= 0):
        raise ValueError("weights must be positive and finite")
    ratio = weights / weights.min()
    whole = np.round(ratio)
    if not np.allclose(ratio, whole, rtol=0, atol=1e-9):
        raise ValueError("weights must be integer multiples of the smallest (a design of shares 1/2^k)")
    return whole.astype(np.int64)


def null_distribution(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(support, pmf) of the sum of weights[i] * e_i, e_i = +1 or -1 with probability 1/2 each,
    for integer weights: one binomial per distinct weight, convolved (directly while small, else by
    FFT: 0.1 s for 700 flips of an MMLU-sized task instead of 0.8; tails within 2e-10 relative at
    1e-6, the smallest level a policy allows). It depends only on how many flips carry each
    weight, so it is kept for the next row or stage with the same counts (read-only arrays)."""
    values, counts = np.unique(np.asarray(weights, dtype=np.int64), return_counts=True)
    return _null(tuple(zip(values.tolist(), counts.tolist(), strict=True)))


@lru_cache(maxsize=1024)
def _null(parts: tuple[tuple[int, int], ...]) -> tuple[np.ndarray, np.ndarray]:
    from scipy.signal import fftconvolve
    from scipy.stats import binom

    total = sum(w * m for w, m in parts)
    pmf = np.array([1.0])
    for w, m in parts:
        # sum of m directions at weight w: w * (2B - m), B ~ Binomial(m, 1/2); on a grid of step 1
        part = np.zeros(2 * w * m + 1)
        part[:: 2 * w] = binom.pmf(np.arange(m + 1), m, 0.5)
        pmf = np.convolve(pmf, part) if pmf.size * part.size <= 100_000 else np.clip(fftconvolve(pmf, part), 0, None)
    support = np.arange(-total, total + 1)
    pmf = pmf / pmf.sum()
    support.flags.writeable = pmf.flags.writeable = False
    return support, pmf


def _tail(support: np.ndarray, pmf: np.ndarray, observed: int, exact: bool) -> float:
    """P(S >= observed) (exact) or P(S > observed) + P(S = observed) / 2 (mid-p)."""
    at = observed + (support.size - 1) // 2
    if at < 0:
        return 1.0
    if at >= support.size:
        return 0.0
    upper = float(pmf[at:].sum())
    return min(1.0, max(0.0, upper if exact else upper - 0.5 * float(pmf[at])))


def rejection_table(support_pmf: tuple[np.ndarray, np.ndarray], exact: bool) -> tuple[np.ndarray, np.ndarray]:
    """(p-values, sizes) of the one-sided weighted test given its read flips (``null_distribution``'s
    support and pmf): at each reachable wrong-way sum s, lowest first, the p-value (P(S >= s), or
    mid-p) and the size when it rejects from s on, P(S >= s); last, never rejecting (0, 0). What
    ``compare._discreteness_scale`` adds up, as for McNemar's rows."""
    pmf = support_pmf[1][support_pmf[1] > 0]
    tail = np.minimum(1.0, np.cumsum(pmf[::-1])[::-1])
    p = tail if exact else np.clip(tail - 0.5 * pmf, 0.0, 1.0)
    return np.append(p, 0.0), np.append(tail, 0.0)


def weighted_flip_test(baseline: np.ndarray, candidate: np.ndarray, weights: np.ndarray, n: int,
                       higher_is_better: bool, confidence: float, exact: bool = True) -> WeightedFlips:
    """The weighted McNemar test of 0/1 items read by a design. ``weights``: what each read item
    stands for (1 / its inclusion probability; the same design for both runs); ``n``: the task's
    items (the estimate is of their mean change). ``exact``: P(S >= s), else mid-p."""
    base, cand = np.asarray(baseline, dtype=float), np.asarray(candidate, dtype=float)
    weights = np.asarray(weights, dtype=float)
    if not base.shape == cand.shape == weights.shape:
        raise ValueError(f"baseline {base.shape}, candidate {cand.shape} and weights {weights.shape} differ")
    d = cand - base
    flipped = d != 0
    total = float(np.sum(weights * d))
    delta = total / n
    if not flipped.any():
        return WeightedFlips(0.0, 1.0, 1.0, 0.0, 0.0, 0.0, int(base.size), 0, n)
    whole = relative_weights(weights[flipped])
    worse_sign = -1 if higher_is_better else 1
    observed = int(np.sum(whole * np.sign(d[flipped]))) * worse_sign
    support, pmf = null_distribution(whole)
    p_worse = _tail(support, pmf, observed, exact)
    p_better = _tail(support, pmf, -observed, exact)
    variance = max(0.0, float(np.sum((weights * d) ** 2)) - total * total / n)
    se = math.sqrt(variance) / n
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    return WeightedFlips(delta, p_worse, p_better, delta - z * se, delta + z * se, se, int(base.size),
                         int(flipped.sum()), n, rejection_table((support, pmf), exact))


WEIGHTED_TEST = "weighted-mcnemar-exact"
WEIGHTED_MIDP = "weighted-mcnemar-midp"
WEIGHTED_TESTS = (WEIGHTED_TEST, WEIGHTED_MIDP)


def weighted_paired_test(baseline: np.ndarray, candidate: np.ndarray, weights: np.ndarray, total: int,
                         higher_is_better: bool, confidence: float, exact: bool = False) -> PairedTest:
    """The weighted flips' test of right/wrong items an informative design read, as the gate's
    ``PairedTest`` of the whole task: ``n`` is ``total`` (the items the read ones stand for), the
    scores are Horvitz-Thompson's estimates of the whole task's, the interval Wald's on them
    (``PairedTest.interval_at`` gives it at any level). ``exact``: P(S >= s), whose size is at most
    the level for any flips; else mid-p, as the fixed gate's McNemar test by default
    (``policy.exact_mcnemar``): with every weight 1 it is that test, and its size stays as near
    the level as that test's (benchmarks/informative_items.py --until-informed, 2,000 harmless
    pairs along the measured curve: p < 0.05 in 5.2% of them, reading every item 4.8%; where the
    flips are not where the baseline said, it reads every item and is that test)."""
    base = np.asarray(baseline, dtype=float)
    weights = np.asarray(weights, dtype=float)
    w = weighted_flip_test(base, candidate, weights, total, higher_is_better, confidence, exact=exact)
    flipped = np.asarray(candidate, dtype=float) != base
    base_score = float(np.sum(weights * base)) / total
    return PairedTest(test=WEIGHTED_TEST if exact else WEIGHTED_MIDP, n=int(total), n_clusters=None,
                      baseline=base_score, candidate=base_score + w.delta, delta=w.delta, ci_low=w.ci_low,
                      ci_high=w.ci_high, confidence=confidence, p_worse=w.p_worse, p_better=w.p_better, se=w.se,
                      n_resamples=0,
                      # under "no change" each flip's direction is a coin: the weighted sum's spread
                      se_null=math.sqrt(float(np.sum(np.square(weights[flipped])))) / total,
                      identical=w.flips == 0, flip_share=float(np.sum(weights[flipped])) / total,
                      flips_read=w.flips, null_table=w.table)


INFORMED = 0.95  # the share of the whole read's information a stage must hold to be decided at
MIN_FLIPS = 20  # fewer read flips estimate that share too loosely: read on
# Except none at all once every item was read with at least this chance (the fourth stage, 75%): F
# flips anywhere all go unread with a chance of at most (1 - NO_FLIP_READ) ** F (0.1% at 10
# flips), and along the measured curve far less. A small task a harmless change leaves as it was
# need not be read whole.
NO_FLIP_READ = 0.5


def informed_share(weights: np.ndarray) -> float:
    """The share of the information of reading every item that flipped items read with these
    ``weights`` hold, estimated from where they are alone: sum(w) / sum(w^2), the variance of the
    count of every flip over that of its weighted estimate (1 when every weight is 1)."""
    weights = np.asarray(weights, dtype=float)
    return float(weights.sum() / np.square(weights).sum()) if weights.size else 0.0


def until_informed(flipped: np.ndarray, design: Design, scales: tuple[float, ...] = SCALES,
                   informed: float = INFORMED, min_flips: int = MIN_FLIPS) -> int:
    """The index of the first scale whose read flips (``design.read(scale)``) number at least
    ``min_flips`` and hold ``informed`` of the information, or number none at a scale that reads
    every item with a chance of at least ``NO_FLIP_READ``; the last scale otherwise (which should
    read every item). ``flipped``: which items' values differ between the runs (only those read
    at a stage may be looked at: a stage's choice never depends on an unread item, nor on any
    direction). The curve only moves power: the test at the chosen stage is exact whatever it
    chose."""
    flipped = np.asarray(flipped, dtype=bool)
    for i, scale in enumerate(scales[:-1]):
        read = np.flatnonzero(design.read(scale) & flipped)
        if read.size == 0 and design.pi.size and min(1.0, scale * float(design.pi.min())) >= NO_FLIP_READ:
            return i
        if read.size >= min_flips and informed_share(design.weights(read, scale)) >= informed:
            return i
    return len(scales) - 1
