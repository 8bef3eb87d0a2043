"""Baseline files: the per-item results of the accepted model, small, versioned, checksummed.

A baseline is gzip'd JSON (gzip mtime 0, so equal content gives equal bytes and no git noise)::

    {"format": "gatekeeper-baseline", "version": 1, "suite": "demo", "suite_hash": "...",
     "created": "2026-01-30T12:00:00Z", "provenance": {...}, "groups": {...},
     "group_subtasks": {...},
     "series": [{"task", "filter", "metric", "kind", "aggregation", "higher_is_better",
                 "reported", "doc_ids": [...], "values": [...], "hashes": [[doc, prompt, target]],
                 "clusters": [...] or null}],
     "checksum": "sha256:<hex of the canonical JSON of everything else>"}

No prompts or generations are kept (only 16-hex-digit prefixes of lm-eval's item hashes),
so a baseline is a fraction of the size of lm-eval's samples files. Floats are written with
``repr`` precision, so loading gives back exactly the values that were saved.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import asdict, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gatekeeper.model import GateError, MetricSeries, Provenance, RunResults, SeriesKey

if TYPE_CHECKING:
    from gatekeeper.suite import Suite

FORMAT = "gatekeeper-baseline"
FORMAT_VERSION = 1
HASH_CHARS = 16  # 64 bits per item hash: collisions are irrelevant at any realistic suite size
_GZIP_MAGIC = b"\x1f\x8b"


# ----------------------------------------------------------------------------- save / load


def save_baseline(
    results: RunResults, path: Path, *, suite_name: str | None, suite_hash: str | None
) -> None:
    """Write ``results`` as a baseline file, whole or not at all."""
    path = Path(path)
    doc = to_document(results, suite_name=suite_name, suite_hash=suite_hash)
    atomic_write_bytes(path, gzip.compress(_dump(doc).encode("utf-8"), compresslevel=9, mtime=0))


def load_baseline(path: Path) -> RunResults:
    """Read a baseline file; refuses unknown formats and files whose checksum does not match."""
    path = Path(path)
    doc = _read_document(path)
    if doc.get("format") != FORMAT:
        raise GateError(f"{path}: not a gatekeeper baseline (format {doc.get('format')!r})")
    version = doc.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
        raise GateError(
            f"{path}: baseline format version {version!r} is not supported "
            f"(this gatekeeper reads version {FORMAT_VERSION}; upgrade gatekeeper or re-record)"
        )
    body = {k: v for k, v in doc.items() if k != "checksum"}
    if doc.get("checksum") != _checksum(body):
        raise GateError(f"{path}: checksum mismatch (file corrupted or edited by hand)")
    try:
        return from_document(doc, source=str(path))
    except (KeyError, TypeError, ValueError) as exc:
        raise GateError(f"{path}: malformed baseline ({type(exc).__name__}: {exc})") from None


def is_baseline_file(path: Path) -> bool:
    """True for a gzip'd gatekeeper baseline (content decides, not the file name)."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            if fh.read(2) != _GZIP_MAGIC:
                return False
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            head = fh.read(1024)  # keys are sorted: checksum, created, format, ...
    except (OSError, EOFError, UnicodeDecodeError, zlib.error):
        return False
    return head.startswith("{") and f'"format":"{FORMAT}"' in head


def check_suite(baseline: RunResults, suite: Suite) -> None:
    """Refuse a baseline measured under a different suite (tasks, shots, seeds, lm-eval pin)."""
    recorded = baseline.provenance.suite_hash
    if recorded and recorded != suite.hash:
        raise GateError(
            f"{baseline.provenance.source}: baseline was recorded for suite hash {recorded[:12]}, "
            f"but {suite.path} now has hash {suite.hash[:12]}; the suite changed what it measures, "
            "so re-record the baseline (gatekeeper baseline promote RUN_DIR --suite ...)"
        )


# ----------------------------------------------------------------------------- record / promote


def record(run_dir: Path, suite: Suite, *, force: bool = False, path: Path | None = None) -> Path:
    """Store ``run_dir`` as the suite's first baseline; refuses to overwrite one unless ``force``."""
    target = Path(path) if path is not None else suite.baseline_path
    _refuse_existing(target, force)  # before reading the run: the cheap check first
    return record_results(_load_run_for(run_dir, suite), suite, force=force, path=target)


def promote(run_dir: Path, suite: Suite, *, path: Path | None = None) -> Path:
    """Replace the suite's baseline with ``run_dir``; the previous one moves to ``history/``."""
    return promote_results(_load_run_for(run_dir, suite), suite, path=path)


def record_results(
    results: RunResults, suite: Suite, *, force: bool = False, path: Path | None = None
) -> Path:
    target = Path(path) if path is not None else suite.baseline_path
    _refuse_existing(target, force)
    save_baseline(results, target, suite_name=suite.name, suite_hash=suite.hash)
    return target


