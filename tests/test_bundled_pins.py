"""A bundled lm-eval task reads its dataset from the hub at the baseline's commit (issue #36).

``arc_easy`` is used exactly as lm-eval ships it (``dataset_path: allenai/ai2_arc``, ``dataset_name:
ARC-Easy``): the suite names the task and nothing else, no YAML of the user's. The loopback hub
(tests/hub_server.py) serves ``allenai/ai2_arc`` with a dataset card that lists the ARC-Easy files.
The baseline records the commit; the dataset's owner then pushes new answers; the same model
still passes, evaluated at the recorded commit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.demo_runs import ROOT, lm_eval_installed
from tests.hub_server import Hub, hub_env
from tests.test_bundled_tasks import _rows

pytestmark = [pytest.mark.lmeval,
              pytest.mark.skipif(not lm_eval_installed(), reason="lm-eval is not installed")]

CARD = """\
---
configs:
- config_name: ARC-Easy
  data_files:
  - {split: train, path: ARC-Easy/train.jsonl}
  - {split: validation, path: ARC-Easy/validation.jsonl}
  - {split: test, path: ARC-Easy/test.jsonl}
---
"""
SUITE = """\
name: bundled-pins
lm_eval_version: "0.4.13"
baseline: .gatekeeper/baselines/bundled-pins.json.gz
model: {backend: hf, dtype: float32, batch_size: 16, device: cpu}
seeds: {random: 1234, numpy: 1234, torch: 1234, fewshot: 1234}
policy: {alpha: 0.05, correction: holm, margin: 0.0}
tasks:
  - name: arc_easy
    num_fewshot: 0
    metrics:
      - {metric: acc, margin: 0.02}
"""


def _repo(folder: Path, rotate: int = 0) -> Path:
    (folder / "ARC-Easy").mkdir(parents=True)
    (folder / "README.md").write_text(CARD)
    for split in ("train", "validation", "test"):
        rows = _rows("arc_easy", 12)
        for i, row in enumerate(rows):  # another commit: other answers
            row["answerKey"] = "ABCD"[(i + rotate) % 4]
        (folder / "ARC-Easy" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _project(tmp_path: Path, hub: Hub) -> tuple[Path, Callable[..., subprocess.CompletedProcess]]:
    """A project holding the suite, and ``gate(*flags)``: the demo base checkpoint gated there
    against the loopback hub."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "gatekeeper.yaml").write_text(SUITE)
    env = hub_env(hub, tmp_path / "hf-home", own_server=True)  # its gates load the model

    def gate(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "gatekeeper", "gate", "--suite", "gatekeeper.yaml", "--model",
                               str(ROOT / "examples/checkpoints/base"), "--no-history", *extra],
                              cwd=project, env=env, capture_output=True, text=True, timeout=900)
    return project, gate


def test_a_bundled_tasks_hub_dataset_is_evaluated_at_the_baselines_commit(tmp_path: Path) -> None:
    hub = Hub({"allenai/ai2_arc": _repo(tmp_path / "hub/c1")}).start()
    project, gate = _project(tmp_path, hub)
    try:
        first = gate("--record-missing", "--out", str(tmp_path / "first"))
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        recorded = hub.sha("allenai/ai2_arc")
        (manifest,) = (tmp_path / "first").glob("*/gatekeeper-manifest.json")
        assert json.loads(manifest.read_text())["datasets"] == {"allenai/ai2_arc": recorded}
        moved = hub.push("allenai/ai2_arc", _repo(tmp_path / "hub/c2", rotate=1))
        hub.requests.clear()
        again = gate("--json", str(tmp_path / "again.json"))
    finally:
        hub.stop()
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    rows = json.loads((tmp_path / "again.json").read_text())["comparisons"]
    assert {(r["task"], r["metric"]) for r in rows} >= {("arc_easy", "acc")}, rows
    assert all(r["verdict"] == "unchanged" and r["n"] == 12 for r in rows), rows
    assert not [p for _, p in hub.requests if moved in p or "/resolve/main/" in p], hub.requests


def test_items_that_moved_are_refused_before_the_model_loads(tmp_path: Path) -> None:
    """Issue #41: a baseline recorded before dataset revisions were (no lock), and the hub's
    dataset pushed with other answers since. The gate used to evaluate everything and only then
    exit 2 (task_hashes differ); it now holds the documents it built against the baseline's items
    before any model loads, and writes the JSON report of the refusal."""
    from gatekeeper.baseline import store

    hub = Hub({"allenai/ai2_arc": _repo(tmp_path / "hub/c1")}).start()
    project, gate = _project(tmp_path, hub)
    try:
        first = gate("--record-missing", "--out", str(tmp_path / "first"))
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        path = project / ".gatekeeper/baselines/bundled-pins.json.gz"
        old = store.load_baseline(path)
        old.provenance.manifest = {k: v for k, v in old.provenance.manifest.items() if k != "datasets"}
        store.save_baseline(old, path, suite_name="bundled-pins", suite_hash=old.provenance.suite_hash)
        hub.push("allenai/ai2_arc", _repo(tmp_path / "hub/c2", rotate=1))
        again = gate("--out", str(tmp_path / "again"), "--json", str(tmp_path / "again.json"))
    finally:
        hub.stop()
    assert again.returncode == 2, again.stdout[-3000:] + again.stderr[-3000:]
    assert "task arc_easy: 12 of 12 of the baseline's items differ from the documents built now" in again.stderr
    assert "this baseline predates recorded dataset revisions" in again.stderr
    # nothing was evaluated: no request ran, no model was placed on a device, no run was written
    assert "requests" not in again.stdout + again.stderr and "device:" not in again.stdout + again.stderr
    assert not (tmp_path / "again").exists() or not any((tmp_path / "again").iterdir())
    refused = json.loads((tmp_path / "again.json").read_text())
    assert refused["verdict"] == "error" and refused["suite"] == "bundled-pins" and refused["comparisons"] == []
    assert "differ from the documents built now" in refused["error"]
    assert refused["provenance"]["model"].endswith("examples/checkpoints/base")
