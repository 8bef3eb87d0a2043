"""publish/: the GitHub client, sticky comments, tracking issue, runner plumbing, event parsing.

Everything talks real HTTP to tests/github_server.py, which validates each request and response
against GitHub's OpenAPI description; every test ends by asserting it found no problem.
"""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import pytest

from gatekeeper.errors import GateError
from gatekeeper.publish import ci, comment, events
from gatekeeper.publish.github import GitHubClient, GitHubError, RetryPolicy, next_link
from tests.github_server import BOT, FakeGitHub

TOKEN = "ghs_FAKEtoken0123456789abcdefSECRET"
REPO = "octo/repo"


def client(fake: FakeGitHub, **kw) -> GitHubClient:
    policy = RetryPolicy(attempts=kw.pop("attempts", 4), backoff=kw.pop("backoff", 0.01), max_backoff=0.05,
                         max_total_wait=kw.pop("max_total_wait", 3.0), connect_timeout=1.0,
                         read_timeout=kw.pop("read_timeout", 0.4), request_timeout=kw.pop("request_timeout", 5.0),
                         secondary_wait=kw.pop("secondary_wait", 0.3), max_pages=kw.pop("max_pages", 30))
    return GitHubClient(TOKEN, fake.url, retry=policy, **kw)


# -- sticky comments -------------------------------------------------------------------------


def test_sticky_comment_is_created_once_then_edited_in_place(gh):
    c = client(gh)
    first = comment.upsert_sticky(c, REPO, 7, "demo", "### ✅ first")
    second = comment.upsert_sticky(c, REPO, 7, "demo", "### ❌ second")
    assert (first.action, second.action) == ("created", "updated")
    assert first.url == second.url and first.url.endswith(f"#issuecomment-{gh.comments[7][0]['id']}")
    bodies = gh.comment_bodies(7)
    assert len(bodies) == 1
    assert bodies[0].startswith("### ❌ second") and bodies[0].endswith("<!-- gatekeeper:sticky suite=demo -->")
    assert [r.method for r in gh.writes()] == ["POST", "PATCH"]
    assert gh.requests[0].headers["authorization"] == f"Bearer {TOKEN}"


def test_marker_on_page_two_is_found_through_link_headers(gh):
    for i in range(130):
        gh.add_comment(7, f"human comment {i} mentions gatekeeper")
    ours = gh.add_comment(7, "old report\n\n" + comment.sticky_marker("demo"), BOT)
    for i in range(20):
        gh.add_comment(7, f"later comment {i}")
    result = comment.upsert_sticky(client(gh), REPO, 7, "demo", "new report")
    assert result.action == "updated"
    assert len(gh.comments[7]) == 151
    assert ours["body"].startswith("new report")
    gets = [r for r in gh.requests if r.method == "GET"]
    assert [r.query.get("page", ["1"])[0] for r in gets] == ["1", "2"]
    assert all(r.query["per_page"] == ["100"] for r in gets)


def test_a_next_link_to_another_host_does_not_get_the_token(gh):
    other = FakeGitHub(REPO).start()
    try:
        gh.fail("GET", r"/comments$", 200, body=[gh.add_comment(7, "human")],
                headers={"Link": f'<{other.url}/repos/{REPO}/issues/7/comments?page=2>; rel="next"'})
        result = comment.upsert_sticky(client(gh), REPO, 7, "demo", "x")
    finally:
        other.stop()
    assert other.requests == []
    assert result.action == "failed" and "another host" in result.reason


def test_an_error_body_echoing_the_token_is_redacted(gh):
    gh.fail("GET", r"/comments$", 404, body={"message": f"no such token Bearer {TOKEN}"})
    result = comment.upsert_sticky(client(gh), REPO, 7, "demo", "x")
    assert result.action == "failed" and "404" in result.reason and TOKEN not in result.reason


def test_two_suites_keep_two_comments(gh):
    c = client(gh)
    for _ in range(2):
        comment.upsert_sticky(c, REPO, 3, "demo", "demo report")
        comment.upsert_sticky(c, REPO, 3, "nightly-big", "big report")
    bodies = gh.comment_bodies(3)
    assert len(bodies) == 2
    assert "suite=demo -->" in bodies[0] and "suite=nightly-big -->" in bodies[1]


