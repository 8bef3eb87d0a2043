"""Task names: a typo gets a "did you mean" from the suite's own tasks first, and lm-eval's bundled
tasks are indexed once, cached, not on every run (issue #17, item 5)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed")


def _suite_with(tmp_path: Path, old: str, new: str) -> tuple[Path, int]:
    demo = tmp_path / "demo"
    shutil.copytree(ROOT / "examples", demo, ignore=shutil.ignore_patterns("checkpoints"))
    suite = demo / "gatekeeper.yaml"
    text = suite.read_text()
    assert f"- name: {old}\n" in text
    suite.write_text(text.replace(f"- name: {old}\n", f"- name: {new}\n", 1))
    line = next(i for i, s in enumerate(suite.read_text().splitlines(), 1) if s.strip() == f"- name: {new}")
    return suite, line


_BUILT: list[Path] = []  # the index the first test built: later tests start from a copy (~12 s each)


def _seed(cache: Path) -> None:
    """Give ``cache`` the index an earlier test built, where one did (else the test builds it)."""
    for built in _BUILT[:1]:
        (cache / "gatekeeper").mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, cache / "gatekeeper" / built.name)


def _gate(suite: Path, cache: Path) -> subprocess.CompletedProcess:
    """The demo gated with ``cache`` as XDG_CACHE_HOME. Each such gate starts cold: a server of
    that environment (tests/warm_start.py) bought nothing (13.9 s of CPU with one, 13.5 without),
    since a name typo stops the gate before it loads a model."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "gatekeeper", "gate", "--suite", str(suite), "--model",
                           str(ROOT / "examples" / "checkpoints" / "base"), "--out", str(suite.parent / "out")],
                          capture_output=True, text=True, env=env, timeout=600, cwd=suite.parent)


def test_typo_names_the_line_and_suggests_the_suites_own_task(tmp_path: Path) -> None:
    suite, line = _suite_with(tmp_path, "demo_arith_gen", "demo_arith_gne")
    cache = tmp_path / "cache"
    r = _gate(suite, cache)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"gatekeeper.yaml:{line}: tasks[1].name: task 'demo_arith_gne' is not in include_path " in r.stderr
    assert r.stderr.rstrip().endswith("bundled tasks; did you mean 'demo_arith_gen'?"), r.stderr
    assert "Traceback" not in r.stderr
    (built,) = (cache / "gatekeeper").glob("lm-eval-tasks-*.json")  # indexed once, kept
    _BUILT.append(built)


def test_the_cached_index_is_what_later_runs_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gatekeeper.files import cached_json
    from gatekeeper.results import taskindex

    suite, _ = _suite_with(tmp_path, "demo_arith_gen", "hellaswg")
    cache = tmp_path / "cache"
    _seed(cache)
    first = _gate(suite, cache)
    assert first.returncode == 2 and "did you mean one of 'hellaswag'" in first.stderr, first.stderr
    (index,) = (cache / "gatekeeper").glob("lm-eval-tasks-*.json")
    data = json.loads(index.read_text())
    assert data["names"]["hellaswag"] == {"kind": "task", "folders": ["hellaswag"]}
    # A name only the cache knows is known: later runs read the cache, not lm-eval's tree (the
    # gate's "did you mean" above comes from this same function; here in-process, a gate less).
    data["names"]["hellaswgg"] = {"kind": "task", "folders": ["hellaswag"]}
    index.write_text(json.dumps(data))
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    assert "hellaswgg" in taskindex.bundled_index()
    # A corrupt cache is made again, never an error (the helper the index is kept by; making the
    # whole index again is what the first test timed).
    index.write_text("{not json")
    assert cached_json(index, lambda d: isinstance(d, dict), lambda: {"made": 1}) == {"made": 1}
    assert json.loads(index.read_text()) == {"made": 1}


def test_a_bundled_task_indexes_only_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gatekeeper.results import taskindex

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    _seed(tmp_path)
    tm = taskindex.task_manager({}, ROOT / "examples" / "tasks", ["boolq", "demo_arith_mc"], {})
    assert "boolq" in tm.all_tasks and "demo_arith_mc" in tm.all_tasks
    assert len(tm.all_tasks) < 100, "the whole bundled tree was indexed"
    # A bundled group indexes its own folder, and its members' where they live elsewhere (pythia
    # lists arc, lambada, mmlu, ...), followed down nested groups: every member the whole index
    # knows is known, at a fraction of it.
    from lm_eval.tasks import TaskManager

    whole = TaskManager(include_defaults=True)
    for name in ("mmlu", "pythia", "multimedqa"):
        group = taskindex.task_manager({}, None, [name], {})
        members = taskindex._group_members(whole, [name])
        assert len(members) > 3 and all(m in group.all_tasks for m in [name, *members] if m in whole.all_tasks), name
        assert len(group.all_tasks) < len(whole.all_tasks) / 3, (name, len(group.all_tasks))


def test_a_cached_index_that_names_a_folder_outside_lm_eval_is_made_again(tmp_path: Path) -> None:
    """The index's folders are indexed for task files: one that is not a folder of lm-eval's own
    tasks (an absolute path, '..', a nested path: a damaged file, or one someone else wrote) would
    load task files lm-eval does not ship, so such a cache is never used."""
    from gatekeeper.results import taskindex

    tasks_dir = taskindex._tasks_dir()
    good = {"hellaswag": {"kind": "task", "folders": ["hellaswag"]}, "tag_x": {"kind": "tag", "folders": []}}
    assert taskindex._valid(good, tasks_dir)
    (tmp_path / "evil").mkdir()
    for bad in (str(tmp_path / "evil"), "..", "../tasks", "hellaswag/../..", "", ".", "no_such_folder", 3, ["x"]):
        assert not taskindex._valid({**good, "x": {"kind": "task", "folders": [bad]}}, tasks_dir), bad
    for bad_entry in ({"kind": "task"}, {"kind": "macro", "folders": []}, ["hellaswag"], None):
        assert not taskindex._valid({**good, "x": bad_entry}, tasks_dir), bad_entry
    assert not taskindex._valid(["hellaswag"], tasks_dir)
