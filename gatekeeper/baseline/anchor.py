"""The anchor: the reference a person approved, which nightly promotions never move.

``promote`` (and the action's ``promote-on-green``) replaces the working baseline every green
night, so each night is compared only with the night before and a model can lose a margin's
worth every night without one red run. The anchor is kept beside the baseline,
``<name>.anchor.json.gz`` (the same file format), and ``gate`` compares a candidate with both.

- A baseline without an anchor file is its own anchor (files from before anchors keep working).
- The first ``promote`` over such a baseline keeps it as the anchor, then replaces the baseline.
- A promotion under a changed suite (a new measurement, re-recorded on purpose) makes the new
  baseline the anchor too: the old anchor measured something else.
- ``gatekeeper baseline pin RUN_DIR | --current --reason "..."`` moves the anchor on purpose
  (``store.pin_anchor``); the history (``trend.py``) records who, when and why.

On an untrusted checkout the anchor, like the baseline, is read from the base commit
(``prbase.py``): a pull request cannot move its own anchor.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from gatekeeper.baseline import format as fmt
from gatekeeper.errors import GateError
from gatekeeper.files import atomic_write_bytes
from gatekeeper.model import RunResults

SUFFIX = ".anchor.json.gz"


def baseline_stem(baseline: Path) -> str:
    """``demo`` for ``demo.json.gz``: the name the anchor, the history and history/ entries share."""
    name = Path(baseline).name
    return name[: -len(".json.gz")] if name.endswith(".json.gz") else Path(baseline).stem


def anchor_path(baseline: Path) -> Path:
    return Path(baseline).with_name(baseline_stem(baseline) + SUFFIX)


def load_anchor(baseline: Path) -> RunResults | None:
    """The anchor of ``baseline``, or None when the baseline is its own anchor."""
    path = anchor_path(baseline)
    if path.is_symlink():
        raise GateError(f"{path}: is a symlink; an anchor is a real file (replace the link with the file itself)")
    return fmt.read(path)[1] if path.is_file() else None


def file_id(path: Path) -> str | None:
    """A short id of a baseline or anchor file (sha256 of its bytes), for the history."""
    path = Path(path)
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12] if path.is_file() else None


def same_measurement(a: RunResults, b: RunResults) -> bool:
    """Whether two stored runs hold the same per-item values: an anchor equal to the baseline
    adds nothing to the comparison but a larger correction, so it is left out."""
    if set(a.series) != set(b.series):
        return False
    for key, sa in a.series.items():
        sb = b.series[key]
        if sa.n != sb.n or not np.array_equal(sa.doc_ids, sb.doc_ids):
            return False
        if not np.array_equal(np.asarray(sa.values, dtype=object), np.asarray(sb.values, dtype=object)):
            return False
    return True


def keep_as_anchor(baseline: Path, *, replace: bool = False) -> bool:
    """Before a promotion replaces ``baseline`` (under its lock): when it has no anchor yet, it
    is the anchor from now on. ``replace``: the promotion changes the measurement (another suite
    hash), so the anchor is dropped and the promoted run becomes its own anchor. Returns whether
    the anchor file changed."""
    target = anchor_path(baseline)
    if replace:
        existed = target.is_file()
        target.unlink(missing_ok=True)
        return existed
    if target.exists() or not Path(baseline).is_file():
        return False
    atomic_write_bytes(target, Path(baseline).read_bytes(), exclusive=True)
    return True

