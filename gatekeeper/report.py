"""Render an ``Outcome``: JSON (machines), markdown (PR comment / job summary), terminal table.

Task names, prompts and model outputs are untrusted text: a generation must not be able to
ping people, link issues or inject markup into a PR comment, so everything that did not come
from gatekeeper itself goes through ``escape_untrusted``.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass
from typing import Any

from gatekeeper import __version__
from gatekeeper.compare import Comparison, Outcome
from gatekeeper.model import Provenance

SCHEMA_VERSION = 1
GITHUB_COMMENT_LIMIT = 65_536
MAX_R2W_PER_METRIC = 5
WORD_JOINER = "\u2060"  # invisible; breaks GitHub's @mention and #ref autolinking
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|~$])")  # ">" and "<" become HTML entities; "$": math
# Bidi controls would let untrusted text display reordered (e.g. a fake "passed").
_BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


@dataclass
class ReportContext:
    suite: str | None = None
    baseline_ref: str | None = None
    candidate_ref: str | None = None
    run_url: str | None = None


# ---------------------------------------------------------------------------- escaping


def escape_untrusted(text: str, limit: int = 200) -> str:
    """Make arbitrary text safe inside markdown (tables included): one line, no markup."""
    text = " ".join(_BIDI.sub("", str(text)).split())  # newlines would break a table row
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    # Markdown first, then HTML: html.escape's entities must not get backslashes.
    text = _MD_SPECIAL.sub(r"\\\1", text)
    text = html.escape(text, quote=False)
    # Neutralise @mentions, #refs and team/user refs after escaping so the joiner survives.
    text = re.sub(r"@(?=\w)", "@" + WORD_JOINER, text)
    text = re.sub(r"#(?=\w)", "#" + WORD_JOINER, text)
    # GitHub links GH-123 to an issue (the backslash before "-" is gone once rendered) and
    # autolinks scheme://host URLs.
    text = re.sub(r"(?i)(gh\\-)(?=\d)", "\\1" + WORD_JOINER, text)
    text = text.replace("://", ":" + WORD_JOINER + "//")
    return text


# ---------------------------------------------------------------------------- numbers


def fmt_num(x: float | None, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if x == 0:
        return "0"
    if abs(x) >= 1000 or abs(x) < 10 ** -(digits - 1):
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}" if abs(x) >= 1 else f"{x:.{digits}f}"


def _signed(x: float) -> str:
    s = fmt_num(x)
    return s if s.startswith("-") or s in ("0", "–") else "+" + s


def fmt_p(x: float | None) -> str:
    if x is None:
        return "–"
    return "<1e-4" if x < 1e-4 else f"{x:.4f}"


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


# ---------------------------------------------------------------------------- JSON


def _provenance_json(p: Provenance) -> dict[str, Any]:
    return {
        "source": p.source,
        "model": p.model_name,
        "dtype": p.model_dtype,
        "batch_size": p.batch_size,
        "device": p.device,
        "lm_eval_version": p.lm_eval_version,
        "transformers_version": p.transformers_version,
        "task_versions": p.task_versions,
        "n_shot": p.n_shot,
        "seeds": p.seeds,
        "limit": p.limit,
        "task_hashes": p.task_hashes,
        "chat_template_sha": p.chat_template_sha,
        "suite_hash": p.suite_hash,
        "date": p.date,
        "manifest": p.manifest,
    }


def comparison_json(c: Comparison) -> dict[str, Any]:
    t = c.test
    lo, hi = c.interval
    return {
        "task": c.key.task,
        "metric": c.key.metric,
        "filter": c.key.filter,
        "gated": c.gated,
        "higher_is_better": c.higher_is_better,
        "margin": c.margin,
        "n": t.n,
        "n_clusters": t.n_clusters,
        "baseline": _finite(t.baseline),
        "candidate": _finite(t.candidate),
        "delta": _finite(t.delta),
        "ci_low": _finite(t.ci_low),
        "ci_high": _finite(t.ci_high),
        "confidence": t.confidence,
        "decision_level": c.level,
        "decision_ci_low": _finite(lo),
        "decision_ci_high": _finite(hi),
        "decision_confidence": 1 - 2 * c.level,
        "p_value": _finite(c.p_value if c.p_value is not None else t.p_worse),
        "p_adjusted": _finite(c.p_adjusted),
        "test": t.test,
        "n_resamples": t.n_resamples,
        "verdict": c.verdict,
        "mde": _finite(c.mde),
        "identical": t.identical,
        "rounded_items": c.rounded,
        "within_rounding": c.within_rounding,
        "right_to_wrong": c.right_to_wrong,
    }


def _delta_cell(c: Comparison) -> str:
    """Delta and the interval at the level the decision used (what the verdict agrees with).

    When no item changed there is no interval to speak of: say so instead of "[0, 0]"."""
    t = c.test
    if t.identical:
        return "0 (no item flipped)" if t.counts is not None else "0 (no item changed)"
    lo, hi = c.interval
    conf = f"{(1 - 2 * c.level) * 100:.3g}%"
    return f"{_signed(t.delta)} [{_signed(lo)}, {_signed(hi)}] {conf}"


def _strict(value: Any) -> Any:
    """``value`` with every non-finite float (anywhere: groups, margins, manifests) as None, so
    the report is strict JSON whoever serialises it."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def to_json(outcome: Outcome) -> dict[str, Any]:
    """The machine-readable report; its schema is documented in docs/report-schema.md."""
    return _strict(_report_dict(outcome))


