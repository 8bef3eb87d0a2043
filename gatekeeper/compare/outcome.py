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
    # The group design run at this share of alpha so that the flips' discreteness keeps a harmless
    # change at alpha (``compare._discreteness_scale``); 1 almost always.
    alpha_scale: float = 1.0
    # Each gated row's warnings that its margin is below what its items resolve (also in
    # ``warnings``), so the gate can say plan's figure instead (``compare/plan.with_plan``).
    resolution: dict[SeriesKey, list[str]] = field(default_factory=dict)

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


def flipped_items(outcome: Outcome, c: Comparison, limit: int) -> tuple[int, list[tuple[str, int]]]:
    """(how many, the first ``limit``) of the items ``c`` saw go from right to wrong, as (task,
    doc_id). A group has no items of its own: its members' rows (gated or informational, same
    metric and filter) hold them, taken in turn from the members with the most flips, so several
    of its tasks show."""
    if not c.is_group:
        return len(c.right_to_wrong), [(c.key.task, d) for d in c.right_to_wrong[:limit]]
    members = set(c.subtasks)
    rows = sorted((m for m in outcome.comparisons if m.key.task in members and not m.is_group
                   and (m.key.metric, m.key.filter) == (c.key.metric, c.key.filter) and m.right_to_wrong),
                  key=lambda m: (-len(m.right_to_wrong), m.key.task))
    picked: list[tuple[str, int]] = []
    for i in range(limit):
        for m in rows:
            if i < len(m.right_to_wrong) and len(picked) < limit:
                picked.append((m.key.task, m.right_to_wrong[i]))
    return sum(len(m.right_to_wrong) for m in rows), picked


def failing_rows(outcome: Outcome) -> list[Comparison]:
    """The gated rows whose right-to-wrong items the report shows: each regressed or inconclusive
    task, and a failing group only where none of its tasks is shown itself (``subtasks: info``,
    or a loss spread so thin that no task fails alone): its items are its tasks'."""
    bad = [c for c in outcome.comparisons if c.gated and c.verdict in (REGRESSED, INCONCLUSIVE)]
    shown = {c.key.task for c in bad if not c.is_group and c.right_to_wrong}
    return [c for c in bad if not c.is_group or not shown.intersection(c.subtasks)]
