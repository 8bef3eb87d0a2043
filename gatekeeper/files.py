"""Files written whole or not at all, folder locks, bounded reads, portable paths.

One home for the file operations every stage needs (pip's ``utils/filesystem.py`` is the
model): baselines, run manifests, reports and the job summary are written with
``atomic_write_bytes``; record and promote serialise on ``folder_lock``; files that may arrive
in a pull request are read with ``read_limited``; nothing that is committed records an
absolute path of the machine that wrote it (``portable_path``).

Ground floor: imports only ``gatekeeper.errors``.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gatekeeper.errors import GateError

LOCK_TIMEOUT_S = 600.0


class TooLarge(Exception):
    """``read_limited`` found more than ``limit`` bytes."""


def read_limited(path: Path, limit: int) -> bytes:
    """The bytes of ``path``, reading at most ``limit`` + 1 of them (bounded even where st_size
    lies: a FIFO, /proc); raises ``TooLarge`` over the limit and ``OSError`` as ``open`` does."""
    with Path(path).open("rb") as fh:
        raw = fh.read(limit + 1)
    if len(raw) > limit:
        raise TooLarge(path)
    return raw


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
    fsync_dir(path.parent)


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


def fsync_dir(folder: Path) -> None:
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


def cache_dir() -> Path:
    """gatekeeper's cache folder of this user: what can be computed again, kept between processes."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gatekeeper"


def cached_json(path: Path, usable: Callable[[Any], bool], make: Callable[[], Any]) -> Any:
    """The JSON ``path`` holds where ``usable`` accepts it; else ``make()``, kept there for the
    processes after (a missing, damaged or unusable file is made again; an unwritable cache
    folder only costs the next process the same work)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if usable(data):
            return data
    except (OSError, ValueError):
        pass
    data = make()
    try:
        write_json_atomic(path, data)
    except OSError:
        pass
    return data


def write_json_atomic(path: Path, data: Any) -> None:
    """``data`` as indented JSON (UTF-8, one trailing newline), whole or not at all."""
    atomic_write_bytes(path, (json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n").encode("utf-8"))


@contextmanager
def folder_lock(folder: Path, *, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold ``folder``'s lock (created if missing): writers of one folder run one at a time.

    The lock is ``fcntl.flock`` on the folder itself (no lock file to commit or leave behind;
    the kernel drops it when the process dies, also on kill -9). Waiting is announced on
    stderr."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY)
    except OSError as exc:
        raise GateError(f"{folder}: cannot lock the baseline folder ({exc.strerror or exc})") from None
    try:
        _acquire(fd, folder, timeout)
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


# A committed file (baseline, history) is read on other machines: it records no absolute path of
# the machine that wrote it. A path inside a git repository is kept relative to that
# repository's root; any other absolute path keeps only its last component.


def portable_path(value: str, project: Path | None = None) -> str:
    """``value`` as a baseline and a report write it, with no absolute path of this machine:
    relative to ``project`` (default: the git repository of the working directory, else the
    working directory) when inside it; else ``<repository folder>/<path in it>`` for a file in
    another git repository, or just its name. Relative paths and anything that is not an
    absolute path are returned unchanged."""
    if not isinstance(value, str) or not value.startswith("/") or "\n" in value:
        return value
    path = Path(os.path.normpath(value))
    root = project if project is not None else project_root()
    if root is not None and (path == root or root in path.parents):
        return path.relative_to(root).as_posix() if path != root else path.name
    for parent in path.parents:
        if parent != Path(parent.anchor) and (parent / ".git").exists():
            return f"{parent.name}/{path.relative_to(parent).as_posix()}"
    return path.name or value


def project_root(start: Path | None = None) -> Path | None:
    """The git repository holding ``start`` (default: the working directory), its top folder;
    else ``start`` itself."""
    try:
        here = Path(os.path.abspath(start if start is not None else os.getcwd()))
    except OSError:
        return None
    for folder in (here, *here.parents):
        if folder != Path(folder.anchor) and (folder / ".git").exists():
            return folder
    return here


# A pull request writes the checkout, links included: a checkpoint that is, or holds, a symlink
# to a runner file (``$HF_HOME/token``) would have the evaluation read that file.


def link_leaving(path: Path, root: Path) -> str | None:
    """The first symlink on the way from ``root`` down to ``path``, or anywhere under ``path``
    when it is a folder (walked without following links), whose target lies outside ``root``: its
    path relative to ``root``. None when there is none. ``path`` (relative, or absolute) is taken
    lexically; a ``path`` outside ``root`` altogether is not ``root``'s to judge: None (an
    absolute model path on the runner is the workflow's choice)."""
    base = Path(os.path.normpath(os.path.abspath(root)))
    lexical = Path(os.path.normpath(base / path))
    try:
        rel = lexical.relative_to(base)
    except ValueError:
        return None

    def leaves(p: Path) -> bool:
        return not resolves_within(p, base)

    step = base
    for part in rel.parts:
        step = step / part
        if step.is_symlink() and leaves(step):
            return step.relative_to(base).as_posix()
    # A folder (or a link to a folder inside the root): every link under it, without following one.
    folder = Path(os.path.realpath(lexical)) if lexical.is_symlink() else lexical
    if folder.is_dir():
        for dirpath, dirnames, filenames in os.walk(folder):
            for name in sorted(dirnames + filenames):
                p = Path(dirpath) / name
                if p.is_symlink() and leaves(p):
                    shown = lexical / p.relative_to(folder)
                    return shown.relative_to(base).as_posix()
    return None


def resolves_within(path: Path, root: Path) -> bool:
    """Whether ``path``, every link resolved, is ``root`` or lies under it (``root`` resolved too)."""
    real, top = os.path.realpath(path), os.path.realpath(root)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


# A committed file that two branches changed: git writes both sides between conflict markers
# (or a binary file whose merge was forced as text). Named as such, with the fix.
_CONFLICT_MARKERS = (b"<<<<<<< ", b"\n=======", b">>>>>>> ")


def merge_conflicted(raw: bytes) -> bool:
    """Whether ``raw`` holds git's merge-conflict markers (a line opening with ``<<<<<<<`` and
    one with ``>>>>>>>``)."""
    return (raw.startswith(_CONFLICT_MARKERS[0]) or b"\n" + _CONFLICT_MARKERS[0] in raw) and (
        b"\n" + _CONFLICT_MARKERS[2] in raw)


def conflict_hint(path: Path) -> str:
    return (f"it holds git merge-conflict markers (a merge of two branches that both changed it): restore one "
            f"side from git (`git checkout --ours -- {path}` or `--theirs`), then re-run")