def promote_results(results: RunResults, suite: Suite, *, path: Path | None = None) -> Path:
    target = Path(path) if path is not None else suite.baseline_path
    if target.is_file():
        # Copy first, replace second: a failure at any point leaves the current baseline valid.
        atomic_write_bytes(_history_path(target), target.read_bytes())
    save_baseline(results, target, suite_name=suite.name, suite_hash=suite.hash)
    return target


def _refuse_existing(target: Path, force: bool) -> None:
    if target.exists() and not force:
        raise GateError(
            f"{target}: a baseline already exists; use `gatekeeper baseline promote` to replace it "
            "(keeps the old one in history/) or --force"
        )


def history(path: Path) -> list[Path]:
    """Previous baselines of ``path``, oldest first."""
    path = Path(path)
    folder = path.parent / "history"
    if not folder.is_dir():
        return []
    def order(p: Path) -> tuple[str, int]:
        stamp = p.name[len(_stem(path)) + 1 : -len(".json.gz")]
        base, _, n = stamp.partition("-")
        return base, int(n) if n.isdigit() else 0

    return sorted(folder.glob(f"{_stem(path)}.*.json.gz"), key=order)


def show(path: Path) -> str:
    """A human summary: suite, hash, model, date, tasks, metrics with aggregates, history."""
    path = Path(path)
    if not path.is_file():
        raise GateError(f"{path}: no baseline file (record one with `gatekeeper baseline record`)")
    doc = _read_document(path)
    res = load_baseline(path)
    prov = res.provenance
    man = prov.manifest or {}
    lines = [
        f"baseline   {path}",
        f"suite      {doc.get('suite') or '-'}  (hash {(prov.suite_hash or '-')[:12]})",
        f"model      {man.get('model') or prov.model_name or '-'}"
        + (f"  dtype {prov.model_dtype}" if prov.model_dtype else ""),
        f"recorded   {doc.get('created') or '-'}",
        f"lm-eval    {prov.lm_eval_version or '-'}",
        f"size       {path.stat().st_size:,} bytes, {len(res.series)} series",
        "",
        f"{'task':<28} {'metric,filter':<34} {'n':>6} {'value':>10}",
    ]
    for key in sorted(res.series, key=lambda k: (k.task, k.metric, k.filter)):
        s = res.series[key]
        value = "-" if s.reported is None else f"{s.reported:.4f}"
        lines.append(f"{key.task:<28} {key.metric + ',' + key.filter:<34} {s.n:>6} {value:>10}")
    for group, metrics in sorted(res.groups.items()):
        for name, value in sorted(metrics.items()):
            if isinstance(value, (int, float)) and "_stderr" not in name:
                lines.append(f"{group + ' (group)':<28} {name:<34} {'':>6} {value:>10.4f}")
    past = history(path)
    lines.append("")
    lines.append(f"history    {len(past)} previous baseline(s)")
    lines.extend(f"           {p.name}" for p in past)
    return "\n".join(lines)


# ----------------------------------------------------------------------------- document


def to_document(results: RunResults, *, suite_name: str | None, suite_hash: str | None) -> dict:
    prov = asdict(results.provenance)
    if suite_hash is not None:
        prov["suite_hash"] = suite_hash
    body = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "suite": suite_name,
        "suite_hash": prov["suite_hash"],
        # The run's own start time, not "now": re-recording the same run gives the same bytes.
        "created": _iso(prov.get("date")),
        "provenance": prov,
        "groups": results.groups,
        "group_subtasks": results.group_subtasks,
        "series": [_series_doc(results.series[k]) for k in sorted(results.series, key=_key_order)],
    }
    body = json.loads(_dump(body))  # normalise numpy scalars / tuples exactly as they will be read
    body["checksum"] = _checksum(body)
    return body


def from_document(doc: dict, *, source: str) -> RunResults:
    known = {f.name for f in fields(Provenance)}
    prov_data = {k: v for k, v in doc["provenance"].items() if k in known}
    recorded_from = prov_data.get("source")
    prov_data["source"] = source
    prov = Provenance(**prov_data)
    series = {}
    for s in doc["series"]:
        ms = _series_from(s)
        series[ms.key] = ms
    notes = [f"baseline recorded from {recorded_from}"] if recorded_from else []
    return RunResults(
        provenance=prov,
        series=series,
        groups=doc.get("groups") or {},
        group_subtasks=doc.get("group_subtasks") or {},
        notes=notes,
    )


def _series_doc(s: MetricSeries) -> dict:
    hashes = np.asarray(s.hashes, dtype=str)
    return {
        "task": s.key.task,
        "filter": s.key.filter,
        "metric": s.key.metric,
        "kind": s.kind,
        "aggregation": s.aggregation,
        "higher_is_better": bool(s.higher_is_better),
        "reported": None if s.reported is None else float(s.reported),
        "doc_ids": [int(d) for d in s.doc_ids],
        "values": _values_doc(s),
        "hashes": [[str(h)[:HASH_CHARS] for h in row] for row in hashes.reshape(-1, 3)],
        "clusters": None if s.clusters is None else [str(c) for c in s.clusters],
    }


