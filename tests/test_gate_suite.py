"""The suite decides, and fails closed: names that match nothing, foreign baselines and runs,
incomparable baselines are refused (exit 2) before lm-eval evaluates anything; one compare path.

Real CLI subprocesses on copies of examples/ (the suite's include_path and baseline are
relative to it). Two real evaluations in all: one ``gatekeeper run`` shared by the module, one
``gatekeeper gate`` without --out.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
BASE = EXAMPLES / "checkpoints" / "base"
STORED = EXAMPLES / ".gatekeeper" / "baselines" / "demo.json.gz"
MEDIAN_TASK = Path(__file__).parent / "fixtures" / "names" / "demo_arith_median.yaml"

pytestmark = [
    pytest.mark.lmeval,
    pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed"),
]
ENV = {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
# Before the evaluation: building the demo tasks takes ~2 s here, evaluating them ~8 s more.
BEFORE_EVAL_S = 30


def gk(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gatekeeper", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env=env or ENV, timeout=600)


def demo_copy(folder: Path, *edits: tuple[str, str]) -> Path:
    """examples/ (suite, tasks, baseline) in ``folder`` with text edits to the suite."""
    shutil.copytree(EXAMPLES / "tasks", folder / "tasks")
    shutil.copytree(EXAMPLES / ".gatekeeper", folder / ".gatekeeper")
    text = (EXAMPLES / "gatekeeper.yaml").read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    (folder / "gatekeeper.yaml").write_text(text)
    return folder / "gatekeeper.yaml"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


SEEDS = ("seeds: {random: 1234, numpy: 1234, torch: 1234, fewshot: 1234}",
         "seeds: {random: 7, numpy: 1234, torch: 1234, fewshot: 1234}")
ARITH_SHOTS = ("  - name: demo_arith_gen\n    num_fewshot: 0", "  - name: demo_arith_gen\n    num_fewshot: 1")


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One real `gatekeeper run` of the demo suite on `base`, from a folder outside any git checkout."""
    where = tmp_path_factory.mktemp("names-run")
    proc = gk("run", "--suite", EXAMPLES / "gatekeeper.yaml", "--model", BASE, "--out", where / "out", cwd=where)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [run_dir] = (where / "out").iterdir()
    return run_dir, proc


# ----------------------------------------------------------------------------- names, before the evaluation


@pytest.mark.parametrize("edit, needle", [
    (("{metric: acc, filter: none, margin: 0.02}", "{metric: accuracy, filter: none, margin: 0.02}"),
     "metric 'accuracy' matches no metric of the 2 tasks of 'demo_mc' in the tasks lm-eval built; did you mean 'acc'?"),
    (("{metric: word_perplexity, filter: none, margin: 0.1}", "{metric: word_perplexity, filter: nnone, margin: 0.1}"),
     "filter 'nnone' matches no filter of metric 'word_perplexity' of task 'demo_synth_ppl'"),
    (("resamples: 10000", "resamples: 10000\n  rules:\n    - {task: demo_arith_gne, metric: exact_match}"),
     "policy.rules[0]: task 'demo_arith_gne' matches no task or group"),
    (("resamples: 10000", "resamples: 10000\n  rules:\n    - {task: demo_mcc, margin: 0.1}"),  # a group margin
     "policy.rules[0]: task 'demo_mcc' matches no task or group of the tasks lm-eval built; did you mean 'demo_mc'?"),
])
def test_gate_refuses_a_name_typo_before_evaluating(tmp_path, edit, needle):
    suite = demo_copy(tmp_path / "ex", edit)
    t0 = time.perf_counter()
    proc = gk("gate", "--suite", suite, "--model", BASE, "--out", tmp_path / "run", cwd=tmp_path)
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert needle in proc.stderr and "did you mean" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()  # nothing evaluated, nothing written
    assert "running loglikelihood requests" not in proc.stdout
    assert elapsed < BEFORE_EVAL_S


