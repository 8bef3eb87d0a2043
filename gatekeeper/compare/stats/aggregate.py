"""Aggregates exactly as lm-eval 0.4.13 computes them, and their sufficient statistics.

Thin entry points over the registry of metric kinds (``gatekeeper.results.metrics``), which holds
each kind's exact aggregate, per-item sufficient statistics and vectorized score. Every
aggregate with sufficient statistics is a function of *sums* of per-item statistics, so a
resample (bootstrap or permutation) only re-sums those columns and applies the score
function; it never averages per-item scores.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gatekeeper.results.metrics import kind_named

ScoreFn = Callable[[np.ndarray], np.ndarray]


def check_values(kind: str, aggregation: str, values: np.ndarray, name: str = "values") -> np.ndarray:
    """Validate one run's per-item values; returns them as an array of the right dtype."""
    return kind_named(kind).check(aggregation, values, name)


def aggregate(kind: str, aggregation: str, values: np.ndarray) -> float:
    """The task score lm-eval 0.4.13 reports for these per-item values, computed the same way
    (e.g. Python's left-to-right float sum for ``mean``), so it matches results.json exactly."""
    return kind_named(kind).aggregate(aggregation, values)


def unit_stats(kind: str, aggregation: str, values: np.ndarray) -> np.ndarray:
    """Per-item sufficient statistics, float64 (n, k); summing rows and applying
    ``score_fn`` gives the aggregate."""
    stats = kind_named(kind).unit_stats(aggregation, values, values)
    if stats is None:
        raise ValueError(f"kind {kind!r} has no per-item sufficient statistics")
    return stats[0]


def score_fn(kind: str, aggregation: str) -> ScoreFn:
    """Vectorized aggregate of summed statistics: (R, k) -> (R,)."""
    return kind_named(kind).score_fn(aggregation)
