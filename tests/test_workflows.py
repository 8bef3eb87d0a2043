"""The copyable workflows in docs/workflows/ work when copied: their steps are read from the YAML
and executed in order as a runner would (tests/test_fork_split.py's ``Runner``: action steps as
``python -m gatekeeper.action`` with their inputs, ``run:`` steps with bash, as the runner's
non-root user on the host or as root in a job container, upload-artifact's file rules), on a
real git repository whose pull request adds the demo's regressed checkpoint, against the
loopback GitHub.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from gatekeeper.publish.comment import sticky_marker
from tests.github_server import BOT, FakeGitHub
from tests.test_fork_split import EXAMPLES, PR, REPO, WORKFLOWS, Runner, _own, git

pytestmark = pytest.mark.lmeval


def _jobs(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS / name).read_text(encoding="utf-8"))["jobs"]


@pytest.fixture
def repo():
    """A checkout of a repository whose main holds the demo suite, tasks and baseline, and whose
    branch `pr` adds checkpoints/candidate (the regressed checkpoint); checked out at `pr`.
    Yields (workspace, base commit, head commit, artifacts folder)."""
    home = Path(tempfile.mkdtemp(prefix="gatekeeper-wf-"))
    home.chmod(0o755)
    ws = home / "ws"
    ws.mkdir()
    shutil.copy(EXAMPLES / "gatekeeper.yaml", ws / "gatekeeper.yaml")
    shutil.copytree(EXAMPLES / "tasks", ws / "tasks", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(EXAMPLES / ".gatekeeper", ws / ".gatekeeper")
    git(ws, "init", "-q", "-b", "main")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "main")
    base = git(ws, "rev-parse", "HEAD")
    git(ws, "update-ref", "refs/remotes/origin/main", base)  # what fetch-depth: 0 gives
    git(ws, "checkout", "-q", "-b", "pr")
    shutil.copytree(EXAMPLES / "checkpoints" / "regressed", ws / "checkpoints" / "candidate")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "pr: a new checkpoint")
    head = git(ws, "rev-parse", "HEAD")
    _own(ws)
    (home / "artifacts").mkdir()
    yield ws, base, head, home / "artifacts"
    shutil.rmtree(home, ignore_errors=True)


def _pr_payload(base: str, head: str) -> dict:
    return {"pull_request": {"number": PR, "head": {"sha": head, "repo": {"full_name": REPO}},
                             "base": {"sha": base, "repo": {"full_name": REPO}}},
            "repository": {"full_name": REPO, "default_branch": "main"}}


def _pr_context(base: str) -> dict[str, str]:
    return {"github.event.pull_request.number": str(PR), "github.event.pull_request.base.sha": base}


def test_pull_request_workflow_fails_the_regressed_pr_and_keeps_its_report(repo, gh: FakeGitHub):
    ws, base, head, artifacts = repo
    (job,) = _jobs("pull-request.yml").values()
    runner = Runner(ws, "pull_request", _pr_payload(base, head), gh.url, sha=head, context=_pr_context(base))
    last = runner.job(job["steps"], artifacts)
    assert runner.failed and last.returncode == 1, last.stdout[-3000:] + last.stderr[-2000:]
    (body,) = gh.comment_bodies(PR)
    assert body.startswith("### ❌") and "demo\\_capitals\\_mc" in body
    assert json.loads((artifacts / "gatekeeper-report" / "gatekeeper-report.json").read_text())["verdict"] == "fail"


def test_pull_request_workflow_keeps_the_report_of_a_gate_that_errs(repo, gh: FakeGitHub):
    ws, base, head, artifacts = repo
    (job,) = _jobs("pull-request.yml").values()
    for step in job["steps"]:
        if step.get("id") == "gate":
            step["with"]["suite"] = "missing.yaml"
    runner = Runner(ws, "pull_request", _pr_payload(base, head), gh.url, sha=head, context=_pr_context(base))
    last = runner.job(job["steps"], artifacts)
    assert last.returncode == 2 and runner.skipped == []
    # Issue #41: the error's report is kept, and says why
    kept = json.loads((artifacts / "gatekeeper-report" / "gatekeeper-report.json").read_text())
    assert kept["verdict"] == "error" and "missing.yaml" in kept["error"] and kept["comparisons"] == []


def test_gpu_job_container_workflow_evaluates_with_the_base_commits_tasks(repo, gh: FakeGitHub):
    ws, base, head, artifacts = repo
    marker = ws.parent / "pr-task-code-ran"
    loaders = ws / "tasks" / "loaders.py"
    loaders.write_text(loaders.read_text() + f"\nopen({str(marker)!r}, 'w').close()\n")  # the PR's task code
    (job,) = _jobs("gpu-job-container.yml").values()
    runner = Runner(ws, "pull_request", _pr_payload(base, head), gh.url, sha=head, context=_pr_context(base),
                    container=True)
    last = runner.job(job["steps"], artifacts)
    assert runner.failed and last.returncode == 1, last.stdout[-3000:] + last.stderr[-2000:]
    assert not marker.exists()
    assert gh.comment_bodies(PR)[0].startswith("### ❌")


def test_sharded_workflow_gates_the_merged_shards_of_the_base_suite(repo, gh: FakeGitHub):
    ws, base, head, artifacts = repo
    jobs = _jobs("sharded.yml")
    shards = jobs["shard"]["strategy"]["matrix"]["shard"]
    for k in shards:
        job_ws = ws.parent / f"shard-{k}"
        shutil.copytree(ws, job_ws, symlinks=True)  # each matrix job has its own checkout
        runner = Runner(job_ws, "pull_request", _pr_payload(base, head), gh.url, sha=head, container=True,
                        context={**_pr_context(base), "matrix.shard": str(k), "strategy.job-total": str(len(shards))})
        runner.job(jobs["shard"]["steps"], artifacts)
        assert not runner.failed, [p.stdout[-2000:] + p.stderr[-2000:] for p in runner.results]
    assert sorted(p.name for p in artifacts.iterdir()) == [f"gatekeeper-shard-{k}" for k in shards]
    # Issue #25: the PR commits files where the gate job used to download the shards (a results
    # file that names itself newer than the shard's own) and a ready-made merged run.
    _plant(artifacts / "gatekeeper-shard-1", ws / "gatekeeper-shards" / "gatekeeper-shard-1")
    _plant(artifacts / "gatekeeper-shard-2", ws / "gatekeeper-merged")
    gate = Runner(ws, "pull_request", _pr_payload(base, head), gh.url, sha=head, container=True,
                  context={**_pr_context(base), "needs.shard.result": "success"})
    last = gate.job(jobs["gate"]["steps"], artifacts)
    assert gate.failed and last.returncode == 1, last.stdout[-3000:] + last.stderr[-2000:]
    assert gh.comment_bodies(PR)[0].startswith("### ❌")
    kept = artifacts / "gatekeeper-merged"
    assert (kept / "gatekeeper-report.json").is_file() and list(kept.glob("*/results_*.json"))


def test_sharded_sequential_workflow_judges_each_wave_and_fails_at_the_second(repo, gh: FakeGitHub):
    """sharded-sequential.yml on the PR that adds the regressed checkpoint: look 1 (two shards)
    does not decide (the judge says continue, names the stopped tasks, the comment is pending),
    look 2 evaluates only the tasks still running, and its judge fails the PR; looks 3-4 never run."""
    ws, base, head, artifacts = repo
    jobs = _jobs("sharded-sequential.yml")
    context: dict[str, str] = {}
    for k in (1, 2):
        wave = jobs[f"look-{k}"]
        if k > 1:
            assert wave["if"] == f"needs.judge-{k - 1}.outputs.next == '{k}/4'"
            assert context[f"needs.judge-{k - 1}.outputs.next"] == f"{k}/4"
        parts = wave["strategy"]["matrix"]["shard"]
        for part in parts:
            job_ws = ws.parent / f"look-{k}-{part}"
            shutil.copytree(ws, job_ws, symlinks=True)
            runner = Runner(job_ws, "pull_request", _pr_payload(base, head), gh.url, sha=head, container=True,
                            context={**_pr_context(base), **context, "matrix.shard": str(part),
                                     "strategy.job-total": str(len(parts))})
            runner.job(wave["steps"], artifacts)
            assert not runner.failed, [p.stdout[-2000:] + p.stderr[-2000:] for p in runner.results]
        judge_ws = ws.parent / f"judge-{k}"
        shutil.copytree(ws, judge_ws, symlinks=True)
        # Issue #25: the PR's checkout holds files where the waves used to be downloaded.
        _plant(artifacts / "gatekeeper-look-1-part-1", judge_ws / "gatekeeper-waves" / "gatekeeper-look-1-part-1")
        judge = Runner(judge_ws, "pull_request", _pr_payload(base, head), gh.url, sha=head, container=True,
                       context=_pr_context(base))
        last = judge.job(jobs[f"judge-{k}"]["steps"], artifacts)
        outputs = {name: judge.outputs.get(expr.replace("${{", "").replace("}}", "").strip(), "")
                   for name, expr in jobs[f"judge-{k}"]["outputs"].items()}
        context.update({f"needs.judge-{k}.outputs.{name}": value for name, value in outputs.items()})
        if k == 1:
            assert not judge.failed, last.stdout[-3000:] + last.stderr[-2000:]
            assert outputs["next"] == "2/4" and "demo_capitals_mc" not in outputs["done"].split(",")
            assert gh.comment_bodies(PR)[0].startswith("### ⏳")
            assert not (artifacts / "gatekeeper-report").exists()  # a look that did not decide keeps none
    assert judge.failed and last.returncode == 1, last.stdout[-3000:] + last.stderr[-2000:]
    # issue #40: the deciding look's report is kept, under the name the other workflows use
    assert json.loads((artifacts / "gatekeeper-report" / "gatekeeper-report.json").read_text())["verdict"] == "fail"
    assert context["needs.judge-2.outputs.next"] == ""  # look 3 is never evaluated
    bodies = gh.comment_bodies(PR)
    assert len(bodies) == 1 and bodies[0].startswith("### ❌")  # the one sticky comment, edited
    assert context["needs.judge-1.outputs.verdict"] == "continue" and context["needs.judge-2.outputs.verdict"] == "fail"
    final = _final(ws, {"look-1": "success", "judge-1": "success", "look-2": "success", "judge-2": "failure"},
                   ["continue", "fail"])
    assert final.returncode == 1 and "gatekeeper: fail" in final.stdout


def _plant(run: Path, where: Path) -> None:
    """What a PR commits into its checkout: a copy of a genuine run folder whose results file is
    renamed to look newer than any real one (the name the reader used to prefer)."""
    shutil.copytree(run, where, dirs_exist_ok=True)
    for results in where.glob("**/results_*.json"):
        results.rename(results.with_name("results_2099-01-01T00-00-00.000000.json"))


_NEEDS = ["look-1", "judge-1", "look-2", "judge-2", "look-3", "judge-3", "look-4", "judge-4"]


def _final(ws: Path, results: dict[str, str], verdicts: list[str]):
    """sharded-sequential.yml's last job (`gate`, the required check) with the jobs before it
    ended as ``results`` (the rest skipped) and the judges' verdicts in order."""
    job = _jobs("sharded-sequential.yml")["gate"]
    assert job["if"] == "always()" and job["needs"] == _NEEDS
    context = {f"needs.{name}.result": results.get(name, "skipped") for name in _NEEDS}
    context.update({f"needs.judge-{k}.outputs.verdict": v for k, v in enumerate(verdicts, 1)})
    context.update({f"needs.judge-{k}.outputs.verdict": "" for k in range(len(verdicts) + 1, 5)})
    final_ws = ws.parent / "final"
    final_ws.mkdir(exist_ok=True)
    runner = Runner(final_ws, "pull_request", {}, "http://127.0.0.1:9", context=context)
    return runner.job(job["steps"], ws.parent)


