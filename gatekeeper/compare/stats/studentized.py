"""The test for a mean of per-item differences: a studentized bootstrap made size-exact at the
small levels a multiplicity design uses.

A plain bootstrap-t is second-order accurate, but its error grows into the tail: on a skewed,
harmless change of 500 items it rejected at 0.0068 where the level was 0.005, and a suite of ten
such metrics failed 5.9% of the time at alpha 0.05 (4.9% with both corrections below, which
address the skewness that a sample of a long tail under-represents; benchmarks/small_levels.py):

- Hall's transformation (Hall 1992): the statistic T = (mean - mu) / se becomes
  g(T) = T + a T^2 + a^2 T^3 / 3 + b, with a = skew / (3 sqrt(n)) and b = skew / (6 sqrt(n)),
  which removes the skewness term of T's distribution; g is increasing ((1 + aT)^2 >= 0), so
  it inverts in closed form. Each resample uses its own skewness.
- A fast double bootstrap (Davidson & MacKinnon 2007): each resample is resampled once more,
  and the second-level statistics show how the first level's p-values miss, which calibrates
  them: p = F1(F2^-1(p1)). F1, F2 are the two levels' distribution functions.

The calibration is one increasing map of the first-level statistics, so the result stays a set
of draws of the change: every margin, level and interval reads off them as before.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from gatekeeper.compare.stats.resampling import (
    BootstrapResult,
    chunk_sizes,
    count_chunks,
    few_distinct_rows,
    matmul,
    percentile_interval,
)

KEEP_COUNTS_BYTES = 16 << 20  # two levels of draw counts kept for the next call up to this size
A_TINY = 1e-9  # below this |a|, g(T) is T + b to within float precision


def bootstrap_t(diff: np.ndarray, confidence: float, n_resamples: int,
                seed_seq: np.random.SeedSequence) -> BootstrapResult:
    """Studentized bootstrap of the mean of paired differences ``diff`` (m,), Hall-transformed
    and calibrated by a fast double bootstrap. ``draws`` are mean - g_obs^-1(V*) se, V* the
    calibrated statistics: a margin delta is rejected at level a exactly when the fraction of
    draws at or beyond delta is below a."""
    return bootstrap_t_many([diff], confidence, n_resamples, seed_seq)[0]


@dataclass
class _Job:
    """One distinct difference to resample: its mean and spread, its columns (c, c^2, c^3), and
    the positions in ``bootstrap_t_many``'s input that share it."""

    mean: float
    se: float
    x: np.ndarray
    indices: list[int]


