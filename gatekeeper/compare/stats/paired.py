"""``paired_test``: pick and run the right paired test for one metric."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

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
)
from gatekeeper.compare.stats.result import PairedTest
from gatekeeper.compare.stats.studentized import bootstrap_t
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


def pending_draws(plans: list[PairedTest | PendingTest]) -> list[np.ndarray | None]:
    """Each pending plan's bootstrap replicates (None for a finished test), drawn together."""
    pending = [p for p in plans if isinstance(p, PendingTest)]
    n_resamples = {p.n_resamples for p in pending}
    if len(n_resamples) > 1:
        raise ValueError(f"plans with different resample counts: {sorted(n_resamples)}")
    draws = iter(bootstrap_draws([p.units for p in pending], n_resamples.pop() if pending else 0,
                                 [p.seed_seq for p in pending]))
    return [next(draws) if isinstance(p, PendingTest) else None for p in plans]


def paired_test(kind: str, aggregation: str, baseline: np.ndarray, candidate: np.ndarray, *,
                higher_is_better: bool, clusters: np.ndarray | None = None, confidence: float = 0.95,
                n_resamples: int = 10_000, seed: int = 0, exact: bool = False) -> PairedTest:
    """``plan_test``, finished at once (``pending_draws`` finishes a suite's together)."""
    plan = plan_test(kind, aggregation, baseline, candidate, higher_is_better=higher_is_better, clusters=clusters,
                     confidence=confidence, n_resamples=n_resamples, seed=seed, exact=exact)
    if isinstance(plan, PairedTest):
        return plan
    return plan.finish(bootstrap_draws([plan.units], n_resamples, [plan.seed_seq])[0])


def plan_test(kind: str, aggregation: str, baseline: np.ndarray, candidate: np.ndarray, *,
              higher_is_better: bool, clusters: np.ndarray | None = None, confidence: float = 0.95,
              n_resamples: int = 10_000, seed: int = 0, exact: bool = False) -> PairedTest | PendingTest:
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
    - other kinds with sufficient statistics (corpus, confusion counts, ...; ratios otherwise):
      permutation swapping the two runs' values within items, and paired bootstrap, both
      recomputing the aggregate from summed statistics.
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
    if (k.monotone_in_sum and labels is None and np.count_nonzero(diff) > EXACT_MAX_UNITS
            and np.array_equal(xb[:, 1:], xc[:, 1:])):
        return _studentized_sum(xb, diff, units.score, b_score, c_score, higher_is_better, confidence,
                                n_resamples, ss_boot, f"{k.name}-bootstrap-t", tuple(warnings))
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
                 n_resamples: int, seed_seq: np.random.SeedSequence, warnings: tuple[str, ...]) -> PairedTest:
    """Bootstrap-t for a mean of per-item differences: p-values read off the same draws as the
    interval (p < a exactly when the one-sided level-a bound excludes no change), with the +1
    correction (Phipson & Smyth 2010)."""
    boot = bootstrap_t(diff, confidence, n_resamples, seed_seq)
    draws = boot.draws[np.isfinite(boot.draws)]
    up, down = np.count_nonzero(draws >= 0), np.count_nonzero(draws <= 0)
    worse, better = (up, down) if hib else (down, up)
    b = draws.size
    return PairedTest(test="bootstrap-t", n=n, n_clusters=None, baseline=b_score, candidate=c_score,
                      delta=c_score - b_score, ci_low=boot.ci_low, ci_high=boot.ci_high, confidence=confidence,
                      p_worse=(1 + worse) / (b + 1), p_better=(1 + better) / (b + 1), se=boot.se,
                      n_resamples=boot.n_resamples, warnings=warnings, se_null=boot.se, draws=boot.draws)


_SHARED_T: dict[tuple, BootstrapResult] = {}
SHARED_T_KEPT = 4


def _shared_bootstrap_t(diff: np.ndarray, confidence: float, n_resamples: int,
                        seed_seq: np.random.SeedSequence) -> BootstrapResult:
    """``bootstrap_t``, its last few answers kept: a task's word and byte perplexities and bits
    per byte test the same log-likelihood differences with the same seed (one double bootstrap
    for the three)."""
    d = np.ascontiguousarray(diff, dtype=np.float64)
    key = (hashlib.blake2b(d.tobytes(), digest_size=16).digest(), d.size, confidence, n_resamples,
           seed_seq.entropy, seed_seq.spawn_key)
    if key not in _SHARED_T:
        while len(_SHARED_T) >= SHARED_T_KEPT:
            _SHARED_T.pop(next(iter(_SHARED_T)))
        _SHARED_T[key] = bootstrap_t(d, confidence, n_resamples, seed_seq)
    return _SHARED_T[key]


def _studentized_sum(xb: np.ndarray, diff: np.ndarray, score, b_score: float, c_score: float, hib: bool,
                     confidence: float, n_resamples: int, seed_seq: np.random.SeedSequence, test: str,
                     warnings: tuple[str, ...]) -> PairedTest:
    """The studentized test for a score that is monotone in column 0's sum, the other columns
    being the same on both sides (perplexities and bits per byte over the same texts): the
    calibrated bootstrap-t of column 0's mean difference (``bootstrap_t``), each draw mapped
    to the score's change at the baseline's sums. The map is monotone, so p-values are the mean
    test's, and the interval and every margin read off the same draws. The sign-swap
    permutation of the ratio it replaces assumes the two runs' values exchangeable: on skewed
    harmless changes of 100 items it rejected at 0.021 where the level was 0.001."""
    boot = _shared_bootstrap_t(diff, confidence, n_resamples, seed_seq)
    total = xb.sum(axis=0)
    sums = np.repeat(total[None, :], boot.draws.size, axis=0)
    sums[:, 0] += diff.size * boot.draws
    deltas = score(sums) - score(total[None, :])[0]  # 0 exactly where the draw is 0
    result = percentile_interval(deltas, confidence, "no spread")
    draws = deltas[np.isfinite(deltas)]
    up, down = np.count_nonzero(draws >= 0), np.count_nonzero(draws <= 0)
    worse, better = (up, down) if hib else (down, up)
    b = draws.size
    return PairedTest(test=test, n=int(diff.size), n_clusters=None, baseline=b_score, candidate=c_score,
                      delta=c_score - b_score, ci_low=result.ci_low, ci_high=result.ci_high, confidence=confidence,
                      p_worse=(1 + worse) / (b + 1), p_better=(1 + better) / (b + 1), se=result.se,
                      n_resamples=result.n_resamples, warnings=warnings, se_null=result.se, draws=deltas)


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
