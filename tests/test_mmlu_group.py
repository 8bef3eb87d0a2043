"""lm-eval's bundled ``mmlu`` group as a user runs it (issue #41), end to end: the loopback hub
serves a stand-in of its dataset (57 subject configs, 3 test and 5 dev items each), the suite is
docs/suite.md's MMLU example (5 shots, ``subtasks: info``, acc margin 0.01). One power figure per
row in the gate, ``gatekeeper plan`` and the dry run, on a failing gate's rows too; a log a
person can read (lm-eval's ~900 "Combined length" warnings were one line each)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.demo_runs import ROOT, lm_eval_installed
from tests.hub_server import Hub, hub_env
from tests.test_doc_blocks import _hub_repos

SUITE = """name: mm
lm_eval_version: "0.4.13"
tasks:
  - name: mmlu
    num_fewshot: 5
    subtasks: info
    metrics:
      - {metric: acc, margin: 0.01}
"""


def _gk(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gatekeeper", *args], cwd=cwd, env={**env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=600)


@pytest.mark.lmeval
@pytest.mark.skipif(not lm_eval_installed(), reason="lm-eval is not installed")
def test_the_mmlu_group_gates_with_one_power_figure_and_a_short_log(tmp_path: Path) -> None:
    """End to end: three real lm-eval runs of the 57-subject group (record, gate, dry run)."""
    hub = Hub(_hub_repos(tmp_path / "hub")).start()
    project = tmp_path / "project"
    project.mkdir()
    (project / "gatekeeper.yaml").write_text(SUITE)
    env = hub_env(hub, tmp_path / "hf-home", own_server=True)
    base, regressed = str(ROOT / "examples/checkpoints/base"), str(ROOT / "examples/checkpoints/regressed")
    try:
        record = _gk("gate", "--suite", "gatekeeper.yaml", "--model", base, "--record-missing", cwd=project, env=env)
        assert record.returncode == 0, record.stdout[-3000:] + record.stderr[-3000:]
        gate = _gk("gate", "--suite", "gatekeeper.yaml", "--model", regressed, "--json", "report.json",
                   cwd=project, env=env)
        assert gate.returncode in (0, 1), gate.stdout[-3000:] + gate.stderr[-3000:]
        dry = _gk("gate", "--suite", "gatekeeper.yaml", "--model", regressed, "--dry-run", cwd=project, env=env)
        assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
        plan = _gk("plan", "--suite", "gatekeeper.yaml", "--format", "json", cwd=project, env=env)
        assert plan.returncode == 0, plan.stderr[-3000:]
    finally:
        hub.stop()
    # a log a person reads: lm-eval's repeated warnings once each, the table, the verdict
    for proc in (record, gate):
        log = proc.stdout + proc.stderr
        assert log.count("Combined length of context") <= 2, log[-3000:]
        assert len(log.splitlines()) < 260, len(log.splitlines())
    # one figure per row: plan's, in the gate's report and warning and in the dry run
    rows = {m["task"]: m for m in json.loads(plan.stdout)["metrics"]}
    assert set(rows) == {"mmlu", "mmlu_humanities", "mmlu_other", "mmlu_social_sciences", "mmlu_stem"}
    report = json.loads((project / "report.json").read_text())
    gated = {c["task"]: c for c in report["comparisons"] if c["gated"]}
    assert set(gated) == set(rows)
    unresolved = [t for t, r in sorted(rows.items()) if r["resolves"] is False]
    assert unresolved  # 171 items cannot resolve one point
    (said,) = [w for w in report["warnings"] if "cannot resolve" in w]
    for task, r in rows.items():
        assert gated[task]["mde"] == pytest.approx(r["mde"], rel=1e-12), task
        line = next(x for x in dry.stdout.splitlines() if x.startswith(f"  {task} acc (none): "))
        assert f"a drop of {r['mde']:.3g} is caught 4 times in 5" in line, line
        if task in unresolved:
            assert f"{task} acc: margin 0.01, MDE {r['mde']:.3g}, smallest margin about" in said
            assert "does not resolve" in line
    assert said in gate.stdout
    assert not re.search(r"can resolve: a drop must reach", gate.stdout)  # the pair's own figure is gone
