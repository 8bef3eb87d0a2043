"""The documented fork split, end to end: the steps of ``docs/workflows/fork-eval.yml`` and
``fork-report.yml`` are read from the YAML and executed in order as a runner would (the action
steps as ``python -m gatekeeper.action`` with their ``with:`` inputs, the ``run:`` steps with
bash, the artifact upload/download as a copy), against a real lm-eval run of a demo checkpoint
and the loopback fake GitHub. Before the fix, the report job always ended in exit 2: the
artifact holds ``run-<id>-<attempt>-<ts>/<model>/results_*.json``, two levels down."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gatekeeper.errors import GateError
from gatekeeper.publish.comment import sticky_marker
from gatekeeper.results.layout import find_results_file
from tests.github_server import FakeGitHub
from tests.warm_start import OWN_SERVER_ENV

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
WORKFLOWS = ROOT / "docs" / "workflows"
TOKEN = "ghs_forkSplitTOKEN0123456789"
REPO = "octo/repo"
HEAD = "c" * 40
PR = 12
ACTION = "your-org/gatekeeper@"
# What GitHub substitutes for the expressions these workflows use; an expression not listed
# here fails the test, so a workflow edit cannot slip past it untested.
EXPRESSIONS = {
    "github.event.pull_request.number": str(PR),
    "github.event.workflow_run.head_sha": HEAD,
    "github.event.workflow_run.id": "777",
    "github.repository": REPO,
    "github.token": TOKEN,
    "secrets.HF_TOKEN": "",  # not set in the test repository: the step's env is then empty
}


def _steps(name: str) -> list[dict[str, Any]]:
    doc = yaml.safe_load((WORKFLOWS / name).read_text(encoding="utf-8"))
    (job,) = doc["jobs"].values()
    return job["steps"]


def _action_inputs() -> dict[str, dict[str, Any]]:
    return yaml.safe_load((ROOT / "action.yml").read_text(encoding="utf-8"))["inputs"]


def _expand(text: str, extra: dict[str, str]) -> str:
    known = {**EXPRESSIONS, **extra}
    return re.sub(r"\$\{\{\s*(.*?)\s*\}\}", lambda m: known[m.group(1)], str(text))


def _condition(expr: str | None, known: dict[str, str], failed: bool) -> bool:
    """A step's ``if:`` as these workflows write it: ``always()``, ``a == 'x'``, ``a != ''``,
    joined by ``&&``. Without ``always()`` a step after a failure is skipped, as on GitHub."""
    if expr is None:
        return not failed
    expr = str(expr).replace("${{", "").replace("}}", "").strip()
    parts = [p.strip() for p in expr.split("&&")]
    if "always()" not in parts and failed:
        return False
    for part in parts:
        if part == "always()":
            continue
        m = re.fullmatch(r"([\w.\-]+)\s*(==|!=)\s*'([^']*)'", part)
        assert m, f"an if: this test cannot evaluate: {part!r}"
        value = known.get(m.group(1), "")
        if (value == m.group(3)) != (m.group(2) == "=="):
            return False
    return True


RUNNER_UID = 1001  # the self-hosted runner's user: the action's container runs as root over its workspace


# git's local transport drops `-c` settings for the other repository's side: a clone or fetch from
# a checkout the runner's user owns needs safe.directory in a global file.
_GITCONFIG = Path(tempfile.mkdtemp(prefix="gatekeeper-gitconfig-")) / "config"
_GITCONFIG.write_text("[safe]\n\tdirectory = *\n")


def git(cwd: Path, *args: str) -> str:
    env = dict(os.environ, GIT_CONFIG_GLOBAL=str(_GITCONFIG), GIT_CONFIG_NOSYSTEM="1")
    proc = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "safe.directory=*",
                           *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _workspace(root: Path) -> tuple[Path, str]:
    """A repository checkout: the demo suite, its tasks and stored baseline at the top level,
    committed on main; returns it and that commit. Owned by the runner's user (not root)."""
    root.mkdir(parents=True)
    shutil.copy(EXAMPLES / "gatekeeper.yaml", root / "gatekeeper.yaml")
    shutil.copytree(EXAMPLES / "tasks", root / "tasks", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(EXAMPLES / ".gatekeeper", root / ".gatekeeper",  # the recorded baseline only
                    ignore=shutil.ignore_patterns("*.trend.jsonl", "*.anchor.json.gz", "history"))
    (root / ".github/workflows").mkdir(parents=True)
    for name in ("fork-eval.yml", "fork-report.yml", "fork-gate.yml"):
        shutil.copy(WORKFLOWS / name, root / ".github/workflows" / name)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "main")
    _own(root)
    return root, git(root, "rev-parse", "HEAD")


