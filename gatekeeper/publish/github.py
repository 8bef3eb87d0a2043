"""A small GitHub REST client: retries, rate limits, timeouts, pagination.

Only the calls the action needs. Every request carries a timeout (connect + read) and a cap on
its whole exchange, body included (a server trickling one byte a second never trips a read
timeout); 5xx answers, connection errors and timeouts are retried with exponential backoff;
403/429 answers that say when to come back (``Retry-After``, or ``x-ratelimit-remaining: 0``
with ``x-ratelimit-reset``) are retried after that wait, and a secondary rate limit that does
not say is retried after GitHub's documented minute. The sum of all waits of one call is capped
(``RetryPolicy.max_total_wait``), pagination stops at ``max_pages`` or at a page already read,
and ``start_deadline`` puts one deadline on everything the client does, so a GitHub outage or a
hostile API cannot hold the job hostage: the verdict never depends on GitHub being up.

The token is only ever put into the ``Authorization`` header; error messages never include it.
"""

from __future__ import annotations

import math
import os
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

import requests
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError

from gatekeeper import __version__

RETRY_STATUSES = frozenset({500, 502, 503, 504})
API_VERSION = "2022-11-28"


@dataclass
class RetryPolicy:
    """How hard to try. Environment overrides (for tests and slow GHES instances):
    GATEKEEPER_HTTP_ATTEMPTS, GATEKEEPER_HTTP_BACKOFF, GATEKEEPER_HTTP_MAX_WAIT,
    GATEKEEPER_HTTP_CONNECT_TIMEOUT, GATEKEEPER_HTTP_READ_TIMEOUT,
    GATEKEEPER_HTTP_REQUEST_TIMEOUT, GATEKEEPER_HTTP_SECONDARY_WAIT (seconds),
    GATEKEEPER_HTTP_MAX_PAGES, GATEKEEPER_PUBLISH_DEADLINE (seconds)."""

    attempts: int = 4  # tries per call, the first included
    backoff: float = 1.0  # first backoff; doubles each retry, with jitter
    max_backoff: float = 20.0
    max_total_wait: float = 90.0  # cap on the sum of sleeps of one call
    connect_timeout: float = 10.0
    read_timeout: float = 30.0  # longest silence while waiting for bytes
    request_timeout: float = 60.0  # whole exchange of one request, body included
    secondary_wait: float = 60.0  # GitHub: wait at least a minute after a secondary rate limit
    max_pages: int = 30  # 3,000 comments at 100 per page; a PR with more is not worth a loop
    publish_deadline: float = 180.0  # everything one start_deadline() covers

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> RetryPolicy:
        env = os.environ if env is None else env
        policy = cls()
        for name, attr, conv in (
            ("ATTEMPTS", "attempts", int),
            ("BACKOFF", "backoff", float),
            ("MAX_WAIT", "max_total_wait", float),
            ("CONNECT_TIMEOUT", "connect_timeout", float),
            ("READ_TIMEOUT", "read_timeout", float),
            ("REQUEST_TIMEOUT", "request_timeout", float),
            ("SECONDARY_WAIT", "secondary_wait", float),
            ("MAX_PAGES", "max_pages", int),
        ):
            raw = env.get(f"GATEKEEPER_HTTP_{name}", "").strip()
            if raw:
                _set(policy, attr, conv, raw)
        _set(policy, "publish_deadline", float, env.get("GATEKEEPER_PUBLISH_DEADLINE", "").strip())
        policy.attempts = max(policy.attempts, 1)
        policy.max_pages = max(policy.max_pages, 1)
        return policy


def _set(policy: RetryPolicy, attr: str, conv: Callable[[str], float], raw: str) -> None:
    """One tuning knob; a bad one (junk, nan, inf) must not break publishing: keep the default."""
    if not raw:
        return
    try:
        value = conv(raw)
    except ValueError:
        return
    if math.isfinite(value):
        setattr(policy, attr, max(value, 0))


