"""What a comparison decided: one ``Comparison`` per (task, filter, metric), one ``Outcome``."""

from __future__ import annotations

from dataclasses import dataclass, field

from gatekeeper.compare.compat import Difference
from gatekeeper.compare.stats import PairedTest
from gatekeeper.model import RunResults, SeriesKey
from gatekeeper.suite.policy import Policy

# Verdicts of one comparison, and the words a reader sees. Only "regressed" fails the gate (and,
# under ``policy.test: non-inferiority``, "inconclusive": the drop was not shown to be within
# the margin).
REGRESSED, INCONCLUSIVE, WORSE, UNCHANGED, IMPROVED = (
    "regressed", "inconclusive", "worse_within_margin", "unchanged", "improved")
WORDS = {WORSE: "worse, within margin"}


def verdict_words(verdict: str) -> str:
    """How a verdict reads in the comment, summary and terminal ("worse, within margin")."""
    return WORDS.get(verdict, verdict)


@dataclass
class Comparison:
    """The outcome for one (task, filter, metric).

    ``level`` is the one-sided level the decision tested this comparison at (alpha split by the
    multiplicity correction: ``p`` < ``level`` exactly when ``p_adjusted`` < alpha), and
    ``interval`` the two-sided interval for delta at confidence 1 - 2 * level: its drop-side
    end is the one-sided bound the decision agrees with. ``rounded``: items whose difference
    was within the rounding floor and counted as none (the test saw them as equal; ``test``'s
    baseline, candidate and delta are the runs' real aggregates all the same).
    """

    key: SeriesKey
    gated: bool
    margin: float
    higher_is_better: bool
    test: PairedTest
    p_adjusted: float | None  # None when informational
    verdict: str
    mde: float
    right_to_wrong: list[int] = field(default_factory=list)
    level: float = 0.05
    interval: tuple[float, float] = (0.0, 0.0)
    p_value: float | None = None  # the p-value the decision used (inferiority: vs the margin)
    rounded: int = 0
    within_rounding: bool = False  # the aggregate moved by no more than rounding
    subtasks: tuple[str, ...] = ()  # a group's leaf tasks (its items are theirs); () for a task
    weight_by_size: bool | None = None  # a group's weighting, as lm-eval aggregates it
    share: float = 1.0  # the share of alpha the multiplicity design started this row with (compare/family.py)

    @property
    def is_group(self) -> bool:
        return bool(self.subtasks)

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
    verdict: str  # "pass" | "fail" | "drift" (passed against the baseline, regressed against the anchor)
    comparisons: list[Comparison]
    regressions: list[Comparison]
    differences: list[Difference]
    warnings: list[str]
    baseline: RunResults
    candidate: RunResults
    policy: Policy
    suite: str | None = None
    notes: list[str] = field(default_factory=list)  # how the inputs were read (newest of 3 runs, ...)
    # The anchor (baseline/anchor.py) when it differs from the baseline: the candidate against it,
    # tested in the same family, and the gated comparisons that regressed against it.
    anchor: RunResults | None = None
    anchor_comparisons: list[Comparison] = field(default_factory=list)
    drifted: list[Comparison] = field(default_factory=list)
    # How alpha was shared among the gated rows, in one line (compare/family.describe).
    design: str = ""

    @property
    def inconclusive(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.gated and c.verdict == INCONCLUSIVE]

    @property
    def worse(self) -> list[Comparison]:
        """Gated comparisons significantly worse, but within their margin (not failures)."""
        return [c for c in self.comparisons if c.gated and c.verdict == WORSE]

    @property
    def failures(self) -> list[Comparison]:
        """The gated comparisons that fail the gate: regressed ones, and under the textbook
        non-inferiority test also those not shown to be within their margin."""
        if self.policy.test == "non-inferiority":
            return [c for c in self.comparisons if c.gated and c.verdict in (REGRESSED, INCONCLUSIVE)]
        return list(self.regressions)

    @property
    def exit_code(self) -> int:
        return 1 if self.verdict in ("fail", "drift") else 0
