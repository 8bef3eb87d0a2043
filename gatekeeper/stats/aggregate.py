"""Aggregates exactly as lm-eval 0.4.13 computes them, and their sufficient statistics.

Every aggregate the gate tests is a function of *sums* of per-item statistics:
  mean:   (sum value, number of items)
  ratio:  (sum loglikelihood, sum count)  (perplexity: count = 1 per item)
  corpus: sacrebleu's per-sentence statistics (n-gram counts, lengths, edits)
so a resample (bootstrap or permutation) only has to re-sum those columns and apply a
vectorized score function; it never averages per-item scores.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from . import corpus as _corpus

RATIO_AGGREGATIONS = ("weighted_perplexity", "bits_per_byte", "perplexity")
ScoreFn = Callable[[np.ndarray], np.ndarray]


def check_values(kind: str, aggregation: str, values: np.ndarray, name: str = "values") -> np.ndarray:
    """Validate one run's per-item values; returns them as an array of the right dtype."""
    if kind == "mean":
        if aggregation != "mean":
            raise ValueError(f"kind 'mean' needs aggregation 'mean', got {aggregation!r}")
        arr = np.asarray(values, dtype=np.float64)
        if arr.ndim != 1:
            raise ValueError(f"{name}: kind 'mean' needs shape (n,), got {arr.shape}")
    elif kind == "ratio":
        if aggregation not in RATIO_AGGREGATIONS:
            raise ValueError(f"kind 'ratio' needs aggregation in {RATIO_AGGREGATIONS}, got {aggregation!r}")
        arr = np.asarray(values, dtype=np.float64)
        if arr.ndim != 2 or arr.shape[1] != 2:
            raise ValueError(f"{name}: kind 'ratio' needs shape (n, 2) [loglikelihood, count], got {arr.shape}")
    elif kind == "corpus":
        if aggregation not in _corpus.CORPUS_AGGREGATIONS:
            raise ValueError(
                f"kind 'corpus' needs aggregation in {_corpus.CORPUS_AGGREGATIONS}, got {aggregation!r}"
            )
        arr = np.asarray(values, dtype=object)
        if arr.ndim != 2 or arr.shape[1] != 2:
            raise ValueError(f"{name}: kind 'corpus' needs shape (n, 2) [reference, prediction], got {arr.shape}")
        if any(v is None for v in arr[:, 1]):
            raise ValueError(f"{name}: a prediction is missing (None)")
        return arr
    else:
        raise ValueError(f"unknown kind {kind!r}; expected mean, ratio or corpus")
    if arr.shape[0] == 0:
        raise ValueError(f"{name}: no items")
    if np.isnan(arr).any():
        raise ValueError(f"{name}: contains NaN")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name}: contains an infinite value")
    return arr


def aggregate(kind: str, aggregation: str, values: np.ndarray) -> float:
    """The task score lm-eval 0.4.13 reports for these per-item values, computed the same way.

    Uses Python's left-to-right float sum like ``lm_eval.api.metrics`` (``mean``,
    ``weighted_mean``), so the result matches results.json to the last bit.
    """
    arr = check_values(kind, aggregation, values)
    if arr.shape[0] == 0:
        raise ValueError("values: no items")
    if kind == "mean":
        return sum(arr.tolist()) / arr.shape[0]
    if kind == "corpus":
        return _corpus.corpus_score(aggregation, arr)
    ll, count = arr[:, 0].tolist(), arr[:, 1].tolist()
    if aggregation == "perplexity":
        return math.exp(-(sum(ll) / len(ll)))
    total = sum(count)
    if total <= 0:
        raise ValueError("values: the counts sum to zero")
    weighted_mean = sum(ll) / total
    if aggregation == "weighted_perplexity":
        return math.exp(-weighted_mean)
    return -weighted_mean / math.log(2)  # bits_per_byte


def unit_stats(kind: str, aggregation: str, values: np.ndarray) -> np.ndarray:
    """Per-item sufficient statistics, float64 (n, k); summing rows and applying
    ``score_fn`` gives the aggregate."""
    if kind == "mean":
        return np.column_stack([values, np.ones(values.shape[0])])
    if kind == "ratio":
        if aggregation == "perplexity":  # lm-eval's perplexity ignores the count column
            return np.column_stack([values[:, 0], np.ones(values.shape[0])])
        return np.ascontiguousarray(values, dtype=np.float64)
    return _corpus.sentence_stats(aggregation, values)


def score_fn(kind: str, aggregation: str) -> ScoreFn:
    """Vectorized aggregate of summed statistics: (R, k) -> (R,)."""
    if kind == "corpus":
        return _corpus.SCORE_FNS[aggregation]
    if kind == "mean":
        return _mean_score
    if aggregation == "bits_per_byte":
        return _bits_per_byte_score
    return _perplexity_score  # weighted_perplexity and perplexity (count column = 1)


def _mean_score(s: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return s[:, 0] / s[:, 1]


def _perplexity_score(s: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.exp(-(s[:, 0] / s[:, 1]))


def _bits_per_byte_score(s: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return -(s[:, 0] / s[:, 1]) / math.log(2)
