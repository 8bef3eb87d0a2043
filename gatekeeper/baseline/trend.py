"""A suite's history: one entry per gate, promote and pin, beside the baseline.

Nightly promotions move the baseline, so no single comparison shows a slow decline; the history
does. ``<name>.trend.jsonl`` sits beside ``<name>.json.gz``: a header line
``{"format": "gatekeeper-trend", "version": 1, "summary": {...}}``, then one entry per line,
oldest first (a line per night keeps a committed file's diffs readable). Each entry
(``model.TrendEntry``) has a row per gated metric: the candidate's aggregate, the baseline's and
the anchor's, the interval against the baseline and both verdicts.

Bounded: the newest ``KEEP`` entries are kept whole; older ones are folded into the header's
summary (per metric: entries, first and last date, min, max, mean). Written whole under the
baseline folder's lock (``store.store_lock``, the same as promote), atomically, never through a
symlink; read with a size cap, every field type-checked (exit 2 naming the line).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gatekeeper.baseline import anchor as anchors
from gatekeeper.baseline.store import check_target, store_lock
from gatekeeper.compare.outcome import Outcome
from gatekeeper.errors import GateError
from gatekeeper.files import TooLarge, atomic_write_bytes, read_limited
from gatekeeper.model import RunResults, TrendEntry, TrendRow
from gatekeeper.results import groups
from gatekeeper.results.metrics import kind_named
from gatekeeper.suite.policy import Policy
from gatekeeper.suite.suite import Suite

FORMAT = "gatekeeper-trend"
VERSION = 1
SUFFIX = ".trend.jsonl"
KEEP = 365  # entries kept whole: a year of nights
MAX_BYTES = 32 << 20  # 365 entries of 100 gated metrics are ~10 MB


def trend_path(baseline: Path) -> Path:
    return Path(baseline).with_name(anchors.baseline_stem(baseline) + SUFFIX)


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def date_of(results: RunResults | None) -> str | None:
    """The day a run was made (YYYY-MM-DD), from its provenance."""
    stamp = results.provenance.date if results is not None else None
    if not isinstance(stamp, (int, float)) or not math.isfinite(stamp):
        return None
    return datetime.fromtimestamp(stamp, timezone.utc).strftime("%Y-%m-%d")


# ----------------------------------------------------------------------------- entries


def entry_from_outcome(outcome: Outcome, *, baseline: Path, commit: str | None = None,
                       model: str | None = None) -> TrendEntry:
    """The history entry of one gate: a row per gated comparison."""
    against_anchor = {c.key: c for c in outcome.anchor_comparisons}
    rows = []
    for c in outcome.comparisons:
        if not c.gated:
            continue
        a = against_anchor.get(c.key)
        rows.append(TrendRow(
            key=str(c.key), value=_num(c.test.candidate), baseline=_num(c.test.baseline),
            anchor=_num(a.test.baseline) if a is not None else None,
            lo=_num(c.interval[0]), hi=_num(c.interval[1]), margin=float(c.margin),
            higher_is_better=bool(c.higher_is_better), verdict=c.verdict,
            anchor_verdict=a.verdict if a is not None else "",
        ))
    return TrendEntry(
        date=now_iso(), event="gate", verdict=outcome.verdict, commit=commit, model=model,
        baseline_id=anchors.file_id(baseline),
        anchor_id=anchors.file_id(anchors.anchor_path(baseline)) or anchors.file_id(baseline),
        anchor_date=date_of(outcome.anchor if outcome.anchor is not None else outcome.baseline),
        rows=rows,
    )


def entry_from_run(results: RunResults, policy: Policy, *, event: str, verdict: str, baseline: Path,
                   commit: str | None = None, model: str | None = None, who: str | None = None,
                   why: str | None = None) -> TrendEntry:
    """The history entry of a promote or pin: the stored run's aggregate of each gated metric."""
    rows = []
    for key in sorted(results.series, key=str):
        margin, gated = policy.lookup(key, results.parents(key.task))
        if not gated:
            continue
        s = results.series[key]
        value = kind_named(s.kind).aggregate(s.aggregation, s.values)
        rows.append(TrendRow(key=str(key), value=_num(value), margin=float(margin),
                             higher_is_better=bool(s.higher_is_better)))
    metrics, _ = groups.group_metrics(results)
    for gm in metrics:  # each group's own score, as lm-eval aggregates it (results/groups.py)
        margin, gated = policy.lookup(gm.key, results.parents(gm.group), group=True)
        if gated:
            first = results.series[gm.leaf_keys[0]]
            rows.append(TrendRow(key=str(gm.key), value=_num(groups.value(results, gm)), margin=float(margin),
                                 higher_is_better=bool(first.higher_is_better)))
    anchor_file = anchors.anchor_path(baseline)
    return TrendEntry(date=now_iso(), event=event, verdict=verdict, commit=commit, model=model,
                      baseline_id=anchors.file_id(baseline),
                      anchor_id=anchors.file_id(anchor_file) or anchors.file_id(baseline),
                      anchor_date=date_of(results) if event == "pin" else None, who=who, why=why, rows=rows)


