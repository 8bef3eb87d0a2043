"""Paired tests for aggregates without per-item sufficient statistics (median, a task's own
``!function`` aggregation): resample *items* and call the aggregate on each resample.

``score(values, idx)`` gives the aggregate of each row of an (R, n) index matrix into
``values`` (the two runs' items stacked: baseline rows 0..n-1, candidate rows n..2n-1), so
a permutation (swap the two runs' items on a random subset) and a paired bootstrap (the same
items for both runs) are both index matrices. Same conventions as ``resampling``: one-sided
Monte Carlo p-values with the +1 correction (Phipson & Smyth 2010), percentile intervals,
chunks seeded from one ``SeedSequence``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gatekeeper.compare.stats.resampling import (
    BootstrapResult,
    PermutationResult,
    chunk_sizes,
    map_chunks,
    percentile_interval,
    spread,
    tail_counts,
    tolerance,
)

IndexScore = Callable[[np.ndarray, np.ndarray], np.ndarray]


def item_permutation(both: np.ndarray, n: int, score: IndexScore, higher_is_better: bool,
                     n_resamples: int, seed_seq: np.random.SeedSequence) -> PermutationResult:
    """Swap the baseline and candidate item of each doc with probability 1/2."""
    ids = np.arange(n)
    t_obs = float(score(both, (ids + n)[None, :])[0] - score(both, ids[None, :])[0])

    def draw(size: int, rng: np.random.Generator) -> np.ndarray:
        swap = rng.integers(0, 2, size=(size, n), dtype=np.int64) * n
        base_idx = ids[None, :] + swap
        cand_idx = ids[None, :] + (n - swap)
        return score(both, cand_idx) - score(both, base_idx)

    t_star = map_chunks(draw, chunk_sizes(n_resamples, n), seed_seq)
    level = abs(t_obs) if np.isfinite(t_obs) else 0.0
    worse, better = tail_counts(t_star, t_obs, tolerance(t_star, level), higher_is_better)
    b = t_star.size
    return PermutationResult((1 + worse) / (b + 1), (1 + better) / (b + 1), False, b, spread(t_star))


def item_bootstrap(both: np.ndarray, n: int, score: IndexScore, confidence: float, n_resamples: int,
                   seed_seq: np.random.SeedSequence) -> BootstrapResult:
    """Paired percentile bootstrap: the same resampled docs for both runs."""

    def draw(size: int, rng: np.random.Generator) -> np.ndarray:
        idx = rng.integers(0, n, size=(size, n), dtype=np.int64)
        return score(both, idx + n) - score(both, idx)

    return percentile_interval(map_chunks(draw, chunk_sizes(n_resamples, n), seed_seq), confidence)
