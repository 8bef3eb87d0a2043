"""One sticky PR comment per suite, and the nightly tracking issue.

The sticky comment is found by a hidden marker that names the suite
(``<!-- gatekeeper:sticky suite=demo -->``), so two suites keep two comments and a re-run edits
its own comment instead of adding one. Comment bodies stay under GitHub's 65,536 characters.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from gatekeeper.publish.github import GitHubClient, GitHubError

MAX_COMMENT_CHARS = 65_536
COMMENT_MODES = ("auto", "always", "on-regression", "never")
TRACKING_LABEL = "gatekeeper"
_SUITE_SAFE = re.compile(r"[^a-z0-9._-]")


def _safe_suite(suite: str) -> str:
    # Suite names are [a-z0-9._-]+ by schema; sanitise anyway so a marker can never close early.
    return _SUITE_SAFE.sub("_", suite.lower()) or "default"


def sticky_marker(suite: str) -> str:
    return f"<!-- gatekeeper:sticky suite={_safe_suite(suite)} -->"


def tracking_marker(suite: str) -> str:
    return f"<!-- gatekeeper:tracking suite={_safe_suite(suite)} -->"


def fit_body(body: str, marker: str, *, limit: int = MAX_COMMENT_CHARS, note: str | None = None) -> str:
    """body + marker, hard-trimmed (with a note) so the whole is at most ``limit`` characters."""
    tail = "\n\n" + marker
    if len(body) + len(tail) <= limit:
        return body + tail
    note = note or "\n\n… _(trimmed: the report was longer than a GitHub comment allows; see the job summary)_"
    reserve = 200  # room to close what the cut left open
    cut = body[: max(limit - len(tail) - len(note) - reserve, 0)]
    # Do not leave a code fence or <details> dangling: the marker must stay an HTML comment.
    closers = "\n```" if cut.count("```") % 2 else ""
    closers += "\n</details>" * max(cut.count("<details") - cut.count("</details>"), 0)
    return cut + closers[:reserve] + note + tail


@dataclass
class CommentResult:
    action: str  # "created" | "updated" | "skipped" | "failed"
    url: str | None = None
    reason: str = ""
    read_only: bool = False


ACTIONS_BOT = "github-actions[bot]"


def _is_ours(c: dict, author: str | None) -> bool:
    user = c.get("user") or {}
    if author:
        return str(user.get("login", "")).lower() == author.lower()
    return user.get("type") == "Bot"


def find_marked_comment(
    client: GitHubClient, repo: str, number: int, marker: str, *, author: str | None = None
) -> dict | None:
    """Our comment carrying ``marker``, or None.

    Only comments we could have written count: by ``author`` (the login behind a personal
    token) when given, else by a bot account, github-actions[bot] first. A person's comment that
    quotes or plants the marker is never edited: our verdict would then stand under their name,
    and they could edit it to read "pass".
    """
    found = [
        c for c in client.list_issue_comments(repo, number)
        if marker in (c.get("body") or "") and _is_ours(c, author)
    ]
    actions = [c for c in found if (c.get("user") or {}).get("login") == ACTIONS_BOT]
    return (actions or found or [None])[0]


def should_post(mode: str, *, regressed: bool, has_outcome: bool, exists: bool) -> bool:
    """Whether this run writes the sticky comment (create or update).

    auto:          every gated run; an error run only refreshes an existing comment.
    always:        every run, errors and "first baseline recorded" notices included.
    on-regression: create only on a regression; an existing comment is always refreshed so
                   it never shows a stale verdict.
    never:         never.
    """
    if mode == "never":
        return False
    if exists:
        return True
    if mode == "always":
        return True
    if mode == "auto":
        return has_outcome
    return regressed  # on-regression


def upsert_sticky(
    client: GitHubClient,
    repo: str,
    number: int,
    suite: str,
    body: str,
    *,
    mode: str = "auto",
    regressed: bool = False,
    has_outcome: bool = True,
    author: str | None = None,
) -> CommentResult:
    """Create or update the suite's sticky comment on issue/PR ``number``; never raises."""
    marker = sticky_marker(suite)
    if mode == "never":
        return CommentResult("skipped", reason="comment: never")
    try:
        existing = find_marked_comment(client, repo, number, marker, author=author)
        if not should_post(mode, regressed=regressed, has_outcome=has_outcome, exists=existing is not None):
            return CommentResult("skipped", reason=f"comment: {mode} and nothing to report")
        return _write(client, repo, number, marker, body, existing, author)
    except GitHubError as err:
        return CommentResult("failed", reason=str(err), read_only=err.read_only)


