"""`gatekeeper compare` as a user runs it: real lm-eval output, real subprocesses, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lmeval_fixtures import *  # noqa: F403
from tests.lmeval_fixtures import results_path

# Runs the CLI with torch, transformers and lm_eval made unimportable: the gate must not need them.
NO_TORCH = (
    "import sys\n"
    "class Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] in ('torch', 'transformers', 'lm_eval', 'datasets'):\n"
    "            raise ImportError(f'blocked for this test: {name}')\n"
    "sys.meta_path.insert(0, Block())\n"
    "from gatekeeper.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def gk(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_TORCH, *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_compare_same_run_passes_without_torch(lmeval_runs, tmp_path):
    good = lmeval_runs["good"]
    out = tmp_path / "r.json"
    md = tmp_path / "r.md"
    proc = gk("compare", str(good), str(good), "--json", str(out), "--markdown", str(md))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["verdict"] == "pass"
    assert {c["verdict"] for c in data["comparisons"]} == {"unchanged"}
    tasks = {c["task"] for c in data["comparisons"]}
    assert {"arith_mc", "arith_gen", "synth_ppl"} <= tasks
    filters = {c["filter"] for c in data["comparisons"] if c["task"] == "arith_gen"}
    assert len(filters) == 2  # the fixture task has two filters
    assert md.read_text().startswith("### ✅")
    assert proc.stdout.strip().splitlines()[-1].startswith("PASS: ")


def test_compare_results_file_and_model_subfolder_forms(lmeval_runs):
    good = lmeval_runs["good"]
    res = results_path(good)
    proc = gk("compare", str(res), str(res.parent))
    assert proc.returncode == 0, proc.stderr


def test_compare_different_models_exit_code_matches_json(lmeval_runs, tmp_path):
    out = tmp_path / "r.json"
    proc = gk("compare", str(lmeval_runs["good"]), str(lmeval_runs["bad"]), "--json", str(out))
    assert proc.returncode in (0, 1), proc.stderr
    data = json.loads(out.read_text())
    assert proc.returncode == (1 if data["verdict"] == "fail" else 0)
    assert data["regressions"] == sum(c["gated"] and c["verdict"] == "regressed" for c in data["comparisons"])


@pytest.mark.parametrize(
    "args, needle",
    [
        (["compare", "/nonexistent/a", "/nonexistent/b"], "/nonexistent/a"),
        (["compare", "GOOD", "GOOD", "--alpha", "2"], "alpha"),
        (["compare", "GOOD", "GOOD", "--policy", "/nonexistent/policy.yaml"], "policy.yaml"),
        (["compare", "GOOD"], "required"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_exit_2(lmeval_runs, args, needle):
    args = [str(lmeval_runs["good"]) if a == "GOOD" else a for a in args]
    proc = gk(*args)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert needle in proc.stderr
    assert len([ln for ln in proc.stderr.splitlines() if ln.startswith("gatekeeper")]) == 1


def test_bad_policy_file_names_file(lmeval_runs, tmp_path):
    pol = tmp_path / "policy.yaml"
    pol.write_text("alpha: 0.05\ncorrection: tukey\n")
    proc = gk("compare", str(lmeval_runs["good"]), str(lmeval_runs["good"]), "--policy", str(pol))
    assert proc.returncode == 2
    assert str(pol) in proc.stderr and "correction" in proc.stderr


def test_policy_file_marks_metrics_informational(lmeval_runs, tmp_path):
    pol = tmp_path / "policy.yaml"
    pol.write_text("policy:\n  margin: 0.5\n  rules:\n    - {metric: acc_norm, gate: false}\n")
    out = tmp_path / "r.json"
    proc = gk("compare", str(lmeval_runs["good"]), str(lmeval_runs["bad"]), "--policy", str(pol), "--json", str(out))
    assert proc.returncode in (0, 1), proc.stderr
    rows = json.loads(out.read_text())["comparisons"]
    assert all(not r["gated"] for r in rows if r["metric"] == "acc_norm")
    assert all(r["gated"] and r["margin"] == 0.5 for r in rows if r["metric"] == "acc")


def test_unwritable_report_fails_before_work(lmeval_runs, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    proc = gk("compare", str(lmeval_runs["good"]), str(lmeval_runs["good"]), "--json", str(blocker / "r.json"))
    assert proc.returncode == 2 and "cannot write" in proc.stderr
    assert blocker.read_text() == "not a directory"


def test_compare_takes_policy_from_the_demo_suite(tmp_path):
    root = Path(__file__).resolve().parents[1]
    baseline = root / "examples" / ".gatekeeper" / "baselines" / "demo.json.gz"
    out = tmp_path / "r.json"
    # The stored baseline against itself, under the suite's policy: margins and gating come from it.
    proc = gk("compare", str(baseline), str(baseline), "--suite", str(root / "examples" / "gatekeeper.yaml"),
              "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["suite"] == "demo"
    rows = {(r["task"], r["metric"], r["filter"]): r for r in data["comparisons"]}
    assert rows[("demo_capitals_mc", "acc", "none")]["margin"] == 0.02  # from the group rule demo_mc
    assert rows[("demo_capitals_mc", "acc_norm", "none")]["gated"] is False
    assert rows[("demo_synth_ppl", "word_perplexity", "none")]["margin"] == 0.1
