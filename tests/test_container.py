"""The Docker action end to end: build the real Dockerfile, run the image the way the Actions
runner runs a Docker action, on the demo checkpoints, against the fake GitHub API.

The image is built once per session (minutes: pip installs lm-eval[hf] inside). Where no container
registry is reachable, offline-docker.sh (``$GATEKEEPER_OFFLINE_DOCKER``, else ../shared/tools/ beside
the checkout, where the project's build machines keep it; not part of the repository) provides
dockerd and a local stand-in for `python:3.11-slim` with the torch==2.13.0 wheel preinstalled, so
the Dockerfile builds unchanged. Skipped, with the reason, when no Docker daemon can be had.
Deselect with `-m "not docker"`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.github_server import FakeGitHub

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[1]
OFFLINE_DOCKER = Path(os.environ.get("GATEKEEPER_OFFLINE_DOCKER") or REPO.parent / "shared" / "tools" / "offline-docker.sh")
BASE_IMAGE = "python:3.11-slim"
# One tag per test session: two sessions on one daemon (two checkouts, a CI run beside a
# developer's) never run each other's image; the tag is removed at the end (its layers stay cached).
IMAGE = f"gatekeeper-action:test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
TOKEN = "ghs_containerTestToken0123456789"
REPO_NAME = "octo/repo"
HEAD_SHA = "a" * 40
BASE_SHA = "b" * 40
DEMO = REPO / "examples"
SUITE = "examples/gatekeeper.yaml"
REGRESSED_TASK = "demo_capitals_mc"
BUILD_TIMEOUT_S = 1800
RUN_TIMEOUT_S = 600


def _sh(args: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)


def _docker_answers() -> bool:
    try:
        return shutil.which("docker") is not None and _sh(["docker", "info"], 60).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _ensure_docker() -> None:
    """A running dockerd, started with offline-docker.sh when we may; else skip with the reason."""
    if _docker_answers():
        return
    if not OFFLINE_DOCKER.is_file():
        pytest.skip("the container test needs a running Docker daemon (`docker info` must answer); start Docker "
                    "and run the tests again")
    if os.geteuid() != 0:
        pytest.skip("no Docker daemon answers, and starting one needs root")
    result = _sh(["bash", str(OFFLINE_DOCKER), "start"], 900)
    if result.returncode != 0 or not _docker_answers():
        pytest.skip(f"could not start dockerd: {(result.stderr or result.stdout).strip()[-400:]}")


def _ensure_base_image(tmp: Path) -> None:
    """`FROM python:3.11-slim` must resolve without a registry: build the local stand-in, with
    the pinned torch wheel preinstalled so the Dockerfile's torch==2.13.0 needs no download."""
    if _sh(["docker", "image", "inspect", BASE_IMAGE], 60).returncode == 0:
        return
    if not OFFLINE_DOCKER.is_file():
        return  # a machine with registry access: docker build pulls the real image
    wheels = tmp / "wheels"
    got = _sh([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), "torch==2.13.0"], 900)
    assert got.returncode == 0, got.stderr[-2000:]
    (wheel,) = wheels.glob("torch-2.13.0*.whl")
    made = _sh(["bash", str(OFFLINE_DOCKER), "base", BASE_IMAGE, str(wheel)], 1500)
    assert made.returncode == 0, (made.stderr or made.stdout)[-2000:]


@pytest.fixture(scope="session")
def image(tmp_path_factory) -> Iterator[str]:
    _ensure_docker()
    if not (REPO / "README.md").is_file():
        pytest.fail("README.md is missing; the image installs the package, whose metadata needs it")
    _ensure_base_image(tmp_path_factory.mktemp("base"))
    started = time.monotonic()
    # Classic builder and no --pull: offline-docker.sh's daemon has no BuildKit and no registry.
    built = _sh(["docker", "build", "-t", IMAGE, str(REPO)], BUILD_TIMEOUT_S,
                env=dict(os.environ, DOCKER_BUILDKIT="0"))
    assert built.returncode == 0, (built.stdout + built.stderr)[-4000:]
    print(f"\ndocker build: {time.monotonic() - started:.0f} s")
    yield IMAGE
    _sh(["docker", "image", "rm", IMAGE], 120)


# -- the image itself ----------------------------------------------------------------------------


