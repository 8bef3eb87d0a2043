"""A task YAML's relative data_files mean the YAML's folder, from any working directory (#17, 6).

lm-eval resolves them against the process's working directory, so a suite that worked from the
repository root failed from anywhere else.

The processes share the session's datasets cache (and so start warm, tests/warm_start.py): each
test's data files lie in its own folder, and datasets keys a local file's cache by its path and
modification time, so no test reads another's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed")

TASK = """\
task: json_arith
dataset_path: json
dataset_kwargs:
  data_files: {{test: {data}}}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: choices
doc_to_target: label
metric_list:
  - {{metric: acc, aggregation: mean, higher_is_better: true}}
metadata: {{version: 1.0}}
"""
SUITE = """\
name: json_demo
lm_eval_version: "0.4.13"
include_path: tasks
model: {dtype: float32, batch_size: 16}
tasks:
  - name: json_arith
    limit: 20
"""


def _project(tmp_path: Path, data: str) -> Path:
    project = tmp_path / "project"
    (project / "tasks" / "data").mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "tasks" / "data" / "arith.jsonl", project / "tasks" / "data" / "arith.jsonl")
    (project / "tasks" / "json_arith.yaml").write_text(TASK.format(data=data))
    (project / "gatekeeper.yaml").write_text(SUITE)
    return project


def _env() -> dict[str, str]:
    return {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1"}


def _run(project: Path, cwd: Path, out: Path) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "gatekeeper", "run", "--suite", str(project / "gatekeeper.yaml"),
                           "--model", str(ROOT / "examples" / "checkpoints" / "base"), "--out", str(out)],
                          cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)


def test_relative_data_files_are_read_beside_the_task_yaml_from_anywhere(tmp_path: Path) -> None:
    project = _project(tmp_path, "data/arith.jsonl")
    r = _run(project, tmp_path / "somewhere" / "else", tmp_path / "out")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (results,) = (tmp_path / "out").rglob("results_*.json")
    data = json.loads(results.read_text())
    assert data["n-samples"]["json_arith"]["effective"] == 20
    # The config keeps the path as written: runs and baselines stay portable between machines.
    assert data["configs"]["json_arith"]["dataset_kwargs"]["data_files"] == {"test": "data/arith.jsonl"}


def test_a_path_relative_to_the_working_directory_says_how_to_write_it(tmp_path: Path) -> None:
    project = _project(tmp_path, "tasks/data/arith.jsonl")  # works with plain lm_eval from project/ only
    r = _run(project, project, tmp_path / "out")
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "json_arith.yaml: data_files 'tasks/data/arith.jsonl' exists relative to the working directory, " \
           "not to the task file; write it relative to " in r.stderr
    assert "Traceback" not in r.stderr


def test_data_outside_the_include_path_is_refused(tmp_path: Path) -> None:
    project = _project(tmp_path, "../../elsewhere.jsonl")
    r = _run(project, tmp_path, tmp_path / "out")
    assert r.returncode == 2 and "points outside the include_path" in r.stderr, r.stderr[-2000:]


def test_a_suite_dataset_run_in_another_folder_is_comparable(tmp_path: Path) -> None:
    """The suite's ``dataset:`` data files are recorded as written (relative to the suite), so a
    baseline recorded in one checkout gates a run from another (a pull request's base tree)."""
    runs = []
    for where in ("checkout-a", "checkout-b"):
        project = _project(tmp_path / where, "data/arith.jsonl")
        suite = project / "gatekeeper.yaml"
        suite.write_text(SUITE.replace("    limit: 20\n", "    limit: 20\n    dataset: {path: json, kwargs: "
                                       "{data_files: {test: tasks/data/arith.jsonl}}}\n"))
        r = _run(project, tmp_path / where / "cwd", tmp_path / where / "out")
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        runs.append(tmp_path / where / "out")
    (results,) = runs[0].rglob("results_*.json")
    files = json.loads(results.read_text())["configs"]["json_arith"]["dataset_kwargs"]["data_files"]
    assert files == {"test": "tasks/data/arith.jsonl"}
    cmp = subprocess.run([sys.executable, "-m", "gatekeeper", "compare", str(runs[0]), str(runs[1]), "--suite",
                          str(tmp_path / "checkout-b" / "project" / "gatekeeper.yaml")],
                         capture_output=True, text=True, timeout=300)
    assert cmp.returncode == 0, cmp.stdout[-2000:] + cmp.stderr[-2000:]
    assert "differs" not in cmp.stdout + cmp.stderr


GROUP_TASK = TASK.replace("task: json_arith\ndataset_path: json\n", "task: {name}\ndataset_path: {path}\n")


def _group_project(tmp_path: Path, members: dict[str, str]) -> Path:
    """A group ``g`` of json tasks (``members``: task -> the dataset_path its YAML loads), and a
    suite whose entry for the group overrides the dataset with a 7-item file beside the suite."""
    project = tmp_path / "project"
    (project / "tasks" / "data").mkdir(parents=True)
    rows = (ROOT / "examples" / "tasks" / "data" / "arith.jsonl").read_text().splitlines(keepends=True)
    (project / "tasks" / "data" / "arith.jsonl").write_text("".join(rows[:20]))
    (project / "pinned").mkdir()
    (project / "pinned" / "seven.jsonl").write_text("".join(rows[20:27]))
    for name, path in members.items():
        (project / "tasks" / f"{name}.yaml").write_text(GROUP_TASK.format(name=name, path=path, data="data/arith.jsonl"))
    (project / "tasks" / "g.yaml").write_text(
        "group: g\ntask: [" + ", ".join(members) + "]\naggregate_metric_list:\n"
        "  - {metric: acc, aggregation: mean, weight_by_size: true}\nmetadata: {version: 1.0}\n")
    (project / "gatekeeper.yaml").write_text(SUITE.replace(
        "  - name: json_arith\n    limit: 20\n",
        "  - name: g\n    dataset: {path: json, kwargs: {data_files: {test: pinned/seven.jsonl}}}\n"))
    return project


def _dry_run(project: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gatekeeper", "gate", "--suite", "gatekeeper.yaml", "--model",
                           str(ROOT / "examples" / "checkpoints" / "base"), "--dry-run", "--record-missing"],
                          cwd=project, env=_env(), capture_output=True, text=True, timeout=600)


