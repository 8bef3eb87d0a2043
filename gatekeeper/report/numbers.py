"""Numbers as every rendering of a report shows them (markdown, terminal, action log)."""

from __future__ import annotations

import math

from gatekeeper.compare.outcome import Comparison, Outcome


def fmt_num(x: float | None, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if x == 0:
        return "0"
    if abs(x) >= 1000 or abs(x) < 10 ** -(digits - 1):
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}" if abs(x) >= 1 else f"{x:.{digits}f}"


def signed(x: float) -> str:
    s = fmt_num(x)
    return s if s.startswith("-") or s in ("0", "–") else "+" + s


def fmt_p(x: float | None) -> str:
    if x is None:
        return "–"
    return "<1e-4" if x < 1e-4 else f"{x:.4f}"


def finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def delta_cell(c: Comparison) -> str:
    """Delta and the interval at the level the decision used (what the verdict agrees with).

    When no item changed there is no interval to speak of: say so instead of "[0, 0]"; when
    the items that changed did so by rounding only, the real (tiny) delta and that."""
    t = c.test
    if t.identical and c.rounded:
        return f"{signed(t.delta)} (rounding only)"
    if t.identical:
        return "0 (no item flipped)" if t.counts is not None else "0 (no item changed)"
    lo, hi = c.interval
    return f"{signed(t.delta)} [{signed(lo)}, {signed(hi)}] {confidence(c.level)}"


def confidence(level: float) -> str:
    """The two-sided confidence of an interval tested at one-sided ``level``: "95%", and at a
    sequential look's tiny level "99.98%" (never "100%", which would claim certainty)."""
    pct = (1 - 2 * level) * 100
    for digits in range(0, 8):
        text = f"{pct:.{digits}f}"
        if float(text) < 100 and (digits >= 1 or pct == round(pct)):
            return text.rstrip("0").rstrip(".") + "%" if "." in text else text + "%"
    return f"{pct}%"


def depths(outcome: Outcome, comparisons: list[Comparison]) -> dict[str, int]:
    """How many of the groups shown in ``comparisons`` hold each task or group (0: top level), so
    a table can indent subtasks (and nested groups) under their group's rows."""
    shown = {c.key.task for c in comparisons if c.is_group}
    return {c.key.task: sum(1 for g in outcome.candidate.parents(c.key.task) if g in shown) for c in comparisons}


def group_note(c: Comparison) -> str:
    """What a group row is: ``group of 57, by size`` (lm-eval's weighting of its subtasks)."""
    how = "by size" if c.weight_by_size else "unweighted"
    return f"group of {len(c.subtasks)}, {how}"
