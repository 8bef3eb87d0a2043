"""Pair two runs, test every (task, filter, metric), correct for multiplicity, decide.

Pure: takes ``RunResults`` in, gives an ``Outcome`` (``outcome.py``) out; the rule that turns
one test into a verdict is ``verdict.py``. The only I/O is ``attach_snippets``, which reads the
text of the few items the report shows, after the statistics.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from gatekeeper.compare import family as family_design
from gatekeeper.compare import margins, sequential, stats
from gatekeeper.compare.compat import check_compatible, pair_series
from gatekeeper.compare.outcome import (
    INCONCLUSIVE,
    REGRESSED,
    Comparison,
    Outcome,
    failing_rows,
    flipped_items,
)
from gatekeeper.compare.stats.mcnemar import rejection_table, size_at
from gatekeeper.compare.stats.result import PairedTest
from gatekeeper.compare.stats.weighted import WEIGHTED_TEST, WEIGHTED_TESTS, weighted_paired_test
from gatekeeper.compare.verdict import Tested, decide, mde, resolution_warnings
from gatekeeper.errors import GateError
from gatekeeper.model import MetricSeries, RunResults, SeriesKey
from gatekeeper.results import groups, snippets
from gatekeeper.results.metrics import kind_named
from gatekeeper.suite.policy import Policy


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
    for c in failing_rows(outcome):
        for task, doc_id in flipped_items(outcome, c, per_metric)[1]:  # a group's: its members'
            wanted.setdefault((task, c.key.filter), set()).add(doc_id)
    if wanted:
        for run in (outcome.baseline, outcome.candidate):
            snippets.attach_snippets(run, wanted)


def _real_candidate(test: stats.PairedTest, series: MetricSeries, cand: np.ndarray) -> stats.PairedTest:
    """The test as run on snapped values, reporting the candidate's real aggregate: the report
    promises lm-eval's value of the candidate's samples, not the one after rounding-level items
    were set to the baseline's."""
    value = kind_named(series.kind).aggregate(series.aggregation, cand)
    return replace(test, candidate=value, delta=value - test.baseline)


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
             if policy.lookup(key, candidate.parents(key.task))[1]]
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
    anchor: RunResults | None = None,
) -> Outcome:
    """Compare every series present in both runs. Raises GateError when they are not comparable.

    With ``anchor`` (the reference a person approved, ``baseline/anchor.py``) the candidate is
    compared with the baseline and with the anchor, as one family: the multiplicity correction
    runs over the gated comparisons of both, so the chance of any false alarm stays at alpha.
    A candidate that regressed against the anchor only gets the verdict ``drift``."""
    differences = _comparable(baseline, candidate, "runs")
    _refuse_gated_untestable(candidate, policy)
    pairs, group_notes = group_pairs(baseline, candidate)
    # A group score is a mean of its leaves' scores: it has their range.
    ranges = {gm.key: next(baseline.series[k] for k in gm.leaf_keys if k in baseline.series) for _, _, gm in pairs}
    unreachable, moot = margins.unreachable(baseline, policy, ranges)
    if unreachable:
        raise GateError(margins.refusal(unreachable))
    tested, warnings = _test_pair(baseline, candidate, pairs, policy, seed)
    anchored: list[Tested] = []
    if anchor is not None:
        _comparable(anchor, candidate, "the anchor and the candidate")
        try:
            anchored, _ = _test_pair(anchor, candidate, group_pairs(anchor, candidate)[0], policy, seed)
        except GateError as err:  # its items differ: the baseline's fix (promote) never moves the anchor
            raise GateError(f"the anchor and the candidate: {str(err).split('; fix: ')[0]}; fix: the anchor "
                            "measured other items: pin a new one on purpose (gatekeeper baseline pin --current "
                            "--suite SUITE --reason ...)") from None

    family = tested + anchored
    gated_idx = [i for i, t in enumerate(family) if t.gated]
    correction = _correction(policy)
    shares = alpha_design(family, gated_idx, len(tested), candidate, policy)
    scale = _discreteness_scale(family, gated_idx, shares, policy)
    raw = np.minimum(1.0, np.array([family[i].p for i in gated_idx]) / scale)
    if policy.look is not None and correction in ("holm", "bonferroni") and raw.size:
        # A sequential look: each row on the group-sequential boundary of the share of alpha it
        # holds (Maurer & Bretz 2013); the adjusted p is scaled so that adjusted < the look's
        # alpha exactly when p < its level (what the verdict reads).
        look, fractions, overall = policy.look
        look_levels = stats.graph_levels(raw, shares.graph, overall,
                                         sequential.share_level(np.asarray(fractions), look))
        levels = dict(zip(gated_idx, look_levels.tolist(), strict=True))
        with np.errstate(divide="ignore", invalid="ignore"):
            scaled = np.where(look_levels > 0, raw * policy.alpha / look_levels, 1.0)
        adjusted = dict(zip(gated_idx, np.minimum(1.0, scaled).tolist(), strict=True))
    elif correction in ("holm", "bonferroni"):
        adjusted = dict(zip(gated_idx, stats.graph_adjusted(raw, shares.graph).tolist(), strict=True))
        # each row's level for its own p (``raw`` is p / scale: the procedure at scale x alpha)
        levels = dict(zip(gated_idx, (scale * stats.graph_levels(raw, shares.graph, policy.alpha)).tolist(),
                          strict=True))
    else:
        adjusted = dict(zip(gated_idx, stats.adjust_pvalues(raw, correction).tolist(), strict=True))
        levels = dict(zip(gated_idx, stats.decision_levels(raw, correction, policy.alpha).tolist(), strict=True))
    # A row that holds no share when the procedure stops (a subtask too small to reach one, a
    # nested group whose group was not rejected) shows its interval at the smallest share held:
    # its p is above that level too, so interval and verdict still agree.
    held = shares.graph.weights[shares.graph.weights > 0]
    if held.size:
        for i in gated_idx:
            if levels[i] <= 0:
                levels[i] = (float(policy.alpha * held.min()) if policy.look is None else
                             sequential.share_level(np.asarray(policy.look[1]), policy.look[0])(
                                 policy.look[2] * float(held.min())))
    # MDE at the share of alpha each row starts with (the procedure is never stricter than that).
    start = (shares.graph.weights if correction in ("holm", "bonferroni")
             else np.full(len(gated_idx), 1.0 / max(1, len(gated_idx)) if correction != "none" else 1.0))
    share = dict(zip(gated_idx, start.tolist(), strict=True))
    # (a row that starts with none: at the smallest share held, what it would need to be tested)
    floor = float(start[start > 0].min()) if (start > 0).any() else 1.0
    per_alpha = {i: scale * policy.alpha * (share.get(i, 1.0) or floor) for i in range(len(family))}

    decided = [decide(t, adjusted.get(i), levels.get(i, policy.alpha), per_alpha.get(i, policy.alpha), policy)
               for i, t in enumerate(family)]
    for i, c in enumerate(decided):
        c.share = share.get(i, 1.0)
    comparisons, anchor_comparisons = decided[:len(tested)], decided[len(tested):]
    # A sequential look's resolution is the suite's, not its sample's: the tests projected to the
    # whole item counts, at the suite's alpha (the final look's comparison, with every item).
    overall = policy.look[2] if policy.look is not None else policy.alpha
    whole_alpha = [overall * (share.get(i, 1.0) or floor) for i in range(len(tested))]
    whole_tested, whole = _whole_suite(tested, comparisons, policy, whole_alpha)
    no_power, weak = margins.after_tests(baseline, whole_tested, whole, whole_alpha, policy, ranges)
    if no_power:
        raise GateError(margins.refusal(no_power))
    # each row's word on what its items resolve (``plan.with_plan`` says plan's instead)
    resolution: dict[SeriesKey, list[str]] = {}
    for c, a in zip(whole, whole_alpha, strict=True):
        lines = resolution_warnings(c, a, policy.test) + ([weak[c.key]] if c.key in weak else [])
        if lines:
            resolution[c.key] = lines
            warnings.extend(lines)
    comparisons = [replace(c, mde=w.mde) for c, w in zip(comparisons, whole, strict=True)]
    warnings.extend(moot)
    notes_rounding = [
        f"{c.key}: {c.rounded} of {c.test.n} items differed only by rounding "
        f"(<= {policy.rounding:g} relative) and count as unchanged"
        for c in comparisons if c.rounded
    ]
    notes_rounding += [_read_note(candidate, c) for c in comparisons if c.test.test in WEIGHTED_TESTS]

    regressions = [c for c in comparisons if c.gated and c.verdict == REGRESSED]
    failing = regressions + ([c for c in comparisons if c.gated and c.verdict == INCONCLUSIVE]
                             if policy.test == "non-inferiority" else [])
    drifted = [c for c in anchor_comparisons if c.gated and c.verdict == REGRESSED]
    if not gated_idx:
        warnings.append("no comparison is gated: the policy marks every metric informational")
    warnings = list(policy.warnings) + warnings
    context = [d for d in differences if d.severity != "error"]
    return Outcome(
        verdict="fail" if failing else ("drift" if drifted else "pass"),
        comparisons=comparisons,
        regressions=regressions,
        differences=context,
        warnings=warnings,
        baseline=baseline,
        candidate=candidate,
        policy=policy,
        suite=suite,
        notes=[f"baseline: {n}" for n in baseline.notes] + [f"candidate: {n}" for n in candidate.notes]
        + group_notes + notes_rounding + [f"{key}: not tested (aggregation {agg}; informational)" for key, agg in sorted(
            candidate.untestable.items(), key=lambda kv: str(kv[0]))],
        anchor=anchor,
        anchor_comparisons=anchor_comparisons,
        drifted=drifted,
        design=family_design.describe(shares, correction, len(gated_idx)) + (
            f"; run at {scale:.3g} of alpha, so that the flipped items' discreteness (mid-p) keeps a harmless "
            "change at alpha" if scale < 1 else ""),
        alpha_scale=scale,
        resolution=resolution,
    )


