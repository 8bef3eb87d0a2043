"""Pair two runs, test every (task, filter, metric), correct for multiplicity, decide.

Pure: takes ``RunResults`` in, gives an ``Outcome`` out. The only I/O is ``attach_snippets``,
which reads the text of the few items the report shows, after the statistics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from statistics import NormalDist

import numpy as np

from gatekeeper.compare import stats
from gatekeeper.compare.compat import Difference, check_compatible, pair_series
from gatekeeper.compare.stats.mcnemar import mde as mcnemar_mde
from gatekeeper.errors import GateError
from gatekeeper.model import RunResults, SeriesKey
from gatekeeper.results import snippets
from gatekeeper.results.metrics import kind_named
from gatekeeper.suite.policy import Policy

POWER = 0.8


@dataclass
class Comparison:
    """The outcome for one (task, filter, metric).

    ``level`` is the one-sided level the decision tested this comparison at (alpha split by the
    multiplicity correction: ``p`` < ``level`` exactly when ``p_adjusted`` < alpha), and
    ``interval`` the two-sided interval for delta at confidence 1 - 2 * level: its drop-side
    end is the one-sided bound the decision agrees with. ``rounded``: items whose difference
    was within the rounding floor and counted as none.
    """

    key: SeriesKey
    gated: bool
    margin: float
    higher_is_better: bool
    test: stats.PairedTest
    p_adjusted: float | None  # None when informational
    verdict: str
    mde: float
    right_to_wrong: list[int] = field(default_factory=list)
    level: float = 0.05
    interval: tuple[float, float] = (0.0, 0.0)
    p_value: float | None = None  # the p-value the decision used (noninferiority: vs the margin)
    rounded: int = 0
    within_rounding: bool = False  # the aggregate moved by no more than rounding

    @property
    def drop(self) -> float:
        """How much worse the candidate is, in metric units (negative: it got better)."""
        return -self.test.delta if self.higher_is_better else self.test.delta

    @property
    def drop_bounds(self) -> tuple[float, float]:
        """(lower, upper) bound on the drop from ``interval``."""
        lo, hi = self.interval
        return (-hi, -lo) if self.higher_is_better else (lo, hi)


@dataclass
class Outcome:
    verdict: str  # "pass" | "fail"
    comparisons: list[Comparison]
    regressions: list[Comparison]
    differences: list[Difference]
    warnings: list[str]
    baseline: RunResults
    candidate: RunResults
    policy: Policy
    suite: str | None = None
    notes: list[str] = field(default_factory=list)  # how the inputs were read (newest of 3 runs, ...)

    @property
    def inconclusive(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.gated and c.verdict == "inconclusive"]

    @property
    def exit_code(self) -> int:
        return 1 if self.verdict == "fail" else 0


def merge_repeats(runs: list[RunResults]) -> RunResults:
    """Average several runs of one model (seeds, repeated sampling) item by item.

    Tests then see one value per item: the variance that matters for "would other prompts
    agree" is across items, and averaging first removes decoding noise without
    double-counting items. Each kind decides (``MetricKind.average``): mean metrics average the
    per-item value; ratio metrics average the log-likelihood (the counts are the same text).
    Texts and labels (corpus, confusion) cannot be averaged per item, so the first run's
    outputs are kept and a note says so.
    """
    if len(runs) == 1:
        return runs[0]
    first = runs[0]
    merged = {}
    notes = list(first.notes) + [f"averaged {len(runs)} runs per item: " + ", ".join(r.provenance.source for r in runs)]
    for key, s in first.series.items():
        others = []
        for r in runs[1:]:
            o = r.series.get(key)
            if o is None:
                raise GateError(f"{r.provenance.source}: {key} missing; repeated runs must measure the same metrics")
            base, cand, _ = pair_series(s, o, where=f"task {key.task} ({key.metric},{key.filter}), repeated run")
            others.append(cand)
        averaged = kind_named(s.kind).average(np.stack([s.values, *others]))
        if averaged is None:
            notes.append(f"{key}: {s.aggregation} items cannot be averaged; the first run's outputs are used")
            merged[key] = s
            continue
        merged[key] = replace(s, values=averaged)
    return replace(first, series=merged, notes=notes)


def attach_snippets(outcome: Outcome, per_metric: int = 5) -> None:
    """Read prompt/output snippets for the few right-to-wrong items the report shows.

    Done after the statistics, and only for those items, because reading every item's text
    would double the cost of loading a large run.
    """
    wanted: dict[tuple[str, str], set[int]] = {}
    for c in outcome.comparisons:
        if c.gated and c.right_to_wrong and c.verdict in ("regressed", "inconclusive"):
            wanted.setdefault((c.key.task, c.key.filter), set()).update(c.right_to_wrong[:per_metric])
    if wanted:
        for run in (outcome.baseline, outcome.candidate):
            snippets.attach_snippets(run, wanted)


def _parents(run: RunResults, task: str) -> tuple[str, ...]:
    return tuple(sorted(g for g, subs in run.group_subtasks.items() if task in subs))


# Float slack for "beyond the margin": a drop of exactly 10 items of 200 against a margin of 0.05
# computes as 0.05000000000000002 about half the time (measured: 46%), so without it rounding
# decides whether a drop at the margin fails.
MARGIN_SLACK = 1e-9


def _verdict(drop: float, bounds: tuple[float, float], margin: float, p: float, alpha: float,
             within_rounding: bool, scale: float = 1.0) -> str:
    """Work in "drop" units (positive = candidate worse), whatever the metric's direction.

    ``bounds`` is the interval on the drop at the level the decision used (see
    ``_decision_interval``), so the label and the interval shown agree: regressed needs the
    test to reject (adjusted p < alpha) and the interval's lower end above 0; an interval whose
    lower end is above the margin is always regressed. ``scale``: the scores' magnitude, for
    the float slack of "beyond the margin".
    """
    low, high = bounds
    beyond = margin + MARGIN_SLACK * max(scale, margin) + 1e-12
    if within_rounding:
        return "unchanged"  # the aggregate moved by no more than floating-point noise
    if p < alpha and low > 0 and (drop > beyond or low > beyond):
        return "regressed"
    if high < 0:
        return "improved"  # the whole interval is on the better side
    if high > beyond or not math.isfinite(high):
        return "inconclusive"  # a drop larger than the margin is not ruled out (NaN: nothing is)
    return "unchanged"


def _decision_interval(test: stats.PairedTest, hib: bool, level: float, rejected: bool,
                       null_drop: float) -> tuple[float, float]:
    """The interval for delta at confidence 1 - 2 * level, made to agree with the test.

    The test (permutation / McNemar) and the interval (bootstrap / Newcombe) are different
    procedures; at the boundary one can reject what the other does not. When the test did not
    reject the null drop (0, or the margin in noninferiority mode), the null is kept inside the
    interval's drop-side end: the union of two valid confidence sets is still valid (wider),
    and the decision's error rate stays the test's own (allowing "either" instead measured a
    suite false-alarm rate of 0.07 at alpha 0.05).
    """
    lo, hi = test.interval_at(1 - 2 * level)
    drop_low = -hi if hib else lo
    if not rejected and drop_low > null_drop:
        drop_low = null_drop
    return (lo, -drop_low) if hib else (drop_low, hi)


def _mde(test: stats.PairedTest, margin: float, alpha: float, aggregation: str = "mean",
         binary: bool = False, shifted: bool = False) -> float:
    """Smallest true drop this rule flags with 80% power (margin and multiplicity included).

    McNemar: exact, by summing over the binomial counts (``stats.mcnemar.mde``): the share of
    items that flipped either way is the harmless flip rate, and a true drop d adds d
    right-to-wrong flips on top. With no flips at all it is the drop that takes a handful of
    items to reach significance. Other tests, normal approximation: the bootstrap's spread for
    the estimate, the permutation spread plus the d^2 a shift adds per unit for the test.
    NaN when no item differed on a non-0/1 metric: the data say nothing about the spread of
    a real change.
    """
    n = test.n
    if test.counts is not None and shifted:  # Newcombe inverted at the margin: Wald-like spread
        pi = (test.counts[1] + test.counts[2]) / n

        def spread(d: float) -> float:
            return math.sqrt(max(0.0, pi + d - d * d) / n)

        return stats.mde_for_rule(margin, alpha, spread, spread, POWER, shifted=True)
    if test.counts is not None:
        return mcnemar_mde(n, (test.counts[1] + test.counts[2]) / n, margin, alpha, POWER)
    if test.identical or test.se == 0:
        return math.nan
    m = test.units
    if shifted:  # the bootstrap tests against the margin: its own spread is the test's
        test = replace(test, se_null=test.se)
    # A perplexity is exp(mean loss): a drop d multiplies it by (ppl + d) / ppl, and its
    # spread with it (measured: the rule's power fell to 0.73 without this at d = 12% of ppl).
    level = abs(test.baseline) if aggregation in ("weighted_perplexity", "perplexity") else math.inf
    if not level > 0:
        level = math.inf
    # Right/wrong items tested by clusters: as for McNemar, a true drop d adds d flipped items
    # per item, independent noise of variance d / n on top of the observed (clustered) spread
    # (measured: power 0.73 at the MDE without it, 0.87 scaling the whole spread instead).
    extra = (1.0 / test.n) if binary else 0.0

    def grow(d: float) -> float:
        return 1.0 + d / level

    return stats.mde_for_rule(
        margin, alpha,
        se_null=lambda d: math.sqrt(test.se_null**2 + d * extra + d * d / m) * grow(d),
        se_alt=lambda d: math.sqrt(test.se**2 + d * extra) * grow(d),
        power=POWER,
        shifted=shifted,
    )


def _resolution_warnings(c: Comparison, alpha: float) -> list[str]:
    """Warn when the margin is below what the items can resolve: below one item (0/1 metrics),
    or below the smallest drop that can be significant at all (z * the test's null spread), in
    which case the test, not the margin, decides what fails. Margin 0 is a deliberate "any
    significant drop" and is not warned about."""
    t = c.test
    if not c.gated or c.margin <= 0 or c.verdict == "regressed":  # a clear regression had power
        return []
    if t.counts is not None and c.margin < 1 / t.n:
        return [
            f"{c.key}: margin {c.margin:.4g} is below one item (1/{t.n} = {1 / t.n:.4g}): any single "
            "right-to-wrong item exceeds it; set a margin of a few items or more"
        ]
    critical = NormalDist().inv_cdf(1 - alpha) * t.se_null
    if critical > c.margin:
        return [
            f"{c.key}: margin {c.margin:.4g} is below what {t.units} items can resolve: only a drop "
            f"above {critical:.4g} can be significant (mde {c.mde:.4g}); add items or widen the margin"
        ]
    return []


@dataclass
class _Tested:
    """One series after its paired test, before the correction across the suite."""

    key: SeriesKey
    gated: bool
    margin: float
    higher_is_better: bool
    test: stats.PairedTest
    p: float  # the p-value the decision uses (noninferiority: against the margin)
    rounded: int
    aggregation: str
    binary: bool
    right_to_wrong: list[int]


def _decide(t: _Tested, p_adjusted: float | None, level: float, per_alpha: float, policy: Policy) -> Comparison:
    """Verdict, the interval it agrees with, and the MDE for one tested series."""
    test = t.test
    decision_p = p_adjusted if p_adjusted is not None else t.p
    noninferiority = policy.test == "noninferiority"
    interval = _decision_interval(test, t.higher_is_better, level, decision_p < policy.alpha,
                                  t.margin if noninferiority else 0.0)
    floor = stats.within_floor(test.delta, test.baseline, test.candidate, policy.rounding)
    c = Comparison(t.key, t.gated, t.margin, t.higher_is_better, test, p_adjusted, "", math.nan,
                   t.right_to_wrong, level, interval, t.p, t.rounded, floor)
    c.verdict = _verdict(c.drop, c.drop_bounds, t.margin, decision_p, policy.alpha, floor,
                         max(abs(test.baseline), abs(test.candidate)))
    c.mde = _mde(test, t.margin, per_alpha, t.aggregation, t.binary, noninferiority)
    return c


def _binary_pair(base: np.ndarray, cand: np.ndarray) -> bool:
    return base.ndim == 1 and base.dtype != object and bool(np.isin(base, (0.0, 1.0)).all() and np.isin(cand, (0.0, 1.0)).all())


def _right_to_wrong(base: np.ndarray, cand: np.ndarray, doc_ids: np.ndarray, hib: bool) -> list[int]:
    if base.ndim == 2 and base.shape[1] == 2 and base.dtype.kind in "iu":  # [gold, pred] labels (f1, mcc)
        return [int(d) for d in doc_ids[(base[:, 0] == base[:, 1]) & (cand[:, 0] != cand[:, 1])]]
    if base.ndim != 1 or base.dtype == object or not np.isin(base, (0.0, 1.0)).all() or not np.isin(cand, (0.0, 1.0)).all():
        return []
    good, bad = (1.0, 0.0) if hib else (0.0, 1.0)
    return [int(d) for d in doc_ids[(base == good) & (cand == bad)]]


def _refuse_gated_untestable(candidate: RunResults, policy: Policy) -> None:
    """A gated metric that cannot be tested would silently pass: refuse it (fail closed)."""
    gated = [(key, agg) for key, agg in sorted(candidate.untestable.items(), key=lambda kv: str(kv[0]))
             if policy.lookup(key, _parents(candidate, key.task))[1]]
    if gated:
        (key, agg), more = gated[0], len(gated) - 1
        if agg.startswith("!function "):
            raise GateError(
                f"{candidate.provenance.source}: {key} is gated but its aggregation {agg!r} is the task's own "
                f"code, which gatekeeper never runs from a results file{f' (and {more} more)' if more else ''}; "
                f"pass --suite SUITE whose include_path (or lm-eval's bundled tasks) provides task {key.task}, "
                f"or mark it informational (metrics: [{{metric: {key.metric}, gate: false}}])"
            )
        raise GateError(
            f"{candidate.provenance.source}: {key} is gated but its aggregation {agg!r} cannot be tested "
            f"by gatekeeper{f' (and {more} more)' if more else ''}; mark it informational "
            f"(metrics: [{{metric: {key.metric}, gate: false}}]) or drop it from the suite"
        )


def compare_runs(
    baseline: RunResults,
    candidate: RunResults,
    policy: Policy,
    *,
    suite: str | None = None,
    seed: int = 0,
) -> Outcome:
    """Compare every series present in both runs. Raises GateError when they are not comparable."""
    differences = check_compatible(baseline, candidate)
    errors = [d.message for d in differences if d.severity == "error"]
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise GateError(f"runs are not comparable: {errors[0]}{more}; all: " + "; ".join(errors))

    _refuse_gated_untestable(candidate, policy)
    warnings: list[str] = []
    tested: list[_Tested] = []
    for key in sorted(baseline.series, key=str):
        b_series, c_series = baseline.series[key], candidate.series[key]
        base, cand, clusters = pair_series(b_series, c_series, where=f"task {key.task} ({key.metric},{key.filter})")
        margin, gated = policy.lookup(key, _parents(candidate, key.task))
        cand, rounded = stats.snap_rounding(b_series.kind, base, cand, policy.rounding)
        try:
            test = stats.paired_test(
                b_series.kind,
                b_series.aggregation,
                base,
                cand,
                higher_is_better=b_series.higher_is_better,
                clusters=clusters,
                confidence=1 - policy.alpha,
                n_resamples=policy.resamples,
                seed=seed,
            )
        except ValueError as exc:  # NaN, empty, bad clusters: the input is wrong, not the gate
            src = f"{baseline.provenance.source} vs {candidate.provenance.source}"
            raise GateError(f"{src}: {key}: {exc}") from None
        warnings.extend(f"{key}: {w}" for w in test.warnings)
        hib = b_series.higher_is_better
        # noninferiority: H0 "the drop is at most the margin"; superiority: H0 "no drop".
        p = test.p_drop_above(margin, hib) if policy.test == "noninferiority" else test.p_worse
        tested.append(_Tested(key, gated, margin, hib, test, p, rounded, b_series.aggregation,
                              _binary_pair(base, cand), _right_to_wrong(base, cand, b_series.doc_ids, hib)))

    gated_idx = [i for i, t in enumerate(tested) if t.gated]
    raw = np.array([tested[i].p for i in gated_idx])
    adjusted = dict(zip(gated_idx, stats.adjust_pvalues(raw, policy.correction).tolist(), strict=True))
    levels = dict(zip(gated_idx, stats.decision_levels(raw, policy.correction, policy.alpha).tolist(), strict=True))
    # MDE at the per-comparison alpha a Bonferroni split would give: Holm is never stricter.
    per_alpha = policy.alpha / max(1, len(gated_idx)) if policy.correction != "none" else policy.alpha

    comparisons = [_decide(t, adjusted.get(i), levels.get(i, policy.alpha), per_alpha, policy)
                   for i, t in enumerate(tested)]
    for c in comparisons:
        warnings.extend(_resolution_warnings(c, per_alpha))
    notes_rounding = [
        f"{c.key}: {c.rounded} of {c.test.n} items differed only by rounding "
        f"(<= {policy.rounding:g} relative) and count as unchanged"
        for c in comparisons if c.rounded
    ]

    regressions = [c for c in comparisons if c.gated and c.verdict == "regressed"]
    if not gated_idx:
        warnings.append("no comparison is gated: the policy marks every metric informational")
    context = [d for d in differences if d.severity != "error"]
    return Outcome(
        verdict="fail" if regressions else "pass",
        comparisons=comparisons,
        regressions=regressions,
        differences=context,
        warnings=warnings,
        baseline=baseline,
        candidate=candidate,
        policy=policy,
        suite=suite,
        notes=[f"baseline: {n}" for n in baseline.notes] + [f"candidate: {n}" for n in candidate.notes]
        + notes_rounding + [f"{key}: not tested (aggregation {agg}; informational)" for key, agg in sorted(
            candidate.untestable.items(), key=lambda kv: str(kv[0]))],
    )