def test_comment_modes(gh):
    c = client(gh)
    assert comment.upsert_sticky(c, REPO, 5, "demo", "x", mode="never").action == "skipped"
    assert comment.upsert_sticky(c, REPO, 5, "demo", "ok", mode="on-regression").action == "skipped"
    assert gh.comment_bodies(5) == []
    assert comment.upsert_sticky(c, REPO, 5, "demo", "bad", mode="on-regression", regressed=True).action == "created"
    # Green again: the existing comment is refreshed so it never shows a stale verdict.
    assert comment.upsert_sticky(c, REPO, 5, "demo", "green", mode="on-regression").action == "updated"
    assert gh.comment_bodies(5)[0].startswith("green")
    assert comment.upsert_sticky(c, REPO, 6, "demo", "err", mode="auto", has_outcome=False).action == "skipped"
    assert comment.upsert_sticky(c, REPO, 6, "demo", "err", mode="always", has_outcome=False).action == "created"


def test_a_human_comment_quoting_the_marker_is_not_preferred_over_ours(gh):
    gh.add_comment(9, "quoting: " + comment.sticky_marker("demo"))
    ours = gh.add_comment(9, "ours\n" + comment.sticky_marker("demo"), BOT)
    comment.upsert_sticky(client(gh), REPO, 9, "demo", "fresh")
    assert ours["body"].startswith("fresh") and gh.comments[9][0]["body"].startswith("quoting")


def test_a_marker_in_a_human_comment_is_never_taken_as_ours(gh):
    # Someone quotes (or plants) the marker before our first run: editing their comment would
    # put our verdict under their name, and they could then edit it to say "pass".
    planted = gh.add_comment(9, "### ✅ all good\n" + comment.sticky_marker("demo"))
    result = comment.upsert_sticky(client(gh), REPO, 9, "demo", "### ❌ real verdict")
    assert result.action == "created"
    assert planted["body"].startswith("### ✅ all good")
    assert gh.comments[9][1]["body"].startswith("### ❌ real verdict")
    assert [r.method for r in gh.writes()] == ["POST"]


def test_a_personal_token_finds_its_own_comment_by_login(gh):
    mine = gh.add_comment(9, "old\n" + comment.sticky_marker("demo"), {"login": "ci-user", "id": 5, "type": "User"})
    gh.add_comment(9, "quote\n" + comment.sticky_marker("demo"))
    result = comment.upsert_sticky(client(gh), REPO, 9, "demo", "fresh", author="CI-user")
    assert result.action == "updated" and mine["body"].startswith("fresh")


# -- size limits -----------------------------------------------------------------------------


def test_fit_body_hard_trims_under_65536_and_keeps_the_marker():
    marker = comment.sticky_marker("demo")
    body = "<details><summary>x</summary>\n\n```\n" + "y" * 100_000
    out = comment.fit_body(body, marker)
    assert len(out) <= 65_536
    assert out.endswith(marker)
    assert "trimmed" in out
    assert out.count("```") % 2 == 0 and out.count("<details") == out.count("</details>")
    assert comment.fit_body("short", marker) == "short\n\n" + marker


def test_oversized_report_reaches_github_under_the_limit(gh):
    result = comment.upsert_sticky(client(gh), REPO, 1, "demo", "z" * 200_000)
    assert result.action == "created"
    assert len(gh.comment_bodies(1)[0]) <= 65_536


def test_422_body_too_long_is_retried_once_with_a_shorter_body(gh):
    gh.fail("POST", r"/comments$", 422, body={"message": "Validation Failed", "errors": [
        {"resource": "IssueComment", "code": "custom", "field": "body",
         "message": "body is too long (maximum is 65536 characters)"}]})
    result = comment.upsert_sticky(client(gh), REPO, 1, "demo", "w" * 60_000)
    assert result.action == "created"
    posts = [r for r in gh.requests if r.method == "POST"]
    assert len(posts) == 2 and len(posts[1].body["body"]) <= 65_536 // 2
    assert "refused the full report" in gh.comment_bodies(1)[0]


# -- reliability -----------------------------------------------------------------------------


def test_5xx_on_a_read_is_retried_then_succeeds(gh):
    gh.fail("GET", r"/comments$", 500)
    gh.fail("GET", r"/comments$", 502)
    result = comment.upsert_sticky(client(gh), REPO, 2, "demo", "after outage")
    assert result.action == "created"
    assert [r.status for r in gh.requests if r.method == "GET"] == [500, 502, 200]
    assert len(gh.comment_bodies(2)) == 1


