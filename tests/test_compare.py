"""compare_runs: verdicts, margins, direction, correction, informational metrics, report output."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from gatekeeper import report
from gatekeeper.compare import stats
from gatekeeper.compare.compare import compare_runs
from gatekeeper.errors import GateError
from gatekeeper.model import SeriesKey
from gatekeeper.suite.policy import Policy, Rule
from tests.synthetic import run, series


def _binary(n: int, p: float, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).random(n) < p).astype(float)


def _flip(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    y = x.copy()
    y[idx] = 1 - y[idx]
    return y


def test_identical_runs_are_unchanged_and_pass():
    base = _binary(500, 0.6, 1)
    a = run(series("t1", "acc", base))
    b = run(series("t1", "acc", base.copy()))
    out = compare_runs(a, b, Policy())
    assert out.verdict == "pass" and out.exit_code == 0
    (c,) = out.comparisons
    assert c.verdict == "unchanged"
    assert c.test.delta == 0.0


def test_clear_drop_regresses_and_names_the_task():
    base = _binary(1000, 0.7, 2)
    right = np.flatnonzero(base == 1)
    cand = _flip(base, right[:120])  # 12 points worse
    a = run(series("good", "acc", base), series("bad", "acc", base))
    b = run(series("good", "acc", base.copy()), series("bad", "acc", cand))
    out = compare_runs(a, b, Policy(margin=0.02))
    assert out.verdict == "fail" and out.exit_code == 1
    assert [c.key.task for c in out.regressions] == ["bad"]
    bad = next(c for c in out.comparisons if c.key.task == "bad")
    assert bad.test.delta == pytest.approx(-0.12)
    assert bad.p_adjusted is not None and bad.p_adjusted < 1e-6
    assert len(bad.right_to_wrong) == 120


def test_significant_drop_within_margin_does_not_fail():
    base = _binary(4000, 0.5, 3)
    right = np.flatnonzero(base == 1)
    cand = _flip(base, right[:80])  # 2 points worse, very significant with no noise
    out = compare_runs(run(series("t", "acc", base)), run(series("t", "acc", cand)), Policy(margin=0.05))
    assert out.verdict == "pass"
    assert out.comparisons[0].verdict == "worse_within_margin"  # said, not a failure


def test_lower_is_better_direction():
    rng = np.random.default_rng(4)
    ll = -rng.uniform(20, 60, 300)
    count = rng.integers(5, 20, 300).astype(float)
    base = np.column_stack([ll, count])
    worse = np.column_stack([ll * 1.3, count])  # lower loglik → higher perplexity → worse
    kw = dict(kind="ratio", aggregation="weighted_perplexity", higher_is_better=False)
    out = compare_runs(run(series("ppl", "word_perplexity", base, **kw)),
                       run(series("ppl", "word_perplexity", worse, **kw)), Policy(resamples=2000))
    (c,) = out.comparisons
    assert c.test.delta > 0 and c.drop > 0
    assert c.verdict == "regressed"
    better = compare_runs(run(series("ppl", "word_perplexity", worse, **kw)),
                          run(series("ppl", "word_perplexity", base, **kw)), Policy(resamples=2000))
    assert better.comparisons[0].verdict == "improved" and better.verdict == "pass"


def test_informational_metric_never_fails_the_suite():
    base = _binary(1000, 0.7, 5)
    cand = _flip(base, np.flatnonzero(base == 1)[:150])
    policy = Policy(rules=[Rule(task="t", metric="acc_norm", gate=False)])
    out = compare_runs(run(series("t", "acc", base), series("t", "acc_norm", base)),
                       run(series("t", "acc", base.copy()), series("t", "acc_norm", cand)), policy)
    assert out.verdict == "pass"
    info = next(c for c in out.comparisons if c.key.metric == "acc_norm")
    assert not info.gated and info.p_adjusted is None
    assert info.verdict == "regressed"  # labelled, but it only informs


def test_correction_changes_borderline_decision():
    # Ten gated metrics; one has a borderline drop that passes raw alpha but not Holm.
    rng = np.random.default_rng(6)
    series_a, series_b = [], []
    for i in range(10):
        base = (rng.random(600) < 0.6).astype(float)
        series_a.append(series(f"t{i}", "acc", base))
        series_b.append(series(f"t{i}", "acc", base.copy()))
    base = series_a[0].values
    r = np.flatnonzero(base == 1)
    w = np.flatnonzero(base == 0)
    cand = base.copy()
    cand[r[:30]] = 0  # 30 right→wrong
    cand[w[:14]] = 1  # 14 wrong→right: one-sided mid-p ≈ 0.01
    series_b[0] = series("t0", "acc", cand)
    none = compare_runs(run(*series_a), run(*series_b), Policy(correction="none"))
    holm = compare_runs(run(*series_a), run(*series_b), Policy(correction="holm"))
    assert none.comparisons[0].test.p_worse < 0.05
    assert none.verdict == "fail"
    assert holm.verdict == "pass"
    assert holm.comparisons[0].verdict == "inconclusive"


def test_mismatched_metric_sets_are_an_error():
    base = _binary(100, 0.5, 7)
    with pytest.raises(GateError, match="acc_norm"):
        compare_runs(run(series("t", "acc", base), series("t", "acc_norm", base)),
                     run(series("t", "acc", base)), Policy())


def test_json_report_schema_and_markdown_escaping():
    base = _binary(1000, 0.7, 8)
    cand = _flip(base, np.flatnonzero(base == 1)[:150])
    evil = "x@octocat#12<script>|"
    a = run(series(evil, "acc", base))
    b = run(series(evil, "acc", cand))
    out = compare_runs(a, b, Policy(), suite="demo")
    data = report.to_json(out)
    json.dumps(data, allow_nan=False)  # strict JSON
    assert data["verdict"] == "fail" and data["regressions"] == 1
    row = data["comparisons"][0]
    for k in ("task", "metric", "filter", "n", "baseline", "candidate", "delta", "ci_low", "ci_high",
              "p_value", "p_adjusted", "test", "verdict", "mde"):
        assert k in row
    assert row["delta"] == pytest.approx(row["candidate"] - row["baseline"])
    assert row["ci_low"] <= row["delta"] <= row["ci_high"]
    md = report.render_markdown(out)
    assert md.startswith("### ❌")
    assert "<script>" not in md and "@octocat" not in md and "#12" not in md
    assert "&lt;script&gt;" in md
    # Each table row has exactly the header's number of unescaped pipes.
    lines = md.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("| task"))
    table = lines[start : lines.index("", start)]
    counts = {ln.replace("\\|", "").count("|") for ln in table}
    assert len(counts) == 1
    term = report.render_terminal(out)
    assert term.splitlines()[-1].startswith("FAIL: gatekeeper demo: 1 regression")


def test_markdown_stays_under_limit_and_says_it_trimmed():
    rng = np.random.default_rng(9)
    sa, sb = [], []
    for i in range(400):
        base = (rng.random(50) < 0.5).astype(float)
        sa.append(series(f"task_{i:03d}_" + "x" * 30, "acc", base))
        sb.append(series(f"task_{i:03d}_" + "x" * 30, "acc", base.copy()))
    pol = Policy(rules=[Rule(task="task_1*", gate=False)])
    out = compare_runs(run(*sa), run(*sb), pol)
    md = report.render_markdown(out, max_chars=20_000)
    assert len(md) <= 20_000
    assert "trimmed" in md or "truncated" in md


def test_policy_lookup_prefers_task_rules_then_groups_then_wildcards():
    pol = Policy(margin=0.01, rules=[Rule(task="*", metric="acc_norm", gate=False),
                                     Rule(task="mmlu", metric="acc", margin=0.03),
                                     Rule(task="mmlu_math", metric="acc", margin=0.05)])
    assert pol.lookup(SeriesKey("mmlu_math", "none", "acc"), ("mmlu",)) == (0.05, True)
    assert pol.lookup(SeriesKey("mmlu_law", "none", "acc"), ("mmlu",)) == (0.03, True)
    assert pol.lookup(SeriesKey("mmlu_law", "none", "acc_norm"), ("mmlu",)) == (0.01, False)
    assert pol.lookup(SeriesKey("other", "none", "acc"), ()) == (0.01, True)


def test_merge_repeats_averages_items_before_testing():
    from gatekeeper.compare.compare import merge_repeats

    a = _binary(300, 0.5, 10)
    b = _flip(a, np.arange(0, 300, 3))  # another seed: a third of the items differ
    merged = merge_repeats([run(series("t", "acc", a)), run(series("t", "acc", b))])
    vals = merged.series[SeriesKey("t", "none", "acc")].values
    assert np.array_equal(vals, (a + b) / 2)
    assert any("averaged 2 runs" in n for n in merged.notes)
    # Averaged values are no longer 0/1: the test switches from McNemar to the permutation test.
    out = compare_runs(merged, run(series("t", "acc", a)), Policy(resamples=1000))
    assert out.comparisons[0].test.test != "mcnemar-midp"


def test_merge_repeats_refuses_different_items():
    from gatekeeper.compare.compare import merge_repeats

    a = _binary(50, 0.5, 11)
    with pytest.raises(GateError, match="doc_ids differ"):
        merge_repeats([run(series("t", "acc", a)), run(series("t", "acc", a[:40]))])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -0.01])
def test_policy_rejects_margins_that_are_not_finite_drops(bad):
    # A NaN margin made "drop > margin" always False: a 30-point drop passed the gate.
    with pytest.raises(GateError, match="margins must be finite"):
        Policy.from_dict({"margin": bad})
    with pytest.raises(GateError, match="margins must be finite"):
        Policy.from_dict({"rules": [{"task": "t", "margin": bad}]})


def test_headline_is_one_line_even_with_hostile_task_names():
    base = _binary(500, 0.8, 12)
    cand = _flip(base, np.flatnonzero(base == 1)[:100])
    name = "t\n::error::fake"
    out = compare_runs(run(series(name, "acc", base)), run(series(name, "acc", cand)), Policy())
    line = report.headline(out)
    assert "\n" not in line and not line.startswith("::")
    term = report.render_terminal(out).splitlines()
    assert term[-1].startswith("FAIL: ")
    assert not any(ln.startswith("::") for ln in term)


# ---------------------------------------------------------------- numerical noise is never a regression


def _noisy(values: np.ndarray, rel: float, seed: int, *, column: int | None = None) -> np.ndarray:
    """``values`` moved by ~``rel`` relative noise (random sign): what another CPU's float
    summation does to per-item scores and log-likelihoods."""
    rng = np.random.default_rng(seed)
    out = np.array(values, dtype=float)
    target = out if column is None else out[:, column]
    target *= 1 + rel * rng.choice([-1.0, 1.0], target.shape) * rng.uniform(0.5, 1.0, target.shape)
    return out


def _every_kind() -> list[tuple[str, dict, np.ndarray, np.ndarray]]:
    """(name, series kwargs, baseline values, candidate values = baseline + 1e-9 relative noise)."""
    rng = np.random.default_rng(8)
    n = 400
    f1 = rng.beta(2, 3, n)
    right = (rng.random(n) < 0.7).astype(float)
    ll = -rng.uniform(20, 60, n)
    ratio = np.column_stack([ll, rng.integers(5, 40, n).astype(float)])
    refs = np.array([[f"the cat sat on mat {i}", f"the cat sat on the mat {i % 7}"] for i in range(60)], dtype=object)
    clusters = np.repeat(np.arange(40), n // 40)
    out = [
        ("mean continuous", {}, f1, _noisy(f1, 1e-9, 1)),
        ("mean 0/1", {}, right, _noisy(right, 1e-9, 2)),  # stored as 0.999999999: still right/wrong
        ("clustered mean", {"clusters": clusters}, f1, _noisy(f1, 1e-9, 3)),
        ("corpus bleu", {"kind": "corpus", "aggregation": "bleu"}, refs, refs.copy()),
    ]
    for agg, hib in (("weighted_perplexity", False), ("bits_per_byte", False), ("perplexity", False)):
        kw = {"kind": "ratio", "aggregation": agg, "higher_is_better": hib}
        out.append((f"ratio {agg}", kw, ratio, _noisy(ratio, 1e-9, 4, column=0)))
    return out


@pytest.mark.parametrize("name, kw, base, cand", _every_kind(), ids=[k[0] for k in _every_kind()])
def test_rerun_noise_is_unchanged_at_margin_zero_for_every_kind(name, kw, base, cand):
    """An identical checkpoint re-run elsewhere: every item moved by ~1e-9 relative. Before the
    rounding floor this was "inconclusive" (margin 0) or, with a consistent sign, "regressed"."""
    a = run(series("t", "m", base, **kw))
    b = run(series("t", "m", cand, **kw))
    out = compare_runs(a, b, Policy(margin=0.0, resamples=1000))
    (c,) = out.comparisons
    assert (c.verdict, out.exit_code) == ("unchanged", 0), (c.test.delta, c.interval)
    moved = int(np.count_nonzero(np.asarray(base != cand).any(axis=-1) if base.ndim > 1 else base != cand))
    assert c.rounded == moved
    assert c.test.identical  # after the floor every pair is equal: nothing to test
    data = report.to_json(out)["comparisons"][0]
    assert data["rounded_items"] == moved and data["identical"] is True
    if moved:
        assert any(f"{moved} of {c.test.n} items differed only by rounding" in n for n in out.notes)


def test_consistent_rounding_bias_does_not_regress():
    """Every log-likelihood 3e-9 lower (another summation order): with 2,000 items all moving
    the same way the permutation p-value is ~0, and without the floor this exited 1."""
    rng = np.random.default_rng(9)
    base = np.column_stack([-rng.uniform(20, 60, 2000), rng.integers(5, 40, 2000).astype(float)])
    cand = base.copy()
    cand[:, 0] *= 1 + 3e-9
    kw = dict(kind="ratio", aggregation="weighted_perplexity", higher_is_better=False)
    a, b = run(series("ppl", "word_perplexity", base, **kw)), run(series("ppl", "word_perplexity", cand, **kw))
    out = compare_runs(a, b, Policy(margin=0.0, resamples=1000))
    assert (out.comparisons[0].verdict, out.exit_code) == ("unchanged", 0)
    # rounding: 0 switches the floor off, and the same input is then a (false) regression
    off = compare_runs(a, b, Policy(margin=0.0, resamples=1000, rounding=0.0))
    assert (off.comparisons[0].verdict, off.exit_code) == ("regressed", 1)


def test_rounding_floor_does_not_hide_a_real_change():
    """1e-3 relative per item (a real, if small, change) is 100x the floor: it is tested."""
    rng = np.random.default_rng(10)
    base = np.column_stack([-rng.uniform(20, 60, 500), rng.integers(5, 40, 500).astype(float)])
    cand = base.copy()
    cand[:, 0] *= 1 + 1e-3
    kw = dict(kind="ratio", aggregation="weighted_perplexity", higher_is_better=False)
    out = compare_runs(run(series("ppl", "word_perplexity", base, **kw)),
                       run(series("ppl", "word_perplexity", cand, **kw)), Policy(resamples=1000))
    (c,) = out.comparisons
    assert c.rounded == 0 and c.verdict == "regressed" and out.exit_code == 1


def test_rounding_floor_snaps_only_items_within_it():
    base = np.array([1.0, 2.0, 3.0, 0.0, 5.0])
    cand = np.array([1.0 + 1e-12, 2.0 * (1 + 2e-5), 3.0 * (1 - 5e-6), 1e-13, 5.0])
    snapped, k = stats.snap_rounding("mean", base, cand, 1e-5)
    assert k == 3
    assert snapped.tolist() == [1.0, 2.0 * (1 + 2e-5), 3.0, 0.0, 5.0]
    ratio_b = np.column_stack([-base - 1, [3.0, 3.0, 3.0, 3.0, 3.0]])
    ratio_c = np.column_stack([-base - 1 - 1e-9, [3.0, 3.0, 4.0, 3.0, 3.0]])  # item 2: another count
    snapped, k = stats.snap_rounding("ratio", ratio_b, ratio_c, 1e-5)
    assert k == 4 and snapped[2, 0] == ratio_c[2, 0] and snapped[0, 0] == ratio_b[0, 0]


def test_aggregate_change_within_rounding_is_unchanged():
    """One item right->wrong and one wrong->right: delta exactly 0. At margin 0 the interval
    reaches past 0 either way, which used to read "inconclusive"; nothing moved."""
    base = _binary(300, 0.6, 11)
    right, wrong = np.flatnonzero(base == 1), np.flatnonzero(base == 0)
    cand = _flip(base, np.array([right[0], wrong[0]]))
    out = compare_runs(run(series("t", "acc", base)), run(series("t", "acc", cand)), Policy())
    (c,) = out.comparisons
    assert c.test.delta == 0 and c.within_rounding and c.verdict == "unchanged"


@pytest.mark.lmeval
@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed")
def test_base_rerun_with_another_batch_size_is_unchanged_everywhere(tmp_path):
    """The demo baseline was recorded from `base` on another CPU at batch size 16; a real lm-eval
    run of the same checkpoint here at batch size 3 moves ~half of the perplexity items by up
    to ~3e-7 relative. With the suite's policy, and with margin 0 on every metric, every
    comparison must be `unchanged` (before the rounding floor: `inconclusive`, and a rerun
    whose noise leans one way `regressed`)."""
    from gatekeeper.baseline import store
    from gatekeeper.results import reader as results
    from gatekeeper.run import runner
    from gatekeeper.suite.suite import load_suite

    root = Path(__file__).resolve().parents[1]
    suite = load_suite(root / "examples" / "gatekeeper.yaml")
    run_dir = runner.run_suite(suite, str(root / "examples" / "checkpoints" / "base"), tmp_path / "run",
                               batch_size=3, log=lambda *_: None)
    baseline = store.load_baseline(root / "examples" / ".gatekeeper" / "baselines" / "demo.json.gz")
    candidate = results.load_run(run_dir)
    for policy in (suite.policy, Policy(margin=0.0)):
        out = compare_runs(baseline, candidate, policy, suite="demo")
        assert out.exit_code == 0
        assert {str(c.key): c.verdict for c in out.comparisons if c.verdict != "unchanged"} == {}
        assert not out.inconclusive


def test_a_drop_exactly_at_the_margin_never_fails_by_float_rounding():
    """10 of 200 items right -> wrong against margin 0.05: the float drop is 0.05 or
    0.05000000000000002 depending on the items (46% of draws). At the margin is not beyond it."""
    rng = np.random.default_rng(13)
    verdicts = set()
    for _ in range(40):
        base = (rng.random(200) < 0.7).astype(float)
        cand = _flip(base, np.flatnonzero(base == 1)[:10])
        out = compare_runs(run(series("t", "acc", base)), run(series("t", "acc", cand)),
                           Policy(margin=0.05, rounding=0.0))
        verdicts.add(out.comparisons[0].verdict)
        assert out.exit_code == 0
    assert "regressed" not in verdicts


def test_warns_when_the_margin_is_below_what_the_items_resolve():
    base = _binary(200, 0.6, 14)
    cand = _flip(base, np.array([0, 1, 2, 3, 5, 8]))
    tiny = compare_runs(run(series("t", "acc", base)), run(series("t", "acc", cand)), Policy(margin=0.001))
    assert any("below one item (1/200" in w for w in tiny.warnings)
    rng = np.random.default_rng(15)
    f1 = rng.beta(2, 3, 30)
    noisy = f1 + rng.normal(0, 0.2, 30)
    out = compare_runs(run(series("t", "f1", f1)), run(series("t", "f1", noisy)), Policy(margin=0.01, resamples=1000))
    (w,) = [w for w in out.warnings if "can resolve" in w]
    assert "below what 30 items can resolve" in w and "add items or widen the margin" in w
    # margin 0 is a deliberate "any significant drop": no warning
    zero = compare_runs(run(series("t", "f1", f1)), run(series("t", "f1", noisy)), Policy(margin=0.0, resamples=1000))
    assert not [w for w in zero.warnings if "resolve" in w or "below one item" in w]


def test_mde_includes_the_margin_and_the_correction():
    base = _binary(1000, 0.6, 16)
    cand = _flip(base, np.flatnonzero(np.random.default_rng(16).random(1000) < 0.1))
    a, b = run(series("t", "acc", base)), run(series("t", "acc", cand))
    plain = compare_runs(a, b, Policy(margin=0.0)).comparisons[0].mde
    with_margin = compare_runs(a, b, Policy(margin=0.02)).comparisons[0].mde
    others = [series(f"o{i}", "acc", base) for i in range(19)]
    in_suite = compare_runs(run(series("t", "acc", base), *others),
                            run(series("t", "acc", cand), *others), Policy(margin=0.0))
    one_of_20 = next(c for c in in_suite.comparisons if c.key.task == "t").mde
    assert plain < with_margin and plain < one_of_20
    assert with_margin > 0.02


def test_an_undefined_interval_is_inconclusive_not_unchanged():
    """Fail closed: an interval that could not be computed (NaN) rules nothing out."""
    from gatekeeper.compare.verdict import _verdict

    nan = float("nan")
    assert _verdict(0.0, (nan, nan), 0.0, 1.0, 0.05, False) == "inconclusive"
    assert _verdict(0.01, (-0.02, 0.03), 0.05, 0.5, 0.05, False) == "unchanged"
