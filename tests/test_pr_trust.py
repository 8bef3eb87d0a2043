"""A pull request changes the model and nothing else (issue #13, one test per attack).

Each test builds a real git repository with a base commit and the attacker's head, runs the
action's entry point on a real event payload against the loopback GitHub, and checks the gate
was not opened: exit 1 on the regressed candidate, or exit 2 with one line; the planted code
never runs; the secret never reaches it; files outside the repository are untouched.

Fast tests use ``command: compare`` on baseline files (no lm-eval); the tests marked ``lmeval``
run the demo suite on the demo checkpoints.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_action_events import (
    BASE,
    REPO,
    SUITE,
    TOKEN,
    _demo_repo,
    act,
    act_subprocess,
    commit,
    commit_base,
    git,
    make_ws,
    needs_demo,
    pr_event,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """A git repository: suite, baseline, candidate runs (tests/test_action_events.py)."""
    return make_ws(tmp_path)


def _error_line(res: dict) -> str:
    lines = [ln for ln in res["out"].splitlines() if ln.startswith("::error")]
    assert res["code"] == 2 and len(lines) == 1 and "Traceback" not in res["err"], res["out"][-3000:]
    return lines[0]


# ----------------------------------------------------------------------------- 1. symlinks


def test_a_pr_that_links_its_baseline_to_a_regressed_history_entry_is_refused(ws, gh, capfd):
    history = ws / ".gatekeeper/baselines/history"
    history.mkdir()
    shutil.copy(ws / "runs/regressed.json.gz", history / "demo.20261101T000000Z.json.gz")
    commit_base(ws)
    baseline = ws / ".gatekeeper/baselines/demo.json.gz"
    baseline.unlink()
    baseline.symlink_to("history/demo.20261101T000000Z.json.gz")
    commit(ws, "head: the baseline is an old, regressed entry now")
    res = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/regressed.json.gz")
    line = _error_line(res)
    assert ".gatekeeper/baselines/demo.json.gz: the baseline path is a symlink in the checkout" in line


def test_a_pr_that_deletes_the_anchor_is_still_judged_against_the_bases(ws, gh, capfd):
    """The anchor (the approved reference) comes from the base commit like the baseline: a PR that
    deletes it, or replaces it with its own candidate, cannot turn drift into a pass."""
    baselines = ws / ".gatekeeper/baselines"
    shutil.copy(baselines / "demo.json.gz", baselines / "demo.anchor.json.gz")  # the approved reference
    shutil.copy(ws / "runs/regressed.json.gz", baselines / "demo.json.gz")  # promoted night by night since
    commit_base(ws)
    (baselines / "demo.anchor.json.gz").unlink()
    commit(ws, "head: no anchor, please")
    res = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/regressed.json.gz")
    assert res["code"] == 1 and "gatekeeper: drift (exit 1)" in res["out"], res["out"][-3000:]
    shutil.copy(ws / "runs/regressed.json.gz", baselines / "demo.anchor.json.gz")
    commit(ws, "head: the anchor is the candidate now")
    res = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/regressed.json.gz")
    assert res["code"] == 1 and "gatekeeper: drift (exit 1)" in res["out"], res["out"][-3000:]


def test_a_pr_that_links_its_suite_to_a_lenient_one_is_refused(ws, gh, capfd):
    (ws / "lenient.yaml").write_text(SUITE.replace("margin: 0.1", "margin: 0.5"))
    commit_base(ws, "gatekeeper.yaml", ".gatekeeper", "lenient.yaml")
    (ws / "gatekeeper.yaml").unlink()
    (ws / "gatekeeper.yaml").symlink_to("lenient.yaml")
    commit(ws, "head: point the suite at the lenient one", "gatekeeper.yaml")
    res = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/regressed.json.gz")
    assert "gatekeeper.yaml: the suite path is a symlink in the checkout" in _error_line(res)


def test_a_symlink_committed_at_the_base_is_refused_too(ws, gh, capfd):
    (ws / "real.json.gz").write_bytes((ws / ".gatekeeper/baselines/demo.json.gz").read_bytes())
    (ws / ".gatekeeper/baselines/demo.json.gz").unlink()
    (ws / ".gatekeeper/baselines/demo.json.gz").symlink_to("../../real.json.gz")
    commit_base(ws, "gatekeeper.yaml", ".gatekeeper", "real.json.gz")
    # the PR's checkout replaces the link with a file: the base's link is what is refused
    (ws / ".gatekeeper/baselines/demo.json.gz").unlink()
    shutil.copy(ws / "real.json.gz", ws / ".gatekeeper/baselines/demo.json.gz")
    commit(ws, "head")
    res = act(ws, gh, capfd, "pull_request", pr_event(), candidate="runs/regressed.json.gz")
    assert ".gatekeeper/baselines/demo.json.gz: the baseline is a symlink at base commit" in _error_line(res)


# ----------------------------------------------------------------------------- 7. pushes and comments


def test_a_push_to_the_pr_branch_is_gated_against_the_default_branch_not_its_own_baseline(ws, gh, capfd):
    """The PR branch re-recorded its own baseline (the regressed run) and then pushed: the push
    is not the default branch, so it is gated against the merge-base with main."""
    git(ws, "checkout", "-q", "-b", "feature")
    shutil.copy(ws / "runs/regressed.json.gz", ws / ".gatekeeper/baselines/demo.json.gz")
    head = commit(ws, "feature: re-record the baseline as the regressed run")
    git(ws, "update-ref", "refs/remotes/origin/main", "main")  # actions/checkout fetch-depth 0 has it
    gh.add_pr(12, head)
    payload = {"ref": "refs/heads/feature", "before": BASE, "after": head, "commits": [],
               "repository": {"full_name": REPO, "default_branch": "main"}}
    res = act(ws, gh, capfd, "push", payload, env_over={"GITHUB_SHA": head, "GITHUB_REF": "refs/heads/feature"},
              candidate="runs/regressed.json.gz")
    assert res["code"] == 1 and res["outputs"]["verdict"] == "fail", res["out"][-3000:]
    assert [s["state"] for s in gh.statuses] == ["failure"]
    (body,) = gh.comment_bodies(12)
    assert body.startswith("### ❌") and "push to branch feature" in body and "edits the baseline" in body


def test_a_comment_run_that_checked_out_the_pr_head_is_gated_against_the_merge_base(ws, gh, capfd):
    main = git(ws, "rev-parse", "HEAD")
    git(ws, "checkout", "-q", "-b", "pr-head")
    shutil.copy(ws / "runs/regressed.json.gz", ws / ".gatekeeper/baselines/demo.json.gz")
    commit(ws, "pr: its own baseline")
    payload = {"action": "created", "issue": {"number": 12, "pull_request": {"url": "x"}},
               "comment": {"body": "/gatekeeper"}, "repository": {"full_name": REPO, "default_branch": "main"}}
    res = act(ws, gh, capfd, "issue_comment", payload, env_over={"GITHUB_SHA": main},
              candidate="runs/regressed.json.gz")
    assert res["code"] == 1, res["out"][-3000:]  # HEAD is not GITHUB_SHA: not the trusted checkout
    assert f"from the base commit {main[:7]}" in gh.comment_bodies(12)[0]


def test_a_checkout_of_the_events_own_commit_on_the_default_branch_is_trusted(ws, gh, capfd):
    shutil.copy(ws / "runs/regressed.json.gz", ws / ".gatekeeper/baselines/demo.json.gz")
    commit(ws, "main: a maintainer promoted the regressed run (their call)")
    res = act(ws, gh, capfd, "push", {"before": BASE, "after": "x", "commits": []},
              candidate="runs/regressed.json.gz")
    assert res["code"] == 0, res["out"][-3000:]  # its own baseline: the default branch decides


def test_a_pr_never_promotes(ws, gh, capfd):
    res = act(ws, gh, capfd, "pull_request", pr_event(), command="promote", candidate="runs/regressed.json.gz")
    assert "command promote: a pull request never writes the baseline" in _error_line(res)


# ----------------------------------------------------------------------------- 8. promote through a link


@pytest.mark.lmeval
@needs_demo
def test_promote_never_writes_through_a_symlink_outside_the_repository(tmp_path):
    ws, _ = _demo_repo(tmp_path)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"precious, not a baseline")
    baseline = ws / "examples/.gatekeeper/baselines/demo.json.gz"
    baseline.unlink()
    baseline.symlink_to(outside)
    before = outside.read_bytes()
    proc = subprocess.run([sys.executable, "-m", "gatekeeper", "baseline", "promote",
                           str(ROOT / "tests/fixtures/demo-regressed-run"), "--suite", "examples/gatekeeper.yaml"],
                          cwd=ws, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "demo.json.gz: is a symlink" in proc.stderr, proc.stderr
    assert outside.read_bytes() == before and not (tmp_path / "history").exists()


# ----------------------------------------------------------------------------- 3 and 4. task code


PLANT = """
import os as _os
_marker = {marker!r}
with open(_marker, "w") as _fh:
    _fh.write(repr(dict(_os.environ)))
