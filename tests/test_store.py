"""Baseline store: exact round trip, checksums, atomic writes, suite check, history."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from gatekeeper import files
from gatekeeper.baseline import format as baseline_format
from gatekeeper.baseline import store
from gatekeeper.baseline.anchor import load_anchor
from gatekeeper.compare.compat import check_suite_hash
from gatekeeper.compare.stats import aggregate
from gatekeeper.errors import GateError
from gatekeeper.model import MetricSeries, Provenance, RunResults, SeriesKey
from gatekeeper.suite.suite import load_suite

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
        assert [[h[: baseline_format.HASH_CHARS] for h in row] for row in sa.hashes.astype(str).tolist()] == \
            sb.hashes.astype(str).tolist()
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
    assert baseline_format.is_baseline_file(path)
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
    with pytest.raises(GateError, match=r"b\.json\.gz: baseline file is truncated .*; restore it from git "
                       r"\(`git checkout -- .*b\.json\.gz`\), or re-record it on purpose"):
        store.load_baseline(path)
    anchor = tmp_path / "b.anchor.json.gz"  # issue #38: an anchor's fix is to restore or re-pin it
    anchor.write_bytes(path.read_bytes())
    with pytest.raises(GateError, match=r"b\.anchor\.json\.gz: anchor file is truncated .*; restore it from git "
                       r"\(`git checkout -- .*`\), or re-pin the anchor on purpose \(`gatekeeper baseline pin"):
        load_anchor(path.with_name("b.json.gz"))


def test_checksum_holds_for_the_written_bytes_and_for_other_spacing(tmp_path: Path) -> None:
    """The checksum is read off the file's own bytes when they are as written, and off the
    re-written body otherwise: both accept a whole file and refuse an edited one."""
    path = tmp_path / "b.json.gz"
    store.save_baseline(_results(), path, suite_name="demo", suite_hash=None)
    text = gzip.decompress(path.read_bytes()).decode()
    assert text.startswith('{"checksum":"sha256:')  # the written form: the fast path
    spaced = tmp_path / "spaced.json.gz"  # same document, other spacing and key order
    doc = json.loads(text)
    spaced.write_bytes(gzip.compress(json.dumps(dict(reversed(list(doc.items()))), indent=1).encode()))
    _assert_same(store.load_baseline(path), store.load_baseline(spaced))
    edited = text.replace('"suite":"demo"', '"suite":"demx"')
    assert edited != text
    for name, body in (("edited.json.gz", edited), ("spaced-edited.json.gz", json.dumps(json.loads(edited), indent=1))):
        (tmp_path / name).write_bytes(gzip.compress(body.encode()))
        with pytest.raises(GateError, match="checksum mismatch"):
            store.load_baseline(tmp_path / name)


def test_not_a_baseline(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text('{"results": {}}')
    assert not baseline_format.is_baseline_file(path)
    with pytest.raises(GateError, match="results.json: not a gzip'd gatekeeper baseline"):
        store.load_baseline(path)
    with pytest.raises(GateError, match="baseline file not found"):
        store.load_baseline(tmp_path / "missing.json.gz")


def test_newer_format_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "b.json.gz"
    store.save_baseline(_results(), path, suite_name="demo", suite_hash=None)
    doc = json.loads(gzip.decompress(path.read_bytes()))
    doc.pop("checksum")
    doc["version"] = baseline_format.FORMAT_VERSION + 1
    doc["checksum"] = baseline_format._checksum(doc)
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(GateError, match=f"format version {baseline_format.FORMAT_VERSION + 1} is not supported"):
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
    check_suite_hash(baseline, suite)  # same suite: fine
    other_path = tmp_path / "other" / "gatekeeper.yaml"
    other_path.parent.mkdir()
    other_path.write_text(SUITE_YAML.format(shots=5))
    other = load_suite(other_path)
    with pytest.raises(GateError) as err:
        check_suite_hash(baseline, other)
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


# ------------------------------------------------------------------ concurrency, kill -9, targets


def _promote_tagged(args: tuple[str, str, int, object]) -> None:
    suite_path, target, tag, barrier = args
    res = _results(seed=tag)
    res.provenance.model_name = f"model-{tag}"
    barrier.wait(30)  # all three start together
    store.promote_results(res, load_suite(Path(suite_path)), path=Path(target))


def test_concurrent_promotes_lose_nothing(tmp_path: Path, suite) -> None:
    """3 processes promote at once, 6 rounds: every promoted baseline is current or in history/,
    each exactly once, and no temp file is left (today: 11 of 15 rounds lost one)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    target = suite.baseline_path
    first = _results(seed=1000)
    first.provenance.model_name = "model-first"
    store.record_results(first, suite)
    promoted = ["model-first"]
    for round_ in range(6):
        barrier = ctx.Barrier(3)
        tags = [round_ * 3 + i for i in range(3)]
        procs = [ctx.Process(target=_promote_tagged, args=((str(suite.path), str(target), t, barrier),),
                             daemon=True)
                 for t in tags]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        promoted += [f"model-{t}" for t in tags]
    stored = [store.load_baseline(p).provenance.model_name for p in [*store.history(target), target]]
    assert sorted(stored) == sorted(promoted)  # none lost, none twice
    assert len(store.history(target)) == len(promoted) - 1
    assert not [p for p in target.parent.rglob("*") if p.name.endswith(".tmp")]


