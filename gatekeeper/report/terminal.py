"""The terminal table ``gatekeeper compare`` and ``gate`` print."""

from __future__ import annotations

from gatekeeper.compare.outcome import Outcome, verdict_words
from gatekeeper.report.headline import anchor_date, headline
from gatekeeper.report.numbers import delta_cell, depths, fmt_num, fmt_p, group_note

COLUMNS = ("task", "metric", "baseline", "candidate", "delta [interval at decision level]", "p adj", "verdict")


def render_terminal(outcome: Outcome) -> str:
    lines = _table(outcome, outcome.comparisons, COLUMNS)
    anchored = [c for c in outcome.anchor_comparisons if c.gated]
    if anchored:
        lines += ["", f"against the anchor of {anchor_date(outcome)}:"]
        lines += _table(outcome, anchored, ("task", "metric", "anchor", *COLUMNS[3:]))
    for n in outcome.notes:
        lines.append(f"note: {n}")
    for d in outcome.differences:
        lines.append(f"context: {d.message}")
    for w in outcome.warnings:
        lines.append(f"warning: {w}")
    lines.append("")
    mark = {"fail": "FAIL", "drift": "DRIFT"}.get(outcome.verdict, "PASS")
    lines.append(f"{mark}: {headline(outcome)}")
    return "\n".join(lines)


def _table(outcome: Outcome, comparisons: list, cols: tuple[str, ...]) -> list[str]:
    rows = []
    depth = depths(outcome, comparisons)
    for c in comparisons:
        t = c.test
        metric = c.key.metric if c.key.filter == "none" else f"{c.key.metric},{c.key.filter}"
        name = " ".join(c.key.task.split())  # one row per comparison, whatever the name holds
        rows.append(
            (
                "  " * depth.get(c.key.task, 0) + name + (f" ({group_note(c)})" if c.is_group else ""),
                " ".join(metric.split()) + ("" if c.gated else " (info)"),
                fmt_num(t.baseline),
                fmt_num(t.candidate),
                delta_cell(c),
                fmt_p(c.p_adjusted) if c.gated else "–",
                c.verdict.upper() if c in outcome.failures or c in outcome.drifted else verdict_words(c.verdict),
            )
        )
    widths = [max(len(str(r[i])) for r in [cols, *rows]) for i in range(len(cols))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*cols).rstrip(), fmt.format(*("-" * w for w in widths))]
    return lines + [fmt.format(*r).rstrip() for r in rows]
