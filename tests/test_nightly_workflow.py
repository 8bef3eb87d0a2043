"""docs/workflows/nightly.yml on three consecutive schedule events with a drifting model (#15).

The workflow's steps run as a runner runs them (tests/test_fork_split.py's ``Runner``: the action
step as ``python -m gatekeeper.action`` with its inputs, the commit step with bash as the runner's
user) on a repository whose ``origin`` is a bare repository, against the loopback GitHub. Each
night's model (scripts/make_drift_checkpoints.py) is a little worse than the night before and
within the margin of it, so the first two nights pass and are promoted and pushed with their
history; the third is beyond the margin since the anchor: verdict ``drift``, the job fails, the
tracking issue opens with the trend chart in it, and the night's history is still pushed.

The suite's capitals margin is 0.12 here (the demo's 0.02 cannot be resolved by its 200 items
night over night: such nights read "inconclusive", are never promoted, and the drop then fails
against the unmoved baseline as a plain regression).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.github_server import FakeGitHub
from tests.test_fork_split import ROOT, Runner, _own, _steps, _workspace, git

pytestmark = pytest.mark.lmeval


@pytest.fixture(scope="module")
def nights(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("nightly-models")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_drift_checkpoints.py"), "--out", str(out),
                           "--nights", "5", "--step", "0.1"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [out / "night2", out / "night4", out / "night5"]


def test_nightly_promotes_two_green_nights_and_opens_the_tracking_issue_on_drift(
        nights: list[Path], gh: FakeGitHub) -> None:
    # Under /tmp, traversable: the commit step runs as the runner's user, as on a self-hosted runner.
    home = Path(tempfile.mkdtemp(prefix="gatekeeper-nightly-"))
    home.chmod(0o755)
    try:
        _three_nights(home, nights, gh)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _three_nights(home: Path, nights: list[Path], gh: FakeGitHub) -> None:
    ws, _ = _workspace(home / "ws")
    suite = ws / "gatekeeper.yaml"
    suite.write_text(suite.read_text().replace("{metric: acc, filter: none, margin: 0.02}",
                                               "{metric: acc, filter: none, margin: 0.12}"))
    git(ws, "commit", "-q", "-am", "capitals margin 0.12")
    origin = home / "origin.git"
    git(home, "init", "-q", "--bare", str(origin))
    git(ws, "remote", "add", "origin", str(origin))
    git(ws, "push", "-q", "-u", "origin", "main")  # actions/checkout leaves main tracking origin/main
    _own(home)
    payload = {"schedule": "17 3 * * *", "repository": {"full_name": "octo/repo", "default_branch": "main"}}
    verdicts = []
    for n, model in enumerate(nights, start=1):
        target = ws / "checkpoints" / "nightly"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(model, target)  # tonight's checkpoint, as the training job leaves it
        _own(ws)
        runner = Runner(ws, "schedule", payload, gh.url, sha=git(ws, "rev-parse", "HEAD"),
                        context={"vars.GATEKEEPER_NIGHTLY_MODEL": "checkpoints/nightly"})
        (home / "summary.md").write_text("")
        runner.job(_steps("nightly.yml"), home / "artifacts")
        gate, commit = runner.results
        verdicts.append(runner.outputs.get("steps.gate.outputs.verdict"))
        assert commit.returncode == 0, commit.stdout + commit.stderr  # the night's history is kept
        assert git(origin, "log", "-1", "--format=%s", "main") == f"gatekeeper: nightly {verdicts[-1]} (run 777)"
        pushed = git(origin, "ls-tree", "--name-only", "main", ".gatekeeper/baselines/")
        assert "demo.trend.jsonl" in pushed, pushed
        summary = (home / "summary.md").read_text()
        if n < 3:
            assert gate.returncode == 0 and not runner.failed, gate.stdout[-3000:]
            assert "promoted this run as the new baseline" in gate.stdout
            assert "demo.anchor.json.gz" in pushed  # the first promotion kept the approved baseline
            assert not [i for i in gh.issues.values() if i["state"] == "open"]
    assert verdicts == ["pass", "pass", "drift"], verdicts
    assert gate.returncode == 1 and runner.failed
    assert "promote-on-green: not promoted: it drifted" in gate.stdout
    assert "xychart-beta" in summary and "#### Trend" in summary
    (issue,) = [i for i in gh.issues.values() if i["state"] == "open"]
    assert issue["title"] == "gatekeeper: nightly drift since the anchor in suite demo"
    assert "each night passed against the night before" in issue["body"]
    assert "xychart-beta" in issue["body"] and "Against the anchor of" in issue["body"]
