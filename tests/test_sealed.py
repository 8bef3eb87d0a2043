"""The sealed evaluation: a pull request brings the model and nothing else (issues #36, #42).

Each vector is replayed as an attacker with a pull request would: the base commit holds a suite
whose tasks read a hub dataset (``gk-test/capitals``, from the loopback hub in tests/hub_server.py),
score with an HF ``evaluate`` metric (``gk_match``, a legitimate copy cached in HF_HOME), and
tokenize with a hub tokenizer (``gk-test/tok``); the PR's head commits

- ``gk_match/gk_match.py``: ``evaluate.load`` imported ``./NAME/NAME.py`` from the working folder;
- ``pip/__init__.py`` and ``pip/__main__.py``: torch's ``collect_env`` (lm-eval's environment report) runs ``python -m pip``
  in the working folder;
- ``gk-test/capitals/``: ``datasets`` read that folder instead of the hub;
- ``gk-test/tok/``: transformers read that folder instead of the hub (a tokenizer whose digits take
  each other's ids, which changes the arithmetic answers).

The gate runs through the console script (``gatekeeper gate --from-commit BASE``) and through the
action's entry outside its image (no PYTHONSAFEPATH). The same model passes (every item as in
the baseline), and no payload runs. A hub dataset whose ``main`` moves after the baseline was
recorded changes nothing either: the baseline's commit is evaluated (online and offline).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gatekeeper.baseline import store
from gatekeeper.errors import GateError
from gatekeeper.run import sealed
from gatekeeper.suite.suite import load_suite
from tests.demo_runs import lm_eval_installed
from tests.hub_server import Hub, hub_env
from tests.test_action_events import BASE, act_subprocess, commit, git, pr_event
from tests.test_hub_datasets import TASK as HUB_TASK  # the same hub_capitals task over gk-test/capitals

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
CONSOLE = str(Path(sys.executable).parent / "gatekeeper")
needs_lm_eval = pytest.mark.skipif(not lm_eval_installed(), reason="lm-eval is not installed")

SUITE = """\
name: sealed
lm_eval_version: "0.4.13"
include_path: tasks
baseline: .gatekeeper/baselines/sealed.json.gz
model: {backend: hf, dtype: float32, batch_size: 16, device: cpu, tokenizer: gk-test/tok}
seeds: {random: 1234, numpy: 1234, torch: 1234, fewshot: 1234}
policy: {alpha: 0.05, correction: holm, margin: 0.0}
tasks:
  - name: hub_capitals
    num_fewshot: 0
    limit: 40
    metrics:
      - {metric: acc, filter: none, margin: 0.02}
  - name: arith_match
    num_fewshot: 0
    limit: 30
    metrics:
      - {metric: gk_match, filter: none, margin: 0.02}
"""
METRIC_TASK = """\
task: arith_match
dataset_path: json
dataset_kwargs: {data_files: {test: data/arith.jsonl}}
test_split: test
output_type: generate_until
doc_to_text: "{{question}}"
doc_to_target: "{{answer}}"
generation_kwargs: {until: ["\\n", "Q:"], do_sample: false, max_gen_toks: 4}
metric_list:
  - {metric: gk_match, aggregation: mean, higher_is_better: true, hf_evaluate: true}
metadata: {version: 1.0}
"""
METRIC = '''\
import datasets
import evaluate


class GkMatch(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(description="exact match", citation="", inputs_description="",
                                   features=datasets.Features({"predictions": datasets.Value("string"),
                                                               "references": datasets.Value("string")}))

    def _compute(self, predictions, references):
        return {"gk_match": sum(p.strip() == r.strip() for p, r in zip(predictions, references)) / len(predictions)}
'''
PAYLOAD = """
import os as _os
with open({marker!r}, "a") as _fh:
    _fh.write({name!r} + "\\n")
