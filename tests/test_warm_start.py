"""The tests' warm start (tests/warm_start.py, issue #28) runs a CLI subprocess exactly as a fresh
interpreter would, and starts one cold whenever it could not."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.demo_runs import DEMO_BASELINE, DEMO_SUITE, ROOT, lm_eval_installed
from tests.test_backends import _write_suite
from tests.warm_start import COLD_ENV, ENV, OWN_SERVER_ENV, env_key

pytestmark = pytest.mark.skipif(not os.environ.get(ENV), reason=f"the warm start is off ({COLD_ENV} is set)")


def _ledger() -> list[str]:
    ledger = Path(os.environ[ENV]).with_name("cpu")
    return ledger.read_text().splitlines() if ledger.is_file() else []


def _warm_runs() -> int:
    """How many warm children have ended in this test process's servers."""
    return sum(not line.endswith(" import") for line in _ledger())


def _imports() -> int:
    """How many servers of another environment have imported torch and lm-eval."""
    return sum(line.endswith(" import") for line in _ledger())


def _server_env() -> dict[str, str]:
    """This process's environment as the server has it (a test before this one in the same worker
    may have set a variable: its subprocesses start cold, which is not what these tests are about)."""
    info = json.loads(Path(os.environ[ENV]).read_text())
    volatile = {k: v for k, v in os.environ.items() if k not in env_key(dict(os.environ))}
    return {**volatile, **info["env"]}


def _cli(*args: str, cold: bool = False, cwd: Path = ROOT, script: str | None = None,
         **env: str) -> subprocess.CompletedProcess:
    """``python -m gatekeeper ARGS``, or with ``script`` that script file run as a command (the
    console script, as a workflow's ``run:`` step calls it)."""
    full = {**_server_env(), **env}
    if cold:
        full[COLD_ENV] = "1"
    command = [script, *args] if script else [sys.executable, "-m", "gatekeeper", *args]
    return subprocess.run(command, cwd=cwd, env=full, capture_output=True, text=True, timeout=300)


def _wait_for_server() -> None:
    deadline = time.monotonic() + 120
    while not Path(os.environ[ENV]).is_file():  # the server imports torch and lm-eval first
        assert time.monotonic() < deadline, "the warm server never came up"
        time.sleep(0.2)


def test_a_warm_run_prints_and_exits_as_a_cold_one(tmp_path: Path) -> None:
    _wait_for_server()
    commands = [
        ("compare", str(DEMO_BASELINE), str(DEMO_BASELINE), "--suite", str(DEMO_SUITE)),  # pass, exit 0
        ("compare", str(tmp_path / "missing.json"), str(DEMO_BASELINE), "--suite", str(DEMO_SUITE)),  # exit 2
        ("--version",),
    ]
    console = str(Path(sys.executable).with_name("gatekeeper"))
    for script in (None, console):
        for args in [*commands, ("compare",)]:  # the last: argparse's usage error names the program
            before = _warm_runs()
            warm = _cli(*args, script=script)
            assert _warm_runs() == before + 1, f"{script} {args} did not run warm"
            cold = _cli(*args, cold=True, script=script)
            assert _warm_runs() == before + 1
            assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout, cold.stderr), args


def _launcher(python: str) -> str:
    """The first lines of a console script as pip writes them: a #! line, or, where the
    interpreter's path has a space (execve cannot take one in a #! line), a /bin/sh line that execs
    it, in lines Python reads as a string (pip's distlib does the same)."""
    if " " not in python:
        return f"#!{python}\n"
    return f"#!/bin/sh\n'''exec' \"{python}\" \"$0\" \"$@\"\n' '''\n"


def test_a_warm_script_sees_the_argv_path_and_file_of_a_cold_one(tmp_path: Path) -> None:
    """A script named gatekeeper (as a console script, or a shim a pull request puts on PATH) run
    warm: its argv, sys.path, __file__ and __name__ are a fresh interpreter's; reached through a
    symbolic link, sys.path[0] is the folder of the file the link points to; by a relative path,
    cold."""
    _wait_for_server()
    real = tmp_path / "real"
    real.mkdir()
    (real / "gatekeeper").write_text(_launcher(sys.executable) + "import json, sys\n"
                                     "print(json.dumps([sys.argv, sys.path, __file__, __name__]))\n")
    (real / "gatekeeper").chmod(0o755)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "gatekeeper").symlink_to(real / "gatekeeper")
    for script in (real / "gatekeeper", tmp_path / "bin" / "gatekeeper"):
        before = _warm_runs()
        warm = _cli("a b", "--x", script=str(script), cwd=tmp_path)
        assert _warm_runs() == before + 1
        cold = _cli("a b", "--x", script=str(script), cwd=tmp_path, cold=True)
        assert warm.returncode == cold.returncode == 0, warm.stderr + cold.stderr
        assert json.loads(warm.stdout) == json.loads(cold.stdout)
        assert json.loads(warm.stdout)[1][0] == str(real)
    before = _warm_runs()  # by a relative path: cold (runpy would make sys.argv[0] absolute)
    relative = _cli("a", script="./bin/gatekeeper", cwd=tmp_path)
    assert _warm_runs() == before and json.loads(relative.stdout)[0] == ["./bin/gatekeeper", "a"]


