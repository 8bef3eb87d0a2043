"""The CLI never ends in a traceback: usage without a command, internal errors, a closed pipe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gatekeeper import cli

ROOT = Path(__file__).resolve().parents[1]
STORED = ROOT / "examples" / ".gatekeeper" / "baselines" / "demo.json.gz"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def test_bare_gatekeeper_prints_usage_and_exits_2():
    proc = subprocess.run([sys.executable, "-m", "gatekeeper"], capture_output=True, text=True, env=ENV, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: gatekeeper") and "{compare,run,gate,init,merge,baseline,history,plan}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unexpected_exception_is_one_line_exit_2(monkeypatch, capsys):
    # A bug anywhere below the CLI (here: in store.show) must not become a traceback with exit 1.
    from gatekeeper.baseline import store

    def broken(path):
        raise KeyError("series")

    monkeypatch.setattr(store, "show", broken)
    assert cli.main(["baseline", "show", str(STORED)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gatekeeper: internal error: KeyError: 'series' (") and err.count("\n") == 1


@pytest.mark.parametrize("args", [["baseline", "show", str(STORED)], ["--version"]])
def test_closed_stdout_is_a_quiet_exit(args):
    # `gatekeeper baseline show | head -0`: the reader is gone before the first write.
    proc = subprocess.Popen([sys.executable, "-m", "gatekeeper", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=ENV)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    if args[0] == "baseline":
        assert code == 141 and err == ""
