"""``gate --items informative`` end to end (issue #57): real lm-eval runs of the demo checkpoints,
read stage by stage from a baseline that kept each multiple-choice item's margin (the session's
first baseline, recorded from the base checkpoint by ``demo_gate("base")``), against the fixed gate
of the same checkpoint on the same baseline."""

from __future__ import annotations

import dataclasses
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
from gatekeeper.gate import GateResult, _replayed_informative_gate
from gatekeeper.results import informative
from gatekeeper.results.reader import load_run
from gatekeeper.suite.suite import load_suite
from tests.demo_runs import DEMO_BASELINE, DEMO_SUITE, OFFLINE_ENV, ROOT, checkpoint_arg

pytestmark = pytest.mark.lmeval


def _gate(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gatekeeper", "gate", "--suite", str(DEMO_SUITE), *args],
                          cwd=cwd, env={**os.environ, **OFFLINE_ENV}, capture_output=True, text=True, timeout=900)


def _flips_first(baseline: Path, regressed_run: Path, task: str, to: Path) -> Path:
    """``baseline`` again, its ``task``'s margins made to rank the items the regressed checkpoint
    flips first (the propensity the design trusts, here known to be right), the rest as recorded."""
    stored = store.load_baseline(baseline)
    key = next(k for k in stored.series if k.task == task and k.metric == "acc")
    run = load_run(regressed_run)
    flipped = np.asarray(stored.series[key].values) != np.asarray(run.series[key].values)
    ids = np.arange(flipped.size)
    margins = np.where(flipped, 1e-3 * (ids + 1), 10.0 + ids)  # |margin| order: the flips, then the rest
    doctored = dataclasses.replace(stored, choice_margins={**stored.choice_margins, task: (ids, margins)})
    store.save_baseline(doctored, to, suite_name=load_suite(DEMO_SUITE).name, suite_hash=stored.provenance.suite_hash)
    return to


def test_a_collapse_fails_at_the_first_stage_with_the_fixed_gates_verdicts(demo_gate: Callable, demo_run: Callable,
                                                                              tmp_path: Path) -> None:
    """The regressed checkpoint, from a baseline whose capitals margins put the items it flips first:
    its drop is shown beyond the margin at the first stage's small share of alpha, so the gate fails
    there, reading 35% of the items; each row's verdict is the fixed gate's, a row read in part
    estimates the whole task's change (its interval holds the fixed gate's), a task read whole is
    the fixed gate's row item for item; plan --mutants' replay decides the same."""
    baseline = _flips_first(demo_gate("base").baseline, demo_run("regressed"), "demo_capitals_mc",
                            tmp_path / "baseline.json.gz")
    fixed = {(c["task"], c["metric"]): c for c in demo_gate("regressed").report["comparisons"]}
    out = tmp_path / "stages"
    proc = _gate("--model", checkpoint_arg("regressed"), "--baseline", str(baseline), "--items", "informative",
                 "--out", str(out), "--json", str(tmp_path / "r.json"))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    info = report["informative"]
    rows = {(c["task"], c["metric"]): c for c in report["comparisons"]}
    assert {k: c["verdict"] for k, c in rows.items()} == {k: c["verdict"] for k, c in fixed.items()}
    assert info["failed_at_stage"] == 1 and {v["stage"] for v in info["items"].values()} == {1}, info
    assert "failed at stage 1 of 5: a drop shown beyond its margin at the stage's alpha" in info["summary"]
    assert info["items"]["demo_arith_gen"]["uniform"] and not info["items"]["demo_capitals_mc"]["uniform"]
    read = {t: v["read"] for t, v in info["items"].items()}
    assert info["read"] == sum(read.values()) < 0.4 * info["total"]
    for key, c in rows.items():
        if key[0] in ("demo_capitals_mc", "demo_arith_mc", "demo_mc", "demo_arith_gen"):  # read in part: estimated
            assert (c["test"], c["n"]) == ("weighted-mcnemar-midp", fixed[key]["n"]), key
            assert c["ci_low"] <= fixed[key]["delta"] <= c["ci_high"], (key, c, fixed[key]["delta"])
        else:  # every item read: the same items, the same test, the same figures
            assert (c["test"], c["n"], c["p_value"]) == pytest.approx(
                (fixed[key]["test"], fixed[key]["n"], fixed[key]["p_value"])), key
    assert info["summary"] in proc.stdout
    assert "read whole: demo_synth_ppl (bits_per_byte is not right/wrong)" in info["summary"]
    assert "read uniformly (the baseline kept no choice margins for them): demo_arith_gen" in info["summary"]
    assert f"demo_capitals_mc/acc,none: an informative read: {read['demo_capitals_mc']} of 200 items" in proc.stdout
    assert sorted(p.name for p in out.glob("stage-*")) == ["stage-1"]
    # plan --mutants grades the informative gate on stages cut from a run of every item: the same
    # stages, items and verdicts as reading them one after another
    fixed_gate = GateResult(1, None, None, demo_run("regressed"))
    replayed = _replayed_informative_gate(load_suite(DEMO_SUITE), fixed_gate, baseline, lambda _line: None)
    assert replayed.report_json["informative"]["items"] == info["items"]
    assert [(c["task"], c["metric"], c["verdict"], c["p_value"]) for c in replayed.report_json["comparisons"]] == \
        [(c["task"], c["metric"], c["verdict"], c["p_value"]) for c in report["comparisons"]]


