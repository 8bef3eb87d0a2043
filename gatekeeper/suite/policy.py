"""Gate policy: which (task, filter, metric) gate, their margins, alpha and correction.

A policy comes from ``--policy FILE`` (a YAML file with these keys at the top level or under
``policy:``; a suite file works too) and from command-line defaults.

    alpha: 0.05
    correction: holm          # holm | bonferroni | bh | none
    group_share: 0.5          # the share of alpha lm-eval groups' rows start with (compare/family.py)
    margin: 0.0               # default margin, in each metric's own units
    resamples: 10000
    rounding: 1e-5            # relative differences up to this are float noise, not change
    test: superiority         # superiority | inferiority | non-inferiority (see docs/statistics.md)
    rules:                    # first match wins; globs allowed in task/filter/metric
      - {task: arith_mc, metric: acc, margin: 0.03}
      - {task: "*", metric: acc_norm, gate: false}     # informational only
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.errors import GateError
from gatekeeper.model import SeriesKey

CORRECTIONS = ("holm", "bonferroni", "bh", "none")
# superiority: fail on a significant drop beyond the margin (default); inferiority: fail only
# when the drop is shown to exceed the margin (H0: drop <= margin); non-inferiority (the
# textbook test): pass only when the drop is shown to be within the margin (H0: drop >= margin).
TESTS = ("superiority", "inferiority", "non-inferiority")
ITEMS = ("uniform", "informative")
# The spelling gatekeeper used for "inferiority" until it was renamed for what it does.
DEPRECATED_TESTS = {"noninferiority": "inferiority"}
# Per-item differences up to this share of the values' magnitude are floating-point noise:
# measured 2.6e-7 for the same float32 checkpoint on two CPUs; 40x headroom for other batch
# sizes and kernels, still far below any real change of a metric.
DEFAULT_ROUNDING = 1e-5
MAX_ROUNDING = 1e-3  # a larger floor would hide real changes: refuse it rather than open the gate
# 1e6 resamples put the Monte Carlo error of a p-value near 0.05 at 0.0002; more only burns CPU
# (2e8 would run for hours) and memory, so a larger value is a typo, refused up front.
MAX_RESAMPLES = 1_000_000
# alpha outside [1e-6, 0.5]: below, no test on a few thousand items can ever reach it (and the
# power and interval formulas run out of float range); above, a coin flip would fail the gate.
MIN_ALPHA, MAX_ALPHA = 1e-6, 0.5


def alpha_problem(alpha: float) -> str | None:
    """Why ``alpha`` is refused, or None (shared by the policy file and ``--alpha``)."""
    if not (math.isfinite(alpha) and MIN_ALPHA <= alpha <= MAX_ALPHA):
        return f"must be between {MIN_ALPHA:g} and {MAX_ALPHA:g} (default 0.05), got {alpha}"
    return None


def resamples_problem(resamples: int) -> str | None:
    """Why ``resamples`` is refused, or None (shared by the policy file and ``--resamples``)."""
    if not 100 <= resamples <= MAX_RESAMPLES:
        return f"must be between 100 and {MAX_RESAMPLES:,} (default 10,000), got {resamples}"
    return None


@dataclass(frozen=True)
class Rule:
    task: str = "*"
    filter: str = "*"
    metric: str = "*"
    margin: float | None = None
    gate: bool = True
    # Where the rule was written ("suite.yaml:14: tasks[0].metrics[0]"), for messages only.
    where: str = field(default="", compare=False)

    def matches(self, key: SeriesKey) -> bool:
        return (
            fnmatch.fnmatchcase(key.task, self.task)
            and fnmatch.fnmatchcase(key.filter, self.filter)
            and fnmatch.fnmatchcase(key.metric, self.metric)
        )


@dataclass
class Policy:
    alpha: float = 0.05
    correction: str = "holm"
    # The share of alpha the rows of top-level groups start with under holm and bonferroni (the
    # rest goes to the other rows; a rejected group row passes its share to its members): 0 is one
    # flat family, as before groups were given their own share (compare/family.py).
    group_share: float = 0.5
    margin: float = 0.0
    resamples: int = 10000
    rules: list[Rule] = field(default_factory=list)
    rounding: float = DEFAULT_ROUNDING
    test: str = "superiority"
    # policy.sequential.looks: gate in that many looks and stop early (compare/sequential.py); None: off.
    sequential_looks: int | None = None
    # policy.items: "informative" reads the items the baseline says are likely to flip first, stage
    # by stage (gate --items informative, issue #57); "uniform" (default) every item.
    items: str = "uniform"
    # Groups whose subtasks are informational (suite ``subtasks: info``): the group's own row decides.
    info_subtasks: frozenset[str] = frozenset()
    # Set by a sequential gate at its interim looks (not a suite key): the exact conditional McNemar
    # p-value, never above nominal size at the tiny levels those looks test at, instead of mid-p.
    exact_mcnemar: bool = False
    # Set by a sequential gate at an interim or final look (not a suite key): (look, the looks'
    # information fractions, the suite's alpha): Holm then tests each rank on its own
    # group-sequential boundary of its share (``compare/sequential.share_level``).
    look: tuple[int, tuple[float, ...], float] | None = None
    # Set with ``look``: each leaf task's whole item count. The report's resolution warnings (MDE,
    # "only a collapse fails") are about the suite, not the look's sample: computed at these sizes.
    look_sizes: dict[str, int] | None = field(default=None, compare=False)
    # Said once per report (deprecated spellings); not part of what the policy decides.
    warnings: list[str] = field(default_factory=list, compare=False)
    # Where the default margin was set (a file line, "--margin"), for messages only.
    margin_where: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.test in DEPRECATED_TESTS:
            new = DEPRECATED_TESTS[self.test]
            self.warnings.append(
                f"policy test: {self.test} is deprecated and reads as `{new}` (fail only when a drop beyond "
                "the margin is shown, which is what it always did); for the textbook non-inferiority test "
                "(pass only when every drop is shown to be within its margin) write `test: non-inferiority`")
            self.test = new

    def lookup(self, key: SeriesKey, parents: tuple[str, ...] = (), *, group: bool = False) -> tuple[float, bool]:
        """(margin, gated) for one series: the first matching rule, else the defaults.

        ``parents`` are the groups the task belongs to, nearest first: a rule written for a group
        (``task: mmlu``) applies to its subtasks (and nested groups) when no rule names them. A
        leaf task (not ``group``) under a group whose suite entry says ``subtasks: info`` is
        informational.
        """
        rule = self.rule_for(key, parents)
        margin, gated = (self.margin, True) if rule is None else (
            self.margin if rule.margin is None else rule.margin, rule.gate)
        if not group and self.info_subtasks.intersection(parents):
            gated = False  # a subtask of a group gated as a whole
        return margin, gated

    def rule_for(self, key: SeriesKey, parents: tuple[str, ...] = ()) -> Rule | None:
        """The rule that decides ``key`` (see ``lookup``), None when the defaults do."""
        for name in (key.task, *parents):
            probe = SeriesKey(name, key.filter, key.metric)
            for rule in self.rules:
                if rule.task != "*" and rule.matches(probe):
                    return rule
        for rule in self.rules:
            if rule.task == "*" and rule.matches(key):
                return rule
        return None

    def margin_source(self, key: SeriesKey, parents: tuple[str, ...] = ()) -> str:
        """Where the margin that applies to ``key`` was written, for messages ("" if unknown)."""
        rule = self.rule_for(key, parents)
        if rule is not None and rule.margin is not None:
            return rule.where
        return self.margin_where

    def note_ignored_share(self, written: bool, where: str) -> None:
        """``group_share`` written with ``correction: bh``: BH shares no alpha among groups, so the
        key does nothing there; said once per report, never silently."""
        if written and self.correction == "bh":
            self.warnings.append(f"{where}: group_share is ignored with correction: bh (the Benjamini-Hochberg "
                                 "step-up shares no alpha between groups and their subtasks); drop it, or use "
                                 "correction: holm")

    def validate(self, where: str = "policy") -> None:
        if alpha_problem(self.alpha):
            raise GateError(f"{where}: alpha {alpha_problem(self.alpha)}")
        if self.correction not in CORRECTIONS:
            raise GateError(
                f"{where}: correction must be one of {', '.join(CORRECTIONS)}, got {self.correction!r}"
            )
        # NaN compares False with everything: a NaN margin would make "drop > margin" never
        # true and silently switch the gate off, so only finite margins >= 0 pass.
        margins = [self.margin, *(r.margin for r in self.rules if r.margin is not None)]
        if any(not math.isfinite(m) or m < 0 for m in margins):
            raise GateError(f"{where}: margins must be finite and >= 0 (they are drops in the metric's units)")
        if resamples_problem(self.resamples):
            raise GateError(f"{where}: resamples {resamples_problem(self.resamples)}")
        if not (math.isfinite(self.rounding) and 0 <= self.rounding <= MAX_ROUNDING):
            raise GateError(
                f"{where}: rounding must be between 0 and {MAX_ROUNDING:g} (a relative tolerance; "
                f"default {DEFAULT_ROUNDING:g}), got {self.rounding}"
            )
        if not (math.isfinite(self.group_share) and 0 <= self.group_share < 1):
            raise GateError(f"{where}: group_share must be at least 0 and below 1 (the share of alpha lm-eval "
                            f"groups' rows start with; default 0.5, 0: one flat family), got {self.group_share}")
        if self.test not in TESTS:
            raise GateError(f"{where}: test must be one of {', '.join(TESTS)}, got {self.test!r}")
        if self.items not in ITEMS:
            raise GateError(f"{where}: items must be one of {', '.join(ITEMS)}, got {self.items!r}")
        if self.items == "informative" and self.sequential_looks:
            raise GateError(f"{where}: items informative and sequential: choose one (the informative read has its "
                            "own stages and tests once)")
        if self.items == "informative" and self.test != "superiority":
            raise GateError(f"{where}: items informative is tested for a drop (test: superiority); {self.test} reads "
                            "every item")

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "policy") -> Policy:
        if not isinstance(data, dict):
            raise GateError(f"{where}: expected a mapping")
        known = {"alpha", "correction", "group_share", "margin", "resamples", "rules", "rounding", "test", "sequential",
                 "items"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise GateError(f"{where}: unknown key(s) {', '.join(unknown)}")
        rules = []
        for i, r in enumerate(data.get("rules") or []):
            if not isinstance(r, dict) or set(r) - {"task", "filter", "metric", "margin", "gate"}:
                raise GateError(f"{where}: rules[{i}]: expected keys task, filter, metric, margin, gate")
            try:
                rules.append(
                    Rule(
                        task=str(r.get("task", "*")),
                        filter=str(r.get("filter", "*")),
                        metric=str(r.get("metric", "*")),
                        margin=None if r.get("margin") is None else float(r["margin"]),
                        gate=bool(r.get("gate", True)),
                        where=f"{where}: rules[{i}].margin",
                    )
                )
            except (TypeError, ValueError) as exc:
                raise GateError(f"{where}: rules[{i}]: {exc}") from None
        try:
            policy = cls(
                alpha=float(data.get("alpha", 0.05)),
                correction=str(data.get("correction", "holm")),
                group_share=float(data.get("group_share", 0.5)),
                margin=float(data.get("margin", 0.0)),
                resamples=int(data.get("resamples", 10000)),
                rules=rules,
                rounding=float(data.get("rounding", DEFAULT_ROUNDING)),
                test=str(data.get("test", "superiority")),
                margin_where=f"{where}: margin",
                sequential_looks=_looks(data.get("sequential"), where),
                items=str(data.get("items", "uniform")),
            )
        except (TypeError, ValueError, OverflowError) as exc:  # OverflowError: resamples: .inf
            raise GateError(f"{where}: {exc}") from None
        policy.note_ignored_share("group_share" in data, where)
        policy.validate(where)
        return policy


def _looks(value: Any, where: str) -> int | None:
    """``sequential: {looks: N}`` of a policy file: N from 2 to 10, or None."""
    if value is None:
        return None
    looks = value.get("looks") if isinstance(value, dict) and set(value) == {"looks"} else None
    if isinstance(looks, bool) or not isinstance(looks, int) or not 2 <= looks <= 10:
        raise GateError(f"{where}: sequential: expected {{looks: N}} with N from 2 to 10, got {value!r}")
    return looks
