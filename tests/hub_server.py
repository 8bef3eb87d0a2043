"""A loopback stand-in for the Hugging Face hub, enough for ``datasets.load_dataset`` (through
huggingface_hub's ``HfApi`` and ``HfFileSystem``) and transformers' ``from_pretrained`` with
``HF_ENDPOINT`` pointing here.

It serves local folders as repositories. Each ``push`` is a new commit with its own files; ``main``
is the newest, so a test can move the head after a baseline was recorded. For datasets:

- ``GET /api/datasets/{repo}[/revision/{rev}]``: the repository's info (sha, siblings);
- ``GET /api/datasets/{repo}/tree/{rev}[/{path}]``: a folder listing (``recursive`` too);
- ``POST /api/datasets/{repo}/paths-info/{rev}``: the entries of the paths asked for;
- ``HEAD|GET /datasets/{repo}/resolve/{rev}/{path}``: a file, with the commit and ETag headers the
  client checks, and byte ranges.

Models are the same without the ``datasets`` prefix (``/api/models/{repo}...``,
``/{repo}/resolve/{rev}/{path}``). ``rev`` is ``main`` or a commit's sha; any other is a 404 with
``X-Error-Code: RevisionNotFound``. Anything else is a 404 with the hub's error header, and every
request is recorded (``requests``), so a test can show where the data came from.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.warm_start import OWN_SERVER_ENV


class Hub:
    """``Hub({"org/name": folder}, models={...}).start()``; ``push`` a new commit; ``url`` for
    HF_ENDPOINT; ``stop()`` when done."""

    def __init__(self, repos: dict[str, Path], models: dict[str, Path] | None = None) -> None:
        self.commits: dict[tuple[str, str], list[tuple[str, Path]]] = {}
        self.requests: list[tuple[str, str]] = []
        self._server: ThreadingHTTPServer | None = None
        for name, folder in repos.items():
            self.push(name, folder)
        for name, folder in (models or {}).items():
            self.push(name, folder, kind="models")

    def push(self, repo: str, folder: Path, kind: str = "datasets") -> str:
        """A new commit of ``repo`` holding ``folder``'s files (read when served); ``main`` moves
        to it. Returns its sha."""
        history = self.commits.setdefault((kind, repo), [])
        sha = hashlib.sha1(f"{kind}/{repo}#{len(history)}".encode()).hexdigest()
        history.append((sha, Path(folder)))
        return sha

    def sha(self, repo: str, kind: str = "datasets") -> str:
        """The commit ``main`` names now."""
        return self.commits[(kind, repo)][-1][0]

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> Hub:
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # -- what the handler answers

    def commit(self, kind: str, repo: str, rev: str) -> tuple[str, Path] | None:
        history = self.commits.get((kind, repo))
        if not history:
            return None
        if rev == "main":
            return history[-1]
        return next((c for c in history if c[0] == rev), None)

    @staticmethod
    def files(root: Path) -> list[Path]:
        return sorted(p for p in root.rglob("*") if p.is_file())

    @staticmethod
    def entry(root: Path, path: Path) -> dict[str, Any]:
        rel = path.relative_to(root).as_posix()
        if path.is_dir():
            return {"type": "directory", "path": rel, "oid": hashlib.sha1(rel.encode()).hexdigest(), "size": 0}
        data = path.read_bytes()
        return {"type": "file", "path": rel, "size": len(data), "oid": _git_oid(data)}

    def info(self, repo: str, sha: str, root: Path) -> dict[str, Any]:
        return {"_id": sha[:24], "id": repo, "modelId": repo, "author": repo.split("/")[0], "sha": sha,
                "private": False, "gated": False, "disabled": False, "downloads": 0, "likes": 0, "tags": [],
                "lastModified": "2026-12-01T00:00:00.000Z", "createdAt": "2026-12-01T00:00:00.000Z",
                "cardData": {}, "siblings": [{"rfilename": p.relative_to(root).as_posix()} for p in self.files(root)]}


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    hub: Hub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet: the test reads hub.requests
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._answer(body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(body=False)

    def do_POST(self) -> None:  # noqa: N802
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path)
        self.hub.requests.append((self.command, self.path))
        parts = path.strip("/").split("/")
        if parts[:1] == ["api"] and len(parts) >= 4 and parts[1] in ("datasets", "models"):
            kind, repo = parts[1], "/".join(parts[2:4])
            if (kind, repo) in self.hub.commits:
                return self._api(kind, repo, parts[4:], parse_qs(url.query), body)
        if parts[:1] == ["datasets"] and len(parts) >= 6 and parts[3] == "resolve":
            if ("datasets", "/".join(parts[1:3])) in self.hub.commits:
                return self._file("datasets", "/".join(parts[1:3]), parts[4], "/".join(parts[5:]), body)
        if len(parts) >= 5 and parts[2] == "resolve" and ("models", "/".join(parts[:2])) in self.hub.commits:
            return self._file("models", "/".join(parts[:2]), parts[3], "/".join(parts[4:]), body)
        self._error(404, "RepoNotFound", f"{path}: not on this hub")

    def _api(self, kind: str, repo: str, rest: list[str], query: dict[str, list[str]], body: bool) -> None:
        rev = rest[1] if len(rest) >= 2 and rest[0] in ("revision", "tree", "paths-info") else "main"
        found = self.hub.commit(kind, repo, rev)
        if found is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        sha, root = found
        if not rest or rest[0] == "revision":
            return self._json(self.hub.info(repo, sha, root), body)
        if rest[0] == "tree" and len(rest) >= 2:
            folder = root.joinpath(*rest[2:]) if len(rest) > 2 else root
            if not folder.is_dir():
                return self._error(404, "EntryNotFound", f"{'/'.join(rest[2:])}: no such folder")
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            found_paths = sorted(folder.rglob("*") if recursive else folder.iterdir())
            return self._json([self.hub.entry(root, p) for p in found_paths], body)
        if rest[0] == "paths-info":
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length).decode("utf-8")
            form = parse_qs(raw) if "application/x-www-form-urlencoded" in (self.headers.get("Content-Type") or "") \
                else json.loads(raw or "{}")
            paths = form.get("paths", [])
            if isinstance(paths, str):
                paths = [paths]
            out = [self.hub.entry(root, root / p) for p in paths if (root / p).exists()]
            return self._json(out, body)
        self._error(404, "EntryNotFound", f"{'/'.join(rest)}: not served here")

    def _file(self, kind: str, repo: str, rev: str, name: str, body: bool) -> None:
        found = self.hub.commit(kind, repo, rev)
        if found is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        sha, root = found
        path = root / name
        if not path.is_file():
            return self._error(404, "EntryNotFound", f"{name}: no such file in {repo}", sha)
        data = path.read_bytes()
        status, start, end = 200, 0, len(data)
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            first, _, last = rng[len("bytes="):].partition("-")
            start = int(first or 0)
            end = min(len(data), int(last) + 1) if last else len(data)
            status = 206
        chunk = data[start:end]
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(chunk)))
        self.send_header("ETag", f'"{_git_oid(data)}"')
        self.send_header("X-Repo-Commit", sha)
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        if body:
            self.wfile.write(chunk)

    def _json(self, value: Any, body: bool) -> None:
        data = json.dumps(value).encode("utf-8")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _error(self, status: int, code: str, message: str, sha: str | None = None) -> None:
        data = json.dumps({"error": message}).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        if sha is not None:
            self.send_header("X-Repo-Commit", sha)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


def hub_env(hub: Hub, home: Path, own_server: bool = False, **extra: str) -> dict[str, str]:
    """The environment of a process that reads ``hub`` (this process's, online, HF_HOME ``home``);
    ``own_server``: several of them load a model, and run warm in a server of this environment
    (tests/warm_start.py)."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")}
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(home), TQDM_DISABLE="1", **extra)
    if own_server:
        env[OWN_SERVER_ENV] = "1"
    return env