"""


@pytest.mark.lmeval
@needs_demo
def test_python_a_pr_adds_to_the_include_path_never_runs(tmp_path, gh):
    ws, base = _demo_repo(tmp_path)
    marker = tmp_path / "planted-ran"
    loaders = ws / "examples/tasks/loaders.py"
    loaders.write_text(loaders.read_text() + PLANT.format(marker=str(marker)))
    commit(ws, "pr: append to the task code", "examples")
    payload = json.loads(json.dumps(pr_event()).replace(BASE, base))
    res = act_subprocess(ws, gh, "pull_request", payload, command="gate", model="examples/checkpoints/regressed",
                         out="out-pr")
    assert res["code"] == 1, res["out"][-3000:] + res["err"][-2000:]
    assert not marker.exists()
    body = gh.comment_bodies(12)[0].replace("\\", "")
    assert "examples/tasks/loaders.py (edited)" in body


@pytest.mark.lmeval
@needs_demo
def test_task_code_on_the_default_branch_runs_without_the_token(tmp_path, gh):
    """Trusted task code runs, but the token and the runner's tokens are not in its environment."""
    ws, _ = _demo_repo(tmp_path)
    marker = tmp_path / "env-seen"
    loaders = ws / "examples/tasks/loaders.py"
    loaders.write_text(loaders.read_text() + PLANT.format(marker=str(marker)))
    commit(ws, "main: task code that looks at its environment", "examples")
    res = act_subprocess(ws, gh, "workflow_dispatch", {"inputs": {}}, command="run",
                         model="examples/checkpoints/base", out="out-run")
    assert res["code"] == 0, res["out"][-3000:] + res["err"][-2000:]
    seen = marker.read_text()
    assert TOKEN not in seen and "INPUT_GITHUB-TOKEN" not in seen and "ACTIONS_RUNTIME_TOKEN" not in seen


