"""A margin in the wrong units must not switch the gate off (issue #17, item 1).

``--margin 2`` or ``{metric: acc, margin: 2}`` (meant as two points) used to pass a 32-point
accuracy drop with p < 1e-4 as "unchanged", MDE inf, no warning.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gatekeeper.compare.compare import compare_runs
from gatekeeper.errors import GateError
from gatekeeper.suite.policy import Policy, Rule
from gatekeeper.suite.suite import load_suite
from tests import synthetic

ROOT = Path(__file__).resolve().parents[1]
DEMO_BASELINE = ROOT / "examples" / ".gatekeeper" / "baselines" / "demo.json.gz"


def _acc_drop(n: int = 400, before: float = 0.8, drop: float = 0.32, seed: int = 0):
    rng = np.random.default_rng(seed)
    base = (rng.random(n) < before).astype(float)
    cand = base.copy()
    right = np.flatnonzero(base == 1)
    cand[rng.choice(right, int(drop * n), replace=False)] = 0.0
    return (synthetic.run(synthetic.series("qa", "acc", base), name="base"),
            synthetic.run(synthetic.series("qa", "acc", cand), name="cand"))


def test_margin_beyond_the_range_is_refused_naming_where_it_was_set() -> None:
    base, cand = _acc_drop()
    with pytest.raises(GateError) as err:
        compare_runs(base, cand, Policy(margin=2.0, margin_where="--margin"))
    msg = str(err.value)
    assert msg.startswith("--margin: qa/acc,none: margin 2 is at or beyond the whole range of acc ([0, 1])")
    assert "0.02 = two points" in msg and "\n" not in msg
    # The same drop with the margin meant (two points) fails as the regression it is.
    assert compare_runs(base, cand, Policy(margin=0.02)).exit_code == 1


def test_margin_more_than_the_baseline_can_lose_is_a_warning() -> None:
    base, cand = _acc_drop(before=0.25, drop=0.1)
    rule = Rule(task="qa", metric="acc", margin=0.3, where="suite.yaml:9: tasks[0].metrics[0].margin")
    outcome = compare_runs(base, cand, Policy(rules=[rule]))
    assert any(w.startswith("qa/acc,none: margin 0.3 is more than acc can lose from the baseline's 0.2")
               and "(it cannot go below 0): this metric cannot fail" in w for w in outcome.warnings), outcome.warnings
    # Informational metrics are not gates: nothing is said about their margins.
    informational = Rule(task="qa", metric="acc", margin=0.3, gate=False)
    assert not any("cannot fail" in w for w in compare_runs(base, cand, Policy(rules=[informational])).warnings)


def test_bleu_is_on_a_100_point_scale_and_perplexity_has_no_ceiling() -> None:
    refs = [[f"the cat sat on mat {i}", f"the cat sat on mat {i}"] for i in range(30)]
    bleu = synthetic.run(synthetic.series("mt", "bleu", refs, kind="corpus", aggregation="bleu"))
    with pytest.raises(GateError, match=r"whole range of bleu \(\[0, 100\]\).*a 0-100 score: 2 = two points"):
        compare_runs(bleu, bleu, Policy(margin=150.0))
    assert compare_runs(bleu, bleu, Policy(margin=2.0)).exit_code == 0  # two BLEU points: fine
    rng = np.random.default_rng(1)
    ll = np.column_stack([-rng.uniform(5, 50, 200), rng.integers(5, 40, 200)])
    ppl = synthetic.run(synthetic.series("lm", "word_perplexity", ll, kind="ratio",
                                         aggregation="weighted_perplexity", higher_is_better=False))
    assert compare_runs(ppl, ppl, Policy(margin=1000.0)).exit_code == 0  # a perplexity can grow without end


def test_an_mde_over_half_the_range_is_a_warning() -> None:
    base, cand = _acc_drop(n=60, before=0.9, drop=0.0)
    outcome = compare_runs(base, cand, Policy(margin=0.6))
    assert any("over half of acc's range [0, 1]" in w for w in outcome.warnings), outcome.warnings
    assert not any("over half" in w for w in compare_runs(base, cand, Policy(margin=0.02)).warnings)


def test_suite_margin_names_its_line() -> None:
    suite = load_suite(ROOT / "examples" / "gatekeeper.yaml")
    rule = next(r for r in suite.policy.rules if r.task == "demo_mc" and r.metric == "acc")
    text = (ROOT / "examples" / "gatekeeper.yaml").read_text().splitlines()
    file, line, where = rule.where.split(":", 2)
    assert file.endswith("gatekeeper.yaml") and "margin: 0.02" in text[int(line) - 1]
    assert where.strip().startswith("tasks[") and where.strip().endswith("].margin")


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "gatekeeper", *args], cwd=cwd, capture_output=True,
                          text=True, env=env, timeout=600)


def test_compare_cli_margin_in_points_is_exit_2(tmp_path: Path) -> None:
    r = _cli("compare", str(DEMO_BASELINE), str(DEMO_BASELINE), "--margin", "2", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and "--margin: " in r.stderr and "Traceback" not in r.stderr


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed")
def test_gate_refuses_before_the_model_runs(tmp_path: Path) -> None:
    demo = tmp_path / "demo"
    shutil.copytree(ROOT / "examples", demo, ignore=shutil.ignore_patterns("checkpoints"))
    suite = demo / "gatekeeper.yaml"
    text = suite.read_text()
    assert "{metric: acc, filter: none, margin: 0.02}" in text
    suite.write_text(text.replace("{metric: acc, filter: none, margin: 0.02}", "{metric: acc, filter: none, margin: 2}", 1))
    line = next(i for i, s in enumerate(suite.read_text().splitlines(), 1) if "margin: 2}" in s)
    out = tmp_path / "out"
    r = _cli("gate", "--suite", str(suite), "--model", str(ROOT / "examples" / "checkpoints" / "regressed"),
             "--out", str(out), cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"gatekeeper.yaml:{line}: tasks[" in r.stderr and "margin 2 is at or beyond" in r.stderr
    assert not list(out.rglob("results_*.json")), "the model must not have been evaluated"