def bootstrap_t_many(diffs: list[np.ndarray], confidence: float, n_resamples: int,
                     seed_seq: np.random.SeedSequence) -> list[BootstrapResult]:
    """``bootstrap_t`` of several differences with as many items, resampled alike: their columns
    are summed in one pass over each chunk of draw counts (a suite's ratio tasks at 1M items:
    one draw instead of one per task), and equal differences (a task's three ratios) once. Each
    comes out as ``bootstrap_t`` gives it alone (the same counts; sums to float rounding)."""
    out: list[BootstrapResult | None] = [None] * len(diffs)
    jobs: dict[bytes, _Job] = {}  # by the difference's digest
    for i, diff in enumerate(diffs):
        d = np.ascontiguousarray(diff, dtype=np.float64)
        m = d.shape[0]
        mean = float(d.mean())
        c = d - mean  # centred: the sums of powers then carry no cancellation
        if m < 2 or not c.any():  # every item changed by the same amount: no spread to resample
            out[i] = percentile_interval(np.full(n_resamples, mean), confidence)
            continue
        key = hashlib.blake2b(d.tobytes(), digest_size=16).digest()
        if key not in jobs:
            se = float(np.sqrt(float(c @ c) / (m - 1) / m))
            jobs[key] = _Job(mean, se, np.column_stack([c, c * c, c * c * c]), [])
        jobs[key].indices.append(i)
    if not jobs:
        return out  # type: ignore[return-value]
    m = diffs[0].shape[0]
    few = {key: few_distinct_rows(job.x, m // 8) if m > 64 else None for key, job in jobs.items()}
    alike = [key for key, f in few.items() if f is None]
    levels: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}
    if alike:  # one pass over the draw counts for every job that has many distinct rows
        outer, inner = _two_levels(np.hstack([jobs[key].x for key in alike]), m, n_resamples, seed_seq)
        for k, key in enumerate(alike):
            levels[key] = (outer[:, 3 * k : 3 * k + 3], inner[:, 3 * k : 3 * k + 3])
    for key, f in few.items():
        if f is not None:
            levels[key] = _few_levels(f, m, n_resamples, seed_seq)
    for key, job in jobs.items():
        result = _calibrated(job, *levels[key], m, n_resamples, confidence)
        for i in job.indices:
            out[i] = result
    return out  # type: ignore[return-value]


def _calibrated(job: _Job, outer: np.ndarray, inner: np.ndarray, m: int, n_resamples: int,
                confidence: float) -> BootstrapResult:
    """The calibrated draws of the change, from the two levels' sums of (c, c^2, c^3)."""
    floor = 1e-12 + 1e-9 * job.se  # a resample of one repeated value has no spread: t* is large, not inf
    first = _hall(outer, m, np.zeros(n_resamples), floor)
    second = _hall(inner, m, outer[:, 0] / m, floor)
    calibrated = np.sort(first)[_rank_of(np.sort(second), first)]
    a_obs, b_obs = _coefficients(_skew(float(job.x[:, 1].sum()) / m, float(job.x[:, 2].sum()) / m), m)
    return percentile_interval(job.mean - _g_inverse(calibrated, a_obs, b_obs) * job.se, confidence, "no spread")


def _rank_of(sorted_second: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Index into the sorted first level at F2(first): the calibrated quantile of each draw."""
    share = np.searchsorted(sorted_second, first, side="right") / sorted_second.size
    return np.clip(np.ceil(share * first.size).astype(np.int64) - 1, 0, first.size - 1)


def _skew(m2: float | np.ndarray, m3: float | np.ndarray) -> np.ndarray:
    m2 = np.asarray(m2, dtype=np.float64)
    return np.where(m2 > 0, m3 / np.maximum(m2, 1e-300) ** 1.5, 0.0)


def _coefficients(skew: float | np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(skew) / (3 * np.sqrt(m)), np.asarray(skew) / (6 * np.sqrt(m))


def _hall(sums: np.ndarray, m: int, centre: np.ndarray, floor: float) -> np.ndarray:
    """g(T) of each resample from its sums of (c, c^2, c^3), T about ``centre`` (the mean of the
    sample it was drawn from)."""
    mu = sums[:, 0] / m
    m2 = np.maximum(sums[:, 1] / m - mu**2, 0.0)
    m3 = sums[:, 2] / m - 3 * mu * sums[:, 1] / m + 2 * mu**3
    se = np.sqrt(m2 / (m - 1))  # the resample's s / sqrt(m), s with m - 1
    t = (mu - centre) / np.maximum(se, floor)
    a, b = _coefficients(_skew(m2, m3), m)
    return t + a * t * t + a * a * t**3 / 3 + b


def _g_inverse(y: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """T with g(T) = y: g(T) = ((1 + aT)^3 - 1) / (3a) + b."""
    a = float(a)
    if abs(a) < A_TINY:
        return y - b
    return (np.cbrt(1 + 3 * a * (y - b)) - 1) / a


def _two_levels(x: np.ndarray, m: int, n_resamples: int,
                seed_seq: np.random.SeedSequence) -> tuple[np.ndarray, np.ndarray]:
    """Column sums of x over ``n_resamples`` bootstrap resamples of its rows, and over one
    resample drawn from each of those (the second level): one matrix product per chunk of draw
    counts. Kept for the next call only when small (16 MB): a suite's tests that would reuse
    them are drawn in this one pass (``bootstrap_t_many``), and keeping 33 MB of two levels
    (1,667 items) cost 14 MiB of peak at 100k items; repeated small calls (a simulation, each
    look of a sequential gate) still reuse them."""
    outer: list[np.ndarray] = []
    inner: list[np.ndarray] = []
    keep = m * n_resamples * 2 <= KEEP_COUNTS_BYTES
    for pair in count_chunks(m, n_resamples, seed_seq, levels=2, keep=keep):
        outer.append(matmul(pair[0].astype(np.float64), x))
        inner.append(matmul(pair[1].astype(np.float64), x))
    return np.concatenate(outer), np.concatenate(inner)


def _few_levels(few: tuple[np.ndarray, np.ndarray], m: int, n_resamples: int,
                seed_seq: np.random.SeedSequence) -> tuple[np.ndarray, np.ndarray]:
    """``_two_levels`` of rows that take few distinct values: a resample is how often each is
    drawn, Multinomial(m, shares), and the second level is Multinomial(m, the first level's
    counts / m): exact, and cheap."""
    uniq, counts = few
    outer: list[np.ndarray] = []
    inner: list[np.ndarray] = []
    sizes = chunk_sizes(n_resamples, uniq.shape[0])
    for size, seed in zip(sizes, seed_seq.spawn(len(sizes)), strict=True):
        rng = np.random.default_rng(seed)
        w = rng.multinomial(m, counts / m, size=size)
        outer.append(matmul(w.astype(np.float64), uniq))
        inner.append(matmul(rng.multinomial(m, w / m).astype(np.float64), uniq))
    return np.concatenate(outer), np.concatenate(inner)
