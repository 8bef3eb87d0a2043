"""gatekeeper.action.main() end to end, per trigger, against the strict loopback fake GitHub.

The evaluation side uses ``command: compare`` on baseline files built from synthetic per-item
results (fast, no lm-eval); the real-gate path is covered by the tests marked ``lmeval`` at
the end, which run the demo checkpoints once per session.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from gatekeeper import action
from gatekeeper.baseline import store
from gatekeeper.publish import comment
from gatekeeper.suite.suite import load_suite
from tests.github_server import FakeGitHub
from tests.synthetic import run, series

TOKEN = "ghs_e2eTOKEN9876543210zyxwSECRET"
REPO = "octo/repo"
HEAD = "b" * 40
BASE = "a" * 40
SUITE = """\
name: demo
lm_eval_version: "0.4.13"
policy: {alpha: 0.05, correction: holm, margin: 0.1, resamples: 1000}
tasks:
  - name: arith_mc
"""
N = 200


def _values(drop: int) -> np.ndarray:
    v = (np.arange(N) < 160).astype(float)  # 0.8 accuracy
    v[:drop] = 0.0
    return v


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return make_ws(tmp_path)


def make_ws(tmp_path: Path) -> Path:
    """A workspace: suite file, baseline, and candidate baselines 'harmless', 'regressed', 'many'."""
    (tmp_path / "gatekeeper.yaml").write_text(SUITE)
    suite = load_suite(tmp_path / "gatekeeper.yaml")

    def save(name: str, *s, model: str = "org/model") -> None:
        path = tmp_path / ("runs" if name != "baseline" else ".gatekeeper/baselines") / (
            f"{name}.json.gz" if name != "baseline" else "demo.json.gz")
        path.parent.mkdir(parents=True, exist_ok=True)
        store.save_baseline(run(*s, name=model), path, suite_name="demo", suite_hash=suite.hash)

    save("baseline", series("arith_mc", "acc", _values(0)))
    save("harmless", series("arith_mc", "acc", _values(1)))
    save("regressed", series("arith_mc", "acc", _values(60)),
         model="@octocat #12 <script>alert(1)</script> a|b")
    git(tmp_path, "init", "-q", "-b", "main")
    commit_base(tmp_path)
    return tmp_path


def git(cwd: Path, *args: str) -> str:
    """git in a test repository, with a fixed identity and no user configuration."""
    env = dict(os.environ, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    proc = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def commit(ws: Path, message: str, *paths: str) -> str:
    """Commit ``paths`` (default: the suite and the baselines; never runs/, the job's own files);
    ``-`` commits what is staged."""
    if paths != ("-",):
        git(ws, "add", "-A", "--", *(paths or ("gatekeeper.yaml", ".gatekeeper")))
    git(ws, "commit", "-q", "--allow-empty", "-m", message)
    return git(ws, "rev-parse", "HEAD")


def commit_base(ws: Path, *paths: str) -> str:
    """Commit and mark the commit the pull requests of these tests start from (tag ``base``)."""
    sha = commit(ws, "base", *paths)
    git(ws, "tag", "-f", "base")
    return sha


def base_of(ws: Path) -> str:
    return git(ws, "rev-parse", "base^{commit}")


def event_file(ws: Path, payload: dict) -> str:
    path = ws.parent / "event.json"
    path.write_text(json.dumps(payload))
    return str(path)


def pr_event(head_repo: str = REPO, fork: bool = False) -> dict:
    return {"pull_request": {"number": 12, "head": {"sha": HEAD, "repo": {"full_name": head_repo, "fork": fork}},
                             "base": {"sha": BASE, "repo": {"full_name": REPO}}}}


def on_default_branch(ws: Path, payload: dict) -> tuple[dict, dict]:
    """(payload, env) of an event the runner delivers on the default branch ``main``, checked out
    at its commit: GITHUB_SHA is the workspace's HEAD (as actions/checkout leaves it)."""
    payload = {"repository": {"full_name": REPO, "default_branch": "main"}, **payload}
    env = {"GITHUB_REF": "refs/heads/main"}
    if (ws / ".git").exists():
        env["GITHUB_SHA"] = git(ws, "rev-parse", "HEAD")
    return payload, env


def act(ws: Path, gh: FakeGitHub | None, capfd, event: str, payload: dict, env_over: dict | None = None,
        **inputs: str) -> dict:
    """Run the action; ``BASE`` in the payload stands for the workspace repository's base commit.
    Events other than pull requests run on the default branch, at the workspace's HEAD."""
    if (ws / ".git").exists() and git(ws, "tag", "--list", "base"):
        payload = json.loads(json.dumps(payload).replace(BASE, base_of(ws)))
    branch_env: dict = {}
    if "pull_request" not in payload and event not in ("pull_request", "pull_request_target"):
        payload, branch_env = on_default_branch(ws, payload)
    env = {
        "GITHUB_EVENT_NAME": event, "GITHUB_EVENT_PATH": event_file(ws, payload), "GITHUB_SHA": HEAD,
        "GITHUB_REPOSITORY": REPO, "GITHUB_API_URL": gh.url if gh else "http://127.0.0.1:9",
        "GITHUB_SERVER_URL": "https://github.example", "GITHUB_RUN_ID": "42", "GITHUB_WORKSPACE": str(ws),
        "GITHUB_STEP_SUMMARY": str(ws.parent / "summary.md"), "GITHUB_OUTPUT": str(ws.parent / "output"),
        "RUNNER_ENVIRONMENT": "github-hosted", "INPUT_GITHUB-TOKEN": TOKEN, "INPUT_COMMAND": "compare",
        "GATEKEEPER_HTTP_BACKOFF": "0.01", "GATEKEEPER_HTTP_MAX_WAIT": "1", "GATEKEEPER_HTTP_READ_TIMEOUT": "2",
    }
    keys = {f"INPUT_{name.upper().replace('_', '-')}": value for name, value in inputs.items()}
    for key, value in {**branch_env, **keys, **(env_over or {})}.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    for f in ("summary.md", "output"):
        (ws.parent / f).unlink(missing_ok=True)
    code = action.main(env)
    out, err = capfd.readouterr()
    outputs_text = (ws.parent / "output").read_text()
    return {
        "code": code, "out": out, "err": err, "summary": _read(ws.parent / "summary.md"),
        "outputs": _parse_outputs(outputs_text), "outputs_text": outputs_text,
    }


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _parse_outputs(text: str) -> dict[str, str]:
    found = re.findall(r"^([a-z-]+)<<(ghadelimiter_[0-9a-f]+)\n(.*?)\n\2$", text, flags=re.M | re.S)
    return {name: value for name, _, value in found}


def assert_token_hidden(res: dict) -> None:
    lines = [ln for ln in res["out"].splitlines() if TOKEN in ln]
    assert lines == [f"::add-mask::{TOKEN}"] and res["out"].splitlines()[0] == lines[0]
    assert TOKEN not in res["err"] and TOKEN not in res["summary"] and TOKEN not in res["outputs_text"]


# -- pull_request ----------------------------------------------------------------------------


def test_pull_request_regression_posts_one_sticky_comment_then_edits_it(ws, gh, capfd):
    res = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/regressed.json.gz")
    assert res["code"] == 1
    assert res["outputs"]["verdict"] == "fail" and res["outputs"]["regressions"] == "1"
    (body,) = gh.comment_bodies(12)
    assert body.endswith(comment.sticky_marker("demo")) and "arith\\_mc" in body or "arith_mc" in body
    assert res["outputs"]["comment-url"] == gh.comments[12][0]["html_url"]
    report = ws / res["outputs"]["report-json"]
    assert not Path(res["outputs"]["report-json"]).is_absolute() and json.loads(report.read_text())["verdict"] == "fail"
    assert re.search(r"^::error title=gatekeeper%3A regression::arith_mc/acc,none: ", res["out"], re.M)
    assert f"{base_of(ws)[:7]} → bbbbbbb" in body  # base and head short SHAs
    assert "https://github.example/octo/repo/actions/runs/42" in body
    assert "❌" in res["summary"]
    assert_token_hidden(res)

    again = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/harmless.json.gz")
    assert again["code"] == 0 and again["outputs"]["verdict"] == "pass"
    (body,) = gh.comment_bodies(12)
    assert body.startswith("### ✅")
    assert [r.method for r in gh.writes()] == ["POST", "PATCH"]


def test_untrusted_text_cannot_ping_or_inject(ws, gh, capfd):
    act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/regressed.json.gz")
    (body,) = gh.comment_bodies(12)
    assert "octocat" in body  # it is shown...
    assert not re.search(r"@octocat|#12\b|<script", body)  # ...but cannot ping, link or inject
    row = next(ln for ln in body.splitlines() if ln.startswith("| model"))
    assert row.count("|") - row.count("\\|") == 4  # the model name's pipe does not add a column


def test_a_token_pasted_with_a_trailing_newline_still_works(ws, gh, capfd):
    # Secrets pasted with a newline are common; "Bearer <token>\n" is an invalid header, so
    # every call used to fail (and be retried) with the comment never posted.
    res = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/harmless.json.gz",
              env_over={"INPUT_GITHUB-TOKEN": f"  {TOKEN}\n"})
    assert res["code"] == 0 and len(gh.comment_bodies(12)) == 1
    assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in gh.requests)
    assert_token_hidden(res)


