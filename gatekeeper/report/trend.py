"""A suite's history, drawn: Mermaid line charts for GitHub, a sparkline table for the terminal.

Input: the entries of ``baseline/trend.py`` (``model.TrendEntry``), oldest first. Per gated
metric, the chart has three lines: the candidate's aggregate on each night, the anchor's value,
and the margin's edge (anchor − margin where higher is better, anchor + margin where lower is):
a night below (above) that line is what ``drift`` fails. GitHub renders ```` ```mermaid ````
blocks in issues, comments and job summaries; ``xychart-beta`` is Mermaid's line chart.
"""

from __future__ import annotations

import math
import re
from typing import Any

from gatekeeper.model import TrendEntry, TrendRow

SPARKS = "▁▂▃▄▅▆▇█"
CHART_POINTS = 60  # nights per chart: a readable x-axis
DATED_POINTS = 8  # up to this many nights on different days, each is labelled with its day
TIMED_POINTS = 4  # up to this many gates, some on one day, each is labelled with its day and time
# Bars for each night's value (a value equal to the anchor stays visible under the anchor's line),
# then two lines: mid-tone colours readable on GitHub's light and dark backgrounds (blue, amber,
# red). The legend names shape and position as well as colour, so it reads in greyscale too.
PALETTE = ("#2f81f7", "#d4a72c", "#e5534b")


def legend(higher_is_better: bool = True) -> str:
    """What the chart draws, told by shape and position (colour is only a third cue)."""
    anchor, edge = ("upper", "lower") if higher_is_better else ("lower", "upper")
    return (f"bars (blue): each night's value · {anchor} line (amber): the anchor · {edge} line (red): the "
            "margin's edge (a bar past it is a drop beyond the margin; with margin 0 the lines coincide)")


_INIT = ('%%{init: {"themeVariables": {"xyChart": {"plotColorPalette": "' + ", ".join(PALETTE) + '"}}}}%%')
_LABEL_SAFE = re.compile(r"[^A-Za-z0-9_.,:/()+ -]")


def series(entries: list[TrendEntry], metrics: list[str] | None = None) -> dict[str, list[tuple[TrendEntry, TrendRow]]]:
    """{metric key: [(entry, row)] oldest first} of the gates (a promote or pin stores a run that
    a gate already measured). ``metrics``: the keys to keep."""
    out: dict[str, list[tuple[TrendEntry, TrendRow]]] = {}
    for e in entries:
        if e.event != "gate":
            continue
        for r in e.rows:
            if r.value is not None and (not metrics or r.key in metrics):
                out.setdefault(r.key, []).append((e, r))
    return out


def anchor_value(row: TrendRow) -> float | None:
    """The anchor a row was judged against: its own anchor, else its baseline (its own anchor)."""
    return row.anchor if row.anchor is not None else row.baseline


def edge(row: TrendRow) -> float | None:
    """The margin's edge below (above) the anchor: crossing it is a drop beyond the margin."""
    a = anchor_value(row)
    if a is None:
        return None
    return a - row.margin if row.higher_is_better else a + row.margin


def mermaid(entries: list[TrendEntry], metrics: list[str] | None = None, *, points: int = CHART_POINTS) -> str:
    """One ```mermaid xychart-beta block per gated metric (last ``points`` nights), or ""."""
    blocks = []
    for key, rows in series(entries, metrics).items():
        rows = rows[-points:]
        values = [r.value for _, r in rows]
        anchors = [_carry(anchor_value(r), values[i]) for i, (_, r) in enumerate(rows)]
        edges = [_carry(edge(r), anchors[i]) for i, (_, r) in enumerate(rows)]
        lo, hi = _axis([*values, *anchors, *edges])
        labels = _x_labels([e.date for e, _ in rows])
        x_axis = "[" + ", ".join(f'"{x}"' for x in labels) + "]" if labels else _numbered([e.date for e, _ in rows])
        blocks.append("\n".join([
            legend(rows[-1][1].higher_is_better),
            "",
            "```mermaid",
            _INIT,
            "xychart-beta",
            f'    title "{_label(key)}"',
            f"    x-axis {x_axis}",
            f'    y-axis "{_label(key.rsplit("/", 1)[-1])}" {_n(lo)} --> {_n(hi)}',
            f"    bar [{', '.join(_n(v) for v in values)}]",
            f"    line [{', '.join(_n(v) for v in anchors)}]",
            f"    line [{', '.join(_n(v) for v in edges)}]",
            "```",
        ]))
    return "\n\n".join(blocks)


def markdown(entries: list[TrendEntry], metrics: list[str] | None = None) -> str:
    """The trend section of the job summary and the tracking issue: charts plus a legend."""
    charts = mermaid(entries, metrics)
    if not charts:
        return ""
    pins = [e for e in entries if e.event == "pin"]
    pinned = (f" The anchor was last pinned on {_day(pins[-1].date)}"
              + (f" by {_label(pins[-1].who or '')}" if pins[-1].who else "")
              + (f": {_label(pins[-1].why or '')}." if pins[-1].why else ".")) if pins else ""
    return ("#### Trend\n\nEach night's value, the anchor and the margin's edge: a night past the edge is a "
            f"drop beyond the margin since the anchor.{pinned}\n\n{charts}")


