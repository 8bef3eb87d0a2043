"""Build RunResults by hand (no lm-eval): for the statistics and report tests."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np

from gatekeeper.model import MetricSeries, Provenance, RunResults, SeriesKey


def _h(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()


_HASHES: dict[str, np.ndarray] = {}


def _hashes(task: str, n: int) -> np.ndarray:
    """The first n items' [doc, prompt, target] hashes of a task: item i's do not depend on n, so
    one table per task, grown as needed, serves every size (simulations draw many)."""
    have = _HASHES.get(task)
    if have is None or have.shape[0] < n:
        size = max(n, 0 if have is None else 2 * have.shape[0])
        _HASHES[task] = np.array([[_h(task, i, "doc"), _h(task, i, "prompt"), _h(task, i, "target")]
                                  for i in range(size)]).reshape(size, 3)
    return _HASHES[task][:n]


def series(task: str, metric: str, values, *, filter: str = "none", kind: str = "mean",
           aggregation: str = "mean", higher_is_better: bool = True, clusters=None) -> MetricSeries:
    values = np.asarray(values, dtype=object if kind == "corpus" else float)
    n = values.shape[0]
    doc_ids = np.arange(n, dtype=np.int64)
    hashes = _hashes(task, n)
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


# MMLU's 57 test subjects and their sizes (14,042 items; clinical_knowledge is the 265-item one).
MMLU_SIZES = (100, 135, 152, 100, 265, 144, 100, 100, 100, 173, 102, 100, 235, 114, 145, 378, 126, 100, 310, 203,
              100, 165, 198, 193, 390, 270, 238, 151, 545, 216, 204, 237, 223, 131, 121, 108, 163, 112, 103, 234,
              100, 783, 346, 895, 306, 311, 324, 282, 1534, 272, 612, 110, 245, 201, 100, 166, 171)


def group_pair(rng: np.random.Generator, drops, *, sizes=MMLU_SIZES, flip: float = 0.04,
               group: str = "mmlu", weighted: bool = True) -> tuple[RunResults, RunResults]:
    """(baseline, candidate) runs of an MMLU-like group of right/wrong subtasks: accuracies
    between 0.3 and 0.9, a share ``flip`` of each subtask's items flipping between two harmless
    runs (half each way), and subtask t losing ``drops[t]`` accuracy on top (right -> wrong)."""
    base, cand = [], []
    for t, (n, d) in enumerate(zip(sizes, drops, strict=True)):
        acc = rng.uniform(0.3, 0.9)
        b = (rng.random(n) < acc).astype(float)
        u = rng.random(n)
        breaks = (b == 1) & (u < (flip / 2 + d) / acc)
        fixes = (b == 0) & (u < (flip / 2) / (1 - acc))
        name = f"{group}_{t:02d}"
        base.append(replace(fast_series(name, b), key=SeriesKey(name, "none", "acc")))
        cand.append(replace(fast_series(name, np.where(breaks, 0.0, np.where(fixes, 1.0, b))),
                            key=SeriesKey(name, "none", "acc")))
    return (as_group(run(*base, name="base"), group, weighted), as_group(run(*cand, name="cand"), group, weighted))


def as_group(r: RunResults, group: str, weighted: bool = True) -> RunResults:
    """``r`` with every task a subtask of ``group`` (lm-eval's acc aggregate, by size or not)."""
    leaves = sorted(r.tasks)
    manifest = {"groups": {group: {"leaves": leaves, "aggregate": [
        {"metric": "acc", "filter_list": ["none"], "weight_by_size": weighted, "aggregation": "mean"}]}}}
    return replace(r, group_subtasks={**r.group_subtasks, group: leaves},
                   provenance=replace(r.provenance, manifest=manifest))