def test_a_group_entry_s_dataset_applies_to_each_of_its_tasks(tmp_path: Path) -> None:
    """Issue #41: a `dataset:` override on a group entry (MMLU: one revision for 57 subjects) was
    refused ("set it on each of its tasks"). It now applies to every member that loads that
    dataset, its data files read beside the suite."""
    proc = _dry_run(_group_project(tmp_path, {"g_a": "json", "g_b": "json"}))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "items: 14 in 2 tasks (g_a 7, g_b 7)" in proc.stdout, proc.stdout


def test_a_group_s_dataset_names_the_tasks_that_load_another(tmp_path: Path) -> None:
    project = _group_project(tmp_path, {"g_a": "json", "g_b": "json", "g_c": "org/other"})
    proc = _dry_run(project)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert ("tasks g: dataset 'json' applies to each of the group's tasks, and g_c (org/other) load another"
            in proc.stderr), proc.stderr


def test_an_override_whose_file_lacks_a_column_names_the_task_the_file_and_the_column(tmp_path: Path) -> None:
    """Issue #58: a `dataset:` override whose file lacks a field the prompt uses ended in jinja's
    `UndefinedError: 'question' is undefined`."""
    project = _project(tmp_path, "data/arith.jsonl")
    rows = [json.loads(x) for x in (project / "tasks/data/arith.jsonl").read_text().splitlines()[:20]]
    (project / "other.jsonl").write_text("".join(json.dumps({"q": r.pop("question"), **r}) + "\n" for r in rows))
    (project / "gatekeeper.yaml").write_text(SUITE + "    dataset: {path: json, kwargs: {data_files: {test: other.jsonl}}}\n")
    proc = _dry_run(project)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert ("tasks json_arith: dataset: the data file(s) other.jsonl of this override lack the column 'question'"
            in line), line
    assert "UndefinedError" not in line
