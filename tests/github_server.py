"""A loopback fake of the GitHub REST API, strict about what it accepts.

Every request is checked against GitHub's OpenAPI description (``tests/github_api``, vendored) and
against the headers GitHub expects; a bad request gets 400 and its problem is recorded in
``errors`` (tests assert it stays empty). Every response the fake sends is validated too, so
the fake cannot drift from the real API.

State: issue/PR comments (ids, urls, pagination with Link headers), commit statuses, issues
with labels/state, PRs by commit and by number. Faults are injected per request (status,
headers, body, delay, a body trickled byte by byte), plus server-wide ones: a ``Link`` next page
that points back to itself or to endless new pages (``pages``), and listings that lag behind
writes (``listing_lag``).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

API_DIR = Path(__file__).resolve().parent / "github_api"  # vendored: see github_api/README.md


def _load_validator():
    spec = importlib.util.spec_from_file_location("gh_validate_request", API_DIR / "validate_request.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_validator = _load_validator()
_EXAMPLES = json.loads((API_DIR / "openapi-subset.json").read_text(encoding="utf-8"))["components"]["examples"]
NOW = "2026-01-01T00:00:00Z"
DROP = -1  # handle(): close the connection instead of answering
BOT = {"login": "github-actions[bot]", "id": 41898282, "type": "Bot"}
HUMAN = {"login": "octocat", "id": 1, "type": "User"}
READ_ONLY = {"message": "Resource not accessible by integration",
             "documentation_url": "https://docs.github.com/rest/issues/comments#create-an-issue-comment",
             "status": "403"}


def example(name: str) -> Any:
    return copy.deepcopy(_EXAMPLES[name]["value"])


@dataclass
class Fault:
    method: str
    path: str  # regex, searched in the request path
    status: int | None = None  # None: no error answer (use with delay)
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    delay: float = 0.0  # seconds to sleep before answering (a client timeout)
    after: bool = False  # apply the request first, then delay and/or answer ``status`` (it happened anyway)
    times: int = 1
    drop: bool = False  # with after: apply, then close the connection without an answer
    trickle: float = 0.0  # seconds between the bytes of the answer's body (a stalled proxy)


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any
    status: int = 0
    at: float = 0.0
    trickle: float = 0.0


class FakeGitHub:
    def __init__(self, repo: str = "octo/repo") -> None:
        self.repo = repo
        self.lock = threading.RLock()
        self.comments: dict[int, list[dict]] = {}  # issue number -> comments
        self.statuses: list[dict] = []
        self.issues: dict[int, dict] = {}
        self.pulls: dict[str, list[dict]] = {}  # sha -> PRs
        self.faults: list[Fault] = []
        self.requests: list[Recorded] = []
        self.errors: list[str] = []
        self.read_only = False
        self.per_page_cap = 100
        self.pages = ""  # "self": every list's next page is itself; "endless": always one more page
        self.listing_lag = 0.0  # seconds before a new comment or issue shows in listings
        self._born: dict[int, float] = {}  # id -> when it was created (for listing_lag)
        self.pull_heads: dict[int, dict] = {}  # PR number -> the PR object GET pulls/{n} answers
        self._next_id = 1000
        self._server: ThreadingHTTPServer | None = None

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> FakeGitHub:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # -- setup helpers ---------------------------------------------------------------------

    def new_id(self) -> int:
        with self.lock:
            self._next_id += 1
            return self._next_id

    def add_pr(self, number: int, head_sha: str, state: str = "open") -> dict:
        pr = example("pull-request-simple-items")[0]
        pr["requested_teams"] = []  # GitHub's own example lacks a required field here
        pr.update(number=number, state=state, id=self.new_id())
        pr["head"]["sha"] = head_sha
        pr["html_url"] = f"https://github.com/{self.repo}/pull/{number}"
        with self.lock:
            self.pulls.setdefault(head_sha, []).append(pr)
        return pr

    def add_pull(self, number: int, head_repo: str, *, fork: bool = False) -> dict:
        """A PR for ``GET /pulls/{number}`` whose head is in ``head_repo``."""
        pr = example("pull-request")
        pr["requested_teams"] = []  # GitHub's own example lacks a required field here
        pr.update(number=number, id=self.new_id(), html_url=f"https://github.com/{self.repo}/pull/{number}")
        pr["base"]["repo"].update(full_name=self.repo, name=self.repo.split("/")[1], fork=False)
        pr["head"]["repo"].update(full_name=head_repo, name=head_repo.split("/")[1], fork=fork)
        with self.lock:
            self.pull_heads[number] = pr
        return pr

    def _visible(self, items: list[dict]) -> list[dict]:
        """Listings lag behind writes by ``listing_lag`` seconds (as GitHub's can)."""
        now = time.monotonic()
        return [i for i in items if now - self._born.get(i["id"], -1e9) >= self.listing_lag]

    def add_comment(self, number: int, body: str, user: dict | None = None) -> dict:
        c = example("issue-comment")
        cid = self.new_id()
        c.update(
            id=cid, node_id=f"IC_{cid}", body=body, user={**c["user"], **(user or HUMAN)},
            url=f"{self.url}/repos/{self.repo}/issues/comments/{cid}",
            html_url=f"https://github.com/{self.repo}/pull/{number}#issuecomment-{cid}",
            issue_url=f"{self.url}/repos/{self.repo}/issues/{number}", created_at=NOW, updated_at=NOW,
        )
        with self.lock:
            self.comments.setdefault(number, []).append(c)
            self._born[cid] = time.monotonic()
        return c

    def add_issue(self, title: str, body: str, labels: list[str], state: str = "open") -> dict:
        issue = example("issue")
        label_tpl = issue["labels"][0]
        with self.lock:
            number = max([0, *self.issues, *self.comments]) + 1
            issue.update(
                id=self.new_id(), number=number, title=title, body=body, state=state, comments=0,
                labels=[{**label_tpl, "name": n, "id": self.new_id()} for n in labels],
                html_url=f"https://github.com/{self.repo}/issues/{number}",
                url=f"{self.url}/repos/{self.repo}/issues/{number}", closed_at=None,
                pull_request=None,
            )
            issue.pop("pull_request")
            self.issues[number] = issue
            self._born[issue["id"]] = time.monotonic()
        return issue

    def fail(self, method: str, path: str, status: int | None = None, **kw: Any) -> None:
        self.faults.append(Fault(method, path, status, **kw))

    def comment_bodies(self, number: int) -> list[str]:
        return [c["body"] for c in self.comments.get(number, [])]

    def writes(self) -> list[Recorded]:
        return [r for r in self.requests if r.method != "GET"]

    # -- request handling ------------------------------------------------------------------

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for f in self.faults:
                if f.method == method and re.search(f.path, path) and f.times > 0:
                    f.times -= 1
                    return f
        return None

    def _check(self, rec: Recorded) -> list[str]:
        problems = []
        auth = rec.headers.get("authorization", "")
        if not auth.startswith("Bearer ") or len(auth) < 12:
            problems.append("missing Authorization: Bearer <token>")
        if rec.headers.get("accept") != "application/vnd.github+json":
            problems.append(f"Accept is {rec.headers.get('accept')!r}")
        if rec.headers.get("x-github-api-version") != "2022-11-28":
            problems.append("missing X-GitHub-Api-Version: 2022-11-28")
        if not rec.headers.get("user-agent"):
            problems.append("missing User-Agent")
        for key in ("per_page", "page"):
            for v in rec.query.get(key, []):
                if not v.isdigit() or int(v) < 1 or (key == "per_page" and int(v) > 100):
                    problems.append(f"bad {key}={v}")
        try:
            problems += _validator.validate_request(rec.method, rec.path, rec.body)
        except LookupError as exc:
            problems.append(str(exc))
        return problems

    def handle(self, rec: Recorded) -> tuple[int, dict[str, str], Any, float]:
        """(status, headers, body, delay_after)."""
        problems = self._check(rec)
        if problems:
            with self.lock:
                self.errors += [f"{rec.method} {rec.path}: {p}" for p in problems]
            return 400, {}, {"message": "; ".join(problems)}, 0.0
        fault = self._take_fault(rec.method, rec.path)
        rec.trickle = fault.trickle if fault else 0.0
        if fault and not fault.after:
            if fault.delay:
                time.sleep(fault.delay)
            if fault.status is not None:
                return fault.status, fault.headers, fault.body or {"message": f"injected {fault.status}"}, 0.0
        if self.read_only and rec.method != "GET":
            return 403, {}, dict(READ_ONLY), 0.0
        status, headers, body = self._route(rec)
        if fault and fault.after and fault.drop:
            return DROP, {}, None, fault.delay
        if fault and fault.after and fault.status is not None:
            # Applied, but the answer is an error (a 502 from the front end after the write).
            return fault.status, fault.headers, fault.body or {"message": f"injected {fault.status}"}, fault.delay
        if 200 <= status < 300 or status == 422:
            try:
                problems = _validator.validate_response(rec.method, rec.path, status, body)
            except LookupError as exc:
                problems = [str(exc)]
            if problems:
                with self.lock:
                    self.errors += [f"response to {rec.method} {rec.path}: {p}" for p in problems]
        return status, headers, body, (fault.delay if fault and fault.after else 0.0)

    def _route(self, rec: Recorded) -> tuple[int, dict[str, str], Any]:
        prefix = f"/repos/{self.repo}"
        if not rec.path.startswith(prefix + "/"):
            return 404, {}, {"message": "Not Found"}
        rest = rec.path[len(prefix):]
        routes = [
            ("GET", r"/issues/(\d+)/comments", self._list_comments),
            ("POST", r"/issues/(\d+)/comments", self._create_comment),
            ("PATCH", r"/issues/comments/(\d+)", self._update_comment),
            ("GET", r"/commits/([0-9a-zA-Z]+)/pulls", self._pulls),
            ("GET", r"/pulls/(\d+)", self._get_pull),
            ("POST", r"/statuses/([0-9a-zA-Z]+)", self._status),
            ("GET", r"/issues", self._list_issues),
            ("POST", r"/issues", self._create_issue),
            ("PATCH", r"/issues/(\d+)", self._update_issue),
        ]
        for method, pattern, fn in routes:
            m = re.fullmatch(pattern, rest)
            if m and method == rec.method:
                with self.lock:
                    return fn(rec, *m.groups())
        return 404, {}, {"message": "Not Found"}

    def _page(self, rec: Recorded, items: list) -> tuple[int, dict[str, str], Any]:
        per_page = min(int((rec.query.get("per_page") or ["30"])[0]), self.per_page_cap)
        page = int((rec.query.get("page") or ["1"])[0])
        last = max((len(items) + per_page - 1) // per_page, 1)
        links = []
        base = f"{self.url}{rec.path}"
        extra = "".join(f"&{k}={v[0]}" for k, v in sorted(rec.query.items()) if k not in ("page", "per_page"))
        if self.pages == "self":
            return 200, {"Link": f'<{base}?per_page={per_page}&page={page}{extra}>; rel="next"'}, items[:per_page]
        if self.pages == "endless":
            last = page + 1
        if page < last:
            links.append(f'<{base}?per_page={per_page}&page={page + 1}{extra}>; rel="next"')
            links.append(f'<{base}?per_page={per_page}&page={last}{extra}>; rel="last"')
        if page > 1:
            links.insert(0, f'<{base}?per_page={per_page}&page={page - 1}{extra}>; rel="prev"')
            links.append(f'<{base}?per_page={per_page}&page=1{extra}>; rel="first"')
        headers = {"Link": ", ".join(links)} if links else {}
        return 200, headers, items[(page - 1) * per_page: page * per_page]

    @staticmethod
    def _too_long(body: str) -> tuple[int, dict, Any] | None:
        if len(body) > 65536:
            return 422, {}, {"message": "Validation Failed", "errors": [
                {"resource": "IssueComment", "code": "custom", "field": "body",
                 "message": "body is too long (maximum is 65536 characters)"}],
                "documentation_url": "https://docs.github.com/rest", "status": "422"}
        return None

    def _list_comments(self, rec, number):
        return self._page(rec, self._visible(list(self.comments.get(int(number), []))))

    def _create_comment(self, rec, number):
        bad = self._too_long(rec.body["body"])
        if bad:
            return bad
        return 201, {}, self.add_comment(int(number), rec.body["body"], BOT)

    def _update_comment(self, rec, cid):
        bad = self._too_long(rec.body["body"])
        if bad:
            return bad
        for comments in self.comments.values():
            for c in comments:
                if c["id"] == int(cid):
                    c["body"] = rec.body["body"]
                    return 200, {}, c
        return 404, {}, {"message": "Not Found"}

    def _pulls(self, rec, sha):
        return self._page(rec, list(self.pulls.get(sha, [])))

    def _get_pull(self, rec, number):
        pr = self.pull_heads.get(int(number))
        return (200, {}, pr) if pr else (404, {}, {"message": "Not Found"})

    def _status(self, rec, sha):
        s = example("status")
        s.update(id=self.new_id(), state=rec.body["state"], description=rec.body.get("description"),
                 target_url=rec.body.get("target_url"), context=rec.body.get("context", "default"))
        self.statuses.append({**s, "sha": sha})
        return 201, {}, s

    def _list_issues(self, rec):
        labels = set(filter(None, (rec.query.get("labels") or [""])[0].split(",")))
        state = (rec.query.get("state") or ["open"])[0]
        items = [i for i in self._visible(list(self.issues.values()))
                 if (state == "all" or i["state"] == state) and labels <= {lb["name"] for lb in i["labels"]}]
        return self._page(rec, items)

    def _create_issue(self, rec):
        return 201, {}, self.add_issue(str(rec.body["title"]), rec.body.get("body", ""), rec.body.get("labels", []))

    def _update_issue(self, rec, number):
        issue = self.issues.get(int(number))
        if issue is None:
            return 404, {}, {"message": "Not Found"}
        for key in ("state", "state_reason", "title", "body"):
            if key in rec.body:
                issue[key] = rec.body[key]
        if issue["state"] == "closed":
            issue["closed_at"] = NOW
        return 200, {}, issue


def _handler(fake: FakeGitHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # keep pytest output clean
            pass

        def _serve(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = {"__invalid_json__": raw.decode("utf-8", "replace")}
            rec = Recorded(self.command, parts.path, parse_qs(parts.query),
                           {k.lower(): v for k, v in self.headers.items()}, body, at=time.monotonic())
            with fake.lock:
                fake.requests.append(rec)
            status, headers, payload, delay = fake.handle(rec)
            rec.status = status
            if delay:
                time.sleep(delay)
            if status == DROP:
                self.close_connection = True
                return
            data = b"" if payload is None else json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                if rec.trickle:
                    self._trickle(data, rec.trickle)
                else:
                    self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError, OSError):
                pass  # the client gave up (timeout test)

        def _trickle(self, data: bytes, every: float) -> None:
            """One byte per ``every`` seconds, for at most 20 s (then the connection closes)."""
            end = time.monotonic() + 20
            for i in range(len(data)):
                if time.monotonic() > end:
                    self.close_connection = True
                    return
                self.wfile.write(data[i:i + 1])
                self.wfile.flush()
                time.sleep(every)

        do_GET = do_POST = do_PATCH = do_DELETE = _serve

    return Handler