@pytest.mark.parametrize(("results", "verdicts", "passes"), [
    ({"look-1": "success", "judge-1": "success", "look-2": "success", "judge-2": "success"},
     ["continue", "pass"], True),
    ({"look-1": "success", "judge-1": "success"}, ["pass"], True),
    ({"look-1": "success", "judge-1": "success", "look-2": "failure"}, ["continue"], False),  # a wave crashed
    ({"look-1": "failure"}, [], False),
    ({"look-1": "success", "judge-1": "success", "look-2": "cancelled"}, ["continue"], False),
    ({"look-1": "success", "judge-1": "failure"}, ["fail"], False),
    ({"look-1": "success", "judge-1": "success", "look-2": "success", "judge-2": "success", "look-3": "success",
      "judge-3": "success", "look-4": "success", "judge-4": "success"},
     ["continue", "continue", "continue", "continue"], False),  # the last judge said continue
    ({"look-1": "success", "judge-1": "success"}, ["drift"], False),
])
def test_the_required_job_of_the_sequential_workflow_passes_only_on_a_verdict(
        tmp_path: Path, results: dict[str, str], verdicts: list[str], passes: bool) -> None:
    home = Path(tempfile.mkdtemp(prefix="gatekeeper-wf-"))
    home.chmod(0o755)
    try:
        (home / "ws").mkdir()
        last = _final(home / "ws", results, verdicts)
        assert (last.returncode == 0) == passes, last.stdout + last.stderr
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.parametrize(("workflow", "results", "reason"), [
    ("sharded.yml", {"shard": "failure"}, "a shard job ended 'failure'"),
    ("sharded.yml", {"shard": "cancelled"}, "a shard job ended 'cancelled'"),
    ("sharded-sequential.yml", {"look-1": "success", "judge-1": "success", "look-2": "failure"},
     "job look-2 ended 'failure'"),
    ("sharded-sequential.yml", {"look-1": "success", "judge-1": "failure"}, "job judge-1 ended 'failure'"),
])
def test_a_failed_evaluation_job_replaces_the_earlier_verdict_in_the_comment(
        repo, gh: FakeGitHub, workflow: str, results: dict[str, str], reason: str) -> None:
    """Issue #40: the PR's comment holds an earlier commit's pass; this commit's shard or wave
    job fails, so no judge runs. The required `gate` job must say in the comment and the job
    summary that this commit was not evaluated, and why, and fail."""
    ws, base, head, artifacts = repo
    gh.add_comment(PR, f"{sticky_marker('demo')}\n### ✅ gatekeeper demo: pass\n\ncommit 1111111", user=BOT)
    job = _jobs(workflow)["gate"]
    assert job["if"] == "always()"
    needs = job["needs"] if isinstance(job["needs"], list) else [job["needs"]]
    context = {f"needs.{name}.result": results.get(name, "skipped") for name in needs}
    # the judges that ran said "continue" (a judge that failed wrote no verdict)
    context.update({f"needs.judge-{k}.outputs.verdict": "continue" if results.get(f"judge-{k}") == "success" else ""
                    for k in range(1, 5)})
    runner = Runner(ws, "pull_request", _pr_payload(base, head), gh.url, sha=head,
                    context={**_pr_context(base), **context})
    last = runner.job(job["steps"], artifacts)
    assert runner.failed and last.returncode == 2, last.stdout[-3000:] + last.stderr[-2000:]
    (body,) = gh.comment_bodies(PR)  # the same sticky comment, edited
    assert body.startswith(f"### ⚠️ gatekeeper demo: not evaluated for commit `{head[:7]}`"), last.stdout[-3000:]
    assert reason in body.replace("\\", "") and "✅" not in body and "https://github.example/" in body
    summary = (ws.parent / "summary.md").read_text(encoding="utf-8")
    assert "not evaluated" in summary and reason in summary.replace("\\", "")
    # The one-line forms (the ::error:: annotation) are plain text: no markdown escapes (#58).
    (annotation,) = [ln for ln in last.stdout.splitlines() if ln.startswith("::error") and "not evaluated" in ln]
    assert reason in annotation and "\\" not in annotation, annotation
    assert not (artifacts / "gatekeeper-report").exists()


