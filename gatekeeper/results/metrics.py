"""The registry of metric kinds: one object per way lm-eval aggregates per-item values.

A kind knows everything the gate does with one metric's per-item values, so adding an
aggregation touches this file only:

- reading: ``fast_values`` (a block of items from the samples reader, in bulk; raises
  ``Unusual`` on anything not plain) and ``item_value`` / ``line_value`` (one item, where the
  bulk refused; ``GateError`` naming the line), ``as_array`` (items -> the series' array);
- validating: ``check`` (shape, dtype, NaN; ``ValueError``) and ``out_of_range``;
- the baseline file: ``to_doc`` / ``from_doc`` / ``doc_problem`` and ``format_version`` (the
  baseline format version that introduced the kind);
- statistics: ``aggregate`` (exactly lm-eval's value, same float operations), ``unit_stats``
  (per-item sufficient statistics, summed per resample) and ``score_fn`` (vectorized score of
  summed statistics), or ``resample_score`` for kinds without sufficient statistics (median);
  ``test_name``; ``average`` (merging repeated runs per item, None when that is meaningless);
  ``rounding`` (which values the rounding floor may snap).

``kind_for(aggregation)`` is the one place that decides whether gatekeeper can test an
aggregation (results/reader.py, baseline/, suite/names.py and run/tasks.task_plan all ask it).
Imports neither torch nor lm-eval; sacrebleu only for corpus metrics, lazily.
"""

from __future__ import annotations

import itertools
import math
import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from gatekeeper.errors import GateError
from gatekeeper.model import is_finite
from gatekeeper.results import corpus
from gatekeeper.text import short

ScoreFn = Callable[[np.ndarray], np.ndarray]
_NUMBERS = frozenset({float, int, bool})


class Unusual(Exception):
    """A block of values is not plain; the samples reader takes its items one by one."""