def _write(
    client: GitHubClient, repo: str, number: int, marker: str, body: str, existing: dict | None,
    author: str | None,
) -> CommentResult:
    full = fit_body(body, marker)
    try:
        return _send(client, repo, number, marker, full, existing, author)
    except GitHubError as err:
        if not err.too_long:
            raise
    # GitHub may count differently than len(); retry once with a much shorter body.
    short = fit_body(
        body,
        marker,
        limit=MAX_COMMENT_CHARS // 2,
        note="\n\n… _(trimmed: GitHub refused the full report as too long; see the job summary)_",
    )
    return _send(client, repo, number, marker, short, existing, author)


def _send(
    client: GitHubClient, repo: str, number: int, marker: str, body: str, existing: dict | None,
    author: str | None,
) -> CommentResult:
    if existing is not None:
        c = client.update_issue_comment(repo, existing["id"], body)
        return CommentResult("updated", url=c.get("html_url"))
    c, landed = create_checked(
        client,
        lambda: client.create_issue_comment(repo, number, body),
        lambda: find_marked_comment(client, repo, number, marker, author=author),
    )
    if landed:
        c = client.update_issue_comment(repo, c["id"], body)
        return CommentResult("updated", url=c.get("html_url"))
    return CommentResult("created", url=c.get("html_url"))


def create_checked(
    client: GitHubClient, post: Callable[[], dict], find: Callable[[], dict | None]
) -> tuple[dict, bool]:
    """Run a non-idempotent ``post`` at most once past the point where GitHub may have acted.

    When its answer was lost (timeout, dropped connection, 5xx) GitHub may have applied it, and
    GitHub's listings can lag behind a write: not finding it is no proof it is not there. So
    ``find`` looks a few times (with backoff, within the deadline) and, if it never shows, the
    call fails instead of posting again: at most one sticky comment or tracking issue, whatever
    the API does; the next run finds it or creates it. Returns (object, found_instead_of_posted).
    """
    try:
        return post(), False
    except GitHubError as err:
        if not err.maybe_applied:
            raise
        lost = err
    for look in range(max(client.retry.attempts, 1)):
        client.pause(look)
        found = find()
        if found is not None:
            return found, True
    raise GitHubError(f"{lost}; it did not show up in the listing, so it is not sent again "
                      "(GitHub may still have applied it; the next run finds it)")


# -- nightly tracking issue --------------------------------------------------------------------


@dataclass
class TrackingResult:
    action: str  # "opened" | "commented" | "closed" | "none" | "failed"
    url: str | None = None
    number: int | None = None
    reason: str = ""


def find_tracking_issue(client: GitHubClient, repo: str, suite: str) -> dict | None:
    marker = tracking_marker(suite)
    for issue in client.list_issues(repo, labels=TRACKING_LABEL, state="open"):
        if marker in (issue.get("body") or ""):
            return issue
    return None


def track_nightly(
    client: GitHubClient, repo: str, suite: str, *, regressed: bool, report: str, run_url: str | None,
    drift: bool = False,
) -> TrackingResult:
    """Regression (or drift since the anchor): open the tracking issue or comment on the open one.
    Green: comment on and close an open one. Never raises."""
    what = "drift since the anchor" if drift else "regression"
    try:
        issue = find_tracking_issue(client, repo, suite)
        run_ref = f" ([run]({run_url}))" if run_url else ""
        if regressed:
            if issue is None:
                found = ("drift: each night passed against the night before, but the model is now worse than "
                         "the anchor (the reference a person approved) by more than the margin" if drift
                         else "a regression")
                body = fit_body(
                    f"The nightly gate for suite `{_safe_suite(suite)}` found {found}{run_ref}.\n\n"
                    f"This issue is closed automatically on the first green night.\n\n{report}",
                    tracking_marker(suite),
                )
                created, _ = create_checked(
                    client,
                    lambda: client.create_issue(
                        repo,
                        title=f"gatekeeper: nightly {what} in suite {_safe_suite(suite)}",
                        body=body,
                        labels=[TRACKING_LABEL],
                    ),
                    lambda: find_tracking_issue(client, repo, suite),
                )
                return TrackingResult("opened", url=created.get("html_url"), number=created.get("number"))
            c = client.create_issue_comment(
                repo, issue["number"], fit_body(f"Still {'drifted' if drift else 'regressed'}{run_ref}.\n\n{report}", ""),
                idempotent=True,  # a duplicate progress note is harmless; retry it blindly
            )
            return TrackingResult("commented", url=c.get("html_url"), number=issue["number"])
        if issue is None:
            return TrackingResult("none", reason="green and no open tracking issue")
        client.create_issue_comment(
            repo, issue["number"], fit_body(f"Green again{run_ref}; closing.\n\n{report}", ""),
            idempotent=True,
        )
        closed = client.update_issue(repo, issue["number"], state="closed", state_reason="completed")
        return TrackingResult("closed", url=closed.get("html_url"), number=issue["number"])
    except GitHubError as err:
        return TrackingResult("failed", reason=str(err))
