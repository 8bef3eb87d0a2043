"""The round-6 first-run list (issue #58): no write on an exit 2, no dead end after a data
change with an anchor pinned, and messages that say what actually happened.

Each case replays what a new user did, on a copy of the demo project (its recorded baseline and
the stored regressed run in tests/fixtures/demo-regressed-run)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gatekeeper.suite.taskcode import describe_changes
from tests.demo_runs import lm_eval_installed

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "tests" / "fixtures" / "demo-regressed-run"
ENV = {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1", "GITHUB_ACTOR": "first-run"}
FRESH = shutil.ignore_patterns("checkpoints", "*.trend.jsonl", "*.anchor.json.gz", "history", "__pycache__",
                               ".gatekeeper-work")


def _gk(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gatekeeper", *map(str, args)], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    shutil.copytree(ROOT / "examples", root, ignore=FRESH)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    return root


def _snapshot(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("gatekeeper: error:")]
    return line


CONFLICTED = """<<<<<<< HEAD
{"date": "2026-12-01"}
=======
{"date": "2026-12-02"}
>>>>>>> nightly
"""


@pytest.mark.parametrize("command", [("baseline", "promote", RUN), ("baseline", "pin", "--current",
                                                                     "--reason", "a new reference")])
def test_promote_and_pin_change_no_file_when_the_history_is_merge_conflicted(project: Path, command) -> None:
    store = project / ".gatekeeper" / "baselines"
    (store / "demo.trend.jsonl").write_text('{"format": "gatekeeper-trend", "version": 1, "summary": {}}\n'
                                            + CONFLICTED)
    before = _snapshot(store)
    line = _one_error(_gk(*command, "--suite", "gatekeeper.yaml", cwd=project))
    assert "demo.trend.jsonl:2: a git merge-conflict marker" in line, line
    assert "mend the file first (nothing was changed)" in line and "--no-history" not in line
    assert _snapshot(store) == before  # before: the baseline was replaced, history/ and the anchor written


def test_a_merge_conflicted_baseline_says_so(project: Path) -> None:
    path = project / ".gatekeeper" / "baselines" / "demo.json.gz"
    raw = path.read_bytes()
    path.write_bytes(b"<<<<<<< HEAD\n" + raw + b"\n=======\n" + raw + b"\n>>>>>>> nightly\n")
    line = _one_error(_gk("compare", path, RUN, "--suite", "gatekeeper.yaml", cwd=project))
    assert "holds git merge-conflict markers" in line and "git checkout --ours" in line, line


def test_a_sequential_folder_is_refused_at_once_with_what_to_store(project: Path, tmp_path: Path) -> None:
    seq = tmp_path / "seq"
    for k in (1, 2):
        look = seq / f"look-{k}" / "base"
        shutil.copytree(RUN, look)
        manifest = json.loads((look / "gatekeeper-manifest.json").read_text())
        manifest["look"] = {"index": k, "of": 4, "seed": 0}
        (look / "gatekeeper-manifest.json").write_text(json.dumps(manifest))
    before = _snapshot(project / ".gatekeeper")
    line = _one_error(_gk("baseline", "promote", seq, "--suite", "gatekeeper.yaml", cwd=project))
    assert "a sequential gate's folder (2 look(s), each a sample of the items) is never a baseline" in line, line
    assert f"gatekeeper run --complete {seq} --suite gatekeeper.yaml" in line and "pass one of them" not in line
    assert _snapshot(project / ".gatekeeper") == before


def test_a_data_file_edit_is_named_as_data() -> None:
    assert describe_changes(["tasks/data/capitals.jsonl"]) == \
        "data file tasks/data/capitals.jsonl changed since the baseline"
    assert describe_changes(["tasks/utils.py", "tasks/data/a.jsonl", "tasks/data/b.csv"]) == \
        "data files tasks/data/a.jsonl, tasks/data/b.csv and task code tasks/utils.py changed since the baseline"


@pytest.mark.lmeval
@pytest.mark.skipif(not lm_eval_installed(), reason="lm-eval is not installed")
def test_the_documented_data_change_path_works_with_an_anchor_pinned(project: Path, tmp_path: Path) -> None:
    """suite.md: edit the data, `run --new-data`, `baseline promote`. With an anchor pinned, every
    later gate used to exit 2 ("fix: run --new-data, then promote": the same advice again). Now the
    promotion says the anchor measured other items and drops it; the next gate passes."""
    model = ROOT / "examples" / "checkpoints" / "base"
    pinned = _gk("baseline", "pin", "--current", "--suite", "gatekeeper.yaml", "--reason", "release 1", cwd=project)
    assert pinned.returncode == 0, pinned.stderr[-2000:]
    data = project / "tasks" / "data" / "capitals.jsonl"
    rows = [json.loads(x) for x in data.read_text().splitlines()]
    rows[0]["country"] = "Refenoria"  # a country renamed: one document changes
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    stale = _gk("gate", "--suite", "gatekeeper.yaml", "--model", model, "--dry-run", cwd=project)
    line = _one_error(stale)
    assert "data file tasks/data/capitals.jsonl changed since the baseline" in line, line
    assert "task code" not in line and "predates recorded dataset revisions" not in line

    # The new baseline is a run of the harmless checkpoint: its values differ from the old baseline's
    # on every machine (a rerun of base equals it to the bit only where the demo was recorded), so the
    # old one, archived in history/, is a second run of other items, which plan must not take.
    run = _gk("run", "--suite", "gatekeeper.yaml", "--model", ROOT / "examples" / "checkpoints" / "harmless",
              "--out", tmp_path / "new", "--new-data", cwd=project)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    (run_dir,) = [p for p in (tmp_path / "new").iterdir() if p.is_dir()]
    promoted = _gk("baseline", "promote", run_dir, "--suite", "gatekeeper.yaml", cwd=project)
    assert promoted.returncode == 0, promoted.stdout[-2000:] + promoted.stderr[-2000:]
    assert "promote: the anchor demo.anchor.json.gz cannot be compared with this run" in promoted.stdout
    assert "data file tasks/data/capitals.jsonl changed since the anchor" in promoted.stdout
    assert not (project / ".gatekeeper" / "baselines" / "demo.anchor.json.gz").exists()

    gate = _gk("gate", "--suite", "gatekeeper.yaml", "--run", run_dir, "--no-history", cwd=project)
    assert gate.returncode == 0, gate.stdout[-2000:] + gate.stderr[-2000:]


def test_compare_with_another_suites_file_names_the_suite_not_promote(project: Path) -> None:
    other = project / "other.yaml"
    other.write_text((project / "gatekeeper.yaml").read_text().replace("name: demo", "name: other", 1))
    line = _one_error(_gk("compare", RUN, RUN, "--suite", other, cwd=project))
    assert "belongs to suite 'demo', not 'other'" in line and "pass that suite's file with --suite" in line, line
    assert "promote" not in line


def test_group_share_with_bh_is_said_not_silently_ignored(project: Path) -> None:
    from gatekeeper.suite.suite import load_policy, load_suite

    suite = project / "gatekeeper.yaml"
    suite.write_text(suite.read_text().replace("  correction: holm\n", "  correction: bh\n  group_share: 0.3\n"))
    (warning,) = load_suite(suite).policy.warnings
    assert "group_share is ignored with correction: bh" in warning
    policy = project / "policy.yaml"
    policy.write_text("correction: bh\ngroup_share: 0.3\n")
    assert "group_share is ignored with correction: bh" in load_policy(policy).warnings[0]
    policy.write_text("correction: bh\n")
    assert load_policy(policy).warnings == []
