"""Baseline store: exact round trip, checksums, atomic writes, suite check, history."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from gatekeeper import store
from gatekeeper.model import GateError, MetricSeries, Provenance, RunResults, SeriesKey
from gatekeeper.stats import aggregate
from gatekeeper.suite import load_suite

SUITE_YAML = """\
name: demo
lm_eval_version: "0.4.13"
tasks:
  - name: arith_mc
    num_fewshot: {shots}
"""


def _h(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()


def _hashes(task: str, n: int) -> np.ndarray:
    return np.array([[_h(task, i, "d"), _h(task, i, "p"), _h(task, i, "t")] for i in range(n)])


def _results(seed: int = 0, n: int = 50) -> RunResults:
    rng = np.random.default_rng(seed)
    flags = rng.integers(0, 2, n).astype(float)
    acc = MetricSeries(
        SeriesKey("arith_mc", "none", "acc"), "mean", "mean", True, np.arange(n), flags,
        _hashes("arith_mc", n), reported=float(flags.mean()), clusters=np.array([f"c{i % 4}" for i in range(n)]),
    )
    # Awkward floats: they must come back bit for bit.
    ll = np.column_stack([-rng.random(n) * 100 - 1e-9, rng.integers(5, 40, n)]).astype(float)
    ppl = MetricSeries(SeriesKey("synth_ppl", "none", "word_perplexity"), "ratio", "weighted_perplexity", False,
                       np.arange(n) * 2, ll, _hashes("synth_ppl", n),
                       reported=aggregate("ratio", "weighted_perplexity", ll))
    pairs = np.empty((n, 2), dtype=object)
    for i in range(n):
        pairs[i] = [f"ref {i} ünï", f"pred {i}\n\"q\""]
    bleu = MetricSeries(SeriesKey("trans", "none", "bleu"), "corpus", "bleu", True, np.arange(n), pairs,
                        _hashes("trans", n))
    prov = Provenance(source="runs/x", lm_eval_version="0.4.13", task_versions={"arith_mc": 1.0},
                      n_shot={"arith_mc": 0}, configs={"arith_mc": {"task": "arith_mc", "num_fewshot": 0}},
                      seeds={"random": 0}, n_samples={"arith_mc": {"original": n, "effective": n}},
                      task_hashes={"arith_mc": "ab" * 32}, model_name="m", model_dtype="torch.float32",
                      batch_size=1, device="cpu", date=1767225600.25, manifest={"model": "m"})
    return RunResults(provenance=prov, series={s.key: s for s in (acc, ppl, bleu)},
                      groups={"synth_mc": {"acc,none": 0.6461538461538462}},
                      group_subtasks={"synth_mc": ["arith_mc"]})


def _assert_same(a: RunResults, b: RunResults) -> None:
    assert set(a.series) == set(b.series)
    for key, sa in a.series.items():
        sb = b.series[key]
        assert (sa.kind, sa.aggregation, sa.higher_is_better, sa.reported) == (
            sb.kind, sb.aggregation, sb.higher_is_better, sb.reported)
        assert np.array_equal(sa.doc_ids, sb.doc_ids)
        assert sa.values.shape == sb.values.shape
        if sa.kind == "corpus":
            assert sa.values.tolist() == sb.values.tolist()
        else:
            assert np.array_equal(sa.values, sb.values)  # exact, not approx
        assert [[h[: store.HASH_CHARS] for h in row] for row in sa.hashes.tolist()] == sb.hashes.tolist()
        assert (sa.clusters is None) == (sb.clusters is None)
        if sa.clusters is not None:
            assert sa.clusters.tolist() == sb.clusters.tolist()
    assert a.groups == b.groups and a.group_subtasks == b.group_subtasks


@pytest.fixture()
def suite(tmp_path: Path):
    p = tmp_path / "gatekeeper.yaml"
    p.write_text(SUITE_YAML.format(shots=0))
    return load_suite(p)


def test_round_trip_is_exact(tmp_path: Path) -> None:
    res = _results()
    path = tmp_path / "b.json.gz"
    store.save_baseline(res, path, suite_name="demo", suite_hash="f" * 64)
    back = store.load_baseline(path)
    _assert_same(res, back)
    assert back.provenance.suite_hash == "f" * 64
    assert back.provenance.source == str(path)
    assert back.provenance.configs == res.provenance.configs
    assert back.provenance.date == res.provenance.date
    assert store.is_baseline_file(path)
    # A second save of the loaded baseline gives the same bytes (deterministic gzip, sorted keys).
    again = tmp_path / "c.json.gz"
    store.save_baseline(back, again, suite_name="demo", suite_hash="f" * 64)
    doc1 = json.loads(gzip.decompress(path.read_bytes()))
    doc2 = json.loads(gzip.decompress(again.read_bytes()))
    doc1["provenance"].pop("source"), doc2["provenance"].pop("source")
    assert doc1["series"] == doc2["series"]


def test_bytes_are_deterministic_and_small(tmp_path: Path) -> None:
    res = _results(n=2000)
    a, b = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    store.save_baseline(res, a, suite_name="demo", suite_hash=None)
    store.save_baseline(res, b, suite_name="demo", suite_hash=None)
    assert a.read_bytes() == b.read_bytes()
    # lm-eval's samples files take ~1 KB per item; three series of 2000 items stay far below that.
    assert a.stat().st_size < 6000 * 120


def test_corrupted_baseline_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "b.json.gz"
    store.save_baseline(_results(), path, suite_name="demo", suite_hash=None)
    doc = json.loads(gzip.decompress(path.read_bytes()))
    doc["series"][0]["values"][0] = 1.0 - doc["series"][0]["values"][0]  # "edited by hand"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(GateError, match=r"b\.json\.gz: checksum mismatch \(file corrupted or edited by hand\)"):
        store.load_baseline(path)
    raw = bytearray(gzip.compress(json.dumps(doc).encode()))
    raw[len(raw) // 2] ^= 0xFF  # bit rot inside the deflate stream
    path.write_bytes(bytes(raw))
    with pytest.raises(GateError, match="checksum mismatch|not valid JSON|is corrupted"):
        store.load_baseline(path)
    path.write_bytes(gzip.compress(json.dumps(doc).encode())[:300])  # an interrupted copy
    with pytest.raises(GateError, match=r"b\.json\.gz: baseline file is truncated"):
        store.load_baseline(path)


def test_not_a_baseline(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text('{"results": {}}')
    assert not store.is_baseline_file(path)
    with pytest.raises(GateError, match="results.json: not a gzip'd gatekeeper baseline"):
        store.load_baseline(path)
    with pytest.raises(GateError, match="baseline file not found"):
        store.load_baseline(tmp_path / "missing.json.gz")


def test_newer_format_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "b.json.gz"
    store.save_baseline(_results(), path, suite_name="demo", suite_hash=None)
    doc = json.loads(gzip.decompress(path.read_bytes()))
    doc.pop("checksum")
    doc["version"] = 2
    doc["checksum"] = store._checksum(doc)
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(GateError, match="format version 2 is not supported"):
        store.load_baseline(path)


def test_interrupted_write_leaves_old_file_and_no_temp(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "b.json.gz"
    store.save_baseline(_results(seed=1), path, suite_name="demo", suite_hash=None)
    before = path.read_bytes()

    def crash(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)  # the failure lands after the temp file is written
    with pytest.raises(GateError, match="b.json.gz: cannot write"):
        store.save_baseline(_results(seed=2), path, suite_name="demo", suite_hash=None)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json.gz"]


def test_unwritable_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a file where the directory should be: fails even as root
    with pytest.raises(GateError, match="cannot write"):
        store.save_baseline(_results(), blocker / "b.json.gz", suite_name="demo", suite_hash=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_other_suite_baseline_is_refused(tmp_path: Path, suite) -> None:
    store.record_results(_results(), suite)
    baseline = store.load_baseline(suite.baseline_path)
    store.check_suite(baseline, suite)  # same suite: fine
    other_path = tmp_path / "other" / "gatekeeper.yaml"
    other_path.parent.mkdir()
    other_path.write_text(SUITE_YAML.format(shots=5))
    other = load_suite(other_path)
    with pytest.raises(GateError) as err:
        store.check_suite(baseline, other)
    assert suite.hash[:12] in str(err.value) and other.hash[:12] in str(err.value)


def test_record_refuses_overwrite_and_promote_keeps_history(suite) -> None:
    first = store.record_results(_results(seed=1), suite)
    assert first == suite.baseline_path and first.name == "demo.json.gz"
    with pytest.raises(GateError, match="a baseline already exists"):
        store.record_results(_results(seed=2), suite)
    store.promote_results(_results(seed=2), suite)
    store.promote_results(_results(seed=3), suite)  # same second: the history names must not collide
    past = store.history(suite.baseline_path)
    assert len(past) == 2
    assert all(p.parent.name == "history" and p.name.startswith("demo.") for p in past)
    _assert_same(_results(seed=1), store.load_baseline(past[0]))
    _assert_same(_results(seed=3), store.load_baseline(suite.baseline_path))
    text = store.show(suite.baseline_path)
    assert "demo" in text and suite.hash[:12] in text and "arith_mc" in text and "acc,none" in text
    assert "2 previous baseline(s)" in text and "synth_mc (group)" in text