def _own(root: Path) -> None:
    if os.geteuid() == 0:
        for path in [root, *root.rglob("*")]:
            os.lchown(path, RUNNER_UID, RUNNER_UID)


@pytest.fixture(scope="module")
def runner_home(tmp_path_factory: pytest.TempPathFactory):
    """A folder the runner's user can reach (pytest's own temp folders are root's, mode 0700):
    the workspaces, step scripts and runner files of these jobs live in it."""
    home = Path(tempfile.mkdtemp(prefix="gatekeeper-runner-"))
    home.chmod(0o755)
    yield home
    shutil.rmtree(home, ignore_errors=True)


def _upload(ws: Path, inputs: dict[str, str], artifacts: Path) -> None:
    """actions/upload-artifact v4.4+'s file rules: hidden files and folders (any part of the
    path starting with '.') are left out unless include-hidden-files is true; no file at all is
    if-no-files-found (warn, the default: no artifact and a green step; error: the step fails)."""
    base = ws / inputs["path"]
    files = [p for p in ([base] if base.is_file() else base.rglob("*")) if p.is_file()]
    if str(inputs.get("include-hidden-files", "false")).lower() != "true":  # YAML true: the runner passes "true"
        files = [p for p in files if not any(part.startswith(".") for part in p.relative_to(ws).parts)]
    if not files:
        assert inputs.get("if-no-files-found", "warn") != "error", f"upload-artifact: no files at {inputs['path']}"
        return  # "No files were found with the provided path": nothing uploaded
    for p in files:
        dest = artifacts / inputs["name"] / p.relative_to(base if base.is_dir() else base.parent)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, dest)


