"""The baseline file format: the per-item results of the accepted model, small, versioned, checksummed.

A baseline is gzip'd JSON (gzip mtime 0, so equal content gives equal bytes and no git noise)::

    {"format": "gatekeeper-baseline", "version": 1, "suite": "demo", "suite_hash": "...",
     "created": "2026-01-30T12:00:00Z", "provenance": {...}, "groups": {...},
     "group_subtasks": {...},
     "series": [{"task", "filter", "metric", "kind", "aggregation", "higher_is_better",
                 "reported", "doc_ids": [...], "values": [...], "hashes": [[doc, prompt, target]],
                 "clusters": [...] or null}],
     "multiple_choice_margins": {task: {"doc_ids": [...], "margins": [...]}},  (only when a task has them)
     "checksum": "sha256:<hex of the canonical JSON of everything else>"}

No prompts or generations are kept (only 16-hex-digit prefixes of lm-eval's item hashes),
so a baseline is a fraction of the size of lm-eval's samples files. Floats are written with
``repr`` precision, so loading gives back exactly the values that were saved. No absolute path
of the writing machine is kept (``portable_path``).

A baseline may arrive in a pull request, so loading fails closed (``GateError``, exit 2):
the inflated size is capped (``max_inflated_bytes``: 64x the file, 16-256 MiB) while streaming;
every field's type is checked; per-item values must lie in the metric's range and reproduce
the stored aggregate (``reported``; ``validate.py``).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import zlib
from dataclasses import asdict, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from gatekeeper.baseline.validate import check_series, validate_document
from gatekeeper.errors import GateError
from gatekeeper.files import conflict_hint, merge_conflicted, portable_path
from gatekeeper.model import HASH_CHARS, HASH_DTYPE, MetricSeries, Provenance, RunResults, SeriesKey
from gatekeeper.results import trusted
from gatekeeper.results.metrics import bind_function, kind_for, kind_named

FORMAT = "gatekeeper-baseline"
# 2: the kinds added with the metric-kind registry (confusion counts, brier, median, nanmean).
# A file is written at the lowest version that can hold its kinds, so a baseline of only
# mean/ratio/corpus metrics stays version 1 (byte-identical to older writers).
FORMAT_VERSION = 2
_GZIP_MAGIC = b"\x1f\x8b"


def encode(results: RunResults, *, suite_name: str | None, suite_hash: str | None,
           project: Path | None = None) -> bytes:
    """The bytes of a baseline file: equal results give equal bytes (sorted keys, gzip mtime 0).
    ``project``: the repository the file is written into (paths are made relative to it)."""
    doc = to_document(results, suite_name=suite_name, suite_hash=suite_hash, project=project)
    return gzip.compress(_dump(doc).encode("utf-8"), compresslevel=9, mtime=0)


def read(path: Path) -> tuple[dict, RunResults]:
    """The document and the results of one baseline file, from one (bounded) read."""
    raw, doc = _read_document(path)
    if doc.get("format") != FORMAT:
        raise GateError(f"{path}: not a gatekeeper baseline (format {doc.get('format')!r})")
    version = doc.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
        raise GateError(
            f"{path}: baseline format version {version!r} is not supported "
            f"(this gatekeeper reads version {FORMAT_VERSION}; upgrade gatekeeper or re-record)"
        )
    if not _checksum_matches(raw, doc):
        raise GateError(f"{path}: checksum mismatch (file corrupted or edited by hand); {repair(path)}")
    # The checksum only proves the file is whole (anyone can recompute it): check every field.
    validate_document(path, doc)
    try:
        res = from_document(doc, source=str(path))
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise GateError(f"{path}: malformed baseline ({type(exc).__name__}: {exc})") from None
    check_series(path, res)
    return doc, res


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


def to_document(results: RunResults, *, suite_name: str | None, suite_hash: str | None,
                project: Path | None = None) -> dict:
    prov = _portable_provenance(asdict(results.provenance), project)
    if suite_hash is not None:
        prov["suite_hash"] = suite_hash
    body = {
        "format": FORMAT,
        "version": max([1] + [kind_named(s.kind).format_version for s in results.series.values()]),
        "suite": suite_name,
        "suite_hash": prov["suite_hash"],
        # The run's own start time, not "now": re-recording the same run gives the same bytes.
        "created": _iso(prov.get("date")),
        "provenance": prov,
        "groups": results.groups,
        "group_subtasks": results.group_subtasks,
        "series": [_series_doc(results.series[k]) for k in sorted(results.series, key=_key_order)],
    }
    # Absent, not empty, without them: older baselines keep their bytes. The key sorts after
    # "format", which is_baseline_file (this and older versions) looks for in the first 1 KiB.
    if results.choice_margins:
        body["multiple_choice_margins"] = {
            task: _margins_doc(*results.choice_margins[task]) for task in sorted(results.choice_margins)}
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
    untestable = {}
    for s in doc["series"]:
        if not _function_available(s):
            # A task-defined aggregation with no trusted code to run it: like results/reader.py,
            # recorded as untestable (an error when gated), never executed from the file.
            untestable[SeriesKey(s["task"], s["filter"], s["metric"])] = s["aggregation"].split("@")[0]
            continue
        ms = _series_from(s)
        series[ms.key] = ms
    notes = [f"baseline recorded from {recorded_from}"] if recorded_from else []
    margins = {task: (np.asarray(m["doc_ids"], dtype=np.int64),
                      np.array([np.nan if v is None else v for v in m["margins"]], dtype=float))
               for task, m in (doc.get("multiple_choice_margins") or {}).items()}
    return RunResults(
        provenance=prov,
        series=series,
        groups=doc.get("groups") or {},
        group_subtasks=doc.get("group_subtasks") or {},
        notes=notes,
        untestable=untestable,
        choice_margins=margins,
    )


def _margins_doc(doc_ids: np.ndarray, margins: np.ndarray) -> dict:
    """A task's choice margins, rounded to 1e-4 nats (a design reads only their order; a file
    loaded and written again keeps its bytes); NaN as null."""
    return {"doc_ids": [int(d) for d in doc_ids],
            "margins": [None if not np.isfinite(m) else round(float(m), 4) for m in margins]}


def _function_available(s: dict) -> bool:
    """False for a task-defined (``!function``) series whose function no trusted code provides."""
    if s["kind"] != "function" or kind_for(s["aggregation"]) is not None:
        return True
    fn = trusted.resolve(s["task"], s["metric"], s["aggregation"])
    if fn is not None:
        bind_function(s["aggregation"], fn)
    return fn is not None


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
    return kind_named(s.kind).to_doc(s.values)


def _series_from(s: dict) -> MetricSeries:
    kind = s["kind"]
    n = len(s["doc_ids"])
    values = kind_named(kind).from_doc(s["values"], n)
    # Validated hex: ASCII. Longer hashes (older files) keep HASH_CHARS digits, as compare would.
    hashes = np.asarray(s["hashes"], dtype=HASH_DTYPE).reshape(n, 3) if n else np.empty((0, 3), dtype=HASH_DTYPE)
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


# A baseline is committed and read on other machines: no absolute path of the machine that wrote
# it is kept (``files.portable_path``).

_PATH_KEYS = ("model_path", "model", "suite_path", "out", "results_file", "run_dir")


def _portable_provenance(prov: dict, project: Path | None = None) -> dict:
    prov = dict(prov)
    for key in ("source", "model_name"):
        if isinstance(prov.get(key), str):
            prov[key] = portable_path(prov[key], project)
    manifest = prov.get("manifest")
    if isinstance(manifest, dict):
        manifest = dict(manifest)
        for key in _PATH_KEYS:
            if isinstance(manifest.get(key), str):
                manifest[key] = portable_path(manifest[key], project)
        if isinstance(manifest.get("command"), list):
            manifest["command"] = [_portable_arg(a, project) for a in manifest["command"]]
        prov["manifest"] = manifest
    return prov


def _portable_arg(arg: Any, project: Path | None = None) -> Any:
    if isinstance(arg, str) and arg.endswith(("gatekeeper/__main__.py", "/gatekeeper")) and arg.startswith("/"):
        return "gatekeeper"  # argv[0] of `python -m gatekeeper` or the console script
    return portable_path(arg, project) if isinstance(arg, str) else arg


def max_inflated_bytes(compressed: int) -> int:
    """The most bytes a baseline of ``compressed`` bytes may inflate to.

    Baselines compress about 3-10x (hex hashes and floats); 64x the file size, at least 16 MiB
    and at most 256 MiB, leaves ample room for real files and stops a gzip bomb (1000x) after
    reading a bounded amount, in well under a second."""
    return min(MAX_INFLATED_BYTES, max(16 << 20, 64 * compressed))


MAX_INFLATED_BYTES = 256 << 20


def _checksum_matches(raw: bytes, doc: dict) -> bool:
    """Whether ``doc`` (parsed from ``raw``) carries the checksum of the rest of itself. A file as
    ``encode`` writes it is its canonical JSON with the checksum first (sorted keys), so the body's
    JSON is the file's own bytes less that member: hashed in place, not written out again. A file
    with other spacing or key order (edited, or another writer) is checked on its re-written body."""
    claimed = doc.get("checksum")
    head = f'{{"checksum":{json.dumps(claimed)},'.encode() if isinstance(claimed, str) else b""
    if head and raw.startswith(head):
        digest = hashlib.sha256(b"{")
        digest.update(memoryview(raw)[len(head):])
        if "sha256:" + digest.hexdigest() == claimed:
            return True
    return claimed == _checksum({k: v for k, v in doc.items() if k != "checksum"})


def _read_document(path: Path) -> tuple[bytes, dict]:
    """The inflated bytes of a baseline file and the JSON object they hold."""
    try:
        with path.open("rb") as fh:
            magic = fh.read(2)
            size = os.fstat(fh.fileno()).st_size
            if magic != _GZIP_MAGIC:
                fh.seek(0)
                if merge_conflicted(fh.read(1 << 20)):
                    raise GateError(f"{path}: not a gzip'd gatekeeper {_kind(path)}: {conflict_hint(path)}")
                raise GateError(f"{path}: not a gzip'd gatekeeper baseline")
            fh.seek(0)
            raw = _inflate(path, fh, max_inflated_bytes(size))
    except FileNotFoundError:
        raise GateError(f"{path}: baseline file not found") from None
    except OSError as exc:
        raise GateError(f"{path}: cannot read baseline ({exc.strerror})") from None
    try:
        if not raw.isascii():
            raw.decode("utf-8")  # msgspec checks the strings it builds; this checks every byte
    except UnicodeDecodeError:
        if merge_conflicted(raw):
            raise GateError(f"{path}: {_kind(path)} is not valid UTF-8 text: {conflict_hint(path)}") from None
        raise GateError(f"{path}: baseline is not valid UTF-8 text; {repair(path)}") from None
    try:
        doc = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        doc = _read_json(path, raw)  # NaN tokens (Python's json writes them), or a named error
    if not isinstance(doc, dict):
        raise GateError(f"{path}: not a gatekeeper baseline")
    return raw, doc


def _read_json(path: Path, raw: bytes) -> Any:
    """Python's json on a document msgspec refused: it reads the NaN and Infinity tokens that
    json.dumps writes, and says where a broken file breaks."""
    try:
        return json.loads(raw.decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise GateError(f"{path}: baseline is not valid JSON (line {exc.lineno}, column {exc.colno}); {repair(path)}") from None
    except (ValueError, RecursionError) as exc:  # 4300+ digit integers, arrays nested 1000s deep
        what = "nested too deeply" if isinstance(exc, RecursionError) else "a number with too many digits"
        raise GateError(f"{path}: baseline is not usable JSON ({what})") from None


def _kind(path: Path) -> str:
    return "anchor" if Path(path).name.endswith(".anchor.json.gz") else "baseline"


def repair(path: Path) -> str:
    """How to mend a damaged baseline or anchor file: git has the good copy; else make a new one
    on purpose (an anchor is a reference a person approved, so never silently)."""
    restore = f"restore it from git (`git checkout -- {path}`)"
    if _kind(path) == "anchor":
        return restore + ", or re-pin the anchor on purpose (`gatekeeper baseline pin --current --reason ...`)"
    return restore + ", or re-record it on purpose (`gatekeeper baseline record RUN_DIR --suite ...`)"


def _inflate(path: Path, fh: Any, limit: int) -> bytes:
    """The gzip content of ``fh``, streamed: stops as soon as it would exceed ``limit`` bytes."""
    try:
        with gzip.GzipFile(fileobj=fh, mode="rb") as gz:
            data = gz.read(limit + 1)  # GzipFile inflates incrementally: never more than asked
    except EOFError:
        raise GateError(f"{path}: {_kind(path)} file is truncated (gzip data does not decompress); {repair(path)}") from None
    except (gzip.BadGzipFile, zlib.error):
        # gzip's own CRC caught it: damaged bytes.
        raise GateError(f"{path}: {_kind(path)} file is corrupted (gzip data does not decompress); {repair(path)}") from None
    if len(data) > limit:
        raise GateError(
            f"{path}: baseline inflates to more than {limit >> 20} MiB from "
            f"{os.fstat(fh.fileno()).st_size:,} bytes (a gzip bomb, or not a baseline); restore it from git or re-record it"
        )
    return data


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