def test_fail_on_never_reports_but_passes(ws, gh, capfd):
    res = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/regressed.json.gz", fail_on="never")
    assert res["code"] == 0 and res["outputs"]["verdict"] == "fail"


def test_comment_never_and_on_regression(ws, gh, capfd):
    act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/harmless.json.gz", comment="never")
    act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/harmless.json.gz", comment="on-regression")
    assert gh.comment_bodies(12) == []
    res = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/regressed.json.gz", comment="on-regression")
    assert len(gh.comment_bodies(12)) == 1 and res["outputs"]["comment-url"]


# -- a pull request cannot choose its own baseline or policy ----------------------------------


def _pr_edits(ws: Path, suite_text: str) -> None:
    """The PR's head: its baseline is the regressed run (so "no change"), and a new suite policy."""
    shutil.copy(ws / "runs/regressed.json.gz", ws / ".gatekeeper/baselines/demo.json.gz")
    (ws / "gatekeeper.yaml").write_text(suite_text)
    commit(ws, "head: edit the baseline and the policy")


LOOSER = {
    "margin": (SUITE.replace("margin: 0.1", "margin: 0.5"),
               ["- default margin: loosened (0.1 → 0.5)", "- arith_mc / none / acc: loosened (margin 0.1 → margin 0.5)"]),
    "ungate": (SUITE + "    metrics:\n      - {metric: acc, gate: false}\n",
               ["- arith_mc / none / acc: no longer gated (informational)"]),
}


@pytest.mark.parametrize("how", sorted(LOOSER))
def test_a_pr_that_edits_its_baseline_and_loosens_the_policy_is_gated_against_the_base(ws, gh, capfd, how):
    suite_text, listed = LOOSER[how]
    _pr_edits(ws, suite_text)
    res = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/regressed.json.gz")
    assert res["code"] == 1 and res["outputs"]["verdict"] == "fail", res["out"]  # the base's baseline and policy
    (body,) = gh.comment_bodies(12)
    plain = body.replace("\\", "")  # markdown escapes off
    assert f"policy from the base commit {base_of(ws)[:7]}" in plain
    assert "This PR edits the baseline .gatekeeper/baselines/demo.json.gz; it is still gated against the base commit's" in plain
    assert "Policy changes in this PR" in plain and all(line in plain.splitlines() for line in listed), plain
    assert body.startswith("### ❌")
    # The PR's own files are untouched, and the base copy did not land in the workspace.
    assert (ws / ".gatekeeper/baselines/demo.json.gz").read_bytes() == (ws / "runs/regressed.json.gz").read_bytes()
    assert git(ws, "status", "--porcelain", "--", "gatekeeper.yaml", ".gatekeeper/baselines") == ""


def test_an_unchanged_pr_is_told_where_its_baseline_came_from_and_nothing_else(ws, gh, capfd):
    res = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/harmless.json.gz")
    assert res["code"] == 0
    (body,) = gh.comment_bodies(12)
    assert f"policy from the base commit {base_of(ws)[:7]}" in body
    assert "edits the baseline" not in body and "Policy changes" not in body


def test_push_still_uses_the_checked_out_baseline(ws, gh, capfd):
    _pr_edits(ws, SUITE.replace("margin: 0.1", "margin: 0.5"))
    res = act(ws, gh, capfd, "push", {"before": BASE, "after": HEAD, "commits": []}, candidate="runs/regressed.json.gz")
    assert res["code"] == 0 and res["outputs"]["verdict"] == "pass"  # its own baseline: nothing changed