HELPER_TASK = """\
task: demo_arith_scored
custom_dataset: !function loaders.load_arith
test_split: test
output_type: generate_until
doc_to_text: "{{question}}"
doc_to_target: "{{answer}}"
generation_kwargs: {until: ["\\n", "Q:"], do_sample: false, max_gen_toks: 8}
process_results: !function scoring.process_results
metric_list:
  - {metric: exact, aggregation: mean, higher_is_better: true}
metadata: {version: 1.0}
"""
SCORING = '''\
def grade(pred, target):
    return float(pred.strip() == target.strip())


def process_results(doc, results):
    return {"exact": grade(results[0].split("Q:")[0], str(doc["answer"]))}
'''


def _scored_suite(ws: Path) -> str:
    """The demo suite plus a generation task whose !function process_results calls a helper."""
    tasks = ws / "examples/tasks"
    (tasks / "demo_arith_scored.yaml").write_text(HELPER_TASK)
    (tasks / "scoring.py").write_text(SCORING)
    suite = ws / "examples/gatekeeper.yaml"
    suite.write_text(suite.read_text() + "  - name: demo_arith_scored\n    num_fewshot: 0\n")
    return "examples/gatekeeper.yaml"


@pytest.mark.lmeval
@needs_demo
def test_a_pr_that_edits_only_a_scoring_helper_is_scored_with_the_bases(tmp_path, gh):
    ws, _ = _demo_repo(tmp_path, with_baseline=False)
    suite = _scored_suite(ws)
    base = commit(ws, "main: a scored task", "examples")
    res = act_subprocess(ws, gh, "workflow_dispatch", {"inputs": {"bootstrap": "true"}}, command="gate",
                         model="examples/checkpoints/base", out="out-bootstrap")
    assert res["code"] == 0, res["out"][-3000:] + res["err"][-2000:]
    commit(ws, "main: its baseline", "examples/.gatekeeper")
    base = git(ws, "rev-parse", "HEAD")
    helper = ws / "examples/tasks/scoring.py"
    helper.write_text(helper.read_text().replace("return float(pred.strip() == target.strip())", "return 1.0"))
    commit(ws, "pr: every answer is right now", "examples")
    payload = json.loads(json.dumps(pr_event()).replace(BASE, base))
    res = act_subprocess(ws, gh, "pull_request", payload, command="gate", model="examples/checkpoints/regressed",
                         suite=suite, out="out-pr")
    assert res["code"] == 1, res["out"][-3000:] + res["err"][-2000:]
    plain = gh.comment_bodies(12)[0].replace("\\", "")
    assert "examples/tasks/scoring.py (edited)" in plain


