"""The one line a person reads in ten seconds, and what the report knows about the run."""

from __future__ import annotations

from dataclasses import dataclass

from gatekeeper.compare.compare import Outcome
from gatekeeper.report.numbers import signed

ICON = {"regressed": "❌", "improved": "🟢", "unchanged": "✅", "inconclusive": "⚠️"}


@dataclass
class ReportContext:
    suite: str | None = None
    baseline_ref: str | None = None
    candidate_ref: str | None = None
    run_url: str | None = None


def headline(outcome: Outcome, ctx: ReportContext | None = None) -> str:
    """One line a person reads in ten seconds (plain text, no markdown)."""
    ctx = ctx or ReportContext(suite=outcome.suite)
    suite = ctx.suite or outcome.suite or "suite"
    gated = [c for c in outcome.comparisons if c.gated]
    refs = ""
    if ctx.baseline_ref or ctx.candidate_ref:
        refs = f" ({ctx.baseline_ref or 'baseline'} → {ctx.candidate_ref or 'candidate'})"
    if outcome.regressions:
        # One line whatever the task names hold: the headline is printed to the job log, where
        # a line starting with "::" would be read as a workflow command.
        worst = ", ".join(
            " ".join(f"{c.key.task} {c.key.metric}".split()) + f" {signed(c.test.delta)}"
            for c in outcome.regressions[:3]
        )
        more = "…" if len(outcome.regressions) > 3 else ""
        n = len(outcome.regressions)
        return f"gatekeeper {suite}: {n} regression{'s' if n != 1 else ''}{refs}: {worst}{more}"
    if outcome.inconclusive:
        n = len(outcome.inconclusive)
        return (
            f"gatekeeper {suite}: passed, {n} inconclusive of {len(gated)} gated{refs}: "
            "a drop beyond the margin is not ruled out"
        )
    return f"gatekeeper {suite}: passed, no regression in {len(gated)} gated metrics{refs}"
