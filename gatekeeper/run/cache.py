"""The request cache: answers kept per request, in a format that can neither run code nor lie.

lm-eval's ``CachingLM`` keeps answers in a SqliteDict, whose values are pickles: a cache file a
pull request (or another job) planted would run its payload when read, and a copy of the base
model's file under another model's name would answer for it. gatekeeper keeps lm-eval's caching
logic (``CachingLM``: which requests are cached, the ``hash_args`` key, partial writes through
the ``CacheHook``) and replaces only the store:

- plain JSON values in SQLite (tuples tagged), never pickle, in a table of its own: a file
  written by lm-eval's SqliteDict is simply empty to it;
- every entry carries an HMAC-SHA256 over (the cache identity, the request hash, the value),
  keyed by a secret only the runner has (``GATEKEEPER_CACHE_KEY``, else a key file created once
  under ``~/.config/gatekeeper/``, never inside the workspace). A forged, copied or stale entry
  does not verify and is a miss, never an answer;
- the identity covers every file of the checkpoint folder (weights, shard index, tokenizer,
  configs, remote code), the suite hash, lm-eval's version and the backend arguments.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gatekeeper.errors import GateError

KEY_ENV = "GATEKEEPER_CACHE_KEY"
KEY_FILE_ENV = "GATEKEEPER_CACHE_KEY_FILE"
TABLE = "gatekeeper_answers_v1"
COMMIT_EVERY, COMMIT_SECONDS = 64, 1.0


def identity(model_files: dict[str, str], suite_hash: str, lm_eval_version: str, backend: str,
             args: dict[str, Any]) -> str:
    """sha256 hex of what decides an answer: the checkpoint's files, suite, lm-eval, backend."""
    key = {"model_files": model_files, "suite_hash": suite_hash, "lm_eval": lm_eval_version,
           "backend": backend, "model_args": args}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


def secret_key(workspace: str | None = None) -> bytes:
    """The runner's cache key: ``$GATEKEEPER_CACHE_KEY``, else the key file (created, mode 0600,
    on first use). A key file inside the workspace is refused: a pull request could read it."""
    value = os.environ.get(KEY_ENV, "").strip()
    if value:
        return hashlib.sha256(value.encode("utf-8")).digest()
    home = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    path = Path(os.environ.get(KEY_FILE_ENV) or home / "gatekeeper" / "cache.key")
    workspace = workspace or os.environ.get("GITHUB_WORKSPACE")
    if workspace and os.path.commonpath([os.path.abspath(path), os.path.abspath(workspace)]) == os.path.abspath(workspace):
        raise GateError(f"{path}: the request cache's key must live outside the workspace (a pull request "
                        f"could read it there); set {KEY_ENV} from a secret or {KEY_FILE_ENV} elsewhere")
    try:
        return _read_or_create(path)
    except OSError as exc:
        raise GateError(f"{path}: cannot read or create the request cache's key ({exc.strerror or exc}); "
                        f"set {KEY_ENV}") from None


def _read_or_create(path: Path) -> bytes:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with contextlib.suppress(FileExistsError):  # another job created it first: use theirs
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32) + "\n")
    text = path.read_text(encoding="utf-8").strip()
    if len(text) < 32:
        raise OSError(f"{path} holds no key")
    return hashlib.sha256(text.encode("utf-8")).digest()


class SafeStore:
    """The mapping ``CachingLM`` and ``CacheHook`` use (``in``, ``[]``, ``[]=``, ``commit``),
    over SQLite with JSON values and an HMAC per entry."""

    def __init__(self, path: str, cache_id: str, key: bytes) -> None:
        self.path, self._id, self._key = path, cache_id.encode("ascii"), key
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path)
        self._db.execute("PRAGMA journal_mode=WAL")  # a killed run keeps what it committed
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (key TEXT PRIMARY KEY, value TEXT, mac TEXT)")
        self.hits = self.rejected = 0
        self._pending, self._last_commit = 0, time.monotonic()

    def _mac(self, key: str, value: str) -> str:
        return hmac.new(self._key, self._id + b"\0" + key.encode() + b"\0" + value.encode(), "sha256").hexdigest()

    def _lookup(self, key: str) -> Any:
        row = self._db.execute(f"SELECT value, mac FROM {TABLE} WHERE key = ?", (key,)).fetchone()
        if row is None:
            return _MISS
        value, mac = row
        if not (isinstance(value, str) and isinstance(mac, str) and hmac.compare_digest(mac, self._mac(key, value))):
            self.rejected += 1
            return _MISS
        try:
            return _decode(json.loads(value))
        except (ValueError, TypeError, RecursionError):
            self.rejected += 1
            return _MISS

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._lookup(key) is not _MISS

    def __getitem__(self, key: str) -> Any:
        value = self._lookup(key)
        if value is _MISS:
            raise KeyError(key)
        self.hits += 1
        return value

    def __setitem__(self, key: str, value: Any) -> None:
        text = json.dumps(_encode(value), separators=(",", ":"), allow_nan=True)
        self._db.execute(f"INSERT OR REPLACE INTO {TABLE} VALUES (?, ?, ?)", (key, text, self._mac(key, text)))
        # Answers arrive one by one (lm-eval's CacheHook): commit often enough that a preempted
        # run resumes from nearly where it stopped, seldom enough not to sync every answer.
        self._pending += 1
        if self._pending >= COMMIT_EVERY or time.monotonic() - self._last_commit > COMMIT_SECONDS:
            self.commit()

    def commit(self) -> None:
        self._db.commit()
        self._pending, self._last_commit = 0, time.monotonic()

    def close(self) -> None:
        self._db.commit()
        self._db.close()


_MISS = object()


def _encode(value: Any) -> Any:
    if isinstance(value, tuple):
        return {"t": [_encode(v) for v in value]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    raise TypeError(f"cannot cache a {type(value).__name__}")


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) != {"t"} or not isinstance(value["t"], list):
            raise ValueError("not a cached value")
        return tuple(_decode(v) for v in value["t"])
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


@contextlib.contextmanager
def safe_caching(cache_id: str, key: bytes) -> Iterator[list[SafeStore]]:
    """While lm-eval evaluates: its ``CachingLM`` keeps answers in a ``SafeStore`` (the stores
    opened are yielded, for their hit counts). Patched on lm-eval 0.4.13's module attribute,
    which ``simple_evaluate`` reads when ``use_cache`` is set."""
    import lm_eval.api.model as lm_model  # lazily: lm-eval only where a model runs

    opened: list[SafeStore] = []
    original = lm_model.CachingLM

    class GateCachingLM(original):  # type: ignore[misc, valid-type]
        def __init__(self, lm: Any, cache_db: str) -> None:  # noqa: D107 - lm-eval's own, minus SqliteDict
            self.lm, self.cache_db = lm, cache_db
            self.dbdict = SafeStore(cache_db, cache_id, key)
            opened.append(self.dbdict)
            lm.set_cache_hook(self.get_cache_hook())

    lm_model.CachingLM = GateCachingLM
    try:
        yield opened
    finally:
        lm_model.CachingLM = original
        for store in opened:
            store.close()
