"""``paired_test``: pick and run the right paired test for one metric."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gatekeeper.compare.stats.flips import flip_test
from gatekeeper.compare.stats.itemwise import item_bootstrap, item_permutation
from gatekeeper.compare.stats.mcnemar import mcnemar
from gatekeeper.compare.stats.resampling import (
    EXACT_MAX_UNITS,
    BootstrapResult,
    PermutationResult,
    Units,
    bootstrap_draws,
    percentile_interval,
    permutation_test,
    seed_key,
)
from gatekeeper.compare.stats.result import PairedTest
from gatekeeper.compare.stats.studentized import bootstrap_t_many
from gatekeeper.results.metrics import MetricKind, kind_named

MIN_CLUSTERS = 20


@dataclass(frozen=True)
class PendingTest:
    """A permutation test whose bootstrap interval is still to draw: ``plan_test`` makes it and
    ``pending_draws`` draws many at once, their bootstraps sharing draws (``bootstrap_draws``)."""

    units: Units
    seed_seq: np.random.SeedSequence
    n_resamples: int
    perm: PermutationResult
    fields: dict  # test, n, n_clusters, baseline, candidate, delta, confidence
    warnings: tuple[str, ...]

    def finish(self, draws: np.ndarray) -> PairedTest:
        """The test, given its bootstrap replicates. ValueError when none is defined."""
        boot = percentile_interval(draws, self.fields["confidence"], "e.g. zero counts")
        return PairedTest(**self.fields, ci_low=boot.ci_low, ci_high=boot.ci_high, p_worse=self.perm.p_worse,
                          p_better=self.perm.p_better, se=boot.se, n_resamples=boot.n_resamples,
                          warnings=self.warnings, se_null=self.perm.se, draws=boot.draws)


@dataclass(frozen=True)
class PendingStudentized:
    """A studentized test (``bootstrap_t``) still to draw: ``pending_draws`` draws the tests with
    as many items and the same seed together (``bootstrap_t_many``), then ``finish`` maps the
    result to the test (a mean's change, or a ratio's: ``_studentized_sum``)."""

    diff: np.ndarray
    seed_seq: np.random.SeedSequence
    n_resamples: int
    confidence: float
    done: Callable[[BootstrapResult], PairedTest]

    def finish(self, boot: BootstrapResult) -> PairedTest:
        return self.done(boot)


Plan = PairedTest | PendingTest | PendingStudentized


def pending_draws(plans: list[Plan]) -> list[np.ndarray | BootstrapResult | None]:
    """What each pending plan's ``finish`` takes (None for a finished test), drawn together: the
    bootstrap replicates of a permutation test, the calibrated bootstrap of a studentized one."""
    pending = [p for p in plans if isinstance(p, PendingTest)]
    n_resamples = {p.n_resamples for p in plans if not isinstance(p, PairedTest)}
    if len(n_resamples) > 1:
        raise ValueError(f"plans with different resample counts: {sorted(n_resamples)}")
    draws = iter(bootstrap_draws([p.units for p in pending], pending[0].n_resamples if pending else 0,
                                 [p.seed_seq for p in pending]))
    out: list[np.ndarray | BootstrapResult | None] = [next(draws) if isinstance(p, PendingTest) else None
                                                       for p in plans]
    # resampled alike: as many items, the same seed (keyed before the draws spawn from it)
    alike: dict[tuple, list[tuple[int, PendingStudentized]]] = {}
    for i, p in enumerate(plans):
        if isinstance(p, PendingStudentized):
            alike.setdefault((p.diff.shape[0], p.confidence, seed_key(p.seed_seq)), []).append((i, p))
    for group in alike.values():
        first = group[0][1]
        boots = bootstrap_t_many([p.diff for _, p in group], first.confidence, first.n_resamples, first.seed_seq)
        for (i, _), boot in zip(group, boots, strict=True):
            out[i] = boot
    return out


def paired_test(kind: str, aggregation: str, baseline: np.ndarray, candidate: np.ndarray, *,
                higher_is_better: bool, clusters: np.ndarray | None = None, confidence: float = 0.95,
                n_resamples: int = 10_000, seed: int = 0, exact: bool = False) -> PairedTest:
    """``plan_test``, finished at once (``pending_draws`` finishes a suite's together)."""
    plan = plan_test(kind, aggregation, baseline, candidate, higher_is_better=higher_is_better, clusters=clusters,
                     confidence=confidence, n_resamples=n_resamples, seed=seed, exact=exact)
    if isinstance(plan, PairedTest):
        return plan
    return plan.finish(pending_draws([plan])[0])


def plan_test(kind: str, aggregation: str, baseline: np.ndarray, candidate: np.ndarray, *,
              higher_is_better: bool, clusters: np.ndarray | None = None, confidence: float = 0.95,
              n_resamples: int = 10_000, seed: int = 0, exact: bool = False) -> Plan:
    """Compare a candidate run with a baseline run on the same items (paired row by row).

    - kind "mean", 0/1 values, no clusters: McNemar mid-p + Newcombe interval (no resampling);
      ``exact``: the exact conditional McNemar p-value instead (a sequential gate's interim looks).
    - other "mean", unclustered: studentized bootstrap (bootstrap-t) of the mean difference,
      Hall-transformed and calibrated by a fast double bootstrap (``studentized``), for the
      p-values and the interval; exact sign-flip permutation when at most 16 items differ (too
      few for a bootstrap).
    - ratios over the same texts' counts (perplexities, bits per byte), unclustered: the same
      calibrated bootstrap-t, of the log-likelihoods' mean difference, each draw mapped to the
      ratio's change (``_studentized_sum``); exact permutation up to 16 differing items.
    - TER over the same references: the same, of the edits' mean difference.
    - BLEU and chrF, unclustered: the same calibrated bootstrap-t, of the change's jackknife
      linearization (``jackknife_influence``); exact permutation up to 16 differing items.
    - f1 and matthews_corrcoef, unclustered: the flips' test (``flips.flip_test``: how many items
      flipped between which cells, against the Poisson rates of no expected change), with the
      paired bootstrap's interval (however few items flipped: the exact permutation assumes
      flips as likely one way as the other, which a harmless change need not be).
    - other kinds with sufficient statistics (ratios and corpus scores otherwise, nanmean
      where the judged items differ and the linearization is not finite): permutation swapping
      the two runs' values within items, and paired bootstrap, both recomputing the aggregate
      from summed statistics.
    - kinds without (median, task-defined aggregations): the same, resampling items and
      calling the aggregate on each resample (no clusters).
    - clusters: the same with whole clusters as the units.
    Degenerate case: when every pair is identical, p_worse = p_better = 1, interval (0, 0),
    se 0 (no evidence either way; the conservative choice) and ``identical`` is True.
    """
    k = kind_named(kind)
    base = k.check(aggregation, baseline, "baseline")
    cand = k.check(aggregation, candidate, "candidate")
    if base.shape != cand.shape:
        raise ValueError(f"baseline and candidate must pair row by row: shapes {base.shape} vs {cand.shape}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    n = int(base.shape[0])
    labels = _check_clusters(clusters, n)

    if kind == "mean" and labels is None and _is_binary(base) and _is_binary(cand):
        return _mcnemar_test(base, cand, higher_is_better, confidence, exact)

    stats = k.unit_stats(aggregation, base, cand)
    if stats is None:
        if labels is not None:
            raise ValueError(f"clusters are not supported for aggregation {aggregation!r}; drop the cluster key")
        return _itemwise_test(k, aggregation, base, cand, higher_is_better, confidence, n_resamples, seed)
    xb, xc = stats
    b_score, c_score = k.exact_scores(aggregation, base, cand, xb, xc)

    warnings: list[str] = []
    n_clusters = None
    if labels is not None:
        _, inverse = np.unique(labels, return_inverse=True)
        n_clusters = int(inverse.max()) + 1
        xb, xc = _cluster_sums(xb, inverse, n_clusters), _cluster_sums(xc, inverse, n_clusters)
        if n_clusters < MIN_CLUSTERS:
            warnings.append(
                f"only {n_clusters} clusters (< {MIN_CLUSTERS}): cluster-level p-values and intervals "
                "are coarse and the interval may undercover"
            )
    units = Units(xb, xc, k.score_fn(aggregation), mean_of_diff=(k.mean_of_diff and labels is None))

    ss_perm, ss_boot = np.random.SeedSequence(seed).spawn(2)
    diff = xc[:, 0] - xb[:, 0]
    if units.mean_of_diff and np.count_nonzero(diff) > EXACT_MAX_UNITS:
        return _studentized(diff, b_score, c_score, n, higher_is_better, confidence, n_resamples, ss_boot,
                            tuple(warnings))
    if (aggregation in k.monotone_in_sum and labels is None and np.count_nonzero(diff) > EXACT_MAX_UNITS
            and np.array_equal(xb[:, 1:], xc[:, 1:])):
        return _studentized_sum(xb, diff, units.score, b_score, c_score, higher_is_better, confidence,
                                n_resamples, ss_boot, f"{k.name}-bootstrap-t", tuple(warnings))
    if (aggregation in k.smooth_in_sums and labels is None
            and np.count_nonzero((xb != xc).any(axis=1)) > EXACT_MAX_UNITS):
        smooth = studentized_smooth(xb, xc, units.score, b_score, c_score, higher_is_better, confidence,
                                    n_resamples, ss_boot, f"{k.name}-bootstrap-t", tuple(warnings))
        if smooth is not None:
            return smooth
    strata = k.flip_strata(aggregation, base, cand) if labels is None else None
    perm = None
    if strata is not None and (xb != xc).any():
        perm = flip_test(xb, xc, strata, units.score, higher_is_better, n_resamples, ss_perm)
    test = f"{k.name}-flips"
    if perm is None:
        perm = permutation_test(units, higher_is_better, n_resamples, ss_perm)
        exact = perm is not None and perm.exact
        test = "cluster-permutation" if labels is not None else k.test_name(exact)
    common = dict(test=test, n=n, n_clusters=n_clusters, baseline=b_score, candidate=c_score,
                  delta=c_score - b_score, confidence=confidence)
    if perm is None:  # every pair identical
        return PairedTest(**common, ci_low=0.0, ci_high=0.0, p_worse=1.0, p_better=1.0, se=0.0,
                          n_resamples=0, warnings=tuple(warnings), identical=True)
    return PendingTest(units, ss_boot, n_resamples, perm, common, tuple(warnings))


def _studentized(diff: np.ndarray, b_score: float, c_score: float, n: int, hib: bool, confidence: float,
                 n_resamples: int, seed_seq: np.random.SeedSequence, warnings: tuple[str, ...],
                 test: str = "bootstrap-t") -> PendingStudentized:
    """Bootstrap-t for a mean of per-item differences: p-values read off the same draws as the
    interval (p < a exactly when the one-sided level-a bound excludes no change), with the +1
    correction (Phipson & Smyth 2010)."""
    return PendingStudentized(diff, seed_seq, n_resamples, confidence, lambda boot: _from_draws(
        boot, test=test, n=n, baseline=b_score, candidate=c_score, hib=hib, confidence=confidence,
        warnings=warnings))


def jackknife_influence(xb: np.ndarray, xc: np.ndarray, score: Callable[[np.ndarray], np.ndarray],
                        block: int = 1 << 16) -> np.ndarray | None:
    """Each item's influence on ``score(sum xc) - score(sum xb)``, for a score that is a smooth
    function of the summed statistics (BLEU, chrF): n - 1 times how far the change moves when
    the item is left out, less the average (the jackknife's pseudo-values, centred; Efron 1982).

    The change is then the mean of (change + influence) to first order, with the jackknife's
    standard error, so the means' calibrated bootstrap-t of those values tests it, and its
    draws are of the score's change in the score's units. The permutation it replaces, which
    swaps the two runs' statistics within items, assumes them exchangeable: on skewed harmless
    changes of BLEU over 500 sentences it rejected at 0.019 where the level was 0.005 (this
    test: 0.0077; benchmarks/small_levels.py --corpus bleu). None when a corpus without one
    item has no finite score (the permutation then decides)."""
    n = xb.shape[0]
    sb, sc = xb.sum(axis=0), xc.sum(axis=0)
    without = np.empty(n)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # non-finite: None below
        for start in range(0, n, block):  # (block, k) at a time: the left-out sums of 1M items are 80 MB
            rows = slice(start, start + block)
            without[rows] = score(sc[None, :] - xc[rows]) - score(sb[None, :] - xb[rows])
    if not np.isfinite(without).all():
        return None
    return (n - 1) * (without.mean() - without)


def studentized_smooth(xb: np.ndarray, xc: np.ndarray, score: Callable[[np.ndarray], np.ndarray], b_score: float,
                       c_score: float, hib: bool, confidence: float, n_resamples: int,
                       seed_seq: np.random.SeedSequence, test: str,
                       warnings: tuple[str, ...]) -> PendingStudentized | None:
    """The studentized test for a score that is a smooth function of the summed statistics
    (BLEU, chrF): the means' calibrated bootstrap-t of the change plus each item's influence
    (``jackknife_influence``), its draws the score's change. None when the influence is not
    finite everywhere (the permutation then decides)."""
    influence = jackknife_influence(xb, xc, score)
    if influence is None:
        return None
    return _studentized(c_score - b_score + influence, b_score, c_score, xb.shape[0], hib, confidence,
                        n_resamples, seed_seq, warnings, test)


def _studentized_sum(xb: np.ndarray, diff: np.ndarray, score: Callable[[np.ndarray], np.ndarray], b_score: float,
                     c_score: float, hib: bool, confidence: float, n_resamples: int,
                     seed_seq: np.random.SeedSequence, test: str, warnings: tuple[str, ...]) -> PendingStudentized:
    """The studentized test for a score that is monotone in column 0's sum, the other columns
    being the same on both sides (perplexities and bits per byte over the same texts): the
    calibrated bootstrap-t of column 0's mean difference (``bootstrap_t``), each draw mapped
    to the score's change at the baseline's sums. The map is monotone, so p-values are the mean
    test's, and the interval and every margin read off the same draws. The sign-swap
    permutation of the ratio it replaces assumes the two runs' values exchangeable: on skewed
    harmless changes of 100 items it rejected at 0.021 where the level was 0.001."""
    total = xb.sum(axis=0)

    def mapped(boot: BootstrapResult) -> PairedTest:
        sums = np.repeat(total[None, :], boot.draws.size, axis=0)
        sums[:, 0] += diff.size * boot.draws
        deltas = score(sums) - score(total[None, :])[0]  # 0 exactly where the draw is 0
        return _from_draws(percentile_interval(deltas, confidence, "no spread"), test=test, n=int(diff.size),
                           baseline=b_score, candidate=c_score, hib=hib, confidence=confidence, warnings=warnings)

    return PendingStudentized(diff, seed_seq, n_resamples, confidence, mapped)


def _from_draws(boot: BootstrapResult, *, test: str, n: int, baseline: float, candidate: float, hib: bool,
                confidence: float, warnings: tuple[str, ...]) -> PairedTest:
    """The test read off draws of the change: p_worse is the share of draws on the worse side of
    no change (with the +1 rule), the interval their percentiles."""
    draws = boot.draws[np.isfinite(boot.draws)]
    up, down = np.count_nonzero(draws >= 0), np.count_nonzero(draws <= 0)
    worse, better = (up, down) if hib else (down, up)
    b = draws.size
    return PairedTest(test=test, n=n, n_clusters=None, baseline=baseline, candidate=candidate,
                      delta=candidate - baseline, ci_low=boot.ci_low, ci_high=boot.ci_high, confidence=confidence,
                      p_worse=(1 + worse) / (b + 1), p_better=(1 + better) / (b + 1), se=boot.se,
                      n_resamples=boot.n_resamples, warnings=warnings, se_null=boot.se, draws=boot.draws)


def _mcnemar_test(base: np.ndarray, cand: np.ndarray, higher_is_better: bool, confidence: float,
                  exact: bool = False) -> PairedTest:
    r = mcnemar(base, cand, higher_is_better, confidence, exact)
    b_score, c_score = kind_named("mean").aggregate("mean", base), kind_named("mean").aggregate("mean", cand)
    flips = r.b + r.c
    both_right = int(np.count_nonzero((base == 1) & (cand == 1)))
    # Under H0 the flips go either way: the test's spread is sqrt(flips) / n.
    return PairedTest(test="mcnemar-exact" if exact else "mcnemar-midp", n=r.n, n_clusters=None, baseline=b_score, candidate=c_score,
                      delta=c_score - b_score, ci_low=r.ci_low, ci_high=r.ci_high, confidence=confidence,
                      p_worse=r.p_worse, p_better=r.p_better, se=r.se, n_resamples=0,
                      se_null=float(np.sqrt(flips)) / r.n, identical=flips == 0,
                      counts=(both_right, r.b, r.c, r.n - both_right - flips))


def _is_binary(values: np.ndarray) -> bool:
    return bool(((values == 0) | (values == 1)).all())


def _check_clusters(clusters: np.ndarray | None, n: int) -> np.ndarray | None:
    if clusters is None:
        return None
    labels = np.asarray(clusters)
    if labels.shape != (n,):
        raise ValueError(f"clusters must have one label per item: shape {labels.shape}, expected ({n},)")
    if labels.dtype == object:
        if any(v is None for v in labels):
            raise ValueError("clusters: an item has no cluster label (None)")
        labels = labels.astype(str)
    return labels


def _cluster_sums(x: np.ndarray, inverse: np.ndarray, n_clusters: int) -> np.ndarray:
    out = np.zeros((n_clusters, x.shape[1]))
    np.add.at(out, inverse, x)
    return out


def _itemwise_test(k: MetricKind, aggregation: str, base: np.ndarray, cand: np.ndarray, hib: bool,
                   confidence: float, n_resamples: int, seed: int) -> PairedTest:
    """Resample items and call the kind's aggregate per resample (no sufficient statistics)."""
    n = int(base.shape[0])
    b_score, c_score = k.aggregate(aggregation, base), k.aggregate(aggregation, cand)
    warnings: tuple[str, ...] = ()
    wanted, n_resamples = n_resamples, k.resamples(aggregation, base, n_resamples)
    if n_resamples < wanted:
        warnings = (f"{n_resamples} resamples instead of {wanted}: the task's own aggregation is called once "
                    f"per resample (the interval and p-value are coarser; smallest p 1/{n_resamples + 1})",)
    common = dict(test=k.test_name(False), n=n, n_clusters=None, baseline=b_score, candidate=c_score,
                  delta=c_score - b_score, confidence=confidence)
    if k.identical(base, cand):
        return PairedTest(**common, ci_low=0.0, ci_high=0.0, p_worse=1.0, p_better=1.0, se=0.0,
                          n_resamples=0, identical=True)
    both = np.concatenate([base, cand])

    def score(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
        return k.resample_score(aggregation, values, idx)

    ss_perm, ss_boot = np.random.SeedSequence(seed).spawn(2)
    perm = item_permutation(both, n, score, hib, n_resamples, ss_perm)
    boot = item_bootstrap(both, n, score, confidence, n_resamples, ss_boot)
    return PairedTest(**common, ci_low=boot.ci_low, ci_high=boot.ci_high, p_worse=perm.p_worse,
                      p_better=perm.p_better, se=boot.se, n_resamples=boot.n_resamples,
                      warnings=warnings, se_null=perm.se, draws=boot.draws)
