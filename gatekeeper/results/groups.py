"""lm-eval groups as gated quantities: which items a group's aggregate is made of, and with what weight.

lm-eval 0.4.13 (``lm_eval.api.group.Group.aggregate``) scores a group with an
``aggregate_metric_list`` over **all its leaf tasks**, nested groups flattened:

- ``weight_by_size: true``: ``sum(leaf score × leaf size) / sum(sizes)``, for a mean metric the
  mean over every item of every leaf;
- ``weight_by_size: false``: the plain mean of the leaf scores.

results.json does not record the weighting. It comes from the run's manifest (``gatekeeper run``
records each group's aggregate list as lm-eval built it), else it is derived: the weighting whose
value, recomputed from the items, equals the reported aggregate. A reported group value that no
weighting reproduces, a group whose leaf is missing, a leaf whose metric is not a per-item mean
(perplexities, corpus scores: their group mean is not an item mean), are named.

``pooled`` turns one group metric into a ``MetricSeries`` over the group's items, whose plain mean
is the group's score: size-weighted items keep their values (right/wrong items stay right/wrong,
so the comparison is a pooled McNemar test); unweighted ones are scaled by ``N / (T × n_t)``, so
the resampling tests weigh each leaf equally. Document ids become ``leaf index × 2**32 + doc id``.
Pure functions on ``RunResults``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from gatekeeper.errors import GateError
from gatekeeper.model import MetricSeries, RunResults, Sample, SeriesKey

_LEAF_SHIFT = np.int64(1) << np.int64(32)
_NO_HASHES = np.array([["", "", ""]], dtype="S1")
# Reported (float) aggregates and the ones recomputed from items: a sum in another order.
_REL_TOL = 1e-9
_ABS_TOL = 1e-12


@dataclass(frozen=True)
class GroupMetric:
    """One gated quantity of a group: ``metric,filter`` over ``leaves`` with lm-eval's weighting."""

    group: str
    metric: str
    filter: str
    weight_by_size: bool
    leaves: tuple[str, ...]

    @property
    def key(self) -> SeriesKey:
        return SeriesKey(self.group, self.filter, self.metric)

    @property
    def leaf_keys(self) -> list[SeriesKey]:
        return [SeriesKey(t, self.filter, self.metric) for t in self.leaves]


def group_metrics(run: RunResults) -> tuple[list[GroupMetric], list[str]]:
    """Every group metric of ``run`` that has an aggregate, and notes for the groups that are
    informational (no ``aggregate_metric_list``, or leaves of a kind a group mean cannot pool)."""
    specs = _specs(run)
    out: list[GroupMetric] = []
    notes: list[str] = []
    tasks = {k.task for k in run.series} | {k.task for k in run.untestable}
    for name in sorted(set(run.group_subtasks) | set(specs)):
        if name in tasks or not (run.group_subtasks.get(name) or name in specs):
            continue  # a leaf task (some writers list every task, with no subtasks)
        leaves = leaves_of(run, name)
        spec = specs.get(name)
        if spec is None:
            reported = run.groups.get(name) or {}
            if not reported:
                notes.append(f"group {name}: no aggregate_metric_list, so lm-eval reports no group score; "
                             "its subtasks are tested, the group is not")
                continue
            found, skipped = _derived(run, name, leaves, reported)
        else:
            found, skipped = _from_spec(run, name, leaves, spec)
        out.extend(found)
        notes.extend(skipped)
    return out, notes