def _report_dict(outcome: Outcome) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "gatekeeper_version": __version__,
        "suite": outcome.suite,
        "verdict": outcome.verdict,
        "regressions": len(outcome.regressions),
        "inconclusive": len(outcome.inconclusive),
        "policy": {
            "alpha": outcome.policy.alpha,
            "correction": outcome.policy.correction,
            "default_margin": outcome.policy.margin,
            "resamples": outcome.policy.resamples,
            "rounding": outcome.policy.rounding,
            "test": outcome.policy.test,
        },
        "comparisons": [comparison_json(c) for c in outcome.comparisons],
        "groups": {
            g: {"baseline": outcome.baseline.groups.get(g, {}), "candidate": vals}
            for g, vals in outcome.candidate.groups.items()
        },
        "provenance": {
            "baseline": _provenance_json(outcome.baseline.provenance),
            "candidate": _provenance_json(outcome.candidate.provenance),
            "differences": [d.message for d in outcome.differences],
        },
        "warnings": list(outcome.warnings),
        "notes": list(outcome.notes),
    }


# ---------------------------------------------------------------------------- markdown

_ICON = {"regressed": "❌", "improved": "🟢", "unchanged": "✅", "inconclusive": "⚠️"}


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
            " ".join(f"{c.key.task} {c.key.metric}".split()) + f" {_signed(c.test.delta)}"
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


def _row(c: Comparison) -> str:
    t = c.test
    name = escape_untrusted(c.key.task, 80)
    metric = escape_untrusted(c.key.metric if c.key.filter == "none" else f"{c.key.metric} ({c.key.filter})", 80)
    ci = _delta_cell(c)
    arrow = "↑" if c.higher_is_better else "↓"
    p = fmt_p(c.p_adjusted if c.gated else t.p_worse)
    verdict = f"{_ICON.get(c.verdict, '')} {c.verdict}"
    return (
        f"| {name} | {metric} {arrow} | {fmt_num(t.baseline)} | {fmt_num(t.candidate)} | {ci} | {p} | "
        f"{fmt_num(c.margin)} | {fmt_num(c.mde)} | {verdict} |"
    )


_TABLE_HEAD = (
    "| task | metric | baseline | candidate | Δ [interval at the decision's level] | p (adj.) | margin | MDE | verdict |\n"
    "|---|---|---:|---:|---|---:|---:|---:|---|"
)


def _table(rows: list[Comparison]) -> str:
    return "\n".join([_TABLE_HEAD, *(_row(c) for c in rows)])


def _rule_text(pol: Any, n_gated: int) -> str:
    if pol.test == "noninferiority":
        rule = (f"Regressed = the drop is significantly larger than the margin: one-sided p (vs. the margin) "
                f"< {pol.alpha:g} after {pol.correction} correction over {n_gated} gated metrics")
    else:
        rule = (f"Regressed = drop beyond the margin **and** one-sided p < {pol.alpha:g} after {pol.correction} "
                f"correction over {n_gated} gated metrics")
    return (
        f"{rule}. The interval is two-sided at 1 − 2α′, α′ being the one-sided level that row was tested at "
        "after the correction: regressed rows have its drop-side end past 0, and an end past the margin "
        f"always fails. Differences within {pol.rounding:g} relative count as rounding, not change. "
        "MDE = smallest true drop this rule flags with 80% power (margin and correction included)."
    )


def _details(summary: str, body: str) -> str:
    return f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>"


