"""A small GitHub REST client: retries, rate limits, timeouts, pagination.

Only the calls the action needs. Every request carries a timeout (connect + read); 5xx answers,
connection errors and timeouts are retried with exponential backoff; 403/429 answers that say
when to come back (``Retry-After``, or ``x-ratelimit-remaining: 0`` with ``x-ratelimit-reset``)
are retried after that wait. The sum of all waits of one call is capped
(``RetryPolicy.max_total_wait``) so a GitHub outage cannot hold the job hostage: the verdict
never depends on GitHub being up.

The token is only ever put into the ``Authorization`` header; error messages never include it.
"""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import requests

from gatekeeper import __version__

RETRY_STATUSES = frozenset({500, 502, 503, 504})
API_VERSION = "2022-11-28"


@dataclass
class RetryPolicy:
    """How hard to try. Environment overrides (for tests and slow GHES instances):
    GATEKEEPER_HTTP_ATTEMPTS, GATEKEEPER_HTTP_BACKOFF, GATEKEEPER_HTTP_MAX_WAIT,
    GATEKEEPER_HTTP_CONNECT_TIMEOUT, GATEKEEPER_HTTP_READ_TIMEOUT (seconds)."""

    attempts: int = 4  # tries per call, the first included
    backoff: float = 1.0  # first backoff; doubles each retry, with jitter
    max_backoff: float = 20.0
    max_total_wait: float = 90.0  # cap on the sum of sleeps of one call
    connect_timeout: float = 10.0
    read_timeout: float = 30.0

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
        ):
            raw = env.get(f"GATEKEEPER_HTTP_{name}", "").strip()
            if raw:
                try:
                    setattr(policy, attr, max(conv(raw), 0))
                except ValueError:
                    pass  # a bad tuning knob must not break publishing; keep the default
        policy.attempts = max(policy.attempts, 1)
        return policy


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

    def _rate_limit_wait(self, resp: requests.Response) -> float | None:
        """Seconds GitHub asks us to wait, or None when the 403/429 is not about rate limits."""
        retry_after = resp.headers.get("Retry-After")
        if retry_after:
            try:
                return max(float(retry_after), 0.0)
            except ValueError:
                return None
        if resp.headers.get("x-ratelimit-remaining") == "0" and resp.headers.get("x-ratelimit-reset"):
            try:
                return max(float(resp.headers["x-ratelimit-reset"]) - time.time(), 0.0) + 1.0
            except ValueError:
                return None
        if resp.status_code == 429:
            return None  # let the backoff decide
        return None

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
            wait: float | None = None
            try:
                resp = self.session.request(
                    method,
                    url,
                    json=json,
                    params=params,
                    timeout=(self.retry.connect_timeout, self.retry.read_timeout),
                )
            except requests.exceptions.ConnectTimeout as exc:
                last = f"connect timeout ({type(exc).__name__})"
            except requests.exceptions.ReadTimeout:
                last = f"no answer within {self.retry.read_timeout:g} s"
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
                    wait = self._rate_limit_wait(resp)
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
            self._log(f"GitHub: {last}; retrying in {wait:.1f} s")
            self._sleep(wait)
            waited += wait
        raise GitHubError(f"{method} {path}: gave up after {attempt + 1} attempt(s): {last}")

    def pause(self, retry_no: int) -> None:
        """Sleep one backoff step (for callers that retry a non-idempotent call themselves)."""
        self._sleep(self._backoff(retry_no))

    def paginate(self, path: str, params: dict[str, Any] | None = None) -> Iterator[Any]:
        """Yield the items of a list endpoint, following Link rel="next"."""
        url: str | None = path
        query: dict[str, Any] | None = {"per_page": 100, **(params or {})}
        while url:
            resp = self.request("GET", url, params=query)
            data = resp.json()
            if not isinstance(data, list):
                raise GitHubError(f"GET {url}: expected a list, got {type(data).__name__}")
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


def _never_sent(exc: requests.exceptions.RequestException) -> bool:
    """True when the request surely never reached GitHub (no connection was made)."""
    from urllib3.exceptions import ConnectTimeoutError, NewConnectionError

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
