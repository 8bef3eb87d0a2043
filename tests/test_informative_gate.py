"""``gate --items informative`` end to end (issue #57): real lm-eval runs of the demo checkpoints,
read stage by stage from a baseline that kept each multiple-choice item's margin (the session's
first baseline, recorded from the base checkpoint by ``demo_gate("base")``), against the fixed gate
of the same checkpoint on the same baseline."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gatekeeper.baseline import store
from gatekeeper.gate import compare_for_suite
from gatekeeper.results import informative, subset
from gatekeeper.results.reader import load_run
from gatekeeper.suite.suite import load_suite
from tests.demo_runs import DEMO_BASELINE, DEMO_SUITE, OFFLINE_ENV, ROOT, checkpoint_arg

pytestmark = pytest.mark.lmeval


def _gate(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gatekeeper", "gate", "--suite", str(DEMO_SUITE), *args],
                          cwd=cwd, env={**os.environ, **OFFLINE_ENV}, capture_output=True, text=True, timeout=900)


def test_the_regressed_checkpoint_fails_as_under_the_fixed_gate_read_stage_by_stage(demo_gate: Callable,
                                                                                     tmp_path: Path) -> None:
    """The regressed checkpoint flips items everywhere (a real defect, not a small change), so
    no stage's flips say enough and every item is read: the stages join into the whole run, the
    verdict is the fixed gate's, and the report says why each task read on or was read whole."""
    baseline = demo_gate("base").baseline  # recorded by this release: with each item's margin
    fixed = demo_gate("regressed").report
    out = tmp_path / "stages"
    proc = _gate("--model", checkpoint_arg("regressed"), "--baseline", str(baseline), "--items", "informative",
                 "--out", str(out), "--json", str(tmp_path / "r.json"))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    info = report["informative"]
    rows = {(c["task"], c["metric"]): c for c in report["comparisons"]}
    fixed_rows = {(c["task"], c["metric"]): c for c in fixed["comparisons"]}
    assert {k: c["verdict"] for k, c in rows.items()} == {k: c["verdict"] for k, c in fixed_rows.items()}
    for key, c in rows.items():  # every item read: the same items, the same test, the same figures
        assert (c["test"], c["n"], c["p_value"]) == pytest.approx(
            (fixed_rows[key]["test"], fixed_rows[key]["n"], fixed_rows[key]["p_value"])), key
    assert info["summary"] in proc.stdout and (info["read"], info["total"]) == (750, 750)
    stored = store.load_baseline(baseline)
    for task, item in info["items"].items():
        assert item["whole"] is None if task in stored.choice_margins else item["whole"], (task, item)
    assert "every item of demo_arith_mc, demo_capitals_mc (fewer than 20 flips read" in info["summary"]
    assert "read whole: demo_arith_gen (the baseline has no choice margins for it)" in info["summary"]
    # stage 1 read exactly the design's items (each later stage the next ones; the join and weigh()
    # refuse any other)
    designs, _ = informative.designs_for(stored, int(load_suite(DEMO_SUITE).seeds["random"]))
    first = load_run(out / "stage-1")
    for task in stored.choice_margins:
        ids = first.series[next(k for k in first.series if k.task == task)].doc_ids
        assert set(ids.tolist()) == set(np.flatnonzero(designs[task].read(1.0)).tolist()), task
    # That first stage alone, weighed as the design says (what a stop there would test): the
    # whole task's change estimated from 47% of its items, by the weighted flips' exact test.
    stage = subset.join([first], [first.provenance.manifest["look"]["docs"]])  # as the gate joins its stages
    docs = subset.docs_of(stage)
    outcome = compare_for_suite(subset.restrict(stored, docs), informative.weigh(stage, designs, 1.0),
                                load_suite(DEMO_SUITE))
    capitals = next(c for c in outcome.comparisons if (c.key.task, c.key.metric) == ("demo_capitals_mc", "acc"))
    group = next(c for c in outcome.comparisons if (c.key.task, c.key.metric) == ("demo_mc", "acc"))
    read = int(designs["demo_capitals_mc"].read(1.0).sum())
    assert capitals.test.test == group.test.test == "weighted-mcnemar-exact" and read < capitals.test.n == 200
    assert capitals.verdict == group.verdict == "regressed" and outcome.verdict == "fail"
    whole_delta = fixed_rows[("demo_capitals_mc", "acc")]["delta"]
    assert capitals.test.ci_low <= whole_delta <= capitals.test.ci_high, (capitals.test, whole_delta)
    assert any(f"demo_capitals_mc/acc,none: an informative read: {read:,} of 200 items" in n for n in outcome.notes)