def test_waiting_for_the_lock_is_announced(tmp_path: Path, suite) -> None:
    store.record_results(_results(seed=1), suite)
    script = (
        "import sys; from pathlib import Path; from gatekeeper.baseline import store; from gatekeeper.suite.suite import load_suite;"
        "from tests.test_store import _results;"
        f"store.promote_results(_results(seed=2), load_suite(Path({str(suite.path)!r})))"
    )
    root = Path(__file__).resolve().parent.parent
    with store.store_lock(suite.baseline_path):
        proc = subprocess.Popen([sys.executable, "-c", script], cwd=root, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, PYTHONPATH=str(root)))
        time.sleep(3)
        assert proc.poll() is None  # still waiting: nothing was written meanwhile
        assert store.history(suite.baseline_path) == []
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "waiting for" in err and "lock" in err
    assert len(store.history(suite.baseline_path)) == 1


def test_temp_files_left_by_kill_9_are_removed(suite) -> None:
    """kill -9 between writing a temp file and renaming it leaves the temp file; the next
    record/promote (holding the lock, so no live writer owns one) removes it."""
    store.record_results(_results(seed=1), suite)
    folder = suite.baseline_path.parent
    (folder / "history").mkdir()
    stale = [folder / ".demo.json.gz.k9x1.tmp", folder / "history" / ".demo.20260101T000000Z.json.gz.k9x2.tmp"]
    for p in stale:
        p.write_bytes(b"half a baseline")
    unrelated = folder / ".other.json.gz.abc.tmp"  # another suite's: not ours to judge
    unrelated.write_bytes(b"x")
    store.promote_results(_results(seed=2), suite)
    assert not any(p.exists() for p in stale) and unrelated.exists()
    assert len(store.history(suite.baseline_path)) == 1


def test_real_kill_9_during_promote_leaves_a_valid_baseline(suite) -> None:
    """kill -9 at random moments of a looping promote: the baseline always loads, and the next
    promote leaves no temp file."""
    store.record_results(_results(seed=1), suite)
    root = Path(__file__).resolve().parent.parent
    script = (
        "from pathlib import Path; from gatekeeper.baseline import store; from gatekeeper.suite.suite import load_suite;"
        "from tests.test_store import _results;"
        f"s = load_suite(Path({str(suite.path)!r})); r = _results(seed=3, n=20000)\n"
        "while True: store.promote_results(r, s)"
    )
    for delay in (1.5, 2.2, 2.9):
        proc = subprocess.Popen([sys.executable, "-c", script], cwd=root, env=dict(os.environ, PYTHONPATH=str(root)))
        time.sleep(delay)
        proc.kill()
        proc.wait()
        store.load_baseline(suite.baseline_path)
    store.promote_results(_results(seed=2), suite)
    assert not [p for p in suite.baseline_path.parent.rglob("*") if p.name.endswith(".tmp")]
    store.load_baseline(suite.baseline_path)


def test_report_to_a_fifo_is_written_through(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    try:
        files.atomic_write_bytes(fifo, b"report\n")
        reader.join(10)
    finally:
        if reader.is_alive():  # the FIFO was replaced: release the blocked reader
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert got == [b"report\n"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # not replaced by a regular file


def test_report_through_a_symlink_to_a_device_keeps_both(tmp_path: Path) -> None:
    link = tmp_path / "out.md"
    link.symlink_to("/dev/null")
    files.atomic_write_bytes(link, b"report\n")
    assert link.is_symlink() and os.readlink(link) == "/dev/null"
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.md"]


def test_report_through_a_symlink_to_a_file_replaces_the_file(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    files.atomic_write_bytes(link, b"new")
    assert link.is_symlink() and real.read_text() == "new"


def test_report_to_stdout_through_proc_fd(tmp_path: Path) -> None:
    """What `--markdown /dev/stdout` resolves to (/proc/self/fd/1, a pipe here): written through,
    the link left alone."""
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-c", f"from gatekeeper import files; files.atomic_write_bytes({str(link)!r}, b'hello')"],
        cwd=root, capture_output=True, env=dict(os.environ, PYTHONPATH=str(root)), timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"hello" and link.is_symlink()


def test_writing_to_a_directory_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(GateError, match="is a directory"):
        files.atomic_write_bytes(tmp_path, b"x")


# ------------------------------------------------------------------ portable provenance


def test_baseline_records_no_absolute_path(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    res = _results()
    res.provenance.source = "/tmp/runs/base/m/results_2026-01-01T00-00-00.json"
    res.provenance.model_name = str(repo / "ckpt" / "base")
    res.provenance.manifest = {
        "command": ["/opt/venv/lib/gatekeeper/__main__.py", "run", "--out", "/tmp/runs/base"],
        "model_path": str(repo / "ckpt" / "base"), "model": "ckpt/base",
    }
    path = repo / ".gatekeeper" / "b.json.gz"
    store.save_baseline(res, path, suite_name="demo", suite_hash=None)
    text = gzip.decompress(path.read_bytes()).decode()
    assert not re.findall(r'"/[^"]*"', text)
    prov = json.loads(text)["provenance"]
    assert prov["source"] == "results_2026-01-01T00-00-00.json"
    assert prov["model_name"] == prov["manifest"]["model_path"] == "ckpt/base"
    assert prov["manifest"]["command"] == ["gatekeeper", "run", "--out", "base"]


def test_committed_demo_baseline_has_no_absolute_path() -> None:
    path = Path(__file__).resolve().parent.parent / "examples" / ".gatekeeper" / "baselines" / "demo.json.gz"
    text = gzip.decompress(path.read_bytes()).decode()
    assert not re.findall(r'"/[^"]*"', text)
    store.load_baseline(path)  # and it passes every new check


def test_version_1_baseline_without_reported_still_loads(tmp_path: Path) -> None:
    res = _results()
    for s in res.series.values():
        s.reported = None  # older writers (and hand-built runs) stored no aggregate
    path = tmp_path / "b.json.gz"
    store.save_baseline(res, path, suite_name="demo", suite_hash=None)
    _assert_same(res, store.load_baseline(path))
