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
``repr`` precision, so loading gives back exactly the values that were saved. No absolute path
of the writing machine is kept (``portable_path``).

A baseline may arrive in a pull request, so loading fails closed (``GateError``, exit 2):
the inflated size is capped (``max_inflated_bytes``: 64x the file, 16-256 MiB) while streaming;
every field's type is checked; per-item values must lie in the metric's range and reproduce
the stored aggregate (``reported``). Record and promote hold an ``flock`` on the baseline
folder, so concurrent promotes serialize; history names are never reused.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import itertools
import json
import os
import re
import stat
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gatekeeper import trusted
from gatekeeper.metrics import KINDS, NO_PROBLEM, bind_function, kind_for, kind_named
from gatekeeper.model import (
    GateError,
    MetricSeries,
    Provenance,
    RunResults,
    SeriesKey,
    is_finite,
    is_int,
)
from gatekeeper.stats import aggregate

if TYPE_CHECKING:
    from gatekeeper.suite import Suite

FORMAT = "gatekeeper-baseline"
# 2: the kinds added with the metric-kind registry (confusion counts, brier, median, nanmean).
# A file is written at the lowest version that can hold its kinds, so a baseline of only
# mean/ratio/corpus metrics stays version 1 (byte-identical to older writers).
FORMAT_VERSION = 2
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
    """Read a baseline file; refuses unknown formats, files whose checksum does not match, fields
    of the wrong type, and per-item values that disagree with the aggregate the file reports."""
    return _load(Path(path))[1]


def _load(path: Path) -> tuple[dict, RunResults]:
    """The document and the results of one baseline file, from one (bounded) read."""
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
    # The checksum only proves the file is whole (anyone can recompute it): check every field.
    _validate_document(path, doc)
    try:
        res = from_document(doc, source=str(path))
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise GateError(f"{path}: malformed baseline ({type(exc).__name__}: {exc})") from None
    _check_series(path, res)
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
    with store_lock(target):
        _refuse_existing(target, force)  # again, under the lock: another record may have won
        save_baseline(results, target, suite_name=suite.name, suite_hash=suite.hash)
    return target


def promote_results(results: RunResults, suite: Suite, *, path: Path | None = None) -> Path:
    target = Path(path) if path is not None else suite.baseline_path
    with store_lock(target):
        if target.is_file():
            # Copy first, replace second: a failure at any point leaves the current baseline valid.
            _write_history(target, target.read_bytes())
        save_baseline(results, target, suite_name=suite.name, suite_hash=suite.hash)
    return target


LOCK_TIMEOUT_S = 600.0


