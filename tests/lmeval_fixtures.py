"""Real lm-eval 0.4.13 output for the reader tests: one subprocess per test session (~12 s).

Use from a test module with ``from tests.lmeval_fixtures import *``. lm-eval runs in a
subprocess so that the test process never imports torch (the gate must work without it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "lmeval_runs",
    "metric_runs",
    "good_copy",
    "results_path",
    "samples_path",
    "edit_results",
    "edit_samples",
]

TASKS_DIR = Path(__file__).resolve().parent / "fixtures" / "lmeval_tasks"
_CACHE: dict[str, Path] = {}  # one run per session even when several modules import the fixture


@pytest.fixture(scope="session")
def lmeval_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{"good": output dir, "bad": output dir} of two real dummy-model runs (seeds 1234, 99)."""
    if "root" not in _CACHE:
        if importlib.util.find_spec("lm_eval") is None:
            pytest.skip("lm-eval is not installed")
        root = tmp_path_factory.mktemp("lmeval")
        env = dict(
            os.environ,
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            TQDM_DISABLE="1",
            HF_HOME=str(root / "hfhome"),
        )
        # Offline matters: the dummy model's tokenizer lookup otherwise retries the hub for ~50 s.
        proc = subprocess.run(
            [sys.executable, str(TASKS_DIR / "run_dummy.py"), str(root)],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"lm-eval dummy run failed:\n{proc.stderr[-4000:]}")
        _CACHE["root"] = root
    root = _CACHE["root"]
    return {"good": root / "good", "bad": root / "bad"}


METRIC_TASKS_DIR = Path(__file__).resolve().parent / "fixtures" / "metric_tasks"
METRIC_CHECKPOINTS = ("base", "harmless", "regressed")


def _metric_tasks_digest() -> str:
    import hashlib

    h = hashlib.sha256()
    for path in sorted(METRIC_TASKS_DIR.iterdir()):
        if path.is_file() and path.suffix in (".py", ".yaml") and path.name != "suite.yaml":
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _complete(root: Path) -> bool:
    return all(any((root / c).glob("*/results_*.json")) for c in METRIC_CHECKPOINTS)


@pytest.fixture(scope="session")
def metric_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{"base" | "harmless" | "regressed": output dir} of real lm-eval runs (hf backend, CPU) of
    the demo checkpoints on tests/fixtures/metric_tasks: every metric kind (~2-3 min, once).

    ``GK_METRIC_RUNS=DIR`` keeps the runs across sessions under DIR/<digest of the task files>
    (a local convenience; the default is a fresh temporary folder)."""
    if "metric_root" not in _CACHE:
        if importlib.util.find_spec("lm_eval") is None or importlib.util.find_spec("torch") is None:
            pytest.skip("lm-eval with torch is not installed")
        keep = os.environ.get("GK_METRIC_RUNS")
        root = Path(keep) / _metric_tasks_digest() if keep else tmp_path_factory.mktemp("metric_runs")
        if not _complete(root):
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                       TQDM_DISABLE="1", HF_HOME=str(root / "hfhome"))
            proc = subprocess.run([sys.executable, str(METRIC_TASKS_DIR / "run_demo.py"), str(root)],
                                  cwd=root, env=env, capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                raise RuntimeError(f"lm-eval metric-kind runs failed:\n{proc.stderr[-4000:]}")
        _CACHE["metric_root"] = root
    root = _CACHE["metric_root"]
    return {c: root / c for c in METRIC_CHECKPOINTS}


@pytest.fixture
def good_copy(lmeval_runs: dict[str, Path], tmp_path: Path) -> Path:
    """A private copy of the good run's output dir, free to corrupt."""
    dst = tmp_path / "good"
    shutil.copytree(lmeval_runs["good"], dst)
    return dst


def _model_dir(out: Path) -> Path:
    subs = [p for p in out.iterdir() if p.is_dir()]
    return subs[0] if len(subs) == 1 else out


def results_path(out: Path) -> Path:
    (path,) = sorted(_model_dir(out).glob("results_*.json"))
    return path


def samples_path(out: Path, task: str) -> Path:
    (path,) = sorted(_model_dir(out).glob(f"samples_{task}_*.jsonl"))
    return path


def edit_results(out: Path, fn: Callable[[dict[str, Any]], None]) -> Path:
    path = results_path(out)
    data = json.loads(path.read_text(encoding="utf-8"))
    fn(data)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
    return path


def edit_samples(out: Path, task: str, fn: Callable[[list[str]], list[str]]) -> Path:
    """Rewrite a samples file through ``fn(lines) -> lines`` (lines without newlines)."""
    path = samples_path(out, task)
    lines = path.read_text(encoding="utf-8").splitlines()
    path.write_text("".join(line + "\n" for line in fn(lines)), encoding="utf-8")
    return path