def _num(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


# ----------------------------------------------------------------------------- the file


# What a reader of a broken history can do besides mending it: a gate can skip the history, while
# promote and pin must record their entry, so the file comes first (``check_readable``).
SKIP_HINT = "or gate with --no-history"


def check_readable(baseline: Path, suite: Suite, command: str, *, inside: bool = True) -> None:
    """Check ``baseline``'s history before ``command`` (promote, pin) writes anything: a history
    that cannot take the new entry must stop it while the baseline is still untouched."""
    check_target(trend_path(baseline), suite, inside=inside)
    read_trend(baseline, hint=f"{command} records its entry there, so mend the file first (nothing was changed)")


def read_trend(baseline: Path, hint: str = SKIP_HINT) -> tuple[list[TrendEntry], dict[str, Any]]:
    """(entries oldest first, summary of older ones) of ``baseline``'s history; none yet: ([], {}).
    ``hint``: what the caller can do besides mending a broken line."""
    path = trend_path(baseline)
    if path.is_symlink():
        raise GateError(f"{path}: is a symlink; the history is a real file (replace the link with the file itself)")
    if not path.is_file():
        return [], {}
    try:
        data = read_limited(path, MAX_BYTES)
    except TooLarge:
        raise GateError(f"{path}: over {MAX_BYTES >> 20} MiB; a history keeps {KEEP} entries, so this is not one "
                        "gatekeeper wrote") from None
    lines = data.decode("utf-8", errors="replace").splitlines()
    if not lines:
        return [], {}
    header = _json_line(path, 1, lines[0], hint)
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise GateError(f"{path}:1: not a gatekeeper history (expected format {FORMAT!r} version {VERSION})")
    summary = header.get("summary") or {}
    if not isinstance(summary, dict):
        raise GateError(f"{path}:1: summary is not an object")
    entries = [_entry(path, n, _json_line(path, n, line, hint)) for n, line in enumerate(lines[1:], start=2)
               if line.strip()]
    return entries, summary


def append(baseline: Path, entry: TrendEntry, suite: Suite, *, keep: int = KEEP,
           inside: bool = True) -> list[TrendEntry]:
    """Add ``entry`` to the history of ``baseline`` (under the store's lock); returns the entries
    now kept, oldest first."""
    path = trend_path(baseline)
    check_target(path, suite, inside=inside)
    with store_lock(baseline):
        entries, summary = read_trend(baseline)
        entries.append(entry)
        if len(entries) > keep:
            summary = _fold(summary, entries[:-keep])
            entries = entries[-keep:]
        head = {"format": FORMAT, "version": VERSION, "summary": summary}
        text = "\n".join(json.dumps(x, sort_keys=True, ensure_ascii=False, allow_nan=False)
                         for x in [head, *(asdict(e) for e in entries)]) + "\n"
        atomic_write_bytes(path, text.encode("utf-8"))
    return entries


def _fold(summary: dict[str, Any], old: list[TrendEntry]) -> dict[str, Any]:
    """``summary`` with the entries ``old`` folded in: per metric, count, dates, min, max, mean."""
    out = {k: dict(v) for k, v in (summary.get("metrics") or {}).items() if isinstance(v, dict)}
    for e in old:
        for r in e.rows:
            if r.value is None:
                continue
            s = out.setdefault(r.key, {"entries": 0, "first": e.date, "last": e.date, "min": r.value,
                                       "max": r.value, "mean": 0.0})
            n = int(s["entries"]) + 1
            s["mean"] = float(s["mean"]) + (r.value - float(s["mean"])) / n
            s.update(entries=n, last=e.date, min=min(float(s["min"]), r.value), max=max(float(s["max"]), r.value))
    return {"entries": int(summary.get("entries") or 0) + len(old), "metrics": out}


def _json_line(path: Path, n: int, line: str, hint: str = SKIP_HINT) -> dict[str, Any]:
    if line.startswith(("<<<<<<< ", "=======", ">>>>>>> ")):
        raise GateError(f"{path}:{n}: a git merge-conflict marker; delete the marker lines and keep both sides' "
                        f"entries, {hint}") from None
    try:
        value = json.loads(line, parse_constant=_no_constant)
    except _NotFinite as exc:
        raise GateError(f"{path}:{n}: {exc} is not a finite number; gatekeeper never writes one (fix or delete "
                        f"the line), {hint}") from None
    except ValueError as exc:
        raise GateError(f"{path}:{n}: not JSON ({exc}); fix or delete that line (a merge conflict? keep both "
                        f"sides' lines), {hint}") from None
    if not isinstance(value, dict):
        raise GateError(f"{path}:{n}: expected an object")
    return value


class _NotFinite(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _NotFinite(name)  # NaN, Infinity, -Infinity: json.loads takes them, a history never holds them


_ENTRY_TYPES = {f.name: f.type for f in fields(TrendEntry)}
_ROW_FIELDS = {f.name for f in fields(TrendRow)}
_NUMBERS = ("value", "baseline", "anchor", "lo", "hi")


def expected_anchor(baseline: Path) -> tuple[str | None, str | None]:
    """(the anchor file id the newest history entry records when the suite had an anchor then, its
    anchor differing from its baseline, else None; why the history could not be read, else None).
    An unreadable history (a merge conflict's markers, a hand edit) is still searched line by line:
    whether an anchor is expected must not depend on the rest of the file parsing."""
    try:
        entries, _ = read_trend(baseline)
        problem = None
    except GateError as exc:
        entries, problem = _readable_entries(trend_path(baseline)), str(exc)
    if not entries:
        return None, problem
    last = entries[-1]
    return (last.anchor_id if last.anchor_id and last.anchor_id != last.baseline_id else None), problem


def _readable_entries(path: Path) -> list[TrendEntry]:
    """The lines of ``path`` that are history entries on their own, oldest first."""
    try:
        data = read_limited(path, MAX_BYTES)
    except (OSError, TooLarge):
        return []
    entries = []
    for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines()[1:], start=2):
        try:
            entries.append(_entry(path, n, _json_line(path, n, line)))
        except GateError:
            continue
    return entries


def _entry(path: Path, n: int, doc: dict[str, Any]) -> TrendEntry:
    where = f"{path}:{n}"
    unknown = sorted(set(doc) - set(_ENTRY_TYPES))
    if unknown:
        raise GateError(f"{where}: unknown field {unknown[0]!r}")
    for name in ("date", "event", "verdict"):
        if not isinstance(doc.get(name), str):
            raise GateError(f"{where}: {name} is missing or not a string")
    for name in ("commit", "model", "baseline_id", "anchor_id", "anchor_date", "who", "why"):
        if doc.get(name) is not None and not isinstance(doc[name], str):
            raise GateError(f"{where}: {name} is not a string")
    rows = doc.get("rows", [])
    if not isinstance(rows, list):
        raise GateError(f"{where}: rows is not a list")
    return TrendEntry(**{**doc, "rows": [_row(where, i, r) for i, r in enumerate(rows)]})


def _row(where: str, i: int, r: Any) -> TrendRow:
    if not isinstance(r, dict) or not isinstance(r.get("key"), str) or set(r) - _ROW_FIELDS:
        raise GateError(f"{where}: rows[{i}] is not a history row (key, value, baseline, anchor, ...)")
    for name in _NUMBERS:
        v = r.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise GateError(f"{where}: rows[{i}].{name} is not a finite number")
    margin = r.get("margin", 0.0)
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin):
        raise GateError(f"{where}: rows[{i}].margin is not a finite number")
    for name in ("verdict", "anchor_verdict"):
        if not isinstance(r.get(name, ""), str):
            raise GateError(f"{where}: rows[{i}].{name} is not a string")
    return TrendRow(**r)