def _values_doc(s: MetricSeries) -> list:
    if s.kind == "mean":
        return [float(v) for v in np.asarray(s.values, dtype=np.float64)]
    if s.kind == "ratio":
        return [[float(a), float(b)] for a, b in np.asarray(s.values, dtype=np.float64).reshape(-1, 2)]
    return [[str(a), str(b)] for a, b in np.asarray(s.values, dtype=object).reshape(-1, 2)]


def _series_from(s: dict) -> MetricSeries:
    kind = s["kind"]
    n = len(s["doc_ids"])
    if kind == "mean":
        values = np.asarray(s["values"], dtype=np.float64).reshape(n)
    elif kind == "ratio":
        values = np.asarray(s["values"], dtype=np.float64).reshape(n, 2)
    elif kind == "corpus":
        values = np.empty((n, 2), dtype=object)
        for i, (ref, pred) in enumerate(s["values"]):
            values[i, 0], values[i, 1] = ref, pred
    else:
        raise ValueError(f"unknown series kind {kind!r}")
    hashes = np.asarray(s["hashes"], dtype=str).reshape(n, 3) if n else np.empty((0, 3), dtype=str)
    return MetricSeries(
        key=SeriesKey(s["task"], s["filter"], s["metric"]),
        kind=kind,
        aggregation=s["aggregation"],
        higher_is_better=bool(s["higher_is_better"]),
        doc_ids=np.asarray(s["doc_ids"], dtype=np.int64),
        values=values,
        hashes=hashes,
        reported=s.get("reported"),
        clusters=None if s.get("clusters") is None else np.asarray(s["clusters"], dtype=str),
    )


# ----------------------------------------------------------------------------- helpers


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Temp file in the same directory, fsync, rename over ``path``, fsync the directory."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise GateError(f"{path}: cannot write ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        # mkstemp creates 0600; a baseline or report is an ordinary file (umask applies).
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException as exc:  # also KeyboardInterrupt: never leave the temp file behind
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise GateError(f"{path}: cannot write ({exc.strerror or exc})") from None
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # not supported on this platform / filesystem; the rename already happened
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _read_document(path: Path) -> dict:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise GateError(f"{path}: baseline file not found") from None
    except OSError as exc:
        raise GateError(f"{path}: cannot read baseline ({exc.strerror})") from None
    if not raw.startswith(_GZIP_MAGIC):
        raise GateError(f"{path}: not a gzip'd gatekeeper baseline")
    try:
        text = gzip.decompress(raw).decode("utf-8")
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        # gzip's own CRC caught it: truncated (EOFError) or damaged bytes.
        what = "truncated" if isinstance(exc, EOFError) else "corrupted"
        raise GateError(f"{path}: baseline file is {what} (gzip data does not decompress)") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GateError(f"{path}: baseline is not valid JSON (line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(doc, dict):
        raise GateError(f"{path}: not a gatekeeper baseline")
    return doc


def _load_run_for(run_dir: Path, suite: Suite) -> RunResults:
    from gatekeeper import results as results_mod
    from gatekeeper.gate import check_run_matches_suite

    res = results_mod.load_run(Path(run_dir), cluster_keys=suite.cluster_keys(), snippets=False)
    # Suite hash, task set, lm-eval pin, n-shot, seeds, limit: refused before the file is touched.
    check_run_matches_suite(res, suite, what="run", fix="re-run it with the current suite before storing "
                            f"it as the baseline (gatekeeper run --suite {suite.path} ...)")
    return res


def _history_path(target: Path) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    folder = target.parent / "history"
    for n in _counter():
        candidate = folder / f"{_stem(target)}.{stamp}{'' if n == 0 else f'-{n}'}.json.gz"
        if not candidate.exists():
            return candidate
    raise AssertionError("unreachable")


def _counter() -> Iterator[int]:
    n = 0
    while True:
        yield n
        n += 1


def _stem(path: Path) -> str:
    name = path.name
    return name[: -len(".json.gz")] if name.endswith(".json.gz") else path.stem


def _key_order(k: SeriesKey) -> tuple[str, str, str]:
    return (k.task, k.filter, k.metric)


def _iso(ts: Any) -> str:
    when = datetime.fromtimestamp(ts, timezone.utc) if isinstance(ts, (int, float)) else datetime.now(timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _dump(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_json_default)


def _checksum(body: dict) -> str:
    return "sha256:" + hashlib.sha256(_dump(body).encode("utf-8")).hexdigest()


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    return str(obj)
