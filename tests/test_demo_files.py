"""The demo's committed files agree with the demo suite, and hold nothing a test left behind
(issue #27: the committed history held 10 gates from test runs).

- examples/.gatekeeper/baselines/ holds the baseline only (scripts/make_demo_checkpoints.py
  records it): no history, anchor or earlier baselines; a user's first gate starts the history.
- tests/fixtures/demo-regressed-run/ (scripts/update_readme.py keeps it) is a run of the current
  suite: its manifest records the suite's hash and task specs, margins included.
- The stored baseline is of the current suite.
conftest.py also checks, at the end of every test session, that no test changed examples/."""

from __future__ import annotations

import json
from pathlib import Path

from gatekeeper.baseline import store
from gatekeeper.suite.suite import load_suite

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "examples" / "gatekeeper.yaml"
FIXTURE = ROOT / "tests" / "fixtures" / "demo-regressed-run" / "gatekeeper-manifest.json"


def test_the_demo_baseline_folder_holds_the_baseline_only() -> None:
    folder = ROOT / "examples" / ".gatekeeper" / "baselines"
    assert sorted(p.name for p in folder.iterdir()) == ["demo.json.gz"]


def test_the_readme_fixture_is_a_run_of_the_current_suite() -> None:
    suite = load_suite(SUITE)
    manifest = json.loads(FIXTURE.read_text())
    assert manifest["suite_hash"] == suite.hash, "re-run: python scripts/update_readme.py"
    assert manifest["tasks"] == [t.portable() for t in suite.tasks], "re-run: python scripts/update_readme.py"


def test_the_stored_baseline_is_of_the_current_suite() -> None:
    suite = load_suite(SUITE)
    stored = store.load_baseline(suite.baseline_path)
    assert stored.provenance.manifest["suite_hash"] == suite.hash
