"""Groups gated on real lm-eval runs (issue #24): a nested group with both weightings.

``demo_all`` holds the demo's ``demo_mc`` group (acc weighted by size) and ``demo_arith_gen``, with
``acc`` weighted by size and ``exact_match`` unweighted; it is one group YAML in the suite's
include_path, the way a team writes "one decision for several benchmarks". The base and regressed
demo checkpoints are evaluated by lm-eval through ``gatekeeper run``; every group row's values
must be lm-eval's own group scores, every level is gated in one family, and each group's row
comes before its subtasks'."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.demo_runs import OFFLINE_ENV, lm_eval_installed

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
ENV = {**os.environ, **OFFLINE_ENV, "PYTHONPATH": str(ROOT)}

pytestmark = pytest.mark.skipif(not lm_eval_installed(), reason="lm-eval is not installed (pip install -e '.[eval]')")

GROUP = """\
group: demo_all
task:
  - demo_mc
  - demo_arith_gen
aggregate_metric_list:
  - metric: acc
    aggregation: mean
    weight_by_size: true
  - metric: exact_match
    aggregation: mean
    weight_by_size: false
    filter_list: [strict-match]
metadata:
  version: 1.0
"""

SUITE = """\
name: all
lm_eval_version: "0.4.13"
include_path: tasks
model: {backend: hf, dtype: float32, batch_size: 16, device: cpu}
seeds: {random: 1234, numpy: 1234, torch: 1234, fewshot: 1234}
policy: {alpha: 0.05, correction: holm, margin: 0.0}
tasks:
  - name: demo_all
    num_fewshot: 0
    metrics:
      - {metric: acc, margin: 0.02}
      - {metric: exact_match, filter: strict-match, margin: 0.02}
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("groups")
    shutil.copytree(EXAMPLES / "tasks", root / "tasks", ignore=shutil.ignore_patterns("__pycache__", "demo_synth*"))
    (root / "tasks" / "demo_all.yaml").write_text(GROUP)
    (root / "gatekeeper.yaml").write_text(SUITE)
    for name in ("base", "regressed"):
        proc = _gk("run", "--suite", "gatekeeper.yaml", "--model", str(EXAMPLES / "checkpoints" / name),
                   "--out", f"runs/{name}", cwd=root)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return root


def _gk(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gatekeeper", *args], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=900)


def test_nested_groups_are_gated_at_every_level_with_lm_evals_values(project: Path) -> None:
    proc = _gk("compare", "runs/base", "runs/regressed", "--suite", "gatekeeper.yaml", "--json", "r.json",
               "--markdown", "r.md", cwd=project)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = json.loads((project / "r.json").read_text())
    rows = {(c["task"], c["metric"], c["filter"]): c for c in report["comparisons"]}
    for (name, metric, filt), weighted in ((("demo_all", "acc", "none"), True),
                                           (("demo_all", "exact_match", "strict-match"), False),
                                           (("demo_mc", "acc", "none"), True)):
        row = rows[(name, metric, filt)]
        assert row["kind"] == "group" and row["weight_by_size"] is weighted and row["gated"]
        for side in ("baseline", "candidate"):
            reported = report["groups"][name][side][f"{metric},{filt}"]
            assert row[side] == pytest.approx(reported, rel=1e-12, abs=1e-15), (name, metric, side)
    assert rows[("demo_all", "acc", "none")]["subtasks"] == ["demo_arith_mc", "demo_capitals_mc"]
    assert rows[("demo_all", "acc", "none")]["test"] == "mcnemar-midp"  # right/wrong, weighted by size
    assert rows[("demo_all", "exact_match", "strict-match")]["subtasks"] == ["demo_arith_gen"]
    # Both levels of the group fail with the capitals subtask; the unweighted exact_match is unchanged.
    regressed = {k[:2] for k, c in rows.items() if c["verdict"] == "regressed" and c["gated"]}
    assert regressed == {("demo_all", "acc"), ("demo_mc", "acc"), ("demo_capitals_mc", "acc")}
    assert rows[("demo_all", "exact_match", "strict-match")]["verdict"] == "unchanged"
    # One family, the outer group's rows first at half of alpha (compare/family.py); the nested
    # group and the subtasks share the rest, and the p shown is adjusted under that design.
    gated = [c for c in report["comparisons"] if c["gated"]]
    assert (f"group rows first: 2 group rows at half of alpha, the other {len(gated) - 2} gated rows share the rest"
            in (project / "r.md").read_text())
    shares = {(c["task"], c["metric"]): c["alpha_share"] for c in gated}
    assert shares[("demo_all", "acc")] == shares[("demo_all", "exact_match")] == 0.25
    assert sum(shares.values()) == pytest.approx(1.0)
    # Each group's rows before its subtasks', the nested group inside the outer one.
    order = [c["task"] for c in report["comparisons"]]
    assert order.index("demo_all") < order.index("demo_mc") < order.index("demo_arith_mc")
    assert "demo_all (group of 2, by size)" in proc.stdout and "    demo_capitals_mc" in proc.stdout


def test_subtasks_info_gates_the_group_alone(project: Path) -> None:
    suite = project / "info.yaml"
    suite.write_text(SUITE.replace("  - name: demo_all\n", "  - name: demo_all\n    subtasks: info\n"))
    proc = _gk("compare", "runs/base", "runs/regressed", "--suite", "info.yaml", "--json", "info.json", cwd=project)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = json.loads((project / "info.json").read_text())
    gated = {(c["task"], c["metric"]) for c in report["comparisons"] if c["gated"]}
    assert gated == {("demo_all", "acc"), ("demo_all", "exact_match"), ("demo_mc", "acc")}
    assert {c["verdict"] for c in report["comparisons"] if c["task"] == "demo_capitals_mc"} == {"regressed"}


def test_a_run_without_the_groups_weighting_is_derived_and_checked(project: Path, tmp_path: Path) -> None:
    """lm-eval's own output (no gatekeeper manifest): the weighting is the one that reproduces the
    reported score; an edited score is an error naming the group."""
    for name in ("base", "regressed"):
        shutil.copytree(project / "runs" / name, tmp_path / name)
        for manifest in (tmp_path / name).rglob("gatekeeper-manifest.json"):
            manifest.unlink()
    proc = _gk("compare", str(tmp_path / "base"), str(tmp_path / "regressed"), "--suite", "gatekeeper.yaml",
               "--json", str(tmp_path / "r.json"), cwd=project)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    rows = {(c["task"], c["metric"]): c for c in json.loads((tmp_path / "r.json").read_text())["comparisons"]}
    assert rows[("demo_all", "acc")]["weight_by_size"] is True  # 225 and 200 items: only by size reproduces it
    assert rows[("demo_all", "acc")]["baseline"] == pytest.approx(0.96, abs=1e-12)
    (results,) = (tmp_path / "regressed").rglob("results_*.json")
    data = json.loads(results.read_text())
    data["groups"]["demo_all"]["acc,none"] += 0.01
    data["results"]["demo_all"]["acc,none"] += 0.01
    results.write_text(json.dumps(data))
    proc = _gk("compare", str(tmp_path / "base"), str(tmp_path / "regressed"), "--suite", "gatekeeper.yaml",
               cwd=project)
    assert proc.returncode == 2 and "group demo_all: acc,none is reported as" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