def _fake_gh_cli(bin_dir: Path, head_of_pr: str) -> None:
    """``gh api repos/REPO/pulls/N --jq .head.sha`` answering ``head_of_pr`` for PR 12."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "gh"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$*" = "api repos/{REPO}/pulls/{PR} --jq .head.sha" ] && [ "$GH_TOKEN" = "{TOKEN}" ]; then\n'
        f'  echo "{head_of_pr}"; exit 0\nfi\n'
        'echo "gh: unexpected call: $*" >&2; exit 1\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


class Runner:
    """Executes one job's steps in a workspace, as the GitHub runner would."""

    def __init__(self, ws: Path, event: str, payload: dict, api_url: str, path_prefix: Path | None = None,
                 sha: str = HEAD, context: dict[str, str] | None = None, container: bool = False,
                 ref: str = "refs/heads/main"):
        self.ws, self.event, self.api_url, self.sha, self.ref = ws, event, api_url, sha, ref
        # A job with a `container:` runs its `run:` steps as root in it; on the host as the runner's user.
        self.container = container
        self.event_path = ws.parent / f"{event}.json"
        self.event_path.write_text(json.dumps(payload))
        self.path_prefix = path_prefix
        self.outputs: dict[str, str] = dict(context or {})  # "steps.<id>.outputs.<name>" -> value, and context
        # The runner's temp folder: outside the checkout, emptied for every job.
        self.temp = ws.parent / f"{ws.name}.runner-temp"
        shutil.rmtree(self.temp, ignore_errors=True)
        self.temp.mkdir()
        _own(self.temp)
        self.outputs["runner.temp"] = str(self.temp)
        self.results: list[subprocess.CompletedProcess] = []

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("INPUT_", "GITHUB_"))}
        env.update({
            "GITHUB_EVENT_NAME": self.event, "GITHUB_EVENT_PATH": str(self.event_path), "GITHUB_SHA": self.sha,
            "GITHUB_REF": self.ref,
            "GITHUB_REPOSITORY": REPO, "GITHUB_API_URL": self.api_url, "GITHUB_WORKSPACE": str(self.ws),
            "GITHUB_RUN_ID": "777", "GITHUB_RUN_ATTEMPT": "1", "RUNNER_ENVIRONMENT": "self-hosted",
            "GITHUB_SERVER_URL": "https://github.example", "GATEKEEPER_HTTP_BACKOFF": "0.01",
            "GITHUB_STEP_SUMMARY": str(self.ws.parent / "summary.md"),
            "GITHUB_OUTPUT": str(self.ws.parent / "output"), "PYTHONPATH": str(ROOT), "RUNNER_TEMP": str(self.temp),
            "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            # A job's HF_HOME is its own (the workflow's env): its gate steps load the model, warm in
            # a server of that environment (tests/warm_start.py).
            OWN_SERVER_ENV: "1",
        })
        # the `gatekeeper` command, as the job-container image has it
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        if self.path_prefix is not None:
            env["PATH"] = f"{self.path_prefix}{os.pathsep}{env.get('PATH', '')}"
        return env

    def step(self, step: dict[str, Any], artifacts: Path) -> subprocess.CompletedProcess | None:
        uses = step.get("uses", "")
        if uses.startswith("actions/cache@"):
            return None  # a cache miss: nothing restored, and nothing this test reads is saved
        inputs = {k: _expand(v, self.outputs) for k, v in (step.get("with") or {}).items()}
        (self.ws.parent / "output").write_text("")
        _own(self.ws.parent / "output")
        if uses.startswith("actions/checkout@"):
            return None  # the workspace is the checkout
        if uses.startswith("actions/upload-artifact@"):
            _upload(self.ws, inputs, artifacts)
            return None
        if uses.startswith("actions/download-artifact@"):
            if "pattern" in inputs:  # one folder per artifact, under path
                found = sorted(p for p in artifacts.glob(inputs["pattern"]) if p.is_dir())
                assert found, f"download-artifact: no artifact matches {inputs['pattern']}"
                for art in found:
                    shutil.copytree(art, self.ws / inputs["path"] / art.name)
            else:
                assert (artifacts / inputs["name"]).is_dir(), f"download-artifact: Artifact not found: {inputs['name']}"
                shutil.copytree(artifacts / inputs["name"], self.ws / inputs["path"])
            _own(self.ws / inputs["path"])
            return None
        env = self._env()
        if uses.startswith(ACTION):
            # The runner passes every input of action.yml: the workflow's value, else the default.
            defaults = {k: _expand(v.get("default", ""), self.outputs) for k, v in _action_inputs().items()}
            unknown = set(inputs) - set(defaults)
            assert not unknown, f"inputs action.yml does not declare: {unknown}"
            env.update({f"INPUT_{k.upper()}": v for k, v in {**defaults, **inputs}.items()})
            # The step's env, with the container's view of the workspace mapped back to it.
            env.update({k: _expand(v, self.outputs).replace("/github/workspace", str(self.ws))
                        for k, v in (step.get("env") or {}).items()})
            cmd = [sys.executable, "-m", "gatekeeper.action"]
        else:
            assert "run" in step and not uses, f"a step this test does not know how to run: {step}"
            env.update({k: _expand(v, self.outputs) for k, v in (step.get("env") or {}).items()})
            script = self.ws.parent / "step.sh"
            script.write_text(_expand(step["run"], self.outputs))
            _own(script)
            cmd = ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)]  # GitHub's default shell
        # The action's container runs as root; a `run:` step as the runner's user.
        as_runner = {} if uses or self.container or os.geteuid() != 0 else {"user": RUNNER_UID, "group": RUNNER_UID}
        proc = subprocess.run(cmd, cwd=self.ws, env=env, capture_output=True, text=True, timeout=600, **as_runner)
        self.results.append(proc)
        text = (self.ws.parent / "output").read_text()
        heredocs = dict((n, v) for n, _, v in re.findall(r"^([\w-]+)<<(\S+)\n(.*?)\n\2$", text, flags=re.M | re.S))
        for line in text.splitlines():
            name, sep, value = line.partition("=")
            if sep and step.get("id") and "<<" not in name:
                self.outputs[f"steps.{step['id']}.outputs.{name}"] = value
        for name, value in heredocs.items():
            if step.get("id"):
                self.outputs[f"steps.{step['id']}.outputs.{name}"] = value
        return proc

    def job(self, steps: list[dict[str, Any]], artifacts: Path) -> subprocess.CompletedProcess | None:
        """The steps as a job runs them: after a failure only `if: always()` steps; the last
        process run. ``self.failed`` tells whether the job failed."""
        last, self.failed, self.skipped = None, False, []
        for step in steps:
            if not _condition(step.get("if"), self.outputs, self.failed):
                self.skipped.append(step.get("name") or step.get("uses"))
                continue
            proc = self.step(step, artifacts)
            if proc is not None:
                last = proc
                self.failed = self.failed or proc.returncode != 0
        return last


