"""Help writing a suite (issue #17, item 7): `gatekeeper init`, the schema's descriptions and
docs/suite.md.

`init --tasks ...` writes a suite, a task template and a workflow that pass the schema and
actionlint, and, on the demo tasks, a real `gate`: the first baseline recorded from the base
checkpoint, the regressed one failing and the harmless one passing.
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
import yaml

from gatekeeper.model import SeriesKey
from gatekeeper.suite import suite as suite_module
from gatekeeper.suite.scaffold import workflow_text
from gatekeeper.suite.suite import field_hashing, load_suite, suite_hash
from tests.test_packaging import _GitHubYamlLoader, _lint_tree, tool

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads(suite_module.SCHEMA_PATH.read_text())
needs_lm_eval = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed")
ENV = {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _gk(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gatekeeper", *args], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A repository of one's own holding the demo's task folder (as a user's own tasks)."""
    root = tmp_path / "my-project"
    shutil.copytree(ROOT / "examples" / "tasks", root / "tasks", ignore=shutil.ignore_patterns("__pycache__"))
    return root


@needs_lm_eval
def test_init_writes_a_suite_that_gates_for_real(project: Path, tmp_path: Path) -> None:
    r = _gk("init", "--tasks", "demo_mc,demo_arith_gen,demo_synth_ppl", "--include-path", "tasks",
            "--new-task", "my_qa", cwd=project)
    assert r.returncode == 0, r.stdout + r.stderr
    written = sorted(p.relative_to(project).as_posix() for p in project.rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts and p.relative_to(project).parts[0] != "tasks"
                     or p.name.startswith("my_qa"))
    assert written == [".github/workflows/gatekeeper.yml", "gatekeeper.yaml", "tasks/data/my_qa.jsonl", "tasks/my_qa.yaml"]
    suite = load_suite(project / "gatekeeper.yaml")  # the schema and every check of a suite file
    assert suite.name == "my-project" and suite.task_names == ["demo_mc", "demo_arith_gen", "demo_synth_ppl", "my_qa"]
    gated = {(r.task, r.metric, r.filter): r.margin for r in suite.policy.rules if r.gate and r.margin is not None}
    assert gated == {("demo_mc", "acc", "*"): 0.02, ("demo_arith_gen", "exact_match", "strict-match"): 0.02,
                     ("demo_synth_ppl", "word_perplexity", "*"): 0.0}
    # The template task's 3 items resolve no margin: informational until its data is the user's (#58).
    assert suite.policy.lookup(SeriesKey("my_qa", "none", "acc"))[1] is False
    assert "replace `gate: false` by `margin: 0.02`" in (project / "gatekeeper.yaml").read_text()

    base, bad, fine = (str(ROOT / "examples" / "checkpoints" / n) for n in ("base", "regressed", "harmless"))
    first = _gk("gate", "--suite", "gatekeeper.yaml", "--model", base, "--record-missing", cwd=project)
    assert first.returncode == 0 and "recorded this run as the first baseline" in first.stdout, first.stderr[-2000:]
    regressed = _gk("gate", "--suite", "gatekeeper.yaml", "--model", bad, cwd=project)
    assert regressed.returncode == 1, regressed.stdout[-2000:] + regressed.stderr[-2000:]
    assert "FAIL: gatekeeper my-project: 2 regressions: demo_mc acc" in regressed.stdout
    # The model outside the project is named by its own repository's folder, not as if it were ours.
    assert f"{ROOT.name}/examples/checkpoints/regressed in candidate" in regressed.stdout
    assert _gk("gate", "--suite", "gatekeeper.yaml", "--model", fine, cwd=project).returncode == 0


@needs_lm_eval
def test_init_workflow_passes_actionlint(project: Path, tmp_path: Path) -> None:
    tool("shellcheck")
    assert _gk("init", "--tasks", "demo_mc", "--include-path", "tasks", "--no-workflow", cwd=project).returncode == 0
    assert not (project / ".github").exists()
    text = workflow_text(suite="evals/suite.yaml", model="models/next", include_path="evals/tasks")
    lint = _lint_tree(tmp_path, {"gatekeeper.yml": text})
    assert lint.returncode == 0, lint.stdout + lint.stderr
    on = yaml.load(text, Loader=_GitHubYamlLoader)["on"]["pull_request"]["paths"]
    assert on == ["models/next/**", "evals/suite.yaml", "evals/tasks/**", ".gatekeeper/**"]


