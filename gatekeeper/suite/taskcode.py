"""The identity of a suite's task code: a content hash of every file its tasks are built from.

lm-eval records a task's config with the source of the one ``!function`` it names, so a change
to a helper that function calls (``utils.py``), to a data file or to a template leaves its
hashes alone. gatekeeper records instead the sha256 of every file under the suite's
``include_path`` (and, for lm-eval's bundled tasks, of the files in each task's folder) in the
run manifest and so in the baseline; a difference is a comparability error naming the paths.

Symlinks are refused here: a link in the task tree would make the hash (and the task) depend on
a file outside it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from gatekeeper.errors import GateError

# Generated next to the sources by Python itself; never what a task is built from.
_SKIP_DIRS = {"__pycache__", ".git"}
_SKIP_SUFFIXES = (".pyc", ".pyo")
MAX_FILES = 20_000


def tree_hashes(folder: Path, *, prefix: str = "") -> dict[str, str]:
    """{relative posix path: sha256} of every regular file under ``folder``, sorted."""
    folder = Path(folder)
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        here = Path(dirpath)
        for d in list(dirnames):
            if (here / d).is_symlink():
                raise GateError(f"{here / d}: a symlink in the task folder {folder}; copy the files in instead")
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            path = here / name
            if name.endswith(_SKIP_SUFFIXES):
                continue
            if path.is_symlink():
                raise GateError(f"{path}: a symlink in the task folder {folder}; copy the file in instead")
            if len(out) >= MAX_FILES:
                raise GateError(f"{folder}: more than {MAX_FILES:,} files; include_path should hold the suite's tasks only")
            out[prefix + path.relative_to(folder).as_posix()] = file_hash(path)
    return dict(sorted(out.items()))


def include_hashes(include_path: Path) -> dict[str, str]:
    """``tree_hashes`` of a suite's include_path, each path under the folder's own name
    (``tasks/utils.py``): the same wherever the suite file sits."""
    return tree_hashes(include_path, prefix=Path(include_path).name + "/")


def file_hash(path: Path) -> str:
    """sha256 hex of one task file."""
    h = hashlib.sha256()
    try:
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    except OSError as exc:
        raise GateError(f"{path}: cannot read a task file ({exc.strerror})") from None
    return h.hexdigest()


def changed_paths(recorded: dict[str, str], current: dict[str, str]) -> list[str]:
    """Paths added, removed or edited between two ``tree_hashes`` results, sorted."""
    return sorted(p for p in set(recorded) | set(current) if recorded.get(p) != current.get(p))


# Files a task reads its documents from, rather than code or templates it is built with.
DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".parquet", ".arrow", ".txt", ".xml", ".gz", ".zst")


def describe_changes(paths: list[str], limit: int = 5) -> str:
    """``data file tasks/data/x.jsonl changed since the baseline`` / ``task code tasks/utils.py
    ...`` / both: a data edit is named as data, not as code."""
    data = [p for p in paths if p.lower().endswith(DATA_SUFFIXES)]
    code = [p for p in paths if p not in data]
    parts = []
    for label, names in (("data file", data), ("task code", code)):
        if names:
            shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
            parts.append(f"{label}{'s' if label == 'data file' and len(names) > 1 else ''} {shown}")
    return " and ".join(parts) + " changed since the baseline"
