"""Only the checkpoint, at the edges too (issue #55): the suite's own paths, a linked checkpoint,
a checkpoint read from git objects, and ``python -m gatekeeper`` started in a PR's checkout.

Each vector is replayed as an attacker with a pull request would. The end-to-end cases run the
real lm-eval on the demo's base checkpoint with a suite of one task (demo_arith_gen, its first 80
items of digits, so a tokenizer whose digits swap ids changes almost every answer)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gatekeeper.baseline import gitbase
from gatekeeper.baseline.prbase import base_tree
from gatekeeper.compare.compat import check_compatible
from gatekeeper.errors import GateError
from gatekeeper.model import Provenance, RunResults
from tests.demo_runs import lm_eval_installed
from tests.test_action_events import BASE, TOKEN, act_subprocess, commit, git, make_ws, pr_event
from tests.test_sealed import _tokenizer

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
CONSOLE = str(Path(sys.executable).parent / "gatekeeper")
needs_lm_eval = pytest.mark.skipif(not lm_eval_installed(), reason="lm-eval is not installed")
SECRET = "hf_runnerSecretToken0123456789abcdef"

SUITE = """\
name: tok
lm_eval_version: "0.4.13"
include_path: tasks
baseline: .gatekeeper/baselines/tok.json.gz
model: {backend: hf, dtype: float32, batch_size: 16, device: cpu, tokenizer: ./tok}
seeds: {random: 1234, numpy: 1234, torch: 1234, fewshot: 1234}
policy: {alpha: 0.05, correction: holm, margin: 0.0}
tasks:
  - name: demo_arith_gen
    num_fewshot: 0
    limit: 80
    metrics:
      - {metric: exact_match, filter: strict-match, margin: 0.02}
      - {metric: exact_match, filter: flexible-extract, gate: false}