def test_a_5xx_post_that_never_shows_up_is_not_sent_again(gh):
    # A 5xx may come after the write; not finding it is no proof it is not there (listings
    # lag). At most one comment: this run gives up, the next one creates it.
    gh.fail("POST", r"/comments$", 500)
    result = comment.upsert_sticky(client(gh), REPO, 2, "demo", "after outage")
    assert result.action == "failed" and "not sent again" in result.reason
    assert [r.status for r in gh.requests if r.method == "POST"] == [500]
    assert comment.upsert_sticky(client(gh), REPO, 2, "demo", "next run").action == "created"
    assert gh.comment_bodies(2) == ["next run\n\n" + comment.sticky_marker("demo")]


def test_a_502_post_while_the_listing_lags_leaves_one_comment(gh):
    # Issue #10 item 14: the POST landed, answered 502, and the listing did not show it yet.
    gh.listing_lag = 1.5
    gh.fail("POST", r"/comments$", 502, after=True)
    result = comment.upsert_sticky(client(gh), REPO, 2, "demo", "once")
    assert result.action == "failed" and "502" in result.reason
    assert len(gh.comment_bodies(2)) == 1 and len([r for r in gh.writes() if r.method == "POST"]) == 1
    time.sleep(1.5)  # the listing caught up: the next run edits the one comment
    assert comment.upsert_sticky(client(gh), REPO, 2, "demo", "twice").action == "updated"
    assert gh.comment_bodies(2) == ["twice\n\n" + comment.sticky_marker("demo")]


def test_a_tracking_issue_post_while_the_listing_lags_opens_one_issue(gh):
    gh.listing_lag = 1.5
    gh.fail("POST", r"/issues$", 502, after=True)
    opened = comment.track_nightly(client(gh), REPO, "demo", regressed=True, report="R", run_url=None)
    assert opened.action == "failed" and len(gh.issues) == 1


# -- bounded publishing (issue #10 item 2) -----------------------------------------------------


def test_a_next_link_pointing_at_itself_is_read_once(gh):
    gh.add_comment(7, "human")
    gh.pages = "self"
    result = comment.upsert_sticky(client(gh), REPO, 7, "demo", "x")
    assert result.action == "failed" and "already read" in result.reason
    assert len(gh.requests) == 1 and gh.writes() == []


def test_endless_pages_stop_at_max_pages(gh):
    gh.add_comment(7, "human")
    gh.pages = "endless"
    t0 = time.monotonic()
    result = comment.upsert_sticky(client(gh, max_pages=5), REPO, 7, "demo", "x")
    assert time.monotonic() - t0 < 5
    assert result.action == "failed" and "more than 5 pages" in result.reason
    assert len(gh.requests) == 5 and gh.writes() == []


def test_max_pages_still_reads_a_long_thread(gh):
    for i in range(250):
        gh.add_comment(7, f"c{i}")
    gh.add_comment(7, "old\n" + comment.sticky_marker("demo"), BOT)
    assert comment.upsert_sticky(client(gh, max_pages=3), REPO, 7, "demo", "new").action == "updated"


def _trickle_setup(gh: FakeGitHub) -> None:
    for i in range(5):  # a listing of a few KB, sent one byte every 50 ms: minutes in all
        gh.add_comment(7, f"human {i}")


def test_a_trickled_answer_is_cut_at_the_request_timeout_and_retried(gh):
    _trickle_setup(gh)
    gh.fail("GET", r"/comments$", trickle=0.05)
    t0 = time.monotonic()
    result = comment.upsert_sticky(client(gh, read_timeout=0.3, request_timeout=0.8), REPO, 7, "demo", "x")
    assert result.action == "created"
    assert 0.8 <= time.monotonic() - t0 < 4
    assert [r.method for r in gh.requests] == ["GET", "GET", "POST"]


def test_the_deadline_bounds_all_publishing_even_a_trickle(gh):
    _trickle_setup(gh)
    gh.fail("GET", r"/comments$", trickle=0.05, times=100)
    c = client(gh, read_timeout=0.3, request_timeout=30, attempts=10)
    c.start_deadline(1.5)
    t0 = time.monotonic()
    result = comment.upsert_sticky(c, REPO, 7, "demo", "x")
    assert time.monotonic() - t0 < 2.5
    assert result.action == "failed" and ("deadline" in result.reason or "no answer within" in result.reason)
    assert gh.writes() == []
    # Past the deadline every call fails at once, without touching the network.
    n = len(gh.requests)
    with pytest.raises(GitHubError, match="publishing deadline of 1.5 s"):
        c.create_status(REPO, "a" * 40, state="success", context="x", description="d", target_url=None)
    assert len(gh.requests) == n