def _comparable(baseline: RunResults, candidate: RunResults, what: str) -> list:
    differences = check_compatible(baseline, candidate)
    errors = [d.message for d in differences if d.severity == "error"]
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        fix = ""
        if "anchor" in what:  # the baseline's fix (record a new one) never moves the anchor: name what does
            errors = [e.split("; fix: ")[0].replace("since the baseline", "since the anchor") for e in errors]
            fix = ("; fix: the anchor measured other items: pin a new one on purpose (gatekeeper baseline pin "
                   "--current --suite SUITE --reason ...)")
        rest = ("; all: " + "; ".join(errors)) if len(errors) > 1 else ""
        raise GateError(f"{what} are not comparable: {errors[0]}{more}{fix}{rest}")
    return differences


GroupPair = tuple[MetricSeries, MetricSeries, groups.GroupMetric]


def group_pairs(baseline: RunResults, candidate: RunResults) -> tuple[list[GroupPair], list[str]]:
    """(baseline, candidate, the group metric) pooled series of every group metric with an aggregate
    (the candidate's groups: ``results/groups.py``), and notes on the groups that stay informational.
    Each run's reported group score must be the one its items give."""
    metrics, notes = groups.group_metrics(candidate)
    groups.check_reported(candidate, metrics)
    groups.check_reported(baseline, [gm for gm in metrics if gm.group in baseline.groups])
    pairs = []
    for gm in metrics:
        missing = [t for t in gm.leaves if SeriesKey(t, gm.filter, gm.metric) in candidate.series
                   and SeriesKey(t, gm.filter, gm.metric) not in baseline.series]
        if missing:
            raise GateError(f"{baseline.provenance.source}: group {gm.group}: subtask {missing[0]} has no "
                            f"{gm.metric},{gm.filter} in the baseline; re-record the baseline with the whole group")
        pairs.append((groups.pooled(baseline, gm), groups.pooled(candidate, gm), gm))
    return pairs, notes


