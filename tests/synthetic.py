"""Build RunResults by hand (no lm-eval): for the statistics and report tests."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np

from gatekeeper.model import MetricSeries, Provenance, RunResults, SeriesKey


def _h(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()


def series(task: str, metric: str, values, *, filter: str = "none", kind: str = "mean",
           aggregation: str = "mean", higher_is_better: bool = True, clusters=None) -> MetricSeries:
    values = np.asarray(values, dtype=object if kind == "corpus" else float)
    n = values.shape[0]
    doc_ids = np.arange(n, dtype=np.int64)
    hashes = np.array([[_h(task, i, "doc"), _h(task, i, "prompt"), _h(task, i, "target")] for i in range(n)])
    return MetricSeries(SeriesKey(task, filter, metric), kind, aggregation, higher_is_better, doc_ids,
                        values, hashes, None, None if clusters is None else np.asarray(clusters, dtype=str))


def run(*all_series: MetricSeries, name: str = "model") -> RunResults:
    tasks = sorted({s.key.task for s in all_series})
    prov = Provenance(
        source=f"synthetic:{name}",
        lm_eval_version="0.4.13",
        task_versions={t: 1.0 for t in tasks},
        n_shot={t: 0 for t in tasks},
        configs={t: {"task": t, "num_fewshot": 0} for t in tasks},
        n_samples={t: {"original": all_series[0].n, "effective": all_series[0].n} for t in tasks},
        model_name=name,
    )
    return RunResults(provenance=prov, series={s.key: s for s in all_series})


_TEMPLATES: dict[tuple, MetricSeries] = {}


def fast_series(task: str, values, *, kind: str = "mean", aggregation: str = "mean",
                higher_is_better: bool = True, clusters=None) -> MetricSeries:
    """``series(task, "m", values, ...)`` with the item hashes built once per task and size, so
    simulations that compare thousands of synthetic runs spend their time in the statistics."""
    values = np.asarray(values, dtype=object if kind == "corpus" else float)
    key = (task, values.shape[0], kind, aggregation, higher_is_better, clusters is not None)
    if key not in _TEMPLATES:
        _TEMPLATES[key] = series(task, "m", values, kind=kind, aggregation=aggregation,
                                 higher_is_better=higher_is_better, clusters=clusters)
    labels = None if clusters is None else np.asarray(clusters, dtype=str)
    return replace(_TEMPLATES[key], values=values, clusters=labels)


def paired_binary(rng: np.random.Generator, n: int, p_break, p_fix) -> tuple[np.ndarray, np.ndarray]:
    """Right/wrong pairs: each item is discordant right->wrong with prob p_break, wrong->right
    with prob p_fix, else concordant (both right w.p. 0.6 of the rest). Harmless when equal."""
    u = rng.random(n)
    breaks = u < p_break
    fixes = (u >= p_break) & (u < p_break + p_fix)
    both_right = ~breaks & ~fixes & (rng.random(n) < 0.6)
    return (breaks | both_right).astype(float), (fixes | both_right).astype(float)
