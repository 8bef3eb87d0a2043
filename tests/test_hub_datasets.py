"""A bundled-style task reads its dataset from the hub (issue #27): gatekeeper never switches the
network off for a local checkpoint. The hub is a loopback server started here (tests/hub_server.py)
that speaks enough of the hub's HTTP API for ``datasets``; ``HF_ENDPOINT`` points at it and no
``*_OFFLINE`` variable is set. The demo's capitals items are served as the dataset ``gk-test/capitals``,
so the regressed demo checkpoint must fail the gate against the base checkpoint's baseline."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.demo_runs import lm_eval_installed
from tests.hub_server import Hub, hub_env

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

pytestmark = pytest.mark.skipif(not lm_eval_installed(), reason="lm-eval is not installed (pip install -e '.[eval]')")

TASK = """\
task: hub_capitals
dataset_path: gk-test/capitals
test_split: test
output_type: multiple_choice
doc_to_text: "The capital of {{country}} is"
doc_to_choice: choices
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""

SUITE = """\
name: hub
lm_eval_version: "0.4.13"
include_path: tasks
baseline: .gatekeeper/baselines/hub.json.gz
model: {backend: hf, dtype: float32, batch_size: 16, device: cpu}
seeds: {random: 1234, numpy: 1234, torch: 1234, fewshot: 1234}
policy: {alpha: 0.05, correction: holm, margin: 0.0}
tasks:
  - name: hub_capitals
    num_fewshot: 0
    metrics:
      - {metric: acc, filter: none, margin: 0.02}
"""


def test_a_hub_dataset_is_downloaded_for_a_local_checkpoint(tmp_path: Path) -> None:
    repo = tmp_path / "hub" / "capitals"
    (repo / "data").mkdir(parents=True)
    shutil.copy(EXAMPLES / "tasks" / "data" / "capitals.jsonl", repo / "data" / "test.jsonl")
    project = tmp_path / "project"
    (project / "tasks").mkdir(parents=True)
    (project / "tasks" / "hub_capitals.yaml").write_text(TASK)
    (project / "gatekeeper.yaml").write_text(SUITE)
    hub = Hub({"gk-test/capitals": repo}).start()
    env = hub_env(hub, tmp_path / "hf-home", own_server=True, PYTHONPATH=str(ROOT))  # its gates load the model

    def gate(checkpoint: str, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "gatekeeper", "gate", "--suite", "gatekeeper.yaml", "--model",
                               str(EXAMPLES / "checkpoints" / checkpoint), "--out", str(tmp_path / checkpoint),
                               "--json", str(tmp_path / f"{checkpoint}.json"), "--no-history", *extra],
                              cwd=project, env=env, capture_output=True, text=True, timeout=900)
    try:
        base = gate("base", "--record-missing")
        assert base.returncode == 0, base.stdout[-2000:] + base.stderr[-2000:]
        regressed = gate("regressed")
    finally:
        hub.stop()
    assert regressed.returncode == 1, regressed.stdout[-2000:] + regressed.stderr[-2000:]
    report = json.loads((tmp_path / "regressed.json").read_text())
    assert report["verdict"] == "fail"
    (row,) = report["comparisons"]
    assert row["task"] == "hub_capitals" and row["n"] == 200 and row["verdict"] == "regressed"
    # The items came from the loopback hub (once: the second gate read the HF cache), and nothing
    # asked the hub for a model.
    downloads = [p for m, p in hub.requests if m == "GET" and p.endswith("/data/test.jsonl")]
    assert len(downloads) == 1, hub.requests
    assert not [p for _, p in hub.requests if "/api/models" in p or p.startswith("/examples")], hub.requests