def _test_pair(baseline: RunResults, candidate: RunResults, pairs: list[GroupPair],
               policy: Policy, seed: int) -> tuple[list[Tested], list[str]]:
    """The paired test of every group metric (``pairs``, from ``group_pairs``) and every series,
    before the correction across the suite."""
    src = f"{baseline.provenance.source} vs {candidate.provenance.source}"
    leaves = [(None, baseline.series[key], candidate.series[key]) for key in sorted(baseline.series, key=str)]
    rows, plans = [], []
    for gm, b_series, c_series in [(gm, b, c) for b, c, gm in pairs] + leaves:
        what = "task" if gm is None else "group"
        key = b_series.key
        base, cand, clusters = pair_series(b_series, c_series, where=f"{what} {key.task} ({key.metric},{key.filter})")
        margin, gated = policy.lookup(key, candidate.parents(key.task), group=gm is not None)
        snapped, rounded = stats.snap_rounding(b_series.kind, base, cand, policy.rounding)
        weighted = _weighted_test(c_series, base, cand, clusters, policy, src)
        if weighted is not None:
            plans.append(weighted)
            rows.append((gm, b_series, base, cand, cand, 0, margin, gated))
            continue
        try:
            plans.append(stats.plan_test(
                b_series.kind,
                b_series.aggregation,
                base,
                snapped,
                higher_is_better=b_series.higher_is_better,
                clusters=clusters,
                confidence=1 - policy.alpha,
                n_resamples=policy.resamples,
                seed=seed,
                exact=policy.exact_mcnemar,
            ))
        except ValueError as exc:  # NaN, empty, bad clusters: the input is wrong, not the gate
            raise GateError(f"{src}: {key}: {exc}") from None
        rows.append((gm, b_series, base, cand, snapped, rounded, margin, gated))
    # The bootstraps still to draw, together: tests with as many items share their resamples.
    draws = stats.pending_draws(plans)
    warnings: list[str] = []
    tested: list[Tested] = []
    for (gm, b_series, base, cand, snapped, rounded, margin, gated), plan, drawn in zip(rows, plans, draws,
                                                                                       strict=True):
        key = b_series.key
        try:
            test = plan if drawn is None else plan.finish(drawn)
        except ValueError as exc:  # every resample undefined (e.g. zero counts)
            raise GateError(f"{src}: {key}: {exc}") from None
        warnings.extend(f"{key}: {w}" for w in test.warnings)
        if rounded:
            test = _real_candidate(test, b_series, cand)
        hib = b_series.higher_is_better
        floor = stats.aggregate_within_floor(b_series.kind, base, cand, test.delta, test.baseline,
                                             test.candidate, policy.rounding)
        tested.append(Tested(key, gated, margin, hib, test, _decision_p(test, margin, hib, policy), rounded,
                             b_series.aggregation, _binary_pair(base, snapped),
                             # a group's items are its subtasks' (listed there): none of its own
                             [] if gm is not None else _right_to_wrong(base, snapped, b_series.doc_ids, hib),
                             floor, subtasks=() if gm is None else gm.leaves,
                             weight_by_size=None if gm is None else gm.weight_by_size))
    # Each group's rows above its subtasks' (the report's order), nested groups inside theirs.
    tested.sort(key=lambda t: (_path(candidate, t.key.task), t.key.metric, t.key.filter))
    return tested, warnings


