"""Issue #10 item 9: untrusted names cannot become workflow commands through the CLI's output.

A CI runner executes any stdout/stderr line that starts with ``::`` (``::add-mask::``,
``::set-output``), and the older ``##[command]`` form anywhere in a line. Task, metric and
model names come from results files, i.e. from whoever produced the run. Every test runs the
real CLI in a subprocess on real lm-eval 0.4.13 output (the dummy-model fixture) whose names
were edited to carry a newline and a command.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lmeval_fixtures import *  # noqa: F403 - the session's lm-eval runs
from tests.lmeval_fixtures import results_path

ROOT = Path(__file__).resolve().parents[1]
EVIL_TASK = "synth_ppl\n::add-mask::x"
EVIL_MODEL = "dummy-good\r\n::set-output name=verdict::pass\n##[add-mask]y"
# What a runner would execute: a line starting with "::" (after blanks), or holding "##[".
COMMAND_LINE = re.compile(r"^\s*::|##\[", re.M)


def gk(*args: str | Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), GITHUB_ACTIONS="true", TQDM_DISABLE="1")
    return subprocess.run([sys.executable, "-m", "gatekeeper", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def _rename(obj, old: str, new: str):
    """Every string equal to ``old`` (keys included) in a JSON value, replaced by ``new``."""
    if isinstance(obj, dict):
        return {(new if k == old else k): _rename(v, old, new) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rename(v, old, new) for v in obj]
    return new if obj == old else obj


def _evil_copy(src: Path, dst: Path, *, task: bool, model: bool) -> Path:
    """A copy of an lm-eval output dir with the task ``synth_ppl`` and/or the model renamed."""
    import shutil

    shutil.copytree(src, dst)
    path = results_path(dst)
    data = json.loads(path.read_text(encoding="utf-8"))
    if task:
        data = _rename(data, "synth_ppl", EVIL_TASK)
        (sample,) = path.parent.glob("samples_synth_ppl_*.jsonl")
        sample.rename(sample.with_name(sample.name.replace("synth_ppl", EVIL_TASK)))
    if model:
        data["model_name"] = EVIL_MODEL
        data["config"]["model_args"] = f"pretrained={EVIL_MODEL}"
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return dst


def assert_no_command(proc: subprocess.CompletedProcess) -> None:
    for stream in (proc.stdout, proc.stderr):
        assert not COMMAND_LINE.search(stream), stream[-3000:]


def test_names_in_the_terminal_report_stay_on_their_line(lmeval_runs, tmp_path):
    base = _evil_copy(lmeval_runs["good"], tmp_path / "base", task=True, model=False)
    cand = _evil_copy(lmeval_runs["good"], tmp_path / "cand", task=True, model=True)
    proc = gk("compare", base, cand)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert_no_command(proc)
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("synth_ppl")]
    assert rows and all(ln.startswith("synth_ppl\\n::add-mask::x ") for ln in rows), proc.stdout
    # The model name is shown, escaped, on the context line that names it.
    (ctx,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("context: model")]
    assert "dummy-good\\r\\n::set-output name=verdict::pass\\n#\\x23[add-mask]y" in ctx


def test_names_in_an_error_never_start_a_command(lmeval_runs, tmp_path):
    # The renamed task does not match the other run: the error names it.
    base = lmeval_runs["good"]
    cand = _evil_copy(lmeval_runs["good"], tmp_path / "cand", task=True, model=True)
    proc = gk("compare", base, cand)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "synth_ppl" in proc.stderr and "add-mask::x" in proc.stderr
    assert_no_command(proc)
    assert all(ln.startswith("gatekeeper: error: ") or not ln.lstrip().startswith(":")
               for ln in proc.stderr.splitlines())


@pytest.mark.parametrize("arg", ["--correction=x\n::add-mask::z", "x\n##[add-mask]z"])
def test_usage_errors_quote_arguments_on_one_line(arg):
    proc = gk("compare", arg, "b", "--correction", "x\n::add-mask::z")
    assert proc.returncode == 2
    assert_no_command(proc)
    assert len(proc.stderr.strip().splitlines()) == 1 or "usage:" in proc.stderr