def number(value: Any, where: str, metric: str, allow_nan: bool = False) -> float:
    """A finite JSON number (bools count as 0/1); ``allow_nan``: NaN too (nanmean)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        try:
            out = float(value)
        except OverflowError:  # an integer beyond float range
            out = math.inf
        if math.isfinite(out) or (allow_nan and math.isnan(out)):
            return out
    if allow_nan and value is None:
        return math.nan  # lm-eval's JSON writer turns NaN into NaN, other writers into null
    raise GateError(f"{where}: {metric} is {short(value)}, not a number")


def _finite_1d(values: Any, name: str, what: str, allow_nan: bool = False) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name}: kind {what!r} needs shape (n,), got {arr.shape}")
    _common_checks(arr, name, allow_nan)
    return arr


def _common_checks(arr: np.ndarray, name: str, allow_nan: bool = False) -> None:
    if arr.shape[0] == 0:
        raise ValueError(f"{name}: no items")
    if not allow_nan and np.isnan(arr).any():
        raise ValueError(f"{name}: contains NaN")
    if np.isinf(arr).any():
        raise ValueError(f"{name}: contains an infinite value")


class MetricKind:
    """Base: one float per item, aggregated as a mean of sums (overridden per kind)."""

    name = ""
    aggregations: tuple[str, ...] = ()
    lower_is_better: frozenset[str] = frozenset()  # lm-eval's default direction per aggregation
    format_version = 1  # the baseline format version that introduced this kind
    rounding = "value"  # "value": 1-D floats; "loglik": column 0 of (ll, count); "none": labels/text
    doc_want = "finite numbers"
    mean_of_diff = False  # score(cand) - score(base) == mean of per-unit differences of column 0
    # Aggregations whose score is a monotone function of column 0's sum when the other columns
    # are the same on both sides (a ratio over the same texts' counts, TER over the same
    # references): "unchanged" is then "column 0's mean difference is 0", which the studentized
    # test decides (compare/stats/paired.py).
    monotone_in_sum: frozenset[str] = frozenset()
    # Aggregations whose score is a smooth function of the summed statistics (BLEU, chrF): the
    # studentized test of its jackknife linearization decides (compare/stats/paired.py).
    smooth_in_sums: frozenset[str] = frozenset()
    score_bounds: dict[str, tuple[float, float]] = {}  # the task score's range, per aggregation
    line_fields: tuple[str, ...] = ()  # other keys of a samples line that ``line_value`` reads

    # ------------------------------------------------------------------ reading
    def fast_values(self, aggregation: str, items: list[Any]) -> Any:
        if not set(map(type, items)) <= _NUMBERS:
            raise Unusual
        arr = np.array(items, dtype=np.float64)
        if not np.isfinite(arr).all():
            raise Unusual
        return arr

    def item_value(self, aggregation: str, value: Any, where: str, metric: str) -> Any:
        return number(value, where, metric)

    def line_value(self, aggregation: str, line: dict[str, Any], where: str, metric: str) -> Any:
        """One item from its samples line (the metric's field and ``line_fields``), where
        ``fast_values`` refused the block; most kinds need only the metric's own field."""
        if metric not in line:
            raise GateError(f"{where}: no value for {metric}")
        return self.item_value(aggregation, line[metric], where, metric)

    def as_array(self, aggregation: str, items: Any) -> np.ndarray:
        return np.asarray(items, dtype=np.float64)

    def join(self, parts: list[Any]) -> Any:
        """Blocks of ``fast_values`` output -> the items of the whole file."""
        return np.concatenate(parts)

    # ------------------------------------------------------------------ validating
    def check(self, aggregation: str, values: np.ndarray, name: str = "values") -> np.ndarray:
        self._check_aggregation(aggregation)
        return _finite_1d(values, name, self.name)

    def accepts(self, aggregation: str) -> bool:
        return aggregation in self.aggregations

    def resamples(self, aggregation: str, values: np.ndarray, wanted: int) -> int:
        """How many resamples an item-resampling test uses (kinds without sufficient statistics)."""
        return wanted

    def _check_aggregation(self, aggregation: str) -> None:
        if not self.accepts(aggregation):
            raise ValueError(f"kind {self.name!r} needs aggregation in {self.aggregations}, got {aggregation!r}")

    def out_of_range(self, metric: str, values: np.ndarray) -> str | None:
        arr = np.asarray(values, dtype=np.float64)
        if arr.size and not np.isfinite(arr).all():
            return "a value is not a finite number"
        return None

    def bounds(self, aggregation: str, metric: str, values: np.ndarray) -> tuple[float, float] | None:
        """The range the task score can take (either end may be infinite), or None when the kind
        cannot know it. A margin at or beyond it can never be exceeded (compare/reach.py)."""
        return self.score_bounds.get(aggregation)

    # ------------------------------------------------------------------ baseline file
    def to_doc(self, values: np.ndarray) -> list[Any]:
        return [float(v) for v in np.asarray(values, dtype=np.float64)]

    def doc_problem(self, values: list[Any]) -> Any:
        """The first stored item that is not a valid value (``NO_PROBLEM`` when all are)."""
        if _all_finite(values):
            return NO_PROBLEM
        for v in values:
            if not is_finite(v):
                return v
        return NO_PROBLEM

    def from_doc(self, values: list[Any], n: int) -> np.ndarray:
        return np.asarray(values, dtype=np.float64).reshape(n)

    # ------------------------------------------------------------------ statistics
    def aggregate(self, aggregation: str, values: np.ndarray) -> float:
        raise NotImplementedError

    def unit_stats(self, aggregation: str, base: np.ndarray, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Per-item sufficient statistics of both runs (float64 (n, k) each); None when the
        aggregate has none (the test then resamples items and calls ``resample_score``)."""
        return _sum_count(base), _sum_count(cand)

    def score_fn(self, aggregation: str) -> ScoreFn:
        return _mean_score

    def flip_strata(self, aggregation: str, base: np.ndarray, cand: np.ndarray) -> np.ndarray | None:
        """Each item's stratum for the flips' test (compare/stats/flips.py), for kinds whose items
        sit in one of a few cells (an item flips only between the cells of its stratum); None
        for the others."""
        return None

    def resample_score(self, aggregation: str, values: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """The aggregate of ``values[row]`` for each row of an (R, n) index matrix (kinds
        without sufficient statistics only)."""
        raise NotImplementedError

    def identical(self, base: np.ndarray, cand: np.ndarray) -> bool:
        if base.dtype == object:
            return bool((base == cand).all())
        return bool(np.array_equal(base, cand, equal_nan=True))

    def exact_scores(self, aggregation: str, base: np.ndarray, cand: np.ndarray,
                     xb: np.ndarray, xc: np.ndarray) -> tuple[float, float]:
        return self.aggregate(aggregation, base), self.aggregate(aggregation, cand)

    def test_name(self, exact: bool) -> str:
        return f"{self.name}-permutation"

    def average(self, stack: np.ndarray) -> np.ndarray | None:
        """Per-item mean of repeated runs (stack: (runs, n, ...)); None: cannot be averaged."""
        return stack.mean(axis=0)


def _all_finite(values: list[Any]) -> bool:
    """``all(map(is_finite, values))`` in bulk, for the usual case (False may only mean "not
    plain": the item-by-item check then names the bad value)."""
    if not set(map(type, values)) <= {int, float}:
        return False
    try:
        return bool(np.isfinite(np.asarray(values, dtype=np.float64)).all())
    except OverflowError:  # an integer beyond float range
        return False


class _NoProblem:
    def __repr__(self) -> str:
        return "<none>"


NO_PROBLEM = _NoProblem()


def _first_bad_pair(values: list[Any], ok: Callable[[Any], bool]) -> Any:
    """For kinds stored as a pair per item: the first item that is not two ``ok`` values."""
    for v in values:
        if not (isinstance(v, list) and len(v) == 2 and all(ok(x) for x in v)):
            return v
    return NO_PROBLEM




def _sum_count(values: np.ndarray) -> np.ndarray:
    return np.column_stack([values, np.ones(values.shape[0])])


def _mean_score(s: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return s[:, 0] / s[:, 1]


# ---------------------------------------------------------------------------------- mean


# Metrics whose per-item values lm-eval 0.4.13 computes as right/wrong scores in [0, 1]
# (api/metrics.py: acc, acc_norm, acc_mutual_info from loglikelihood comparisons,
# exact_match from HF evaluate's mean of matches). A value outside the range is not something
# lm-eval writes; +1e6 and -1e6 items would cancel out in the mean and hide any drop.
UNIT_RANGE_METRICS = frozenset({"acc", "acc_norm", "acc_mutual_info", "exact_match"})


class MeanKind(MetricKind):
    """``mean``: one float per item (acc, exact_match); 0/1 values get McNemar."""

    name = "mean"
    aggregations = ("mean",)
    mean_of_diff = True

    def item_value(self, aggregation: str, value: Any, where: str, metric: str) -> Any:
        if isinstance(value, list):  # several numbers for one doc: their mean is the doc's value
            if not value:
                raise GateError(f"{where}: {metric} is an empty list, not a number")
            return float(np.mean([number(v, where, metric) for v in value]))
        return number(value, where, metric)

    def aggregate(self, aggregation: str, values: np.ndarray) -> float:
        arr = self.check(aggregation, values)
        # Python's left-to-right float sum, like lm_eval.api.metrics.mean: bit-exact.
        return sum(arr.tolist()) / arr.shape[0]

    def out_of_range(self, metric: str, values: np.ndarray) -> str | None:
        arr = np.asarray(values, dtype=np.float64)
        problem = super().out_of_range(metric, arr)
        if problem or metric not in UNIT_RANGE_METRICS:
            return problem
        bad = np.flatnonzero((arr < 0) | (arr > 1))
        return f"{metric} per-item value {arr[bad[0]]!r} is outside [0, 1]" if bad.size else None

    def bounds(self, aggregation: str, metric: str, values: np.ndarray) -> tuple[float, float] | None:
        return _unit_bounds(metric, values)

    def test_name(self, exact: bool) -> str:
        return "exact-sign-flip" if exact else "sign-flip-permutation"


def _unit_bounds(metric: str, values: np.ndarray) -> tuple[float, float] | None:
    """[0, 1] for the right/wrong metrics, and for any metric whose items are all 0 or 1 (a
    custom scorer of right/wrong answers); other means have no range gatekeeper can know."""
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[~np.isnan(arr)]
    if metric in UNIT_RANGE_METRICS or (arr.size and bool(np.isin(arr, (0.0, 1.0)).all())):
        return (0.0, 1.0)
    return None


# ---------------------------------------------------------------------------------- ratio

# Log-probabilities are <= 0; a few ulps of float32 log-softmax rounding are tolerated.
_MAX_LOGLIKELIHOOD = 1e-4


class RatioKind(MetricKind):
    """``ratio``: [loglikelihood, count] per item; perplexities and bits per byte from sums."""

    name = "ratio"
    aggregations = ("weighted_perplexity", "bits_per_byte", "perplexity")
    lower_is_better = frozenset(aggregations)
    score_bounds = {"weighted_perplexity": (1.0, math.inf), "perplexity": (1.0, math.inf),
                    "bits_per_byte": (0.0, math.inf)}
    rounding = "loglik"
    doc_want = "[loglikelihood, count] pairs"
    monotone_in_sum = frozenset(aggregations)  # exp(-ll / count) and -ll / count / ln 2 at fixed counts

    def fast_values(self, aggregation: str, items: list[Any]) -> Any:
        types = set(map(type, items))
        if aggregation == "perplexity" and types <= _NUMBERS:
            arr = np.column_stack([np.array(items, dtype=np.float64), np.ones(len(items))])
        elif types == {list} and set(map(type, itertools.chain.from_iterable(items))) <= _NUMBERS:
            arr = np.array(items, dtype=np.float64)  # ValueError if ragged
            if arr.shape != (len(items), 2) or not (arr[:, 1] > 0).all():
                raise Unusual
        else:
            raise Unusual
        if not np.isfinite(arr).all():
            raise Unusual
        return arr

    def item_value(self, aggregation: str, value: Any, where: str, metric: str) -> Any:
        if aggregation == "perplexity" and not isinstance(value, list):
            return (number(value, where, metric), 1.0)  # loglikelihood per doc; count 1
        if isinstance(value, list) and len(value) == 2:
            ll, count = number(value[0], where, metric), number(value[1], where, metric)
            if count <= 0:
                raise GateError(f"{where}: {metric} count is {count}, must be > 0")
            return (ll, count)
        raise GateError(f"{where}: {metric} is {short(value)}, expected [loglikelihood, count]")

    def as_array(self, aggregation: str, items: Any) -> np.ndarray:
        return np.asarray(items, dtype=np.float64).reshape(-1, 2)

    def check(self, aggregation: str, values: np.ndarray, name: str = "values") -> np.ndarray:
        self._check_aggregation(aggregation)
        arr = np.asarray(values, dtype=np.float64)
        if arr.ndim != 2 or arr.shape[1] != 2:
            raise ValueError(f"{name}: kind 'ratio' needs shape (n, 2) [loglikelihood, count], got {arr.shape}")
        _common_checks(arr, name)
        return arr

    def out_of_range(self, metric: str, values: np.ndarray) -> str | None:
        arr = np.asarray(values, dtype=np.float64)
        problem = super().out_of_range(metric, arr)
        if problem or arr.size == 0:
            return problem
        arr = arr.reshape(-1, 2)
        bad = np.flatnonzero(arr[:, 0] > _MAX_LOGLIKELIHOOD)
        if bad.size:
            return f"loglikelihood {arr[bad[0], 0]!r} is positive (log-probabilities are <= 0)"
        bad = np.flatnonzero(arr[:, 1] <= 0)
        return f"count {arr[bad[0], 1]!r} is not positive" if bad.size else None

    def to_doc(self, values: np.ndarray) -> list[Any]:
        return [[float(a), float(b)] for a, b in np.asarray(values, dtype=np.float64).reshape(-1, 2)]

    def doc_problem(self, values: list[Any]) -> Any:
        if (set(map(type, values)) == {list} and set(map(len, values)) == {2}
                and _all_finite(list(itertools.chain.from_iterable(values)))):
            return NO_PROBLEM
        return _first_bad_pair(values, is_finite)

    def from_doc(self, values: list[Any], n: int) -> np.ndarray:
        return np.asarray(values, dtype=np.float64).reshape(n, 2)

    def aggregate(self, aggregation: str, values: np.ndarray) -> float:
        arr = self.check(aggregation, values)
        ll, count = arr[:, 0].tolist(), arr[:, 1].tolist()
        if aggregation == "perplexity":  # lm-eval: exp(-mean(lls)), the count is ignored
            return math.exp(-(sum(ll) / len(ll)))
        total = sum(count)
        if total <= 0:
            raise ValueError("values: the counts sum to zero")
        weighted_mean = sum(ll) / total
        if aggregation == "weighted_perplexity":
            return math.exp(-weighted_mean)
        return -weighted_mean / math.log(2)  # bits_per_byte

    def unit_stats(self, aggregation: str, base: np.ndarray, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if aggregation == "perplexity":  # lm-eval's perplexity ignores the count column
            return _sum_count(base[:, 0]), _sum_count(cand[:, 0])
        return np.ascontiguousarray(base, dtype=np.float64), np.ascontiguousarray(cand, dtype=np.float64)

    def score_fn(self, aggregation: str) -> ScoreFn:
        return _bits_per_byte_score if aggregation == "bits_per_byte" else _perplexity_score

    def average(self, stack: np.ndarray) -> np.ndarray | None:
        out = stack.mean(axis=0)
        out[:, 1] = stack[0][:, 1]  # the counts are the same text's
        return out


def _perplexity_score(s: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.exp(-(s[:, 0] / s[:, 1]))


def _bits_per_byte_score(s: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return -(s[:, 0] / s[:, 1]) / math.log(2)


# ---------------------------------------------------------------------------------- corpus


def _is_text(v: Any) -> bool:
    return isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))


class CorpusKind(MetricKind):
    """``corpus``: [reference, prediction] per item; sacrebleu's sentence statistics summed."""

    name = "corpus"
    aggregations = ("bleu", "chrf", "chrf++", "ter")
    lower_is_better = frozenset({"ter"})
    monotone_in_sum = frozenset({"ter"})  # 100 * edits / reference length, the same references
    smooth_in_sums = frozenset({"bleu", "chrf", "chrf++"})
    # sacrebleu's scores, as lm-eval reports them: 0-100 points (TER has no upper bound).
    score_bounds = {"bleu": (0.0, 100.0), "chrf": (0.0, 100.0), "chrf++": (0.0, 100.0), "ter": (0.0, math.inf)}
    rounding = "none"
    doc_want = "[reference, prediction] pairs of text"

    def fast_values(self, aggregation: str, items: list[Any]) -> Any:
        if not all(type(v) is list and len(v) == 2 and _is_text(v[0]) and _is_text(v[1]) for v in items):
            raise Unusual
        return [(v[0], v[1]) for v in items]

    def join(self, parts: list[Any]) -> Any:
        return list(itertools.chain.from_iterable(parts))

    def item_value(self, aggregation: str, value: Any, where: str, metric: str) -> Any:
        if isinstance(value, list) and len(value) == 2 and all(_is_text(v) for v in value):
            return (value[0], value[1])
        raise GateError(f"{where}: {metric} is {short(value)}, expected [reference, prediction]")

    def as_array(self, aggregation: str, items: Any) -> np.ndarray:
        arr = np.empty((len(items), 2), dtype=object)
        for i, (ref, pred) in enumerate(items):
            arr[i, 0], arr[i, 1] = ref, pred
        return arr

    def check(self, aggregation: str, values: np.ndarray, name: str = "values") -> np.ndarray:
        self._check_aggregation(aggregation)
        arr = np.asarray(values, dtype=object)
        if arr.ndim != 2 or arr.shape[1] != 2:
            raise ValueError(f"{name}: kind 'corpus' needs shape (n, 2) [reference, prediction], got {arr.shape}")
        if any(v is None for v in arr[:, 1]):
            raise ValueError(f"{name}: a prediction is missing (None)")
        if arr.shape[0] == 0:
            raise ValueError(f"{name}: no items")
        return arr

    def out_of_range(self, metric: str, values: np.ndarray) -> str | None:
        return None

    def to_doc(self, values: np.ndarray) -> list[Any]:
        return [[_text_doc(a), _text_doc(b)] for a, b in np.asarray(values, dtype=object).reshape(-1, 2)]

    def doc_problem(self, values: list[Any]) -> Any:
        return _first_bad_pair(values, _is_text)

    def from_doc(self, values: list[Any], n: int) -> np.ndarray:
        return self.as_array("", values)

    def aggregate(self, aggregation: str, values: np.ndarray) -> float:
        return corpus.corpus_score(aggregation, self.check(aggregation, values))

    def unit_stats(self, aggregation: str, base: np.ndarray, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return corpus.sentence_stats(aggregation, base), corpus.sentence_stats(aggregation, cand)

    def score_fn(self, aggregation: str) -> ScoreFn:
        return corpus.SCORE_FNS[aggregation]

    def exact_scores(self, aggregation: str, base: np.ndarray, cand: np.ndarray,
                     xb: np.ndarray, xc: np.ndarray) -> tuple[float, float]:
        # sacrebleu's own formula on the summed statistics already computed: equals corpus_*().
        return corpus.exact_score_from_stats(aggregation, xb), corpus.exact_score_from_stats(aggregation, xc)

    def average(self, stack: np.ndarray) -> np.ndarray | None:
        return None  # texts cannot be averaged; merge_repeats keeps the first run's


def _text_doc(v: Any) -> Any:
    return [str(x) for x in v] if isinstance(v, list) else str(v)


# ---------------------------------------------------------------------------------- confusion

_MAX_LABELS = 64  # matthews_corrcoef keeps a K x K confusion matrix per item


def _is_label(v: Any) -> bool:
    # bool is an int: sklearn treats True/False as 1/0 too. Bounded: labels are class indices.
    return isinstance(v, int) and -(1 << 53) < v < 1 << 53


class ConfusionKind(MetricKind):
    """``confusion``: [gold, prediction] class labels per item (lm-eval's f1 and mcc), tested
    through confusion counts per item: f1 [tp, fp, fn] for the positive label 1 (sklearn's
    ``average='binary'``, what lm-eval calls); matthews_corrcoef a one-hot K x K confusion
    cell over the labels either run uses (binary and multi-class)."""

    name = "confusion"
    aggregations = ("f1", "matthews_corrcoef")
    score_bounds = {"f1": (0.0, 1.0), "matthews_corrcoef": (-1.0, 1.0)}
    format_version = 2
    rounding = "none"
    doc_want = "[gold, prediction] pairs of integer class labels"

    def fast_values(self, aggregation: str, items: list[Any]) -> Any:
        if set(map(type, items)) != {list}:
            raise Unusual
        arr = np.array(items)
        if arr.dtype.kind not in "iub" or arr.shape != (len(items), 2):
            raise Unusual
        return arr.astype(np.int64)

    def item_value(self, aggregation: str, value: Any, where: str, metric: str) -> Any:
        if isinstance(value, list) and len(value) == 2 and all(_is_label(v) for v in value):
            return (int(value[0]), int(value[1]))
        raise GateError(
            f"{where}: {metric} is {short(value)}, expected [gold, prediction] integer class labels "
            "(lm-eval's multiple_choice f1/mcc); text labels are not supported: map them to indices"
        )

    def as_array(self, aggregation: str, items: Any) -> np.ndarray:
        return np.asarray(items, dtype=np.int64).reshape(-1, 2)

    def check(self, aggregation: str, values: np.ndarray, name: str = "values") -> np.ndarray:
        self._check_aggregation(aggregation)
        arr = np.asarray(values)
        if arr.ndim != 2 or arr.shape[1] != 2 or arr.dtype.kind not in "iub":
            raise ValueError(f"{name}: kind 'confusion' needs integer labels of shape (n, 2), got {arr.dtype} {arr.shape}")
        if arr.shape[0] == 0:
            raise ValueError(f"{name}: no items")
        return arr.astype(np.int64)

    def out_of_range(self, metric: str, values: np.ndarray) -> str | None:
        labels = np.unique(np.asarray(values))
        if labels.size > _MAX_LABELS:
            return f"{labels.size} distinct labels (gatekeeper tests at most {_MAX_LABELS} classes)"
        return None

    def to_doc(self, values: np.ndarray) -> list[Any]:
        return np.asarray(values, dtype=np.int64).reshape(-1, 2).tolist()

    def doc_problem(self, values: list[Any]) -> Any:
        return _first_bad_pair(values, lambda x: _is_label(x) and not isinstance(x, bool))

    def from_doc(self, values: list[Any], n: int) -> np.ndarray:
        return np.asarray(values, dtype=np.int64).reshape(n, 2)

    def aggregate(self, aggregation: str, values: np.ndarray) -> float:
        arr = self.check(aggregation, values)
        if aggregation == "f1":
            if np.unique(arr).size > 2:
                # lm-eval's f1 calls sklearn f1_score(average='binary'), which refuses this.
                raise ValueError("f1 is binary in lm-eval (sklearn average='binary') but the labels are multi-class")
            return float(_f1_score(self._f1_counts(arr).sum(axis=0)[None, :])[0])
        labels = np.unique(arr)
        return float(_mcc_score(self._cells(arr, labels).sum(axis=0)[None, :])[0])

    @staticmethod
    def _f1_counts(arr: np.ndarray) -> np.ndarray:
        gold, pred = arr[:, 0] == 1, arr[:, 1] == 1  # sklearn's default pos_label=1
        return np.column_stack([gold & pred, ~gold & pred, gold & ~pred]).astype(np.float64)

    @staticmethod
    def _cells(arr: np.ndarray, labels: np.ndarray) -> np.ndarray:
        k = labels.size
        code = np.searchsorted(labels, arr[:, 0]) * k + np.searchsorted(labels, arr[:, 1])
        out = np.zeros((arr.shape[0], k * k))
        out[np.arange(arr.shape[0]), code] = 1.0
        return out

    def unit_stats(self, aggregation: str, base: np.ndarray, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if aggregation == "f1":
            return self._f1_counts(base), self._f1_counts(cand)
        labels = np.unique(np.concatenate([base.ravel(), cand.ravel()]))
        return self._cells(base, labels), self._cells(cand, labels)

    def score_fn(self, aggregation: str) -> ScoreFn:
        return _f1_score if aggregation == "f1" else _mcc_score

    def flip_strata(self, aggregation: str, base: np.ndarray, cand: np.ndarray) -> np.ndarray | None:
        # an item keeps its gold label; where the runs disagree on it the permutation decides
        return base[:, 0] if np.array_equal(base[:, 0], cand[:, 0]) else None

    def average(self, stack: np.ndarray) -> np.ndarray | None:
        return None  # labels cannot be averaged


def _f1_score(s: np.ndarray) -> np.ndarray:
    """sklearn's binary F1 on summed [tp, fp, fn]: (1 + beta^2) tp / (beta^2 (tp + fn) + (tp + fp)),
    0 when there is no positive at all (sklearn's zero_division default, with a warning)."""
    tp, fp, fn = s[:, 0], s[:, 1], s[:, 2]
    denom = 1.0 * (tp + fn) + (tp + fp)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denom > 0, (1 + 1.0) * tp / denom, 0.0)


def _mcc_score(s: np.ndarray) -> np.ndarray:
    """sklearn's matthews_corrcoef on summed K x K confusion matrices (rows: gold), the same
    float operations; 0 when a marginal is constant (sklearn's degenerate case)."""
    k = math.isqrt(s.shape[1])
    c = s.reshape(-1, k, k)
    t_sum, p_sum = c.sum(axis=2), c.sum(axis=1)
    n_correct = np.trace(c, axis1=1, axis2=2)
    n = p_sum.sum(axis=1)
    cov_ytyp = n_correct * n - (t_sum * p_sum).sum(axis=1)
    cov_ypyp = n**2 - (p_sum * p_sum).sum(axis=1)
    cov_ytyt = n**2 - (t_sum * t_sum).sum(axis=1)
    prod = cov_ypyp * cov_ytyt
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(prod == 0, 0.0, cov_ytyp / np.sqrt(prod))


# ---------------------------------------------------------------------------------- brier


class BrierKind(MetricKind):
    """``brier``: lm-eval's brier_score. lm-eval logs [gold, str(probabilities)] (numpy's
    8-digit print), so the per-item score is rebuilt from the exact loglikelihoods in
    ``filtered_resps``: softmax as ``lm_eval.utils.softmax``, then the row's squared error as
    ``brier_score`` sums it; the aggregate is ``np.mean`` of those rows, as lm-eval computes."""

    name = "brier"
    aggregations = ("brier_score",)
    lower_is_better = frozenset(aggregations)
    score_bounds = {"brier_score": (0.0, 2.0)}  # sum of squared errors of a distribution vs one-hot
    format_version = 2
    mean_of_diff = True
    line_fields = ("filtered_resps",)

    def fast_values(self, aggregation: str, items: list[Any]) -> Any:
        raise Unusual  # each item's value is rebuilt from its filtered_resps (line_value)

    def line_value(self, aggregation: str, line: dict[str, Any], where: str, metric: str) -> Any:
        value = line.get(metric)
        if not (isinstance(value, list) and len(value) == 2 and _is_label(value[0])):
            raise GateError(f"{where}: {metric} is {short(value)}, expected [gold, probabilities]")
        resps = line.get("filtered_resps")
        try:
            lls = [float(r[0]) for r in resps]
        except (TypeError, ValueError, IndexError, KeyError):
            raise GateError(f"{where}: filtered_resps is {short(resps)}, expected [[loglikelihood, is_greedy], ...]") from None
        gold = int(value[0])
        if not lls or not 0 <= gold < len(lls) or not all(math.isfinite(x) for x in lls):
            raise GateError(f"{where}: {metric} gold {gold} and loglikelihoods {short(lls)} do not fit")
        return float(brier_rows([gold], [lls])[0])

    def aggregate(self, aggregation: str, values: np.ndarray) -> float:
        return float(np.mean(self.check(aggregation, values)))  # lm-eval: np.mean of the rows

    def out_of_range(self, metric: str, values: np.ndarray) -> str | None:
        arr = np.asarray(values, dtype=np.float64)
        problem = super().out_of_range(metric, arr)
        if problem:
            return problem
        bad = np.flatnonzero((arr < 0) | (arr > 2))
        return f"{metric} per-item value {arr[bad[0]]!r} is outside [0, 2]" if bad.size else None


def brier_rows(golds: list[int], lls: list[list[float]]) -> np.ndarray:
    """Per-item squared error of softmax(loglikelihoods) against the one-hot gold, with
    lm-eval 0.4.13's operations (utils.softmax per item; brier_score's row sum)."""
    probs = [_softmax(x) for x in lls]
    predictions = np.array(probs)
    num_class = predictions.shape[1]
    gold_one_hot = np.eye(num_class)[list(golds)]
    return np.sum((predictions - gold_one_hot) ** 2, axis=1)


def _softmax(x: list[float]) -> np.ndarray:
    e_x = np.exp(x - np.max(x))  # lm_eval.utils.softmax, on the tuple of loglikelihoods
    return e_x / e_x.sum()


# ---------------------------------------------------------------------------------- nanmean


class NanMeanKind(MetricKind):
    """``nanmean``: one float per item, NaN allowed (an item the scorer could not judge).
    NaN items stay in the pairing: the statistics are [value or 0, 1 if judged], so an item
    that became NaN in one run drops out of that run's mean exactly as in lm-eval's."""

    name = "nanmean"
    aggregations = ("nanmean",)
    # The judged values' sum over the judged count: monotone in the sum when the same items are
    # judged on both sides, smooth in both sums otherwise (compare/stats/paired.py).
    monotone_in_sum = frozenset(aggregations)
    smooth_in_sums = frozenset(aggregations)
    format_version = 2
    doc_want = "finite numbers or null (NaN)"

    def fast_values(self, aggregation: str, items: list[Any]) -> Any:
        if not set(map(type, items)) <= _NUMBERS:
            raise Unusual
        arr = np.array(items, dtype=np.float64)
        if np.isinf(arr).any():
            raise Unusual
        return arr

    def item_value(self, aggregation: str, value: Any, where: str, metric: str) -> Any:
        return number(value, where, metric, allow_nan=True)

    def check(self, aggregation: str, values: np.ndarray, name: str = "values") -> np.ndarray:
        self._check_aggregation(aggregation)
        arr = _finite_1d(values, name, self.name, allow_nan=True)
        if np.isnan(arr).all():
            raise ValueError(f"{name}: every item is NaN (lm-eval reports NaN: nothing to compare)")
        return arr

    def out_of_range(self, metric: str, values: np.ndarray) -> str | None:
        arr = np.asarray(values, dtype=np.float64)
        return "a value is infinite" if np.isinf(arr).any() else None

    def bounds(self, aggregation: str, metric: str, values: np.ndarray) -> tuple[float, float] | None:
        return _unit_bounds(metric, values)

    def to_doc(self, values: np.ndarray) -> list[Any]:
        return [None if math.isnan(v) else float(v) for v in np.asarray(values, dtype=np.float64)]

    def doc_problem(self, values: list[Any]) -> Any:
        for v in values:
            if v is not None and not is_finite(v):
                return v
        return NO_PROBLEM

    def from_doc(self, values: list[Any], n: int) -> np.ndarray:
        return np.asarray([math.nan if v is None else v for v in values], dtype=np.float64).reshape(n)

    def aggregate(self, aggregation: str, values: np.ndarray) -> float:
        return float(np.nanmean(self.check(aggregation, values)))  # lm-eval: np.nanmean(arr)

    def unit_stats(self, aggregation: str, base: np.ndarray, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        def stats(v: np.ndarray) -> np.ndarray:
            judged = ~np.isnan(v)
            return np.column_stack([np.where(judged, v, 0.0), judged.astype(np.float64)])

        return stats(base), stats(cand)

    def average(self, stack: np.ndarray) -> np.ndarray | None:
        with np.errstate(invalid="ignore"):
            judged = (~np.isnan(stack)).sum(axis=0)
            return np.where(judged > 0, np.nansum(stack, axis=0) / np.maximum(judged, 1), np.nan)


# ---------------------------------------------------------------------------------- median


class MedianKind(MetricKind):
    """``median``: one float per item; lm-eval reports ``sorted(arr)[len(arr) // 2]`` (the upper
    median). No sufficient statistics: the permutation test and the bootstrap resample items and
    take that order statistic of every resample (``median-permutation``)."""

    name = "median"
    aggregations = ("median",)
    format_version = 2

    def aggregate(self, aggregation: str, values: np.ndarray) -> float:
        arr = self.check(aggregation, values)
        return float(sorted(arr.tolist())[arr.shape[0] // 2])

    def unit_stats(self, aggregation: str, base: np.ndarray, cand: np.ndarray) -> None:
        return None

    def resample_score(self, aggregation: str, values: np.ndarray, idx: np.ndarray) -> np.ndarray:
        k = idx.shape[1] // 2
        return np.partition(values[idx], k, axis=1)[:, k]

    def test_name(self, exact: bool) -> str:
        return "median-permutation"


# ---------------------------------------------------------------------------------- function

# Task-defined aggregations bound to trusted code (gatekeeper.trusted), by aggregation id
# ``!function NAME@HASH``: the hash is of the function's source, so one id is one function.
_FUNCTIONS: dict[str, Callable[[list[Any]], Any]] = {}
_FUNCTION_ID = re.compile(r"!function [A-Za-z_]\w*@[0-9a-f]{12}")
# Task functions are plain Python called once per resample: 1,000 resamples by default (a fixed
# count, so the same inputs give the same p-value everywhere; the smallest p is 1/1001). Only a
# function so slow that those would take more than FUNCTION_BUDGET_S gets fewer (not below
# MIN_FUNCTION_RESAMPLES); the report then carries a warning with the count.
FUNCTION_RESAMPLES = 1000
FUNCTION_BUDGET_S = 60.0
MIN_FUNCTION_RESAMPLES = 200


def bind_function(aggregation: str, fn: Callable[[list[Any]], Any]) -> None:
    """Make a trusted task-defined aggregation testable under its id (``trusted.aggregation_id``)."""
    if not _FUNCTION_ID.fullmatch(aggregation):
        raise ValueError(f"not a task-defined aggregation id: {aggregation!r}")
    _FUNCTIONS[aggregation] = fn


def _objects(items: Any) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out


class FunctionKind(MetricKind):
    """``function``: a task's own ``!function`` aggregation, loaded from trusted code only
    (the suite's include_path or lm-eval's bundled tasks; never from a results file). Per-item
    values are whatever lm-eval logged (lists of booleans per item as IFEval's instruction
    level, [gold, pred] pairs, dicts, numbers), kept as JSON values. No sufficient statistics:
    items are resampled and the function is called on every resample
    (``function-permutation``), with fewer resamples when it is slow."""

    name = "function"
    format_version = 2
    rounding = "none"
    doc_want = "JSON values"

    def accepts(self, aggregation: str) -> bool:
        return _FUNCTION_ID.fullmatch(aggregation) is not None

    def _fn(self, aggregation: str) -> Callable[[list[Any]], Any]:
        fn = _FUNCTIONS.get(aggregation)
        if fn is None:
            raise ValueError(f"{aggregation.split('@')[0]} is not loaded from trusted task code (pass --suite)")
        return fn

    def fast_values(self, aggregation: str, items: list[Any]) -> Any:
        return list(items)

    def join(self, parts: list[Any]) -> Any:
        return list(itertools.chain.from_iterable(parts))

    def item_value(self, aggregation: str, value: Any, where: str, metric: str) -> Any:
        return value

    def as_array(self, aggregation: str, items: Any) -> np.ndarray:
        return _objects(items)

    def check(self, aggregation: str, values: np.ndarray, name: str = "values") -> np.ndarray:
        self._fn(aggregation)
        arr = values if isinstance(values, np.ndarray) and values.dtype == object and values.ndim == 1 \
            else _objects(list(values))
        if arr.shape[0] == 0:
            raise ValueError(f"{name}: no items")
        return arr

    def out_of_range(self, metric: str, values: np.ndarray) -> str | None:
        return None

    def to_doc(self, values: np.ndarray) -> list[Any]:
        return list(values)

    def doc_problem(self, values: list[Any]) -> Any:
        return NO_PROBLEM

    def from_doc(self, values: list[Any], n: int) -> np.ndarray:
        return _objects(values)

    def aggregate(self, aggregation: str, values: np.ndarray) -> float:
        return self._call(aggregation, list(self.check(aggregation, values)))

    def _call(self, aggregation: str, items: list[Any]) -> float:
        """The task's function on items; anything it raises (values it cannot take, e.g. an
        edited baseline) becomes a ValueError naming it, which the callers turn into exit 2."""
        try:
            return float(self._fn(aggregation)(items))
        except Exception as exc:  # noqa: BLE001 - the task's own code: any failure is bad input
            name = aggregation.split("@")[0]
            raise ValueError(f"{name} failed on these values ({type(exc).__name__}: {short(str(exc), 80)})") from None

    def unit_stats(self, aggregation: str, base: np.ndarray, cand: np.ndarray) -> None:
        return None

    def resample_score(self, aggregation: str, values: np.ndarray, idx: np.ndarray) -> np.ndarray:
        return np.array([self._call(aggregation, list(values[row])) for row in idx], dtype=np.float64)

    def resamples(self, aggregation: str, values: np.ndarray, wanted: int) -> int:
        """FUNCTION_RESAMPLES, fewer only for a function too slow for FUNCTION_BUDGET_S."""
        count = min(wanted, FUNCTION_RESAMPLES)
        start = time.perf_counter()
        self._fn(aggregation)(list(values))
        per_call = time.perf_counter() - start
        if 2 * count * per_call <= FUNCTION_BUDGET_S:
            return count
        return int(max(MIN_FUNCTION_RESAMPLES, FUNCTION_BUDGET_S / (2 * per_call)))

    def identical(self, base: np.ndarray, cand: np.ndarray) -> bool:
        return all(a == b for a, b in zip(base.tolist(), cand.tolist(), strict=True))

    def test_name(self, exact: bool) -> str:
        return "function-permutation"

    def average(self, stack: np.ndarray) -> np.ndarray | None:
        return None


# ---------------------------------------------------------------------------------- registry

KINDS: dict[str, MetricKind] = {}
_BY_AGGREGATION: dict[str, MetricKind] = {}


def register(kind: MetricKind) -> MetricKind:
    """Add a kind; its aggregations become testable everywhere at once."""
    if kind.name in KINDS:
        raise ValueError(f"kind {kind.name!r} registered twice")
    for agg in kind.aggregations:
        if agg in _BY_AGGREGATION:
            raise ValueError(f"aggregation {agg!r} already belongs to kind {_BY_AGGREGATION[agg].name!r}")
        _BY_AGGREGATION[agg] = kind
    KINDS[kind.name] = kind
    return kind


def kind_named(name: str) -> MetricKind:
    """The kind stored under ``name`` (``MetricSeries.kind``); ValueError when unknown."""
    try:
        return KINDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown kind {name!r}; expected {', '.join(KINDS)}") from None


def kind_for(aggregation: str) -> MetricKind | None:
    """The kind that tests ``aggregation`` (an lm-eval aggregation name, or the id of a
    task-defined one bound to trusted code), None when none can."""
    if aggregation in _FUNCTIONS:
        return KINDS["function"]
    return _BY_AGGREGATION.get(aggregation)


def known_aggregations() -> list[str]:
    return sorted(_BY_AGGREGATION)


for _kind in (MeanKind(), RatioKind(), CorpusKind(), ConfusionKind(), BrierKind(), NanMeanKind(), MedianKind(),
              FunctionKind()):
    register(_kind)