def _read_note(candidate: RunResults, c: Comparison) -> str:
    read = sum(candidate.series[key].n for key in candidate.series
               if key.task in (c.subtasks or (c.key.task,)) and (key.metric, key.filter) == (c.key.metric, c.key.filter))
    return (f"{c.key}: an informative read: {read:,} of {c.test.n:,} items; its values estimate the whole "
            "task's, its test the weighted flips' McNemar test")


def _weighted_test(series: MetricSeries, base: np.ndarray, cand: np.ndarray, clusters: np.ndarray | None,
                   policy: Policy, src: str) -> PairedTest | None:
    """The weighted flips' test of a series an informative design read (``series.sample``,
    ``results/informative.py``), on the paired values; None where the items are the whole task, each
    standing for itself (the ordinary test then). Only right/wrong items without clusters can be
    weighted exactly: any other read of part of a task is an error, never a test of the wrong items."""
    sample = series.sample
    if sample is None or (sample.total == base.shape[0] and bool(np.all(sample.weights == 1))):
        return None
    why = ("its items are clustered" if clusters is not None else
           "" if _binary_pair(base, cand) else f"its values are not right/wrong ({series.aggregation})")
    if why:
        raise GateError(f"{src}: {series.key}: an informative read of {base.shape[0]:,} of its {sample.total:,} "
                        f"items cannot be weighted exactly: {why}; read the task whole or gate with --items uniform")
    if policy.test != "superiority" or policy.look is not None:
        what = f"policy test {policy.test}" if policy.test != "superiority" else "a sequential gate's looks"
        raise GateError(f"{src}: {series.key}: an informative read is tested once, for a drop (policy test: "
                        f"superiority); {what} reads items uniformly: gate with --items uniform")
    weights = sample.weights[np.argsort(series.doc_ids, kind="stable")]  # pair_series' order: by doc id
    return weighted_paired_test(base, cand, weights, sample.total, series.higher_is_better, 1 - policy.alpha,
                                exact=policy.exact_mcnemar)


