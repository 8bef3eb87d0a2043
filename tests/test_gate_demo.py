"""`gatekeeper gate` end to end on the bundled demo: real lm-eval runs of the demo checkpoints,
one per checkpoint per session (fixtures ``demo_gate`` / ``demo_run``, tests/demo_runs.py)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from gatekeeper.baseline import store
from gatekeeper.errors import GateError
from gatekeeper.gate import run_gate
from tests.demo_runs import assert_same_items, compare_cli

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "examples" / "gatekeeper.yaml"
CKPT = ROOT / "examples" / "checkpoints"
BASELINE = ROOT / "examples" / ".gatekeeper" / "baselines" / "demo.json.gz"

pytestmark = [
    pytest.mark.lmeval,
    pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed"),
]


def test_regressed_checkpoint_fails_naming_capitals(demo_gate):
    result = demo_gate("regressed")
    assert result.exit_code == 1
    rows = {(c["task"], c["metric"]): c for c in result.report["comparisons"]}
    regressed = {k for k, c in rows.items() if c["gated"] and c["verdict"] == "regressed"}
    # The demo_mc group (issue #24) fails with its capitals subtask; its row comes first, with its
    # subtasks, and its values are lm-eval's own group scores.
    assert regressed == {("demo_mc", "acc"), ("demo_capitals_mc", "acc")}
    group = rows[("demo_mc", "acc")]
    assert group["kind"] == "group" and group["subtasks"] == ["demo_arith_mc", "demo_capitals_mc"]
    assert group["weight_by_size"] is True and group["n"] == 425 and group["test"] == "mcnemar-midp"
    assert group["candidate"] == pytest.approx(result.report["groups"]["demo_mc"]["candidate"]["acc,none"], rel=1e-12)
    assert group["baseline"] == pytest.approx(result.report["groups"]["demo_mc"]["baseline"]["acc,none"], rel=1e-12)
    order = [c["task"] for c in result.report["comparisons"]]
    assert order.index("demo_mc") < order.index("demo_arith_mc") < order.index("demo_capitals_mc")
    assert any(c["gated"] for k, c in rows.items() if k[0] not in ("demo_capitals_mc", "demo_mc"))
    assert result.report["verdict"] == "fail" and result.report["regressions"] == 2


def test_harmless_checkpoint_passes(demo_gate):
    result = demo_gate("harmless")
    assert result.exit_code == 0, result.report
    assert result.report["verdict"] == "pass" and result.report["regressions"] == 0
    # It did change: at least one metric moved, so this is not a byte-identical copy of base.
    assert any(c["delta"] != 0 for c in result.report["comparisons"])


def test_base_rerun_matches_the_stored_baseline_on_any_cpu(demo_run, tmp_path):
    """The baseline was recorded on another CPU: per-item log-likelihoods differ ~1e-8 there,
    so right/wrong items must be identical, continuous values equal within 1e-5 relative,
    hashes identical, and the gate must pass."""
    from gatekeeper.results import reader as results

    run_dir = demo_run("base")
    proc = compare_cli(BASELINE, run_dir, "--json", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verdict"] == "pass" and report["regressions"] == 0
    # Nothing really moved: every row, gated or not, every metric kind, says so (not "inconclusive").
    assert {c["verdict"] for c in report["comparisons"]} == {"unchanged"}, [
        (c["task"], c["metric"], c["verdict"]) for c in report["comparisons"] if c["verdict"] != "unchanged"]
    assert_same_items(store.load_baseline(BASELINE), results.load_run(run_dir))


def test_no_baseline_is_an_error_before_anything_runs(tmp_path):
    target = tmp_path / "baselines" / "demo.json.gz"
    with pytest.raises(GateError, match="no baseline file.*--record-missing"):
        run_gate(SUITE, str(CKPT / "regressed"), out_dir=tmp_path / "run", baseline=target, log=lambda *_: None)
    assert not target.exists() and not (tmp_path / "run").exists()


def test_no_baseline_records_the_first_one_when_asked(demo_gate):
    from gatekeeper.results import reader as results

    result = demo_gate("base")  # the session's base run is gated with record_missing=True
    assert result.exit_code == 0 and result.notice and "first baseline" in result.notice
    assert result.report["verdict"] == "pass" and result.report["comparisons"] == []
    recorded = store.load_baseline(result.baseline)
    assert recorded.provenance.suite_hash == store.load_baseline(BASELINE).provenance.suite_hash
    assert_same_items(recorded, results.load_run(result.run_dir), rel=0)  # recorded as run, bit for bit


def test_corrupted_baseline_is_refused_before_running(tmp_path):
    bad = tmp_path / "demo.json.gz"
    doc = json.loads(gzip.decompress(BASELINE.read_bytes()))
    doc["series"][0]["values"][0] = 0.5  # an edit by hand
    bad.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(GateError, match="checksum"):
        run_gate(SUITE, str(CKPT / "base"), out_dir=tmp_path / "run", baseline=bad, log=lambda *_: None)
    assert not (tmp_path / "run").exists()


def test_baseline_from_another_suite_is_refused(tmp_path):
    suite = tmp_path / "gatekeeper.yaml"
    shutil.copytree(ROOT / "examples" / "tasks", tmp_path / "tasks")
    text = SUITE.read_text().replace("seeds: {random: 1234, numpy: 1234, torch: 1234, fewshot: 1234}",
                                     "seeds: {random: 1, numpy: 1, torch: 1, fewshot: 1}")
    suite.write_text(text)
    with pytest.raises(GateError, match="suite"):
        run_gate(suite, str(CKPT / "base"), out_dir=tmp_path / "run", baseline=BASELINE, log=lambda *_: None)
    assert not (tmp_path / "run").exists()


def test_cli_gate_regressed_prints_verdict_and_markdown(demo_gate, tmp_path):
    """The one end-to-end `gatekeeper gate` CLI run (scripts/demo.sh regressed), and it prints
    exactly what `gatekeeper compare` prints for its run, which is how README's blocks are made."""
    result = demo_gate("regressed")
    assert result.exit_code == 1, result.stderr[-2000:]
    assert "FAIL: gatekeeper demo: 2 regressions: demo_mc acc" in result.stdout
    assert "### ❌" in result.stdout and "demo\\_capitals\\_mc" in result.stdout
    assert json.loads(result.json_path.read_text())["regressions"] == 2
    assert "Traceback" not in result.stderr
    md = tmp_path / "r.md"
    proc = compare_cli(BASELINE, result.run_dir, "--markdown", str(md))
    assert proc.returncode == 1, proc.stderr
    assert result.stdout.endswith(proc.stdout + "\n" + md.read_text(encoding="utf-8"))
