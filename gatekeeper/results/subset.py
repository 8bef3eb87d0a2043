"""Part of a run: the items a sequential gate has seen so far (issue #16).

``join`` puts the looks of a sequential gate together item for item (each look keeps only the
documents new at it: ``run/looks.py`` repeats one already-seen document where lm-eval would
otherwise evaluate a whole task); ``restrict`` cuts a baseline (or anchor) down to the same
documents, so the paired comparison sees the same items on both sides. Pure functions on
``RunResults``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from gatekeeper.errors import GateError
from gatekeeper.model import MetricSeries, RunResults


def join(runs: list[RunResults], new_docs: list[dict[str, list[int]]]) -> RunResults:
    """The looks ``runs`` as one run of the documents each added (``new_docs[i][task]``)."""
    if not runs or len(runs) != len(new_docs):
        raise GateError("sequential gate: no looks to join")
    first = runs[0]
    series: dict[Any, MetricSeries] = {}
    for key in first.series:
        parts = []
        for run, new in zip(runs, new_docs, strict=True):
            s = run.series.get(key)
            if s is None:
                raise GateError(f"{run.provenance.source}: look has no {key}, the first look had it")
            wanted = np.asarray(new.get(key.task, []), dtype=np.int64)
            keep = np.isin(s.doc_ids, wanted)
            if int(np.count_nonzero(keep)) != np.unique(wanted).size:
                raise GateError(f"{run.provenance.source}: {key} holds {int(np.count_nonzero(keep))} of the "
                                f"{np.unique(wanted).size} documents its manifest says the look added; re-run the look")
            parts.append(_take(s, keep))
        series[key] = _concat(parts)
    counts = {t: sum(len(new.get(t, [])) for new in new_docs) for t in {k.task for k in series}}
    return replace(first, series=series, provenance=_with_counts(first, counts), groups={}, snippets=_snippets(runs))


def restrict(run: RunResults, docs: dict[str, np.ndarray]) -> RunResults:
    """``run`` with each task's series cut to the documents ``docs[task]``."""
    series = {}
    for key, s in run.series.items():
        keep = np.isin(s.doc_ids, docs.get(key.task, np.empty(0, dtype=np.int64)))
        series[key] = _take(s, keep)
    counts = {t: int(np.asarray(d).size) for t, d in docs.items()}
    return replace(run, series=series, provenance=_with_counts(run, counts), groups={})


def docs_of(run: RunResults) -> dict[str, np.ndarray]:
    """{task: the document ids the run holds}."""
    out: dict[str, np.ndarray] = {}
    for key, s in run.series.items():
        out.setdefault(key.task, np.asarray(s.doc_ids, dtype=np.int64))
    return out


def _take(s: MetricSeries, keep: np.ndarray) -> MetricSeries:
    return replace(s, doc_ids=s.doc_ids[keep], values=s.values[keep], hashes=s.hashes[keep], reported=None,
                   clusters=None if s.clusters is None else s.clusters[keep],
                   sample=None if s.sample is None else replace(s.sample, weights=s.sample.weights[keep]))


def _concat(parts: list[MetricSeries]) -> MetricSeries:
    s = parts[0]
    ids = np.concatenate([p.doc_ids for p in parts])
    order = np.argsort(ids, kind="stable")
    values = np.concatenate([p.values for p in parts])[order]
    hashes = np.concatenate([p.hashes for p in parts])[order]
    clusters = None if s.clusters is None else np.concatenate([p.clusters for p in parts])[order]
    if np.unique(ids).size != ids.size:
        raise GateError(f"{s.key}: a document was evaluated at two looks; the looks do not fit together")
    # an informative design's weights are given to the joined items (``informative.weigh``), not kept per look
    return replace(s, doc_ids=ids[order], values=values, hashes=hashes, reported=None, clusters=clusters, sample=None)


def _with_counts(run: RunResults, counts: dict[str, int]):
    """Provenance of a part: its item counts; no task_hashes (lm-eval hashes all of a task's
    documents, so a part's differs from the whole's; every item's own hashes are still compared);
    the manifest says it is a part, not which look."""
    n = {t: {**(run.provenance.n_samples.get(t) or {}), "effective": c} for t, c in counts.items()}
    manifest = {k: v for k, v in (run.provenance.manifest or {}).items() if k != "look"}
    if manifest:
        manifest["part"] = True
    return replace(run.provenance, n_samples={**run.provenance.n_samples, **n}, task_hashes={}, manifest=manifest)


def _snippets(runs: list[RunResults]) -> dict:
    out: dict = {}
    for r in runs:
        for key, items in r.snippets.items():
            out.setdefault(key, {}).update(items)
    return out