@contextmanager
def store_lock(target: Path, *, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the baseline folder's lock: record and promote run one at a time per folder.

    The lock is ``fcntl.flock`` on the folder itself (no lock file to commit or leave behind;
    the kernel drops it when the process dies, also on kill -9). Waiting is announced on
    stderr. Temp files that a killed writer left behind are removed while the lock is held,
    when no other writer can own them."""
    folder = Path(target).parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY)
    except OSError as exc:
        raise GateError(f"{folder}: cannot lock the baseline folder ({exc.strerror or exc})") from None
    try:
        _acquire(fd, folder, timeout)
        _remove_stale_temps(Path(target))
        yield
    finally:
        os.close(fd)  # releases the lock


def _acquire(fd: int, folder: Path, timeout: float) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    except OSError as exc:
        raise GateError(f"{folder}: cannot lock the baseline folder ({exc.strerror or exc})") from None
    print(f"gatekeeper: waiting for {folder}: another baseline record/promote holds its lock",
          file=sys.stderr, flush=True)
    deadline = time.monotonic() + timeout
    while True:
        time.sleep(0.05)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise GateError(
                    f"{folder}: still locked by another baseline record/promote after {timeout:.0f} s; "
                    "retry when it has finished"
                ) from None


def _remove_stale_temps(target: Path) -> None:
    name, stem = target.name, _stem(target)
    stale = list(target.parent.glob(f".{name}.*.tmp"))
    stale += list((target.parent / "history").glob(f".{stem}.*.json.gz.*.tmp"))
    for tmp in stale:
        tmp.unlink(missing_ok=True)


def _write_history(target: Path, data: bytes) -> Path:
    """The previous baseline under a new name in history/; never replaces an existing entry
    (``os.link`` fails when the name is taken, even against a writer that ignores the lock)."""
    for _ in range(1000):
        dest = _history_path(target)
        try:
            atomic_write_bytes(dest, data, exclusive=True)
            return dest
        except FileExistsError:
            continue
    raise GateError(f"{target.parent / 'history'}: no free history name; clean up history/")


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
    doc, res = _load(path)  # one read: a hostile file is inflated (at most) once
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
    prov = _portable_provenance(asdict(results.provenance))
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
            # A task-defined aggregation with no trusted code to run it: like results.py,
            # recorded as untestable (an error when gated), never executed from the file.
            untestable[SeriesKey(s["task"], s["filter"], s["metric"])] = s["aggregation"].split("@")[0]
            continue
        ms = _series_from(s)
        series[ms.key] = ms
    notes = [f"baseline recorded from {recorded_from}"] if recorded_from else []
    return RunResults(
        provenance=prov,
        series=series,
        groups=doc.get("groups") or {},
        group_subtasks=doc.get("group_subtasks") or {},
        notes=notes,
        untestable=untestable,
    )


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


# ----------------------------------------------------------------------------- portable paths
# A baseline is committed and read on other machines: it records no absolute path of the machine
# that wrote it. A path inside a git repository is kept relative to that repository's root; any
# other absolute path keeps only its last component.

_PATH_KEYS = ("model_path", "model", "suite_path", "out", "results_file", "run_dir")


def portable_path(value: str) -> str:
    """``value`` relative to the git repository containing it, or its name when outside one;
    relative paths and anything that is not an absolute path are returned unchanged."""
    if not isinstance(value, str) or not value.startswith("/") or "\n" in value:
        return value
    path = Path(os.path.normpath(value))
    for parent in path.parents:
        if parent != Path(parent.anchor) and (parent / ".git").exists():
            return path.relative_to(parent).as_posix()
    return path.name or value


def _portable_provenance(prov: dict) -> dict:
    prov = dict(prov)
    for key in ("source", "model_name"):
        if isinstance(prov.get(key), str):
            prov[key] = portable_path(prov[key])
    manifest = prov.get("manifest")
    if isinstance(manifest, dict):
        manifest = dict(manifest)
        for key in _PATH_KEYS:
            if isinstance(manifest.get(key), str):
                manifest[key] = portable_path(manifest[key])
        if isinstance(manifest.get("command"), list):
            manifest["command"] = [_portable_arg(a) for a in manifest["command"]]
        prov["manifest"] = manifest
    return prov


def _portable_arg(arg: Any) -> Any:
    if isinstance(arg, str) and arg.endswith(("gatekeeper/__main__.py", "/gatekeeper")) and arg.startswith("/"):
        return "gatekeeper"  # argv[0] of `python -m gatekeeper` or the console script
    return portable_path(arg) if isinstance(arg, str) else arg


# ----------------------------------------------------------------------------- helpers


def atomic_write_bytes(path: Path, data: bytes, *, exclusive: bool = False) -> None:
    """Temp file in the same directory, fsync, rename over ``path``, fsync the directory.

    Only a regular file (or a new one) is replaced that way. Anything else that exists is
    written through, as a shell redirection would: a character device (``/dev/stdout``,
    ``/dev/null``), a FIFO or process substitution. A symlink is followed: the file it points to
    is replaced and the link stays a link. ``exclusive``: fail with ``FileExistsError`` rather
    than replace an existing ``path``."""
    path = Path(path)
    try:
        st = os.stat(path)  # follows symlinks, also /proc's "magic" fd links
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise GateError(f"{path}: cannot write ({exc.strerror or exc})") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        if exclusive:
            raise FileExistsError(path)
        _write_through(path, data, st)
        return
    if path.is_symlink():
        path = Path(os.path.realpath(path))  # replace the link's target, keep the link
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
        if exclusive:
            os.link(tmp, path)  # FileExistsError when taken; the temp name goes in `finally`
        else:
            os.replace(tmp, path)
    except BaseException as exc:  # also KeyboardInterrupt: never leave the temp file behind
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and not isinstance(exc, FileExistsError):
            raise GateError(f"{path}: cannot write ({exc.strerror or exc})") from None
        raise
    if exclusive:
        Path(tmp).unlink(missing_ok=True)
    _fsync_dir(path.parent)


def _write_through(path: Path, data: bytes, st: os.stat_result) -> None:
    """Write into an existing non-regular file (device, FIFO) without replacing it."""
    if stat.S_ISDIR(st.st_mode):
        raise GateError(f"{path}: is a directory; give a file name")
    try:
        fd = os.open(path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))  # no O_CREAT: it exists
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
    except OSError as exc:
        raise GateError(f"{path}: cannot write ({exc.strerror or exc})") from None


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


def max_inflated_bytes(compressed: int) -> int:
    """The most bytes a baseline of ``compressed`` bytes may inflate to.

    Baselines compress about 3-10x (hex hashes and floats); 64x the file size, at least 16 MiB
    and at most 256 MiB, leaves ample room for real files and stops a gzip bomb (1000x) after
    reading a bounded amount, in well under a second."""
    return min(MAX_INFLATED_BYTES, max(16 << 20, 64 * compressed))


MAX_INFLATED_BYTES = 256 << 20


def _read_document(path: Path) -> dict:
    try:
        with path.open("rb") as fh:
            magic = fh.read(2)
            size = os.fstat(fh.fileno()).st_size
            if magic != _GZIP_MAGIC:
                raise GateError(f"{path}: not a gzip'd gatekeeper baseline")
            fh.seek(0)
            raw = _inflate(path, fh, max_inflated_bytes(size))
    except FileNotFoundError:
        raise GateError(f"{path}: baseline file not found") from None
    except OSError as exc:
        raise GateError(f"{path}: cannot read baseline ({exc.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise GateError(f"{path}: baseline is not valid UTF-8 text") from None
    del raw
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GateError(f"{path}: baseline is not valid JSON (line {exc.lineno}, column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:  # 4300+ digit integers, arrays nested 1000s deep
        what = "nested too deeply" if isinstance(exc, RecursionError) else "a number with too many digits"
        raise GateError(f"{path}: baseline is not usable JSON ({what})") from None
    if not isinstance(doc, dict):
        raise GateError(f"{path}: not a gatekeeper baseline")
    return doc


def _inflate(path: Path, fh: Any, limit: int) -> bytes:
    """The gzip content of ``fh``, streamed: stops as soon as it would exceed ``limit`` bytes."""
    try:
        with gzip.GzipFile(fileobj=fh, mode="rb") as gz:
            data = gz.read(limit + 1)  # GzipFile inflates incrementally: never more than asked
    except EOFError:
        raise GateError(f"{path}: baseline file is truncated (gzip data does not decompress)") from None
    except (gzip.BadGzipFile, zlib.error):
        # gzip's own CRC caught it: damaged bytes.
        raise GateError(f"{path}: baseline file is corrupted (gzip data does not decompress)") from None
    if len(data) > limit:
        raise GateError(
            f"{path}: baseline inflates to more than {limit >> 20} MiB from "
            f"{os.fstat(fh.fileno()).st_size:,} bytes (a gzip bomb, or not a baseline); restore it from git or re-record it"
        )
    return data


def _load_run_for(run_dir: Path, suite: Suite) -> RunResults:
    from gatekeeper import results as results_mod
    from gatekeeper.gate import check_run_matches_suite

    with trusted.trusted_code(suite.include_path):
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


# ----------------------------------------------------------------------------- validation
# A baseline can arrive in a pull request: its checksum proves nothing (anyone can recompute
# it), so every field is checked for the type this module writes before it is used.

_HASH_RE = re.compile(r"[0-9a-f]{16,64}")
_MAX_DOC_ID = (1 << 53) - 1
_MAX_DATE = 253402300799.0  # 9999-12-31T23:59:59Z


class _Bad(Exception):
    """One wrong field: ``(field, value, expected)``; ``_validate_document`` names the file."""


def _want(ok: bool, field: str, value: Any, expected: str) -> None:
    if not ok:
        raise _Bad(field, value, expected)






def _opt(v: Any, *types: type) -> bool:
    return v is None or (isinstance(v, types) and not isinstance(v, bool))


def _validate_document(path: Path, doc: dict) -> None:
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
    from gatekeeper.results import manifest_problem

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


def _check_series(path: Path, res: RunResults) -> None:
    """Per-item values inside the metric's range and agreeing with the aggregate the file
    reports, with the tolerance the lm-eval reader uses: a baseline edited item by item (a
    recomputed checksum) no longer matches its own aggregate."""
    from gatekeeper.results import _close, out_of_range

    for key, s in res.series.items():
        problem = out_of_range(key.metric, s.kind, s.values)
        if problem:
            raise GateError(f"{path}: {key}: {problem} (edited by hand? re-record the baseline)")
        if s.reported is None:
            continue  # nothing to check against (older writers stored no aggregate)
        try:
            recomputed = aggregate(s.kind, s.aggregation, s.values)
        except ValueError as exc:
            raise GateError(f"{path}: {key}: cannot aggregate the per-item values ({exc})") from None
        if not _close(recomputed, float(s.reported)):
            raise GateError(
                f"{path}: {key}: the per-item values give {recomputed!r}, but the file reports "
                f"{s.reported!r} (edited by hand? re-record the baseline)"
            )