"""


def _hub_dataset(folder: Path, rows: int, relabel: bool = False) -> Path:
    (folder / "data").mkdir(parents=True)
    lines = (EXAMPLES / "tasks/data/capitals.jsonl").read_text().splitlines()[:rows]
    if relabel:  # another commit of the dataset: every answer moved to the first choice
        lines = [json.dumps({**json.loads(x), "label": 0}) for x in lines]
    (folder / "data/test.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def _tokenizer(folder: Path, swap: bool = False) -> Path:
    folder.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(EXAMPLES / "checkpoints/base" / name, folder / name)
    if swap:
        data = json.loads((folder / "tokenizer.json").read_text())
        vocab = data["model"]["vocab"]
        for prefix in ("", "\u0120"):  # each digit, bare and after a space, takes the next digit's id
            ids = [vocab[f"{prefix}{d}"] for d in range(10) if f"{prefix}{d}" in vocab]
            for d, i in zip([d for d in range(10) if f"{prefix}{d}" in vocab], ids[1:] + ids[:1], strict=True):
                vocab[f"{prefix}{d}"] = i
        (folder / "tokenizer.json").write_text(json.dumps(data))
    return folder


def _cached_metric(hf_home: Path) -> None:
    """A legitimate gk_match in HF_HOME, where evaluate.load finds it when the hub has none."""
    folder = hf_home / "modules/evaluate_modules/metrics/evaluate-metric--gk_match" / ("0" * 64)
    folder.mkdir(parents=True)
    for init in (hf_home / "modules/evaluate_modules", folder.parent.parent, folder.parent, folder):
        (init / "__init__.py").touch()
    (folder / "gk_match.py").write_text(METRIC)


@pytest.fixture
def world(tmp_path: Path):
    """(workspace repository at its base commit, hub, environment): the baseline recorded by the
    console script on the default branch."""
    ws = tmp_path / "ws"
    (ws / "tasks/data").mkdir(parents=True)
    (ws / "gatekeeper.yaml").write_text(SUITE)
    (ws / "tasks/hub_capitals.yaml").write_text(HUB_TASK)
    (ws / "tasks/arith_match.yaml").write_text(METRIC_TASK)
    shutil.copy(EXAMPLES / "tasks/data/arith.jsonl", ws / "tasks/data/arith.jsonl")
    hub = Hub({"gk-test/capitals": _hub_dataset(tmp_path / "hub/c1", 60)},
              models={"gk-test/tok": _tokenizer(tmp_path / "hub/tok")}).start()
    env = hub_env(hub, tmp_path / "hf-home", own_server=True, HF_HUB_DISABLE_TELEMETRY="1")  # its gates load the model
    _cached_metric(tmp_path / "hf-home")
    git(ws, "init", "-q", "-b", "main")
    first = _gate(ws, env, "base", "--record-missing")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    commit(ws, "base: suite, tasks and baseline", "gatekeeper.yaml", "tasks", ".gatekeeper")
    try:
        yield ws, hub, env
    finally:
        hub.stop()


def _gate(ws: Path, env: dict, checkpoint: str, *extra: str, **more: str) -> subprocess.CompletedProcess:
    """``gatekeeper gate`` by the console script from the checkout; its JSON report is ``<ws>/../last.json``."""
    out = Path(tempfile.mkdtemp(prefix="out-", dir=ws.parent))
    (ws.parent / "last.json").unlink(missing_ok=True)
    return subprocess.run([CONSOLE, "gate", "--suite", "gatekeeper.yaml", "--model",
                           str(EXAMPLES / "checkpoints" / checkpoint), "--out", str(out / "run"), "--json",
                           str(ws.parent / "last.json"), "--no-history", *extra],
                          cwd=ws, env={**env, **more}, capture_output=True, text=True, timeout=900)


def _unchanged(ws: Path) -> None:
    report = json.loads((ws.parent / "last.json").read_text())
    rows = {(r["task"], r["metric"]): r for r in report["comparisons"]}
    assert set(rows) == {("hub_capitals", "acc"), ("arith_match", "gk_match")}, rows
    for row in rows.values():  # the same model, the same items, the same answers
        assert row["verdict"] == "unchanged" and row["delta"] == 0, row


@pytest.mark.lmeval
@needs_lm_eval
def test_a_prs_files_never_reach_the_evaluation_through_the_console_script_or_the_action(world, gh):
    ws, hub, env = world
    base = git(ws, "rev-parse", "HEAD")
    marker = ws.parent / "payload-ran"
    (ws / "gk_match").mkdir()
    (ws / "gk_match/gk_match.py").write_text(METRIC + PAYLOAD.format(marker=str(marker), name="metric"))
    (ws / "pip").mkdir()
    (ws / "pip/__init__.py").touch()  # a regular package: it wins over the installed pip from sys.path[0]
    (ws / "pip/__main__.py").write_text(PAYLOAD.format(marker=str(marker), name="pip"))
    _hub_dataset(ws / "gk-test/capitals", 60, relabel=True)
    _tokenizer(ws / "gk-test/tok", swap=True)
    commit(ws, "pr: a metric, pip, a dataset and a tokenizer of its own", "gk_match", "pip", "gk-test")

    cli = _gate(ws, env, "base", "--from-commit", base)
    assert cli.returncode == 0, cli.stdout[-3000:] + cli.stderr[-3000:]
    _unchanged(ws)

    payload = json.loads(json.dumps(pr_event()).replace(BASE, base))
    shutil.copytree(EXAMPLES / "checkpoints/base", ws / "ckpt")  # the PR's model, in its checkout
    offline_off = {"HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0"}
    res = act_subprocess(ws, gh, "pull_request", payload, command="gate", suite="gatekeeper.yaml", model="ckpt",
                         out="out-pr", extra_env={**{k: v for k, v in env.items() if k.startswith(("HF_", "TQDM"))},
                                                  **offline_off, "PYTHONSAFEPATH": ""})
    assert res["code"] == 0, res["out"][-3000:] + res["err"][-3000:]
    assert res["outputs"]["verdict"] == "pass", res["outputs"]
    assert not marker.exists(), marker.read_text()
    # The tokenizer and the items came from the hub, never from the PR's folders of those names.
    assert any("/gk-test/tok/resolve/" in p for _, p in hub.requests), hub.requests


@pytest.mark.lmeval
@needs_lm_eval
def test_a_hub_dataset_that_moves_after_the_baseline_changes_nothing(world):
    ws, hub, env = world
    recorded = hub.sha("gk-test/capitals")
    baseline = json.loads(subprocess.run([sys.executable, "-c", (
        "import gzip, json, sys; print(json.dumps(json.load(gzip.open(sys.argv[1]))['provenance']['manifest']"
        "['datasets']))"), str(ws / ".gatekeeper/baselines/sealed.json.gz")], capture_output=True, text=True,
        check=True).stdout)
    assert baseline == {"gk-test/capitals": recorded}
    moved = hub.push("gk-test/capitals", _hub_dataset(ws.parent / "hub/c2", 60, relabel=True))

    hub.requests.clear()
    again = _gate(ws, env, "base")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    _unchanged(ws)
    asked = [p for _, p in hub.requests if p.startswith(("/datasets/", "/api/datasets/"))]
    assert asked and not [p for p in asked if moved in p or "/main" in p], asked

    dry = subprocess.run([CONSOLE, "gate", "--suite", "gatekeeper.yaml", "--model", str(EXAMPLES / "checkpoints/base"),
                          "--dry-run"], cwd=ws, env=env, capture_output=True, text=True, timeout=600)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert f"hub datasets: gk-test/capitals at {recorded[:7]} (the baseline's)" in dry.stdout

    # Offline, the cache holds both commits: the recorded one is evaluated, not the newest.
    offline = _gate(ws, env, "base", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    assert offline.returncode == 0, offline.stdout[-3000:] + offline.stderr[-3000:]

    # New data on purpose: run --new-data takes the head, promote names the move.
    new = subprocess.run([CONSOLE, "run", "--suite", "gatekeeper.yaml", "--model", str(EXAMPLES / "checkpoints/base"),
                          "--out", str(ws.parent / "new-data"), "--new-data"], cwd=ws, env=env,
                         capture_output=True, text=True, timeout=600)
    assert new.returncode == 0, new.stderr[-3000:]
    (run_dir,) = [p for p in (ws.parent / "new-data").iterdir() if p.is_dir()]
    shown = subprocess.run([CONSOLE, "compare", str(run_dir), str(run_dir), "--suite", "gatekeeper.yaml",
                            "--markdown", str(ws.parent / "same.md")], cwd=ws, env=env, capture_output=True,
                           text=True, timeout=300)
    assert shown.returncode == 0, shown.stdout[-3000:] + shown.stderr[-2000:]
    (row,) = [ln for ln in (ws.parent / "same.md").read_text().splitlines() if ln.startswith("| hub datasets |")]
    assert row.count(moved[:7]) == 2 and "capitals" in row, row
    manifest = json.loads((run_dir / "gatekeeper-manifest.json").read_text())
    assert manifest["datasets"] == {"gk-test/capitals": moved}
    # The hub tokenizer's files, as the HF cache holds them, are part of the provenance.
    tokenizer = (EXAMPLES / "checkpoints/base/tokenizer.json").read_bytes()
    assert manifest["tokenizer_files"]["tokenizer.json"] == hashlib.sha256(tokenizer).hexdigest()
    promoted = subprocess.run([CONSOLE, "baseline", "promote", str(run_dir), "--suite", "gatekeeper.yaml"],
                              cwd=ws, env=env, capture_output=True, text=True, timeout=300)
    assert promoted.returncode == 0, promoted.stderr[-3000:]
    assert f"dataset gk-test/capitals: revision {recorded[:7]} → {moved[:7]}" in promoted.stdout

    # The owner rewrites history: the locked commit is gone. One line names it and the fix.
    hub.commits[("datasets", "gk-test/capitals")] = [(moved[::-1], ws.parent / "hub/c1")]
    gone = _gate(ws, env, "base")
    assert gone.returncode == 2, gone.stdout[-3000:] + gone.stderr[-3000:]
    (line,) = [ln for ln in gone.stderr.splitlines() if "error" in ln]
    assert f"dataset gk-test/capitals: the hub ({hub.url}) has no revision '{moved}'" in line
    assert "gatekeeper run --new-data" in line and "Traceback" not in gone.stderr


@pytest.mark.lmeval
@needs_lm_eval
def test_the_dry_run_finds_items_changed_under_a_baseline_without_recorded_revisions(world):
    """A baseline recorded before revisions were recorded: the hub's head moves, and the dry run
    says which task's items changed, before any model runs."""
    ws, hub, env = world
    path = ws / ".gatekeeper/baselines/sealed.json.gz"
    recorded = store.load_baseline(path)
    del recorded.provenance.manifest["datasets"]
    suite = load_suite(ws / "gatekeeper.yaml")
    store.save_baseline(recorded, path, suite_name=suite.name, suite_hash=suite.hash)
    args = [CONSOLE, "gate", "--suite", "gatekeeper.yaml", "--model", str(EXAMPLES / "checkpoints/base"), "--dry-run"]
    same = subprocess.run(args, cwd=ws, env=env, capture_output=True, text=True, timeout=600)
    assert same.returncode == 0, same.stderr[-3000:]
    assert "baseline items: all 70 match the documents and targets built now" in same.stdout
    hub.push("gk-test/capitals", _hub_dataset(ws.parent / "hub/c2", 60, relabel=True))
    moved = subprocess.run(args, cwd=ws, env=env, capture_output=True, text=True, timeout=600)
    assert moved.returncode == 2, moved.stdout[-3000:] + moved.stderr[-3000:]
    (line,) = [ln for ln in moved.stderr.splitlines() if "error" in ln]
    assert re.search(r"task hub_capitals: [1-9]\d* of 40 of the baseline's items differ from the documents built now "
                     r"in their doc/target hash, the first doc_id \d+; likely cause: the documents changed", line), line
    assert "this baseline predates recorded dataset revisions" in line and "gatekeeper run --new-data" in line


