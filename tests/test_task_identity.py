"""A task's identity is its code, not lm-eval's config strings (issue #13).

lm-eval writes a ``doc_to_choice: !function`` into the task config as
``<function choices at 0x7f…>``, an address that changes every run: re-gating the identical
checkpoint used to be refused ("config doc_to_choice differs"). And it serialises only the named
function's source, so editing a helper that function calls changed no hash at all. gatekeeper
compares configs without the addresses, and records a content hash of every file under the
suite's include_path: editing the helper on the default branch without re-recording the
baseline is exit 2 naming the file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.demo_runs import OFFLINE_ENV, ROOT, lm_eval_installed

pytestmark = [pytest.mark.lmeval,
              pytest.mark.skipif(not lm_eval_installed(), reason="lm-eval is not installed")]

CHOICE_TASK = """\
task: demo_capitals_fn
custom_dataset: !function loaders.load_capitals
test_split: test
output_type: multiple_choice
doc_to_text: "The capital of {{country}} is"
doc_to_choice: !function choosing.choices
doc_to_target: label
metric_list:
  - {metric: acc, aggregation: mean, higher_is_better: true}
metadata: {version: 1.0}
"""
CHOOSING = '''\
def tidy(name):
    return name.strip()


def choices(doc):
    return [tidy(c) for c in doc["choices"]]
'''
SUITE = """\
name: identity
lm_eval_version: "0.4.13"
include_path: tasks
model: {backend: hf, dtype: float32, batch_size: 16, device: cpu}
seeds: {random: 1234, numpy: 1234, torch: 1234, fewshot: 1234}
policy: {alpha: 0.05, margin: 0.02}
tasks:
  - name: demo_capitals_fn
    num_fewshot: 0
"""


def _gk(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gatekeeper", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **OFFLINE_ENV, "PYTHONPATH": str(ROOT)}, timeout=600)


@pytest.fixture
def suite_dir(tmp_path: Path) -> Path:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    shutil.copy(ROOT / "examples/tasks/loaders.py", tasks / "loaders.py")
    shutil.copytree(ROOT / "examples/tasks/data", tasks / "data")
    (tasks / "demo_capitals_fn.yaml").write_text(CHOICE_TASK)
    (tasks / "choosing.py").write_text(CHOOSING)
    (tmp_path / "gatekeeper.yaml").write_text(SUITE)
    return tmp_path


def test_an_identical_rerun_of_a_function_choice_task_is_unchanged_and_a_helper_edit_is_refused(suite_dir):
    model = str(ROOT / "examples/checkpoints/base")
    first = _gk("gate", "--suite", "gatekeeper.yaml", "--model", model, "--record-missing", cwd=suite_dir)
    assert first.returncode == 0, first.stderr[-2000:]
    again = _gk("gate", "--suite", "gatekeeper.yaml", "--model", model, "--json", "r.json", cwd=suite_dir)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    report = json.loads((suite_dir / "r.json").read_text())
    assert {c["verdict"] for c in report["comparisons"]} == {"unchanged"}
    assert "doc_to_choice" not in again.stdout + again.stderr
    # an edit of the helper `choices` calls: lm-eval's hashes do not see it, the task code's does
    helper = suite_dir / "tasks/choosing.py"
    helper.write_text(helper.read_text().replace("return name.strip()", "return name.strip().upper()"))
    edited = _gk("gate", "--suite", "gatekeeper.yaml", "--model", model, cwd=suite_dir)
    assert edited.returncode == 2, edited.stdout[-2000:] + edited.stderr[-2000:]
    assert "task code tasks/choosing.py changed since the baseline: record a new baseline on purpose" in edited.stderr
    assert edited.stderr.count("\n") == 1
