"""Group gating (issue #24), proven by fixed-seed simulation through the real comparison
(``compare_runs``: the group's pooled test, its subtasks' tests and one Holm family), against the
gate without group rows on the same data.

An MMLU-like group: 57 right/wrong subtasks of 100 to 449 items (about 250 on average, 14k in
all), accuracies between 0.3 and 0.9, 4% of items changing between two harmless runs in both
directions (as a reordered batch or another kernel does)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from gatekeeper.compare.compare import compare_runs
from gatekeeper.errors import GateError
from gatekeeper.model import RunResults
from gatekeeper.suite.policy import Policy
from tests.synthetic import fast_series, run

N_TASKS = 57
FLIP = 0.04
ALPHA = 0.05


def _sizes(rng: np.random.Generator) -> np.ndarray:
    return rng.integers(100, 450, N_TASKS)


def _pair(rng: np.random.Generator, sizes: np.ndarray, drops: np.ndarray, *, weighted: bool = True
          ) -> tuple[RunResults, RunResults]:
    """(baseline, candidate) runs of the group; subtask t loses ``drops[t]`` accuracy on average."""
    acc = rng.uniform(0.3, 0.9, N_TASKS)
    base, cand = [], []
    for t, (n, p, d) in enumerate(zip(sizes, acc, drops, strict=True)):
        b = (rng.random(n) < p).astype(float)
        u = rng.random(n)
        # symmetric churn: as many right->wrong as wrong->right in expectation, plus the drop
        breaks = (b == 1) & (u < FLIP * (1 - p) + d / p)
        fixes = (b == 0) & (u < FLIP * p)
        c = np.where(breaks, 0.0, np.where(fixes, 1.0, b))
        for values, side in ((b, base), (c, cand)):
            series = fast_series(f"sub{t:02d}", values)
            side.append(replace(series, key=replace(series.key, metric="acc")))
    return _grouped(run(*base, name="base"), weighted), _grouped(run(*cand, name="cand"), weighted)


def _grouped(r: RunResults, weighted: bool) -> RunResults:
    leaves = sorted(r.tasks)
    manifest = {"groups": {"mmlu": {"leaves": leaves, "aggregate": [
        {"metric": "acc", "filter_list": ["none"], "weight_by_size": weighted, "aggregation": "mean"}]}}}
    return replace(r, group_subtasks={"mmlu": leaves}, provenance=replace(r.provenance, manifest=manifest))


def _ungrouped(r: RunResults) -> RunResults:
    return replace(r, group_subtasks={}, provenance=replace(r.provenance, manifest={}))


def _fails(base: RunResults, cand: RunResults) -> bool:
    return compare_runs(base, cand, Policy(alpha=ALPHA)).verdict == "fail"


def _allowance(rate: float, n: int) -> float:
    return rate + 2 * math.sqrt(rate * (1 - rate) / n)


def test_harmless_changes_keep_the_false_alarm_rate_at_alpha() -> None:
    rng = np.random.default_rng(2401)
    sims = 150
    sizes = _sizes(rng)  # a group's subjects keep their sizes from gate to gate, as MMLU's do
    alarms = sum(_fails(*_pair(rng, sizes, np.zeros(N_TASKS))) for _ in range(sims))
    assert alarms / sims <= _allowance(ALPHA, sims), alarms


def test_a_one_point_drop_on_every_subtask_fails_the_group() -> None:
    """Today's per-subtask gate passes it nearly always; the group's pooled McNemar test catches it."""
    rng = np.random.default_rng(2402)
    sims = 40
    caught = today = 0
    for _ in range(sims):
        base, cand = _pair(rng, _sizes(rng), np.full(N_TASKS, 0.01))
        outcome = compare_runs(base, cand, Policy(alpha=ALPHA))
        caught += outcome.verdict == "fail"
        today += _fails(_ungrouped(base), _ungrouped(cand))
        if outcome.verdict == "fail":
            assert [c.key.task for c in outcome.regressions][0] == "mmlu"
    assert caught / sims >= 0.9, (caught, today)
    assert today / sims <= 0.3, (caught, today)


def test_large_drops_on_three_subtasks_are_caught_as_often_as_before() -> None:
    rng = np.random.default_rng(2403)
    sims = 40
    caught = today = 0
    for _ in range(sims):
        drops = np.zeros(N_TASKS)
        drops[rng.choice(N_TASKS, 3, replace=False)] = 0.08
        base, cand = _pair(rng, _sizes(rng), drops)
        caught += _fails(base, cand)
        today += _fails(_ungrouped(base), _ungrouped(cand))
    assert caught >= today and caught == sims, (caught, today)


def test_an_unweighted_group_is_tested_on_the_mean_of_its_subtask_means() -> None:
    rng = np.random.default_rng(2404)
    sizes = _sizes(rng)
    base, cand = _pair(rng, sizes, np.full(N_TASKS, 0.015), weighted=False)
    outcome = compare_runs(base, cand, Policy(alpha=ALPHA))
    row = next(c for c in outcome.comparisons if c.key.task == "mmlu")
    means = [float(np.mean(base.series[k].values)) for k in sorted(base.series, key=str)]
    assert row.test.baseline == pytest.approx(np.mean(means), rel=1e-12)
    assert row.weight_by_size is False and row.test.test != "mcnemar-midp"  # a resampling test
    assert row.verdict == "regressed"


def test_a_group_whose_reported_score_does_not_reproduce_is_named() -> None:
    rng = np.random.default_rng(2405)
    base, cand = _pair(rng, _sizes(rng), np.zeros(N_TASKS))
    cand = replace(cand, groups={"mmlu": {"acc,none": 0.123}})
    with pytest.raises(GateError, match=r"group mmlu: acc,none is reported as 0.123, but its subtasks' items give"):
        compare_runs(base, cand, Policy(alpha=ALPHA))
    missing = _grouped(replace(cand, groups={}), True)
    leaves = [*sorted(cand.tasks), "sub99"]
    manifest = {"groups": {"mmlu": {**missing.provenance.manifest["groups"]["mmlu"], "leaves": leaves}}}
    missing = replace(missing, group_subtasks={"mmlu": leaves},
                      provenance=replace(missing.provenance, manifest=manifest))
    with pytest.raises(GateError, match=r"group mmlu lists subtask sub99, which is not in the run"):
        compare_runs(base, missing, Policy(alpha=ALPHA))


def test_a_subtask_list_that_disagrees_between_manifest_and_results_is_named() -> None:
    rng = np.random.default_rng(2406)
    base, cand = _pair(rng, _sizes(rng), np.zeros(N_TASKS))
    leaves = sorted(cand.tasks)
    other = replace(cand, group_subtasks={"mmlu": leaves[:-1], "other": leaves[-1:]})
    with pytest.raises(GateError, match=r"group mmlu: the run's manifest lists subtasks .* the two disagree"):
        compare_runs(base, other, Policy(alpha=ALPHA))


def test_a_results_file_that_lists_every_task_as_a_group_of_none_gates_only_real_groups() -> None:
    """Some writers list every leaf in group_subtasks with no subtasks: those are tasks, not groups."""
    rng = np.random.default_rng(2407)
    base, cand = _pair(rng, _sizes(rng), np.zeros(N_TASKS))
    listed = {**{t: [] for t in cand.tasks}, **cand.group_subtasks, "outer": ["mmlu"]}
    reported = {t: {"acc,none": float(np.mean(cand.series[k].values))} for k in cand.series for t in [k.task]}
    everything = np.concatenate([cand.series[k].values for k in sorted(cand.series, key=str)])
    reported["mmlu"] = {"acc,none": float(np.mean(everything))}
    # lm-eval's own output: no manifest, so the weighting is derived from the reported score
    cand = replace(cand, group_subtasks=listed, groups=reported, provenance=replace(cand.provenance, manifest={}))
    rows = [c for c in compare_runs(base, cand, Policy(alpha=ALPHA)).comparisons if c.is_group]
    assert [c.key.task for c in rows] == ["mmlu"]  # "outer" has no aggregate: informational