"""


def _gate(ws: Path, *extra: str, suite: str = "gatekeeper.yaml") -> subprocess.CompletedProcess:
    out = ws.parent / f"out-{time.monotonic_ns()}"
    (ws.parent / "last.json").unlink(missing_ok=True)
    return subprocess.run([CONSOLE, "gate", "--suite", suite, "--model", str(EXAMPLES / "checkpoints/base"),
                           "--out", str(out), "--json", str(ws.parent / "last.json"), "--no-history", *extra],
                          cwd=ws, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def tok_repo(tmp_path_factory) -> Path:
    """A repository whose suite names its own tokenizer folder ``./tok``; baseline recorded, committed."""
    ws = tmp_path_factory.mktemp("tok") / "ws"
    ws.mkdir()
    (ws / "gatekeeper.yaml").write_text(SUITE)
    shutil.copytree(EXAMPLES / "tasks", ws / "tasks", ignore=shutil.ignore_patterns("__pycache__"))
    _tokenizer(ws / "tok")
    git(ws, "init", "-q", "-b", "main")
    first = _gate(ws, "--record-missing")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    commit(ws, "base", "gatekeeper.yaml", "tasks", "tok", ".gatekeeper")
    git(ws, "tag", "base")
    return ws


def _unchanged(ws: Path) -> None:
    rows = json.loads((ws.parent / "last.json").read_text())["comparisons"]
    assert rows and all(r["verdict"] == "unchanged" and r["delta"] == 0 for r in rows), rows


@pytest.mark.lmeval
@needs_lm_eval
def test_a_prs_edit_of_the_suites_tokenizer_changes_nothing_on_the_cli_and_the_action(tok_repo: Path, gh) -> None:
    """Before: the PR's ``tok/`` was loaded (exact_match 0.86 → 0.06, exit 1, no comparability
    error). Now ``./tok`` is the suite's: read beside the suite file, which is the base commit's."""
    ws = tok_repo
    base = git(ws, "rev-parse", "base")
    git(ws, "checkout", "-q", "-b", "pr-tok")
    shutil.rmtree(ws / "tok")
    _tokenizer(ws / "tok", swap=True)
    commit(ws, "pr: my own tokenizer", "tok")
    try:
        cli = _gate(ws, "--from-commit", base)
        assert cli.returncode == 0, cli.stdout[-3000:] + cli.stderr[-3000:]
        _unchanged(ws)
        shutil.copytree(EXAMPLES / "checkpoints/base", ws / "ckpt")
        payload = json.loads(json.dumps(pr_event()).replace(BASE, base))
        res = act_subprocess(ws, gh, "pull_request", payload, command="gate", suite="gatekeeper.yaml", model="ckpt",
                             out="out-pr", extra_env={"PYTHONSAFEPATH": ""})
        assert res["code"] == 0 and res["outputs"]["verdict"] == "pass", res["out"][-3000:] + res["err"][-2000:]
    finally:
        shutil.rmtree(ws / "ckpt", ignore_errors=True)
        git(ws, "checkout", "-q", "-f", "main")


@pytest.mark.lmeval
@needs_lm_eval
def test_a_tokenizer_edited_since_the_baseline_is_a_comparability_error_naming_the_file(tok_repo: Path) -> None:
    ws = tok_repo
    shutil.rmtree(ws / "tok")
    _tokenizer(ws / "tok", swap=True)
    try:
        res = _gate(ws)
        assert res.returncode == 2, res.stdout[-3000:] + res.stderr[-3000:]
        assert "model.tokenizer files changed since the baseline (tokenizer.json)" in res.stderr, res.stderr[-2000:]
    finally:
        git(ws, "checkout", "-q", "-f", "--", "tok")


def test_a_pr_cannot_repoint_the_suites_paths_into_its_own_tree(tmp_path: Path) -> None:
    """The base tree holds the base commit's ``tok/`` (a PR's edit is not read), and an absolute
    path into the repository, which the PR writes, is refused."""
    ws = tmp_path / "ws"
    (ws / ".gatekeeper/baselines").mkdir(parents=True)
    (ws / "gatekeeper.yaml").write_text(SUITE.replace("include_path: tasks\n", ""))
    _tokenizer(ws / "tok")
    git(ws, "init", "-q", "-b", "main")
    commit(ws, "base", "gatekeeper.yaml", "tok")
    base = git(ws, "rev-parse", "HEAD")
    original = (ws / "tok/tokenizer.json").read_bytes()
    (ws / "tok/tokenizer.json").write_text("{}")  # the PR's edit, in the working tree
    with base_tree(ws, base, "gatekeeper.yaml", need_baseline=False) as tree:
        assert (tree.root / "tok/tokenizer.json").read_bytes() == original
    absolute = SUITE.replace("include_path: tasks\n", "").replace("./tok", str(ws / "tok"))
    (ws / "gatekeeper.yaml").write_text(absolute)
    commit(ws, "base: an absolute tokenizer path", "gatekeeper.yaml")
    with pytest.raises(GateError, match=r"model.tokenizer: .*/tok lies inside the repository, which the pull request"):
        with base_tree(ws, git(ws, "rev-parse", "HEAD"), "gatekeeper.yaml", need_baseline=False):
            pass
    missing = SUITE.replace("include_path: tasks\n", "").replace("./tok", "./adapters/none")
    (ws / "gatekeeper.yaml").write_text(missing)
    commit(ws, "base: a path the commit lacks", "gatekeeper.yaml")
    with pytest.raises(GateError, match=r"model.tokenizer: ./adapters/none is not in the base commit"):
        with base_tree(ws, git(ws, "rev-parse", "HEAD"), "gatekeeper.yaml", need_baseline=False):
            pass


def _run(manifest: dict) -> RunResults:
    return RunResults(series={}, provenance=Provenance(source="test", manifest=manifest))


def test_tokenizer_and_adapter_files_are_compared_with_the_baseline() -> None:
    before = {"tokenizer_files": {"tokenizer.json": "a" * 64, "vocab.txt": "b" * 64},
              "model_arg_files": {"peft": {"adapter_model.safetensors": "c" * 64}}}
    same = check_compatible(_run(before), _run(json.loads(json.dumps(before))))
    assert not [d for d in same if d.severity == "error"]
    after = {"tokenizer_files": {"tokenizer.json": "d" * 64, "vocab.txt": "b" * 64},
             "model_arg_files": {"peft": {"adapter_model.safetensors": "e" * 64}}}
    errors = [d.message for d in check_compatible(_run(before), _run(after)) if d.severity == "error"]
    assert any(m.startswith("model.tokenizer files changed since the baseline (tokenizer.json)") for m in errors)
    assert any(m.startswith("model.model_args.peft files changed since the baseline (adapter_model.safetensors)")
               for m in errors)
    # A baseline that recorded none (older, or a hub tokenizer offline) is not compared.
    assert not [d for d in check_compatible(_run({}), _run(after)) if d.severity == "error"]


# ----------------------------------------------------------------------------- the dry run, in a second


@pytest.mark.parametrize(("setting", "says"), [
    ("tokenizer: checkpoints/base", "model.tokenizer: checkpoints/base is not a path, and as a hub id it is not in "
                                    "the Hugging Face cache"),
    ("model_args: {peft: ./adapters/lora}", "model.model_args.peft: ./adapters/lora does not exist"),
    ("tokenizer: ./tok", "model.tokenizer: ./tok does not exist"),
])
def test_the_dry_run_checks_every_model_path_in_about_a_second(tmp_path: Path, setting: str, says: str) -> None:
    """A tokenizer or adapter the gate would fail on after loading the model (66 s, 33 s before)
    fails the dry run at once, naming the key; paths are relative to the suite's folder."""
    suite_dir = tmp_path / "project"
    shutil.copytree(EXAMPLES, suite_dir, ignore=shutil.ignore_patterns(".gatekeeper-work", "__pycache__"))
    text = (suite_dir / "gatekeeper.yaml").read_text()
    (suite_dir / "gatekeeper.yaml").write_text(text.replace("  trust_remote_code: false\n",
                                                            f"  trust_remote_code: false\n  {setting}\n"))
    other = tmp_path / "elsewhere"
    other.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    t0 = time.monotonic()
    res = subprocess.run([CONSOLE, "gate", "--suite", str(suite_dir / "gatekeeper.yaml"), "--model",
                          str(suite_dir / "checkpoints/base"), "--dry-run"], cwd=other, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    (line,) = res.stderr.strip().splitlines()
    assert says in line and "Traceback" not in res.stderr, line
    if setting.startswith("tokenizer: checkpoints"):
        assert "write it as ./checkpoints/base" in line
    assert time.monotonic() - t0 < 60  # before: after the model loaded (33-66 s); now before lm-eval loads


def test_model_paths_are_relative_to_the_suite_not_the_working_folder(tmp_path: Path) -> None:
    from gatekeeper.run.modelref import absolute_model_paths

    m = {"tokenizer": "./tok", "model_args": {"peft": "../adapters/lora", "delta": "org/delta", "dtype": "float16"}}
    got = absolute_model_paths(m, tmp_path / "suite")
    assert got["tokenizer"] == str(tmp_path / "suite/tok")
    assert got["model_args"] == {"peft": str(tmp_path / "adapters/lora"), "delta": "org/delta", "dtype": "float16"}


# ----------------------------------------------------------------------------- a linked checkpoint


def test_a_prs_linked_checkpoint_never_prints_a_runner_file_in_the_summary(tmp_path: Path, gh) -> None:
    """Before: checkpoints/candidate → $HF_HOME/token printed the token in the job summary (the
    PR comment body). Now the link is refused by name, and the file's text is nowhere."""
    (tmp_path / "repo").mkdir()
    ws = make_ws(tmp_path / "repo")
    home = tmp_path / "hf-home"
    home.mkdir()
    (home / "token").write_text(SECRET + "\n")
    (ws / "checkpoints").mkdir()
    (ws / "checkpoints/candidate").symlink_to(home / "token")
    base = git(ws, "rev-parse", "HEAD")
    payload = json.loads(json.dumps(pr_event()).replace(BASE, base))
    res = act_subprocess(ws, gh, "pull_request", payload, command="gate", suite="gatekeeper.yaml",
                         model="checkpoints/candidate", extra_env={"HF_HOME": str(home)})
    assert res["code"] == 2, res["out"][-2000:] + res["err"][-2000:]
    assert "checkpoints/candidate is a symlink that leaves the workspace" in res["summary"]
    for text in (res["summary"], res["out"], res["err"], res["outputs_text"], *gh.comment_bodies(12)):
        assert SECRET not in text
    assert TOKEN not in res["summary"]


# ----------------------------------------------------------------------------- a checkpoint from git objects


def test_a_checkpoint_read_from_git_objects_is_plain_files_only(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "ckpt/sub").mkdir(parents=True)
    (ws / "ckpt/config.json").write_text("{}")
    (ws / "ckpt/sub/model.safetensors").write_bytes(b"\0" * 32)
    git(ws, "init", "-q", "-b", "main")
    commit(ws, "ckpt", "ckpt")
    repo = gitbase.find_repo(ws)
    good = git(ws, "rev-parse", "HEAD")
    out = gitbase.export_folder(repo, good, "ckpt", tmp_path / "out/ckpt")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "config.json", "sub/model.safetensors"]
    (ws / "ckpt/tokenizer.json").symlink_to("/etc/hostname")
    commit(ws, "a link", "ckpt")
    with pytest.raises(GateError, match="ckpt/tokenizer.json: is a symlink at commit"):
        gitbase.export_folder(repo, git(ws, "rev-parse", "HEAD"), "ckpt", tmp_path / "out2/ckpt")
    (ws / "ckpt/tokenizer.json").unlink()
    (ws / "ckpt/model.safetensors").write_bytes(b"version https://git-lfs.github.com/spec/v1\noid sha256:"
                                                + b"0" * 64 + b"\nsize 12\n")
    commit(ws, "an LFS pointer whose object is not here", "ckpt")
    env_path = os.environ.get("PATH", "")
    with pytest.raises(GateError, match="ckpt/model.safetensors: a git LFS pointer whose object could not be read"):
        gitbase.export_folder(repo, git(ws, "rev-parse", "HEAD"), "ckpt", tmp_path / "out3/ckpt")
    assert os.environ.get("PATH", "") == env_path
    with pytest.raises(GateError, match="nope: no such folder at commit"):
        gitbase.export_folder(repo, good, "nope", tmp_path / "out4/nope")


# ----------------------------------------------------------------------------- python -m gatekeeper in a checkout


@pytest.mark.parametrize("module", ["gatekeeper", "gatekeeper.action"])
def test_python_m_gatekeeper_imports_nothing_from_the_working_folder(tmp_path: Path, module: str) -> None:
    """A PR's ``numpy/__init__.py`` (and ``yaml``) ran before the seal under ``python -m gatekeeper``."""
    marker = tmp_path / "ran"
    for name in ("numpy", "yaml"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"open({str(marker)!r}, 'a').write({name!r})\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")}
    env.update(GITHUB_WORKSPACE=str(tmp_path), GITHUB_EVENT_NAME="", GITHUB_STEP_SUMMARY=str(tmp_path / "s.md"))
    args = ["--help"] if module == "gatekeeper" else []
    res = subprocess.run([sys.executable, "-m", module, *args], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode in (0, 2), res.stdout[-2000:] + res.stderr[-2000:]
    assert not marker.exists(), marker.read_text()