def leaves_of(run: RunResults, group: str, _seen: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The leaf tasks of ``group``, nested groups flattened, in lm-eval's order."""
    if group in _seen:
        raise GateError(f"{run.provenance.source}: group {group} contains itself (group_subtasks loops)")
    out: list[str] = []
    for child in run.group_subtasks.get(group, []):
        if run.group_subtasks.get(child):  # a group (a task may be listed with no subtasks)
            out.extend(leaves_of(run, child, (*_seen, group)))
        else:
            out.append(child)
    spec = _specs(run).get(group)
    if not out and spec is not None:
        out = [str(t) for t in spec.get("leaves") or []]
    return tuple(dict.fromkeys(out))


def pooled(run: RunResults, gm: GroupMetric) -> MetricSeries:
    """The group metric as one series over all its items; its plain mean is lm-eval's group score."""
    parts = [_leaf(run, gm, leaf) for leaf in gm.leaves]
    parts = [(i, s) for i, s in enumerate(parts) if s is not None]
    first = parts[0][1]
    total = sum(s.n for _, s in parts)
    values = []
    for _, s in parts:
        v = np.asarray(s.values, dtype=np.float64)
        values.append(v if gm.weight_by_size else v * (total / (len(parts) * s.n)))
    clustered = any(s.clusters is not None for _, s in parts)
    clusters = None
    if clustered:
        clusters = np.concatenate([
            np.char.add(f"{s.key.task}:", (s.clusters if s.clusters is not None else s.doc_ids).astype(str))
            for _, s in parts]).astype(object)
    return MetricSeries(
        key=gm.key, kind="mean", aggregation="mean", higher_is_better=first.higher_is_better,
        sample=_pooled_sample(gm, [s for _, s in parts]),
        doc_ids=np.concatenate([i * _LEAF_SHIFT + s.doc_ids.astype(np.int64) for i, s in parts]),
        # No item hashes: each subtask's items are paired and their hashes checked in its own row;
        # copying 3 hex strings per item for every level of nesting would triple the memory.
        values=np.concatenate(values), hashes=np.broadcast_to(_NO_HASHES, (total, 3)),
        reported=(run.groups.get(gm.group) or {}).get(f"{gm.metric},{gm.filter}"), clusters=clusters)


def _pooled_sample(gm: GroupMetric, parts: list[MetricSeries]) -> Sample | None:
    """What the group's items stand for where an informative design read its subtasks: each
    item's own weight over every subtask's items (the pooled mean is then the group's size-weighted
    score). A group of unweighted subtask means scales each subtask's items by its size, which a
    sample's weights would have to carry too: not yet, so that is an error."""
    if all(s.sample is None for s in parts):
        return None
    if not gm.weight_by_size:
        raise GateError(f"group {gm.group}: an informative read of its subtasks cannot be weighted exactly for a "
                        "group that averages its subtasks' scores (weight_by_size: false); gate it with --items uniform")
    samples = [s.sample or Sample(np.ones(s.n), s.n) for s in parts]
    return Sample(np.concatenate([x.weights for x in samples]), sum(x.total for x in samples))


def value(run: RunResults, gm: GroupMetric) -> float:
    """The group's score recomputed from the items, as lm-eval computes it from the leaf scores."""
    scores, sizes = [], []
    for leaf in gm.leaves:
        s = _leaf(run, gm, leaf)
        if s is not None:
            scores.append(float(np.mean(np.asarray(s.values, dtype=np.float64))))
            sizes.append(s.n)
    weights = sizes if gm.weight_by_size else [1] * len(sizes)
    return sum(v * w for v, w in zip(scores, weights, strict=True)) / sum(weights)


def check_reported(run: RunResults, metrics: list[GroupMetric]) -> None:
    """Each reported group score equals the one recomputed from the items (lm-eval's own value in
    every report); a group that does not reproduce is an error naming it."""
    for gm in metrics:
        reported = (run.groups.get(gm.group) or {}).get(f"{gm.metric},{gm.filter}")
        if reported is None or not run.series:
            continue
        mine = value(run, gm)
        if not math.isclose(mine, reported, rel_tol=_REL_TOL, abs_tol=_ABS_TOL):
            how = "weighted by size" if gm.weight_by_size else "unweighted"
            raise GateError(f"{run.provenance.source}: group {gm.group}: {gm.metric},{gm.filter} is reported as "
                            f"{reported!r}, but its subtasks' items give {mine!r} ({how}); the results file was "
                            "edited, or its subtasks are not the group's")


# ----------------------------------------------------------------------------- where the weighting comes from


def _specs(run: RunResults) -> dict[str, dict[str, Any]]:
    """The groups' aggregate lists as the run's manifest records them ({} when it does not)."""
    manifest = run.provenance.manifest or {}
    specs = manifest.get("groups")
    if specs is None:
        part = manifest.get("shard") or manifest.get("look") or {}
        specs = part.get("groups") if isinstance(part, dict) else None
    if not isinstance(specs, dict):
        return {}
    return {str(k): v for k, v in specs.items() if isinstance(v, dict)}


def _from_spec(run: RunResults, name: str, leaves: tuple[str, ...],
               spec: dict[str, Any]) -> tuple[list[GroupMetric], list[str]]:
    aggregates = spec.get("aggregate") or []
    if not isinstance(aggregates, list):
        raise GateError(f"{run.provenance.source}: manifest groups.{name}.aggregate is not a list")
    recorded = spec.get("leaves")
    if isinstance(recorded, list) and run.group_subtasks.get(name) and set(map(str, recorded)) != set(leaves):
        raise GateError(f"{run.provenance.source}: group {name}: the run's manifest lists subtasks "
                        f"{sorted(map(str, recorded))[:5]}, results.json's group_subtasks {sorted(leaves)[:5]}; "
                        "the two disagree (edited, or files of two runs mixed)")
    if not aggregates:
        return [], [f"group {name}: no aggregate_metric_list, so lm-eval reports no group score; "
                    "its subtasks are tested, the group is not"]
    _check_leaves(run, name, leaves)
    out, notes = [], []
    for agg in aggregates:
        if not isinstance(agg, dict) or not isinstance(agg.get("metric"), str):
            raise GateError(f"{run.provenance.source}: manifest groups.{name}.aggregate has an entry without a metric")
        if agg.get("aggregation", "mean") != "mean":
            notes.append(f"group {name}: aggregation {agg.get('aggregation')} of {agg['metric']} is not a mean; "
                         "informational")
            continue
        filters = agg.get("filter_list") or sorted({k.filter for k in run.series
                                                    if k.task in leaves and k.metric == agg["metric"]})
        for filt in filters:
            gm = _reporting(run, GroupMetric(name, agg["metric"], str(filt), bool(agg.get("weight_by_size", True)),
                                             leaves))
            problem = _poolable(run, gm)
            if problem:
                notes.append(problem)
            elif gm.leaves:
                out.append(gm)
    return out, notes


def _derived(run: RunResults, name: str, leaves: tuple[str, ...],
             reported: dict[str, float]) -> tuple[list[GroupMetric], list[str]]:
    """No manifest: the weighting whose recomputed value is the reported one."""
    _check_leaves(run, name, leaves)
    out, notes = [], []
    for mf, score in sorted(reported.items()):
        metric, _, filt = mf.partition(",")
        weighted = _reporting(run, GroupMetric(name, metric, filt, True, leaves))
        problem = _poolable(run, weighted)
        if problem:
            notes.append(problem)
            continue
        if not weighted.leaves:
            raise GateError(f"{run.provenance.source}: group {name} reports {mf}, which none of its subtasks has")
        fits = [gm for gm in (weighted, replace(weighted, weight_by_size=False))
                if math.isclose(value(run, gm), score, rel_tol=_REL_TOL, abs_tol=_ABS_TOL)]
        if not fits:
            raise GateError(f"{run.provenance.source}: group {name}: {mf} is reported as {score!r}, which neither "
                            f"weighting of its subtasks' items reproduces (by size {value(run, weighted)!r}, "
                            f"unweighted {value(run, replace(weighted, weight_by_size=False))!r}); edited, or "
                            "not lm-eval's group score")
        sizes = {s.n for leaf in leaves if (s := _leaf(run, weighted, leaf)) is not None}
        if len(fits) == 2 and len(sizes) > 1:
            raise GateError(f"{run.provenance.source}: group {name}: {mf} is reproduced both weighted by size and "
                            "unweighted, and their tests differ; gate with --suite so the group's YAML says which")
        out.append(fits[0])
    return out, notes


def _reporting(run: RunResults, gm: GroupMetric) -> GroupMetric:
    """``gm`` over the leaves that report its metric (lm-eval aggregates over those, and warns)."""
    return replace(gm, leaves=tuple(t for t in gm.leaves if _leaf(run, gm, t) is not None))


def _check_leaves(run: RunResults, name: str, leaves: tuple[str, ...]) -> None:
    tasks = {k.task for k in run.series} | {k.task for k in run.untestable}
    missing = [t for t in leaves if t not in tasks]
    if missing:
        raise GateError(f"{run.provenance.source}: group {name} lists subtask {missing[0]}, which is not in the run"
                        f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; evaluate the whole group")


def _poolable(run: RunResults, gm: GroupMetric) -> str | None:
    for leaf in gm.leaves:
        s = run.series.get(SeriesKey(leaf, gm.filter, gm.metric))
        if s is not None and s.kind != "mean":
            return (f"group {gm.group}: {gm.metric},{gm.filter} is a {s.aggregation} score in {leaf}, whose group mean "
                    "is not a mean of items; its subtasks are tested, the group is informational")
    return None


def _leaf(run: RunResults, gm: GroupMetric, leaf: str) -> MetricSeries | None:
    s = run.series.get(SeriesKey(leaf, gm.filter, gm.metric))
    return s if s is not None and s.n > 0 else None
