"""The registry of metric kinds (gatekeeper.results.metrics): every aggregation lm-eval 0.4.13 registers
is testable, each kind's aggregate equals lm-eval's own function bit for bit (including the
degenerate cases sklearn warns about), baselines keep the new kinds, and real lm-eval runs of
the demo checkpoints on local tasks (tests/fixtures/metric_tasks) are gated on them.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from gatekeeper.baseline import format as baseline_format
from gatekeeper.baseline import store
from gatekeeper.compare.stats import paired_test
from gatekeeper.errors import GateError
from gatekeeper.results import reader as results
from gatekeeper.results.metrics import KINDS, kind_for, kind_named, known_aggregations
from tests.lmeval_fixtures import *  # noqa: F403 - session fixtures (metric_runs)

lm_metrics = pytest.importorskip("lm_eval.api.metrics")


def _lm(name: str, items: list) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn's UndefinedMetricWarning on degenerate cases
        return float(lm_metrics.__dict__[name](items))


# ---------------------------------------------------------------------------------- registry


def test_every_aggregation_lm_eval_registers_is_testable():
    code = ("import lm_eval.api.metrics; from lm_eval.api.registry import AGGREGATION_REGISTRY as R; "
            "print(' '.join(sorted(R)))")
    names = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "f1" in names and "chrf++" in names  # the registry really was read
    untestable = [n for n in names if kind_for(n) is None]
    assert untestable == ["bypass"]  # lm-eval's "no aggregate" placeholder (always 999)


def test_each_aggregation_belongs_to_exactly_one_kind():
    seen = [agg for kind in KINDS.values() for agg in kind.aggregations]
    assert len(seen) == len(set(seen)) == len(known_aggregations())
    assert {kind_for(a).name for a in seen} == set(KINDS) - {"function"}  # task functions: by id
    with pytest.raises(ValueError, match="unknown kind"):
        kind_named("histogram")


# ---------------------------------------------------------------------------------- exactness


def _labels(rng: np.random.Generator, n: int, k: int, p_right: float) -> np.ndarray:
    gold = rng.integers(0, k, n)
    pred = np.where(rng.random(n) < p_right, gold, rng.integers(0, k, n))
    return np.column_stack([gold, pred])


def _pairs(arr: np.ndarray) -> list[tuple[int, int]]:
    return [(int(g), int(p)) for g, p in arr]


@pytest.mark.parametrize("seed", range(6))
def test_f1_and_mcc_equal_lm_eval_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    for n, k, p in [(7, 2, 0.5), (225, 2, 0.8), (1000, 2, 0.95), (300, 4, 0.6), (50, 7, 0.3)]:
        arr = _labels(rng, n, k, p)
        kind = kind_named("confusion")
        if k == 2:
            assert kind.aggregate("f1", arr) == _lm("f1_score", _pairs(arr))
        assert kind.aggregate("matthews_corrcoef", arr) == _lm("matthews_corrcoef", _pairs(arr))


@pytest.mark.parametrize("arr", [
    [[0, 0], [0, 0], [0, 0]],          # no positive at all: f1 0 (sklearn warns), mcc 0
    [[1, 1], [1, 1]],                  # one class only
    [[0, 1], [0, 1], [1, 1]],          # every prediction the same: mcc 0
    [[1, 0], [0, 1], [1, 0]],          # all wrong
    [[3, 3], [5, 3], [5, 5], [9, 3]],  # multi-class, labels not 0..k-1
])
def test_degenerate_confusions_match_sklearn(arr):
    arr = np.asarray(arr)
    kind = kind_named("confusion")
    if np.unique(arr).size <= 2 and set(np.unique(arr)) <= {0, 1}:
        assert kind.aggregate("f1", arr) == _lm("f1_score", _pairs(arr))
    assert kind.aggregate("matthews_corrcoef", arr) == _lm("matthews_corrcoef", _pairs(arr))


def test_multiclass_f1_is_refused_like_lm_eval():
    arr = np.array([[0, 1], [2, 2], [1, 0]])
    with pytest.raises(ValueError):
        _lm("f1_score", _pairs(arr))  # sklearn average='binary'
    with pytest.raises(ValueError, match="binary"):
        kind_named("confusion").aggregate("f1", arr)


def test_score_of_summed_statistics_equals_the_aggregate():
    rng = np.random.default_rng(3)
    for agg, k in [("f1", 2), ("matthews_corrcoef", 2), ("matthews_corrcoef", 5)]:
        arr = _labels(rng, 400, k, 0.7)
        kind = kind_named("confusion")
        xb, _ = kind.unit_stats(agg, arr, arr)
        assert kind.score_fn(agg)(xb.sum(axis=0)[None, :])[0] == kind.aggregate(agg, arr)


def test_brier_median_nanmean_equal_lm_eval():
    rng = np.random.default_rng(5)
    lls = rng.normal(-3, 2, size=(300, 4))
    golds = rng.integers(0, 4, 300)
    from lm_eval.utils import softmax

    from gatekeeper.results.metrics import brier_rows

    rows = brier_rows(golds.tolist(), lls.tolist())
    items = [(int(g), softmax(tuple(x))) for g, x in zip(golds, lls.tolist(), strict=True)]
    assert kind_named("brier").aggregate("brier_score", rows) == _lm("brier_score", items)
    for n in (1, 2, 9, 10, 301):
        x = rng.normal(size=n)
        assert kind_named("median").aggregate("median", x) == _lm("median", x.tolist())
        x[rng.random(n) < 0.3] = np.nan
        if not np.isnan(x).all():
            assert kind_named("nanmean").aggregate("nanmean", x) == _lm("nanmean", x.tolist())


def test_chrfpp_sentence_statistics_reproduce_sacrebleu():
    pytest.importorskip("sacrebleu")
    from gatekeeper.results import corpus

    refs = ["Figat", "Rahe", "the cat sat", "a b c d"]
    preds = [" Figat", " Laker", "the cat sat down", ""]
    values = np.array(list(zip(refs, preds, strict=True)), dtype=object)
    want = _lm("chrfpp", list(zip(refs, preds, strict=True)))
    kind = kind_named("corpus")
    assert kind.aggregate("chrf++", values) == want
    xb, _ = kind.unit_stats("chrf++", values, values)
    assert xb.shape[1] == 24
    assert corpus.exact_score_from_stats("chrf++", xb) == want
    assert kind.score_fn("chrf++")(xb.sum(axis=0)[None, :])[0] == pytest.approx(want, rel=1e-12)


# ---------------------------------------------------------------------------------- tests


def test_nan_items_stay_in_the_pairing():
    base = np.array([1.0, np.nan, 0.0, 1.0, np.nan, 1.0] * 20)
    cand = base.copy()
    cand[1] = 1.0  # an item judged only by the candidate
    t = paired_test("nanmean", "nanmean", base, cand, higher_is_better=True, n_resamples=500)
    assert t.n == base.size and not t.identical
    assert t.candidate == np.nanmean(cand) and t.baseline == np.nanmean(base)
    same = paired_test("nanmean", "nanmean", base, base.copy(), higher_is_better=True)
    assert same.identical and same.p_worse == 1.0


def test_median_uses_item_resampling_and_rejects_clusters():
    rng = np.random.default_rng(1)
    base = rng.normal(size=200)
    t = paired_test("median", "median", base, base - 0.5, higher_is_better=True, n_resamples=2000)
    assert t.test == "median-permutation" and t.p_worse < 0.01 and t.ci_high < 0
    with pytest.raises(ValueError, match="clusters"):
        paired_test("median", "median", base, base, higher_is_better=True, clusters=np.arange(200) % 30)


# ---------------------------------------------------------------------------------- real runs
# tests/fixtures/metric_tasks, run by lm-eval 0.4.13 (hf backend, CPU) on the demo checkpoints:
# base, harmless (float16 round trip) and regressed (capital-name embeddings shuffled).

SUITE = Path(__file__).resolve().parent / "fixtures" / "metric_tasks" / "suite.yaml"
NEW_KINDS = {"confusion", "brier", "median", "nanmean", "corpus", "mean"}


def test_reported_aggregates_are_reproduced_bit_for_bit(metric_runs):
    for which, out in metric_runs.items():
        run = results.load_run(out)
        kinds = {}
        for key, s in run.series.items():
            kinds.setdefault(s.kind, set()).add(s.aggregation)
            assert kind_named(s.kind).aggregate(s.aggregation, s.values) == s.reported, (which, key)
        assert set(kinds) == NEW_KINDS, which
        assert kinds["confusion"] == {"f1", "matthews_corrcoef"} and kinds["corpus"] == {"chrf++"}
        # The task's own !function aggregations are recorded by name, never by their source.
        assert sorted(run.untestable.values()) == ["!function agg_inst_level", "!function weighted_f1"]


def _verdicts(outcome) -> dict[str, str]:
    return {f"{c.key.task}/{c.key.metric}": c.verdict for c in outcome.comparisons if c.gated}


def test_regressed_checkpoint_is_caught_on_every_kind_and_harmless_passes(metric_runs):
    from gatekeeper.gate import compare_paths
    from gatekeeper.suite.suite import load_suite

    suite = load_suite(SUITE)
    bad = compare_paths(metric_runs["base"], metric_runs["regressed"], suite)
    assert set(_verdicts(bad).values()) == {"regressed"}, _verdicts(bad)
    assert len(_verdicts(bad)) == 11  # 9 registered aggregations + 2 task-defined (!function)
    f1 = next(c for c in bad.comparisons if c.key.metric == "f1")
    assert f1.test.test == "confusion-flips" and f1.test.baseline > 0.95 and f1.test.candidate < 0.7
    ok = compare_paths(metric_runs["base"], metric_runs["harmless"], suite)
    assert ok.verdict == "pass" and set(_verdicts(ok).values()) == {"unchanged"}, _verdicts(ok)


@pytest.mark.parametrize("which, code", [("harmless", 0), ("regressed", 1)])
def test_cli_compare_on_plain_lm_eval_runs_with_the_suite(metric_runs, which, code):
    proc = subprocess.run(
        [sys.executable, "-m", "gatekeeper", "compare", str(metric_runs["base"]), str(metric_runs[which]),
         "--suite", str(SUITE)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == code, proc.stderr[-2000:]
    assert "def " not in proc.stdout + proc.stderr  # no function source is ever printed


def test_baseline_format_2_round_trip_gives_the_same_decisions(metric_runs, tmp_path):
    from gatekeeper.compare.compare import compare_runs
    from gatekeeper.results.trusted import trusted_code
    from gatekeeper.suite.suite import load_suite

    with trusted_code(SUITE.parent):
        run = results.load_run(metric_runs["base"])
        path = tmp_path / "b.json.gz"
        store.save_baseline(run, path, suite_name="metric-kinds", suite_hash=None)
        loaded = store.load_baseline(path)
    doc = json.loads(gzip.decompress(path.read_bytes()))
    assert doc["version"] == 2
    for key, s in run.series.items():
        back = loaded.series[key]
        assert back.kind == s.kind and back.values.dtype == s.values.dtype
        if s.values.dtype == object:
            assert back.values.tolist() == s.values.tolist()
        else:
            assert np.array_equal(back.values, s.values, equal_nan=True)
    policy = load_suite(SUITE).policy
    with trusted_code(SUITE.parent):
        cand = results.load_run(metric_runs["regressed"])
        direct, stored = compare_runs(run, cand, policy), compare_runs(loaded, cand, policy)
    assert [(c.key, c.verdict, c.test.p_worse) for c in direct.comparisons] == \
        [(c.key, c.verdict, c.test.p_worse) for c in stored.comparisons]


def test_version_1_file_cannot_hold_the_new_kinds(metric_runs, tmp_path):
    path = tmp_path / "b.json.gz"
    store.save_baseline(results.load_run(metric_runs["base"]), path, suite_name="x", suite_hash=None)
    doc = json.loads(gzip.decompress(path.read_bytes()))
    doc.pop("checksum")
    doc["version"] = 1
    doc["checksum"] = baseline_format._checksum(doc)
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(GateError, match=r"kind is 'brier', expected one of mean, ratio, corpus \(format version 1\)"):
        store.load_baseline(path)


def test_older_version_1_baselines_still_load():
    demo = Path(__file__).resolve().parents[1] / "examples" / ".gatekeeper" / "baselines" / "demo.json.gz"
    assert json.loads(gzip.decompress(demo.read_bytes()))["version"] == 1
    assert store.load_baseline(demo).series


# ---------------------------------------------------------------------------------- !function


def test_task_functions_are_gated_with_the_suite(metric_runs):
    from gatekeeper.gate import compare_paths
    from gatekeeper.suite.suite import load_suite

    suite = load_suite(SUITE)
    bad = compare_paths(metric_runs["base"], metric_runs["regressed"], suite)
    by_metric = {c.key.metric: c for c in bad.comparisons}
    for metric in ("inst_level", "wf1"):
        c = by_metric[metric]
        assert c.gated and c.verdict == "regressed" and c.test.test == "function-permutation", (metric, c)
        assert c.test.n_resamples > 0
    assert bad.baseline.series[by_metric["wf1"].key].aggregation.startswith("!function weighted_f1@")
    ok = compare_paths(metric_runs["base"], metric_runs["harmless"], suite)
    assert ok.verdict == "pass"


def test_task_function_aggregates_equal_lm_eval(metric_runs):
    from gatekeeper.results.trusted import trusted_code

    with trusted_code(SUITE.parent):
        for out in metric_runs.values():
            run = results.load_run(out)
            funcs = [s for s in run.series.values() if s.kind == "function"]
            assert {s.key.metric for s in funcs} == {"inst_level", "wf1"} and not run.untestable
            for s in funcs:
                assert kind_named("function").aggregate(s.aggregation, s.values) == s.reported
                # IFEval-like lists of booleans and (gold, pred) pairs, kept as logged
                assert all(isinstance(v, list) for v in s.values)


def test_bare_compare_refuses_a_gated_task_function_and_names_the_suite_fix(metric_runs):
    proc = subprocess.run([sys.executable, "-m", "gatekeeper", "compare", str(metric_runs["base"]),
                           str(metric_runs["regressed"])], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert "!function" in err and "--suite" in err and "def " not in err and "sum(flat)" not in err


def test_function_source_in_a_results_file_is_never_executed(metric_runs, tmp_path):
    import shutil

    from gatekeeper.gate import compare_paths
    from gatekeeper.suite.suite import load_suite

    cand = tmp_path / "cand"
    shutil.copytree(metric_runs["regressed"], cand)
    res = sorted(cand.glob("*/results_*.json"))[-1]  # the newest, the one compare reads
    data = json.loads(res.read_text())
    marker = tmp_path / "executed"
    for item in data["configs"]["mk_custom"]["metric_list"]:
        if item["metric"] == "inst_level":
            item["aggregation"] = (f"def agg_inst_level(items):\n    open({str(marker)!r}, 'w').close()\n"
                                   "    return 1.0\n")
    res.write_text(json.dumps(data))
    with pytest.raises(GateError, match="another version of !function agg_inst_level"):
        compare_paths(metric_runs["base"], cand, load_suite(SUITE))
    assert not marker.exists()


def test_baseline_keeps_task_functions_and_needs_trusted_code_to_use_them(metric_runs, tmp_path):
    from gatekeeper.results.trusted import trusted_code

    path = tmp_path / "b.json.gz"
    with trusted_code(SUITE.parent):
        store.save_baseline(results.load_run(metric_runs["base"]), path, suite_name="x", suite_hash=None)
        with_code = store.load_baseline(path)
    assert {s.kind for s in with_code.series.values()} >= {"function"}
    doc = json.loads(gzip.decompress(path.read_bytes()))
    assert doc["version"] == 2
    # the series name the function by id; its source is only in the provenance's configs (data)
    assert all("def " not in json.dumps(s) for s in doc["series"])
    import gatekeeper.results.metrics as mk

    saved = dict(mk._FUNCTIONS)
    mk._FUNCTIONS.clear()  # a fresh process: nothing bound
    try:
        bare = store.load_baseline(path)
    finally:
        mk._FUNCTIONS.update(saved)
    assert sorted(bare.untestable.values()) == ["!function agg_inst_level", "!function weighted_f1"]


def test_task_functions_get_a_fixed_number_of_resamples_fewer_only_when_very_slow(monkeypatch):
    import time

    import gatekeeper.results.metrics as mk

    def slow_mean(items):  # 0.5 ms a call: 1,000 resamples of both runs sleep 1 s, not 4 (a test's 19 s, once)
        time.sleep(0.0005)
        return sum(sum(x) / len(x) for x in items) / len(items)

    agg = "!function slow_mean@0123456789ab"
    mk.bind_function(agg, slow_mean)
    rng = np.random.default_rng(0)
    base = mk._objects([[bool(b) for b in rng.random(3) < 0.7] for _ in range(100)])
    cand = mk._objects([[bool(b) for b in rng.random(3) < 0.5] for _ in range(100)])
    t = paired_test("function", agg, base, cand, higher_is_better=True, n_resamples=10_000)
    assert t.n_resamples == mk.FUNCTION_RESAMPLES and t.p_worse < 0.01
    assert any(f"{mk.FUNCTION_RESAMPLES} resamples instead of 10000" in w for w in t.warnings)
    again = paired_test("function", agg, base, cand, higher_is_better=True, n_resamples=10_000)
    assert (again.p_worse, again.ci_low) == (t.p_worse, t.ci_low)  # no timing in the result
    monkeypatch.setattr(mk, "FUNCTION_BUDGET_S", 0.25)  # 0.5 ms per call: 250 resamples fit in 0.25 s
    t = paired_test("function", agg, base, cand, higher_is_better=True, n_resamples=10_000)
    assert mk.MIN_FUNCTION_RESAMPLES <= t.n_resamples < mk.FUNCTION_RESAMPLES


def test_bundled_lm_eval_task_functions_are_trusted_code():
    """A bundled task's !function (AraDiCE BoolQ's micro F1 over (gold, pred) pairs), found
    through lm-eval's own TaskManager index of its bundled tasks."""
    import inspect

    from lm_eval.tasks.aradice.boolq.ENG import metrics as boolq_metrics

    from gatekeeper.results.trusted import TrustedCode, aggregation_id

    code = TrustedCode(None)
    agg = aggregation_id(inspect.getsource(boolq_metrics.micro_f1_score))
    fn = code.find("AraDiCE_boolq_eng", "f1", agg)
    assert fn is not None and fn.__name__ == "micro_f1_score"
    assert fn([(1, 1), (0, 1), (1, 1), (0, 0)]) == 0.75
    fresh = TrustedCode(None)
    fresh._managers = code._managers  # the same index, no function found yet
    assert fresh.find("AraDiCE_boolq_eng", "acc", agg) is None  # a plain mean, no function
    with pytest.raises(GateError, match="another version of !function micro_f1_score"):
        fresh.find("AraDiCE_boolq_eng", "f1", "!function micro_f1_score@000000000000")


