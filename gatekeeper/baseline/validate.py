"""Field-by-field checks of a baseline document, before anything is built from it.

A baseline can arrive in a pull request: its checksum proves nothing (anyone can recompute
it), so every field is checked for the type ``format.py`` writes, and the per-item values must
lie in the metric's range and reproduce the aggregate the file reports.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

from gatekeeper.errors import GateError
from gatekeeper.model import RunResults, is_finite, is_int
from gatekeeper.results.metrics import KINDS, NO_PROBLEM, kind_named
from gatekeeper.results.reader import close_enough, manifest_problem

_HASH_RE = re.compile(r"[0-9a-f]{16,64}")
_MAX_DOC_ID = (1 << 53) - 1
_MAX_DATE = 253402300799.0  # 9999-12-31T23:59:59Z


class _Bad(Exception):
    """One wrong field: ``(field, value, expected)``; ``validate_document`` names the file."""


def _want(ok: bool, field: str, value: Any, expected: str) -> None:
    if not ok:
        raise _Bad(field, value, expected)


def _opt(v: Any, *types: type) -> bool:
    return v is None or (isinstance(v, types) and not isinstance(v, bool))


def validate_document(path: Path, doc: dict) -> None:
    try:
        _check_document(doc)
    except _Bad as bad:
        if len(bad.args) == 2:
            raise GateError(f"{path}: {bad.args[0]}: {bad.args[1]} (edited by hand? re-record the baseline)") from None
        field, value, expected = bad.args
        text = repr(value)
        text = text if len(text) <= 40 else text[:37] + "..."
        raise GateError(
            f"{path}: {field} is {text}, expected {expected} (edited by hand? re-record the baseline)"
        ) from None


def _check_document(doc: dict) -> None:
    _want(_opt(doc.get("suite"), str), "suite", doc.get("suite"), "a string or null")
    _want(_opt(doc.get("suite_hash"), str), "suite_hash", doc.get("suite_hash"), "a string or null")
    _want(_opt(doc.get("created"), str), "created", doc.get("created"), "a date string")
    _check_provenance(doc.get("provenance"))
    groups = doc.get("groups", {})
    _want(isinstance(groups, dict), "groups", groups, "an object")
    for name, metrics in groups.items():
        _want(isinstance(metrics, dict) and all(is_finite(v) for v in metrics.values()),
              f"groups[{name}]", metrics, "an object of finite numbers")
    subtasks = doc.get("group_subtasks", {})
    _want(isinstance(subtasks, dict), "group_subtasks", subtasks, "an object")
    for name, tasks in subtasks.items():
        _want(isinstance(tasks, list) and all(isinstance(t, str) for t in tasks),
              f"group_subtasks[{name}]", tasks, "a list of task names")
    series = doc.get("series")
    _want(isinstance(series, list), "series", series, "a list")
    seen = set()
    for i, s in enumerate(series):
        _want(isinstance(s, dict), f"series[{i}]", s, "an object")
        key = _check_series_doc(i, s, doc.get("version", 1))
        _want(key not in seen, f"series[{i}]", key, "each (task, filter, metric) once")
        seen.add(key)
    _check_margins(doc.get("multiple_choice_margins", {}), {key[0] for key in seen})


def _check_margins(margins: Any, tasks: set[str]) -> None:
    """``multiple_choice_margins``: {task: {"doc_ids": [...], "margins": [number or null, ...]}} of tasks
    the file has series of (results/informative.py reads the design from them)."""
    _want(isinstance(margins, dict), "multiple_choice_margins", margins, "an object")
    for task, entry in margins.items():
        where = f"multiple_choice_margins[{task}]"
        _want(task in tasks, where, task, "a task of this baseline's series")
        _want(isinstance(entry, dict) and set(entry) == {"doc_ids", "margins"}, where, entry,
              'an object {"doc_ids": [...], "margins": [...]}')
        doc_ids, values = entry["doc_ids"], entry["margins"]
        _want(isinstance(doc_ids, list) and len(doc_ids) > 0 and all(is_int(d) and 0 <= d <= _MAX_DOC_ID for d in doc_ids),
              f"{where}.doc_ids", doc_ids, "a non-empty list of integers from 0 to 2**53-1")
        _want(len(set(doc_ids)) == len(doc_ids), f"{where}.doc_ids", "duplicates", "each doc once")
        _want(isinstance(values, list) and len(values) == len(doc_ids)
              and all(v is None or is_finite(v) for v in values),
              f"{where}.margins", values, f"a list of {len(doc_ids)} finite numbers or nulls")


def _check_provenance(prov: Any) -> None:
    _want(isinstance(prov, dict), "provenance", prov, "an object")
    for key in ("source", "lm_eval_version", "model_name", "model_dtype", "device",
                "chat_template_sha", "transformers_version", "suite_hash"):
        _want(_opt(prov.get(key), str), f"provenance.{key}", prov.get(key), "a string or null")
    for key in ("task_versions", "n_shot", "configs", "seeds", "n_samples", "task_hashes", "manifest"):
        _want(_opt(prov.get(key), dict), f"provenance.{key}", prov.get(key), "an object")
    _want(_opt(prov.get("batch_size"), str, int), "provenance.batch_size", prov.get("batch_size"),
          "a number, a string or null")
    limit = prov.get("limit")
    _want(limit is None or is_finite(limit), "provenance.limit", limit, "a number or null")
    date = prov.get("date")
    _want(date is None or (is_finite(date) and 0 <= float(date) <= _MAX_DATE), "provenance.date", date,
          "a Unix time in seconds or null")
    for task, n in (prov.get("n_shot") or {}).items():
        _want(n is None or (is_int(n) and 0 <= n < 1 << 31), f"provenance.n_shot[{task}]", n,
              "a number of examples")
    for task, cfg in (prov.get("configs") or {}).items():
        _want(isinstance(cfg, dict), f"provenance.configs[{task}]", cfg, "an object")
    for task, version in (prov.get("task_versions") or {}).items():
        _want(version is None or isinstance(version, str) or is_finite(version),
              f"provenance.task_versions[{task}]", version, "a version")
    for task, counts in (prov.get("n_samples") or {}).items():
        _want(isinstance(counts, dict) and all(is_int(counts.get(k)) and 0 <= counts[k] <= _MAX_DOC_ID
                                               for k in ("original", "effective")),
              f"provenance.n_samples[{task}]", counts, 'an object {"original": N, "effective": N}')
    for task, h in (prov.get("task_hashes") or {}).items():
        _want(isinstance(h, str) and _HASH_RE.fullmatch(h) is not None, f"provenance.task_hashes[{task}]",
              h, "16 to 64 hex digits")
    problem = manifest_problem(prov.get("manifest") or {})
    if problem:
        raise _Bad("provenance.manifest", problem)
    for name, seed in (prov.get("seeds") or {}).items():
        _want(seed is None or is_int(seed), f"provenance.seeds[{name}]", seed, "an integer or null")


def _check_series_doc(i: int, s: dict, version: int) -> tuple[str, str, str]:
    where = f"series[{i}]"
    for key in ("task", "filter", "metric", "kind", "aggregation"):
        _want(isinstance(s.get(key), str) and s[key] != "", f"{where}.{key}", s.get(key), "a non-empty string")
    allowed = [name for name, k in KINDS.items() if k.format_version <= version]
    _want(s["kind"] in allowed, f"{where}.kind", s["kind"], f"one of {', '.join(allowed)} (format version {version})")
    kind, agg = KINDS[s["kind"]], s["aggregation"]
    _want(kind.accepts(agg), f"{where}.aggregation", agg,
          f"one of {', '.join(kind.aggregations)}" if kind.aggregations else "!function NAME@HASH")
    _want(isinstance(s.get("higher_is_better"), bool), f"{where}.higher_is_better",
          s.get("higher_is_better"), "true or false")
    reported = s.get("reported")
    _want(reported is None or is_finite(reported), f"{where}.reported", reported, "a finite number or null")
    doc_ids = s.get("doc_ids")
    _want(isinstance(doc_ids, list) and len(doc_ids) > 0, f"{where}.doc_ids", doc_ids, "a non-empty list")
    if not (set(map(type, doc_ids)) == {int} and 0 <= min(doc_ids) and max(doc_ids) <= _MAX_DOC_ID):
        for d in doc_ids:  # the slow loop only to name the offending value
            _want(is_int(d) and 0 <= d <= _MAX_DOC_ID, f"{where}.doc_ids", d, "integers from 0 to 2**53-1")
    _want(len(set(doc_ids)) == len(doc_ids), f"{where}.doc_ids", "duplicates", "each doc once")
    n = len(doc_ids)
    values = s.get("values")
    _want(isinstance(values, list) and len(values) == n, f"{where}.values", values, f"a list of {n} items")
    bad = kind.doc_problem(values)
    _want(bad is NO_PROBLEM, f"{where}.values", bad, kind.doc_want)
    hashes = s.get("hashes")
    _want(isinstance(hashes, list) and len(hashes) == n, f"{where}.hashes", hashes, f"a list of {n} items")
    for row in hashes if not _all_hashes(hashes) else ():
        _want(isinstance(row, list) and len(row) == 3
              and all(isinstance(h, str) and _HASH_RE.fullmatch(h) for h in row),
              f"{where}.hashes", row, "[doc, prompt, target] hashes of 16 to 64 hex digits")
    clusters = s.get("clusters")
    _want(clusters is None or (isinstance(clusters, list) and len(clusters) == n
                               and all(isinstance(c, str) for c in clusters)),
          f"{where}.clusters", clusters, f"null or a list of {n} strings")
    return s["task"], s["filter"], s["metric"]


def _all_hashes(rows: list) -> bool:
    """Fast path: every row is three hex strings of 16 to 64 digits."""
    if set(map(type, rows)) != {list} or set(map(len, rows)) != {3}:
        return False
    flat = list(itertools.chain.from_iterable(rows))
    if set(map(type, flat)) != {str} or not set(map(len, flat)) <= set(range(16, 65)):
        return False
    return _HEX_ONLY.fullmatch("".join(flat)) is not None


_HEX_ONLY = re.compile(r"[0-9a-f]*")


def check_series(path: Path, res: RunResults) -> None:
    """Per-item values inside the metric's range and agreeing with the aggregate the file
    reports, with the tolerance the lm-eval reader uses: a baseline edited item by item (a
    recomputed checksum) no longer matches its own aggregate."""
    for key, s in res.series.items():
        problem = kind_named(s.kind).out_of_range(key.metric, s.values)
        if problem:
            raise GateError(f"{path}: {key}: {problem} (edited by hand? re-record the baseline)")
        if s.reported is None:
            continue  # nothing to check against (older writers stored no aggregate)
        try:
            recomputed = kind_named(s.kind).aggregate(s.aggregation, s.values)
        except ValueError as exc:
            raise GateError(f"{path}: {key}: cannot aggregate the per-item values ({exc})") from None
        if not close_enough(recomputed, float(s.reported)):
            raise GateError(
                f"{path}: {key}: the per-item values give {recomputed!r}, but the file reports "
                f"{s.reported!r} (edited by hand? re-record the baseline)"
            )