@dataclass
class ForkRun:
    """fork-eval.yml's run on a fork PR: its artifacts folder and the fork's repository and head."""

    artifacts: Path
    origin: Path  # a bare copy of the fork, root's, as the base repository's remote serves its head
    head: str


@pytest.fixture(scope="module")
def fork_eval(runner_home: Path) -> ForkRun:
    """fork-eval.yml run on a fork PR that proposes the harmless checkpoint."""
    root = runner_home / "fork-eval"
    ws, base = _workspace(root / "ws")
    git(ws, "checkout", "-q", "-b", "fork")
    shutil.copytree(EXAMPLES / "checkpoints" / "harmless", ws / "checkpoints" / "candidate")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "fork: a new checkpoint")
    head = git(ws, "rev-parse", "HEAD")
    origin = root / "origin.git"  # made before the checkout is the runner's: git refuses another user's remote
    git(root, "clone", "-q", "--bare", str(ws), str(origin))
    git(origin, "config", "uploadpack.allowAnySHA1InWant", "true")  # as GitHub serves a PR's head by its sha
    _own(ws)
    payload = {"pull_request": {"number": PR, "head": {"sha": head, "repo": {"full_name": "evil/fork", "fork": True}},
                                "base": {"sha": base, "repo": {"full_name": REPO}}}}
    runner = Runner(ws, "pull_request", payload, "http://127.0.0.1:9", sha=head)
    artifacts = root / "artifacts"
    runner.job(_steps("fork-eval.yml"), artifacts)
    assert [p.returncode for p in runner.results] == [0, 0], [p.stdout[-2000:] + p.stderr[-2000:]
                                                              for p in runner.results]
    return ForkRun(artifacts, origin, head)


def _report(fork_eval: ForkRun, gh: FakeGitHub, head_of_pr: str, *, path: str = ".github/workflows/fork-eval.yml",
            fork_edits: bool = False) -> tuple[Runner, Any]:
    """fork-report.yml on the workflow_run of ``fork_eval``'s run (of the workflow file ``path``);
    ``fork_edits``: the fork's head commit changes fork-eval.yml (one more commit in the fork)."""
    tmp_path = Path(tempfile.mkdtemp(prefix="report-", dir=fork_eval.artifacts.parent.parent))
    tmp_path.chmod(0o755)
    ws, main = _workspace(tmp_path / "ws")
    head = fork_eval.head
    origin = fork_eval.origin
    if fork_edits:
        fork = tmp_path / "fork"
        git(tmp_path, "clone", "-q", str(origin), str(fork))
        git(fork, "checkout", "-q", head)
        with (fork / ".github/workflows/fork-eval.yml").open("a") as fh:
            fh.write("      - run: echo 'an artifact of my choosing'\n")
        git(fork, "commit", "-q", "-am", "fork: my own eval")
        head = git(fork, "rev-parse", "HEAD")
        origin = tmp_path / "origin.git"
        git(tmp_path, "clone", "-q", "--bare", str(fork), str(origin))
        git(origin, "config", "uploadpack.allowAnySHA1InWant", "true")
    git(ws, "remote", "add", "origin", str(origin))
    _fake_gh_cli(tmp_path / "bin", head if head_of_pr == HEAD else head_of_pr)  # HEAD: the evaluated head
    _own(tmp_path / "bin")
    _own(ws)
    payload = {"workflow_run": {"id": 777, "head_sha": head, "event": "pull_request", "conclusion": "success",
                                "path": path, "head_repository": {"full_name": "evil/fork"},
                                "pull_requests": []},  # GitHub lists no PRs for a fork's run
               "repository": {"full_name": REPO, "default_branch": "main"}}
    # workflow_run checks out the default branch: GITHUB_SHA is its commit, and HEAD is it
    runner = Runner(ws, "workflow_run", payload, gh.url, path_prefix=tmp_path / "bin", sha=main,
                    context={"github.event.workflow_run.head_sha": head})
    return runner, runner.job(_steps("fork-report.yml"), fork_eval.artifacts)


@pytest.mark.lmeval
def test_fork_eval_artifact_has_the_run_two_levels_down_and_the_pr_number(fork_eval: ForkRun) -> None:
    artifact = fork_eval.artifacts / "gatekeeper-run"
    assert (artifact / "pr-number").read_text().strip() == str(PR)
    (results,) = artifact.glob("run-777-1-*/*/results_*.json")
    assert find_results_file(artifact)[0] == results