def test_shallow_checkout_fetches_the_base_commit(ws, gh, capfd, tmp_path_factory):
    _pr_edits(ws, SUITE.replace("margin: 0.1", "margin: 0.5"))
    clone = tmp_path_factory.mktemp("clone") / "ws"
    git(ws.parent, "clone", "-q", "--depth", "1", f"file://{ws}", str(clone))
    shutil.copytree(ws / "runs", clone / "runs")
    base = base_of(ws)
    assert subprocess.run(["git", "cat-file", "-e", f"{base}^{{commit}}"], cwd=clone).returncode != 0
    payload = json.loads(json.dumps(pr_event()).replace(BASE, base))
    res = act(clone, gh, capfd, "pull_request", payload, candidate="runs/regressed.json.gz")
    assert res["code"] == 1 and "edits the baseline" in gh.comment_bodies(12)[0], res["out"]
    assert git(clone, "cat-file", "-t", base) == "commit"  # fetched


def _one_error_line(res: dict) -> str:
    (line,) = [ln for ln in res["out"].splitlines() if ln.startswith("::error")]
    assert "Traceback" not in res["err"] and res["code"] == 2 and res["outputs"]["verdict"] == "error"
    return line


def test_no_git_repository_is_exit_2_never_the_prs_own_baseline(ws, gh, capfd):
    shutil.rmtree(ws / ".git")
    res = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/harmless.json.gz")
    line = _one_error_line(res)
    assert "not a git repository" in line and "fetch-depth" in line


@pytest.mark.parametrize("sha, says", [("f" * 40, "base commit ffffffffffff is not in the checkout"),
                                       ("main", "is not a full commit id"), ("", "is not a full commit id")])
def test_an_unknown_or_bad_base_sha_is_exit_2(ws, gh, capfd, sha, says):
    payload = pr_event()
    payload["pull_request"]["base"]["sha"] = sha
    res = act(ws, gh, capfd, "pull_request", payload, candidate="runs/harmless.json.gz", comment="always")
    assert says in _one_error_line(res)
    (body,) = gh.comment_bodies(12)
    assert body.startswith("### ⚠️ gatekeeper could not run")


def test_a_pr_that_changes_what_the_suite_measures_is_gated_with_the_base_suite(ws, gh, capfd):
    """The PR's suite is never applied: it is listed, and the base commit's suite decides."""
    (ws / "gatekeeper.yaml").write_text(SUITE.replace("  - name: arith_mc\n", "  - name: arith_mc\n    cluster: topic\n")
                                        + "  - name: extra_task\n")
    commit(ws, "head: a new task, and clusters")
    res = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/regressed.json.gz")
    assert res["code"] == 1, res["out"]  # the base suite: no clusters, no extra task
    plain = gh.comment_bodies(12)[0].replace("\\", "")
    assert "Suite changes in this PR" in plain
    assert "- tasks[arith_mc].cluster: None → 'topic'" in plain.splitlines(), plain
    assert "- tasks[extra_task]: added" in plain.splitlines()


def test_a_pr_that_adds_the_suite_is_exit_2(ws, gh, capfd):
    git(ws, "rm", "-q", "--cached", "gatekeeper.yaml")
    commit_base(ws, "-")
    res = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/harmless.json.gz")
    assert "not in the pull request's base commit" in _one_error_line(res)


@pytest.mark.parametrize("command", ["compare", "gate"])
def test_a_pr_never_bootstraps_its_baseline(ws, gh, capfd, command):
    # The base has no baseline; the PR adds one and asks for bootstrap: both are refused.
    git(ws, "rm", "-q", "--cached", ".gatekeeper/baselines/demo.json.gz")
    commit_base(ws, "-")
    commit(ws, "head: add a baseline")
    res = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/harmless.json.gz", command=command,
              model="checkpoints/none", bootstrap="true", comment="always")
    line = _one_error_line(res)
    assert "no baseline at the pull request's base commit" in line
    assert "(the bootstrap input is ignored on pull requests)" in line
    (body,) = gh.comment_bodies(12)
    assert "never records its own baseline" in body and "bootstrap input is ignored" in body


def test_a_pr_cannot_point_the_baseline_input_at_a_file_it_adds(ws, gh, capfd):
    shutil.copy(ws / "runs/regressed.json.gz", ws / ".gatekeeper/baselines/mine.json.gz")
    commit(ws, "head: my own baseline")
    res = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/regressed.json.gz",
              baseline=".gatekeeper/baselines/mine.json.gz")
    assert "mine.json.gz: no baseline at the pull request's base commit" in _one_error_line(res)


def test_a_pr_cannot_repoint_the_suites_baseline(ws, gh, capfd):
    shutil.copy(ws / "runs/regressed.json.gz", ws / "mine.json.gz")
    (ws / "gatekeeper.yaml").write_text(SUITE.replace("tasks:", "baseline: mine.json.gz\ntasks:"))
    commit(ws, "head: my own baseline", "gatekeeper.yaml", "mine.json.gz")
    res = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/regressed.json.gz")
    assert res["code"] == 1  # gated against .gatekeeper/baselines/demo.json.gz of the base
    assert "moves the suite's baseline file" in gh.comment_bodies(12)[0]


# -- fork safety -----------------------------------------------------------------------------


def test_fork_pr_on_self_hosted_runner_is_refused(ws, gh, capfd):
    res = act(ws, gh, capfd, "pull_request", pr_event("evil/fork", fork=True), candidate="runs/regressed.json.gz",
              env_over={"RUNNER_ENVIRONMENT": None})
    assert res["code"] == 2 and res["outputs"]["verdict"] == "refused"
    assert gh.writes() == []  # nothing ran, so nothing is posted
    assert "refusing to evaluate code from fork evil/fork on a self-hosted runner" in res["out"]
    assert "workflow\\_run" in res["summary"] or "workflow_run" in res["summary"]


@pytest.mark.parametrize("event", ["pull_request_review", "pull_request_review_comment"])
def test_fork_code_from_other_pr_events_is_refused_on_self_hosted(ws, gh, capfd, event):
    # These events also check out the PR's (fork) code; only the event name differs.
    res = act(ws, gh, capfd, event, pr_event("evil/fork", fork=True), candidate="runs/harmless.json.gz",
              env_over={"RUNNER_ENVIRONMENT": "self-hosted"})
    assert res["code"] == 2 and res["outputs"]["verdict"] == "refused"


def test_fork_pr_with_read_only_token_falls_back_to_the_summary(ws, gh, capfd, monkeypatch):
    gh.read_only = True
    res = act(ws, gh, capfd, "pull_request", pr_event("evil/fork", fork=True), candidate="runs/regressed.json.gz")
    assert res["code"] == 1  # GitHub-hosted: the eval ran; the verdict stands
    assert re.search(r"^::warning title=gatekeeper::the token cannot write", res["out"], re.M)
    assert "cannot write" in res["summary"] and "❌" in res["summary"]
    assert gh.comment_bodies(12) == [] and res["outputs"]["comment-url"] == ""


