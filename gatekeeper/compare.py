"""Pair two runs, test every (task, filter, metric), correct for multiplicity, decide.

Pure: takes ``RunResults`` in, gives an ``Outcome`` out. The only I/O is ``load_any``, the
thin front door the CLI and the action use to read either a run directory or a baseline file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from gatekeeper import stats
from gatekeeper.compat import Difference, check_compatible, pair_series
from gatekeeper.model import GateError, RunResults, SeriesKey
from gatekeeper.policy import Policy

POWER = 0.8


@dataclass
class Comparison:
    """The outcome for one (task, filter, metric)."""

    key: SeriesKey
    gated: bool
    margin: float
    higher_is_better: bool
    test: stats.PairedTest
    p_adjusted: float | None  # None when informational
    verdict: str
    mde: float
    right_to_wrong: list[int] = field(default_factory=list)

    @property
    def drop(self) -> float:
        """How much worse the candidate is, in metric units (negative: it got better)."""
        return -self.test.delta if self.higher_is_better else self.test.delta


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


def load_any(path: str | Path, *, cluster_keys: dict[str, str] | None = None) -> RunResults:
    """A baseline file (.json.gz from the store) or anything ``results.load_run`` accepts."""
    from gatekeeper import results, store

    path = Path(path)
    if path.is_file() and store.is_baseline_file(path):
        return store.load_baseline(path)
    return results.load_run(path, cluster_keys=cluster_keys)


def merge_repeats(runs: list[RunResults]) -> RunResults:
    """Average several runs of one model (seeds, repeated sampling) item by item.

    Tests then see one value per item: the variance that matters for "would other prompts
    agree" is across items, and averaging first removes decoding noise without
    double-counting items. Mean metrics average the per-item value; ratio metrics average
    the log-likelihood (the counts are the same text). Corpus metrics cannot be averaged
    per item, so the first run's outputs are kept and a note says so.
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
        if s.kind == "corpus":
            notes.append(f"{key}: corpus metric, first run's outputs used (cannot average per item)")
            merged[key] = s
            continue
        stack = np.stack([s.values, *others])
        values = stack.mean(axis=0)
        if s.kind == "ratio":
            values[:, 1] = s.values[:, 1]
        merged[key] = replace(s, values=values)
    return replace(first, series=merged, notes=notes)


def attach_snippets(outcome: Outcome, per_metric: int = 5) -> None:
    """Read prompt/output snippets for the few right-to-wrong items the report shows.

    Done after the statistics, and only for those items, because reading every item's text
    would double the cost of loading a large run.
    """
    from gatekeeper import results

    wanted: dict[tuple[str, str], set[int]] = {}
    for c in outcome.comparisons:
        if c.gated and c.right_to_wrong and c.verdict in ("regressed", "inconclusive"):
            wanted.setdefault((c.key.task, c.key.filter), set()).update(c.right_to_wrong[:per_metric])
    if wanted:
        for run in (outcome.baseline, outcome.candidate):
            results.attach_snippets(run, wanted)


def _parents(run: RunResults, task: str) -> tuple[str, ...]:
    return tuple(sorted(g for g, subs in run.group_subtasks.items() if task in subs))


def _verdict(test: stats.PairedTest, hib: bool, margin: float, p: float, alpha: float) -> str:
    # Work in "drop" units (positive = candidate worse), whatever the metric's direction.
    drop = -test.delta if hib else test.delta
    worst_drop = -test.ci_low if hib else test.ci_high  # the interval's most pessimistic end
    if drop > margin and p < alpha:
        return "regressed"
    if worst_drop < 0:
        return "improved"  # the whole interval is on the better side
    if worst_drop > margin:
        return "inconclusive"  # a drop larger than the margin is not ruled out
    return "unchanged"


def _mde(test: stats.PairedTest, alpha: float) -> float:
    """Smallest drop caught with 80% power, from the observed spread of the differences.

    With few or no flipped items the observed spread is ~0, which would claim any drop is
    detectable. For McNemar a drop needs at least k items flipping one way before mid-p can
    reach alpha (0.5**(k+1) < alpha), so k/n is a floor no matter how quiet the rerun was.
    """
    mde = stats.mde(test.se, alpha, POWER)
    if test.test.startswith("mcnemar") and test.n:
        k_min = math.floor(math.log2(1 / alpha) - 1) + 1
        mde = max(mde, k_min / test.n)
    return mde


def _right_to_wrong(base: np.ndarray, cand: np.ndarray, doc_ids: np.ndarray, hib: bool) -> list[int]:
    if base.ndim != 1 or not np.isin(base, (0.0, 1.0)).all() or not np.isin(cand, (0.0, 1.0)).all():
        return []
    good, bad = (1.0, 0.0) if hib else (0.0, 1.0)
    return [int(d) for d in doc_ids[(base == good) & (cand == bad)]]


def _refuse_gated_untestable(candidate: RunResults, policy: Policy) -> None:
    """A gated metric that cannot be tested would silently pass: refuse it (fail closed)."""
    gated = [(key, agg) for key, agg in sorted(candidate.untestable.items(), key=lambda kv: str(kv[0]))
             if policy.lookup(key, _parents(candidate, key.task))[1]]
    if gated:
        (key, agg), more = gated[0], len(gated) - 1
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
    pending = []
    for key in sorted(baseline.series, key=str):
        b_series, c_series = baseline.series[key], candidate.series[key]
        base, cand, clusters = pair_series(b_series, c_series, where=f"task {key.task} ({key.metric},{key.filter})")
        margin, gated = policy.lookup(key, _parents(candidate, key.task))
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
        r2w = _right_to_wrong(base, cand, b_series.doc_ids, b_series.higher_is_better)
        pending.append((key, gated, margin, b_series.higher_is_better, test, r2w))

    gated_idx = [i for i, p in enumerate(pending) if p[1]]
    p_adj = stats.adjust_pvalues(np.array([pending[i][4].p_worse for i in gated_idx]), policy.correction)
    adjusted = dict(zip(gated_idx, p_adj.tolist(), strict=True))
    # MDE at the per-comparison alpha a Bonferroni split would give: Holm is never stricter.
    per_alpha = policy.alpha / max(1, len(gated_idx)) if policy.correction != "none" else policy.alpha

    comparisons = []
    for i, (key, gated, margin, hib, test, r2w) in enumerate(pending):
        p = adjusted.get(i)
        verdict = _verdict(test, hib, margin, p if p is not None else test.p_worse, policy.alpha)
        mde = _mde(test, per_alpha)
        comparisons.append(Comparison(key, gated, margin, hib, test, p, verdict, mde, r2w))
        # On a clear regression the test had power enough; the warning would only be noise.
        if gated and margin > 0 and mde > margin and verdict != "regressed":
            warnings.append(
                f"{key}: the smallest drop this comparison can catch (mde {mde:.4g}) is larger than "
                f"its margin {margin:.4g}: {test.n} items are too few for that margin"
            )

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
        + [f"{key}: not tested (aggregation {agg}; informational)" for key, agg in sorted(
            candidate.untestable.items(), key=lambda kv: str(kv[0]))],
    )