def test_the_deadline_stops_waiting_on_retries(gh):
    gh.fail("GET", r"/comments$", 503, times=100)
    c = client(gh, attempts=50, backoff=0.4, max_total_wait=60)
    c.start_deadline(1.0)
    t0 = time.monotonic()
    result = comment.upsert_sticky(c, REPO, 2, "demo", "x")
    assert time.monotonic() - t0 < 1.5 and result.action == "failed"


# -- rate limits (issue #10 item 14) -----------------------------------------------------------


def test_a_secondary_rate_limit_without_retry_after_waits_and_retries(gh):
    gh.fail("POST", r"/comments$", 403, body={"message": "You have exceeded a secondary rate limit. "
                                                          "Please wait a few minutes before you try again."})
    result = comment.upsert_sticky(client(gh, secondary_wait=0.4), REPO, 2, "demo", "x")
    assert result.action == "created" and len(gh.comment_bodies(2)) == 1
    posts = [r for r in gh.requests if r.method == "POST"]
    assert [r.status for r in posts] == [403, 201] and posts[1].at - posts[0].at >= 0.4


def test_the_secondary_wait_defaults_to_a_minute():
    assert RetryPolicy().secondary_wait >= 60


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "soon", ""])
def test_a_retry_after_that_is_no_time_does_not_abort_publishing(gh, value):
    gh.fail("GET", r"/comments$", 403, headers={"Retry-After": value},
            body={"message": "You have exceeded a secondary rate limit."})
    result = comment.upsert_sticky(client(gh, secondary_wait=0.2), REPO, 2, "demo", "x")
    assert result.action == "created"
    gets = [r for r in gh.requests if r.method == "GET"]
    assert gets[1].at - gets[0].at >= 0.2


def test_retry_after_as_an_http_date_is_honoured(gh):
    from email.utils import formatdate

    gh.fail("GET", r"/comments$", 429, headers={"Retry-After": formatdate(time.time() + 1.2, usegmt=True)})
    result = comment.upsert_sticky(client(gh), REPO, 2, "demo", "x")
    gets = [r for r in gh.requests if r.method == "GET"]
    assert result.action == "created" and gets[1].at - gets[0].at >= 0.1


def test_retry_after_is_honoured(gh):
    gh.fail("GET", r"/comments$", 403, headers={"Retry-After": "0.5"},
            body={"message": "You have exceeded a secondary rate limit."})
    result = comment.upsert_sticky(client(gh), REPO, 2, "demo", "x")
    assert result.action == "created"
    gets = [r for r in gh.requests if r.method == "GET"]
    assert gets[1].at - gets[0].at >= 0.5


def test_rate_limit_reset_header_is_honoured_on_429(gh):
    reset = str(int(time.time()))  # already due: waits only the 1 s safety margin
    gh.fail("GET", r"/comments$", 429, headers={"x-ratelimit-remaining": "0", "x-ratelimit-reset": reset},
            body={"message": "API rate limit exceeded"})
    result = comment.upsert_sticky(client(gh), REPO, 2, "demo", "x")
    assert result.action == "created"
    gets = [r for r in gh.requests if r.method == "GET"]
    assert 0.9 <= gets[1].at - gets[0].at < 3


def test_total_wait_is_capped(gh):
    gh.fail("GET", r"/comments$", 429, headers={"Retry-After": "3600"}, body={"message": "slow down"})
    t0 = time.monotonic()
    result = comment.upsert_sticky(client(gh, max_total_wait=2), REPO, 2, "demo", "x")
    assert time.monotonic() - t0 < 1.5
    assert result.action == "failed" and "cap" in result.reason
    assert gh.comment_bodies(2) == []


def test_timeouts_are_retried(gh):
    gh.fail("GET", r"/comments$", delay=1.0)
    result = comment.upsert_sticky(client(gh, read_timeout=0.3), REPO, 2, "demo", "x")
    assert result.action == "created"


def test_a_timed_out_post_that_landed_does_not_duplicate_the_comment(gh):
    # GitHub created the comment but the answer never came back in time.
    gh.fail("POST", r"/comments$", delay=1.0, after=True)
    result = comment.upsert_sticky(client(gh, read_timeout=0.3), REPO, 2, "demo", "once")
    assert result.action == "updated"
    assert len(gh.comment_bodies(2)) == 1


def test_a_post_that_landed_but_answered_502_does_not_duplicate_the_comment(gh):
    gh.fail("POST", r"/comments$", 502, after=True)
    result = comment.upsert_sticky(client(gh), REPO, 2, "demo", "once")
    assert result.action == "updated"
    assert len(gh.comment_bodies(2)) == 1


