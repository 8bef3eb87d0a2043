"""MLflow export (issue #15): one run per gate, read back through the real MlflowClient, from a
local file store and from a real ``mlflow server`` started on 127.0.0.1 by this test. A failure
to log is a warning and never changes the exit code."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.demo_runs import DEMO_BASELINE

mlflow = pytest.importorskip("mlflow", reason="the mlflow extra is not installed (pip install -e '.[mlflow]')")

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
REGRESSED_RUN = ROOT / "tests" / "fixtures" / "demo-regressed-run"


def _compare(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gatekeeper", "compare", str(DEMO_BASELINE), str(REGRESSED_RUN),
                           "--suite", str(ROOT / "examples" / "gatekeeper.yaml"), "--json", str(tmp_path / "r.json"),
                           *extra], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)


def _check_run(uri: str, report: dict) -> None:
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("gatekeeper/demo")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    r = runs[0]
    assert r.info.status == "FINISHED"
    assert r.data.tags["verdict"] == "fail" and r.data.tags["event"] == "cli" and r.data.tags["regressions"] == "2"
    assert r.data.params["suite"] == "demo" and r.data.params["lm_eval_version"] == "0.4.13"
    assert r.data.params["suite_hash"] == report["provenance"]["candidate"]["suite_hash"]
    caps = next(c for c in report["comparisons"] if c["task"] == "demo_capitals_mc" and c["metric"] == "acc")
    assert r.data.metrics["demo_capitals_mc/acc/value"] == pytest.approx(caps["candidate"])
    assert r.data.metrics["demo_capitals_mc/acc/delta"] == pytest.approx(caps["delta"])
    assert r.data.metrics["demo_capitals_mc/acc/p_adjusted"] == pytest.approx(caps["p_adjusted"])
    history = client.get_metric_history(r.info.run_id, "demo_capitals_mc/acc/delta")
    assert history[0].step == int(time.time() // 86400)  # the night
    arts = {a.path for a in client.list_artifacts(r.info.run_id)}
    assert arts == {"report.json", "report.md"}
    local = client.download_artifacts(r.info.run_id, "report.json")
    assert json.loads(Path(local).read_text())["verdict"] == "fail"


def test_compare_logs_one_run_to_a_local_file_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # reading MLflow 3's file store asks for it too
    proc = _compare(tmp_path, "--mlflow")
    assert proc.returncode == 1, proc.stderr  # the verdict is the gate's, logged or not
    assert "logged MLflow run" in proc.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    _check_run((tmp_path / "mlruns").as_uri(), report)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_compare_logs_to_a_real_mlflow_server(tmp_path: Path) -> None:
    if not (Path(sys.executable).parent / "mlflow").exists():
        pytest.skip("the mlflow server command is not installed (the full mlflow package)")
    port = _free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--default-artifact-root",
         str(tmp_path / "artifacts"), "--workers", "1"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=(tmp_path / "server.log").open("wb"),
        # MLflow 3's server starts six job-runner processes (huey) for its GenAI jobs, which
        # gatekeeper never submits (it logs a run's params, metrics and artifacts): 20 s of wall
        # and 6 s of CPU each time, for nothing this test reads.
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert server.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
                time.sleep(0.5)
        else:
            pytest.fail("mlflow server did not start in 120 s: " + (tmp_path / "server.log").read_text()[-2000:])
        proc = _compare(tmp_path, "--mlflow", uri)
        assert proc.returncode == 1 and "logged MLflow run" in proc.stdout, proc.stdout + proc.stderr
        _check_run(uri, json.loads((tmp_path / "r.json").read_text()))
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_tracking_failure_is_a_warning_never_the_verdict(tmp_path: Path) -> None:
    port = _free_port()  # nothing listens there
    proc = _compare(tmp_path, "--mlflow", f"http://user:s3cret@127.0.0.1:{port}")
    assert proc.returncode == 1, proc.stderr
    assert "warning: could not log to MLflow" in proc.stderr and "s3cret" not in proc.stderr + proc.stdout


def test_a_server_that_trickles_is_given_up_on_within_the_deadline(tmp_path: Path) -> None:
    """Issue #25: a loopback server that answers one byte every second holds no gate past
    GATEKEEPER_MLFLOW_DEADLINE (MLflow's per-request timeout does not bound it), and the report
    is written before any logging starts."""
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.5)
    stop = threading.Event()

    def trickle() -> None:
        conns = []
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
                conns.append(conn)
            except OSError:
                pass
            for conn in conns:
                try:
                    conn.sendall(b"H")
                except OSError:
                    pass
            stop.wait(1.0)
        for conn in conns:
            conn.close()

    server = threading.Thread(target=trickle, daemon=True)
    server.start()
    try:
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "gatekeeper", "compare", str(DEMO_BASELINE), str(REGRESSED_RUN),
                               "--suite", str(ROOT / "examples" / "gatekeeper.yaml"), "--json", str(tmp_path / "r.json"),
                               "--mlflow", f"http://127.0.0.1:{listener.getsockname()[1]}"], cwd=tmp_path,
                              env={**ENV, "GATEKEEPER_MLFLOW_DEADLINE": "4"}, capture_output=True, text=True,
                              timeout=120)
        took = time.monotonic() - t0
    finally:
        stop.set()
        server.join(timeout=10)
        listener.close()
    assert proc.returncode == 1, proc.stderr
    assert "gave up logging to MLflow" in proc.stderr and "after 4 s" in proc.stderr, proc.stderr
    assert json.loads((tmp_path / "r.json").read_text())["verdict"] == "fail"
    assert took < 60, took
