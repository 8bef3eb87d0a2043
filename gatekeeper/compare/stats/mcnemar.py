"""McNemar mid-p test (or the exact conditional test) and Newcombe's interval for paired right/wrong (0/1) items."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from gatekeeper.compare.stats.multiplicity import mde_for_rule


@dataclass(frozen=True)
class McNemar:
    b: int  # baseline right, candidate wrong
    c: int  # baseline wrong, candidate right
    n: int
    p_worse: float
    p_better: float
    ci_low: float
    ci_high: float
    se: float


def midp_one_sided(k: int, n_discordant: int) -> float:
    """Mid-p for H1 "more than half of the discordant pairs go this way", k going this way:
    P(X > k) + P(X = k) / 2 with X ~ Binomial(n_discordant, 1/2) (Fagerland, Lydersen & Laake
    2013: close to nominal size, unlike the conservative exact test). 1.0 when there are no
    discordant pairs: with no evidence at all we report the most conservative value."""
    if n_discordant == 0:
        return 1.0
    from scipy.special import bdtrc  # the ufunc: ~100x less overhead than scipy.stats.binom

    # mid-p = (P(X >= k) + P(X > k)) / 2; both upper tails, so small p-values keep their
    # relative precision (no 1 - cdf cancellation).
    p = 0.5 * (float(bdtrc(k - 1, n_discordant, 0.5)) + float(bdtrc(k, n_discordant, 0.5)))
    return min(1.0, max(0.0, p))


def exact_one_sided(k: int, n_discordant: int) -> float:
    """The exact conditional McNemar p-value P(X >= k), X ~ Binomial(n_discordant, 1/2): never
    above nominal size, unlike mid-p at small counts. A sequential gate's interim looks use it
    (their levels are tiny, where mid-p's excess is largest relative to the level)."""
    if n_discordant == 0:
        return 1.0
    from scipy.special import bdtrc

    return min(1.0, max(0.0, float(bdtrc(k - 1, n_discordant, 0.5))))


def _wilson(x: int, n: int, z: float) -> tuple[float, float]:
    p = x / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def corrected_phi(a: int, b: int, c: int, d: int) -> float:
    """Newcombe's continuity-corrected correlation of the two runs' right/wrong outcomes.

    A = ad - bc is replaced by A - N/2 when A > N/2, by 0 when 0 <= A <= N/2, and kept when
    A < 0 (Newcombe 1998, method 10; as in biostatUZH's ``confIntPairedProportion``). The plain
    phi overstates the correlation in small tables and makes the interval too narrow. 0 when a
    margin of the table is empty.
    """
    n = a + b + c + d
    denom = (a + b) * (c + d) * (a + c) * (b + d)
    if denom <= 0:
        return 0.0
    big_a = a * d - b * c
    if big_a > n / 2:
        big_a -= n / 2
    elif big_a >= 0:
        big_a = 0
    return big_a / math.sqrt(denom)


def newcombe_interval(a: int, b: int, c: int, d: int, confidence: float) -> tuple[float, float]:
    """Newcombe's hybrid score interval for a paired difference of proportions (Newcombe 1998,
    method 10, no continuity correction) for p_cand - p_base.

    a = both right, b = base right & cand wrong, c = base wrong & cand right, d = both wrong.
    Chosen over Wald because it stays inside [-1, 1] and keeps coverage near nominal for small
    counts, and over Tango's score interval because it is closed form.
    """
    n = a + b + c + d
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    p1, p2 = (a + c) / n, (a + b) / n  # candidate, baseline proportions right
    l1, u1 = _wilson(a + c, n, z)
    l2, u2 = _wilson(a + b, n, z)
    phi = corrected_phi(a, b, c, d)
    theta = p1 - p2
    lo_sq = (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2
    hi_sq = (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2
    return theta - math.sqrt(max(0.0, lo_sq)), theta + math.sqrt(max(0.0, hi_sq))


def mcnemar(baseline: np.ndarray, candidate: np.ndarray, higher_is_better: bool, confidence: float,
            exact: bool = False) -> McNemar:
    """Paired test for 0/1 values. With higher_is_better, b (right -> wrong) pairs are the
    worse direction; otherwise (a 0/1 error indicator) c pairs are. ``exact``: the exact
    conditional p-value instead of mid-p."""
    base = baseline.astype(bool)
    cand = candidate.astype(bool)
    n = int(base.shape[0])
    a = int(np.count_nonzero(base & cand))
    b = int(np.count_nonzero(base & ~cand))
    c = int(np.count_nonzero(~base & cand))
    d = n - a - b - c
    worse = b if higher_is_better else c
    better = b + c - worse
    one_sided = exact_one_sided if exact else midp_one_sided
    p_worse = one_sided(worse, b + c)
    p_better = one_sided(better, b + c)
    if b + c == 0:
        # No discordant pairs: identical outcomes, nothing to estimate (documented choice:
        # zero-width interval, se 0) rather than an interval driven by the sample size alone.
        return McNemar(b, c, n, 1.0, 1.0, 0.0, 0.0, 0.0)
    lo, hi = newcombe_interval(a, b, c, d, confidence)
    delta = (c - b) / n
    # se of the mean paired difference d_i in {-1, 0, 1}: sqrt(var(d) / n), var(d) =
    # (b + c) / n - delta^2.
    se = math.sqrt(max(0.0, (b + c) / n - delta * delta) / n)
    return McNemar(b, c, n, p_worse, p_better, lo, hi, se)


def _first_flagged(big_n: np.ndarray, n: int, margin: float, alpha: float) -> np.ndarray:
    """For each discordant count N, the fewest right-to-wrong flips b the rule flags: mid-p < alpha
    and (2b - N) / n > margin. Mid-p lies between P(X >= b + 1) and P(X >= b), so the first b
    with P(X > b) <= alpha is at most one away; ``bdtrik`` (the binomial quantile, continuous in
    k) puts it within one of its ceiling, so five candidates around it are checked."""
    from scipy.special import bdtrc, bdtrik  # scipy.special only: scipy.stats costs 0.4 s to import

    with np.errstate(all="ignore"):
        k = bdtrik(1 - alpha, big_n.astype(np.float64), 0.5)
    start = np.maximum(np.nan_to_num(np.ceil(k), nan=0.0) - 2, 0).astype(np.int64)
    first = np.full(big_n.shape, np.inf)
    for step in (4, 3, 2, 1, 0):  # from the largest candidate down: the last passing one is the smallest
        # bdtrc wants integer counts (floats are deprecated, and slow through the warning machinery)
        b = start + step
        midp = 0.5 * (bdtrc(b - 1, big_n, 0.5) + bdtrc(b, big_n, 0.5))
        first = np.where((midp < alpha) & (b <= big_n), b, first)
    by_margin = np.floor((margin * n + big_n) / 2 + 1e-9) + 1
    return np.maximum(first, by_margin)


def _binomial_pmf(k: np.ndarray, n: int, p: np.ndarray) -> np.ndarray:
    """Binomial(n, p) probabilities of the counts ``k`` (rows: one p each), from log-gamma."""
    from scipy.special import gammaln, xlog1py, xlogy

    log = (gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1))[None, :]
    return np.exp(log + xlogy(k[None, :], p[:, None]) + xlog1py(n - k[None, :], -p[:, None]))


def power(n: int, flip_rate: float, drop: float | np.ndarray, margin: float, alpha: float,
          _cache: np.ndarray | None = None) -> float | np.ndarray:
    """Exact probability that the gate's McNemar rule flags a true drop ``drop`` on n items
    (``drop`` may be an array: one probability each, in one pass).

    Items flip either way at ``flip_rate`` in total; a true drop adds ``drop`` right-to-wrong
    flips: N discordant ~ Binomial(n, flip_rate + drop), right-to-wrong among them ~
    Binomial(N, (flip_rate / 2 + drop) / (flip_rate + drop)). The rule flags when mid-p < alpha
    and the observed drop (b - c) / n exceeds the margin. Summed over the likely N, so the
    discreteness of small counts is in the answer (a normal approximation is off by ~0.05).
    """
    from scipy.special import bdtrc

    drops = np.atleast_1d(np.asarray(drop, dtype=np.float64))
    pi = np.minimum(1.0, flip_rate + drops)
    live = pi > 0
    q = np.where(live, np.minimum(1.0, (flip_rate / 2 + drops) / np.where(live, pi, 1.0)), 0.0)
    sd = np.sqrt(n * pi * (1 - pi))
    low = max(1, math.floor(float(np.min(n * pi - 8 * sd))) - 1)
    high = min(n, math.ceil(float(np.max(n * pi + 8 * sd))) + 1)
    out = np.zeros(drops.shape)
    big_n = np.arange(low, high + 1)
    if big_n.size and live.any():
        cache = _cache if _cache is not None else np.full(n + 1, np.nan)  # first flagged b, by N
        todo = big_n[np.isnan(cache[big_n])]
        if todo.size:
            cache[todo] = _first_flagged(todo, n, margin, alpha)
        first = cache[big_n]
        reach = np.isfinite(first) & (first <= big_n)
        tail = np.zeros((drops.size, big_n.size))  # P(B >= first flagged b | N), per drop
        tail[:, reach] = bdtrc(first[reach].astype(np.int64)[None, :] - 1, big_n[reach][None, :], q[:, None])
        pmf = _binomial_pmf(big_n.astype(np.float64), n, pi)
        out = np.where(live, np.minimum(1.0, np.einsum("kn,kn->k", pmf, tail)), 0.0)
    return out if np.ndim(drop) else float(out[0])


@functools.lru_cache(maxsize=32)
def _flagged_by_n(n: int, margin: float, alpha: float) -> np.ndarray:
    """The first flagged b by discordant count N for one rule, filled in as ``power`` needs them:
    kept across ``mde`` calls, since a suite's rows (MMLU's subjects, the looks of a sequential
    gate, a simulation's thousands of gates) ask for the same n, margin and level again and again.
    512 rules: MMLU's 57 subjects, its groups and their looks fit (with 32 they pushed each other
    out, every call a miss: 8 s of CPU in two of the tests' simulations); an entry is n + 1 floats."""
    return np.full(n + 1, np.nan)


@functools.lru_cache(maxsize=4096)
def mde(n: int, flip_rate: float, margin: float, alpha: float, target: float = 0.8) -> float:
    """Smallest true drop with ``power`` >= target, to a twentieth of an item (power rises with
    the drop, smoothly: it sums binomial probabilities continuous in it). Pure, so remembered:
    the same n, flips and level give the same figure (half the CPU of the tests' simulations).

    The bracket starts around the normal approximation, so only the binomial counts near the
    answer are ever evaluated (a bracket from 0 to 1 cost ~130 ms at n = 100,000); then the
    Illinois variant of regula falsi, which keeps the bracket and needs about half the power
    evaluations of bisection (5 to 6 instead of 11 on MMLU's subjects). A grid of 16 drops per
    vectorized ``power`` call measured slower than either (the union of their counts is wider
    than one drop's).
    """
    cache = _flagged_by_n(n, margin, alpha)
    top = 1.0 - flip_rate / 2

    def gap(d: float) -> float:
        return float(power(n, flip_rate, d, margin, alpha, cache)) - target

    guess = min(top, mde_for_rule(margin, alpha, lambda d: math.sqrt((flip_rate + d) / n),
                                  lambda d: math.sqrt(max(0.0, flip_rate + d - d * d) / n), target))
    # A bracket around the guess, 10% wide (the exact answer is usually within it), widened
    # geometrically where it is not.
    step = 0.1 * guess + 1.0 / n
    g = gap(guess)
    if g >= 0:
        hi, g_hi = guess, g
        lo = max(0.0, guess - step)
        g_lo = gap(lo)
        while g_lo >= 0:
            if lo == 0.0:
                return 0.0
            hi, g_hi, step = lo, g_lo, 2 * step
            lo = max(0.0, lo - step)
            g_lo = gap(lo)
    else:
        lo, g_lo = guess, g
        hi = min(top, guess + step)
        g_hi = gap(hi)
        while g_hi < 0:
            if hi >= top:
                return math.inf
            lo, g_lo, step = hi, g_hi, 2 * step
            hi = min(top, hi + step)
            g_hi = gap(hi)
    side = 0
    for _ in range(100):
        if hi - lo < 0.05 / n:
            break
        # The secant's root, kept a sliver inside the bracket so that it always shrinks.
        mid = min(max(lo + (hi - lo) * g_lo / (g_lo - g_hi), lo + 1e-3 * (hi - lo)), hi - 1e-3 * (hi - lo))
        g_mid = gap(mid)
        if g_mid >= 0:
            hi, g_hi = mid, g_mid
            g_lo = g_lo / 2 if side == 1 else g_lo  # Illinois: the end kept twice counts half
            side = 1
        else:
            lo, g_lo = mid, g_mid
            g_hi = g_hi / 2 if side == -1 else g_hi
            side = -1
    return hi


def rejection_table(n_discordant: int, exact: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(p-values, sizes) by the number of wrong-way flips k = 0..n+1 given ``n_discordant``
    flips: the one-sided test's p-value at k (mid-p, or the exact conditional one), falling with
    k, and its size when it rejects from k on, the exact tail P(X >= k), X ~ Binomial(n, 1/2)
    (k = n + 1: never rejects, size 0)."""
    from scipy.special import bdtrc

    k = np.arange(n_discordant + 2)
    tail = bdtrc(k - 1, n_discordant, 0.5)
    tail[-1] = 0.0
    p = tail.copy() if exact else 0.5 * (tail + bdtrc(k, n_discordant, 0.5))
    p[-1] = 0.0
    return p, tail


def size_at(table: tuple[np.ndarray, np.ndarray], level: float) -> float:
    """The size of the test of ``table`` (``rejection_table``) at ``level``: it rejects from the
    fewest wrong-way flips whose p-value is at most the level. Mid-p's is above the level at
    levels just past its values (up to twice), the exact test's never."""
    p, tail = table
    return float(tail[min(int(np.searchsorted(-p, -level, side="left")), p.size - 1)])