def compact(entries: list[TrendEntry], metrics: list[str] | None = None, *, points: int = 20,
            rows: int = 30) -> str:
    """The PR comment's trend: per gated metric, its last ``points`` gates on the default branch as
    a sparkline, with the newest value and the anchor ("" without history)."""
    found = series(entries, metrics)
    if not found:
        return ""
    lines = [f"#### Trend on the default branch (last {points} gates)", "",
             "| metric | trend | newest | anchor |", "|---|---|---:|---:|"]
    for key, pts in list(found.items())[:rows]:
        values = [r.value for _, r in pts[-points:]]
        lines.append(f"| {_label(key)} | {sparkline(values)} | {_num(values[-1])} | {_num(anchor_value(pts[-1][1]))} |")
    if len(found) > rows:
        lines.append(f"\n{len(found) - rows} more metrics: `gatekeeper history --suite ...`")
    return "\n".join(lines)


def sparkline(values: list[float]) -> str:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return ""
    lo, hi = min(finite), max(finite)
    span = hi - lo
    # A constant series is drawn mid-height: all-bottom bars would read "at the minimum".
    return "".join(" " if v is None else SPARKS[3 if span == 0 else min(7, int((v - lo) / span * 8))] for v in values)


def terminal(entries: list[TrendEntry], metrics: list[str] | None = None, *, points: int = 30) -> str:
    """`gatekeeper history`: one row per gated metric, the last ``points`` values as a sparkline."""
    cols = ("metric", "entries", "first", "last", "anchor", "since anchor", f"last {points}", "last verdict")
    rows = []
    for key, pts in series(entries, metrics).items():
        e_last, r_last = pts[-1]
        a = anchor_value(r_last)
        since = "-" if a is None or r_last.value is None else f"{r_last.value - a:+.4g}"
        verdict = r_last.anchor_verdict if e_last.verdict == "drift" else (r_last.verdict or e_last.verdict)
        rows.append((key, str(len(pts)), _num(pts[0][1].value), _num(r_last.value), _num(a), since,
                     sparkline([r.value for _, r in pts[-points:]]), f"{e_last.verdict}: {verdict}"
                     if verdict and verdict != e_last.verdict else e_last.verdict))
    if not rows:
        return "no history yet: `gatekeeper gate` and `gatekeeper baseline promote` add to it"
    widths = [max(len(str(r[i])) for r in [cols, *rows]) for i in range(len(cols))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*cols).rstrip(), fmt.format(*("-" * w for w in widths)),
                      *(fmt.format(*r).rstrip() for r in rows)])


def to_json(entries: list[TrendEntry], summary: dict[str, Any], metrics: list[str] | None = None) -> dict[str, Any]:
    """`gatekeeper history --format json`: per metric, the points with both references."""
    return {
        "format": "gatekeeper-history",
        "version": 1,
        "entries": len(entries),
        "summarised": summary,
        "metrics": {
            key: [{"date": e.date, "event": e.event, "verdict": e.verdict, "commit": e.commit, "model": e.model,
                   "value": r.value, "baseline": r.baseline, "anchor": anchor_value(r), "margin": r.margin,
                   "interval": [r.lo, r.hi], "row_verdict": r.verdict, "anchor_verdict": r.anchor_verdict,
                   "baseline_id": e.baseline_id, "anchor_id": e.anchor_id}
                  for e, r in pts]
            for key, pts in series(entries, metrics).items()
        },
        "pins": [{"date": e.date, "who": e.who, "why": e.why, "anchor_id": e.anchor_id}
                 for e in entries if e.event == "pin"],
    }


def _x_labels(dates: list[str]) -> list[str]:
    """One short label per point, all different (Mermaid draws points with equal labels at one x),
    or [] when they would not fit: the day, up to DATED_POINTS nights on different days; the day
    and time, up to TIMED_POINTS gates at different minutes; else the axis is numbered."""
    days = [_day(d) for d in dates]
    if len(set(days)) == len(days) and len(days) <= DATED_POINTS:
        return days
    timed = [_label(d[5:16].replace("T", " ")) for d in dates]
    if len(set(timed)) == len(timed) and len(timed) <= TIMED_POINTS:
        return timed
    return []


def _numbered(dates: list[str]) -> str:
    """A numbered x-axis that says which dates it spans (nights, or gates when a day has several)."""
    what = "night" if len({_day(d) for d in dates}) == len(dates) else "gate"
    return f'"{what}, {_day(dates[0])} to {_day(dates[-1])}" 1 --> {len(dates)}'


def _carry(value: float | None, fallback: float | None) -> float | None:
    return value if value is not None else fallback


def _axis(values: list[float | None]) -> tuple[float, float]:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    pad = (hi - lo) * 0.1 or abs(hi) * 0.05 or 0.05
    return lo - pad, hi + pad


def _n(value: float | None) -> str:
    return "0" if value is None or not math.isfinite(value) else f"{value:.6g}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _day(date: str) -> str:
    return _label(date[:10])



def _label(text: str) -> str:
    """Text safe inside a Mermaid quoted label (no quotes, no newlines, bounded)."""
    return _LABEL_SAFE.sub("_", " ".join(str(text).split()))[:80]
