"""Margins that switch a gate off: at or beyond what a metric can lose, it can never fail.

A margin is a drop in the metric's own units. ``margin: 2`` on accuracy, meant as two points,
accepts any drop at all (accuracy cannot fall by more than 1), and the gate reads "unchanged"
over a collapse. So a gated margin at or beyond the metric's range is an error, named by the line
it was written on, checked on the baseline alone (``unreachable``: before the model runs in
``gate``, and in every compare); one that only the baseline's score puts out of reach (a task the
model scores 0 on) is a warning. After the tests, a margin that leaves no detectable drop (MDE
infinite) is an error too, and an MDE above half the metric's range a warning (``after_tests``).
"""

from __future__ import annotations

import math

from gatekeeper.compare.outcome import Comparison
from gatekeeper.compare.verdict import Tested, mde
from gatekeeper.model import MetricSeries, RunResults, SeriesKey
from gatekeeper.results.metrics import kind_named
from gatekeeper.suite.policy import Policy


def unreachable(baseline: RunResults, policy: Policy,
                groups: dict[SeriesKey, MetricSeries] | None = None) -> tuple[list[str], list[str]]:
    """(errors, warnings) for gated margins no drop can exceed: at or beyond the metric's whole
    range (wrong units: an error), or more than the baseline's score can lose (a baseline at the
    metric's floor: a warning, since any margin is then moot and the model may grow out of it).
    ``groups``: a group metric's key → one of its leaves' series (a group score is a mean of the
    leaves' scores, so it has their range)."""
    errors: list[str] = []
    warnings: list[str] = []
    for key, series in sorted({**baseline.series, **(groups or {})}.items(), key=lambda kv: str(kv[0])):
        parents = baseline.parents(key.task)
        margin, gated = policy.lookup(key, parents, group=key not in baseline.series)
        if not gated or margin <= 0:
            continue
        problem = _beyond_range(series, margin)
        if problem:
            errors.append(f"{_source(policy, key, parents)}{key}: margin {margin:g} {problem}")
        elif key in baseline.series and (moot := _beyond_room(series, margin)):
            warnings.append(f"{key}: margin {margin:g} {moot}")
    return errors, warnings


def refusal(problems: list[str]) -> str:
    """One line for a GateError: the first problem, and how many more there are."""
    more = len(problems) - 1
    return problems[0] + (f" (and {more} more gated metric{'s' if more > 1 else ''} like it)" if more else "")


def after_tests(baseline: RunResults, tested: list[Tested], comparisons: list[Comparison],
                per_alpha: list[float], policy: Policy,
                groups: dict[SeriesKey, MetricSeries] | None = None) -> tuple[list[str], dict[SeriesKey, str]]:
    """(errors, warnings by row) from each gated comparison's MDE: infinite because of the margin
    (an error), infinite because there are too few items, or above half the metric's range."""
    errors: list[str] = []
    warnings: dict[SeriesKey, str] = {}
    series = {**baseline.series, **(groups or {})}
    for t, c, alpha in zip(tested, comparisons, per_alpha, strict=True):
        if not c.gated or c.margin <= 0 or math.isnan(c.mde) or policy.test == "non-inferiority":
            continue
        # A row that regressed showed its drop: a warning that it could not would contradict it.
        shown = c.verdict == "regressed"
        parents = baseline.parents(c.key.task)
        if math.isinf(c.mde):
            # Exact only for right/wrong items (McNemar's counts); elsewhere the MDE is a normal
            # approximation, which can read infinite at a handful of items: a warning then.
            exact = t.test.counts is not None
            without = mde(t.test, 0.0, alpha, t.aggregation, t.binary, policy.test == "inferiority")
            if exact and math.isfinite(without):
                errors.append(f"{_source(policy, c.key, parents)}{c.key}: margin {c.margin:g} leaves no drop "
                              f"that {c.test.n} items can show beyond it (the MDE is infinite; at margin 0 it "
                              f"is {without:.3g}), so this gate can never fail; margins are in the metric's "
                              "own units: lower it")
            elif shown:
                continue
            elif math.isfinite(without):
                warnings[c.key] = (f"{c.key}: margin {c.margin:g} leaves no drop {c.test.n} items can show with "
                                   f"80% power (the approximate MDE is infinite; {without:.3g} at margin 0): "
                                   "the gate fails only on a collapse; check the margin's units or add items")
            else:
                warnings[c.key] = (f"{c.key}: {c.test.n} items cannot show any drop with 80% power (MDE "
                                   "infinite): the gate fails only on a collapse; add items")
            continue
        bounds = _bounds(series[c.key])
        if not shown and bounds and math.isfinite(bounds[1] - bounds[0]) and c.mde > (bounds[1] - bounds[0]) / 2:
            warnings[c.key] = (f"{c.key}: the smallest drop this rule detects with 80% power is {c.mde:.3g}, "
                               f"over half of {c.key.metric}'s range [{bounds[0]:g}, {bounds[1]:g}]: "
                               "only a collapse fails; check the margin's units or add items")
    return errors, warnings


def _beyond_range(series: MetricSeries, margin: float) -> str | None:
    bounds = _bounds(series)
    if bounds is None or margin < bounds[1] - bounds[0]:
        return None
    return (f"is at or beyond the whole range of {series.key.metric} ([{bounds[0]:g}, {bounds[1]:g}]), so no "
            f"drop can exceed it and this gate can never fail; margins are in the metric's own units"
            f"{_hint(*bounds)}")


def _beyond_room(series: MetricSeries, margin: float) -> str | None:
    bounds = _bounds(series)
    if bounds is None:
        return None
    score = kind_named(series.kind).aggregate(series.aggregation, series.values)
    worst = bounds[0] if series.higher_is_better else bounds[1]
    if margin < abs(score - worst):
        return None
    side = "below" if series.higher_is_better else "above"
    return (f"is more than {series.key.metric} can lose from the baseline's {score:.4g} (it cannot go {side} "
            f"{worst:g}): this metric cannot fail; lower the margin, or mark it informational (gate: false)")


def _hint(lo: float, hi: float) -> str:
    if hi - lo == 100:
        return " (a 0-100 score: 2 = two points)"
    if hi - lo <= 2:
        return ", not points (0.02 = two points)"
    return ""


def _bounds(series: MetricSeries) -> tuple[float, float] | None:
    return kind_named(series.kind).bounds(series.aggregation, series.key.metric, series.values)


def _source(policy: Policy, key: SeriesKey, parents: tuple[str, ...]) -> str:
    where = policy.margin_source(key, parents)
    return f"{where}: " if where else ""

