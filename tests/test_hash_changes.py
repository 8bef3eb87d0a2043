"""A changed suite hash names the field that changed (issue #17, item 7).

Deleting a redundant-looking ``num_fewshot: 0`` changes what is measured (unset means the task's
own default, which may be 5 shots), so the baseline is refused, but the refusal used to give only
two hashes.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from gatekeeper.suite.suite import hash_changes, hashed_document, load_suite

ROOT = Path(__file__).resolve().parents[1]


def test_hash_changes_names_each_field() -> None:
    before = hashed_document(load_suite(ROOT / "examples" / "gatekeeper.yaml").hashed)
    after = hashed_document(before)
    after["tasks"][0]["num_fewshot"] = None
    after["seeds"]["random"] = 7
    after["model"]["dtype"] = "bfloat16"
    after["tasks"].append({"name": "hellaswag", "num_fewshot": 0, "limit": None, "gen_kwargs": None, "repeats": None})
    assert hash_changes(before, after) == [
        "model.dtype: 'float32' -> 'bfloat16'",
        "seeds.random: 1234 -> 7",
        "tasks[demo_mc].num_fewshot: 0 -> unset",
        "tasks[hellaswag] added",
    ]
    assert hash_changes(before, before) == []


def test_the_refusal_names_the_deleted_num_fewshot(tmp_path: Path) -> None:
    demo = tmp_path / "demo"
    shutil.copytree(ROOT / "examples", demo, ignore=shutil.ignore_patterns("checkpoints"))
    suite = demo / "gatekeeper.yaml"
    text = suite.read_text()
    assert "  - name: demo_mc\n    num_fewshot: 0\n" in text
    suite.write_text(text.replace("  - name: demo_mc\n    num_fewshot: 0\n", "  - name: demo_mc\n", 1))
    r = subprocess.run([sys.executable, "-m", "gatekeeper", "compare", str(demo / ".gatekeeper" / "baselines" / "demo.json.gz"),
                        str(ROOT / "tests" / "fixtures" / "demo-regressed-run"), "--suite", str(suite)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "(the suite changed what it measures: tasks[demo_mc].num_fewshot: 0 -> unset)" in r.stderr, r.stderr