def test_image_follows_githubs_rules_and_carries_the_pinned_stack(image):
    info = json.loads(_sh(["docker", "image", "inspect", image], 60).stdout)[0]["Config"]
    assert info["Entrypoint"] == ["python", "-m", "gatekeeper.action"]
    assert info["User"] == "" and info["WorkingDir"] == ""  # GitHub runs it as root in /github/workspace
    probe = (
        "import importlib.metadata as m, os, shutil, gatekeeper.action, mlflow; "
        "print(m.version('torch').split('+')[0], m.version('lm_eval'), m.version('mlflow-skinny'), "
        "os.path.isdir('/root/.cache/pip'), shutil.which('gcc'))"
    )
    out = _sh(["docker", "run", "--rm", "--entrypoint", "python", image, "-c", probe], 300)
    assert out.returncode == 0, out.stderr[-2000:]
    # The action's mlflow-tracking-uri input needs the client: locked, at the lock's version.
    mlflow = re.search(r"^mlflow-skinny==(\S+)", (REPO / "requirements" / "runtime.txt").read_text(), re.M).group(1)
    assert out.stdout.split() == ["2.13.0", "0.4.13", mlflow, "False", "None"]  # no pip cache, no compiler


# -- the action's container, run as the Actions runner runs it ---------------------------------


@dataclass
class ActionRun:
    code: int
    log: str
    outputs: dict[str, str]
    summary: str
    comments: list[dict]
    requests: list[tuple[str, str]]


def _parse_outputs(text: str) -> dict[str, str]:
    """$GITHUB_OUTPUT in both forms: `name=value` and `name<<DELIM ... DELIM`."""
    out: dict[str, str] = {}
    lines = iter(text.splitlines())
    for line in lines:
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delim = line.split("<<", 1)
            body = []
            for value_line in lines:
                if value_line == delim:
                    break
                body.append(value_line)
            out[name] = "\n".join(body)
        elif "=" in line:
            name, value = line.split("=", 1)
            out[name] = value
    return out


def _pr_event(number: int) -> dict:
    repo = {"full_name": REPO_NAME, "fork": False, "name": "repo", "owner": {"login": "octo"}}
    return {
        "action": "synchronize",
        "number": number,
        "pull_request": {
            "number": number,
            "head": {"sha": HEAD_SHA, "ref": "feature", "repo": repo},
            "base": {"sha": BASE_SHA, "ref": "main", "repo": repo},
        },
        "repository": repo,
    }


class Runner:
    """Just enough of the Actions runner: mounts, env, inputs with action.yml's defaults."""

    def __init__(self, image: str, root: Path, fake: FakeGitHub) -> None:
        self.image, self.root, self.fake = image, root, fake
        self.workspace = root / "workspace"
        self.count = 0

    def run(self, event_name: str, event: dict, **inputs: str) -> ActionRun:
        self.count += 1
        step = self.root / f"step{self.count}"
        (step / "workflow").mkdir(parents=True)
        (step / "file_commands").mkdir()
        (step / "home").mkdir()
        (step / "workflow" / "event.json").write_text(json.dumps(event))
        for name in ("summary", "output"):
            (step / "file_commands" / name).touch()
        values = {  # action.yml's defaults, as the runner fills them in
            "command": "gate", "suite": "gatekeeper.yaml", "model": "", "revision": "", "baseline": "",
            "candidate": "", "out": ".gatekeeper-work", "github-token": TOKEN, "comment": "auto",
            "fail-on": "regression", "allow-forks": "false", "promote-on-green": "false", "pr-number": "",
        }
        values.update({k.replace("_", "-"): v for k, v in inputs.items()})
        env = {
            "HOME": "/github/home", "GITHUB_ACTIONS": "true", "CI": "true",
            "GITHUB_EVENT_NAME": event_name, "GITHUB_EVENT_PATH": "/github/workflow/event.json",
            "GITHUB_WORKSPACE": "/github/workspace", "GITHUB_REPOSITORY": REPO_NAME,
            "GITHUB_SHA": "c" * 40, "GITHUB_RUN_ID": "4242", "GITHUB_SERVER_URL": "https://github.com",
            "GITHUB_API_URL": self.fake.url, "GITHUB_STEP_SUMMARY": "/github/file_commands/summary",
            "GITHUB_OUTPUT": "/github/file_commands/output", "RUNNER_ENVIRONMENT": "self-hosted",
            **{f"INPUT_{k.upper()}": v for k, v in values.items()},  # hyphens kept, as the runner does
        }
        args = ["docker", "run", "--rm", "--network", "host", "--workdir", "/github/workspace",
                "-v", f"{self.workspace}:/github/workspace", "-v", f"{step / 'workflow'}:/github/workflow",
                "-v", f"{step / 'file_commands'}:/github/file_commands", "-v", f"{step / 'home'}:/github/home"]
        for key, value in env.items():
            args += ["-e", f"{key}={value}"]
        started = time.monotonic()
        done = _sh([*args, self.image], RUN_TIMEOUT_S)
        print(f"\naction run {self.count} ({values['model']}): exit {done.returncode}, "
              f"{time.monotonic() - started:.0f} s")
        with self.fake.lock:
            comments = [dict(c) for cs in self.fake.comments.values() for c in cs]
            requests = [(r.method, r.path) for r in self.fake.requests]
        return ActionRun(
            code=done.returncode, log=done.stdout + done.stderr,
            outputs=_parse_outputs((step / "file_commands" / "output").read_text()),
            summary=(step / "file_commands" / "summary").read_text(), comments=comments, requests=requests,
        )


