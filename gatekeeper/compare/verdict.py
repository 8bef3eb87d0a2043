"""From one paired test to a verdict: the rule, the interval it agrees with, and the MDE.

Three rules (``policy.test``), all in "drop" units (positive = the candidate is worse):

- ``superiority`` (default): regressed when the drop is beyond the margin **and** significant
  (one-sided p below the comparison's level);
- ``inferiority``: regressed only when the drop is shown to exceed the margin (H0: drop <= margin);
- ``non-inferiority`` (the textbook test): passes only when the drop is shown to be below the
  margin (H0: drop >= margin); a comparison that shows neither is ``inconclusive``, which fails.

A significant drop within the margin is ``worse_within_margin``: said, never a failure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist

from gatekeeper.compare.outcome import IMPROVED, INCONCLUSIVE, REGRESSED, UNCHANGED, WORSE, Comparison
from gatekeeper.compare.stats import PairedTest, mde_for_rule
from gatekeeper.compare.stats.mcnemar import mde as mcnemar_mde
from gatekeeper.model import SeriesKey
from gatekeeper.suite.policy import Policy

POWER = 0.8
# Float slack for "beyond the margin": a drop of exactly 10 items of 200 against a margin of 0.05
# computes as 0.05000000000000002 about half the time (measured: 46%), so without it rounding
# decides whether a drop at the margin fails.
MARGIN_SLACK = 1e-9


@dataclass
class Tested:
    """One series after its paired test, before the correction across the suite."""

    key: SeriesKey
    gated: bool
    margin: float
    higher_is_better: bool
    test: PairedTest  # on the snapped values; baseline/candidate/delta are the real aggregates
    p: float  # the p-value the decision uses (inferiority / non-inferiority: against the margin)
    rounded: int
    aggregation: str
    binary: bool
    right_to_wrong: list[int]
    within_rounding: bool  # the aggregate moved by no more than rounding (``stats.aggregate_within_floor``)
    # A group's aggregate (``results/groups.py``): its leaf tasks and lm-eval's weighting; () for a task.
    subtasks: tuple[str, ...] = ()
    weight_by_size: bool | None = None


def decide(t: Tested, p_adjusted: float | None, level: float, per_alpha: float, policy: Policy) -> Comparison:
    """Verdict, the interval it agrees with, and the MDE for one tested series."""
    test = t.test
    decision_p = p_adjusted if p_adjusted is not None else t.p
    scale = max(abs(test.baseline), abs(test.candidate))
    if policy.test == "non-inferiority":
        interval = test.interval_at(1 - 2 * level, unflipped_zero=False)
    else:
        interval = _decision_interval(test, t.higher_is_better, level, decision_p < policy.alpha,
                                      t.margin if policy.test == "inferiority" else 0.0)
    c = Comparison(t.key, t.gated, t.margin, t.higher_is_better, test, p_adjusted, "", math.nan,
                   t.right_to_wrong, level, interval, t.p, t.rounded, t.within_rounding, t.subtasks, t.weight_by_size)
    # "Significantly worse" always means against no drop, at the comparison's own level.
    worse = test.p_worse < level and c.drop_bounds[0] > 0
    if policy.test == "non-inferiority":
        shown_beyond = test.p_drop_above(t.margin, t.higher_is_better) < level
        c.verdict = _ni_verdict(c.drop_bounds, t.margin, shown_beyond, worse, scale)
        c.mde = _ni_margin(test, per_alpha)
    else:
        c.verdict = _verdict(c.drop, c.drop_bounds, t.margin, decision_p, policy.alpha, t.within_rounding,
                             scale, worse)
        c.mde = mde(test, t.margin, per_alpha, t.aggregation, t.binary, policy.test == "inferiority")
    return c


def _beyond(margin: float, scale: float) -> float:
    return margin + MARGIN_SLACK * max(scale, margin) + 1e-12


def _verdict(drop: float, bounds: tuple[float, float], margin: float, p: float, alpha: float,
             within_rounding: bool, scale: float = 1.0, worse: bool = False) -> str:
    """superiority / inferiority. ``bounds`` is the interval on the drop at the level the
    decision used (see ``_decision_interval``), so the label and the interval shown agree:
    regressed needs the test to reject (adjusted p < alpha) and the interval's lower end above
    0; an interval whose lower end is above the margin is always regressed. ``scale``: the
    scores' magnitude, for the float slack of "beyond the margin". ``worse``: the drop is
    significant against no drop (at the comparison's level)."""
    low, high = bounds
    beyond = _beyond(margin, scale)
    if within_rounding:
        return UNCHANGED  # the aggregate moved by no more than floating-point noise
    if p < alpha and low > 0 and (drop > beyond or low > beyond):
        return REGRESSED
    if high < 0:
        return IMPROVED  # the whole interval is on the better side
    if high > beyond or not math.isfinite(high):
        return INCONCLUSIVE  # a drop larger than the margin is not ruled out (NaN: nothing is)
    return WORSE if worse else UNCHANGED


def _ni_verdict(bounds: tuple[float, float], margin: float, shown_beyond: bool, worse: bool,
                scale: float) -> str:
    """non-inferiority: passes only when the interval's upper end on the drop is below the
    margin (the one-sided bound at the comparison's level); regressed when the drop is shown
    to exceed it; inconclusive (a failure in this mode) otherwise."""
    low, high = bounds
    if shown_beyond and low > _beyond(margin, scale):
        return REGRESSED
    if not (math.isfinite(high) and high < margin):
        return INCONCLUSIVE
    if high < 0:
        return IMPROVED
    return WORSE if worse else UNCHANGED


def _decision_interval(test: PairedTest, hib: bool, level: float, rejected: bool,
                       null_drop: float) -> tuple[float, float]:
    """The interval for delta at confidence 1 - 2 * level, made to agree with the test.

    The test (permutation / McNemar) and the interval (bootstrap / Newcombe) are different
    procedures; at the boundary one can reject what the other does not. When the test did not
    reject the null drop (0, or the margin under ``inferiority``), the null is kept inside the
    interval's drop-side end: the union of two valid confidence sets is still valid (wider),
    and the decision's error rate stays the test's own (allowing "either" instead measured a
    suite false-alarm rate of 0.07 at alpha 0.05).
    """
    lo, hi = test.interval_at(1 - 2 * level)
    drop_low = -hi if hib else lo
    if not rejected and drop_low > null_drop:
        drop_low = null_drop
    return (lo, -drop_low) if hib else (drop_low, hi)


def _ni_margin(test: PairedTest, alpha: float) -> float:
    """non-inferiority's counterpart of the MDE: the smallest margin this test shows with 80%
    power when nothing really changed (the one-sided bound's expected reach, z(1-a) + z(power)
    spreads; Newcombe's spread for right/wrong items even when none flipped)."""
    z = NormalDist().inv_cdf(1 - alpha) + NormalDist().inv_cdf(POWER)
    if test.counts is not None:
        n = test.n
        flips = test.counts[1] + test.counts[2]
        # With no flip observed, the 80% upper bound of the flip rate (rule of three-like).
        pi = flips / n if flips else -math.log(1 - POWER) / n
        return z * math.sqrt(pi / n)
    return z * test.se if test.se > 0 else 0.0


def mde(test: PairedTest, margin: float, alpha: float, aggregation: str = "mean",
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

        return mde_for_rule(margin, alpha, spread, spread, POWER, shifted=True)
    if test.counts is not None:
        return mcnemar_mde(n, (test.counts[1] + test.counts[2]) / n, margin, alpha, POWER)
    if test.flip_share is not None:  # an informative read: the whole task's, at its estimated flips
        return mcnemar_mde(n, test.flip_share, margin, alpha, POWER)
    if test.identical or test.se == 0:
        return math.nan
    m = test.units
    if shifted:  # the bootstrap tests against the margin: its own spread is the test's
        test = replace(test, se_null=test.se)
    # A permutation's null spread grows with a shift (d^2 per unit); a bootstrap's does not.
    shift_term = 0.0 if test.test.endswith("bootstrap-t") else 1.0 / m
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

    return mde_for_rule(
        margin, alpha,
        se_null=lambda d: math.sqrt(test.se_null**2 + d * extra + d * d * shift_term) * grow(d),
        se_alt=lambda d: math.sqrt(test.se**2 + d * extra) * grow(d),
        power=POWER,
        shifted=shifted,
    )


def resolution_warnings(c: Comparison, alpha: float, test_mode: str = "superiority") -> list[str]:
    """Warn when the margin is below what the items can resolve: below one item (0/1 metrics),
    or below the smallest drop that can be significant at all (z * the test's null spread), in
    which case the test, not the margin, decides what fails. Margin 0 is a deliberate "any
    significant drop" and is not warned about."""
    t = c.test
    if c.gated and test_mode == "non-inferiority":
        return _ni_resolution(c, alpha)
    if not c.gated or c.margin <= 0 or c.verdict == REGRESSED:  # a clear regression had power
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
    # What `plan` calls "resolves": a drop of twice the margin caught 4 times in 5. One answer
    # to "is my suite big enough?" in plan and in every gate's report.
    if math.isfinite(c.mde) and c.mde > 2 * c.margin:
        return [
            f"{c.key}: margin {c.margin:.4g} is below what {t.units} items can resolve: a drop must reach "
            f"{c.mde:.4g} to be caught 4 times in 5 (over twice the margin); `gatekeeper plan` gives the "
            "smallest margin they can gate; add items or widen the margin"
        ]
    return []


def _ni_resolution(c: Comparison, alpha: float) -> list[str]:
    if c.margin <= 0:
        return [f"{c.key}: margin 0 under non-inferiority: only a candidate shown to be better passes; "
                "set the drop you accept as the margin"]
    if c.mde > c.margin:
        return [f"{c.key}: margin {c.margin:.4g} is below what {c.test.units} items can show under "
                f"non-inferiority (about {c.mde:.4g} with 80% power when nothing changed): the "
                "gate will usually read inconclusive and fail; add items or widen the margin"]
    return []