def test_a_connection_dropped_after_a_post_is_not_blindly_repeated(gh):
    # The server applies the POST, then the connection dies before an answer comes back.
    gh.fail("POST", r"/comments$", after=True, drop=True)
    result = comment.upsert_sticky(client(gh), REPO, 2, "demo", "once")
    assert result.action == "updated"
    assert len(gh.comment_bodies(2)) == 1


def test_tracking_issue_post_that_landed_is_not_opened_twice(gh):
    gh.fail("POST", r"/issues$", 502, after=True)
    opened = comment.track_nightly(client(gh), REPO, "demo", regressed=True, report="R", run_url=None)
    assert opened.action == "opened" and len(gh.issues) == 1


def test_giving_up_is_reported_not_raised(gh):
    gh.fail("GET", r"/comments$", 503, times=10)
    result = comment.upsert_sticky(client(gh, attempts=3), REPO, 2, "demo", "x")
    assert result.action == "failed"
    assert "gave up after 3 attempt(s)" in result.reason and "503" in result.reason
    assert TOKEN not in result.reason


def test_read_only_token_is_recognised_and_not_retried(gh):
    gh.read_only = True
    result = comment.upsert_sticky(client(gh), REPO, 2, "demo", "x")
    assert result.action == "failed" and result.read_only
    assert len([r for r in gh.requests if r.method == "POST"]) == 1


def test_network_error_is_retried_then_reported():
    c = GitHubClient(TOKEN, "http://127.0.0.1:9", retry=RetryPolicy(attempts=2, backoff=0.01, connect_timeout=0.5))
    with pytest.raises(GitHubError, match="gave up after 2 attempt"):
        c.create_status(REPO, "abc", state="success", context="x", description="d", target_url=None)


def test_next_link_parsing():
    header = '<https://api.github.com/x?page=2>; rel="next", <https://api.github.com/x?page=5>; rel="last"'
    assert next_link(header) == "https://api.github.com/x?page=2"
    assert next_link('<https://a/x?page=1>; rel="prev"') is None and next_link(None) is None


def test_retry_policy_from_env():
    p = RetryPolicy.from_env({"GATEKEEPER_HTTP_MAX_WAIT": "5", "GATEKEEPER_HTTP_ATTEMPTS": "0",
                              "GATEKEEPER_HTTP_READ_TIMEOUT": "junk"})
    assert (p.max_total_wait, p.attempts, p.read_timeout) == (5.0, 1, 30.0)
    p = RetryPolicy.from_env({"GATEKEEPER_PUBLISH_DEADLINE": "12", "GATEKEEPER_HTTP_MAX_PAGES": "0",
                              "GATEKEEPER_HTTP_SECONDARY_WAIT": "nan", "GATEKEEPER_HTTP_REQUEST_TIMEOUT": "7"})
    assert (p.publish_deadline, p.max_pages, p.secondary_wait, p.request_timeout) == (12.0, 1, 60.0, 7.0)


# -- statuses and the nightly tracking issue ---------------------------------------------------


def test_commit_status_payload(gh):
    client(gh).create_status(REPO, "a" * 40, state="failure", context="gatekeeper/demo",
                             description="d" * 300, target_url="https://github.com/octo/repo/actions/runs/1")
    (status,) = gh.statuses
    assert status["context"] == "gatekeeper/demo" and status["state"] == "failure"
    assert len(status["description"]) == 140 and status["sha"] == "a" * 40


def test_tracking_issue_opens_comments_and_closes(gh):
    c = client(gh)
    gh.add_issue("unrelated", "no marker", ["gatekeeper"])
    opened = comment.track_nightly(c, REPO, "demo", regressed=True, report="R1", run_url="https://x/runs/1")
    assert opened.action == "opened"
    issue = gh.issues[opened.number]
    assert [lb["name"] for lb in issue["labels"]] == ["gatekeeper"]
    assert comment.tracking_marker("demo") in issue["body"]
    again = comment.track_nightly(c, REPO, "demo", regressed=True, report="R2", run_url=None)
    assert (again.action, again.number) == ("commented", opened.number)
    closed = comment.track_nightly(c, REPO, "demo", regressed=False, report="G", run_url=None)
    assert closed.action == "closed" and issue["state"] == "closed"
    assert gh.comment_bodies(opened.number)[-1].startswith("Green again")
    assert comment.track_nightly(c, REPO, "demo", regressed=False, report="G", run_url=None).action == "none"
    assert len(gh.issues) == 2


# -- runner plumbing -------------------------------------------------------------------------


