"""Backends (hf, vllm, served endpoints), the request cache and progress lines.

The served-endpoint tests run lm-eval's own ``local-completions`` client against a loopback
OpenAI-compatible server (tests/completions_server.py) that serves the demo checkpoints on CPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gatekeeper.baseline.store import load_baseline
from gatekeeper.errors import GateError
from gatekeeper.results.reader import load_run
from gatekeeper.run import backends
from gatekeeper.run.progress import Progress
from gatekeeper.suite.suite import load_suite, load_suite_text
from tests.completions_server import CompletionsServer
from tests.demo_runs import DEMO_BASELINE, DEMO_SUITE, OFFLINE_ENV, ROOT, assert_same_items, lm_eval_installed

CKPT = "examples/checkpoints"
API_REL_TOL = 1e-4  # hf pads a batch, the server scores one sequence: float32 summation order


def _model(**keys: object) -> dict:
    from gatekeeper.suite.suite import MODEL_DEFAULTS

    return {**MODEL_DEFAULTS, **keys}


def _suite_text(**model_keys: object) -> str:
    """The demo suite with model keys replaced/added, paths absolute (written anywhere)."""
    lines = []
    for line in DEMO_SUITE.read_text().splitlines():
        if line.startswith("include_path:"):
            line = f"include_path: {ROOT / 'examples' / 'tasks'}"
        elif line.startswith("baseline:"):
            line = f"baseline: {DEMO_BASELINE}"
        lines.append(line)
        if line == "model:":
            lines += [f"  {k}: {json.dumps(v)}" for k, v in model_keys.items()]
    text = "\n".join(lines) + "\n"
    if "backend" in model_keys:
        text = text.replace("  backend: hf\n", "", 1)
    return text


def _write_suite(tmp: Path, name: str = "suite.yaml", **model_keys: object) -> Path:
    path = tmp / name
    path.write_text(_suite_text(**model_keys))
    return path


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, **OFFLINE_ENV, "PYTHONPATH": str(ROOT), **extra}


def _run_cli(*args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gatekeeper", *args], cwd=ROOT, env=_env(**env),
                          capture_output=True, text=True, timeout=timeout)


# ----------------------------------------------------------------------------- argument mapping


def test_vllm_args_map_first_class_keys_and_pass_model_args_through() -> None:
    m = _model(backend="vllm", tensor_parallel_size=4, data_parallel_size=2, gpu_memory_utilization=0.85,
               max_model_len=8192, tokenizer="org/tok", max_length=4096,
               model_args={"enforce_eager": True, "quantization": "awq"})
    plan = backends.plan(m, "/ckpt/llama-70b", dtype="bfloat16", revision="abc")
    assert plan.name == "vllm" and not plan.local_device and not plan.served
    assert plan.args == {"pretrained": "/ckpt/llama-70b", "dtype": "bfloat16", "revision": "abc",
                         "max_length": 4096, "tokenizer": "org/tok", "tensor_parallel_size": 4,
                         "data_parallel_size": 2, "gpu_memory_utilization": 0.85, "max_model_len": 8192,
                         "enforce_eager": True, "quantization": "awq"}


def test_hf_args_parallelize_and_defaults_unchanged() -> None:
    assert backends.plan(_model(), "m", dtype="float32", revision=None).args == {"pretrained": "m", "dtype": "float32"}
    assert backends.plan(_model(parallelize=True), "m", dtype="auto", revision=None).args["parallelize"] is True


def test_local_completions_args_use_the_checkpoint_tokenizer() -> None:
    m = _model(backend="local-completions", base_url="http://127.0.0.1:8000/v1/completions", num_concurrent=8,
               model_args={"max_retries": 2, "timeout": 30})
    model = str(ROOT / CKPT / "base")
    plan = backends.plan(m, model, dtype="float32", revision=None)
    assert plan.served and not plan.local_device
    assert plan.args == {"pretrained": model, "base_url": "http://127.0.0.1:8000/v1/completions",
                         "tokenizer": model, "tokenizer_backend": "huggingface", "num_concurrent": 8,
                         "max_retries": 2, "timeout": 30}


def test_chat_completions_args_leave_tokenization_to_the_server() -> None:
    m = _model(backend="local-chat-completions", base_url="http://h:8000/v1/chat/completions", chat_template=True)
    plan = backends.plan(m, "served-model-name", dtype="auto", revision=None)
    assert plan.args == {"pretrained": "served-model-name", "base_url": "http://h:8000/v1/chat/completions"}


def test_other_lm_eval_types_pass_through_with_model_args() -> None:
    m = _model(backend="sglang", model_args={"tp_size": 2})
    plan = backends.plan(m, "m", dtype="bfloat16", revision=None)
    assert (plan.name, plan.args, plan.local_device) == ("sglang", {"pretrained": "m", "dtype": "bfloat16",
                                                                    "tp_size": 2}, True)


def test_progress_interval_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from gatekeeper.run.progress import DEFAULT_INTERVAL, interval_from_env

    for value, expected in (("0.5", 0.5), ("junk", DEFAULT_INTERVAL), ("-1", DEFAULT_INTERVAL)):
        monkeypatch.setenv("GATEKEEPER_PROGRESS_SECONDS", value)
        assert interval_from_env() == expected


@pytest.mark.parametrize(("keys", "needle"), [
    ({"backend": "hf", "tensor_parallel_size": 2}, "model.tensor_parallel_size applies to backend vllm, not hf"),
    ({"backend": "vllm", "base_url": "http://x/v1/completions"}, "model.base_url applies to backend"),
    ({"backend": "local-completions"}, "model.base_url is required"),
    ({"backend": "hf", "model_args": {"dtype": "float16"}}, "model_args sets dtype"),
    ({"backend": "hf", "model_args": {"pretrained": "other"}}, "model_args.pretrained"),
])
def test_backend_key_mistakes_are_errors(keys: dict, needle: str) -> None:
    with pytest.raises(GateError, match=needle.replace(".", r"\.")):
        backends.plan(_model(**keys), "m", dtype="float32", revision=None)


def test_suite_hash_moves_only_with_what_is_measured(tmp_path: Path) -> None:
    demo = load_suite(DEMO_SUITE)
    stored = json.loads(__import__("gzip").open(DEMO_BASELINE).read())["suite_hash"]
    assert demo.hash == stored  # the new keys did not orphan recorded baselines

    def h(**keys: object) -> str:
        return load_suite_text(_suite_text(**keys), ROOT / "examples" / "x.yaml").hash

    same = h()
    assert h(base_url="http://a:1/v1/completions", num_concurrent=4, backend="local-completions") == \
        h(base_url="http://b:2/v1/completions", num_concurrent=16, backend="local-completions")
    assert h(tensor_parallel_size=8, data_parallel_size=2, gpu_memory_utilization=0.5, backend="vllm") == \
        h(backend="vllm")
    assert h(parallelize=True) == same
    assert h(model_args={"timeout": 5, "max_retries": 1}) == same
    assert h(backend="vllm") != same
    assert h(tokenizer="other/tok") != same
    assert h(model_args={"add_bos_token": True}) != same
    assert h(max_model_len=4096, backend="vllm") != h(backend="vllm")


def test_schema_rejects_bad_backend_values(tmp_path: Path) -> None:
    text = _suite_text(gpu_memory_utilization=1.5, base_url="ftp://x", num_concurrent=0)
    with pytest.raises(GateError) as err:
        load_suite_text(text, tmp_path / "s.yaml")
    msg = str(err.value)
    assert "model.gpu_memory_utilization: expected a fraction in (0, 1] or null, got 1.5" in msg
    assert "model.base_url: expected an http(s):// URL or null" in msg
    assert "model.num_concurrent: expected an integer >= 1 or null, got 0" in msg


def test_vllm_missing_is_exit_2_before_anything_loads(tmp_path: Path) -> None:
    if backends.importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    suite = _write_suite(tmp_path, backend="vllm", tensor_parallel_size=2)
    t = time.perf_counter()
    proc = _run_cli("run", "--suite", str(suite), "--model", f"{CKPT}/base", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0] == (f"gatekeeper: error: {suite}: model.backend vllm needs vllm, which is not installed; "
                        "pip install 'lm-eval[vllm]==0.4.13' (needs a CUDA GPU)")
    assert not (tmp_path / "out").exists()
    assert time.perf_counter() - t < 30  # no task building, no model loading


def test_unknown_backend_names_the_closest(tmp_path: Path) -> None:
    if not lm_eval_installed():
        pytest.skip("lm-eval is not installed")
    suite = _write_suite(tmp_path, backend="local-completion", base_url="http://127.0.0.1:9/v1/completions")
    proc = _run_cli("run", "--suite", str(suite), "--model", f"{CKPT}/base", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "model.backend 'local-completion' is not an lm-eval 0.4.13 model type" in proc.stderr
    assert "did you mean 'local-completions'?" in proc.stderr


# ----------------------------------------------------------------------------- progress lines


def test_progress_lines_are_rate_limited_and_carry_rate_and_eta() -> None:
    now = [100.0]
    lines: list[str] = []
    p = Progress(lines.append, t0=90.0, interval=30.0, clock=lambda: now[0])
    p.start("loglikelihood", 1000)
    for i in range(1000):
        now[0] = 100.0 + (i + 1) / 10  # 10 requests/s: 100 s in all
        p.step("loglikelihood")
        p.step("generate_until")  # another phase's requests are not counted
    p.finish()
    assert lines == [
        "[   40.0s] loglikelihood: 300/1000 requests (30%), 10.0/s, ETA 1m10s",
        "[   70.0s] loglikelihood: 600/1000 requests (60%), 10.0/s, ETA 40s",
        "[  100.0s] loglikelihood: 900/1000 requests (90%), 10.0/s, ETA 10s",
        "[  110.0s] loglikelihood: 1000/1000 requests (100%), 10.0/s, done in 1m40s",
    ]


# ----------------------------------------------------------------------------- served endpoint

lmeval = pytest.mark.lmeval


@pytest.fixture(scope="module")
def server():
    if not lm_eval_installed():
        pytest.skip("lm-eval is not installed")
    srv = CompletionsServer(root=ROOT).preload(*(f"{CKPT}/{n}" for n in ("base", "harmless", "regressed"))).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def api_suite(server: CompletionsServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_suite(tmp_path_factory.mktemp("api"), backend="local-completions", base_url=server.url)


@pytest.fixture(scope="module")
def api_runs(server: CompletionsServer, api_suite: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The three demo checkpoints through the endpoint, once per module:
    {name: (run dir, stdout, model calls)}."""
    out = tmp_path_factory.mktemp("api-runs")
    runs = {}
    for name in ("base", "harmless", "regressed"):
        before = server.served
        proc = _run_cli("run", "--suite", str(api_suite), "--model", f"{CKPT}/{name}", "--out",
                        str(out / name), GATEKEEPER_PROGRESS_SECONDS="0.2")
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs[name] = (next((out / name).iterdir()), proc.stdout, server.served - before)
    return runs