def test_allow_forks_lets_a_self_hosted_runner_evaluate(ws, gh, capfd):
    res = act(ws, gh, capfd, "pull_request", pr_event("evil/fork", fork=True), candidate="runs/harmless.json.gz",
              env_over={"RUNNER_ENVIRONMENT": None}, allow_forks="true")
    assert res["code"] == 0


# -- reliability -----------------------------------------------------------------------------


def test_github_down_does_not_change_the_verdict(ws, gh, capfd):
    gh.fail("GET", r"/comments$", 503, times=50)
    res = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/regressed.json.gz")
    assert res["code"] == 1 and res["outputs"]["verdict"] == "fail"
    assert "could not post the PR comment" in res["out"] and "gave up" in res["summary"]
    assert "503" in res["summary"]


def test_no_github_at_all_still_gates(ws, capfd):
    res = act(ws, None, capfd, "push", {"after": HEAD, "commits": []}, candidate="runs/harmless.json.gz")
    assert res["code"] == 0 and "could not set the commit status" in res["summary"]


def test_bad_input_is_exit_2_with_one_clear_line(ws, gh, capfd):
    res = act(ws, gh, capfd, "pull_request", pr_event(), command="evaluate")
    assert res["code"] == 2 and res["outputs"]["verdict"] == "error"
    assert "::error title=gatekeeper::input command: expected one of gate, run, compare, promote" in res["out"]
    assert "Traceback" not in res["err"]
    res = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/missing")
    assert res["code"] == 2 and "runs/missing" in res["out"]


def test_an_unexpected_crash_is_exit_2_not_a_regression(ws, gh, capfd):
    # A malformed payload (head is not an object) used to escape as a traceback with exit 1,
    # which CI reads as "regression".
    payload = {"pull_request": {"number": 12, "head": "evil", "base": {"sha": BASE}}}
    res = act(ws, gh, capfd, "pull_request", payload, candidate="runs/harmless.json.gz")
    assert res["code"] == 2 and res["outputs"]["verdict"] == "error"
    assert re.search(r"^::error title=gatekeeper::internal error \(AttributeError", res["out"], re.M)
    assert "Traceback" not in res["err"]
    assert_token_hidden(res)


def test_an_unwritable_summary_does_not_change_the_exit_code(ws, gh, capfd):
    res = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/regressed.json.gz",
              env_over={"GITHUB_STEP_SUMMARY": str(ws / "no-such-dir" / "summary.md")})
    assert res["code"] == 1 and res["outputs"]["verdict"] == "fail"
    assert "could not write the job summary" in res["out"]


def test_annotations_are_capped_at_ten(ws, gh, capfd):
    suite_text = SUITE + "".join(f"  - name: t{i:02d}\n" for i in range(14))
    (ws / "gatekeeper.yaml").write_text(suite_text)
    suite = load_suite(ws / "gatekeeper.yaml")
    tasks = ["arith_mc", *[f"t{i:02d}" for i in range(14)]]
    for name, drop in (("demo", 0), ("many", 60)):
        path = ws / (".gatekeeper/baselines/demo.json.gz" if name == "demo" else "runs/many.json.gz")
        store.save_baseline(run(*[series(t, "acc", _values(drop)) for t in tasks]), path,
                            suite_name="demo", suite_hash=suite.hash)
    commit_base(ws)
    res = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/many.json.gz")
    errors = [ln for ln in res["out"].splitlines() if ln.startswith("::error")]
    assert res["code"] == 1 and res["outputs"]["regressions"] == "15"
    assert len(errors) == 10 and "6 more regression(s)" in errors[-1]


# -- push ------------------------------------------------------------------------------------


def test_push_sets_a_status_and_comments_on_the_open_pr(ws, gh, capfd):
    gh.add_pr(31, HEAD, state="closed")
    gh.add_pr(30, HEAD)
    res = act(ws, gh, capfd, "push", {"before": BASE, "after": HEAD, "commits": []},
              candidate="runs/regressed.json.gz")
    assert res["code"] == 1
    (status,) = gh.statuses
    assert (status["sha"], status["state"], status["context"]) == (HEAD, "failure", "gatekeeper/demo")
    assert status["target_url"] == "https://github.example/octo/repo/actions/runs/42"
    assert len(status["description"]) <= 140 and "1 regression" in status["description"]
    assert len(gh.comment_bodies(30)) == 1 and gh.comment_bodies(31) == []


def test_push_without_pr_sets_only_the_status(ws, gh, capfd):
    res = act(ws, gh, capfd, "push", {"after": HEAD, "commits": []}, candidate="runs/harmless.json.gz")
    assert res["code"] == 0 and [s["state"] for s in gh.statuses] == ["success"]
    assert gh.comments == {}


def test_push_error_sets_an_error_status(ws, gh, capfd):
    res = act(ws, gh, capfd, "push", {"after": HEAD, "commits": []}, candidate="runs/nope.json.gz")
    assert res["code"] == 2 and [s["state"] for s in gh.statuses] == ["error"]


# -- schedule --------------------------------------------------------------------------------


def test_nightly_opens_updates_and_closes_the_tracking_issue(ws, gh, capfd):
    res = act(ws, gh, capfd, "schedule", {"schedule": "0 3 * * *"}, candidate="runs/regressed.json.gz")
    assert res["code"] == 1
    (issue,) = gh.issues.values()
    assert issue["state"] == "open" and [lb["name"] for lb in issue["labels"]] == ["gatekeeper"]
    assert res["outputs"]["comment-url"] == issue["html_url"]
    act(ws, gh, capfd, "schedule", {}, candidate="runs/regressed.json.gz")
    assert len(gh.issues) == 1 and gh.comment_bodies(issue["number"])[0].startswith("Still regressed")
    res = act(ws, gh, capfd, "schedule", {}, candidate="runs/harmless.json.gz")
    assert res["code"] == 0 and issue["state"] == "closed" and issue["state_reason"] == "completed"
    assert gh.statuses == []


def test_nightly_comment_url_is_the_tracking_issue_and_action_yml_says_so():
    meta = yaml.safe_load((Path(__file__).resolve().parents[1] / "action.yml").read_text())
    text = meta["outputs"]["comment-url"]["description"]
    assert "tracking issue" in text and "schedule" in text


# -- no readable event file ------------------------------------------------------------------


