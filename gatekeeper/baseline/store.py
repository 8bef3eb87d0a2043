"""The baseline store: where the accepted reference lives, and how it is replaced.

``save_baseline`` / ``load_baseline`` read and write one baseline file (its format and checks:
``format.py``, ``validate.py``); ``record_results`` stores a first baseline, ``promote_results``
replaces it and keeps the previous one under ``history/`` (names never reused). Both hold
``store_lock`` (an ``flock`` on the baseline folder), so concurrent promotes serialize.
``load_any`` is the one front door for "a baseline file or an lm-eval run".
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gatekeeper.baseline import anchor
from gatekeeper.baseline import format as fmt
from gatekeeper.compare.compat import compatibility_errors, dataset_moves
from gatekeeper.errors import GateError
from gatekeeper.files import LOCK_TIMEOUT_S, atomic_write_bytes, folder_lock, project_root
from gatekeeper.model import RunResults
from gatekeeper.results.reader import load_run
from gatekeeper.suite.suite import Suite


def save_baseline(
    results: RunResults, path: Path, *, suite_name: str | None, suite_hash: str | None
) -> None:
    """Write ``results`` as a baseline file, whole or not at all."""
    # Paths in it are made relative to the repository the baseline is committed to.
    project = project_root(Path(path).parent)
    atomic_write_bytes(Path(path), fmt.encode(results, suite_name=suite_name, suite_hash=suite_hash, project=project))


def load_baseline(path: Path) -> RunResults:
    """Read a baseline file; refuses unknown formats, files whose checksum does not match, fields
    of the wrong type, and per-item values that disagree with the aggregate the file reports."""
    return fmt.read(Path(path))[1]


def load_any(path: str | Path, *, cluster_keys: dict[str, str] | None = None) -> RunResults:
    """A baseline file (.json.gz from the store) or anything ``results.reader.load_run`` accepts."""
    path = Path(path)
    if path.is_file() and fmt.is_baseline_file(path):
        return load_baseline(path)
    return load_run(path, cluster_keys=cluster_keys)


# ----------------------------------------------------------------------------- record / promote


def record_results(
    results: RunResults, suite: Suite, *, force: bool = False, path: Path | None = None
) -> Path:
    target = Path(path) if path is not None else suite.baseline_path
    check_target(target, suite, inside=path is None)
    with store_lock(target):
        refuse_existing(target, force)  # again, under the lock: another record may have won
        save_baseline(results, target, suite_name=suite.name, suite_hash=suite.hash)
    return target


def promote_results(results: RunResults, suite: Suite, *, path: Path | None = None,
                    on_dropped: Callable[[str], Any] | None = None) -> Path:
    """Replace the working baseline; the anchor (``anchor.py``) stays: the baseline being replaced
    becomes the anchor when there is none yet, and a promotion that changes the measurement
    (another suite hash than the anchor's, or new commits of its hub datasets) drops the old anchor."""
    target = Path(path) if path is not None else suite.baseline_path
    check_target(target, suite, inside=path is None)
    check_target(anchor.anchor_path(target), suite, inside=path is None)
    with store_lock(target):
        if target.is_file():
            # Copy first, replace second: a failure at any point leaves the current baseline valid.
            _write_history(target, target.read_bytes())
            why = anchor_outdated(target, suite, results)
            if anchor.keep_as_anchor(target, replace=why is not None) and why is not None and on_dropped:
                on_dropped(why)  # an anchor file was there, and it measured other items
        save_baseline(results, target, suite_name=suite.name, suite_hash=suite.hash)
    return target


def pin_anchor(results: RunResults, suite: Suite, *, baseline: Path | None = None) -> Path:
    """Make ``results`` the anchor of the suite's baseline (``baseline pin``; the caller records why)."""
    base = Path(baseline) if baseline is not None else suite.baseline_path
    if not base.is_file():
        raise GateError(f"{base}: no baseline to anchor; record one first (gatekeeper baseline record RUN_DIR "
                        f"--suite {suite.path})")
    target = anchor.anchor_path(base)
    check_target(target, suite, inside=baseline is None)
    with store_lock(base):
        save_baseline(results, target, suite_name=suite.name, suite_hash=suite.hash)
    return target


def anchor_outdated(target: Path, suite: Suite, results: RunResults) -> str | None:
    """Why the anchor in place (else the baseline about to become it) cannot be compared with
    ``results``, the run being promoted: another suite hash, other commits of a hub dataset
    (``run --new-data``), or other items (a local data file or task edited, another lm-eval): the
    promotion then drops it, and the promoted run is its own anchor. None when it still measures
    the same thing."""
    current = anchor.anchor_path(target) if anchor.anchor_path(target).is_file() else target
    if not current.is_file():
        return None
    stored = fmt.read(current)[1]
    recorded = stored.provenance.suite_hash
    if bool(recorded) and recorded != suite.hash:
        return f"it was recorded for another suite (hash {recorded[:12]}, now {suite.hash[:12]})"
    moved = dataset_moves(stored.provenance.manifest, results.provenance.manifest)
    if moved:
        return "; ".join(f"dataset {name}: revision {was[:7]} → {now[:7]}" for name, was, now in moved)
    errors = compatibility_errors(stored, results)
    return errors[0].split("; fix: ")[0].replace("since the baseline", "since the anchor") if errors else None


def check_target(target: Path, suite: Suite, *, inside: bool = True) -> None:
    """Record and promote write only real files: never through a symlink (the baseline, its
    folder, ``history/`` or a folder on the way from the repository's root), and the suite's own
    baseline (``inside``) never outside the suite's repository. A baseline committed as a link
    would let whoever committed it point the writer at any file of the runner; a path given on
    the command line (``--baseline``) is the person's choice."""
    target = Path(os.path.normpath(os.path.abspath(target)))
    root = _repo_root(Path(os.path.abspath(suite.path)).parent)
    if inside and root is not None and os.path.commonpath([root, target]) != str(root):
        raise GateError(f"{target}: outside the repository {root}; a baseline is written inside the repository "
                        "that holds the suite")
    start = root if root is not None else target.parent.parent
    steps = [target.parent / "history", target, *[p for p in target.parents if start in p.parents or p == start]]
    for step in sorted(set(steps), key=lambda p: len(p.parts)):
        if step.is_symlink():
            raise GateError(f"{step}: is a symlink; gatekeeper writes baselines only to real files and folders "
                            "(replace the link with the file itself)")


def _repo_root(folder: Path) -> Path | None:
    for p in (folder, *folder.parents):
        if (p / ".git").exists():
            return p
    return None


@contextmanager
def store_lock(target: Path, *, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the baseline folder's lock: record and promote run one at a time per folder.

    Temp files that a killed writer left behind are removed while the lock is held, when no
    other writer can own them."""
    with folder_lock(Path(target).parent, timeout=timeout):
        _remove_stale_temps(Path(target))
        yield


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


def refuse_existing(target: Path, force: bool) -> None:
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
    doc, res = fmt.read(path)  # one read: a hostile file is inflated (at most) once
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


_stem = anchor.baseline_stem
