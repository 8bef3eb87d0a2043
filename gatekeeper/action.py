"""Entrypoint of the gatekeeper Docker action: ``python -m gatekeeper.action``.

Reads ``INPUT_*`` (the runner keeps hyphens: ``INPUT_GITHUB-TOKEN``) and ``GITHUB_*``, refuses
pull-request code it cannot verify on self-hosted runners, runs the gate in-process (no shell
ever sees an input), writes the verdict (annotations, JSON report, job summary, step outputs),
and only then publishes under one deadline: sticky PR comment, commit status, nightly tracking
issue.

Exit codes: 0 pass (or fail-on: never), 1 regression, 2 error or refusal. Publishing never
changes the exit code: if GitHub is down, slow or hostile, the job says so in the log and the
summary and still exits with the gate's code. See docs/action.md.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from gatekeeper import drop_working_folder

    drop_working_folder()  # before any third-party import (see its docstring)

import json  # noqa: E402 - after the working folder is off sys.path when run as a module
import os  # noqa: E402
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from gatekeeper import report
from gatekeeper.baseline import gitbase, trend
from gatekeeper.baseline.prbase import BaseTree, base_tree, pr_base_sha
from gatekeeper.errors import GateError
from gatekeeper.files import atomic_write_bytes
from gatekeeper.gate import (
    baseline_checks,
    compare_paths,
    judge_looks,
    promote_run,
    run_gate,
    run_informative_gate,
    run_sequential_gate,
)
from gatekeeper.publish import ci, comment, events
from gatekeeper.publish.github import GitHubClient, RetryPolicy
from gatekeeper.report import ReportContext, error_json
from gatekeeper.report import trend as trend_report
from gatekeeper.run import complete, runner
from gatekeeper.run.environment import scrub_ci_secrets
from gatekeeper.suite.suite import Suite, load_suite
from gatekeeper.text import escape_untrusted

# The action always gates: its stages are imported up front (torch and lm-eval stay lazy, in
# run/), unlike the CLI, whose --help must not pay for numpy and scipy.

COMMANDS = ("gate", "run", "compare", "promote", "not-evaluated")
# Events whose GITHUB_SHA (the checkout) is the default branch's latest commit, not the PR's code.
DEFAULT_BRANCH_EVENTS = ("workflow_run", "issue_comment", "check_run", "check_suite")
FAIL_ON = ("regression", "never")
# Inputs a workflow_dispatch event may override (never the token: dispatch inputs are public).
DISPATCHABLE = (
    "suite", "model", "baseline", "command", "comment", "fail-on", "candidate",
    "promote-on-green", "out", "revision", "bootstrap", "mlflow-tracking-uri", "sequential", "items",
)
DEFAULTS = {
    "suite": "gatekeeper.yaml",
    "model": "",
    "baseline": "",
    "command": "gate",
    "github-token": "",  # read once by main() and scrubbed from the environment: never held in Inputs
    "comment": "auto",
    "fail-on": "regression",
    "allow-forks": "false",
    "candidate": "",
    "promote-on-green": "false",
    "out": ".gatekeeper-work",
    "revision": "",
    "pr-number": "",
    "bootstrap": "false",
    "mlflow-tracking-uri": "",  # "" = no MLflow logging; a URI (or a folder) logs one run per gate
    "sequential": "",  # "" = the suite's policy.sequential; "false"; "true" (4 looks); or a number of looks
    "items": "",  # "" = the suite's policy.items; "uniform" (every item); "informative" (the likely flips first)
    "reason": "",  # command not-evaluated: why this commit has no verdict (a shard or wave job failed)
    "model-commit": "",  # read the model folder from this commit's git objects, not the working tree
    "model-roots": "",  # folders outside the workspace a pointer file may name (one per line, or commas)
    "advisory": "false",  # the candidate is a run nobody here can vouch for: never a success, own comment
    "fork-workflow": "",  # workflow_run from a fork: the eval workflow's path, checked against the default branch
}
FORK_DOC = "docs/action.md#fork-pull-requests"


@dataclass
class Inputs:
    values: dict[str, str]

    def __getitem__(self, name: str) -> str:
        return self.values.get(name, "")

    def flag(self, name: str) -> bool:
        value = self[name].strip().lower()
        if value in ("true", "yes", "1", "on"):
            return True
        if value in ("false", "no", "0", "off", ""):
            return False
        raise GateError(f"input {name}: expected true or false, got {self[name]!r}")


def read_inputs(env: dict[str, str], event: events.Event) -> Inputs:
    values = dict(DEFAULTS)
    for name in DEFAULTS:
        raw = env.get(f"INPUT_{name.upper()}")
        if raw is None:  # some runners replace hyphens; accept both spellings
            raw = env.get(f"INPUT_{name.upper().replace('-', '_')}")
        if raw is not None and raw.strip() != "":
            values[name] = raw.strip()
    for name, value in event.dispatch_inputs().items():
        if name in DISPATCHABLE:
            values[name] = value.strip()
    inputs = Inputs(values)
    if inputs["command"] not in COMMANDS:
        raise GateError(f"input command: expected one of {', '.join(COMMANDS)}, got {inputs['command']!r}")
    if inputs["comment"] not in comment.COMMENT_MODES:
        raise GateError(
            f"input comment: expected one of {', '.join(comment.COMMENT_MODES)}, got {inputs['comment']!r}"
        )
    if inputs["fail-on"] not in FAIL_ON:
        raise GateError(f"input fail-on: expected one of {', '.join(FAIL_ON)}, got {inputs['fail-on']!r}")
    return inputs


@dataclass
class Evaluation:
    """What the gate (or another command) produced."""

    code: int  # 0 / 1 / 2
    verdict: str  # pass | fail | drift | ran | promoted | error | refused | not-evaluated
    markdown: str  # the report (comment body without the marker)
    headline: str
    outcome: Any = None
    regressions: list[str] = field(default_factory=list)
    report_json: dict[str, Any] | None = None
    run_dir: Path | None = None
    suite: Any = None
    summary: str | None = None  # the job summary's report, when longer than the comment allows
    trusted: bool = False  # evaluated on the trusted default branch's own suite and baseline
    trend_markdown: str = ""  # the history's charts (trusted gates only), for the tracking issue
    advisory: bool = False  # compared a run the fork's own workflow wrote: shown, never a success
    # compare on a sequential gate's waves: the next look ("K/L", "" once decided) and the stopped tasks
    sequential: dict[str, str] | None = None

    @property
    def summary_markdown(self) -> str:
        return self.markdown if self.summary is None else self.summary


@dataclass
class Job:
    env: dict[str, str]
    event: events.Event
    console: ci.Console
    workspace: Path
    repo: str
    run_url: str | None
    notes: list[str] = field(default_factory=list)  # publishing problems, for the summary
    written: list[Path] = field(default_factory=list)  # files and folders this run made in the workspace
    scratch: Path | None = None  # a private folder outside the workspace, removed when the run ends
    measured_at: str | None = None  # the commit whose suite and baseline were used, when not the checkout

    def warn(self, message: str) -> None:
        self.console.annotate("warning", message, title="gatekeeper")
        self.notes.append(message)


def _run_url(env: dict[str, str]) -> str | None:
    server, repo, run_id = env.get("GITHUB_SERVER_URL"), env.get("GITHUB_REPOSITORY"), env.get("GITHUB_RUN_ID")
    if not (server and repo and run_id):
        return None
    return f"{server.rstrip('/')}/{repo}/actions/runs/{run_id}"


def _path(job: Job, value: str) -> Path:
    p = Path(value)
    return p if p.is_absolute() else job.workspace / p


# -- evaluation ------------------------------------------------------------------------------


def fork_refusal(job: Job, inputs: Inputs, client: GitHubClient | None = None) -> str | None:
    """Why this run must not evaluate the PR's code, or None.

    On a self-hosted runner (and always with pull_request_target's write token) every event
    that can run a pull request's code must show that the PR's head is this repository: from
    the payload where it names the head repository, else from ``GET /pulls/{n}``. Whatever
    cannot be verified is refused (fail closed): a checkpoint is code.

    ``compare`` and ``promote`` load no model, but they do run the checked-out suite's task code
    (``!function`` aggregations from its include_path). On events whose checkout is the default
    branch (``DEFAULT_BRANCH_EVENTS``) that code is trusted and the fork's files are data: this is
    how the fork split's report job (``workflow_run``) handles a fork's artifact safely. On
    pull_request events the checkout is the PR's code, so they are refused there too."""
    if inputs.flag("allow-forks"):
        return None
    if inputs["command"] in ("compare", "promote") and job.event.name in DEFAULT_BRANCH_EVENTS:
        return None
    # compare loads no model, and on pull_request_target the suite, tasks and baseline come from
    # the base commit whatever is checked out: the candidate run is data (the trusted fork gate).
    if inputs["command"] == "compare" and job.event.name == "pull_request_target":
        return None
    # The trusted fork gate: the base's workflow reads the head's checkpoint from git objects as
    # data (``model-commit``: plain files, safetensors, no remote code); nothing of the fork runs.
    if inputs["model-commit"] and inputs["command"] in ("run", "gate") and job.event.name == "pull_request_target":
        return None
    runner_env = job.env.get("RUNNER_ENVIRONMENT", "").strip().lower() or "self-hosted"
    if job.event.name == "pull_request_target":
        where = "with a write token (pull_request_target)"
    elif runner_env != "github-hosted":
        where = "on a self-hosted runner"
    else:
        return None
    for head in job.event.pr_heads():
        fork, why = _head_problem(job, head, client)
        if fork:
            return (
                f"refusing to evaluate code from fork {fork} {where}: a checkpoint can run code when "
                f"loaded. Use the pull_request + workflow_run split (see {FORK_DOC}) or set allow-forks: "
                "true if you accept the risk"
            )
        if why:
            return (
                f"refusing to evaluate a pull request's code {where}: the {job.event.name or 'unknown'} "
                f"event's pull request head cannot be verified to be {job.repo or 'this repository'} "
                f"({why}), and a fork's checkpoint can run code when loaded. Give the action a "
                "github-token that can read pull requests, run on a GitHub-hosted runner, or set "
                f"allow-forks: true if you accept the risk (see {FORK_DOC})"
            )
    return None


def _head_problem(job: Job, head: events.PrHead, client: GitHubClient | None) -> tuple[str, str]:
    """(fork name, "") when the head is another repository, ("", why) when that cannot be
    told, ("", "") when it is verified to be this repository."""
    if not job.repo:
        return "", "GITHUB_REPOSITORY is not set"
    if not head.known:
        if head.number is None:
            return "", "the event names no pull request number to look up"
        if client is None:
            return "", f"no github-token to look up pull request #{head.number}"
        try:
            client.start_deadline()
            head = events.head_of(client.get_pull(job.repo, head.number))
        except Exception as err:  # noqa: BLE001 - any failure to verify is a refusal
            return "", f"looking up pull request #{head.number} failed: {err}"
        if not head.known:
            return "", f"GitHub's answer for pull request #{head.number} names no head repository"
    if head.repo is None:
        return "(deleted fork)", ""
    if head.repo.lower() != job.repo.lower():
        return head.repo, ""
    return "", ""


def _report_ctx(job: Job, suite_name: str | None) -> ReportContext:
    # The baseline's commit only when it came from a base commit: a push's `before` is not where
    # the checked-out baseline was recorded, so "(before → after)" would mislead.
    base = job.measured_at
    return ReportContext(
        suite=suite_name,
        baseline_ref=base[:7] if base else None,
        candidate_ref=(job.event.head_sha or "")[:7] or None,
        run_url=job.run_url,
    )


def _from_outcome(job: Job, outcome, suite, run_dir: Path | None, report_json: dict | None) -> Evaluation:
    ctx = _report_ctx(job, suite.name if suite else outcome.suite)
    regressions = [
        f"{c.key}: {report.fmt_num(c.test.baseline)} → {report.fmt_num(c.test.candidate)} "
        f"(Δ {c.test.delta:+.4g}, margin {c.margin:g}, adjusted p {report.fmt_p(c.p_adjusted)})"
        for c in outcome.failures
    ] + [
        f"{c.key}: {report.fmt_num(c.test.baseline)} at the anchor → {report.fmt_num(c.test.candidate)} "
        f"(Δ {c.test.delta:+.4g} since the anchor, margin {c.margin:g}, adjusted p {report.fmt_p(c.p_adjusted)})"
        for c in (outcome.drifted if outcome.verdict == "drift" else [])
    ]
    return Evaluation(
        code=outcome.exit_code,
        verdict=outcome.verdict,
        markdown=report.render_markdown(outcome, ctx),
        headline=report.headline(outcome, ctx),
        # The job summary may hold 1 MiB, not the comment's 60k: render it again at its own size.
        summary=report.render_markdown(outcome, ctx, max_chars=ci.SUMMARY_CHARS),
        outcome=outcome,
        regressions=regressions,
        report_json=report_json if report_json is not None else report.to_json(outcome),
        run_dir=run_dir,
        suite=suite,
    )


# -- which checkout may define the measurement ---------------------------------------------


@dataclass(frozen=True)
class Checkout:
    """Whether the checked-out tree is the trusted default branch. When it is not, ``base`` is
    the commit whose suite, tasks and baseline define the measurement (the checkout supplies the
    model only) and ``why`` names the run in messages."""

    trusted: bool
    base: str | None = None
    why: str = ""


# Events whose checkout is the default branch by GitHub's design (GITHUB_SHA: its latest commit).
DEFAULT_BRANCH_BY_DESIGN = ("schedule", "workflow_run", "issue_comment", "check_run", "check_suite")


def decide_checkout(job: Job) -> Checkout:
    """Trusted only when the event runs on the default branch **and** the working tree is
    checked out at the event's commit (``HEAD == GITHUB_SHA``): a workflow may check out
    anything, so the event alone proves nothing. Pull requests are gated against their base
    commit; anything else that is not trusted (a push to another branch, a comment run that
    checked out a PR's head) against its merge-base with the default branch."""
    ev = job.event
    if ev.name in events.PR_EVENTS or "pull_request" in ev.payload:
        if ev.pull_request is None:  # never fall back to the PR's own files
            raise GateError(f"event: a {ev.name} event without its pull_request object; cannot tell "
                            "the base commit to gate against")
        return Checkout(False, pr_base_sha(ev.pull_request), "pull request")
    repo = gitbase.find_repo(job.workspace)
    head = gitbase.head_commit(repo)
    sha = gitbase.check_sha(job.env.get("GITHUB_SHA", ""), "GITHUB_SHA")
    if ev.name in DEFAULT_BRANCH_BY_DESIGN:
        if head == sha:
            return Checkout(True)
        return Checkout(False, gitbase.merge_base(repo, head, sha), f"checkout of {head[:7]}")
    default = ev.default_branch
    if not default:
        raise GateError(f"event: the {ev.name or 'unknown'} event's payload names no repository.default_branch, "
                        "so gatekeeper cannot tell whether this checkout is the trusted default branch")
    ref = job.env.get("GITHUB_REF", "")
    if ref == f"refs/heads/{default}" and head == sha:
        return Checkout(True)
    branch = ref.removeprefix("refs/heads/") or head[:7]
    base = gitbase.merge_base(repo, head, gitbase.branch_commit(repo, default))
    return Checkout(False, base, f"push to branch {branch}" if ev.name == "push" else f"{ev.name} on {branch}")


# -- a fork's own run (the fork split's report job) -----------------------------------------


ADVISORY_NOTE = (
    "**Advisory: this is the fork's own run, not a verdict of this repository.** The pull request's "
    "workflow ran the evaluation and uploaded what it liked, so this report is shown, never a passing "
    f"check; the required check is the trusted fork gate ({FORK_DOC})."
)


def _fork_run(job: Job) -> bool:
    """workflow_run triggered by a run of a fork's head (or one whose head cannot be told): its
    artifacts were written by code the fork controls."""
    if job.event.name != "workflow_run":
        return False
    heads = job.event.pr_heads()
    return not heads or any(not h.known or (h.repo or "").lower() != job.repo.lower() or not job.repo
                            for h in heads)


def check_fork_workflow(job: Job, inputs: Inputs) -> None:
    """Refuse a fork's artifact unless it came from the ``fork-workflow`` file, unchanged from the
    default branch's copy at the fork's head: a fork can add a workflow of the same name, or edit
    the evaluation workflow, and upload any artifact from it."""
    expected = inputs["fork-workflow"].strip().removeprefix("./")
    if not expected:
        raise GateError("input fork-workflow: required to compare a fork's workflow_run artifact: the path of the "
                        f"evaluation workflow (e.g. .github/workflows/fork-eval.yml), see {FORK_DOC}")
    run = job.event.payload.get("workflow_run")
    run = run if isinstance(run, dict) else {}
    path = str(run.get("path") or "").split("@", 1)[0]
    if path != expected:
        raise GateError(f"workflow_run: the run came from {path or 'an unnamed workflow file'}, not {expected}: "
                        "its artifact was not written by the evaluation workflow; refusing it")
    sha = gitbase.check_sha(str(run.get("head_sha") or ""), "event workflow_run.head_sha")
    repo = gitbase.find_repo(job.workspace)
    ours = gitbase.read_at(repo, gitbase.head_commit(repo), expected)
    if ours is None:
        raise GateError(f"{expected}: not in the default branch's checkout (input fork-workflow)")
    if gitbase.read_at(repo, sha, expected) != ours:
        raise GateError(f"{expected}: the fork's copy at {sha[:7]} differs from the default branch's, so its run "
                        "was the fork's own workflow and its artifact is refused (rebase the fork on the default branch)")


def _as_advisory(ev: Evaluation) -> Evaluation:
    ev.advisory = True
    ev.headline = f"advisory (the fork's own run): {ev.headline}"
    ev.markdown = _under_headline(ev.markdown, [ADVISORY_NOTE])
    if ev.summary is not None:
        ev.summary = _under_headline(ev.summary, [ADVISORY_NOTE])
    return ev


def _with_notes(ev: Evaluation, tree: BaseTree | None) -> Evaluation:
    """The report with the base-commit notes under its headline, where a reviewer reads them."""
    if tree is None or not tree.notes:
        return ev
    ev.markdown = _under_headline(ev.markdown, tree.notes)
    if ev.summary is not None:
        ev.summary = _under_headline(ev.summary, tree.notes)
    return ev


def _under_headline(markdown: str, notes: list[str]) -> str:
    head, sep, rest = markdown.partition("\n\n")
    return head + "\n\n" + "\n\n".join(notes) + (sep + rest if sep else "")


def evaluate(job: Job, inputs: Inputs) -> Evaluation:
    fork_run = inputs["command"] == "compare" and _fork_run(job)
    if not (fork_run or inputs.flag("advisory")):
        return _evaluate_checkout(job, inputs)
    # Advisory: even its errors go to its own comment, never over the trusted verdict's.
    try:
        if fork_run:
            check_fork_workflow(job, inputs)
        ev = _evaluate_checkout(job, inputs)
    except GateError as err:
        ev = error_evaluation(str(err))
    return _as_advisory(ev)


def _evaluate_checkout(job: Job, inputs: Inputs) -> Evaluation:
    checkout = decide_checkout(job)
    if checkout.trusted:
        ev = _evaluate(job, inputs, load_suite(_path(job, inputs["suite"])), None)
        ev.trusted = True
        return ev
    if inputs["command"] == "promote":
        raise GateError(f"command promote: a {checkout.why} never writes the baseline; promote on the default "
                        "branch (a push, schedule or workflow_dispatch run of its latest commit)")
    job.measured_at = checkout.base
    with base_tree(job.workspace, checkout.base, inputs["suite"], baseline_input=inputs["baseline"] or None,
                   bootstrap=inputs.flag("bootstrap"), why=checkout.why,
                   need_baseline=inputs["command"] not in ("run", "not-evaluated")) as tree:
        return _with_notes(_evaluate(job, inputs, tree.suite, tree), tree)


def _evaluate(job: Job, inputs: Inputs, suite: Suite, base: BaseTree | None) -> Evaluation:
    """``base``: the base commit's measurement when the checkout is not trusted, else None."""
    command = inputs["command"]
    # One fresh folder per run: a self-hosted runner reuses its workspace, and the runner
    # refuses to write over an earlier run's files.
    out = _path(job, inputs["out"] or DEFAULTS["out"]) / _run_folder(job)
    job.written.append(out.parent)
    if command == "promote":
        if not inputs["candidate"]:
            raise GateError("command promote: set the candidate input to the run directory to promote")
        run_dir = _path(job, inputs["candidate"])
        written = promote_run(run_dir, suite, log=job.warn)
        job.written.append(written.parent)
        text = f"Promoted {run_dir.name} as the new baseline of suite {suite.name}: {written}"
        return Evaluation(0, "promoted", _notice_md(text), text, run_dir=run_dir, suite=suite)
    if command == "compare":
        return _compare(job, inputs, suite, base)
    if command == "not-evaluated":
        return not_evaluated(job, inputs["reason"], suite)
    if not inputs["model"]:
        raise GateError(f"input model: required for command {command} (a checkpoint dir, hub id, pointer file, or auto)")
    model = _model(job, inputs, suite, untrusted=base is not None)
    with job.console.group(f"gatekeeper: evaluating {Path(model).name} on suite {suite.name}") as log:
        if command == "run":
            lock, items_check = baseline_checks(base.baseline if base is not None else suite.baseline_path, suite)
            run_dir = runner.run_suite(suite, model, out, revision=inputs["revision"] or None, log=log, lock=lock,
                                       items_check=items_check)
            text = f"Evaluated suite {suite.name}; run written to {run_dir}"
            return Evaluation(0, "ran", _notice_md(text), text, run_dir=run_dir, suite=suite)
        baseline = _path(job, inputs["baseline"]) if inputs["baseline"] else None
        # Recording a first baseline is a maintainer's explicit choice, never a pull request's.
        bootstrap = inputs.flag("bootstrap") and job.event.pr_number is None and base is None
        looks = _sequential_looks(inputs["sequential"], suite)
        recording = bootstrap and not (base.baseline if base else baseline or suite.baseline_path).exists()
        if not recording and _items_input(inputs["items"], suite, looks) == "informative":
            result = run_informative_gate(
                suite.path, model, out_dir=out, baseline=base.baseline if base else baseline,
                policy=base.policy if base else None, revision=inputs["revision"] or None, log=log,
            )
        elif looks and not recording:
            result = run_sequential_gate(
                suite.path, model, out_dir=out, looks=looks, baseline=base.baseline if base else baseline,
                policy=base.policy if base else None, revision=inputs["revision"] or None, log=log,
            )
        else:
            result = run_gate(
                suite.path, model, out_dir=out, baseline=base.baseline if base else baseline,
                policy=base.policy if base else None, record_missing=bootstrap,
                revision=inputs["revision"] or None, log=log,
                # The history is the default branch's: a trusted checkout appends (a later step commits it).
                history=base is None, commit=job.event.head_sha or job.env.get("GITHUB_SHA") or None,
            )
    if result.outcome is None:
        job.written.append((base.baseline if base else baseline or suite.baseline_path).parent)
        notice = result.notice or "No baseline yet."
        return Evaluation(0, "baseline-recorded", _notice_md(notice), notice, report_json=result.report_json,
                          run_dir=result.run_dir, suite=suite)
    ev = _from_outcome(job, result.outcome, suite, result.run_dir, result.report_json)
    _with_trend(ev, result.trend or _history(base.baseline if base is not None and base.baseline else None))
    if result.trend:
        written = trend.trend_path(baseline or suite.baseline_path)
        job.written.append(written.parent)
        chart = trend_report.markdown(result.trend)
        if chart and ev.summary is not None:  # the job summary holds 1 MiB; the chart a few KB per metric
            ev.summary += "\n\n" + chart
        ev.trend_markdown = chart
    return ev


def _model(job: Job, inputs: Inputs, suite: Suite, *, untrusted: bool) -> str:
    """The checkpoint to evaluate. With ``model-commit`` the model folder is read from that
    commit's git objects into a private folder outside the workspace (a pull request's head,
    fetched as data by the trusted fork gate); else from the working tree, where an untrusted
    checkout's symlinks leaving the workspace are refused, and a pointer file may name only a
    checkpoint folder in the workspace or under ``model-roots``."""
    if inputs["model-commit"]:
        sha = gitbase.check_sha(inputs["model-commit"].lower(), "input model-commit")
        repo = gitbase.find_repo(job.workspace)
        rel = gitbase.repo_relative(repo, _path(job, inputs["model"]))
        if job.scratch is None:
            raise GateError("input model-commit: no private folder to write the checkpoint to")
        folder = gitbase.export_folder(repo, sha, rel, job.scratch / "model" / PurePosixPath(rel).name)
        _data_only(folder, rel, sha, suite)
        job.console.line(f"model: {rel} read from commit {sha[:12]}'s git objects (the working tree is not read)")
        return str(folder)
    roots = tuple(Path(r.strip()) for r in inputs["model-roots"].replace(",", "\n").splitlines() if r.strip())
    relative = [str(r) for r in roots if not r.is_absolute()]
    if relative:
        raise GateError(f"input model-roots: {relative[0]} is not an absolute path (folders on the runner, "
                        "outside the workspace)")
    return events.resolve_model(inputs["model"], job.event, job.workspace, untrusted=untrusted, roots=roots)


# What a checkpoint read from a pull request's head may hold: weights that are data, never a
# pickle (*.bin, *.pt, *.pth, *.pkl and *.ckpt run code when loaded) or code of its own.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def _data_only(folder: Path, rel: str, sha: str, suite: Suite) -> None:
    if suite.model.get("trust_remote_code"):
        raise GateError(f"input model-commit: the suite sets model.trust_remote_code, so {rel} at {sha[:12]} "
                        "would run its own code; a pull request's checkpoint is evaluated as data only")
    for path in sorted(folder.rglob("*")):
        if path.suffix in PICKLE_SUFFIXES or path.suffix == ".py":
            raise GateError(f"{rel}/{path.relative_to(folder).as_posix()}: at commit {sha[:12]} a pull request's "
                            "checkpoint holds code or a pickle; model-commit evaluates safetensors weights only")


def _history(baseline: Path | None) -> list[Any]:
    """The base commit's history (a pull request never writes one), [] when there is none or it
    cannot be read (the gate's own append reports that)."""
    if baseline is None:
        return []
    try:
        return trend.read_trend(baseline)[0]
    except GateError:
        return []


def _with_trend(ev: Evaluation, entries: list[Any]) -> None:
    """The comment carries each gated metric's trend when there is a history (a sparkline table)."""
    table = trend_report.compact(entries, [str(c.key) for c in ev.outcome.comparisons if c.gated]) if entries else ""
    if table:
        ev.markdown += "\n\n" + table
        if ev.summary is not None:
            ev.summary += "\n\n" + table


def _sequential_looks(value: str, suite: Suite) -> int | None:
    """The input ``sequential``: "" follows the suite's policy.sequential; "false" is off; "true"
    is 4 looks (or the suite's number); a number is that many looks (2 to 10)."""
    value = value.strip().lower()
    if value == "":
        return suite.policy.sequential_looks
    if value == "false":
        return None
    if value == "true":
        return suite.policy.sequential_looks or 4
    if value.isdigit() and 2 <= int(value) <= 10:
        return int(value)
    raise GateError(f"input sequential: {value!r}; expected true, false, or a number of looks from 2 to 10")


def _items_input(value: str, suite: Suite, looks: int | None) -> str:
    """The input ``items``: "" follows the suite's policy.items (uniform where the input
    ``sequential`` asks for looks); "uniform" or "informative", which looks cannot go with."""
    value = value.strip().lower()
    if value == "":
        return "uniform" if looks else suite.policy.items
    if value not in ("uniform", "informative"):
        raise GateError(f"input items: {value!r}; expected uniform or informative")
    if value == "informative" and looks:
        raise GateError("input items: informative reads its own stages and tests once; not with sequential looks "
                        "(input sequential or the suite's policy.sequential)")
    return value


def _run_folder(job: Job) -> str:
    run_id = job.env.get("GITHUB_RUN_ID")
    attempt = job.env.get("GITHUB_RUN_ATTEMPT", "1")
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return f"run-{run_id}-{attempt}-{stamp}" if run_id else f"run-{stamp}-{os.getpid()}"


def _notice_md(text: str) -> str:
    return f"### ✅ {escape_untrusted(text, 1000)}"


def _compare(job: Job, inputs: Inputs, suite: Suite, base: BaseTree | None) -> Evaluation:
    if not inputs["candidate"]:
        raise GateError("command compare: set the candidate input (a run directory or results file)")
    if base is not None:
        base_path = base.baseline
    else:
        base_path = _path(job, inputs["baseline"]) if inputs["baseline"] else suite.baseline_path
    candidate_path = _path(job, inputs["candidate"])
    policy = base.policy if base is not None else suite.policy
    if _holds_looks(candidate_path):  # a sharded workflow's waves of a sequential gate
        return _judge(job, suite, base_path, candidate_path, policy)
    # The one path shared with `gate` and `compare --suite`: both runs must belong to the suite.
    outcome = compare_paths(base_path, candidate_path, suite, policy)
    return _from_outcome(job, outcome, suite, candidate_path, None)


def _holds_looks(path: Path) -> bool:
    if not path.is_dir():
        return False
    try:
        return bool(complete.look_folders(path))
    except GateError:
        return False


def _judge(job: Job, suite: Suite, base_path: Path, folder: Path, policy: Any) -> Evaluation:
    """``compare`` on the waves of a sequential gate (``run --look K/L``): the verdict once they
    decide; else ``continue``, with the next look and the stopped tasks as outputs."""
    with job.console.group(f"gatekeeper: judging the looks in {folder.name}") as log:
        result = judge_looks(suite.path, folder, baseline=base_path, policy=policy, log=log)
    info = result.report_json["sequential"]
    nxt = info.get("next")
    if nxt is None:
        ev = _from_outcome(job, result.outcome, suite, None, result.report_json)
        ev.sequential = {"next": "", "done": ""}
        return ev
    text = escape_untrusted(info["summary"], 1000)
    report_json = {**result.report_json, "verdict": "continue"}
    ev = Evaluation(0, "continue", f"### ⏳ gatekeeper {suite.name}: {text}", info["summary"], report_json=report_json,
                    suite=suite)
    ev.sequential = {"next": f"{nxt['look']}/{nxt['of']}", "done": ",".join(nxt["done"])}
    return ev


def not_evaluated(job: Job, reason: str, suite: Suite) -> Evaluation:
    """A multi-runner workflow whose evaluation jobs failed: no judge ran, so the sticky comment
    (and the job summary) must say that this commit has no verdict, never keep an earlier
    commit's. Exit 2: the required job fails, and not as a regression."""
    plain = " ".join((reason or "an evaluation job did not finish").split())[:300]
    reason = escape_untrusted(plain, 300)  # the comment's markdown; the one-line headline stays plain text
    sha = job.event.head_sha or job.env.get("GITHUB_SHA", "")
    commit = f" for commit `{sha[:7]}`" if sha else ""
    link = f" ([the run]({job.run_url}))" if job.run_url else ""
    headline = f"gatekeeper {suite.name}: not evaluated{commit.replace('`', '')}: {plain}"
    body = (f"### ⚠️ gatekeeper {suite.name}: not evaluated{commit}\n\n"
            f"{reason}{link}. No verdict was reached for this commit: an earlier verdict no longer applies. "
            "Re-run the failed jobs to gate it.")
    return Evaluation(2, "not-evaluated", body, headline, suite=suite)


def error_evaluation(message: str, verdict: str = "error") -> Evaluation:
    lines = [escape_untrusted(ln, 500) for ln in message.splitlines()[:30] if ln.strip()]
    title = "gatekeeper refused to run" if verdict == "refused" else "gatekeeper could not run"
    body = f"### ⚠️ {title}\n\n" + "\n".join(f"- {ln}" for ln in lines)
    return Evaluation(2, verdict, body, message or title)


# -- publishing ------------------------------------------------------------------------------


def _suite_name(ev: Evaluation, inputs: Inputs) -> str:
    if ev.suite is not None:
        return ev.suite.name
    return Path(inputs["suite"]).stem or "default"


def _target_pr(job: Job, client: GitHubClient, inputs: Inputs) -> int | None:
    if inputs["pr-number"].isdigit():
        return int(inputs["pr-number"])
    if job.event.pr_number is not None:
        return job.event.pr_number
    if job.event.name in ("push", "workflow_run"):
        sha = job.event.head_sha
        if not sha:  # no event file and no GITHUB_SHA: `/commits//pulls` is not a request to make
            return None
        try:
            pulls = client.pulls_for_commit(job.repo, sha)
        except Exception as err:  # noqa: BLE001 - publishing must never decide the verdict
            job.warn(f"could not look up the pull request of {sha[:7]}: {err}")
            return None
        open_prs = [p for p in pulls if p.get("state") == "open"]
        return int(open_prs[0]["number"]) if open_prs else None
    return None


def publish(job: Job, inputs: Inputs, ev: Evaluation, client: GitHubClient | None) -> str:
    """Comment / status / tracking issue; returns the comment URL (or ""). Never raises."""
    if client is None:
        if inputs["comment"] != "never" or job.event.name in ("push", "schedule"):
            why = "GITHUB_REPOSITORY is not set" if not job.repo else "no github-token given"
            job.warn(f"{why}: the report is only in the job summary")
        return ""
    suite = _suite_name(ev, inputs)
    url = ""
    # A commit status where no job of the PR's own workflow carries the verdict: a push, and the
    # trusted fork gate (pull_request_target); never for a fork's own run (advisory).
    if job.event.name in ("push", "pull_request_target") and job.event.head_sha and not ev.advisory:
        _status(job, client, suite, ev)
    if job.event.name == "schedule" and ev.verdict in ("pass", "fail", "drift"):
        report_md = ev.markdown + ("\n\n" + ev.trend_markdown if ev.trend_markdown else "")
        tracked = comment.track_nightly(
            client, job.repo, suite, regressed=ev.code == 1 or ev.verdict in ("fail", "drift"),
            report=report_md, run_url=job.run_url, drift=ev.verdict == "drift",
        )
        if tracked.action == "failed":
            job.warn(f"could not update the nightly tracking issue: {tracked.reason}")
        else:
            job.console.line(f"tracking issue: {tracked.action} {tracked.url or ''}".rstrip())
            url = tracked.url or ""
    if inputs["comment"] == "never" or job.event.name == "schedule":
        return url
    number = _target_pr(job, client, inputs)
    if number is None:
        return url
    # The advisory report has a comment of its own: it never replaces the trusted verdict's.
    result = comment.upsert_sticky(
        client, job.repo, number, f"{suite} (advisory)" if ev.advisory else suite, ev.markdown, mode=inputs["comment"],
        regressed=ev.verdict == "fail", has_outcome=ev.verdict in ("pass", "fail", "baseline-recorded"),
        author=job.env.get("GATEKEEPER_COMMENT_AUTHOR", "").strip() or None,
    )
    if result.action == "failed":
        if result.read_only:
            job.warn(
                "the token cannot write to this repository (pull requests from forks get a read-only "
                f"GITHUB_TOKEN); the report is in the job summary. See {FORK_DOC}"
            )
        else:
            job.warn(f"could not post the PR comment: {result.reason}. The verdict stands.")
        return url
    job.console.line(f"PR comment: {result.action} {result.url or ''}".rstrip())
    return result.url or url


def _status(job: Job, client: GitHubClient, suite: str, ev: Evaluation) -> None:
    state = {0: "success", 1: "failure"}.get(ev.code, "error")
    if ev.verdict == "continue":
        state = "pending"  # a sequential gate's next wave decides
    if ev.verdict == "fail":
        state = "failure"  # the status reports the verdict even when fail-on: never
    try:
        client.create_status(
            job.repo, job.event.head_sha, state=state, context=f"gatekeeper/{suite}",
            description=_one_line(ev.headline, 140), target_url=job.run_url,
        )
    except Exception as err:  # noqa: BLE001 - publishing must never decide the verdict
        job.warn(f"could not set the commit status gatekeeper/{suite}: {err}")


def _one_line(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- main --------------------------------------------------------------------------------------


def _write_report_json(job: Job, ev: Evaluation) -> str:
    """Write the JSON report; the output is workspace-relative when possible, because the
    container's paths (/github/workspace) differ from the host's for later steps."""
    if ev.report_json is None:
        return ""
    base = ev.run_dir if ev.run_dir and ev.run_dir.is_dir() else job.workspace / ".gatekeeper"
    path = base / "gatekeeper-report.json"
    try:
        atomic_write_bytes(path, (json.dumps(ev.report_json, indent=2) + "\n").encode("utf-8"))
        job.written.append(path.parent if path.parent.name == ".gatekeeper" else path)
    except GateError as err:
        job.warn(f"could not write the JSON report: {err}")
        return ""
    try:
        return str(path.resolve().relative_to(job.workspace.resolve()))
    except ValueError:
        return str(path)


def main(env: dict[str, str] | None = None) -> int:
    env_given = env
    env = dict(os.environ if env is None else env)
    console = ci.Console()
    # Stripped: a secret pasted with a trailing newline would make every call an invalid header.
    token = (env.get("INPUT_GITHUB-TOKEN") or env.get("INPUT_GITHUB_TOKEN") or "").strip()
    if token:
        console.mask(token)  # first thing: nothing printed later can reveal it
    # The token stays in this function (and the client); task code and lm-eval never see it.
    if env_given is None:
        scrub_ci_secrets(os.environ)
    scrub_ci_secrets(env)
    job = Job(
        env=env,
        # Used when the event file cannot be read: keep the commit, so a push still gets its status.
        event=events.Event(name=env.get("GITHUB_EVENT_NAME", ""), sha=env.get("GITHUB_SHA", "").strip(),
                           repository=env.get("GITHUB_REPOSITORY", "")),
        console=console,
        workspace=Path(env.get("GITHUB_WORKSPACE") or os.getcwd()),
        repo=env.get("GITHUB_REPOSITORY", ""),
        run_url=_run_url(env),
    )
    inputs = Inputs(dict(DEFAULTS))
    client = None
    if token and job.repo:
        client = GitHubClient(token, env.get("GITHUB_API_URL") or "https://api.github.com",
                              retry=RetryPolicy.from_env(env), log=lambda m: console.line(f"  {m}"))
    try:
        job.event = events.load_event(env)
        inputs = read_inputs(env, job.event)
        refusal = fork_refusal(job, inputs, client)
        if refusal:
            ev = error_evaluation(refusal, "refused")
        else:
            with tempfile.TemporaryDirectory(prefix="gatekeeper-private-", dir=_temp_root(env)) as scratch:
                job.scratch = Path(scratch)
                ev = evaluate(job, inputs)
            job.scratch = None
    except GateError as err:
        ev = error_evaluation(str(err))
    except OSError as err:  # unreadable/unwritable paths: an input problem, not a crash
        ev = error_evaluation(f"{getattr(err, 'filename', None) or 'file'}: {err.strerror or err}")
    except Exception as err:  # noqa: BLE001 - a crash must read as an error (2), never as exit 1
        _log_traceback(console)
        ev = error_evaluation(f"internal error ({type(err).__name__}: {err}); please report it with the log")
    if ev.code == 2 and ev.report_json is None:  # the artifact and the summary say why, too
        ev.report_json = error_json(ev.headline, suite=_suite_name(ev, inputs), verdict=ev.verdict,
                                    command=inputs["command"], model=inputs["model"] or None,
                                    commit=_safe_head_sha(job))
    code = ev.code
    if code == 1 and inputs["fail-on"] == "never":
        code = 0
    _announce(job, ev)
    if job.event.name == "schedule" and ev.outcome is not None and inputs.values.get("promote-on-green"):
        _promote_on_green(job, inputs, ev)

    # The verdict is written before GitHub is called: a hung or hostile API can then cost the
    # comment, never the report, the summary or the outputs.
    outputs = {"verdict": ev.verdict, "regressions": str(len(ev.regressions)),
               "report-json": _write_report_json(job, ev)}
    if ev.sequential is not None:
        outputs.update({"sequential-next": ev.sequential["next"], "sequential-done": ev.sequential["done"]})
    noted = len(job.notes)
    _write_runner_files(job, ev.summary_markdown + _notes_md(job.notes), outputs, reserve=ci.SUMMARY_RESERVE)
    if client is not None:
        client.start_deadline()  # one deadline on all publishing (GATEKEEPER_PUBLISH_DEADLINE)
    try:
        comment_url = publish(job, inputs, ev, client)
    except Exception as err:  # noqa: BLE001 - a publishing bug must not change the verdict
        job.warn(f"publishing failed unexpectedly ({type(err).__name__}: {err}); the verdict stands")
        comment_url = ""
    if inputs.values.get("mlflow-tracking-uri") and ev.outcome is not None:
        _log_mlflow(job, inputs, ev)  # last: the report and the outputs are already written
    _write_runner_files(job, _notes_md(job.notes[noted:]), {"comment-url": comment_url}, reserve=0)
    hand_back(job)
    console.line(f"gatekeeper: {ev.verdict} (exit {code})")
    return code


def _temp_root(env: dict[str, str]) -> str | None:
    """The runner's temp folder (outside the workspace, large), else the system's."""
    folder = env.get("RUNNER_TEMP", "").strip()
    return folder if folder and os.path.isdir(folder) else None


def _safe_head_sha(job: Job) -> str | None:
    """The evaluated commit, for an error's report: a malformed event payload (the error being
    reported) must not raise again here."""
    try:
        return job.event.head_sha or None
    except Exception:  # noqa: BLE001 - the payload's shape is what went wrong
        return job.env.get("GITHUB_SHA") or None


def hand_back(job: Job) -> None:
    """Give what this run wrote in the workspace to the workspace's owner. The action's container
    runs as root: root-owned outputs would stop the job's next (non-root) step from writing
    beside them, and a persistent runner's next checkout from cleaning them. Never through a
    symlink, never outside the workspace; a failure is a warning."""
    if os.geteuid() != 0 or not job.written:
        return
    try:
        owner = os.stat(job.workspace)
    except OSError:
        return
    if owner.st_uid == 0:
        return
    root = os.path.abspath(job.workspace)
    for top in dict.fromkeys(job.written):
        top_path = os.path.abspath(top)
        if os.path.commonpath([root, top_path]) != root or not os.path.lexists(top_path):
            continue
        try:
            for path in _owned_tree(top_path):
                os.chown(path, owner.st_uid, owner.st_gid, follow_symlinks=False)
        except OSError as err:
            job.console.annotate("warning", f"could not hand {top} back to uid {owner.st_uid}: {err.strerror or err}",
                                 title="gatekeeper")


def _owned_tree(top: str) -> Iterator[str]:
    yield top
    if os.path.isdir(top) and not os.path.islink(top):
        for dirpath, dirnames, filenames in os.walk(top):
            for name in dirnames + filenames:
                yield os.path.join(dirpath, name)


def _notes_md(notes: list[str]) -> str:
    return "\n\n#### Publishing\n" + "\n".join(f"- {_md_note(n)}" for n in notes) if notes else ""


def _write_runner_files(job: Job, summary: str, outputs: dict[str, str], *, reserve: int) -> None:
    """Append to the job summary and the step outputs; a failure is a warning, never the exit code."""
    for what, write in (
        ("job summary", lambda: summary and ci.append_summary(
            job.env.get("GITHUB_STEP_SUMMARY"), summary.lstrip("\n") + "\n", reserve=reserve)),
        ("step outputs", lambda: ci.write_outputs(job.env.get("GITHUB_OUTPUT"), outputs)),
    ):
        try:
            write()
        except OSError as err:  # the runner's files, not ours: say so, keep the gate's code
            job.console.annotate("warning", f"could not write the {what}: {err.strerror or err}", title="gatekeeper")


def _log_traceback(console: ci.Console) -> None:
    """The traceback, folded, with workflow commands off (it can quote untrusted text)."""
    with console.group("gatekeeper: internal error details") as log:
        for line in traceback.format_exc().splitlines():
            log(line)


def _md_note(text: str) -> str:
    return escape_untrusted(text, 600)


def _announce(job: Job, ev: Evaluation) -> None:
    if ev.code == 2:
        job.console.annotate("error", "\n".join(ev.headline.splitlines()[:30]), title="gatekeeper")
        return
    job.console.line(ev.headline)
    if ev.regressions:
        job.console.error_annotations(ev.regressions, title="gatekeeper: regression")


def _log_mlflow(job: Job, inputs: Inputs, ev: Evaluation) -> None:
    """One MLflow run per gate; a failure is a warning in the summary, never the verdict."""
    from gatekeeper.publish.tracking import log_gate

    logged = log_gate(_mlflow_uri(job, inputs["mlflow-tracking-uri"]), ev.report_json, ev.summary_markdown,
                      event=job.event.name, commit=job.event.head_sha or job.env.get("GITHUB_SHA"))
    if logged.ok:
        job.console.line(logged.message)
    else:
        job.warn(f"mlflow: {logged.message}")


def _mlflow_uri(job: Job, value: str) -> str:
    """A server or database URI as given; a folder relative to the workspace."""
    return value if "://" in value or value.startswith("file:") else str(_path(job, value))


def _promote_on_green(job: Job, inputs: Inputs, ev: Evaluation) -> None:
    try:
        if not inputs.flag("promote-on-green") or ev.outcome is None or ev.run_dir is None:
            return
        held = _not_promoted(ev)
        if held:  # said in the log and the summary: a silent skip would read as "promoted"
            job.console.line(f"promote-on-green: not promoted: {held}")
            note = f"\n\nNot promoted: {held}."
            ev.markdown += note
            if ev.summary is not None:
                ev.summary += note
            return
        if not ev.trusted:  # the base commit's suite gated it: its files are not the branch's to write
            job.warn("promote-on-green: this checkout is not the default branch's latest commit; not promoted")
            return
        written = promote_run(ev.run_dir, ev.suite)
        job.written.append(written.parent)
    except GateError as err:
        job.warn(f"promote-on-green: {err}")
        return
    except Exception as err:  # noqa: BLE001 - promotion must not turn a pass into a crash
        job.warn(f"promote-on-green failed ({type(err).__name__}: {err}); the verdict stands")
        return
    job.console.line(f"promoted this run as the new baseline: {written}")
    note = f"\n\nPromoted this run as the new baseline: `{written.name}` (commit it to keep it)."
    ev.markdown += note
    if ev.summary is not None:
        ev.summary += note


def _not_promoted(ev: Evaluation) -> str:
    """Why a nightly run must not become the baseline ("" when it may): a failed or drifted run,
    or one with an inconclusive gated metric (a drop beyond the margin is not ruled out, so
    promoting it could hand the next night a worse reference)."""
    out = ev.outcome
    if out is None or ev.verdict not in ("pass", "fail", "drift"):
        return f"the gate did not decide ({ev.verdict})"
    if (ev.report_json or {}).get("sequential"):
        return "a sequential gate evaluates a sample of the items, not a whole run"
    if (ev.report_json or {}).get("informative"):
        return "an informative gate reads the items in stages, a sample, not a whole run"
    if out.verdict == "fail":
        return "it regressed"
    if out.verdict == "drift":
        return "it drifted beyond the margin since the anchor"
    if out.inconclusive:
        names = ", ".join(str(c.key) for c in out.inconclusive[:3])
        return f"{len(out.inconclusive)} gated metric(s) inconclusive ({names}): a drop beyond the margin is not ruled out"
    return ""


if __name__ == "__main__":
    sys.exit(main())