def _path(run: RunResults, name: str, seen: tuple[str, ...] = ()) -> tuple[str, ...]:
    """``name`` under the groups that hold it, outermost first: ("mmlu", "mmlu_stem", "mmlu_anatomy")."""
    parents = [g for g in run.parents(name) if g not in seen]
    return (*_path(run, parents[0], (*seen, name)), name) if parents else (name,)


def _decision_p(test: stats.PairedTest, margin: float, hib: bool, policy: Policy) -> float:
    """The p-value each rule decides with: superiority, H0 "no drop"; inferiority, H0 "the drop
    is at most the margin"; non-inferiority, H0 "the drop is at least the margin"."""
    if policy.test == "inferiority":
        return test.p_drop_above(margin, hib)
    if policy.test == "non-inferiority":
        return test.p_drop_below(margin, hib)
    return test.p_worse


def _whole_suite(tested: list[Tested], comparisons: list[Comparison], policy: Policy,
                 alphas: list[float]) -> tuple[list[Tested], list[Comparison]]:
    """``tested`` and ``comparisons`` as the whole suite would show them: at a sequential look
    (``policy.look_sizes``) each test's spread is scaled from the look's items to the task's (or
    group's) whole count and its MDE recomputed at its share of the suite's alpha (``alphas``);
    elsewhere unchanged."""
    if policy.look is None or not policy.look_sizes:
        return tested, comparisons
    sizes = policy.look_sizes
    out_t, out_c = [], []
    for t, c, alpha in zip(tested, comparisons, alphas, strict=True):
        total = sum(sizes.get(task, 0) for task in (t.subtasks or (t.key.task,)))
        if total <= t.test.n or t.test.n <= 0:
            out_t.append(t)
            out_c.append(c)
            continue
        test = _scaled(t.test, total)
        t = replace(t, test=test)
        out_t.append(t)
        out_c.append(replace(c, test=test, mde=mde(test, c.margin, alpha, t.aggregation, t.binary,
                                                                policy.test == "inferiority")))
    return out_t, out_c


def _scaled(test: PairedTest, n: int) -> PairedTest:
    """A paired test's summary at ``n`` items with the same per-item spread and flip shares."""
    ratio = n / test.n
    counts = None if test.counts is None else tuple(int(round(x * ratio)) for x in test.counts)
    return replace(test, n=n, n_clusters=None if test.n_clusters is None else int(round(test.n_clusters * ratio)),
                               se=test.se / math.sqrt(ratio), se_null=test.se_null / math.sqrt(ratio),
                               counts=counts, draws=None)