def test_unreadable_event_file_on_push_keeps_github_sha_for_the_status(ws, gh, capfd):
    gh.add_pr(30, HEAD)
    res = act(ws, gh, capfd, "push", {}, env_over={"GITHUB_EVENT_PATH": str(ws / "missing.json")},
              candidate="runs/harmless.json.gz")
    assert res["code"] == 2 and "GITHUB_EVENT_PATH does not exist" in res["out"]
    assert [(s["sha"], s["state"]) for s in gh.statuses] == [(git(ws, "rev-parse", "HEAD"), "error")]


def test_no_event_file_and_no_sha_skips_the_pull_request_lookup(ws, gh, capfd):
    res = act(ws, gh, capfd, "push", {}, env_over={"GITHUB_EVENT_PATH": str(ws / "missing.json"), "GITHUB_SHA": None},
              candidate="runs/harmless.json.gz")
    assert res["code"] == 2 and gh.statuses == []
    assert not [r for r in gh.requests if "/commits/" in r.path]  # never GET /commits//pulls


# -- workflow_dispatch -----------------------------------------------------------------------


def test_dispatch_inputs_override_the_action_inputs(ws, gh, capfd):
    payload = {"inputs": {"candidate": "runs/regressed.json.gz", "fail-on": "never", "github-token": "stolen"}}
    res = act(ws, gh, capfd, "workflow_dispatch", payload, candidate="runs/harmless.json.gz")
    assert res["code"] == 0 and res["outputs"]["verdict"] == "fail"
    assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in gh.requests)


# -- the real gate on a demo checkpoint (lm-eval in a subprocess, ~25 s on 2 cores) -----------
# One real run only, to keep this module near a minute; the other paths share publish code with
# the compare-based tests above.

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
needs_demo = pytest.mark.skipif(
    not (EXAMPLES / "gatekeeper.yaml").is_file() or importlib.util.find_spec("lm_eval") is None,
    reason="needs examples/ (demo suite and checkpoints) and lm-eval",
)


@pytest.fixture(scope="module")
def demo_ws(tmp_path_factory) -> Path:
    """A workspace holding a copy of examples/ (the baseline file included)."""
    ws, _ = _demo_repo(tmp_path_factory.mktemp("demo"))
    return ws


def act_subprocess(ws: Path, gh: FakeGitHub, event: str, payload: dict, *, extra_env: dict | None = None,
                   **inputs: str) -> dict:
    """``python -m gatekeeper.action`` as the container runs it (torch stays out of pytest).
    Events other than pull requests run on the default branch, at the workspace's HEAD."""
    branch_env: dict = {}
    if "pull_request" not in payload and event not in ("pull_request", "pull_request_target"):
        payload, branch_env = on_default_branch(ws, payload)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INPUT_", "GITHUB_"))}
    env.update({
        "GITHUB_EVENT_NAME": event, "GITHUB_EVENT_PATH": event_file(ws, payload), "GITHUB_SHA": HEAD,
        "GITHUB_REPOSITORY": REPO, "GITHUB_API_URL": gh.url, "GITHUB_SERVER_URL": "https://github.example",
        "GITHUB_RUN_ID": "43", "GITHUB_WORKSPACE": str(ws), "RUNNER_ENVIRONMENT": "self-hosted",
        "GITHUB_STEP_SUMMARY": str(ws.parent / "summary.md"), "GITHUB_OUTPUT": str(ws.parent / "output"),
        "INPUT_GITHUB-TOKEN": TOKEN, "INPUT_SUITE": "examples/gatekeeper.yaml", "GATEKEEPER_HTTP_BACKOFF": "0.01",
    })
    env.update(branch_env)
    env.update(extra_env or {})
    env.update({f"INPUT_{k.upper().replace('_', '-')}": v for k, v in inputs.items()})
    for f in ("summary.md", "output"):
        (ws.parent / f).unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-m", "gatekeeper.action"], cwd=ws, env=env,
                          capture_output=True, text=True, timeout=300)
    return {"code": proc.returncode, "out": proc.stdout, "err": proc.stderr,
            "summary": (ws.parent / "summary.md").read_text(),
            "outputs": _parse_outputs((ws.parent / "output").read_text()),
            "outputs_text": (ws.parent / "output").read_text()}


@pytest.mark.lmeval
@needs_demo
def test_real_gate_push_with_model_auto_blocks_the_regressed_checkpoint(demo_ws, gh):
    gh.add_pr(40, HEAD)
    payload = {"before": BASE, "after": HEAD, "commits": [
        {"added": ["examples/checkpoints/regressed/model.safetensors"], "modified": [], "removed": []},
        {"added": [], "modified": ["examples/checkpoints/regressed/config.json", "README.md"], "removed": []},
    ]}
    res = act_subprocess(demo_ws, gh, "push", payload, command="gate", model="auto", out="out-regressed")
    assert res["code"] == 1, res["err"][-2000:]
    assert res["outputs"]["verdict"] == "fail" and int(res["outputs"]["regressions"]) >= 1
    assert "demo_capitals_mc" in res["out"] and "demo\\_capitals\\_mc" in res["summary"]
    assert re.search(r"^::group::gatekeeper: evaluating regressed on suite demo$", res["out"], re.M)
    (status,) = gh.statuses
    assert (status["state"], status["context"]) == ("failure", "gatekeeper/demo")
    (body,) = gh.comment_bodies(40)
    assert body.startswith("### ❌") and body.endswith(comment.sticky_marker("demo")) and len(body) <= 65_536
    assert (demo_ws / res["outputs"]["report-json"]).is_file()
    assert_token_hidden(res)


@pytest.mark.lmeval
@needs_demo
def test_real_sequential_gate_on_a_pull_request_stops_early(tmp_path, gh):
    """input sequential: the PR's regressed checkpoint fails at an early look, gated against the base
    commit's baseline; the report says where it stopped and how many items it evaluated."""
    ws, base = _demo_repo(tmp_path)
    payload = json.loads(json.dumps(pr_event()).replace(BASE, base))
    res = act_subprocess(ws, gh, "pull_request", payload, command="gate", model="examples/checkpoints/regressed",
                         out="out-seq", sequential="true")
    assert res["code"] == 1 and res["outputs"]["verdict"] == "fail", res["out"][-3000:] + res["err"][-2000:]
    report = json.loads((ws / res["outputs"]["report-json"]).read_text())
    assert report["sequential"]["decision"] == "fail" and report["sequential"]["stopped_at"] <= 2
    assert report["sequential"]["evaluated"] < report["sequential"]["total"]
    (body,) = gh.comment_bodies(12)
    assert "sequential: stopped at look" in body.replace("\\", "")
    bad = act_subprocess(ws, gh, "pull_request", payload, command="gate", model="examples/checkpoints/regressed",
                         out="out-seq2", sequential="sometimes")
    assert bad["code"] == 2 and "input sequential: 'sometimes'" in bad["out"]


