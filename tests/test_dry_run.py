"""``gatekeeper gate --dry-run`` (issue #27): every check a gate makes before it pays for the model,
the items, a time estimate and rendered prompts, in seconds; nothing evaluated, nothing written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.demo_runs import OFFLINE_ENV, lm_eval_installed

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
ENV = {**os.environ, **OFFLINE_ENV, "PYTHONPATH": str(ROOT)}

pytestmark = pytest.mark.skipif(not lm_eval_installed(), reason="lm-eval is not installed (pip install -e '.[eval]')")


def _gate(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gatekeeper", "gate", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=300)


def _listing(project: Path) -> list[Path]:
    """What is in ``project``, but Python's bytecode: importing the suite's task code writes
    tasks/__pycache__ unless PYTHONDONTWRITEBYTECODE is set, as any import does."""
    return sorted(p.relative_to(project) for p in project.rglob("*") if "__pycache__" not in p.parts)


def test_a_dry_run_checks_the_suite_and_shows_prompts_without_evaluating(tmp_path: Path) -> None:
    project = tmp_path / "p"
    shutil.copytree(EXAMPLES, project, ignore=shutil.ignore_patterns("checkpoints", "__pycache__"))
    before = _listing(project)
    model = str(EXAMPLES / "checkpoints" / "regressed")
    proc = _gate("--suite", "gatekeeper.yaml", "--model", model, "--dry-run", cwd=project)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout
    assert "every check passed, nothing evaluated" in out and "device cpu" in out
    assert "items: 750 in 4 tasks (demo_arith_gen 225, demo_arith_mc 225, demo_capitals_mc 200, demo_synth_ppl 100)" in out
    assert "matches the suite and the built tasks" in out and "s of evaluation, as the baseline's run took" in out
    assert "  > The capital of Refenor is  ⟶ Fizu | Titeb | Figat | Pifug" in out
    assert out.count("the first 3 requests as lm-eval builds them") == 4
    assert _listing(project) == before  # nothing written

    # What a gate would refuse, a dry run refuses: a typo, a margin in the wrong units, a missing model.
    suite = (project / "gatekeeper.yaml").read_text()
    (project / "typo.yaml").write_text(suite.replace("- name: demo_arith_gen", "- name: demo_arith_gem"))
    bad = _gate("--suite", "typo.yaml", "--model", model, "--dry-run", cwd=project)
    assert bad.returncode == 2 and "did you mean 'demo_arith_gen'" in bad.stderr, bad.stderr
    (project / "units.yaml").write_text(suite.replace("{metric: acc, filter: none, margin: 0.02}",
                                                      "{metric: acc, filter: none, margin: 2}"))
    bad = _gate("--suite", "units.yaml", "--model", model, "--dry-run", cwd=project)
    assert bad.returncode == 2 and "margin 2 is at or beyond the whole range" in bad.stderr, bad.stderr
    bad = _gate("--suite", "gatekeeper.yaml", "--model", "./checkpoints/nope", "--dry-run", cwd=project)
    assert bad.returncode == 2 and "model path not found" in bad.stderr, bad.stderr
    bad = _gate("--suite", "gatekeeper.yaml", "--model", model, "--dry-run", "--out", "x", cwd=project)
    assert bad.returncode == 2 and "--out does not apply" in bad.stderr, bad.stderr
