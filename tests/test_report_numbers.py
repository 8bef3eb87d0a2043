"""What the report says is exactly right: real aggregates under the rounding floor, one floor for
every metric made from the same log-likelihoods, the wording of a drop within the margin, and
the three test rules (superiority, inferiority, non-inferiority)."""

from __future__ import annotations

import numpy as np
import pytest

from gatekeeper import report
from gatekeeper.compare.compare import compare_runs
from gatekeeper.results.metrics import kind_named
from gatekeeper.suite.policy import Policy
from tests.synthetic import run, series


def _ratio_items(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    count = rng.integers(20, 400, n).astype(float)
    return np.column_stack([-count * rng.gamma(20, 0.09, n), count])


@pytest.mark.parametrize("kind, aggregation, metric, hib", [
    ("mean", "mean", "acc_like", True),
    ("ratio", "weighted_perplexity", "word_perplexity", False),
    ("ratio", "bits_per_byte", "bits_per_byte", False),
    ("ratio", "perplexity", "perplexity", False),
    ("brier", "brier_score", "brier_score", False),
    ("nanmean", "nanmean", "nanmean_metric", True),
    ("median", "median", "median_metric", True),
])
def test_reported_aggregates_are_the_runs_own_also_under_the_rounding_floor(kind, aggregation, metric, hib):
    """Half the candidate's items differ from the baseline by 3e-6 relative (within the 1e-5
    floor: the test sees them as equal), a few by a real amount: the report's baseline and
    candidate are the aggregates of each run's own values, computed as lm-eval computes them."""
    rng = np.random.default_rng(5)
    n = 300
    if kind == "ratio":
        base = _ratio_items(n, 1)
        if aggregation == "perplexity":  # lm-eval: exp(-mean(ll)) of per-item log-likelihoods, count 1
            base = np.column_stack([-rng.gamma(2.0, 0.5, n), np.ones(n)])
        cand = base.copy()
        cand[: n // 2, 0] *= 1 + 3e-6
        cand[n - 10:, 0] *= 1.01
    else:
        base = rng.uniform(0.1, 0.9, n)
        cand = base * np.where(np.arange(n) < n // 2, 1 + 3e-6, 1.0)
        cand[n - 10:] += 0.05
    out = compare_runs(run(series("t", metric, base, kind=kind, aggregation=aggregation, higher_is_better=hib)),
                       run(series("t", metric, cand, kind=kind, aggregation=aggregation, higher_is_better=hib)),
                       Policy(resamples=500))
    c = out.comparisons[0]
    assert c.rounded == n // 2
    k = kind_named(kind)
    assert c.test.baseline == k.aggregate(aggregation, base)
    assert c.test.candidate == k.aggregate(aggregation, cand)  # not the snapped values' aggregate
    assert c.test.delta == c.test.candidate - c.test.baseline
    data = report.to_json(out)["comparisons"][0]
    assert (data["baseline"], data["candidate"]) == (c.test.baseline, c.test.candidate)


def test_lm_evals_own_functions_give_the_reported_values():
    lm_metrics = pytest.importorskip("lm_eval.api.metrics")
    base = _ratio_items(200, 2)
    cand = base.copy()
    cand[:120, 0] *= 1 + 4e-6  # within rounding
    for aggregation, fn in (("weighted_perplexity", lm_metrics.weighted_perplexity),
                            ("bits_per_byte", lm_metrics.bits_per_byte)):
        out = compare_runs(run(series("t", "m", base, kind="ratio", aggregation=aggregation, higher_is_better=False)),
                           run(series("t", "m", cand, kind="ratio", aggregation=aggregation, higher_is_better=False)),
                           Policy(resamples=500))
        c = out.comparisons[0]
        assert c.rounded == 120
        assert c.test.candidate == fn([(float(ll), float(k)) for ll, k in cand])
        assert c.test.baseline == fn([(float(ll), float(k)) for ll, k in base])
        assert c.verdict == "unchanged" and c.within_rounding
        assert report.numbers.delta_cell(c).endswith("(rounding only)")


@pytest.mark.parametrize("shift, verdict", [(1.1e-5, "regressed"), (0.9e-5, "unchanged")])
def test_one_loglikelihood_shift_gives_one_verdict_for_every_metric_made_from_it(shift, verdict):
    """Every document's log-likelihood 1.1e-5 (relative) worse on a 20,000-document task: word
    perplexity (~6), byte perplexity (~1.3) and bits per byte all regress; 0.9e-5 is rounding for
    all three. With the floor relative to each aggregate byte_perplexity read unchanged at 1.1e-5."""
    rng = np.random.default_rng(9)
    n = 20_000
    words = rng.integers(50, 200, n).astype(float)
    nbytes = words * 5.5
    ll = -words * rng.normal(1.84, 0.05, n)  # word perplexity ~ e^1.84 ~ 6.3, byte ~ 1.4
    worse = ll * (1 + shift)
    cases = [("word_perplexity", "weighted_perplexity", words), ("byte_perplexity", "weighted_perplexity", nbytes),
             ("bits_per_byte", "bits_per_byte", nbytes)]
    base = run(*(series("doc", m, np.column_stack([ll, cnt]), kind="ratio", aggregation=a, higher_is_better=False)
                 for m, a, cnt in cases))
    cand = run(*(series("doc", m, np.column_stack([worse, cnt]), kind="ratio", aggregation=a, higher_is_better=False)
                 for m, a, cnt in cases))
    out = compare_runs(base, cand, Policy(resamples=1000))
    assert {c.key.metric: c.verdict for c in out.comparisons} == {m: verdict for m, _, _ in cases}


def test_a_significant_drop_within_the_margin_is_said_and_passes():
    """A final-norm-gain-like defect: every item a little worse, far from noise, well inside a
    generous margin. Not "unchanged": its own verdict, in JSON, markdown, terminal, headline."""
    rng = np.random.default_rng(3)
    base = _ratio_items(300, 3)
    cand = base.copy()
    cand[:, 0] *= 1.004  # ~ +0.04 word perplexity on ~6, margin 0.5
    cand[:, 0] += rng.normal(0, 0.001, 300) * cand[:, 1]
    out = compare_runs(run(series("ppl", "word_perplexity", base, kind="ratio", aggregation="weighted_perplexity",
                                  higher_is_better=False)),
                       run(series("ppl", "word_perplexity", cand, kind="ratio", aggregation="weighted_perplexity",
                                  higher_is_better=False)),
                       Policy(margin=0.5, resamples=2000))
    c = out.comparisons[0]
    assert out.verdict == "pass" and c.verdict == "worse_within_margin"
    assert report.to_json(out)["comparisons"][0]["verdict"] == "worse_within_margin"
    assert report.to_json(out)["worse_within_margin"] == 1
    assert "🟡 worse, within margin" in report.render_markdown(out)
    assert "worse, within margin" in report.render_terminal(out)
    assert "1 worse within the margin: ppl word_perplexity +" in report.headline(out)


def test_noninferiority_spelling_is_deprecated_and_reads_as_inferiority():
    policy = Policy(margin=0.02, test="noninferiority")
    assert policy.test == "inferiority"
    base = np.zeros(200)
    base[:100] = 1
    out = compare_runs(run(series("t", "acc", base)), run(series("t", "acc", base.copy())), policy)
    assert any("deprecated" in w and "non-inferiority" in w for w in out.warnings)


def test_textbook_noninferiority_fails_what_it_cannot_show_within_the_margin():
    """Twenty unchanged right/wrong items do not show a drop below 0.02 (Newcombe's bound, even
    with no item flipped): non-inferiority reads inconclusive and fails; 4,000 do."""
    few = np.zeros(20)
    few[:10] = 1
    out = compare_runs(run(series("t", "acc", few)), run(series("t", "acc", few.copy())),
                       Policy(margin=0.02, test="non-inferiority"))
    assert out.verdict == "fail" and out.comparisons[0].verdict == "inconclusive"
    assert "not shown within the margin" in report.headline(out)
    many = np.zeros(4000)
    many[:2000] = 1
    out = compare_runs(run(series("t", "acc", many)), run(series("t", "acc", many.copy())),
                       Policy(margin=0.02, test="non-inferiority"))
    assert out.verdict == "pass" and out.comparisons[0].verdict == "unchanged"
    assert "Non-inferiority" in report.render_markdown(out)