@pytest.mark.lmeval
@needs_demo
def test_input_items_informative_reads_the_base_commits_baseline_stage_by_stage(tmp_path, gh):
    """input items: informative gates the PR from the base commit's baseline, stage by stage; the
    demo's committed baseline predates the choice margins, so its right/wrong tasks are read
    uniformly, and said; the regression is caught at the first stage. An input that names neither
    order, or goes with looks, is refused."""
    ws, base = _demo_repo(tmp_path)
    payload = json.loads(json.dumps(pr_event()).replace(BASE, base))
    res = act_subprocess(ws, gh, "pull_request", payload, command="gate", model="examples/checkpoints/regressed",
                         out="out-inf", items="informative")
    assert res["code"] == 1 and res["outputs"]["verdict"] == "fail", res["out"][-3000:] + res["err"][-2000:]
    assert "failed at stage 1 of 5: a drop shown beyond its margin" in res["out"], res["out"][-3000:]
    assert "read uniformly (the baseline kept no choice margins for them): demo_arith_gen, demo_arith_mc, " \
           "demo_capitals_mc" in res["out"], res["out"][-3000:]
    for extra, said in (({"items": "some"}, "input items: 'some'; expected uniform or informative"),
                        ({"items": "informative", "sequential": "true"}, "not with sequential looks")):
        bad = act_subprocess(ws, gh, "pull_request", payload, command="gate", model="examples/checkpoints/regressed",
                             out="out-inf2", **extra)
        assert bad["code"] == 2 and said in bad["out"], bad["out"][-2000:]


def _demo_repo(root: Path, *, with_baseline: bool = True) -> tuple[Path, str]:
    """A workspace repository holding examples/ (checkpoints untracked); returns it and its base commit."""
    ws = root / "ws"
    shutil.copytree(EXAMPLES, ws / "examples", ignore=shutil.ignore_patterns(".gatekeeper-work", "__pycache__"))
    if not with_baseline:
        shutil.rmtree(ws / "examples" / ".gatekeeper")
    git(ws, "init", "-q", "-b", "main")
    tracked = ["examples/gatekeeper.yaml", "examples/tasks"] + (["examples/.gatekeeper"] if with_baseline else [])
    return ws, commit(ws, "base", *tracked)


@pytest.mark.lmeval
@needs_demo
def test_real_gate_pr_is_gated_with_the_base_commits_baseline_and_policy(tmp_path, gh):
    ws, base = _demo_repo(tmp_path)
    suite = ws / "examples/gatekeeper.yaml"
    text = suite.read_text()
    assert "{metric: acc, filter: none, margin: 0.02}" in text
    suite.write_text(text.replace("{metric: acc, filter: none, margin: 0.02}", "{metric: acc, filter: none, margin: 0.5}"))
    (ws / "examples/.gatekeeper/baselines/demo.json.gz").write_bytes(b"not even gzip")  # its own baseline
    commit(ws, "head: loosen the capitals margin past the regression; break the baseline", "examples")
    payload = json.loads(json.dumps(pr_event()).replace(BASE, base))
    res = act_subprocess(ws, gh, "pull_request", payload, command="gate", model="examples/checkpoints/regressed",
                         out="out-pr")
    assert res["code"] == 1, res["out"][-3000:] + res["err"][-2000:]
    (body,) = gh.comment_bodies(12)
    plain = body.replace("\\", "")
    assert f"policy from the base commit {base[:7]}" in plain and "This PR edits the baseline" in plain
    assert "- demo_capitals_mc / none / acc: loosened (margin 0.02 → margin 0.5)" in plain.splitlines()
    assert re.search(r"\| (↳ )?demo_capitals_mc \| acc ↑ .*\| 0\.0200 \| .*regressed", plain)


@pytest.mark.lmeval
@needs_demo
@pytest.mark.parametrize("event", ["workflow_dispatch"])
def test_real_gate_bootstrap_records_the_first_baseline_on_a_maintainers_run(tmp_path, gh, event):
    ws, _ = _demo_repo(tmp_path, with_baseline=False)
    baseline = ws / "examples/.gatekeeper/baselines/demo.json.gz"
    refused = act_subprocess(ws, gh, event, {"inputs": {}}, command="gate", model="examples/checkpoints/base")
    assert refused["code"] == 2 and "no baseline file" in refused["out"] and not baseline.exists()
    res = act_subprocess(ws, gh, event, {"inputs": {"bootstrap": "true"}}, command="gate",
                         model="examples/checkpoints/base", out="out-bootstrap")
    assert res["code"] == 0, res["out"][-3000:] + res["err"][-2000:]
    assert res["outputs"]["verdict"] == "baseline-recorded" and baseline.is_file()
    assert store.load_baseline(baseline).provenance.suite_hash == load_suite(ws / "examples/gatekeeper.yaml").hash


def test_a_corrupt_baseline_at_the_base_is_exit_2_naming_the_committed_file(ws, gh, capfd):
    (ws / ".gatekeeper/baselines/demo.json.gz").write_bytes(b"not gzip")
    commit_base(ws)
    res = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/harmless.json.gz")
    line = _one_error_line(res)
    assert f"::error title=gatekeeper::.gatekeeper/baselines/demo.json.gz at base commit {base_of(ws)[:7]}: " in line
    assert "gatekeeper-base-" not in line  # never the temporary copy's path


def test_a_pull_request_event_without_its_pull_request_object_is_exit_2(ws, gh, capfd):
    res = act(ws, gh, capfd, "pull_request", {"action": "opened"}, candidate="runs/regressed.json.gz")
    assert "without its pull_request object" in _one_error_line(res)


# -- fork policy per event (issue #10 item 4) --------------------------------------------------

SELF_HOSTED = {"RUNNER_ENVIRONMENT": "self-hosted"}


def comment_event(number: int | None = 12) -> dict:
    issue = {"number": number or 5, "title": "t"}
    if number is not None:
        issue["pull_request"] = {"url": f"https://api.github.com/repos/{REPO}/pulls/{number}"}
    return {"action": "created", "issue": issue, "comment": {"body": "/gatekeeper"}}