def test_run_refuses_a_metric_typo_too(tmp_path):
    suite = demo_copy(tmp_path / "ex", ("{metric: exact_match, filter: strict-match, margin: 0.02}",
                                        "{metric: exact_match, filter: strict_match, margin: 0.02}"))
    proc = gk("run", "--suite", suite, "--model", BASE, "--out", tmp_path / "run", cwd=tmp_path)
    assert proc.returncode == 2
    assert "tasks[1].metrics[0]: filter 'strict_match'" in proc.stderr and "did you mean 'strict-match'?" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_gated_untestable_aggregation_is_refused_naming_it(tmp_path):
    suite = demo_copy(tmp_path / "ex", ("tasks:\n", "tasks:\n  - name: demo_arith_median\n"))
    shutil.copy(MEDIAN_TASK, tmp_path / "ex" / "tasks")
    proc = gk("run", "--suite", suite, "--model", BASE, "--out", tmp_path / "run", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "demo_arith_median/acc,none is gated but its aggregation 'bypass' cannot be tested" in proc.stderr
    assert not (tmp_path / "run").exists()
    # Informational, the same metric is fine: the run goes past the check (stopped by a bad model).
    suite.write_text(suite.read_text().replace("  - name: demo_arith_median\n",
                                               "  - name: demo_arith_median\n    metrics: [{metric: acc, gate: false}]\n"))
    proc = gk("run", "--suite", suite, "--model", tmp_path / "no-model", "--out", tmp_path / "run", cwd=tmp_path)
    assert proc.returncode == 2 and "bypass" not in proc.stderr


# ----------------------------------------------------------------------------- comparability, before the evaluation


def test_gate_refuses_an_incomparable_baseline_before_evaluating(tmp_path):
    suite = demo_copy(tmp_path / "ex", SEEDS, ARITH_SHOTS)
    t0 = time.perf_counter()
    proc = gk("gate", "--suite", suite, "--model", BASE, "--out", tmp_path / "run", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert time.perf_counter() - t0 < BEFORE_EVAL_S and not (tmp_path / "run").exists()
    lines = proc.stderr.strip().splitlines()
    assert "task demo_arith_gen: num_fewshot 0 in the baseline, 1 in the suite" in lines[0]
    assert any("seed random 1234 in the baseline, 7 in the suite" in ln for ln in lines)
    assert len(lines) == len(set(lines)) == 2  # one line per difference, none repeated
    assert all("re-record the baseline: gatekeeper baseline promote RUN_DIR --suite" in ln for ln in lines)


def test_gate_refuses_a_baseline_with_other_item_counts(tmp_path):
    suite = demo_copy(tmp_path / "ex", (ARITH_SHOTS[0], ARITH_SHOTS[0] + "\n    limit: 50"))
    proc = gk("gate", "--suite", suite, "--model", BASE, "--out", tmp_path / "run", cwd=tmp_path)
    assert proc.returncode == 2
    assert "task demo_arith_gen: 225 of 225 items in the baseline, 50 of 225 in this run" in proc.stderr


# ----------------------------------------------------------------------------- a real run: noise, promote, compare


def test_a_run_prints_no_git_or_attention_mask_noise(base_run):
    _, proc = base_run
    assert "fatal: not a git repository" not in proc.stderr
    assert "attention_mask" not in proc.stderr + proc.stdout


def test_promote_refuses_a_run_of_another_suite_and_leaves_the_baseline(base_run, tmp_path):
    run_dir, _ = base_run
    suite = demo_copy(tmp_path / "ex", SEEDS)
    target = tmp_path / "ex" / ".gatekeeper" / "baselines" / "demo.json.gz"
    before = sha256(target)
    for action in (["promote"], ["record", "--force"]):
        proc = gk("baseline", *action, run_dir, "--suite", suite, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert "run does not match suite" in proc.stderr and "seed random 1234 in the run, 7 in the suite" in proc.stderr
        assert sha256(target) == before
        assert not (target.parent / "history").exists()


def test_promote_refuses_a_run_whose_tasks_differ(base_run, tmp_path):
    run_dir, _ = base_run
    suite = demo_copy(tmp_path / "ex", ("  - name: demo_synth_ppl\n", "  - name: demo_synth_pp\n"))
    (tmp_path / "ex" / "tasks" / "demo_synth_ppl.yaml").write_text(
        (EXAMPLES / "tasks" / "demo_synth_ppl.yaml").read_text().replace("task: demo_synth_ppl", "task: demo_synth_pp"))
    before = sha256(tmp_path / "ex" / ".gatekeeper" / "baselines" / "demo.json.gz")
    proc = gk("baseline", "promote", run_dir, "--suite", suite, cwd=tmp_path)
    assert proc.returncode == 2
    assert "suite task 'demo_synth_pp' is not in the run" in proc.stderr
    assert "the run has task(s) the suite does not list: demo_synth_ppl" in proc.stderr
    assert sha256(tmp_path / "ex" / ".gatekeeper" / "baselines" / "demo.json.gz") == before


def test_compare_suite_refuses_a_baseline_of_another_suite(base_run, tmp_path):
    run_dir, _ = base_run
    suite = demo_copy(tmp_path / "ex", ARITH_SHOTS)
    proc = gk("compare", STORED, run_dir, "--suite", suite, cwd=tmp_path)
    assert proc.returncode == 2
    assert f"{STORED}: baseline does not match suite" in proc.stderr
    assert "num_fewshot 0 in the baseline, 1 in the suite" in proc.stderr
    # The suite's own stored baseline against the same run: the one path passes.
    proc = gk("compare", STORED, run_dir, "--suite", EXAMPLES / "gatekeeper.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_compare_suite_checks_names_after_the_run(base_run, tmp_path):
    run_dir, _ = base_run
    suite = demo_copy(tmp_path / "ex", ("{metric: acc_norm, gate: false}", "{metric: acc_nrom, gate: false}"))
    proc = gk("compare", STORED, run_dir, "--suite", suite, cwd=tmp_path)
    assert proc.returncode == 2
    assert "metric 'acc_nrom' matches no metric of the 2 tasks of 'demo_mc' in the candidate" in proc.stderr


def test_compare_plain_policy_rule_matching_nothing(base_run, tmp_path):
    run_dir, _ = base_run
    pol = tmp_path / "policy.yaml"
    pol.write_text("rules:\n  - {task: demo_capitals, margin: 0.1}\n")
    proc = gk("compare", STORED, run_dir, "--policy", pol, cwd=tmp_path)
    assert proc.returncode == 2
    assert f"{pol}: rules[0]: task 'demo_capitals' matches no task or group of the runs; did you mean" in proc.stderr


def test_gate_without_out_removes_its_temp_run(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = gk("gate", "--suite", EXAMPLES / "gatekeeper.yaml", "--model", BASE, "--json", tmp_path / "r.json",
              "--no-history", cwd=tmp_path, env={**ENV, "TMPDIR": str(tmp)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list(tmp.glob("gatekeeper-run-*")) == []  # torch may leave its own caches there
    assert "fatal: not a git repository" not in proc.stderr and "attention_mask" not in proc.stderr


def test_the_plan_before_the_run_is_what_the_run_produced(base_run):
    """What tasks.task_plan predicts from lm-eval's built tasks (names, aggregations, versions,
    n-shot, item counts) is exactly what the real run wrote: the pre-run checks see the truth."""
    from gatekeeper.results import reader as results
    from gatekeeper.run import runner, tasks
    from gatekeeper.suite import names
    from gatekeeper.suite.suite import load_suite

    run_dir, _ = base_run
    suite = load_suite(EXAMPLES / "gatekeeper.yaml")
    settings = runner._settings(suite, str(BASE), None, None, None, None, None)
    tm = tasks.task_manager(suite, settings.model_args)
    _, leaves, groups = tasks.load_tasks(suite, tm)
    plan = tasks.task_plan(leaves, groups, None)
    run = results.load_run(run_dir)
    after = names.from_run(run)
    assert plan.produced.leaves == after.leaves
    assert plan.produced.groups == after.groups
    prov = run.provenance
    assert plan.versions == {t: prov.task_versions[t] for t in plan.versions}
    assert plan.n_shot == {t: prov.n_shot[t] for t in plan.n_shot}
    assert plan.n_samples == {t: prov.n_samples[t] for t in plan.n_samples}


def test_a_dtype_override_makes_the_run_foreign_to_the_suite(tmp_path):
    """`run --dtype float64` on a suite that pins float32 measures something else: gating that run
    (or storing it as the baseline) is refused naming the dtype, never compared as context."""
    proc = gk("run", "--suite", EXAMPLES / "gatekeeper.yaml", "--model", BASE, "--dtype", "float64",
              "--out", tmp_path / "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [run_dir] = (tmp_path / "out").iterdir()
    proc = gk("gate", "--suite", EXAMPLES / "gatekeeper.yaml", "--run", run_dir, "--no-history", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "dtype float64 in the candidate (a command-line override), the suite pins float32" in proc.stderr
    suite = demo_copy(tmp_path / "ex")
    proc = gk("baseline", "promote", run_dir, "--suite", suite, cwd=tmp_path)
    assert proc.returncode == 2 and "dtype float64 in the run" in proc.stderr
