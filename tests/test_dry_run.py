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
    assert "  > The capital of Refenor is  ⟶ Fizu | Titeb | Figat | Pifug  (target: Figat)" in out
    assert "  > Q: 0+2= A:  (target: 2)" in out  # a generation task: its target
    assert out.count("the first 3 requests as lm-eval builds them") == 4
    assert _listing(project) == before  # nothing written
    # the power figure of each gated row is the one `gatekeeper plan` prints (one model)
    from gatekeeper.gate import plan_suite

    rows = plan_suite(project / "gatekeeper.yaml").rows
    assert rows and "resolution, as `gatekeeper plan` gives it" in out
    for r in rows:
        line = next(x for x in out.splitlines() if x.startswith(f"  {r.key.task} {r.key.metric} ({r.key.filter}): "))
        assert (r.note in line) if r.resolves is None else (f"a drop of {r.mde:.3g} is caught" in line), line

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


def test_a_dry_run_rehearses_the_gate_it_stands_for(tmp_path: Path) -> None:
    """Issue #38: no baseline is the gate's exit 2, --record-missing and --sequential are rehearsed
    (the looks and their items), each group is listed, and a missing --model or --run says which."""
    project = tmp_path / "p"
    shutil.copytree(EXAMPLES, project, ignore=shutil.ignore_patterns("checkpoints", "__pycache__", ".gatekeeper"))
    model = str(EXAMPLES / "checkpoints" / "regressed")
    first = _gate("--suite", "gatekeeper.yaml", "--model", model, "--dry-run", cwd=project)
    real = _gate("--suite", "gatekeeper.yaml", "--model", model, cwd=project)
    assert first.returncode == real.returncode == 2 and first.stderr == real.stderr, first.stderr + real.stderr
    assert "no baseline file; record one on purpose with `gatekeeper gate --record-missing" in first.stderr
    record = _gate("--suite", "gatekeeper.yaml", "--model", model, "--dry-run", "--record-missing", cwd=project)
    assert record.returncode == 0, record.stderr[-2000:]
    assert f"baseline: none at {project / '.gatekeeper' / 'baselines' / 'demo.json.gz'}: the gate would record this " \
           "run as the first baseline" in record.stdout, record.stdout
    assert "group demo_mc: 2 tasks (demo_arith_mc 225, demo_capitals_mc 200); acc, acc_norm weighted by items; " \
           "gated: acc (margin 0.02); its tasks gated with it, one family" in record.stdout, record.stdout
    assert not (project / ".gatekeeper").exists()
    both = _gate("--suite", "gatekeeper.yaml", "--model", model, "--dry-run", "--record-missing", "--sequential",
                 cwd=project)
    assert both.returncode == 2 and "--record-missing does not apply" in both.stderr, both.stderr

    shutil.copytree(EXAMPLES / ".gatekeeper", project / ".gatekeeper")
    looks = _gate("--suite", "gatekeeper.yaml", "--model", model, "--dry-run", "--sequential", "--looks", "3",
                  cwd=project)
    assert looks.returncode == 0, looks.stderr[-2000:]
    assert "sequential: 3 looks; a task stops at the first look that decides it" in looks.stdout
    shown = [line for line in looks.stdout.splitlines() if line.startswith("  look ")]
    assert len(shown) == 3 and shown[-1].startswith("  look 3: ") and "(then 750 of 750, 100%)" in shown[-1], shown
    assert sum(int(line.split(": ")[1].split(" items")[0].replace(",", "")) for line in shown) == 750
    neither = _gate("--suite", "gatekeeper.yaml", cwd=project)
    assert neither.returncode == 2 and neither.stderr.strip().endswith(
        "give --model (evaluate now) or --run RUN_DIR (gate an existing run)"), neither.stderr


def test_a_group_s_typo_and_a_task_listed_twice_are_named_where_they_are_written(tmp_path: Path) -> None:
    """Issue #38: a group YAML listing a misspelled task was lm-eval's TypeError; a group listed
    beside its own task named neither entry."""
    project = tmp_path / "p"
    shutil.copytree(EXAMPLES, project, ignore=shutil.ignore_patterns("checkpoints", "__pycache__"))
    model = str(EXAMPLES / "checkpoints" / "regressed")
    group = project / "tasks" / "demo_mc.yaml"
    text = group.read_text()
    group.write_text(text.replace("  - demo_capitals_mc", "  - demo_captals_mc"))
    typo = _gate("--suite", "gatekeeper.yaml", "--model", model, "--dry-run", cwd=project)
    assert typo.returncode == 2, typo.stderr
    assert typo.stderr.strip().splitlines()[-1] == (
        f"gatekeeper: error: {group}:4: group 'demo_mc' lists task 'demo_captals_mc', which is neither in the "
        "include_path nor among lm-eval's bundled tasks; did you mean 'demo_capitals_mc'?")
    group.write_text(text)
    suite = (project / "gatekeeper.yaml").read_text()
    (project / "twice.yaml").write_text(suite.replace(
        "  - name: demo_arith_gen\n", "  - name: demo_capitals_mc\n    metrics:\n      - {metric: acc}\n"
        "  - name: demo_arith_gen\n", 1))
    twice = _gate("--suite", "twice.yaml", "--model", model, "--dry-run", cwd=project)
    assert twice.returncode == 2
    assert "twice.yaml:33: tasks[1].name: task 'demo_capitals_mc' is in the suite twice, as group 'demo_mc' at " \
           "twice.yaml:25 and as itself at twice.yaml:33; keep one entry" in twice.stderr, twice.stderr


def test_a_many_task_preview_shows_a_spread_of_tasks_and_each_prompt_s_own_end() -> None:
    """Issue #41: MMLU at 5 shots gave 171 previews that all began with the same instructions and
    examples. A dry run shows 8 tasks spread over the names, and a long prompt's end (the item's
    own question) with its target."""
    from gatekeeper.gate import _prompts_preview
    from gatekeeper.run.runner import preview_tasks

    names = [f"mmlu_{i:02d}" for i in range(57)]
    picked = preview_tasks(names)
    assert len(picked) == 8 and picked[0] == "mmlu_00" and picked[-1] == "mmlu_49" and len(set(picked)) == 8
    assert preview_tasks(names[:5]) == names[:5]
    shots = "The following are multiple choice questions (with answers) about anatomy. " * 40
    prompts = {t: [(shots + f"Question {t}: which bone is the longest? Answer:", "A | B | C | D", "C")] for t in picked}
    lines = _prompts_preview(prompts, 57)
    assert lines[0] == "\nprompts of 8 of 57 tasks, spread over their names"
    shown = [ln for ln in lines if ln.startswith("  > ")]
    assert len(shown) == 8
    assert shown[0].startswith("  > …") and shown[0].endswith(
        "Question mmlu_00: which bone is the longest? Answer:  ⟶ A | B | C | D  (target: C)")