class GitHubError(Exception):
    """A call that failed for good (after any retries).

    ``status`` is the HTTP status (None for network errors / timeouts); ``maybe_applied`` is
    True when a non-idempotent request was sent but its answer was lost (read timeout, dropped
    connection, 5xx), so GitHub may have acted on it: the caller looks before sending it again.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        body: Any = None,
        maybe_applied: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.maybe_applied = maybe_applied

    @property
    def api_message(self) -> str:
        if isinstance(self.body, dict):
            parts = [str(self.body.get("message", ""))]
            for err in self.body.get("errors") or []:
                parts.append(str(err.get("message", "")) if isinstance(err, dict) else str(err))
            return " ".join(p for p in parts if p)
        return ""

    @property
    def read_only(self) -> bool:
        """403 for a token that may not write here (fork PRs get a read-only GITHUB_TOKEN)."""
        return self.status == 403 and "not accessible by integration" in self.api_message.lower()

    @property
    def too_long(self) -> bool:
        return self.status == 422 and "too long" in self.api_message.lower()


def _split_repo(repo: str) -> tuple[str, str]:
    owner, _, name = repo.partition("/")
    if not owner or not name or "/" in name:
        raise ValueError(f"GITHUB_REPOSITORY must be owner/name, got {repo!r}")
    return quote(owner, safe=""), quote(name, safe="")


_LINK_RE = re.compile(r'<([^>]+)>\s*;\s*rel="([^"]+)"')


def _page_key(url: str, params: dict[str, Any] | None) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A page's identity whatever the spelling: path plus sorted query (params included)."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query)) | {str(k): str(v) for k, v in (params or {}).items()}
    query.setdefault("page", "1")  # no page is the first page
    return parts.path.rstrip("/"), tuple(sorted(query.items()))


def _seconds(value: str | None) -> float | None:
    """A Retry-After value in seconds (delta-seconds or an HTTP date); None when absent or not a
    finite time (``nan``, ``inf``, junk)."""
    if value is None or not value.strip():
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    return max(seconds, 0.0) if math.isfinite(seconds) else None


def _secondary_limit(body: Any) -> bool:
    message = str(body.get("message", "")).lower() if isinstance(body, dict) else ""
    return "secondary rate limit" in message or "abuse detection" in message


class _Overdue(Exception):
    """One request did not complete (headers and body) in its time."""


def next_link(link_header: str | None) -> str | None:
    """The rel="next" URL of a Link header, or None."""
    for url, rel in _LINK_RE.findall(link_header or ""):
        if "next" in rel.split():
            return url
    return None


class GitHubClient:
    def __init__(
        self,
        token: str,
        api_url: str = "https://api.github.com",
        *,
        retry: RetryPolicy | None = None,
        session: requests.Session | None = None,
        sleep: Callable[[float], None] = time.sleep,
        log: Callable[[str], None] = lambda _m: None,
    ) -> None:
        self.api_url = (api_url or "https://api.github.com").rstrip("/")
        self.retry = retry or RetryPolicy.from_env()
        self.session = session or requests.Session()
        self._sleep = sleep
        self._log = log
        self._deadline: float | None = None  # time.monotonic() value; None: no deadline
        self._deadline_s = 0.0
        self.session.headers.update(
            {
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": API_VERSION,
                "User-Agent": f"gatekeeper/{__version__} (+github-action)",
            }
        )
        token = (token or "").strip()  # a trailing newline would make the header invalid
        self._token = token
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"

    # -- transport ---------------------------------------------------------------------------

    def _url(self, path_or_url: str) -> str:
        if path_or_url.startswith(("http://", "https://")):
            # Absolute URLs come from Link headers. The session sends the token with every
            # request, so follow them only to the API's own scheme and host.
            if urlsplit(path_or_url)[:2] != urlsplit(self.api_url)[:2]:
                raise GitHubError(f"refusing to follow a link to another host ({urlsplit(path_or_url).netloc})")
            return path_or_url
        return self.api_url + path_or_url

    def _redact(self, text: str) -> str:
        """Error text from a server (or a proxy that echoes requests) without the token."""
        return text.replace(self._token, "***") if self._token else text

    # -- the one deadline ---------------------------------------------------------------------

    def start_deadline(self, seconds: float | None = None) -> None:
        """From now on every call, retry and pause ends within ``seconds`` (default
        ``retry.publish_deadline``); past it a call fails at once with GitHubError."""
        self._deadline_s = self.retry.publish_deadline if seconds is None else seconds
        self._deadline = time.monotonic() + self._deadline_s

    def remaining(self) -> float:
        return math.inf if self._deadline is None else self._deadline - time.monotonic()

    def _past_deadline(self, what: str) -> GitHubError:
        return GitHubError(f"{what}: the publishing deadline of {self._deadline_s:g} s is reached "
                           "(GATEKEEPER_PUBLISH_DEADLINE); not waiting for GitHub any longer")

    def _rate_limit_wait(self, resp: requests.Response, body: Any) -> float | None:
        """Seconds GitHub asks us to wait, or None when the 403/429 is not about rate limits."""
        if "Retry-After" in resp.headers:
            # A Retry-After that is no finite time (nan, junk) still says "rate limited".
            wait = _seconds(resp.headers.get("Retry-After"))
            return self.retry.secondary_wait if wait is None else wait
        if resp.headers.get("x-ratelimit-remaining") == "0" and resp.headers.get("x-ratelimit-reset"):
            reset = _seconds(resp.headers["x-ratelimit-reset"])
            if reset is not None:
                return max(reset - time.time(), 0.0) + 1.0
        if _secondary_limit(body):
            return self.retry.secondary_wait  # GitHub: "wait at least one minute before retrying"
        return None  # 429: let the backoff decide; 403: a permission problem

    def _backoff(self, retry_no: int) -> float:
        base = min(self.retry.backoff * (2**retry_no), self.retry.max_backoff)
        return base * (0.5 + random.random() / 2)  # jitter: many jobs must not retry in lockstep

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        idempotent: bool | None = None,
    ) -> requests.Response:
        """Send one call with retries; return the 2xx response or raise GitHubError."""
        if idempotent is None:
            idempotent = method.upper() in ("GET", "HEAD", "PUT", "DELETE", "PATCH")
        url = self._url(path)
        waited = 0.0
        last: str = ""
        for attempt in range(self.retry.attempts):
            if self.remaining() <= 0:
                raise self._past_deadline(f"{method} {path}")
            wait: float | None = None
            try:
                resp = self._send(method, url, json=json, params=params)
            except requests.exceptions.ConnectTimeout as exc:
                last = f"connect timeout ({type(exc).__name__})"
            except (requests.exceptions.ReadTimeout, _Overdue) as exc:
                last = f"no answer within {exc.args[0] if isinstance(exc, _Overdue) else self.retry.read_timeout:g} s"
                if not idempotent:
                    # GitHub may have acted on it; the caller checks before trying again.
                    raise GitHubError(f"{method} {path}: {last}", maybe_applied=True) from None
            except requests.exceptions.RequestException as exc:
                last = f"network error ({type(exc).__name__})"
                if not idempotent and not _never_sent(exc):
                    # The connection died after the request went out: it may have been applied.
                    raise GitHubError(f"{method} {path}: {last}", maybe_applied=True) from None
            else:
                if resp.status_code < 400:
                    return resp
                body = _json_or_none(resp)
                err = GitHubError(
                    f"{method} {path}: HTTP {resp.status_code} {self._redact(_short(body, resp.text))}",
                    status=resp.status_code,
                    body=body,
                )
                last = str(err)
                if resp.status_code in (403, 429):
                    wait = self._rate_limit_wait(resp, body)
                    if wait is None and resp.status_code == 403:
                        raise err  # a permission problem: retrying will not help
                elif resp.status_code not in RETRY_STATUSES:
                    raise err
                elif not idempotent:
                    # A 502/504 from GitHub's front end often comes after the write happened;
                    # repeating a POST blindly could post twice. The caller looks first.
                    err.maybe_applied = True
                    raise err
            if attempt + 1 >= self.retry.attempts:
                break
            if wait is None:
                wait = self._backoff(attempt)
            if waited + wait > self.retry.max_total_wait:
                last += f"; would need to wait {wait:.0f} s more, over the {self.retry.max_total_wait:g} s cap"
                break
            if wait >= self.remaining():
                last += f"; would need to wait {wait:.0f} s, past the publishing deadline"
                break
            self._log(f"GitHub: {last}; retrying in {wait:.1f} s")
            self._sleep(wait)
            waited += wait
        raise GitHubError(f"{method} {path}: gave up after {attempt + 1} attempt(s): {last}")

    def _send(self, method: str, url: str, *, json: Any, params: dict[str, Any] | None) -> requests.Response:
        """One exchange, headers and body, within ``request_timeout`` (and the deadline) of wall
        clock. requests' read timeout bounds each silence, not the whole: a server that trickles
        a byte a second would hold it forever. So the exchange runs in a worker thread that is
        abandoned (daemon, its response closed) when overdue."""
        limit = max(min(self.retry.request_timeout, self.remaining()), 0.001)
        box: dict[str, Any] = {}
        done = threading.Event()

        def work() -> None:
            try:
                resp = self.session.request(
                    method, url, json=json, params=params, stream=True,
                    timeout=(min(self.retry.connect_timeout, limit), min(self.retry.read_timeout, limit)),
                )
                box["resp"] = resp
                _ = resp.content  # read the whole body here, under the watch
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                box["exc"] = exc
            finally:
                done.set()

        threading.Thread(target=work, name="gatekeeper-http", daemon=True).start()
        if not done.wait(limit):
            _shut(box.get("resp"))
            raise _Overdue(round(limit, 3))
        if "exc" in box:
            raise box["exc"]
        return box["resp"]

    def pause(self, retry_no: int) -> None:
        """Sleep one backoff step (for callers that retry a non-idempotent call themselves),
        never past the deadline."""
        wait = self._backoff(retry_no)
        if wait >= self.remaining():
            raise self._past_deadline("waiting to look again")
        self._sleep(wait)

    def paginate(self, path: str, params: dict[str, Any] | None = None) -> Iterator[Any]:
        """Yield the items of a list endpoint, following Link rel="next" for at most
        ``retry.max_pages`` pages, and never to a page already read (a Link pointing back)."""
        url: str | None = path
        query: dict[str, Any] | None = {"per_page": 100, **(params or {})}
        seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        while url:
            key = _page_key(url, query)
            if key in seen:
                raise GitHubError(f"GET {path}: the Link header's next page is one already read; "
                                  f"stopped after {len(seen)} page(s)")
            if len(seen) >= self.retry.max_pages:
                raise GitHubError(f"GET {path}: more than {self.retry.max_pages} pages; stopped "
                                  "(GATEKEEPER_HTTP_MAX_PAGES)")
            seen.add(key)
            resp = self.request("GET", url, params=query)
            try:
                data = resp.json()
            except ValueError:
                raise GitHubError(f"GET {path}: the answer is not JSON") from None
            if not isinstance(data, list):
                raise GitHubError(f"GET {path}: expected a list, got {type(data).__name__}")
            yield from data
            url, query = next_link(resp.headers.get("Link")), None  # next URL carries the query

    # -- endpoints ---------------------------------------------------------------------------

    def list_issue_comments(self, repo: str, number: int) -> Iterator[dict]:
        o, r = _split_repo(repo)
        return self.paginate(f"/repos/{o}/{r}/issues/{int(number)}/comments")

    def create_issue_comment(self, repo: str, number: int, body: str, *, idempotent: bool = False) -> dict:
        """``idempotent=True`` retries blindly: only for comments where a duplicate is harmless."""
        o, r = _split_repo(repo)
        return self.request(
            "POST", f"/repos/{o}/{r}/issues/{int(number)}/comments", json={"body": body}, idempotent=idempotent
        ).json()

    def update_issue_comment(self, repo: str, comment_id: int, body: str) -> dict:
        o, r = _split_repo(repo)
        return self.request(
            "PATCH", f"/repos/{o}/{r}/issues/comments/{int(comment_id)}", json={"body": body}
        ).json()

    def get_pull(self, repo: str, number: int) -> dict:
        o, r = _split_repo(repo)
        data = self.request("GET", f"/repos/{o}/{r}/pulls/{int(number)}").json()
        if not isinstance(data, dict):
            raise GitHubError(f"GET /repos/{o}/{r}/pulls/{int(number)}: expected an object")
        return data

    def pulls_for_commit(self, repo: str, sha: str) -> list[dict]:
        o, r = _split_repo(repo)
        return list(self.paginate(f"/repos/{o}/{r}/commits/{quote(sha, safe='')}/pulls"))

    def create_status(
        self, repo: str, sha: str, *, state: str, context: str, description: str, target_url: str | None
    ) -> dict:
        o, r = _split_repo(repo)
        payload: dict[str, Any] = {"state": state, "context": context, "description": description[:140]}
        if target_url:
            payload["target_url"] = target_url
        # Statuses are last-writer-wins per context, so retrying a POST is harmless.
        return self.request(
            "POST", f"/repos/{o}/{r}/statuses/{quote(sha, safe='')}", json=payload, idempotent=True
        ).json()

    def list_issues(self, repo: str, *, labels: str, state: str = "open") -> Iterator[dict]:
        o, r = _split_repo(repo)
        for item in self.paginate(f"/repos/{o}/{r}/issues", {"labels": labels, "state": state}):
            if "pull_request" not in item:  # this endpoint lists PRs too
                yield item

    def create_issue(self, repo: str, *, title: str, body: str, labels: list[str]) -> dict:
        o, r = _split_repo(repo)
        return self.request(
            "POST", f"/repos/{o}/{r}/issues", json={"title": title, "body": body, "labels": labels}
        ).json()

    def update_issue(self, repo: str, number: int, **fields: Any) -> dict:
        o, r = _split_repo(repo)
        return self.request("PATCH", f"/repos/{o}/{r}/issues/{int(number)}", json=fields).json()


def _shut(resp: requests.Response | None) -> None:
    """Best effort: shut the socket of an abandoned exchange so its worker thread ends now.
    (Not ``resp.close()``: that waits for the lock the blocked read holds.)"""
    sock = getattr(getattr(getattr(resp, "raw", None), "_connection", None), "sock", None)
    try:
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _never_sent(exc: requests.exceptions.RequestException) -> bool:
    """True when the request surely never reached GitHub (no connection was made)."""
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return True
    reason = getattr(exc.args[0], "reason", None) if exc.args else None
    return isinstance(reason, (NewConnectionError, ConnectTimeoutError))


def _json_or_none(resp: requests.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return None


def _short(body: Any, text: str) -> str:
    if isinstance(body, dict) and body.get("message"):
        msg = str(body["message"])
        errs = [e.get("message") for e in body.get("errors") or [] if isinstance(e, dict) and e.get("message")]
        if errs:
            msg += ": " + "; ".join(map(str, errs))
    else:
        msg = text
    msg = " ".join(msg.split())
    return msg[:300]