def test_a_harmless_change_reads_stage_by_stage_the_designs_items(demo_gate: Callable, tmp_path: Path) -> None:
    """The harmless checkpoint flips no item: each multiple-choice task reads on to the fourth
    stage (every item then had an even chance to be read), the generation task (right/wrong, no
    margins: read uniformly) to the second, the perplexity task whole at the first; each stage
    reads exactly the design's new items; one comparison at the alpha the stages leave, passed."""
    baseline = demo_gate("base").baseline
    out = tmp_path / "stages"
    proc = _gate("--model", checkpoint_arg("harmless"), "--baseline", str(baseline), "--items", "informative",
                 "--out", str(out), "--json", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    info = json.loads((tmp_path / "r.json").read_text())["informative"]
    stages = {t: v["stage"] for t, v in info["items"].items()}
    assert stages == {"demo_arith_gen": 2, "demo_synth_ppl": 1, "demo_capitals_mc": 4, "demo_arith_mc": 4}, info
    assert info["failed_at_stage"] is None and not any(v["futile"] for v in info["items"].values())
    assert "the one comparison at alpha 0.04975" in info["summary"]
    stored = store.load_baseline(baseline)
    designs, _ = informative.designs_for(stored, load_suite(DEMO_SUITE).random_seed)
    seen = {t: set() for t in designs}
    assert sorted(p.name for p in out.glob("stage-*")) == [f"stage-{k}" for k in range(1, 5)]
    for k, scale in enumerate(informative.SCALES[:4], 1):
        docs = load_run(out / f"stage-{k}").provenance.manifest["look"]["docs"]
        for task in seen:
            now = designs[task].read(min(scale, informative.SCALES[stages[task] - 1]))
            want = set(np.flatnonzero(now).tolist()) - seen[task]
            assert set(docs.get(task, [])) == want, (task, k)
            seen[task] |= want
    assert {t: len(v) for t, v in seen.items()} == {t: v["read"] for t, v in info["items"].items()}


def test_informative_flags_that_cannot_apply_are_refused_before_anything_runs(tmp_path: Path) -> None:
    for extra, said in ((["--sequential"], "not with a sequential gate's looks"),
                        (["--record-missing"], "--record-missing does not apply"),
                        (["--run", str(tmp_path)], "--run gates a run that read every item")):
        model = [] if "--run" in extra else ["--model", checkpoint_arg("regressed")]
        proc = _gate(*model, "--items", "informative", *extra)
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    plan = subprocess.run([sys.executable, "-m", "gatekeeper", "plan", "--suite", str(DEMO_SUITE), "--items",
                           "informative"], cwd=ROOT, env={**os.environ, **OFFLINE_ENV}, capture_output=True, text=True,
                          timeout=300)
    assert plan.returncode == 2 and "--items and --keep go with --mutants MODEL" in plan.stderr, plan.stderr
    # the committed demo baseline predates the margins: its right/wrong tasks are read uniformly, said
    proc = _gate("--model", checkpoint_arg("regressed"), "--items", "informative", "--baseline", str(DEMO_BASELINE),
                 "--dry-run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "read uniformly (the baseline kept no choice margins for them; a multiple-choice task's are kept by a " \
           "baseline recorded or promoted from this release on): demo_arith_gen, demo_arith_mc, demo_capitals_mc" \
           in proc.stdout, proc.stdout


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