def _r2w_section(outcome: Outcome) -> str | None:
    lines = []
    for c in outcome.comparisons:
        if not c.gated or not c.right_to_wrong or c.verdict not in ("regressed", "inconclusive"):
            continue
        snippets = outcome.candidate.snippets.get((c.key.task, c.key.filter), {})
        base_snips = outcome.baseline.snippets.get((c.key.task, c.key.filter), {})
        lines.append(
            f"**{escape_untrusted(c.key.task, 80)} / {escape_untrusted(c.key.metric, 40)}**: "
            f"{len(c.right_to_wrong)} items went from right to wrong"
        )
        for doc_id in c.right_to_wrong[:MAX_R2W_PER_METRIC]:
            s = snippets.get(doc_id)
            if s is None:
                lines.append(f"- doc {doc_id}")
                continue
            was = base_snips.get(doc_id)
            was_txt = f"; baseline said {escape_untrusted(was.output, 60)}" if was else ""
            lines.append(
                f"- doc {doc_id}: prompt {escape_untrusted(s.prompt, 120)} → output "
                f"{escape_untrusted(s.output, 80)} (target {escape_untrusted(s.target, 60)}{was_txt})"
            )
        lines.append("")
    return "\n".join(lines).strip() or None


def _groups_section(outcome: Outcome) -> str | None:
    rows = []
    for g, vals in sorted(outcome.candidate.groups.items()):
        base = outcome.baseline.groups.get(g, {})
        for k, v in sorted(vals.items()):
            b = base.get(k)
            rows.append(f"| {escape_untrusted(g, 80)} | {escape_untrusted(k, 60)} | {fmt_num(b)} | {fmt_num(v)} |")
    if not rows:
        return None
    head = "| group | metric,filter | baseline | candidate |\n|---|---|---:|---:|"
    return head + "\n" + "\n".join(rows) + "\n\nGroups are reported as lm-eval aggregates them; their subtasks carry the tests."


def render_markdown(outcome: Outcome, ctx: ReportContext | None = None, *, max_chars: int = 60_000) -> str:
    """The PR comment / job summary body: verdict first, table, folded details, under max_chars."""
    ctx = ctx or ReportContext(suite=outcome.suite)
    icon = "❌" if outcome.regressions else ("⚠️" if outcome.inconclusive else "✅")
    head = f"### {icon} {escape_untrusted(headline(outcome, ctx), 400)}"
    gated = [c for c in outcome.comparisons if c.gated]
    info = [c for c in outcome.comparisons if not c.gated]
    pol = outcome.policy
    core = [
        head,
        "",
        _table(gated) if gated else "_No gated metrics._",
        "",
        "<sub>Δ = candidate − baseline in the metric's units (↑ higher is better, ↓ lower is better). "
        + _rule_text(pol, len(gated)) + "</sub>",
    ]
    # Optional sections, least important last: they are dropped from the end to fit.
    optional: list[tuple[str, str]] = []
    r2w = _r2w_section(outcome)
    if r2w:
        optional.append(("Items that went from right to wrong", r2w))
    if info:
        optional.append((f"Informational metrics ({len(info)})", _table(info)))
    groups = _groups_section(outcome)
    if groups:
        optional.append(("Groups", groups))
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
    lines = ["| | baseline | candidate |", "|---|---|---|"]
    for name, x, y in rows:
        lines.append(f"| {name} | {escape_untrusted(str(x), 80)} | {escape_untrusted(str(y), 80)} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- terminal


def render_terminal(outcome: Outcome) -> str:
    cols = ("task", "metric", "baseline", "candidate", "delta [interval at decision level]", "p adj", "verdict")
    rows = []
    for c in outcome.comparisons:
        t = c.test
        metric = c.key.metric if c.key.filter == "none" else f"{c.key.metric},{c.key.filter}"
        rows.append(
            (
                " ".join(c.key.task.split()),  # one row per comparison, whatever the name holds
                " ".join(metric.split()) + ("" if c.gated else " (info)"),
                fmt_num(t.baseline),
                fmt_num(t.candidate),
                _delta_cell(c),
                fmt_p(c.p_adjusted) if c.gated else "–",
                c.verdict.upper() if c.verdict == "regressed" and c.gated else c.verdict,
            )
        )
    widths = [max(len(str(r[i])) for r in [cols, *rows]) for i in range(len(cols))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*cols).rstrip(), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*r).rstrip() for r in rows]
    for n in outcome.notes:
        lines.append(f"note: {n}")
    for d in outcome.differences:
        lines.append(f"context: {d.message}")
    for w in outcome.warnings:
        lines.append(f"warning: {w}")
    lines.append("")
    mark = "FAIL" if outcome.verdict == "fail" else "PASS"
    lines.append(f"{mark}: {headline(outcome)}")
    return "\n".join(lines)