def test_a_task_function_failing_on_stored_values_is_bad_input(metric_runs, tmp_path):
    from gatekeeper.results.trusted import trusted_code

    path = tmp_path / "b.json.gz"
    with trusted_code(SUITE.parent):
        store.save_baseline(results.load_run(metric_runs["base"]), path, suite_name="x", suite_hash=None)
        doc = json.loads(gzip.decompress(path.read_bytes()))
        doc.pop("checksum")
        wf1 = next(s for s in doc["series"] if s["metric"] == "wf1")
        wf1["values"][0] = {"gold": 1}  # not a (gold, pred) pair
        doc["checksum"] = baseline_format._checksum(doc)
        path.write_bytes(gzip.compress(json.dumps(doc).encode()))
        with pytest.raises(GateError, match=r"wf1,none: cannot aggregate .*!function weighted_f1 failed"):
            store.load_baseline(path)


def test_label_metrics_list_the_items_that_went_right_to_wrong(metric_runs):
    from gatekeeper.compare.compare import compare_runs
    from gatekeeper.suite.policy import Policy, Rule

    policy = Policy(rules=[Rule(task="mk_custom", gate=False)])
    out = compare_runs(results.load_run(metric_runs["base"]), results.load_run(metric_runs["regressed"]), policy)
    by_metric = {(c.key.task, c.key.metric): c for c in out.comparisons}
    acc, f1 = by_metric[("mk_binary", "acc")], by_metric[("mk_binary", "f1")]
    assert f1.right_to_wrong and f1.right_to_wrong == acc.right_to_wrong  # the same docs flipped


@pytest.mark.parametrize("value, needle", [
    ([0, 10**30], "integer class labels"),
    ([0, "yes"], "integer class labels"),
    ([1], "integer class labels"),
    ([0, 1.5], "integer class labels"),
])
def test_hostile_label_values_are_refused_naming_the_line(metric_runs, tmp_path, value, needle):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(metric_runs["base"], out)
    path = sorted(out.glob("*/samples_mk_binary_*.jsonl"))[-1]
    lines = path.read_text().splitlines()
    first = json.loads(lines[0])
    first["f1"] = value
    lines[0] = json.dumps(first)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(GateError, match=rf"line 1: f1 is .*{needle}"):
        results.load_run(out)