# ----------------------------------------------------------------------------- 5. the endpoint and its key


@pytest.fixture(scope="module")
def endpoints():
    from tests.completions_server import CompletionsServer

    ckpt = "examples/checkpoints"
    good = CompletionsServer(root=ROOT).preload(f"{ckpt}/base", f"{ckpt}/regressed").start()
    evil = CompletionsServer(root=ROOT).preload(f"{ckpt}/base").start()
    yield good, evil
    good.stop()
    evil.stop()


@pytest.mark.lmeval
@needs_demo
def test_a_pr_cannot_send_the_api_key_to_its_own_server(tmp_path, endpoints, gh):
    good, evil = endpoints
    ws, _ = _demo_repo(tmp_path, with_baseline=False)
    suite = ws / "examples/gatekeeper.yaml"
    text = suite.read_text().replace("  backend: hf\n", f"  backend: local-completions\n  base_url: {good.url}\n")
    suite.write_text(text)
    commit(ws, "main: a served endpoint", "examples")
    key = "sk-base-secret-0123456789"
    res = act_subprocess(ws, gh, "workflow_dispatch", {"inputs": {"bootstrap": "true"}}, command="gate",
                         model=str(ROOT / "examples/checkpoints/base"), out="out-bootstrap",
                         extra_env={"OPENAI_API_KEY": key})
    assert res["code"] == 0, res["out"][-3000:] + res["err"][-2000:]
    commit(ws, "main: its baseline", "examples/.gatekeeper")
    base = git(ws, "rev-parse", "HEAD")
    suite.write_text(text.replace(good.url, evil.url))
    commit(ws, "pr: my server answers as the base model", "examples")
    served_before = good.served
    payload = json.loads(json.dumps(pr_event()).replace(BASE, base))
    res = act_subprocess(ws, gh, "pull_request", payload, command="gate",
                         model=str(ROOT / "examples/checkpoints/regressed"), out="out-pr",
                         extra_env={"OPENAI_API_KEY": key})
    assert res["code"] == 1, res["out"][-3000:] + res["err"][-2000:]
    assert evil.received == 0 and good.served > served_before
    assert set(good.authorization) == {f"Bearer {key}"}  # the backend needs it: the base's server only
    body = gh.comment_bodies(12)[0].replace("\\", "")
    assert re.search(r"model\.base_url: 'http:\S+' → 'http:\S+'", body)


# ----------------------------------------------------------------------------- 6. the request cache


def _gate(suite: str, model: str, cwd: Path, cache: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gatekeeper", "gate", "--suite", suite, "--model", model,
                           "--out", str(cwd / f"out-{len(list(cwd.glob('out-*')))}")],
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT), "GATEKEEPER_CACHE": str(cache),
                                        "GATEKEEPER_CACHE_KEY": "runner-local-secret", "TQDM_DISABLE": "1",
                                        "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                                        **env},
                          capture_output=True, text=True, timeout=600)