def test_the_documented_pull_request_workflow_is_what_init_writes() -> None:
    assert (ROOT / "docs" / "workflows" / "pull-request.yml").read_text() == workflow_text(
        suite="gatekeeper.yaml", model="checkpoints/candidate", include_path="tasks"), \
        "docs/workflows/pull-request.yml drifted from gatekeeper/suite/templates/pull-request.yml"


@needs_lm_eval
def test_init_refuses_typos_and_never_writes_over_a_file(project: Path) -> None:
    r = _gk("init", "--tasks", "demo_mcc", "--include-path", "tasks", cwd=project)
    assert r.returncode == 2 and "task 'demo_mcc' is not in include_path" in r.stderr, r.stderr
    assert "did you mean 'demo_mc'?" in r.stderr and not (project / "gatekeeper.yaml").exists()
    (project / "gatekeeper.yaml").write_text("mine\n")
    r = _gk("init", "--tasks", "demo_mc", "--include-path", "tasks", cwd=project)
    assert r.returncode == 2 and "gatekeeper.yaml: already exists" in r.stderr, r.stderr
    assert (project / "gatekeeper.yaml").read_text() == "mine\n" and not (project / ".github").exists()
    r = _gk("init", "--new-task", "bad name", cwd=project)
    assert r.returncode == 2 and "--new-task 'bad name'" in r.stderr


def _properties() -> list[tuple[str, str, dict]]:
    out = []
    for section, node in [("", SCHEMA["properties"]), ("model", SCHEMA["properties"]["model"]["properties"]),
                          ("seeds", SCHEMA["properties"]["seeds"]["properties"]),
                          ("policy", SCHEMA["properties"]["policy"]["properties"]),
                          ("rule", SCHEMA["$defs"]["rule"]["properties"]), ("task", SCHEMA["$defs"]["task"]["properties"]),
                          ("metric", SCHEMA["$defs"]["task"]["properties"]["metrics"]["items"]["properties"])]:
        out += [(section, key, prop) for key, prop in node.items()]
    return out


def test_every_schema_key_is_described_and_says_whether_it_is_hashed() -> None:
    for section, key, prop in _properties():
        text = prop.get("description", "")
        assert len(text) > 20, f"{section}.{key}: no description"
        said = ("not hashed" if "Not hashed" in text else "hashed when set" if "Hashed when set" in text
                else "hashed" if "Hashed" in text else None)
        if section in ("model", "task") or (section == "" and key not in ("model", "seeds", "tasks")):
            assert said == field_hashing(section, key), f"{section}.{key}: says {said}, is {field_hashing(section, key)}"


@pytest.mark.parametrize(("section", "key", "value"), [
    ("model", "dtype", "bfloat16"), ("model", "batch_size", 64), ("model", "device", "cpu"),
    ("model", "max_length", 512), ("model", "tokenizer", "gpt2"), ("task", "num_fewshot", 3),
    ("task", "cluster", "topic"), ("task", "limit", 7), ("", "baseline", "elsewhere.json.gz"),
    ("seeds", "random", 9), ("policy", "margin", 0.5),
])
def test_field_hashing_is_what_the_suite_hash_does(section: str, key: str, value: object) -> None:
    doc = {"name": "x", "lm_eval_version": "0.4.13", "tasks": [{"name": "t"}]}
    changed = json.loads(json.dumps(doc))
    target = {"": changed, "model": changed.setdefault("model", {}), "seeds": changed.setdefault("seeds", {}),
              "policy": changed.setdefault("policy", {}), "task": changed["tasks"][0]}[section]
    target[key] = value
    differs = suite_hash(doc) != suite_hash(changed)
    assert differs == (field_hashing(section, key) != "not hashed"), f"{section}.{key}"


def test_suite_reference_is_generated() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "suite_reference.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