def _git_base_commit(workspace: Path, paths: list[str]) -> str:
    """git init + one commit of ``paths`` (checkpoints stay untracked); returns the commit id."""
    env = dict(os.environ, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    for args in (["init", "-q", "-b", "main"], ["add", "--", *paths], ["commit", "-q", "-m", "base"]):
        done = _sh(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], 60, cwd=workspace, env=env)
        assert done.returncode == 0, done.stderr
    return _sh(["git", "rev-parse", "HEAD"], 60, cwd=workspace, env=env).stdout.strip()


@pytest.fixture(scope="module")
def pr_flow(image, tmp_path_factory):
    """A PR's life: the regressed checkpoint, then the harmless fix pushed to the same PR. (A
    re-run of the same checkpoint edits the comment the same way as the fix's run: one run of the
    image less; tests/test_action_events.py re-runs the action in process.)"""
    for need in ("gatekeeper.yaml", ".gatekeeper/baselines/demo.json.gz", "checkpoints/regressed/config.json"):
        if not (DEMO / need).is_file():
            pytest.fail(f"examples/{need} (part of the demo) is missing")
    root = tmp_path_factory.mktemp("action")
    workspace = root / "workspace"
    shutil.copytree(DEMO, workspace / "examples", ignore=shutil.ignore_patterns("__pycache__", "out"))
    # A repository may contain a `gatekeeper/` folder of its own; it must not shadow the
    # installed package (the container's cwd is the workspace).
    (workspace / "gatekeeper").mkdir()
    (workspace / "gatekeeper" / "__init__.py").write_text("raise SystemExit('shadowed by the workspace')\n")
    # On pull requests the action reads the baseline and policy at the PR's base commit with git
    # inside the container, so the workspace is a repository whose base commit holds them.
    base_sha = _git_base_commit(workspace, ["examples/gatekeeper.yaml", "examples/tasks", "examples/.gatekeeper"])
    fake = FakeGitHub(REPO_NAME).start()
    try:
        runner = Runner(image, root, fake)
        event = _pr_event(7)
        event["pull_request"]["base"]["sha"] = base_sha
        runs = [
            runner.run("pull_request", event, suite=SUITE, model="examples/checkpoints/regressed"),
            runner.run("pull_request", event, suite=SUITE, model="examples/checkpoints/harmless"),
        ]
        yield runs, fake, workspace
    finally:
        fake.stop()


def test_regressed_checkpoint_fails_the_pr_with_one_comment(pr_flow):
    (first, _), fake, workspace = pr_flow
    assert first.code == 1, first.log[-4000:]
    assert len(first.comments) == 1
    body = first.comments[0]["body"]
    assert REGRESSED_TASK in body.replace("\\_", "_")  # markdown-escaped in the comment
    assert "gatekeeper:sticky" in body
    assert first.outputs["verdict"] == "fail"
    assert int(first.outputs["regressions"]) >= 1
    assert first.outputs["comment-url"] == first.comments[0]["html_url"]
    report = workspace / first.outputs["report-json"]  # workspace-relative, valid on the host too
    assert json.loads(report.read_text())["verdict"] == "fail"
    assert REGRESSED_TASK in first.summary.replace("\\_", "_")
    assert any(ln.startswith("::error") and REGRESSED_TASK in ln for ln in first.log.splitlines())
    # The token is masked first thing and never printed otherwise.
    assert [ln for ln in first.log.splitlines() if TOKEN in ln] == [f"::add-mask::{TOKEN}"]
    assert not fake.errors, fake.errors


def test_harmless_fix_passes_and_turns_the_comment_green(pr_flow):
    (first, fix), fake, _ = pr_flow
    assert fix.code == 0, fix.log[-4000:]
    assert fix.outputs["verdict"] == "pass" and fix.outputs["regressions"] == "0"
    # the sticky comment: found and edited in place, never a second one
    assert len(fix.comments) == 1 and fix.comments[0]["id"] == first.comments[0]["id"]
    assert ("PATCH", f"/repos/{REPO_NAME}/issues/comments/{first.comments[0]['id']}") in fix.requests
    assert sum(m == "POST" and p.endswith("/issues/7/comments") for m, p in fix.requests) == 1
    assert fix.comments[0]["body"] != first.comments[0]["body"]
    assert not fake.errors, fake.errors
