"""The PR comment and job summary: verdict first, the gated table, details folded, size-capped.

Task names, prompts and model outputs are untrusted text: a generation must not be able to
ping people, link issues or inject markup into a PR comment, so everything that did not come
from gatekeeper itself goes through ``text.escape_untrusted``.
"""

from __future__ import annotations

from typing import Any

from gatekeeper import __version__
from gatekeeper.compare.outcome import Comparison, Outcome, failing_rows, flipped_items, verdict_words
from gatekeeper.report.headline import ICON, ReportContext, anchor_date, headline
from gatekeeper.report.numbers import delta_cell, depths, fmt_num, fmt_p, group_note
from gatekeeper.text import escape_untrusted

GITHUB_COMMENT_LIMIT = 65_536
MAX_R2W_PER_METRIC = 5


def _row(c: Comparison, depth: int = 0) -> str:
    t = c.test
    name = "↳ " * depth + escape_untrusted(c.key.task, 80)
    if c.is_group:
        name = f"**{name}** ({group_note(c)})"
    metric = escape_untrusted(c.key.metric if c.key.filter == "none" else f"{c.key.metric} ({c.key.filter})", 80)
    ci = delta_cell(c)
    arrow = "↑" if c.higher_is_better else "↓"
    p = fmt_p(c.p_adjusted if c.gated else t.p_worse)
    verdict = f"{ICON.get(c.verdict, '')} {verdict_words(c.verdict)}"
    return (
        f"| {name} | {metric} {arrow} | {fmt_num(t.baseline)} | {fmt_num(t.candidate)} | {ci} | {p} | "
        f"{fmt_num(c.margin)} | {fmt_num(c.mde)} | {verdict} |"
    )


_TABLE_HEAD = (
    "| task | metric | baseline | candidate | Δ [interval at the decision's level] | p (adj.) | margin | MDE | verdict |\n"
    "|---|---|---:|---:|---|---:|---:|---:|---|"
)


def _table(rows: list[Comparison], outcome: Outcome) -> str:
    depth = depths(outcome, rows)
    return "\n".join([_TABLE_HEAD, *(_row(c, depth.get(c.key.task, 0)) for c in rows)])


def _rule_text(pol: Any, n_gated: int, design: str = "") -> str:
    worse = " Worse, within margin = a significant drop no larger than the margin (not a failure)."
    if pol.test == "non-inferiority":
        return (
            f"Non-inferiority: a row passes only when its drop is shown to be below the margin (one-sided "
            f"p vs. the margin < {pol.alpha:g}, each of the {n_gated} gated metrics at that level: the suite "
            "passes only if all do, which keeps the chance of passing a worse model at alpha without a "
            "correction); a row that shows neither is inconclusive and fails. The interval is two-sided at "
            "1 − 2α, its drop-side upper end the bound that must lie below the margin. Differences within "
            f"{pol.rounding:g} relative count as rounding, not change. MDE column = the smallest margin "
            "these items show with 80% power when nothing changed." + worse
        )
    if pol.test == "inferiority":
        rule = (f"Regressed = the drop is significantly larger than the margin: adjusted one-sided p (vs. the "
                f"margin) < {pol.alpha:g}")
    else:
        rule = f"Regressed = drop beyond the margin **and** adjusted one-sided p < {pol.alpha:g}"
    rule += f" ({design or f'{pol.correction} correction over {n_gated} gated metrics'})"
    return (
        f"{rule}. The interval is two-sided at 1 − 2α′, α′ being the one-sided level that row was tested at "
        "after the correction: regressed rows have its drop-side end past 0, and an end past the margin "
        f"always fails. Differences within {pol.rounding:g} relative count as rounding, not change. "
        "MDE = smallest true drop this rule flags with 80% power, the margin included." + worse
    )


def _details(summary: str, body: str) -> str:
    return f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>"


def _r2w_section(outcome: Outcome) -> str | None:
    lines = []
    for c in failing_rows(outcome):
        total, items = flipped_items(outcome, c, MAX_R2W_PER_METRIC)
        if not items:
            continue
        lines.append(
            f"**{escape_untrusted(c.key.task, 80)} / {escape_untrusted(c.key.metric, 40)}**: "
            f"{total} items went from right to wrong" + (" in its tasks" if c.is_group else "")
        )
        for task, doc_id in items:
            where = f"{escape_untrusted(task, 80)} " if c.is_group else ""
            s = outcome.candidate.snippets.get((task, c.key.filter), {}).get(doc_id)
            if s is None:
                lines.append(f"- {where}doc {doc_id}")
                continue
            was = outcome.baseline.snippets.get((task, c.key.filter), {}).get(doc_id)
            was_txt = f"; baseline said {escape_untrusted(was.output, 60)}" if was else ""
            lines.append(
                f"- {where}doc {doc_id}: prompt {escape_untrusted(s.prompt, 120)} → output "
                f"{escape_untrusted(s.output, 80)} (target {escape_untrusted(s.target, 60)}{was_txt})"
            )
        lines.append("")
    return "\n".join(lines).strip() or None


def _groups_section(outcome: Outcome) -> str | None:
    """Groups whose scores are not compared (no aggregate, or not a mean of items): as lm-eval reports them."""
    compared = {(c.key.task, f"{c.key.metric},{c.key.filter}") for c in outcome.comparisons if c.is_group}
    rows = []
    for g, vals in sorted(outcome.candidate.groups.items()):
        vals = {k: v for k, v in vals.items() if (g, k) not in compared}
        base = outcome.baseline.groups.get(g, {})
        for k, v in sorted(vals.items()):
            b = base.get(k)
            rows.append(f"| {escape_untrusted(g, 80)} | {escape_untrusted(k, 60)} | {fmt_num(b)} | {fmt_num(v)} |")
    if not rows:
        return None
    head = "| group | metric,filter | baseline | candidate |\n|---|---|---:|---:|"
    return head + "\n" + "\n".join(rows) + "\n\nThese group scores are reported as lm-eval aggregates them, not tested; their subtasks are."