@pytest.mark.lmeval
@needs_demo
def test_the_request_cache_never_unpickles_and_never_answers_for_another_model(tmp_path):
    sqlitedict = pytest.importorskip("sqlitedict")
    ws = tmp_path / "ws"
    shutil.copytree(ROOT / "examples", ws / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    cache = tmp_path / "cache"
    suite = "examples/gatekeeper.yaml"
    warm = _gate(suite, "examples/checkpoints/base", ws, cache)
    assert warm.returncode == 0, warm.stderr[-2000:]
    [base_db] = cache.glob("demo-*_rank0.db")
    # the cache file of the base model, copied under the name the regressed model's run will use
    first = _gate(suite, "examples/checkpoints/regressed", ws, tmp_path / "probe")
    [regressed_name] = [p.name for p in (tmp_path / "probe").glob("demo-*_rank0.db")]
    shutil.copy(base_db, cache / regressed_name)
    # and lm-eval's own (pickled) format in it, with a payload
    marker = tmp_path / "payload-ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    with sqlitedict.SqliteDict(str(cache / regressed_name), autocommit=True) as db:
        db["anything"] = Payload()
    second = _gate(suite, "examples/checkpoints/regressed", ws, cache)
    assert first.returncode == 1 and second.returncode == 1, second.stdout[-3000:] + second.stderr[-2000:]
    assert not marker.exists()
    assert "answered from the cache, " in second.stdout and " 0 answered from the cache" in second.stdout


@pytest.mark.lmeval
@needs_demo
def test_a_checkpoint_that_differs_only_in_its_shard_index_gets_its_own_cache(tmp_path):
    """Two shards in each folder (the base's and the regressed model's weights); only the index
    says which is loaded. The cache's identity covers the index: no answer is shared."""
    from safetensors.torch import load_file, save_file

    ws = tmp_path / "ws"
    shutil.copytree(ROOT / "examples", ws / "examples", ignore=shutil.ignore_patterns("__pycache__", "checkpoints"))
    weights = {name: load_file(str(ROOT / f"examples/checkpoints/{name}/model.safetensors"))
               for name in ("base", "regressed")}
    for folder, use in (("pick-base", "base"), ("pick-regressed", "regressed")):
        ckpt = ws / folder
        shutil.copytree(ROOT / "examples/checkpoints/base", ckpt, ignore=shutil.ignore_patterns("model.safetensors"))
        for name, tensors in weights.items():
            save_file(tensors, str(ckpt / f"{name}.safetensors"), metadata={"format": "pt"})
        index = {"metadata": {}, "weight_map": {k: f"{use}.safetensors" for k in weights[use]}}
        (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    cache = tmp_path / "cache"
    assert _gate("examples/gatekeeper.yaml", "pick-base", ws, cache).returncode == 0
    proc = _gate("examples/gatekeeper.yaml", "pick-regressed", ws, cache)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " 0 answered from the cache" in proc.stdout


def test_the_trust_table_names_what_the_evaluation_keeps_and_loses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #25: docs/action.md says exactly which variables the evaluation loses (and that the
    rest, HF_TOKEN included, stays); the MLflow credentials are out while lm-eval runs."""
    from gatekeeper.run.environment import API_KEYS, CI_SECRETS, TRACKING_SECRETS, evaluation_env

    table = (Path(__file__).resolve().parents[1] / "docs" / "action.md").read_text(encoding="utf-8")
    named = [n for n in CI_SECRETS if not n.startswith(("INPUT_", "ACTIONS_"))] + list(TRACKING_SECRETS) + list(API_KEYS)
    for name in named:
        assert f"`{name}`" in table, name
    assert "`ACTIONS_*`" in table and "`HF_TOKEN` included" in table
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "t0ken")
    monkeypatch.setenv("HF_TOKEN", "hf")
    with evaluation_env("hf"):
        assert "MLFLOW_TRACKING_TOKEN" not in os.environ and os.environ["HF_TOKEN"] == "hf"
    assert os.environ["MLFLOW_TRACKING_TOKEN"] == "t0ken"