def alpha_design(family: list[Tested], gated_idx: list[int], n_baseline: int, run: RunResults,
                 policy: Policy) -> family_design.Design:
    """The multiplicity design over the gated rows of ``family`` (rows from ``n_baseline`` on are
    against the anchor): ``compare/family.py``."""
    rows = [family_design.Row(family[i].key, int(i >= n_baseline), family[i].subtasks) for i in gated_idx]
    min_p = [_min_p(family[i].test) if policy.test == "superiority" else 0.0 for i in gated_idx]
    return family_design.design(rows, run.parents, policy.group_share, _correction(policy), min_p, policy.alpha)


def _discreteness_scale(family: list[Tested], gated_idx: list[int], shares: family_design.Design,
                        policy: Policy) -> float:
    """The factor (at most 1) the group design's alpha is scaled by so that a harmless change fails
    the suite at most alpha of the time, given the flips. Under the complete null the procedure's
    first rejection is at the starting shares, so the chance of any is at most the sum over rows
    of each test's size at its starting share: a continuous test's is its share; a McNemar row's
    is exact given its flips (``mcnemar.rejection_table``; an informative read's weighted test's,
    given its read flips and their weights, ``weighted.rejection_table``), and mid-p's is above
    the share at levels just past its values. Tarone's admission picks shares just past mid-p's smallest value
    (47 subjects of 14 flips at 0.025/47: mid-p rejects at 13 of 14, probability 9.2e-4, not
    5.3e-4; the suite failed 6.8% of harmless pairs), so there the sum exceeds alpha and the whole
    design is run at the largest scale x alpha that brings it back to alpha. Elsewhere mid-p's
    excess and shortfall even out, the sum is at most alpha and nothing changes. Without groups
    the design is plain Holm, as before: 1."""
    if not shares.share or policy.test != "superiority" or policy.look is not None \
            or _correction(policy) not in ("holm", "bonferroni"):
        return 1.0
    weights = shares.graph.weights
    continuous, discrete = 0.0, []
    for row, i in enumerate(gated_idx):
        t, w = family[i].test, float(weights[row])
        if w <= 0:
            continue
        if t.test.startswith("mcnemar") and t.counts is not None:
            if t.counts[1] + t.counts[2]:  # no flip: never rejects
                discrete.append((w, rejection_table(t.counts[1] + t.counts[2], t.test == "mcnemar-exact")))
        elif t.null_table is not None:  # an informative read's weighted test: its size given its read flips
            discrete.append((w, t.null_table))
        else:
            continuous += w

    def bound(scale: float) -> float:
        a = scale * policy.alpha
        return continuous * a + sum(size_at(table, w * a) for w, table in discrete)

    if bound(1.0) <= policy.alpha:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(30):  # the bound rises with the scale: the largest scale it allows, to 1e-9
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if bound(mid) <= policy.alpha else (lo, mid)
    return lo


def _min_p(test: PairedTest) -> float:
    """The smallest p-value a right/wrong row's McNemar test can reach, given its flipped items
    (every one of them right -> wrong); 0 for the other tests. An informative read's weighted
    test: every read flip the worse way, 0.5 ** its read flips (half that for mid-p), so Tarone's
    admission gives a subject that cannot reach its share's level its share back, as for McNemar."""
    if test.test in WEIGHTED_TESTS and test.flips_read is not None:
        return 0.5 ** test.flips_read * (1.0 if test.test == WEIGHTED_TEST else 0.5)
    if test.counts is None or not test.test.startswith("mcnemar"):
        return 0.0
    flips = test.counts[1] + test.counts[2]
    return 0.5 ** flips * (1.0 if test.test == "mcnemar-exact" else 0.5)


def _correction(policy: Policy) -> str:
    """The textbook non-inferiority gate passes only when *every* gated metric is shown within
    its margin: an intersection-union test, whose chance of passing a candidate that is worse
    than a margin on any one metric is at most alpha with each metric tested at alpha (Berger,
    1982). A correction would only make passing harder, so none is applied."""
    return "none" if policy.test == "non-inferiority" else policy.correction
