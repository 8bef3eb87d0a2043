"""``gatekeeper plan``'s output: a terminal table, markdown, JSON (``compare/plan.py``'s ``Plan``)."""

from __future__ import annotations

import math
from typing import Any

from gatekeeper.compare.plan import CATCH_BAR, MutantRow, MutantsPlan, Plan, PlanRow


def _num(x: float, fmt: str = ".3g") -> str:
    return format(x, fmt) if math.isfinite(x) else ("∞" if x == math.inf else "–")


def _items(x: float) -> str:
    return f"{int(x):,}" if math.isfinite(x) else ("more than 10M" if x == math.inf else "–")


def _cells(r: PlanRow) -> list[str]:
    spread = (f"flips {r.flip_rate:.1%} ({r.spread_from})" if r.flip_rate is not None
              else ("–" if r.spread_from == "none" else f"{r.test} ({r.spread_from})"))
    share = f"{r.sequential_share:.0%}" if math.isfinite(r.sequential_share) else "–"
    power = f"{r.sequential_power:.0%}" if math.isfinite(r.sequential_power) else "–"
    mde = _num(r.mde) if r.mde != math.inf else f"cannot resolve ({r.n:,} items)"
    return [f"{r.key.task} {r.key.metric} ({r.key.filter})", f"{r.n:,}", f"{r.margin:g}", spread, mde,
            _num(r.smallest_margin, ".2g"), _items(r.items_needed), share, power,
            {True: "yes", False: "NO", None: "–"}[r.resolves]]


# The fixed gate evaluates every item and has 80% power at the MDE by definition; the sequential
# columns are the same figures for `gate --sequential`.
# "smallest margin": the least margin these items resolve (MDE at most twice the margin).
HEADER = ["metric", "n", "margin", "harmless spread", "MDE (80%)", "smallest margin", "items for 2x margin",
          "sequential items", "sequential power at MDE", "resolves"]


def _summary(p: Plan) -> list[str]:
    lines = [f"plan for suite {p.suite}: alpha {p.alpha:g}, {len(p.rows)} gated metrics, "
             f"spread {'measured against ' + p.against if p.against else 'assumed where not measured'}"]
    if math.isfinite(p.sequential_share):
        lines.append(f"a sequential gate ({p.looks} looks) is expected to evaluate {p.sequential_share:.0%} of the "
                     "items on a harmless change (the fixed gate: all of them)")
    if math.isfinite(p.informative_share):
        lines.append(f"an informative gate (--items informative) is expected to read at most {p.informative_share:.0%} "
                     "if the flips follow the baseline's margins as a small change's do (an early pass, where no drop "
                     "is to be found, reads less), and about what a sequential gate does if they are spread evenly"
                     + (f"; read whole: {', '.join(sorted(p.informative_whole))}" if p.informative_whole else ""))
    elif p.informative_whole:
        task, why = sorted(p.informative_whole.items())[0]
        lines.append(f"an informative gate (--items informative) cannot read this baseline's items in part ({task}: "
                     f"{why}{', ...' if len(p.informative_whole) > 1 else ''})")
    if p.against_problem:
        lines.append(f"warning: {p.against}: {p.against_problem}")
    powers = [r.sequential_power for r in p.rows if math.isfinite(r.sequential_power)]
    if powers:
        low, high = min(powers), max(powers)
        span = f"{low:.0%}" if round(low, 2) == round(high, 2) else f"{low:.0%}–{high:.0%}"
        lines.append(f"at each metric's MDE the sequential gate fails {span} of the time (the fixed gate: 80%)")
    return lines


def _notes(p: Plan) -> list[str]:
    return [f"{r.key.task} {r.key.metric}: {r.note}" for r in p.rows if r.note]


def to_terminal(p: Plan) -> str:
    rows = [HEADER, *[_cells(r) for r in p.rows]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    table = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]
    return "\n".join([*_summary(p), "", *table, *(["", *_notes(p)] if _notes(p) else [])]) + "\n"