@lmeval
def test_served_endpoint_catches_regressed_and_passes_harmless(api_runs: dict, api_suite: Path) -> None:
    base = api_runs["base"][0]
    regressed = subprocess.run([sys.executable, "-m", "gatekeeper", "compare", str(base),
                                str(api_runs["regressed"][0]), "--suite", str(api_suite)],
                               cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    harmless = subprocess.run([sys.executable, "-m", "gatekeeper", "compare", str(base),
                               str(api_runs["harmless"][0]), "--suite", str(api_suite)],
                              cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert regressed.returncode == 1, regressed.stderr
    assert harmless.returncode == 0, harmless.stdout + harmless.stderr
    manifest = json.loads((base / "gatekeeper-manifest.json").read_text())
    assert manifest["backend"] == "local-completions"
    assert {"aiohttp", "requests", "tenacity"} <= set(manifest["backend_versions"])
    assert manifest["model_args"]["tokenizer_backend"] == "huggingface"


@lmeval
def test_served_endpoint_matches_hf_item_by_item(api_runs: dict, api_suite: Path, demo_gate,
                                                 tmp_path: Path) -> None:
    """The endpoint's per-item values equal the hf backend's (the stored baseline, from `base`,
    and a fresh hf gate of `regressed`), and so does the verdict of every comparison."""
    assert_same_items(load_baseline(DEMO_BASELINE), load_run(api_runs["base"][0]), rel=API_REL_TOL)
    hf = demo_gate("regressed")
    assert_same_items(load_run(hf.run_dir), load_run(api_runs["regressed"][0]), rel=API_REL_TOL)
    report = tmp_path / "api.json"
    proc = _run_cli("compare", str(api_runs["base"][0]), str(api_runs["regressed"][0]), "--suite",
                    str(api_suite), "--json", str(report))
    assert proc.returncode == hf.exit_code == 1, proc.stderr

    def rows(rep: dict) -> dict:
        return {(c["task"], c["filter"], c["metric"]): c for c in rep["comparisons"]}

    api, ref = rows(json.loads(report.read_text())), rows(hf.report)
    assert set(api) == set(ref)
    for key, c in api.items():
        assert c["delta"] == pytest.approx(ref[key]["delta"], rel=1e-3, abs=1e-6), key
        # Gated comparisons decide the suite: same verdict. (An informational metric whose delta
        # is ~1e-7 with margin 0 may read regressed on one engine, inconclusive on the other:
        # that noise is what margins are for.)
        if c["gated"]:
            assert c["verdict"] == ref[key]["verdict"], key
    assert any(c["gated"] and c["verdict"] == "regressed" for c in api.values())


@lmeval
def test_backend_change_is_named_as_context(api_runs: dict) -> None:
    proc = _run_cli("compare", str(DEMO_BASELINE), str(api_runs["harmless"][0]))
    assert proc.returncode in (0, 1), proc.stderr
    assert "backend: hf in baseline, local-completions in candidate" in proc.stdout + proc.stderr


@lmeval
def test_progress_lines_in_a_real_run(api_runs: dict) -> None:
    out = api_runs["base"][1]
    lines = [ln for ln in out.splitlines() if " requests (" in ln]
    assert any("ETA" in ln for ln in lines), out
    for phase in ("loglikelihood", "generate_until", "loglikelihood_rolling"):
        assert any(f"] {phase}: " in ln and "(100%)" in ln and "done in" in ln for ln in lines), phase
    stamps = [float(ln.split("s]")[0].strip("[ ")) for ln in lines if "ETA" in ln]
    # 0.2 s apart at least (stamps are rounded to 0.1 s); unlimited lines would be ms apart
    assert all(b - a >= 0.09 for a, b in zip(stamps, stamps[1:], strict=False)), stamps


@lmeval
def test_concurrent_requests_give_the_same_items(server: CompletionsServer, tmp_path: Path) -> None:
    """num_concurrent > 1 takes lm-eval's async (aiohttp) path: same answers, same items."""
    runs = []
    for n in (1, 4):
        suite = _write_suite(tmp_path, f"s{n}.yaml", backend="local-completions", base_url=server.url,
                             num_concurrent=n)
        proc = _run_cli("run", "--suite", str(suite), "--model", f"{CKPT}/base", "--out", str(tmp_path / f"c{n}"),
                        "--limit", "30")
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs.append(load_run(tmp_path / f"c{n}"))
    assert_same_items(runs[0], runs[1], rel=1e-6)


@lmeval
@pytest.mark.parametrize("fault", ["500", "drop", "hang"])
def test_endpoint_failures_end_in_exit_2_without_a_verdict(fault: str, tmp_path: Path) -> None:
    srv = CompletionsServer(root=ROOT, fault=fault, fail_after=2, hang_s=60).preload(f"{CKPT}/base").start()
    try:
        suite = _write_suite(tmp_path, backend="local-completions", base_url=srv.url,
                             # the hang costs this test the client's whole timeout: 5 s, where a
                             # tiny model's answers take milliseconds even on busy cores
                             model_args={"max_retries": 1, "timeout": 5 if fault == "hang" else 15})
        proc = _run_cli("run", "--suite", str(suite), "--model", f"{CKPT}/base", "--out", str(tmp_path / "out"),
                        "--limit", "8", timeout=300)
    finally:
        srv.stop()
    assert srv.served == 2  # it failed part-way, after answers had arrived
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gatekeeper: error: lm-eval failed while evaluating"), proc.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@lmeval
def test_null_answers_from_the_endpoint_end_in_exit_2(tmp_path: Path) -> None:
    """lm-eval replaces a null answer with "" and scores it: a verdict on answers never given."""
    srv = CompletionsServer(root=ROOT, fault="null").preload(f"{CKPT}/base").start()
    try:
        suite = _write_suite(tmp_path, backend="local-completions", base_url=srv.url)
        proc = _run_cli("run", "--suite", str(suite), "--model", f"{CKPT}/base", "--out", str(tmp_path / "out"),
                        "--limit", "4", timeout=300)
    finally:
        srv.stop()
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and f"{srv.url}: the endpoint answered " in err[0] and "null content" in err[0], err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


# ----------------------------------------------------------------------------- request cache


@lmeval
def test_killed_run_resumes_from_the_cache_with_equal_results(server: CompletionsServer, api_suite: Path,
                                                              api_runs: dict, tmp_path: Path) -> None:
    cache, out = tmp_path / "cache", tmp_path / "out"
    args = ("run", "--suite", str(api_suite), "--model", f"{CKPT}/base", "--cache", str(cache))
    before = server.served
    proc = subprocess.Popen([sys.executable, "-m", "gatekeeper", *args, "--out", str(tmp_path / "killed")],
                            cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 300
    while server.served - before < 60 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # a preempted runner: no clean-up of any kind
    proc.wait()
    killed_after = server.served - before
    assert 60 <= killed_after
    assert not (tmp_path / "killed").exists() or not any((tmp_path / "killed").glob("*/results_*.json"))

    before = server.served
    resumed = _run_cli(*args, "--out", str(out))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    resumed_calls = server.served - before
    from_cache = [ln for ln in resumed.stdout.splitlines() if "answered from the cache" in ln]
    assert from_cache and int(from_cache[0].split("request cache: ")[1].split()[0]) > 0, resumed.stdout
    full_calls = api_runs["base"][2]
    assert resumed_calls <= full_calls - killed_after + 5  # at most the batch in flight redone
    assert_same_items(load_run(api_runs["base"][0]), load_run(out), rel=0)

    before = server.served
    warm = _run_cli(*args, "--out", str(tmp_path / "warm"))
    assert warm.returncode == 0, warm.stderr[-2000:]
    assert server.served - before == 0  # an unchanged checkpoint re-gates without a model call
    assert_same_items(load_run(api_runs["base"][0]), load_run(tmp_path / "warm"), rel=0)


def test_cache_needs_local_model_files(tmp_path: Path) -> None:
    from gatekeeper.run import manifest, runner

    suite = load_suite(DEMO_SUITE)
    s = runner._settings(suite, "org/model", None, None, None, None, None)
    with pytest.raises(GateError, match="--cache needs a local checkpoint directory"):
        runner.request_cache_path(tmp_path, suite, s, {}, "org/model")
    files = manifest.hash_model_files(ROOT / CKPT / "base")
    a = runner.request_cache_path(tmp_path, suite, s, files, "x")
    b = runner.request_cache_path(tmp_path, suite, runner._settings(suite, "x", None, None, None, "float16", None),
                                  files, "x")
    other = runner.request_cache_path(tmp_path, suite, s, manifest.hash_model_files(ROOT / CKPT / "regressed"), "x")
    assert len({a, b, other}) == 3 and a.parent == tmp_path


def test_backend_change_is_context_never_an_error_nor_silent() -> None:
    import copy

    from gatekeeper.compare.compat import check_compatible

    base = load_baseline(DEMO_BASELINE)
    assert base.provenance.manifest and "backend" not in base.provenance.manifest  # recorded before backends
    cand = copy.deepcopy(base)
    cand.provenance.manifest["backend"] = "vllm"
    diffs = check_compatible(base, cand)
    assert [(d.severity, d.message) for d in diffs if "backend" in d.message] == [
        ("context", "backend: hf in baseline, vllm in candidate (another engine's numerical noise; "
                    "the margins are there for it)")]
    assert not [d for d in diffs if d.severity == "error"]
    cand.provenance.manifest["backend"] = "hf"  # an old manifest without the key is hf
    assert not [d for d in check_compatible(base, cand) if "backend" in d.message]


def test_credentials_in_the_endpoint_and_model_args_are_written_nowhere(server: CompletionsServer,
                                                                        tmp_path: Path) -> None:
    """A ``base_url`` carrying ``?api-key=…`` and an ``auth_token`` model argument: the run's
    manifest, lm-eval's results.json copy, the baseline, the JSON report and the log show
    neither, while the endpoint still receives the URL it was given."""
    key, token = "sk-query-SECRET-0001", "hf_TOKEN_SECRET_0002"
    suite = _write_suite(tmp_path, backend="local-completions", base_url=f"{server.url}?api-key={key}",
                         model_args={"auth_token": token})
    text = suite.read_text().replace(f"baseline: {DEMO_BASELINE}", f"baseline: {tmp_path / 'b.json.gz'}")
    suite.write_text(text)
    out = tmp_path / "out"
    run = _run_cli("run", "--suite", str(suite), "--model", f"{CKPT}/base", "--out", str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    record = _run_cli("baseline", "record", str(out), "--suite", str(suite))
    assert record.returncode == 0, record.stderr[-2000:]
    gate = _run_cli("gate", "--suite", str(suite), "--model", f"{CKPT}/base", "--json", str(tmp_path / "r.json"),
                    "--out", str(tmp_path / "out2"))
    assert gate.returncode == 0, gate.stdout[-2000:] + gate.stderr[-2000:]
    import gzip

    written = [p.read_bytes() for p in out.rglob("*") if p.is_file()]
    written += [p.read_bytes() for p in (tmp_path / "out2").rglob("*") if p.is_file()]
    written += [gzip.decompress((tmp_path / "b.json.gz").read_bytes()), (tmp_path / "r.json").read_bytes(),
                (run.stdout + run.stderr + gate.stdout + gate.stderr).encode()]
    for blob in written:
        assert key.encode() not in blob and token.encode() not in blob
    assert any(b"api-key=***" in blob for blob in written)  # redacted, not dropped


@lmeval
def test_sequential_gate_on_the_served_endpoint_stops_early_with_fewer_model_calls(
        server: CompletionsServer, api_runs: dict, tmp_path: Path) -> None:
    """gate --sequential through the endpoint: the regressed checkpoint fails at look 1, the
    harmless one passes early, each with a fraction of a whole run's completions requests."""
    suite = tmp_path / "suite.yaml"
    suite.write_text(_suite_text(backend="local-completions", base_url=server.url)
                     .replace(f"baseline: {DEMO_BASELINE}", f"baseline: {tmp_path / 'api.json.gz'}"))
    record = _run_cli("baseline", "record", str(api_runs["base"][0]), "--suite", str(suite))
    assert record.returncode == 0, record.stderr
    for name, code, verdict in (("regressed", 1, "fail"), ("harmless", 0, "pass")):
        before = server.served
        proc = _run_cli("gate", "--suite", str(suite), "--model", f"{CKPT}/{name}", "--sequential", "--looks", "3",
                        "--out", str(tmp_path / name), "--json", str(tmp_path / f"{name}.json"))
        calls = server.served - before
        report = json.loads((tmp_path / f"{name}.json").read_text())
        assert proc.returncode == code and report["verdict"] == verdict, proc.stdout[-2000:] + proc.stderr[-2000:]
        seq = report["sequential"]
        assert seq["stopped_at"] <= 2 and seq["evaluated"] < 0.7 * seq["total"]
        whole = api_runs[name][2]  # the completions an unsequenced run of this checkpoint asked for
        assert 0 < calls < 0.7 * whole, (calls, whole)
