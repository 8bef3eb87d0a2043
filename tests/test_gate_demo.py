"""`gatekeeper gate` end to end on the bundled demo: real lm-eval runs of the demo checkpoints."""

from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gatekeeper import store
from gatekeeper.gate import run_gate
from gatekeeper.model import GateError

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "examples" / "gatekeeper.yaml"
CKPT = ROOT / "examples" / "checkpoints"
BASELINE = ROOT / "examples" / ".gatekeeper" / "baselines" / "demo.json.gz"

pytestmark = [
    pytest.mark.lmeval,
    pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed"),
]
_RESULTS: dict[str, object] = {}


def _gate(name: str, tmp_path_factory: pytest.TempPathFactory):
    if name not in _RESULTS:
        out = tmp_path_factory.mktemp(f"gate-{name}")
        _RESULTS[name] = run_gate(SUITE, str(CKPT / name), out_dir=out, log=lambda *_: None)
    return _RESULTS[name]


def test_regressed_checkpoint_fails_naming_capitals(tmp_path_factory):
    result = _gate("regressed", tmp_path_factory)
    assert result.exit_code == 1
    names = {(c.key.task, c.key.metric) for c in result.outcome.regressions}
    assert names == {("demo_capitals_mc", "acc")}
    others = [c for c in result.outcome.comparisons if c.gated and c.key.task != "demo_capitals_mc"]
    assert others and all(c.verdict != "regressed" for c in others)
    assert result.report_json["verdict"] == "fail"


def test_harmless_checkpoint_passes(tmp_path_factory):
    result = _gate("harmless", tmp_path_factory)
    assert result.exit_code == 0, [str(c.key) for c in result.outcome.regressions]
    assert result.outcome.regressions == []
    # It did change: at least one metric moved, so this is not a byte-identical copy of base.
    assert any(c.test.delta != 0 for c in result.outcome.comparisons)


def test_base_rerun_reproduces_the_baseline_exactly(tmp_path_factory):
    from gatekeeper import results

    result = _gate("base", tmp_path_factory)
    assert result.exit_code == 0
    assert all(c.verdict == "unchanged" and c.test.delta == 0 for c in result.outcome.comparisons)
    stored = store.load_baseline(BASELINE)
    fresh = results.load_run(result.run_dir)
    assert set(stored.series) == set(fresh.series)
    for key, s in stored.series.items():
        f = fresh.series[key]
        assert np.array_equal(s.doc_ids, f.doc_ids), key
        if s.kind == "corpus":
            assert (s.values == f.values).all(), key
        else:
            assert np.array_equal(s.values, f.values), key  # bit for bit on CPU


def test_no_baseline_is_an_error_before_anything_runs(tmp_path):
    target = tmp_path / "baselines" / "demo.json.gz"
    with pytest.raises(GateError, match="no baseline file.*--record-missing"):
        run_gate(SUITE, str(CKPT / "regressed"), out_dir=tmp_path / "run", baseline=target, log=lambda *_: None)
    assert not target.exists() and not (tmp_path / "run").exists()


def test_no_baseline_records_the_first_one_when_asked(tmp_path):
    target = tmp_path / "baselines" / "demo.json.gz"
    result = run_gate(SUITE, str(CKPT / "base"), out_dir=tmp_path / "run", baseline=target,
                      record_missing=True, log=lambda *_: None)
    assert result.exit_code == 0 and result.outcome is None
    assert "first baseline" in result.notice
    assert store.load_baseline(target).provenance.suite_hash == store.load_baseline(BASELINE).provenance.suite_hash


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


def test_cli_gate_regressed_prints_verdict_and_markdown(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "gatekeeper", "gate", "--suite", str(SUITE), "--model", str(CKPT / "regressed"),
         "--out", str(tmp_path / "run"), "--json", str(tmp_path / "r.json"), "--print-markdown"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "FAIL: gatekeeper demo: 1 regression" in proc.stdout
    assert "### ❌" in proc.stdout and "demo\\_capitals\\_mc" in proc.stdout
    assert json.loads((tmp_path / "r.json").read_text())["regressions"] == 1