def check_event(kind: str, numbers: list[int]) -> dict:
    prs = [{"number": n, "id": n, "head": {"sha": HEAD, "repo": {"id": 1, "name": "repo"}}} for n in numbers]
    return {kind: {"head_sha": HEAD, "pull_requests": prs}}


def workflow_run_event(head_repo: str | None) -> dict:
    run = {"head_sha": HEAD, "event": "pull_request", "pull_requests": []}
    if head_repo is not None:
        run["head_repository"] = {"full_name": head_repo}
    return {"workflow_run": run}


def _refused(res: dict) -> str:
    assert res["code"] == 2 and res["outputs"]["verdict"] == "refused", res["out"][-2000:]
    (line,) = [ln for ln in res["out"].splitlines() if ln.startswith("::error")]
    assert "Traceback" not in res["err"]
    return line


@pytest.mark.parametrize("event, payload", [
    ("issue_comment", comment_event()),
    ("check_run", check_event("check_run", [12])),
    ("check_suite", check_event("check_suite", [12])),
])
def test_events_that_name_a_fork_pr_by_number_are_refused_after_a_lookup(ws, gh, capfd, event, payload):
    gh.add_pull(12, "evil/fork", fork=True)
    line = _refused(act(ws, gh, capfd, event, payload, env_over=SELF_HOSTED, command="gate",
                        model="checkpoints/x"))
    assert "refusing to evaluate code from fork evil/fork on a self-hosted runner" in line
    assert (gh.requests[0].method, gh.requests[0].path) == ("GET", f"/repos/{REPO}/pulls/12")
    assert gh.writes() == []


@pytest.mark.parametrize("event, payload", [
    ("issue_comment", comment_event()),
    ("check_run", check_event("check_run", [12])),
    ("check_suite", check_event("check_suite", [12])),
    ("workflow_run", workflow_run_event(REPO)),
])
def test_events_whose_pr_head_is_this_repository_are_evaluated(ws, gh, capfd, event, payload):
    gh.add_pull(12, REPO)
    res = act(ws, gh, capfd, event, payload, env_over=SELF_HOSTED, candidate="runs/harmless.json.gz")
    assert res["code"] == 0 and res["outputs"]["verdict"] == "pass", res["out"][-2000:]


def test_a_deleted_fork_is_refused(ws, gh, capfd):
    line = _refused(act(ws, gh, capfd, "pull_request_review", {"pull_request": {
        "number": 12, "head": {"sha": HEAD, "repo": None}, "base": {"sha": BASE, "repo": {"full_name": REPO}}}},
        env_over=SELF_HOSTED, candidate="runs/harmless.json.gz"))
    assert "(deleted fork)" in line


def test_a_fork_artifact_is_compared_on_workflow_run_but_never_on_pull_request(ws, gh, capfd):
    """The fork split: workflow_run checks out the default branch, so comparing a fork's result
    files there runs no fork code; a pull_request checkout is the fork's code (task functions)."""
    (ws / ".github/workflows").mkdir(parents=True)
    (ws / ".github/workflows/fork-eval.yml").write_text("name: gatekeeper fork eval\n")
    head = commit(ws, "the evaluation workflow", ".github")  # the fork's head holds the same file
    payload = workflow_run_event("evil/fork")
    payload["workflow_run"].update(head_sha=head, path=".github/workflows/fork-eval.yml")
    # Issue #55: the fork's artifact is its own writing: the eval workflow must be named ...
    missing = act(ws, gh, capfd, "workflow_run", payload, env_over=SELF_HOSTED, candidate="runs/harmless.json.gz")
    assert missing["code"] == 2 and "input fork-workflow: required" in missing["out"], missing["out"][-2000:]
    # ... and the report is advisory: shown, never a passing status
    res = act(ws, gh, capfd, "workflow_run", payload, env_over=SELF_HOSTED, candidate="runs/harmless.json.gz",
              fork_workflow=".github/workflows/fork-eval.yml")
    assert res["code"] == 0 and res["outputs"]["verdict"] == "pass", res["out"][-2000:]
    assert "Advisory: this is the fork's own run" in res["summary"] and gh.statuses == []
    pr = {"pull_request": {"number": 12, "head": {"sha": HEAD, "repo": {"full_name": "evil/fork"}},
                           "base": {"sha": BASE, "repo": {"full_name": REPO}}}}
    line = _refused(act(ws, gh, capfd, "pull_request", pr, env_over=SELF_HOSTED, candidate="runs/harmless.json.gz"))
    assert "fork evil/fork" in line


def test_a_fork_workflow_run_is_refused_from_its_payload(ws, gh, capfd):
    line = _refused(act(ws, gh, capfd, "workflow_run", workflow_run_event("evil/fork"), env_over=SELF_HOSTED,
                        command="gate", model="checkpoints/x"))
    assert "fork evil/fork" in line and gh.writes() == []
    assert not [r for r in gh.requests if "/pulls/" in r.path and "/commits/" not in r.path]


@pytest.mark.parametrize("case", ["api down", "no token", "unknown pr", "no number", "no head repository"])
def test_a_pr_head_that_cannot_be_verified_is_refused(ws, gh, capfd, case):
    event, payload, env = "issue_comment", comment_event(), dict(SELF_HOSTED)
    if case == "api down":
        gh.add_pull(12, REPO)
        gh.fail("GET", r"/pulls/12$", 503, times=100)
    elif case == "no token":
        env["INPUT_GITHUB-TOKEN"] = None
    elif case == "no number":  # GitHub lists no PRs in a fork's check suite
        event, payload = "check_suite", check_event("check_suite", [])
    elif case == "no head repository":
        event, payload = "workflow_run", workflow_run_event(None)
    res = act(ws, gh, capfd, event, payload, env_over=env, command="gate", model="checkpoints/x")
    line = _refused(res)
    assert "cannot be verified to be octo/repo" in line
    assert gh.writes() == [] and "refused" in res["summary"]


def test_github_hosted_runners_evaluate_without_a_lookup(ws, gh, capfd):
    res = act(ws, gh, capfd, "issue_comment", comment_event(), candidate="runs/harmless.json.gz")
    assert res["code"] == 0 and not [r for r in gh.requests if "/pulls/" in r.path]


def test_an_issue_comment_on_a_plain_issue_is_not_a_pull_request(ws, gh, capfd):
    res = act(ws, gh, capfd, "issue_comment", comment_event(None), env_over=SELF_HOSTED,
              candidate="runs/harmless.json.gz")
    assert res["code"] == 0 and gh.requests == []