@pytest.mark.lmeval
@needs_lm_eval
def test_a_hugging_face_cache_inside_the_repository_is_refused(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    git(ws, "init", "-q", "-b", "main")
    shutil.copytree(EXAMPLES, ws / "examples", ignore=shutil.ignore_patterns("checkpoints", ".gatekeeper-work"))
    for var, value in (("HF_HOME", ".hf-cache"), ("HF_DATASETS_CACHE", str(ws / "cache/datasets")),
                       ("HF_MODULES_CACHE", "sub/../modules")):
        env = {**os.environ, var: value}
        res = subprocess.run([CONSOLE, "gate", "--suite", "examples/gatekeeper.yaml", "--model",
                              str(EXAMPLES / "checkpoints/base"), "--no-history"], cwd=ws, env=env,
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
        (line,) = res.stderr.strip().splitlines()
        assert line.startswith(f"gatekeeper: error: {var}={value}: the Hugging Face cache ") and str(ws) in line, line
        assert "keep it outside the checkout" in line


# ----------------------------------------------------------------------------- the seal itself


def test_the_seal_switches_folder_path_and_children_and_restores_them(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONSAFEPATH", raising=False)
    (tmp_path / "pip").mkdir()
    (tmp_path / "pip/__main__.py").write_text("print('planted')\n")
    monkeypatch.setattr(sys, "path", ["", str(tmp_path), *sys.path])
    before = list(sys.path)
    with sealed.sealed() as folder:
        assert Path.cwd() == folder and not any(folder.iterdir()) and folder.stat().st_mode & 0o077 == 0
        assert "" not in sys.path and str(tmp_path) not in sys.path
        assert os.environ["PYTHONSAFEPATH"] == "1" and sealed.origin() == tmp_path
        assert sealed.absolute("a/b") == tmp_path / "a/b"
        pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True)
        assert pip.returncode == 0 and "planted" not in pip.stdout
    assert Path.cwd() == tmp_path and sys.path == before and "PYTHONSAFEPATH" not in os.environ
    assert not folder.exists()


def test_cache_variables_are_checked_where_the_libraries_read_them(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    outside = str(tmp_path / "cache")
    for env in ({"HF_HOME": str(repo / "c")}, {"XDG_CACHE_HOME": str(repo / "x")}, {"HOME": str(repo)},
                {"HF_HOME": outside, "HF_HUB_CACHE": str(repo / "hub")},
                {"HF_HOME": outside, "HUGGINGFACE_HUB_CACHE": str(repo / "hub")},
                {"HF_HOME": outside, "TRANSFORMERS_CACHE": str(repo / "t")},
                {"HF_HOME": outside, "HF_EVALUATE_CACHE": str(repo / "e")}):
        with pytest.raises(GateError, match="inside the repository"):
            sealed.check_caches([repo], env)
    sealed.check_caches([repo], {"HF_HOME": outside, "HOME": str(repo)})  # HF_HOME decides, not HOME
    link = tmp_path / "link"
    link.symlink_to(repo)
    with pytest.raises(GateError, match="HF_HOME"):  # a link into the checkout is inside it
        sealed.check_caches([repo], {"HF_HOME": str(link / "c")})


def test_a_suites_dataset_revision_must_be_a_string(tmp_path: Path) -> None:
    from gatekeeper.suite.suite import load_suite

    (tmp_path / "gatekeeper.yaml").write_text(
        'name: t\nlm_eval_version: "0.4.13"\nmodel: {backend: hf}\ntasks:\n  - name: x\n    dataset:\n'
        "      path: org/name\n      kwargs:\n        revision: 20240101\n")
    with pytest.raises(GateError) as err:
        load_suite(tmp_path / "gatekeeper.yaml")
    assert str(err.value) == (f"{tmp_path / 'gatekeeper.yaml'}:9: tasks[0].dataset.kwargs.revision: expected a "
                              'string (a commit sha, tag or branch), got 20240101; quote it: revision: "20240101"')
