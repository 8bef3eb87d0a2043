"""The result object of a paired comparison (shaped like scipy.stats result objects)."""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

from gatekeeper.compare.stats.mcnemar import newcombe_interval


@dataclass(frozen=True)
class PairedTest:
    """One paired comparison of a candidate run against a baseline run on the same items.

    ``delta = candidate - baseline`` in the metric's own units. ``p_worse`` / ``p_better`` are
    one-sided p-values for "candidate is worse" / "candidate is better", already oriented by
    ``higher_is_better``. ``n_resamples`` is the number of random resamples behind the result
    (Monte Carlo permutations and/or bootstrap draws); 0 when everything is exact/closed form.

    ``se`` is the spread of the estimate (bootstrap, or McNemar's closed form); ``se_null`` the
    spread the test compares it with (the permutation distribution's; McNemar: from the
    discordant items). ``identical``: every pair was identical (no item changed), so there is
    nothing to estimate and the interval (0, 0) is a statement about the data, not a bound.
    ``counts`` (McNemar: both right, right->wrong, wrong->right, both wrong) and ``draws`` (the
    bootstrap's deltas) let ``interval_at`` give the interval at any level, e.g. the
    multiplicity-adjusted level the decision used.
    """

    test: str
    n: int
    n_clusters: int | None
    baseline: float
    candidate: float
    delta: float
    ci_low: float
    ci_high: float
    confidence: float
    p_worse: float
    p_better: float
    se: float
    n_resamples: int
    warnings: tuple[str, ...] = ()
    se_null: float = 0.0
    identical: bool = False
    counts: tuple[int, int, int, int] | None = None
    draws: np.ndarray | None = field(default=None, repr=False, compare=False)
    # The weighted flips' test of an informative read (``stats/weighted.py``): the share of the
    # task's items estimated to have flipped (its MDE's flip rate); ``n`` is then the whole task's.
    flip_share: float | None = None
    flips_read: int | None = None  # and how many of the items it read flipped (its smallest p: 0.5 ** flips_read)
    # and its (p-values, sizes) given them (weighted.rejection_table): its exact size at any level
    null_table: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False, compare=False)

    def confidence_interval(self) -> tuple[float, float]:
        return (self.ci_low, self.ci_high)

    @property
    def units(self) -> int:
        """Independent units behind the test: clusters when clustered, else items."""
        return self.n_clusters or self.n

    def interval_at(self, confidence: float, *, unflipped_zero: bool = True) -> tuple[float, float]:
        """Two-sided interval for delta at ``confidence``, by the same method as ``ci_low/high``.

        When no item changed it is (0, 0), a statement about the items; ``unflipped_zero=False``
        gives Newcombe's interval for right/wrong items even then (ten unchanged items do not
        bound a real drop at 0.02: what a non-inferiority decision must not assume)."""
        if not 0 < confidence < 1:
            raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")
        if self.identical and (unflipped_zero or self.counts is None):
            return (0.0, 0.0)
        if self.counts is not None:
            return newcombe_interval(*self.counts, confidence)
        if self.flip_share is not None:  # Wald's, on the weighted estimate (as ``ci_low`` / ``ci_high``)
            z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
            return (self.delta - z * self.se, self.delta + z * self.se)
        if self.draws is None:
            return (self.ci_low, self.ci_high)
        finite = self.draws[np.isfinite(self.draws)]
        tail = (1 - confidence) / 2
        lo, hi = np.quantile(finite, [tail, 1 - tail])
        return (float(lo), float(hi))

    def p_drop_above(self, margin: float, higher_is_better: bool) -> float:
        """One-sided p-value for H0 "the drop is at most ``margin``" against "it is larger".

        The shifted-null test behind ``policy.test: inferiority``: it inverts the same
        interval the report shows (Newcombe for right/wrong items, the bootstrap otherwise), so
        p < a exactly when the one-sided level-a bound on the drop lies above the margin.
        """
        if self.identical:
            return 1.0
        if self.counts is None and self.draws is not None:
            drops = -self.draws if higher_is_better else self.draws
            drops = drops[np.isfinite(drops)]
            return float((1 + np.count_nonzero(drops <= margin)) / (drops.size + 1))
        return _invert_bound(self, margin, higher_is_better, upper=False)

    def p_drop_below(self, margin: float, higher_is_better: bool) -> float:
        """One-sided p-value for H0 "the drop is at least ``margin``" against "it is smaller":
        the textbook non-inferiority test (``policy.test: non-inferiority``). p < a exactly when
        the one-sided level-a upper bound on the drop lies below the margin.

        Right/wrong items use Newcombe's interval even when no item flipped: ten unchanged
        items do not show that a real drop is below 0.02 (``interval_at`` would say (0, 0))."""
        if self.counts is None and self.identical:
            return 0.0 if margin > 0 else 1.0  # no item changed: the drop is 0 on these items
        if self.counts is None and self.draws is not None:
            drops = -self.draws if higher_is_better else self.draws
            drops = drops[np.isfinite(drops)]
            return float((1 + np.count_nonzero(drops >= margin)) / (drops.size + 1))
        return _invert_bound(self, margin, higher_is_better, upper=True)

    def drop_upper(self, confidence: float, higher_is_better: bool) -> float:
        """The one-sided ``confidence`` upper bound on the drop (Newcombe for right/wrong items,
        also when none flipped; the bootstrap otherwise)."""
        lo, hi = self.interval_at(2 * confidence - 1, unflipped_zero=False)
        return -lo if higher_is_better else hi


def _invert_bound(test: PairedTest, margin: float, higher_is_better: bool, *, upper: bool) -> float:
    """The one-sided level a at which the lower (``upper``: upper) bound on the drop equals
    ``margin`` (bisection on the closed-form interval: ~50 evaluations of a few float operations)."""

    def beyond(a: float) -> bool:  # the bound at one-sided level a is past the margin (rejects H0)
        lo, hi = test.interval_at(1 - 2 * a, unflipped_zero=False)
        if upper:
            return (-lo if higher_is_better else hi) < margin
        return (-hi if higher_is_better else lo) > margin

    lo_a, hi_a = 1e-12, 0.5 - 1e-12
    if not beyond(hi_a):  # not even the point estimate is past the margin
        return 1.0
    if beyond(lo_a):
        return lo_a
    for _ in range(60):
        mid = 0.5 * (lo_a + hi_a)
        if beyond(mid):
            hi_a = mid
        else:
            lo_a = mid
    return hi_a
