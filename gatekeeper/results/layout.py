"""Where lm-eval 0.4.13 (and ``gatekeeper run``) put a run's files.

    DIR/<model_name_sanitized>/results_<ts>.json
    DIR/<model_name_sanitized>/samples_<task>_<ts>.jsonl     one per leaf task
    DIR/<model_name_sanitized>/gatekeeper-manifest.json      gatekeeper run only

``find_results_file`` accepts DIR (lm-eval's ``--output_path`` or ``gatekeeper run --out``), the
model subfolder, one results file, or a folder one level above DIR holding a single run, and
refuses to guess between two runs.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from gatekeeper.errors import GateError

MANIFEST_NAME = "gatekeeper-manifest.json"
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
        return path, []
    if not path.is_dir():
        raise GateError(f"{path}: not a file or directory")
    try:
        if not any(path.iterdir()):
            raise GateError(f"{path}: directory is empty (expected lm-eval --output_path output)")
        folder, notes = _results_folder(path)
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