def test_checkpoint_push_to_a_branch_is_gated_against_main(repo, gh: FakeGitHub):
    ws, base, head, artifacts = repo
    gh.add_pr(PR, head)
    (job,) = _jobs("checkpoint-push.yml").values()
    payload = {"ref": "refs/heads/pr", "before": base, "after": head,
               "commits": [{"added": ["checkpoints/candidate/model.safetensors", "checkpoints/candidate/config.json"],
                            "modified": [], "removed": []}],
               "repository": {"full_name": REPO, "default_branch": "main"}}
    runner = Runner(ws, "push", payload, gh.url, sha=head, ref="refs/heads/pr")
    last = runner.job(job["steps"], artifacts)
    assert last.returncode == 1, last.stdout[-3000:] + last.stderr[-2000:]
    assert [(s["state"], s["context"]) for s in gh.statuses] == [("failure", "gatekeeper/demo")]
    assert f"from the base commit {base[:7]}" in gh.comment_bodies(PR)[0].replace("\\", "")


def test_the_trusted_fork_gate_evaluates_the_heads_checkpoint_as_data_and_sets_the_status(repo, gh: FakeGitHub):
    """fork-gate.yml (pull_request_target, the base repository's own workflow) on a fork PR that
    adds the regressed checkpoint. The checkout is the base commit, with a forged, good
    checkpoints/candidate left in its working tree: the evaluation reads the head's checkpoint
    from git objects, so the forged folder changes nothing; the report job sets the required
    status on the PR's head (failure) and the verdict comment."""
    ws, base, head, artifacts = repo
    upstream = ws.parent / "upstream.git"
    git(ws.parent, "clone", "-q", "--bare", str(ws), str(upstream))
    git(upstream, "update-ref", f"refs/pull/{PR}/head", head)
    git(ws, "remote", "add", "origin", str(upstream))
    git(ws, "checkout", "-q", base)
    shutil.rmtree(ws / "checkpoints", ignore_errors=True)
    shutil.copytree(EXAMPLES / "checkpoints" / "harmless", ws / "checkpoints" / "candidate")  # not the PR's
    _own(ws)
    _own(upstream)
    payload = {"pull_request": {"number": PR, "head": {"sha": head, "repo": {"full_name": "evil/fork", "fork": True}},
                                "base": {"sha": base, "repo": {"full_name": REPO}}},
               "label": {"name": "gatekeeper:evaluate"},
               "repository": {"full_name": REPO, "default_branch": "main"}}
    context = {**_pr_context(base), "github.event.pull_request.head.sha": head}
    jobs = _jobs("fork-gate.yml")
    assert jobs["evaluate"]["permissions"] == {"contents": "read"} and "secrets" not in json.dumps(jobs["evaluate"])
    evaluate = Runner(ws, "pull_request_target", payload, gh.url, sha=base, context=context)
    evaluate.job(jobs["evaluate"]["steps"], artifacts)
    assert not evaluate.failed, [p.stdout[-2000:] + p.stderr[-2000:] for p in evaluate.results]
    assert f"read from commit {head[:12]}'s git objects" in evaluate.results[-1].stdout
    report_ws = ws.parent / "report-ws"
    shutil.copytree(ws, report_ws, symlinks=True, ignore=shutil.ignore_patterns(".gatekeeper-work", "checkpoints"))
    report = Runner(report_ws, "pull_request_target", payload, gh.url, sha=base, context=context)
    last = report.job(jobs["report"]["steps"], artifacts)
    assert report.failed and last.returncode == 1, last.stdout[-3000:] + last.stderr[-2000:]
    (status,) = gh.statuses
    assert status["sha"] == head and status["state"] == "failure" and status["context"] == "gatekeeper/demo"
    (body,) = gh.comment_bodies(PR)
    assert body.startswith("### ❌") and sticky_marker("demo") in body
