"""Where lm-eval 0.4.13 (and ``gatekeeper run``) put a run's files.

    DIR/<model_name_sanitized>/results_<ts>.json
    DIR/<model_name_sanitized>/samples_<task>_<ts>.jsonl     one per leaf task
    DIR/<model_name_sanitized>/gatekeeper-manifest.json      gatekeeper run only

``find_results_file`` accepts DIR (lm-eval's ``--output_path`` or ``gatekeeper run --out``), the
model subfolder, one results file, or a folder one level above DIR holding a single run, and
refuses to guess between two runs.

A folder written by ``gatekeeper run`` (it holds a manifest) is bound to its files: the
manifest names the results file and every samples file, and no other run file may sit beside
them (``bound_files``). A shard or a look (a part of a run, judged or merged on another job)
also records each file's sha256, which must match: a file planted in the folder, or one changed
after the run, is an error naming it, never read.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from gatekeeper.errors import GateError
from gatekeeper.files import TooLarge, read_limited

MANIFEST_NAME = "gatekeeper-manifest.json"
WARNINGS_LOG = "lm-eval-warnings.log"  # every warning lm-eval gave, in full (the log shows each kind once)
# A manifest lists each look's documents: some MB for a 100k-item suite, never hundreds.
MAX_MANIFEST_BYTES = 64 << 20
# lm-eval: datetime.now().isoformat().replace(":", "-"), e.g. 2026-11-30T01-57-33.954527
_TS = r"\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}(?:\.\d+)?"
RESULTS_RE = re.compile(rf"^(?P<stem>.+)_(?P<ts>{_TS})\.json$")


def _timestamp(name: str) -> datetime | None:
    m = RESULTS_RE.match(name)
    if not m:
        return None
    ts = m.group("ts")
    for fmt in ("%Y-%m-%dT%H-%M-%S.%f", "%Y-%m-%dT%H-%M-%S"):
        try:
            return datetime.strptime(ts, fmt)
        except ValueError:
            continue
    return None


def _results_files(folder: Path) -> list[Path]:
    """Timestamped aggregate files in one folder (results_<ts>.json, or X_<ts>.json from
    ``--output_path X.json``); samples files never match because they end in .jsonl."""
    found = [
        p
        for p in folder.iterdir()
        if p.is_file() and not p.name.startswith("samples_") and _timestamp(p.name) is not None
    ]
    preferred = [p for p in found if p.name.startswith("results_")]
    return preferred or found


def find_results_file(path: Path) -> tuple[Path, list[str]]:
    """The results file to read under ``path`` (newest run when several), and notes about it.

    ``path`` is a results file, a folder holding one (lm-eval's model folder), lm-eval's
    ``--output_path`` (one model folder down), or ``gatekeeper run --out`` (two down:
    ``run-<id>-<attempt>-<ts>/<model>/``, what the fork workflow's artifact holds). Below the
    folder given, exactly one folder with results must exist: two are refused, never guessed.
    """
    path = Path(path)
    if not path.exists():
        raise GateError(f"{path}: no such file or directory")
    if path.is_file():
        if path.name.startswith("samples_") and path.suffix == ".jsonl":
            raise GateError(
                f"{path}: this is an lm-eval samples file; pass the run's results_<timestamp>.json "
                "or its output folder instead"
            )
        bound = bound_files(path.parent)
        if bound is not None and bound != path:
            raise GateError(f"{path}: not the results file of this run (its {MANIFEST_NAME} names {bound.name})")
        return path, []
    if not path.is_dir():
        raise GateError(f"{path}: not a file or directory")
    try:
        if not any(path.iterdir()):
            raise GateError(f"{path}: directory is empty (expected lm-eval --output_path output)")
        folder, notes = _results_folder(path)
        bound = bound_files(folder)
        if bound is not None:
            return bound, notes
        files = _results_files(folder)
    except OSError as exc:  # an unreadable subfolder, or one removed while looking
        raise GateError(f"{exc.filename or path}: cannot read directory ({exc.strerror})") from None
    # Timestamps are local time and all files of one run share one; newest wins, like
    # lm_eval.utils.get_latest_filename.
    files.sort(key=lambda p: (_timestamp(p.name), p.name))
    chosen = files[-1]
    if len(files) > 1:
        notes.append(f"{len(files)} runs in {folder}; using the newest, {chosen.name}")
    return chosen, notes


def _subfolders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir())


def _results_folder(path: Path) -> tuple[Path, list[str]]:
    """The one folder at or below ``path`` (at most two levels) that holds results files."""
    if _results_files(path):
        return path, []
    found = [p for p in _subfolders(path) if _results_files(p)]
    depth = 1
    if not found:  # a folder holding one DIR: <folder>/<DIR>/<model>/
        found = [q for p in _subfolders(path) for q in _subfolders(p) if _results_files(q)]
        depth = 2
    if len(found) > 1:
        shown = ", ".join(str(p.relative_to(path)) for p in found[:5]) + (", ..." if len(found) > 5 else "")
        what = "model folders" if depth == 1 else "run folders with results"
        raise GateError(f"{path}: {len(found)} {what} ({shown}); pass one of them")
    if not found:
        raise GateError(
            f"{path}: no results_*.json here, in a model subfolder (<out>/<model>/) or one level below that "
            "(was lm-eval or gatekeeper run given this output folder, and did it finish?)"
        )
    notes = [f"using {found[0].relative_to(path)} under {path}"] if depth == 2 else []
    return found[0], notes


def samples_path(results_file: Path, task: str) -> Path:
    ts = RESULTS_RE.match(results_file.name)
    if ts is None:
        raise GateError(
            f"{results_file}: cannot find the run's timestamp in the file name "
            "(lm-eval names it results_<timestamp>.json)"
        )
    return results_file.parent / f"samples_{task}_{ts.group('ts')}.jsonl"


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The run manifest in ``folder`` (None when there is none); one-line error when unreadable."""
    path = Path(folder) / MANIFEST_NAME
    if not path.is_file() or path.is_symlink():
        return None
    try:
        data = json.loads(read_limited(path, MAX_MANIFEST_BYTES).decode("utf-8"))
    except TooLarge:
        raise GateError(f"{path}: larger than {MAX_MANIFEST_BYTES >> 20} MiB; not a run manifest") from None
    except OSError as exc:
        raise GateError(f"{path}: cannot read ({exc.strerror})") from None
    except (ValueError, RecursionError):
        raise GateError(f"{path}: not a readable JSON manifest (edited, or not written by gatekeeper?)") from None
    if not isinstance(data, dict):
        raise GateError(f"{path}: expected a JSON object (a gatekeeper run manifest)")
    return data


def is_part(manifest: dict[str, Any]) -> bool:
    """A shard or a look: part of a run, carried between jobs."""
    return isinstance(manifest.get("shard"), dict) or isinstance(manifest.get("look"), dict)


def bound_files(folder: Path) -> Path | None:
    """The results file the manifest in ``folder`` names, after checking that the folder holds no
    other run file and, for a shard or a look, that every file's sha256 is the manifest's. None
    when ``folder`` has no manifest naming its files (lm-eval's own output)."""
    manifest = read_manifest(folder)
    if manifest is None or manifest.get("results_file") is None:
        return None
    path = Path(folder) / MANIFEST_NAME
    named = _named_files(path, manifest)
    for entry in sorted(Path(folder).iterdir()):
        if _is_run_file(entry.name) and entry.name not in named:
            raise GateError(f"{entry}: not a file of this run (its {MANIFEST_NAME} names {manifest['results_file']}); "
                            "a file beside a run is never read: remove it, or evaluate into an empty folder")
    for name in named:
        if not (Path(folder) / name).is_file() or (Path(folder) / name).is_symlink():
            raise GateError(f"{Path(folder) / name}: named by {path} but missing (or not a plain file); re-run it")
    if is_part(manifest):
        _check_digests(path, manifest, named)
    return Path(folder) / manifest["results_file"]


def _check_digests(path: Path, manifest: dict[str, Any], named: set[str]) -> None:
    """A part's files are the ones it evaluated: each sha256 as its manifest records it. (A whole
    run is not checked here: every aggregate is recomputed from its samples, and its folder is the
    job's own.)"""
    folder = path.parent
    digests = manifest.get("files")
    if digests is None:
        raise GateError(f"{path}: a shard or look without the sha256 of its files (written by an older gatekeeper); "
                        "re-run it")
    if not (isinstance(digests, dict) and set(digests) == named
            and all(isinstance(v, str) and len(v) == 64 for v in digests.values())):
        raise GateError(f"{path}: files is not the sha256 of exactly the results and samples files it names "
                        "(edited, or not written by gatekeeper run?)")
    for name in sorted(named):
        try:
            digest = sha256_file(folder / name)
        except OSError as exc:
            raise GateError(f"{folder / name}: cannot read ({exc.strerror})") from None
        if digest != digests[name]:
            raise GateError(f"{folder / name}: its sha256 is not the one {MANIFEST_NAME} records "
                            "(changed after the run); re-run it")


def _named_files(path: Path, manifest: dict[str, Any]) -> set[str]:
    results_name, samples = manifest.get("results_file"), manifest.get("samples_files")
    names = [results_name, *(samples.values() if isinstance(samples, dict) else [None])]
    if not all(isinstance(n, str) and _is_run_file(n) and "/" not in n and "\\" not in n for n in names):
        raise GateError(f"{path}: results_file and samples_files must name this folder's results_<ts>.json and "
                        "samples_<task>_<ts>.jsonl files (edited, or not written by gatekeeper run?)")
    return set(names)


def _is_run_file(name: str) -> bool:
    """A file the reader could take for part of a run: a timestamped results or samples file."""
    return (name.startswith("samples_") and name.endswith(".jsonl")) or _timestamp(name) is not None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