def parse_outputs(text: str) -> dict[str, str]:
    out, lines, i = {}, text.split("\n"), 0
    while i < len(lines) and lines[i]:
        name, delim = lines[i].split("<<", 1)
        j = lines.index(delim, i + 1)
        out[name] = "\n".join(lines[i + 1: j])
        i = j + 1
    return out


def test_outputs_use_a_random_heredoc_delimiter(tmp_path):
    path = tmp_path / "out"
    hostile = "line1\nghadelimiter_x\nverdict<<EOF\npass\nEOF"
    ci.write_outputs(path, {"verdict": "fail", "comment-url": hostile, "regressions": "2"})
    text = path.read_text()
    assert re.match(r"^verdict<<ghadelimiter_[0-9a-f]{24}\nfail\nghadelimiter_[0-9a-f]{24}\n", text)
    assert parse_outputs(text) == {"verdict": "fail", "comment-url": hostile, "regressions": "2"}


def test_annotations_are_escaped_and_capped_at_ten():
    buf = io.StringIO()
    con = ci.Console(buf)
    n = con.error_annotations([f"task{i}: 50% drop\r\nsecond line" for i in range(25)], title="gate: x,y")
    lines = buf.getvalue().splitlines()
    assert n == 10 and len(lines) == 10
    assert lines[0] == "::error title=gate%3A x%2Cy::task0: 50%25 drop%0D%0Asecond line"
    assert "16 more regression(s)" in lines[-1]


def test_group_disables_workflow_commands_for_untrusted_log():
    buf = io.StringIO()
    con = ci.Console(buf)
    with con.group("eval log") as log:
        log("::set-output name=verdict::pass")
    lines = buf.getvalue().splitlines()
    assert lines[0] == "::group::eval log" and lines[-1] == "::endgroup::"
    token = lines[1].removeprefix("::stop-commands::")
    assert len(token) == 32 and lines[3] == f"::{token}::"


def test_a_full_summary_is_an_error_not_silence(tmp_path):
    path = tmp_path / "summary.md"
    path.write_bytes(b"x" * (ci.SUMMARY_LIMIT - 100))
    with pytest.raises(OSError, match="summary.md: the job summary already holds"):
        ci.append_summary(path, "#### Publishing\n- could not post")
    assert path.stat().st_size == ci.SUMMARY_LIMIT - 100


def test_the_report_leaves_room_for_the_publishing_notes(tmp_path):
    path = tmp_path / "summary.md"
    assert ci.append_summary(path, "r" * 2_000_000, reserve=ci.SUMMARY_RESERVE)
    assert path.stat().st_size <= ci.SUMMARY_LIMIT - ci.SUMMARY_RESERVE
    assert ci.append_summary(path, "#### Publishing\n- could not post the PR comment")
    assert path.read_text().endswith("could not post the PR comment\n") and path.stat().st_size <= ci.SUMMARY_LIMIT


def test_console_lines_are_one_line_and_never_a_command():
    buf = io.StringIO()
    con = ci.Console(buf)
    con.line("PR comment: updated https://x/1\n::set-output name=verdict::pass\r\u2028 ##[add-mask]y")
    con.line("  ::add-mask::z")
    assert buf.getvalue().splitlines() == [
        "PR comment: updated https://x/1\\n::set-output name=verdict::pass\\r\\u2028 #\\x23[add-mask]y",
        "  \\x3a:add-mask::z",
    ]


def test_summary_stays_under_one_mebibyte(tmp_path):
    path = tmp_path / "summary.md"
    path.write_text("# earlier step\n")
    assert ci.append_summary(path, "é" * 2_000_000)
    size = path.stat().st_size
    assert size <= ci.SUMMARY_LIMIT and "summary trimmed" in path.read_text(encoding="utf-8")


# -- events ----------------------------------------------------------------------------------


def pr_payload(head_repo: str | None, base_repo: str = REPO, fork: bool = False) -> dict:
    head = {"sha": "b" * 40, "repo": None if head_repo is None else {"full_name": head_repo, "fork": fork}}
    return {"pull_request": {"number": 12, "head": head, "base": {"sha": "a" * 40, "repo": {"full_name": base_repo}}}}


