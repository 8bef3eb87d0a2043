"""The one line a person reads in ten seconds, and what the report knows about the run."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from gatekeeper.compare.outcome import Outcome
from gatekeeper.report.numbers import signed

ICON = {"regressed": "❌", "improved": "🟢", "unchanged": "✅", "inconclusive": "⚠️", "worse_within_margin": "🟡"}


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
        n = len(outcome.regressions)
        return f"gatekeeper {suite}: {n} regression{'s' if n != 1 else ''}{refs}: {_named(outcome.regressions)}"
    if outcome.verdict == "drift":
        n = len(outcome.drifted)
        return (f"gatekeeper {suite}: drift{refs}: {n} gated metric{'s' if n != 1 else ''} regressed since the "
                f"anchor of {anchor_date(outcome)}, though no regression against the baseline: "
                f"{_drift_named(outcome)}")
    if outcome.failures:  # non-inferiority: not shown to be within the margin
        n = len(outcome.failures)
        return (f"gatekeeper {suite}: {n} of {len(gated)} gated not shown within the margin "
                f"(non-inferiority){refs}: {_named(outcome.failures)}")
    worse = f"; {len(outcome.worse)} worse within the margin: {_named(outcome.worse)}" if outcome.worse else ""
    if outcome.inconclusive:
        n = len(outcome.inconclusive)
        return (
            f"gatekeeper {suite}: passed, {n} inconclusive of {len(gated)} gated{refs}: "
            f"a drop beyond the margin is not ruled out{worse}"
        )
    return f"gatekeeper {suite}: passed, no regression in {len(gated)} gated metrics{refs}{worse}"


def anchor_date(outcome: Outcome) -> str:
    """The day the anchor was measured (YYYY-MM-DD), or "unknown date"."""
    stamp = outcome.anchor.provenance.date if outcome.anchor is not None else None
    if not isinstance(stamp, (int, float)) or stamp != stamp or abs(stamp) > 1e11:
        return "unknown date"
    return datetime.fromtimestamp(stamp, timezone.utc).strftime("%Y-%m-%d")


def _drift_named(outcome: Outcome) -> str:
    """"demo_capitals_mc acc −0.12 since the anchor, −0.02 against the baseline", up to three."""
    against_base = {c.key: c for c in outcome.comparisons}
    parts = []
    for c in outcome.drifted[:3]:
        name = " ".join(f"{c.key.task} {c.key.metric}".split())
        b = against_base.get(c.key)
        last = f", {signed(b.test.delta)} against the baseline" if b is not None else ""
        parts.append(f"{name} {signed(c.test.delta)} since the anchor{last}")
    return "; ".join(parts) + ("…" if len(outcome.drifted) > 3 else "")


def _named(comparisons: list) -> str:
    """Up to three comparisons as "task metric delta", on one line whatever the task names hold:
    the headline is printed to the job log, where a line starting with "::" would be read as a
    workflow command."""
    text = ", ".join(" ".join(f"{c.key.task} {c.key.metric}".split()) + f" {signed(c.test.delta)}"
                     for c in comparisons[:3])
    return text + ("…" if len(comparisons) > 3 else "")
