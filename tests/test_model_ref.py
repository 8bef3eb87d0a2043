"""``--model`` is decided before anything heavy loads (issue #38, run/modelref.py): a relative
checkpoint path given from the wrong folder is not a half-minute hub error but one line naming the
folder, the hub's answer and the suite's folder that has the path. Real HTTP: the loopback hub of
tests/hub_server.py, as ``HF_ENDPOINT``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gatekeeper.errors import GateError
from gatekeeper.run import modelref
from tests.hub_server import Hub

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "examples" / "gatekeeper.yaml"
REGRESSED = ROOT / "examples" / "checkpoints" / "regressed"


@pytest.fixture
def hub():
    hub = Hub({}, models={"gk-test/tiny": REGRESSED}).start()
    yield hub
    hub.stop()


def _env(tmp_path: Path, hub: Hub | None, offline: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")}
    env.update(PYTHONPATH=str(ROOT), HF_HOME=str(tmp_path / "hf-home"), HF_HUB_ETAG_TIMEOUT="5")
    if hub is not None:
        env["HF_ENDPOINT"] = hub.url
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def _run(tmp_path: Path, model: str, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    cwd = tmp_path / "elsewhere"
    cwd.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "gatekeeper", "run", "--suite", str(SUITE), "--model", model,
                           "--out", str(tmp_path / "out"), *extra], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_relative_checkpoint_from_the_wrong_folder_is_one_line_naming_both_readings(tmp_path: Path, hub: Hub) -> None:
    proc = _run(tmp_path, "checkpoints/regressed", _env(tmp_path, hub, offline=False))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert f"no folder 'checkpoints/regressed' under {tmp_path / 'elsewhere'}; as a hub id it was not found on " \
           f"the hub ({hub.url};" in line, line
    assert f"the suite's folder has it: give --model {REGRESSED}, or run from {SUITE.parent}" in line
    asked = [r for r in hub.requests if r[1] != "/api/agent-harnesses"]  # huggingface_hub's user agent probe
    assert asked == [("GET", "/api/models/checkpoints/regressed")]  # one question, nothing loaded
    assert not (tmp_path / "out").exists()


def test_offline_a_model_missing_from_the_cache_is_said_before_loading(tmp_path: Path) -> None:
    proc = _run(tmp_path, "checkpoints/regressed", _env(tmp_path, None, offline=True))
    assert proc.returncode == 2
    assert "as a hub id it is not in the Hugging Face cache and the hub is switched off" in proc.stderr, proc.stderr
    assert "the suite's folder has it" in proc.stderr


def test_a_hub_model_the_hub_has_passes_and_a_missing_revision_is_named(tmp_path: Path, hub: Hub) -> None:
    code = ("import sys; from gatekeeper.run import modelref; "
            "print(modelref.hub_problem(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))")
    env = _env(tmp_path, hub, offline=False)
    ok = subprocess.run([sys.executable, "-c", code, "gk-test/tiny"], env=env, capture_output=True, text=True,
                        check=True, timeout=120)
    assert ok.stdout.strip() == "None"
    bad = subprocess.run([sys.executable, "-c", code, "gk-test/tiny", "v9"], env=env, capture_output=True, text=True,
                         check=True, timeout=120)
    assert bad.stdout.strip() == f"has no revision 'v9' on the hub ({hub.url})"
    hub.stop()  # no answer and nothing cached: said, not guessed
    gone = subprocess.run([sys.executable, "-c", code, "gk-test/tiny"], env=env, capture_output=True, text=True,
                          check=True, timeout=120)
    assert gone.stdout.strip().startswith(f"could not be looked up (the hub {hub.url} did not answer: ")


def test_a_served_backend_s_model_name_is_not_looked_up(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert modelref.check_model("my-served-model", hub=False) is None
    with pytest.raises(GateError, match="model path not found"):
        modelref.check_model("./my-served-model", hub=False)