def test_a_same_named_head_in_another_case_is_this_repository(ws, gh, capfd):
    res = act(ws, gh, capfd, "pull_request", pr_event("Octo/Repo"), env_over=SELF_HOSTED,
              candidate="runs/harmless.json.gz")
    assert res["code"] == 0


# -- publishing never costs the verdict (issue #10 items 2, 14) --------------------------------

FAST = {"GATEKEEPER_HTTP_SECONDARY_WAIT": "0.2", "GATEKEEPER_PUBLISH_DEADLINE": "4",
        "GATEKEEPER_HTTP_REQUEST_TIMEOUT": "1", "GATEKEEPER_HTTP_MAX_PAGES": "5",
        "GATEKEEPER_HTTP_READ_TIMEOUT": "0.5"}
SECONDARY = {"message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again."}


def _fault(gh: FakeGitHub, name: str) -> None:
    for i in range(3):
        gh.add_comment(12, f"human {i}")
    if name == "self link":
        gh.pages = "self"
    elif name == "endless pages":
        gh.pages = "endless"
    elif name == "trickle":
        gh.fail("GET", r"/comments$", trickle=0.05, times=100)
    elif name == "secondary limit":
        gh.fail("POST", r"/comments$", 403, body=SECONDARY, times=100)
    elif name == "retry-after nan":
        gh.fail("GET", r"/comments$", 403, headers={"Retry-After": "nan"}, body=SECONDARY, times=100)
    elif name == "502 on post, listing lags":
        gh.listing_lag = 30
        gh.fail("POST", r"/comments$", 502, after=True, times=100)
    elif name == "timeouts":
        gh.fail("POST", r"/comments$", delay=2, after=True, times=100)
    elif name == "dropped":
        gh.fail("POST", r"/comments$", after=True, drop=True, times=100)
    elif name == "down":
        gh.fail("GET", r"/comments$", 503, times=100)


@pytest.mark.parametrize("fault", ["self link", "endless pages", "trickle", "secondary limit", "retry-after nan",
                                   "502 on post, listing lags", "timeouts", "dropped", "down"])
def test_no_api_fault_changes_the_exit_code_or_the_report_or_posts_twice(ws, gh, capfd, fault):
    import time

    _fault(gh, fault)
    t0 = time.monotonic()
    res = act(ws, gh, capfd, "pull_request", pr_event(), env_over=FAST, candidate="runs/regressed.json.gz")
    assert time.monotonic() - t0 < 12
    assert res["code"] == 1 and res["outputs"]["verdict"] == "fail" and res["outputs"]["regressions"] == "1"
    assert json.loads((ws / res["outputs"]["report-json"]).read_text())["verdict"] == "fail"
    assert res["summary"].startswith("### ❌")
    marked = [b for b in gh.comment_bodies(12) if comment.sticky_marker("demo") in b]
    assert len(marked) <= 1  # at most one comment, whatever the API did
    assert marked or "#### Publishing" in res["summary"]  # no comment: the summary says why
    assert "comment-url" in res["outputs"] and "publishing failed unexpectedly" not in res["out"]


def test_the_verdict_is_written_before_github_is_called(ws, gh, capfd):
    import threading
    import time

    _fault(gh, "trickle")  # publishing hangs on a trickled listing until the deadline
    done: dict = {}
    worker = threading.Thread(target=lambda: done.update(res=act(
        ws, gh, capfd, "pull_request", pr_event(), candidate="runs/regressed.json.gz",
        env_over={"GATEKEEPER_PUBLISH_DEADLINE": "3", "GATEKEEPER_HTTP_REQUEST_TIMEOUT": "30"})))
    worker.start()
    summary, output = ws.parent / "summary.md", ws.parent / "output"
    seen_at = None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and seen_at is None:
        if gh.requests and summary.exists() and "verdict<<" in _read(output):
            seen_at = time.monotonic()
        time.sleep(0.05)
    assert seen_at is not None and worker.is_alive()  # written while GitHub still hangs
    assert summary.read_text().startswith("### ❌") and "comment-url" not in _read(output)
    worker.join(15)
    res = done["res"]
    assert res["code"] == 1 and res["outputs"]["comment-url"] == ""
    assert "deadline" in res["summary"] or "no answer" in res["summary"]


def test_an_html_url_from_the_api_cannot_inject_a_command(ws, gh, capfd):
    ours = gh.add_comment(12, "old\n\n" + comment.sticky_marker("demo"), {"login": "github-actions[bot]",
                                                                          "id": 41898282, "type": "Bot"})
    ours["html_url"] = "https://github.com/x\n::set-output name=verdict::pass\r\n##[add-mask]y"
    res = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/regressed.json.gz")
    assert res["code"] == 1
    assert not re.search(r"^\s*::set-output|##\[", res["out"], re.M)
    assert "PR comment: updated https://github.com/x\\n::set-output name=verdict::pass\\r\\n#\\x23[add-mask]y" in res["out"]


def test_the_summary_holds_the_full_report_beyond_the_comment_limit(ws, gh, capfd):
    tasks = [f"task_{i:04d}_{'x' * 40}" for i in range(500)]
    (ws / "gatekeeper.yaml").write_text(SUITE + "".join(f"  - name: {t}\n" for t in tasks))
    suite = load_suite(ws / "gatekeeper.yaml")
    for name, drop in (("demo", 0), ("wide", 60)):
        path = ws / (".gatekeeper/baselines/demo.json.gz" if name == "demo" else "runs/wide.json.gz")
        store.save_baseline(run(*[series(t, "acc", _values(drop)) for t in ["arith_mc", *tasks]]), path,
                            suite_name="demo", suite_hash=suite.hash)
    commit_base(ws)
    res = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/wide.json.gz")
    (body,) = gh.comment_bodies(12)
    assert res["code"] == 1 and len(body) <= 65_536
    assert len(res["summary"].encode()) > 100_000 and res["summary"].count("task\\_") >= 501
    assert body.count("task\\_") < 501  # the comment had to cut what the summary keeps


def test_a_summary_with_no_room_left_is_a_warning(ws, gh, capfd):
    full = ws.parent / "full-summary.md"
    full.write_bytes(b"x" * (1024 * 1024 - 200))  # what earlier writes of this step left
    res = act(ws, gh, capfd, "pull_request", pr_event(), env_over={"GITHUB_STEP_SUMMARY": str(full)},
              candidate="runs/regressed.json.gz")
    assert res["code"] == 1 and res["outputs"]["verdict"] == "fail" and full.stat().st_size == 1024 * 1024 - 200
    assert re.search(r"^::warning title=gatekeeper::could not write the job summary: full-summary\.md: the job "
                     r"summary already holds", res["out"], re.M)