@pytest.mark.skipif(not lm_eval_installed(), reason="lm-eval is not installed")
def test_a_warm_lm_eval_run_writes_the_same_items_as_a_cold_one(tmp_path: Path) -> None:
    _wait_for_server()
    outputs = {}
    for mode in ("warm", "cold"):
        before = _warm_runs()
        proc = _cli("run", "--suite", str(DEMO_SUITE), "--model", "examples/checkpoints/base", "--limit", "8",
                    "--out", str(tmp_path / mode), cold=mode == "cold")
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert _warm_runs() == before + (mode == "warm")
        samples = sorted((tmp_path / mode).rglob("samples_*.jsonl"))
        assert len(samples) == 4
        outputs[mode] = ([re.sub(r"_\d{4}-\d\d-\d\dT[\d.-]+\.jsonl$", "", p.name) for p in samples],
                         [p.read_bytes() for p in samples],
                         re.sub(r"\[ *[\d.]+s\]|in [\d.]+s|[\d.]+/s|/(warm|cold)/", "", proc.stdout))
    assert outputs["warm"] == outputs["cold"]


def test_a_process_of_another_environment_runs_in_a_server_that_imported_under_it(tmp_path: Path) -> None:
    """A library reads its variables at import (huggingface_hub its cache folder): a process with
    another value than the first server's runs in a server that imported under that value, one
    import for all the processes of that environment, and sees what a cold start sees."""
    _wait_for_server()
    (tmp_path / "gatekeeper").write_text(_launcher(sys.executable) + "import json, os, sys\n"
                                         "from huggingface_hub import constants\n"
                                         "print(json.dumps([constants.HF_HUB_CACHE, os.environ['HF_HOME'], sys.path]))\n")
    (tmp_path / "gatekeeper").chmod(0o755)
    script = str(tmp_path / "gatekeeper")
    runs, imports = _warm_runs(), _imports()
    outputs = []
    for home in ("hf", "hf"):
        warm = _cli(script=script, HF_HOME=str(tmp_path / home), **{OWN_SERVER_ENV: "1"})
        cold = _cli(script=script, HF_HOME=str(tmp_path / home), cold=True)
        assert warm.returncode == cold.returncode == 0, warm.stderr + cold.stderr
        assert json.loads(warm.stdout) == json.loads(cold.stdout)
        outputs.append(json.loads(warm.stdout)[0])
    assert outputs == [str(tmp_path / "hf" / "hub")] * 2
    assert (_warm_runs() - runs, _imports() - imports) == (2, 1)  # both runs warm, one import
    servers = list(Path(os.environ[ENV]).parent.glob("env-*/pid"))
    assert len(servers) == 1  # it ends with this test (tests/conftest.py)


def test_a_process_that_could_differ_from_the_server_starts_cold(tmp_path: Path) -> None:
    _wait_for_server()
    args = ("compare", str(DEMO_BASELINE), str(DEMO_BASELINE), "--suite", str(DEMO_SUITE))
    before = _warm_runs()
    # Another environment, and the test did not ask for a server of its own.
    assert _cli(*args, HF_HOME=str(tmp_path / "hf")).returncode == 0
    # A module in the working directory would shadow the server's own import (a pull request could
    # plant one): such a process starts cold, and `python -m gatekeeper` takes the working folder
    # off sys.path before importing anything, so the planted module never runs (issue #55).
    (tmp_path / "yaml.py").write_text("raise SystemExit('the planted yaml ran')\n")
    planted = _cli(*args, cwd=tmp_path)
    assert planted.returncode == 0 and "the planted yaml ran" not in planted.stderr, planted.stderr[-2000:]
    # A process that leads its own group (a test that kills the group) is the process the test kills.
    led = subprocess.run([sys.executable, "-m", "gatekeeper", *args], cwd=ROOT, capture_output=True,
                         env=_server_env(), start_new_session=True, timeout=300)
    assert led.returncode == 0
    assert _warm_runs() == before


@pytest.mark.skipif(not lm_eval_installed(), reason="lm-eval is not installed")
def test_killing_a_warm_process_ends_its_run(tmp_path: Path) -> None:
    _wait_for_server()
    endpoint = socket.create_server(("127.0.0.1", 0))  # accepts, never answers: a run that never ends alone
    endpoint.settimeout(120)
    url = f"http://127.0.0.1:{endpoint.getsockname()[1]}/v1/completions"
    suite = _write_suite(tmp_path, backend="local-completions", base_url=url)
    before = _warm_runs()
    proc = subprocess.Popen([sys.executable, "-m", "gatekeeper", "run", "--suite", str(suite), "--model",
                             "examples/checkpoints/base", "--limit", "2", "--out", str(tmp_path / "out")],
                            cwd=ROOT, env=_server_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    conn, _ = endpoint.accept()  # the run's first request is in flight
    conn.settimeout(10)
    proc.send_signal(signal.SIGKILL)  # as subprocess.run does on a timeout
    proc.wait()
    try:
        while conn.recv(65536):  # the request, then end of file once the warm child is gone
            pass
    except TimeoutError:
        pytest.fail("the warm run outlived the process the test killed")
    finally:
        conn.close()
        endpoint.close()
    assert _warm_runs() == before  # killed: it never finished