@pytest.mark.lmeval
def test_fork_report_shows_the_forks_own_run_as_advisory_and_never_a_success(fork_eval: ForkRun,
                                                                             gh: FakeGitHub) -> None:
    """The fork's run may be honest or forged: either way it is the fork's writing. It gets a
    comment of its own, marked advisory, and no commit status: never a green required check."""
    gh.add_pr(PR, fork_eval.head)
    runner, last = _report(fork_eval, gh, head_of_pr=HEAD)
    assert [p.returncode for p in runner.results] == [0, 0], last.stdout[-3000:] + last.stderr[-2000:]
    assert runner.outputs["steps.pr.outputs.number"] == str(PR)
    (body,) = gh.comment_bodies(PR)
    assert body.startswith("### ✅") and "Advisory: this is the fork's own run" in body
    assert sticky_marker("demo (advisory)") in body and sticky_marker("demo") not in body
    assert gh.statuses == []
    assert [ln for ln in last.stdout.splitlines() if TOKEN in ln] == [f"::add-mask::{TOKEN}"]
    assert TOKEN not in last.stderr


@pytest.mark.lmeval
@pytest.mark.parametrize("case", ["another workflow file", "the fork edited fork-eval.yml"])
def test_fork_report_refuses_an_artifact_the_forks_own_workflow_wrote(fork_eval: ForkRun, gh: FakeGitHub,
                                                                      case: str) -> None:
    """A fork adds a workflow of the same name, or edits fork-eval.yml, and uploads a forged
    artifact (an honest run of another, good checkpoint): refused, nothing posted."""
    gh.add_pr(PR, fork_eval.head)
    if case == "another workflow file":
        runner, last = _report(fork_eval, gh, head_of_pr=HEAD, path=".github/workflows/forged.yml")
        says = "the run came from .github/workflows/forged.yml, not .github/workflows/fork-eval.yml"
    else:
        runner, last = _report(fork_eval, gh, head_of_pr=HEAD, fork_edits=True)
        says = ".github/workflows/fork-eval.yml: the fork's copy at"
    assert last.returncode == 2, last.stdout[-3000:] + last.stderr[-2000:]
    assert says in last.stdout
    # The refusal is said in the advisory comment only, never over the trusted verdict's; no status.
    (body,) = gh.comment_bodies(PR)
    assert body.rstrip().endswith("__advisory_ -->") and "refus" in body and "✅" not in body
    assert gh.statuses == []


@pytest.mark.lmeval
def test_fork_report_refuses_a_pr_number_that_does_not_match_the_evaluated_commit(
    fork_eval: ForkRun, gh: FakeGitHub
) -> None:
    gh.add_pr(PR, fork_eval.head)
    runner, last = _report(fork_eval, gh, head_of_pr="d" * 40)
    assert len(runner.results) == 1 and last.returncode == 1  # the compare step never runs
    assert f"::error::PR #{PR} head is {'d' * 40}, not {fork_eval.head}" in last.stdout
    assert gh.comment_bodies(PR) == []


# ------------------------------------------------------------------ layouts (no evaluation)


def _results(folder: Path, ts: str = "2026-12-01T00-00-00.000001") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"results_{ts}.json"
    path.write_text("{}")
    return path


def test_gatekeeper_run_out_folder_is_found_two_levels_down(tmp_path: Path) -> None:
    out = tmp_path / "out"
    want = _results(out / "run-1-1-20261201T000000" / "org__model")
    (out / "pr-number").write_text("12\n")
    found, notes = find_results_file(out)
    assert found == want and notes == [f"using run-1-1-20261201T000000/org__model under {out}"]
    assert find_results_file(out / "run-1-1-20261201T000000") == (want, [])  # one level: no note


def test_two_runs_in_the_out_folder_are_refused_not_guessed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _results(out / "run-1-1-20261201T000000" / "org__model")
    _results(out / "run-2-1-20261201T010000" / "org__model")
    with pytest.raises(GateError, match=re.escape(
            f"{out}: 2 run folders with results (run-1-1-20261201T000000/org__model, "
            "run-2-1-20261201T010000/org__model); pass one of them")):
        find_results_file(out)


def test_results_one_level_down_win_over_deeper_ones(tmp_path: Path) -> None:
    out = tmp_path / "out"
    want = _results(out / "model")
    _results(out / "old" / "model")
    assert find_results_file(out) == (want, [])


def test_three_levels_down_is_not_searched(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _results(out / "a" / "b" / "c")
    with pytest.raises(GateError, match="no results_"):
        find_results_file(out)