def test_pr_heads_per_event():
    ev = events.Event("pull_request", pr_payload(REPO), sha="m" * 40)
    assert ev.pr_heads() == [events.PrHead(12, REPO, True)] and ev.pr_number == 12 and ev.head_sha == "b" * 40
    assert events.Event("pull_request", pr_payload("evil/repo", fork=True)).pr_heads()[0].repo == "evil/repo"
    assert events.Event("pull_request_review", pr_payload(None)).pr_heads() == [events.PrHead(12, None, True)]
    # A payload that does not name the head repository: looked up by number.
    assert events.Event("pull_request", {"pull_request": {"number": 3}}).pr_heads() == [events.PrHead(3, None, False)]
    comment_on_pr = {"issue": {"number": 7, "pull_request": {"url": "u"}}}
    assert events.Event("issue_comment", comment_on_pr).pr_heads() == [events.PrHead(7, None, False)]
    assert events.Event("issue_comment", comment_on_pr).pr_number == 7
    assert events.Event("issue_comment", {"issue": {"number": 7}}).pr_heads() == []
    run = {"workflow_run": {"head_repository": {"full_name": "evil/fork"}, "pull_requests": []}}
    assert events.Event("workflow_run", run).pr_heads() == [events.PrHead(None, "evil/fork", True)]
    assert events.Event("workflow_run", {"workflow_run": {"pull_requests": [{"number": 4}]}}).pr_heads() == [
        events.PrHead(4, None, False)]
    check = {"check_run": {"pull_requests": [{"number": 5}, {"number": 6}]}}
    assert [h.number for h in events.Event("check_run", check).pr_heads()] == [5, 6]
    assert events.Event("check_suite", {"check_suite": {"pull_requests": []}}).pr_heads() == [
        events.PrHead(None, None, False)]
    assert events.Event("push", {}).pr_heads() == [] and events.Event("schedule", {}).pr_heads() == []


def test_dispatch_inputs_are_normalised():
    ev = events.Event("workflow_dispatch", {"inputs": {"model": "ckpt/x", "fail_on": "never", "suite": "",
                                                       "promote-on-green": True}})
    assert ev.dispatch_inputs() == {"model": "ckpt/x", "fail-on": "never", "promote-on-green": "true"}
    assert events.Event("push", {"inputs": {"model": "x"}}).dispatch_inputs() == {}


def make_ckpt(root: Path, rel: str) -> None:
    (root / rel).mkdir(parents=True)
    (root / rel / "config.json").write_text("{}")
    (root / rel / "model.safetensors").write_bytes(b"\0" * 16)


def push(*commits: dict) -> events.Event:
    return events.Event("push", {"before": "0" * 40, "after": "c" * 40, "commits": list(commits)})


def test_model_auto_picks_the_pushed_checkpoint(tmp_path):
    make_ckpt(tmp_path, "checkpoints/step-200")
    make_ckpt(tmp_path, "checkpoints/step-100")
    ev = push({"added": ["checkpoints/step-200/model.safetensors", "README.md"], "modified": [], "removed": []},
              {"added": [], "modified": ["checkpoints/step-200/config.json"], "removed": ["checkpoints/old/x"]})
    assert events.resolve_model("auto", ev, tmp_path) == str(tmp_path / "checkpoints/step-200")


def test_model_auto_with_several_or_no_checkpoints_is_an_error(tmp_path):
    make_ckpt(tmp_path, "a")
    make_ckpt(tmp_path, "b")
    ev = push({"added": ["a/config.json", "b/model.safetensors"], "modified": []})
    with pytest.raises(GateError, match="changed 2 checkpoints"):
        events.resolve_model("auto", ev, tmp_path)
    # Choosing one explicitly resolves the ambiguity.
    assert events.resolve_model("b", ev, tmp_path) == str(tmp_path / "b")
    with pytest.raises(GateError, match="changed no checkpoint"):
        events.resolve_model("auto", push({"added": ["docs/x.md"], "modified": []}), tmp_path)
    with pytest.raises(GateError, match="only works for push"):
        events.resolve_model("auto", events.Event("schedule"), tmp_path)


def test_pointer_files(tmp_path):
    make_ckpt(tmp_path, "store/ckpt-7")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints/latest.ckpt-path").write_text(f"# written by training\n{tmp_path / 'store/ckpt-7'}\n")
    ev = push({"added": [], "modified": ["checkpoints/latest.ckpt-path"]})
    assert events.resolve_model("auto", ev, tmp_path) == str(tmp_path / "store/ckpt-7")
    (tmp_path / "current.txt").write_text("store/ckpt-7\n")
    assert events.resolve_model("current.txt", events.Event("schedule"), tmp_path) == str(tmp_path / "store/ckpt-7")
    (tmp_path / "dangling.txt").write_text("/nowhere/ckpt\n")
    with pytest.raises(GateError, match="dangling.txt: the pointer file does not name a checkpoint folder") as err:
        events.resolve_model("dangling.txt", events.Event("schedule"), tmp_path)
    assert "/nowhere" not in str(err.value)  # a pointer's text is never shown
    assert events.resolve_model("gpt2", events.Event("schedule"), tmp_path) == "gpt2"


