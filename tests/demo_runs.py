"""The bundled demo, evaluated once per test session (fixtures ``demo_gate`` / ``demo_run`` in conftest).

Each demo checkpoint is evaluated by lm-eval at most once per session, through the real gate:

- ``regressed``: the project's one end-to-end ``gatekeeper gate`` CLI run (a subprocess, exactly the
  command ``scripts/demo.sh regressed`` runs), stdout/stderr/exit code kept for the tests;
- ``base``: ``run_gate(..., record_missing=True)`` against a baseline path that does not exist yet,
  so the run also exercises recording the first baseline;
- ``harmless``: ``run_gate`` against the stored baseline.

Tests that need other gate semantics compare a run directory with the stored baseline
(``gatekeeper compare BASELINE RUN --suite examples/gatekeeper.yaml``), which costs no evaluation.
Runs use model paths relative to the repository (as the README's commands do), so reports name
``examples/checkpoints/<name>`` like the stored baseline does.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEMO_SUITE = ROOT / "examples" / "gatekeeper.yaml"
DEMO_BASELINE = ROOT / "examples" / ".gatekeeper" / "baselines" / "demo.json.gz"
DEMO_CHECKPOINTS = ("base", "harmless", "regressed")
OFFLINE_ENV = {"TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1"}
REL_TOL = 1e-5  # continuous per-item values across CPUs: ~1e-8 relative noise seen, 1000x headroom


def checkpoint_arg(name: str) -> str:
    """The --model argument the README uses (relative to the repository root)."""
    return f"examples/checkpoints/{name}"


@dataclass(frozen=True)
class DemoGate:
    """One gate of a demo checkpoint: what the tests may look at."""

    checkpoint: str
    exit_code: int
    run_dir: Path
    report: dict[str, Any]  # the JSON report (`--json`)
    baseline: Path  # the baseline file compared with, or recorded
    notice: str | None = None  # set when the run was recorded as the first baseline
    stdout: str = ""  # CLI runs only
    stderr: str = ""
    json_path: Path | None = None  # CLI runs only: where --json wrote the report


def lm_eval_installed() -> bool:
    return importlib.util.find_spec("lm_eval") is not None


@contextlib.contextmanager
def _in_repo_root() -> Iterator[None]:
    """Relative model paths, as the README's commands give them (py3.10 has no contextlib.chdir)."""
    before = os.getcwd()
    os.chdir(ROOT)
    try:
        yield
    finally:
        os.chdir(before)


def gate_cli(name: str, out: Path) -> DemoGate:
    """``gatekeeper gate`` as ``scripts/demo.sh NAME`` runs it, in a subprocess from the repo root."""
    json_path = out / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "gatekeeper", "gate", "--suite", "examples/gatekeeper.yaml",
         "--model", checkpoint_arg(name), "--print-markdown", "--json", str(json_path), "--out", str(out / "run"),
         "--no-history"],  # as scripts/demo.sh: the repository's example baseline folder stays as it is
        capture_output=True, text=True, timeout=900, cwd=ROOT, env=dict(os.environ, **OFFLINE_ENV),
    )
    if proc.returncode not in (0, 1) or not json_path.is_file():
        raise RuntimeError(f"gatekeeper gate {name} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    report = json.loads(json_path.read_text(encoding="utf-8"))
    return DemoGate(name, proc.returncode, Path(report["run_dir"]), report, DEMO_BASELINE,
                    stdout=proc.stdout, stderr=proc.stderr, json_path=json_path)


def gate_in_process(name: str, out: Path, *, baseline: Path = DEMO_BASELINE, record_missing: bool = False) -> DemoGate:
    from gatekeeper.gate import run_gate

    os.environ.update(OFFLINE_ENV)  # what scripts/test.sh exports; a local model needs no hub
    with _in_repo_root():
        result = run_gate(DEMO_SUITE, checkpoint_arg(name), out_dir=out / "run", baseline=baseline,
                          record_missing=record_missing, log=lambda *_: None)
    return DemoGate(name, result.exit_code, Path(result.run_dir), result.report_json, baseline, notice=result.notice)


def make_demo_gate(name: str, out: Path) -> DemoGate:
    if name == "regressed":
        return gate_cli(name, out)
    if name == "base":
        return gate_in_process(name, out, baseline=out / "first" / "demo.json.gz", record_missing=True)
    if name == "harmless":
        return gate_in_process(name, out)
    raise ValueError(f"not a demo checkpoint: {name!r} (one of {', '.join(DEMO_CHECKPOINTS)})")


def compare_cli(baseline: Path, candidate: Path, *extra: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``gatekeeper compare BASELINE CANDIDATE --suite examples/gatekeeper.yaml`` (no evaluation)."""
    return subprocess.run(
        [sys.executable, "-m", "gatekeeper", "compare", str(baseline), str(candidate),
         "--suite", str(DEMO_SUITE), *extra],
        capture_output=True, text=True, timeout=300, cwd=cwd,
    )


def assert_same_items(expected: Any, got: Any, *, rel: float = REL_TOL) -> None:
    """Two runs (``RunResults``) of the same checkpoint agree item by item on any CPU.

    Same series, doc ids and hashes (compared on the shorter stored prefix); right/wrong (0/1)
    values identical; continuous values (log-likelihoods, counts, scores) within ``rel``;
    corpus items (reference, prediction strings) identical.
    """
    assert expected.series and set(expected.series) == set(got.series)
    for key, e in expected.series.items():
        g = got.series[key]
        assert e.kind == g.kind, key
        assert np.array_equal(e.doc_ids, g.doc_ids), key
        width = min(len(e.hashes[0][0]), len(g.hashes[0][0]))
        assert [[h[:width] for h in row] for row in e.hashes.tolist()] == \
            [[h[:width] for h in row] for row in g.hashes.tolist()], key
        if e.kind == "corpus":
            assert (e.values == g.values).all(), key
            continue
        binary = e.kind == "mean" and np.isin(e.values, (0.0, 1.0)).all()
        if binary:
            assert np.array_equal(e.values, g.values), key  # a flipped item is a real difference
        else:
            np.testing.assert_allclose(g.values, e.values, rtol=rel, atol=0, err_msg=str(key))