def to_markdown(p: Plan) -> str:
    out = [f"### gatekeeper plan: {p.suite}", "", *_summary(p), "",
           "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in _cells(r)) + " |" for r in p.rows]
    if _notes(p):
        out += ["", *[f"- {n}" for n in _notes(p)]]
    return "\n".join(out) + "\n"


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def to_json(p: Plan) -> dict[str, Any]:
    return {
        "suite": p.suite, "alpha": p.alpha, "looks": p.looks, "against": p.against,
        "against_problem": p.against_problem or None,
        "sequential_share": _finite(p.sequential_share),
        "informative_share": _finite(p.informative_share),
        "informative_whole": dict(sorted(p.informative_whole.items())),
        "metrics": [{"task": r.key.task, "kind": "group" if r.group else "task", "filter": r.key.filter,
                     "metric": r.key.metric, "n": r.n,
                     "margin": r.margin, "level": r.level, "test": r.test, "flip_rate": r.flip_rate,
                     "spread_from": r.spread_from, "mde": _finite(r.mde),
                     "smallest_margin": _finite(r.smallest_margin),
                     "items_for_twice_margin": _finite(r.items_needed),
                     "items_for_twice_margin_unreachable": r.items_needed == math.inf,
                     "sequential_share": _finite(r.sequential_share),
                     "sequential_power": _finite(r.sequential_power), "resolves": r.resolves,
                     "note": r.note or None} for r in p.rows],
    }


MUTANT_HEADER = ["variant", "made as", "measured effect", "verdict", "gate", "items", "worst gated change",
                 "what was done"]


def _effect(r: MutantRow) -> str:
    if r.beyond_margin is None:
        return "–"
    return "beyond a margin" if r.beyond_margin else "within the margins"


def _mutant_cells(r: MutantRow) -> list[str]:
    ok = "ok" if r.right else ("MISSED" if r.should_fail else "FALSE ALARM")
    if r.borderline:
        ok = "borderline"
    if r.error:
        ok = "error"
    items = f"{r.items:.0%}" + (f" (look {r.look})" if r.look else "") if r.items is not None else "–"
    return [r.name, "defect" if r.defect else "harmless", _effect(r), r.verdict, ok, items, r.worst or "–", r.what]


def _mutant_summary(p: MutantsPlan) -> list[str]:
    due, within = p.due, p.within
    caught = p.caught
    alarms = sum(r.flagged for r in within)
    errors = [r for r in p.rows if r.error]
    rate = f" ({p.catch_rate:.0%})" if due else ""
    mode = "informative" if p.items == "informative" else ("sequential" if p.sequential else "every item")
    lines = [f"plan --mutants for suite {p.suite} on {p.model} ({mode}): "
             f"caught {caught} of {len(due)} variants that moved a gated metric beyond its margin{rate}, "
             f"{alarms} false alarm{'s' if alarms != 1 else ''} in {len(within)} that did not "
             "(each variant labelled once by its effect on every item, whatever mode is graded)"]
    borderline = [r for r in p.rows if r.borderline and not r.error]
    if borderline:
        lines.append("borderline, within one standard error of a margin and not counted: "
                     + "; ".join(f"{r.name} ({r.borderline}, {'failed' if r.flagged else 'passed'})" for r in borderline))
    quiet = [r.name for r in within if r.defect]
    if quiet:
        lines.append(f"made as defects but within the margins on this suite's items: {', '.join(quiet)} "
                     "(nothing a gate should fail here; a suite that must see them needs more items or smaller margins)")
    if due and not p.meets_bar:
        missed = [r for r in due if not r.flagged]
        lines.append(f"below the bar of {CATCH_BAR:.0%} of such defects caught with no false alarm"
                     + ("; to catch " + "; ".join(f"{r.name}, {r.items_needed}" for r in missed if r.items_needed)
                        if any(r.items_needed for r in missed) else ""))
    if errors:
        lines.append(f"{len(errors)} variant(s) could not be gated: " + "; ".join(f"{r.name}: {r.error}" for r in errors))
    return lines


def mutants_terminal(p: MutantsPlan) -> str:
    rows = [MUTANT_HEADER, *[_mutant_cells(r) for r in p.rows]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(MUTANT_HEADER))]
    table = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join([*_mutant_summary(p), "", *table]) + "\n"


def mutants_markdown(p: MutantsPlan) -> str:
    out = [f"### gatekeeper plan --mutants: {p.suite}", "", *_mutant_summary(p), "",
           "| " + " | ".join(MUTANT_HEADER) + " |", "|" + "---|" * len(MUTANT_HEADER)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in _mutant_cells(r)) + " |" for r in p.rows]
    return "\n".join(out) + "\n"


def mutants_json(p: MutantsPlan) -> dict[str, Any]:
    return {"suite": p.suite, "model": p.model, "sequential": p.sequential, "items": p.items,
            "catch_rate": _finite(p.catch_rate),
            "false_alarm_rate": _finite(p.false_alarm_rate), "caught": p.caught,
            "counted": len(p.due), "catch_bar": CATCH_BAR, "meets_bar": p.meets_bar,
            "borderline": [r.name for r in p.rows if r.borderline and not r.error],
            "variants": [{"name": r.name, "defect": r.defect, "what": r.what, "verdict": r.verdict,
                          "beyond_margin": r.beyond_margin, "borderline": r.borderline or None,
                          "counted": r.counted, "items_needed": r.items_needed or None, "should_fail": r.should_fail,
                          "exit_code": r.exit_code, "flagged": r.flagged, "right": r.right, "items": r.items,
                          "stopped_at": r.look, "worst": r.worst or None, "error": r.error} for r in p.rows]}