def test_a_pointer_reaches_outside_the_workspace_only_under_model_roots(tmp_path):
    ws, store = tmp_path / "ws", tmp_path / "store"
    make_ckpt(tmp_path, "store/ckpt-7")
    ws.mkdir()
    (ws / "current.txt").write_text(f"{store / 'ckpt-7'}\n")
    with pytest.raises(GateError, match="outside the workspace and outside every model-roots folder") as err:
        events.resolve_model("current.txt", events.Event("schedule"), ws)
    assert str(store) not in str(err.value)
    assert events.resolve_model("current.txt", events.Event("schedule"), ws, roots=(store,)) == str(store / "ckpt-7")
    (store / "notes").mkdir()  # a folder, but not a checkpoint
    (ws / "notes.txt").write_text(f"{store / 'notes'}\n")
    with pytest.raises(GateError, match="does not name a checkpoint folder"):
        events.resolve_model("notes.txt", events.Event("schedule"), ws, roots=(store,))


SECRET = "hf_runnerSecretToken0123456789"


def test_a_linked_checkpoint_never_prints_a_runner_file(tmp_path):
    """A pull request makes checkpoints/candidate a link to a one-line runner file (the HF token):
    refused on its checkout naming the link, and the file's text is never in any message."""
    home, ws = tmp_path / "home", tmp_path / "ws"
    home.mkdir()
    (home / "token").write_text(SECRET + "\n")
    (ws / "checkpoints").mkdir(parents=True)
    (ws / "checkpoints/candidate").symlink_to(home / "token")
    with pytest.raises(GateError, match="checkpoints/candidate is a symlink that leaves the workspace") as err:
        events.resolve_model("checkpoints/candidate", events.Event("pull_request"), ws, untrusted=True)
    assert SECRET not in str(err.value)
    # Trusted (a maintainer's push), the link is followed, and its text is still never shown.
    with pytest.raises(GateError) as err:
        events.resolve_model("checkpoints/candidate", events.Event("push"), ws)
    assert SECRET not in str(err.value)
    # A linked folder, and a checkpoint holding a link to a runner file, are refused on a PR too.
    make_ckpt(tmp_path, "outside")
    (ws / "checkpoints/candidate").unlink()
    (ws / "checkpoints/candidate").symlink_to(tmp_path / "outside")
    with pytest.raises(GateError, match="checkpoints/candidate is a symlink that leaves"):
        events.resolve_model("checkpoints/candidate", events.Event("pull_request"), ws, untrusted=True)
    (ws / "checkpoints/candidate").unlink()
    make_ckpt(ws, "checkpoints/candidate")
    (ws / "checkpoints/candidate/tokenizer.json").symlink_to(home / "token")
    with pytest.raises(GateError, match="checkpoints/candidate/tokenizer.json is a symlink that leaves"):
        events.resolve_model("checkpoints/candidate", events.Event("pull_request"), ws, untrusted=True)
    # A link that stays inside the workspace is the PR's own business.
    (ws / "checkpoints/candidate/tokenizer.json").unlink()
    (ws / "shared.json").write_text("{}")
    (ws / "checkpoints/candidate/tokenizer.json").symlink_to(ws / "shared.json")
    assert events.resolve_model("checkpoints/candidate", events.Event("pull_request"), ws,
                                untrusted=True) == str(ws / "checkpoints/candidate")


def test_event_paths_outside_the_workspace_are_ignored(tmp_path):
    make_ckpt(tmp_path / "ws", "ok")
    make_ckpt(tmp_path, "outside")
    ev = push({"added": ["../outside/config.json", "/etc/passwd", "ok/config.json"], "modified": []})
    assert events.checkpoints_in_push(ev.payload, tmp_path / "ws") == ["ok"]


def test_load_event_errors_name_the_file(tmp_path):
    bad = tmp_path / "event.json"
    bad.write_text("[1,")
    with pytest.raises(GateError, match="event.json: cannot read the event payload"):
        events.load_event({"GITHUB_EVENT_PATH": str(bad), "GITHUB_EVENT_NAME": "push"})
    bad.write_text(json.dumps({"ref": "x"}))
    assert events.load_event({"GITHUB_EVENT_PATH": str(bad), "GITHUB_EVENT_NAME": "push"}).payload == {"ref": "x"}