def render_markdown(outcome: Outcome, ctx: ReportContext | None = None, *, max_chars: int = 60_000) -> str:
    """The PR comment / job summary body: verdict first, table, folded details, under max_chars."""
    ctx = ctx or ReportContext(suite=outcome.suite)
    icon = "❌" if outcome.failures else ("📉" if outcome.verdict == "drift" else ("⚠️" if outcome.inconclusive else "✅"))
    head = f"### {icon} {escape_untrusted(headline(outcome, ctx), 400)}"
    gated = [c for c in outcome.comparisons if c.gated]
    info = [c for c in outcome.comparisons if not c.gated]
    pol = outcome.policy
    core = [
        head,
        "",
        _table(gated, outcome) if gated else "_No gated metrics._",
        "",
        "<sub>Δ = candidate − baseline in the metric's units (↑ higher is better, ↓ lower is better). "
        + _rule_text(pol, len(gated), outcome.design) + "</sub>",
    ]
    anchored = [c for c in outcome.anchor_comparisons if c.gated]
    if anchored and outcome.verdict == "drift":
        # The rows that decide the verdict come first, never folded away: a skimmer must not see
        # the all-green table against the promoted baseline before the anchor's failures.
        core = [head, "", f"**Against the anchor of {anchor_date(outcome)}** (the reference a person approved; "
                "the baseline moves with every promotion, the anchor only with `gatekeeper baseline pin`):",
                "", _table(anchored, outcome), "",
                "**Against the baseline** (the last promoted run; small steps that each pass here add up to the "
                "drift above):", "", *core[2:]]
    # Optional sections, least important last: they are dropped from the end to fit.
    optional: list[tuple[str, str]] = []
    if anchored and outcome.verdict != "drift":
        optional.append((f"Against the anchor of {anchor_date(outcome)}", _table(anchored, outcome)))
    r2w = _r2w_section(outcome)
    if r2w:
        optional.append(("Items that went from right to wrong", r2w))
    if info:
        optional.append((f"Informational metrics ({len(info)})", _table(info, outcome)))
    groups = _groups_section(outcome)
    if groups:
        optional.append(("Groups not tested", groups))
    if outcome.differences:
        optional.append(
            ("Provenance differences (context, not errors)",
             "\n".join(f"- {escape_untrusted(d.message, 300)}" for d in outcome.differences))
        )
    if outcome.warnings:
        optional.append(("Warnings", "\n".join(f"- {escape_untrusted(w, 400)}" for w in outcome.warnings)))
    if outcome.notes:
        optional.append(("Notes", "\n".join(f"- {escape_untrusted(w, 400)}" for w in outcome.notes)))
    optional.append(("Provenance", _provenance_md(outcome)))

    footer = []
    if ctx.run_url:
        footer.append(f"[Run details]({ctx.run_url})")
    footer.append(f"<sub>gatekeeper {__version__}</sub>")

    body = "\n".join(core)
    sections = [_details(s, b) for s, b in optional]
    trimmed = 0
    note = "\n\n_Details trimmed to fit GitHub's comment size limit; the full report is in the job summary artifacts (report JSON)._"
    while sections and len(body) + sum(len(s) + 2 for s in sections) + len(" · ".join(footer)) + len(note) + 4 > max_chars:
        sections.pop()
        trimmed += 1
    out = body + ("\n\n" + "\n\n".join(sections) if sections else "")
    if trimmed:
        out += note
    out += "\n\n" + " · ".join(footer)
    if len(out) > max_chars:  # the gated table alone is too long: cut rows, say so
        out = _cut(out, max_chars)
    return out


_TRUNCATED = "\n\n_Report truncated: too many rows for one comment; see the report JSON._"


def _cut(text: str, max_chars: int) -> str:
    """``text`` cut at a line end, plus a note, in at most ``max_chars`` characters (whatever
    the limit: the note itself is cut when the limit is tiny)."""
    keep = max_chars - len(_TRUNCATED)
    if keep <= 0:
        return _TRUNCATED.strip()[:max_chars]
    cut = text[:keep]
    line_end = cut.rfind("\n")
    return (cut[:line_end] if line_end > 0 else cut) + _TRUNCATED


def _provenance_md(outcome: Outcome) -> str:
    b, c = outcome.baseline.provenance, outcome.candidate.provenance
    rows = [
        ("model", b.model_name, c.model_name),
        ("dtype", b.model_dtype, c.model_dtype),
        ("batch size", b.batch_size, c.batch_size),
        ("device", b.device, c.device),
        ("lm-eval", b.lm_eval_version, c.lm_eval_version),
        ("suite hash", (b.suite_hash or "")[:12] or None, (c.suite_hash or "")[:12] or None),
    ]
    locked = [(p.manifest or {}).get("datasets") for p in (b, c)]
    if any(isinstance(d, dict) and d for d in locked):  # the hub datasets' commits (run/pins.py)
        rows.append(("hub datasets", *(", ".join(f"{k}@{str(v)[:7]}" for k, v in sorted(d.items()))
                                       if isinstance(d, dict) and d else None for d in locked)))
    lines = ["| | baseline | candidate |", "|---|---|---|"]
    for name, x, y in rows:
        lines.append(f"| {name} | {escape_untrusted(str(x), 80)} | {escape_untrusted(str(y), 80)} |")
    return "\n".join(lines)