def test_informative_flags_that_cannot_apply_are_refused_before_anything_runs(tmp_path: Path) -> None:
    for extra, said in ((["--sequential"], "not with a sequential gate's looks"),
                        (["--record-missing"], "--record-missing does not apply"),
                        (["--run", str(tmp_path)], "--run gates a run that read every item")):
        model = [] if "--run" in extra else ["--model", checkpoint_arg("regressed")]
        proc = _gate(*model, "--items", "informative", *extra)
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    # the committed demo baseline predates the margins: said, with what to do
    proc = _gate("--model", checkpoint_arg("regressed"), "--items", "informative", "--baseline", str(DEMO_BASELINE))
    assert proc.returncode == 2 and "no task can be read informatively" in proc.stderr, proc.stderr
    assert "promote a run of it" in proc.stderr and "Traceback" not in proc.stderr


def test_the_dry_run_says_what_the_stages_read(demo_gate: Callable) -> None:
    proc = _gate("--model", checkpoint_arg("harmless"), "--baseline", str(demo_gate("base").baseline),
                 "--items", "informative", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("informative: the stages read about "))
    assert "read whole: " in proc.stdout
    shares = [int(x.rstrip("%,")) for x in line.split("about ")[1].split(" of the")[0].split()]
    assert len(shares) == len(informative.SCALES) and shares == sorted(shares) and shares[-1] == 100, line


def _suite_with_policy(tmp_path: Path, lines: str) -> Path:
    demo = tmp_path / "demo"
    shutil.copytree(ROOT / "examples", demo, ignore=shutil.ignore_patterns("checkpoints", "__pycache__"))
    suite = demo / "gatekeeper.yaml"
    text = suite.read_text()
    assert "  test: superiority" in text
    suite.write_text(text.replace("  test: superiority", lines, 1))  # the lines hold the policy's test
    return suite


def test_the_suites_policy_items_turns_it_on_and_refuses_what_cannot_go_with_it(demo_gate: Callable,
                                                                                 tmp_path: Path) -> None:
    suite = _suite_with_policy(tmp_path / "on", "  test: superiority\n  items: informative")
    proc = subprocess.run([sys.executable, "-m", "gatekeeper", "gate", "--suite", str(suite), "--model",
                           str(ROOT / checkpoint_arg("harmless")), "--baseline", str(demo_gate("base").baseline),
                           "--dry-run"], cwd=tmp_path, env={**os.environ, **OFFLINE_ENV}, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and "informative: the stages read about" in proc.stdout, proc.stderr[-2000:]
    from gatekeeper.cli import _items, build_parser

    args = build_parser().parse_args(["gate", "--suite", str(suite), "--model", "m"])
    assert _items(args, load_suite(suite)) == "informative"
    for flags in (["--sequential"], ["--record-missing"]):  # an explicit whole or sequential read wins
        assert _items(build_parser().parse_args(["gate", "--suite", str(suite), "--model", "m", *flags]),
                      load_suite(suite)) == "uniform", flags
    for lines, said in (("  test: superiority\n  items: informative\n  sequential: {looks: 4}",
                         "items informative and sequential: choose one"),
                        ("  test: inferiority\n  items: informative", "test: superiority); inferiority reads"),
                        ("  test: superiority\n  items: sometimes", "policy.items")):
        bad = _suite_with_policy(tmp_path / str(len(said)), lines)
        proc = _gate_suite(bad)
        assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr, (lines, proc.stderr)


def _gate_suite(suite: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gatekeeper", "gate", "--suite", str(suite), "--model",
                           str(ROOT / checkpoint_arg("harmless")), "--dry-run"], cwd=suite.parent,
                          env={**os.environ, **OFFLINE_ENV}, capture_output=True, text=True, timeout=600)
