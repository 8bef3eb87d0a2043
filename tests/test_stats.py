"""Unit tests of gatekeeper.compare.stats: hand computations, lm-eval equality, edge cases."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import binom, binomtest

from gatekeeper.compare.stats import (
    PairedTest,
    adjust_pvalues,
    aggregate,
    decision_levels,
    mde,
    paired_test,
    resampling,
)
from gatekeeper.compare.stats.paired import jackknife_influence
from gatekeeper.results import corpus as corpus_mod

SENTENCES = [
    ("the cat sat on the mat", "the cat sat on a mat"),
    ("a quick brown fox jumps", "quick brown foxes jump"),
    ("hello world", "hello there world"),
    ("it is raining today in the city", "today it rains in the city"),
    ("one two three four five", "one two three four five"),
    ("we will meet at noon", "we meet at noon tomorrow"),
    ("numbers like 42 and 7 matter", "numbers 42 and 7 matter a lot"),
    ("short", "a much longer prediction than the reference"),
]


def _pairs(b: int, c: int, a: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """0/1 arrays with a both-right, b base-right/cand-wrong, c base-wrong/cand-right, d both-wrong."""
    base = np.array([1] * a + [1] * b + [0] * c + [0] * d, dtype=float)
    cand = np.array([1] * a + [0] * b + [1] * c + [0] * d, dtype=float)
    return base, cand


# --- McNemar ---------------------------------------------------------------------------------

def test_mcnemar_midp_matches_hand_computation():
    base, cand = _pairs(b=5, c=1, a=10, d=4)
    r = paired_test("mean", "mean", base, cand, higher_is_better=True)
    # X ~ Bin(6, 1/2): P(X > 5) + P(X = 5)/2 = 1/64 + 3/64
    assert r.test == "mcnemar-midp"
    assert r.p_worse == pytest.approx(4 / 64, abs=1e-12)
    assert r.p_better == pytest.approx(1 - 4 / 64, abs=1e-12)
    assert r.delta == pytest.approx(-4 / 20)
    assert r.n_resamples == 0 and r.n_clusters is None


@pytest.mark.parametrize("b,c", [(30, 12), (7, 9), (0, 5), (40, 40)])
def test_mcnemar_midp_is_exact_binomial_minus_half_point_mass(b, c):
    base, cand = _pairs(b=b, c=c, a=50, d=20)
    r = paired_test("mean", "mean", base, cand, higher_is_better=True)
    exact = binomtest(b, b + c, 0.5, alternative="greater").pvalue
    assert r.p_worse == pytest.approx(exact - 0.5 * binom.pmf(b, b + c, 0.5), abs=1e-12)
    exact_better = binomtest(c, b + c, 0.5, alternative="greater").pvalue
    assert r.p_better == pytest.approx(exact_better - 0.5 * binom.pmf(c, b + c, 0.5), abs=1e-12)


def test_mcnemar_direction_follows_higher_is_better():
    base, cand = _pairs(b=20, c=3, a=50, d=27)  # more ones in baseline
    up = paired_test("mean", "mean", base, cand, higher_is_better=True)
    down = paired_test("mean", "mean", base, cand, higher_is_better=False)
    assert up.p_worse < 0.001 < 0.999 < up.p_better
    assert down.p_worse == pytest.approx(up.p_better) and down.p_better == pytest.approx(up.p_worse)
    assert up.delta == down.delta < 0


def test_mcnemar_interval_and_se():
    base, cand = _pairs(b=30, c=12, a=120, d=38)
    r = paired_test("mean", "mean", base, cand, higher_is_better=True)
    n, delta = 200, (12 - 30) / 200
    assert r.ci_low < delta < r.ci_high < 0  # a clear drop: interval excludes 0
    assert r.se == pytest.approx(math.sqrt((42 / n - delta**2) / n))
    # Newcombe's interval is close to Wald for moderate counts
    assert r.ci_low == pytest.approx(delta - 1.96 * r.se, abs=0.01)
    assert r.ci_high == pytest.approx(delta + 1.96 * r.se, abs=0.01)
    wider = paired_test("mean", "mean", base, cand, higher_is_better=True, confidence=0.99)
    assert wider.ci_low < r.ci_low and wider.ci_high > r.ci_high


def test_mcnemar_interval_stays_inside_bounds_for_extreme_counts():
    base, cand = _pairs(b=0, c=6, a=0, d=0)
    r = paired_test("mean", "mean", base, cand, higher_is_better=True)
    assert -1 <= r.ci_low < r.ci_high <= 1 and r.ci_low < 1 == r.delta


# --- sign-flip and swap permutations ------------------------------------------------------------

def test_exact_sign_flip_matches_hand_enumeration():
    base = np.array([0.3, 0.5, 0.9, 0.2])
    cand = np.array([1.3, 2.5, 0.4, 0.2])  # d = [1, 2, -0.5, 0]
    r = paired_test("mean", "mean", base, cand, higher_is_better=True)
    # sums over the 8 sign patterns of (1, 2, 0.5): 3.5 2.5 1.5 0.5 -0.5 -1.5 -2.5 -3.5; observed 2.5
    assert r.test == "exact-sign-flip"
    assert r.p_better == pytest.approx(2 / 8)
    assert r.p_worse == pytest.approx(7 / 8)


def test_exact_ratio_permutation_equals_brute_force_recomputation():
    rng = np.random.default_rng(3)
    base = np.column_stack([-rng.gamma(4, 10, 7), rng.integers(5, 40, 7)]).astype(float)
    cand = base.copy()
    cand[:, 0] += rng.normal(-3, 4, 7)
    r = paired_test("ratio", "weighted_perplexity", base, cand, higher_is_better=False)
    observed = aggregate("ratio", "weighted_perplexity", cand) - aggregate("ratio", "weighted_perplexity", base)
    stats = []
    for swap in itertools.product([False, True], repeat=7):
        s = np.array(swap)
        b = np.where(s[:, None], cand, base)
        c = np.where(s[:, None], base, cand)
        stats.append(aggregate("ratio", "weighted_perplexity", c) - aggregate("ratio", "weighted_perplexity", b))
    stats = np.array(stats)
    tol = 1e-9 * abs(observed)
    # lower perplexity is better: "worse" is a larger delta
    assert r.p_worse == pytest.approx(np.mean(stats >= observed - tol))
    assert r.p_better == pytest.approx(np.mean(stats <= observed + tol))
    assert r.test == "ratio-permutation"


def test_monte_carlo_permutation_paths_agree():
    """The byte-table sampler, the bit-unpacking sampler and the binomial (tied values) sampler
    all draw the same permutation distribution."""
    rng = np.random.default_rng(5)
    d = rng.normal(0.05, 1, 400)
    base = rng.normal(0, 1, 400)
    def sign_flip(cand: np.ndarray) -> resampling.PermutationResult:
        # the sign-flip test of a mean (clustered and small tests, and f1/mcc/nanmean, use the
        # same samplers; larger unclustered means, ratios and corpus scores take the bootstrap-t)
        units = resampling.Units(base[:, None], cand[:, None], lambda s: s[:, 0] / base.size, mean_of_diff=True)
        return resampling.permutation_test(units, True, 4000, np.random.SeedSequence(0))

    ps = []
    for lut_cells in (resampling.LUT_MAX_CELLS, 0):
        old = resampling.LUT_MAX_CELLS
        resampling.LUT_MAX_CELLS = lut_cells
        try:
            ps.append(sign_flip(base + d).p_better)
        finally:
            resampling.LUT_MAX_CELLS = old
    z = (d.sum()) / math.sqrt((d**2).sum())  # normal approximation of the sign-flip test
    normal_p = 0.5 * math.erfc(z / math.sqrt(2))
    assert ps[0] == pytest.approx(normal_p, abs=0.02)
    assert ps[1] == pytest.approx(normal_p, abs=0.02)
    tied = np.round(d)  # few distinct values -> binomial sampler
    r = sign_flip(base + tied + 0.25)
    dd = tied + 0.25
    z = dd.sum() / math.sqrt((dd**2).sum())
    assert r.p_better == pytest.approx(0.5 * math.erfc(z / math.sqrt(2)), abs=0.02)


def test_monte_carlo_p_uses_plus_one_correction():
    rng = np.random.default_rng(1)
    base = rng.normal(0, 1, 300)
    r = paired_test("mean", "mean", base, base - 5, higher_is_better=True, n_resamples=999)
    assert r.test == "bootstrap-t"
    assert r.p_worse == pytest.approx(1 / 1000)
    assert r.p_better == pytest.approx(1.0)
    assert r.n_resamples == 999


# --- aggregates --------------------------------------------------------------------------------

def _ratio_values(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.column_stack([-rng.gamma(5, 20, n), rng.integers(10, 200, n)]).astype(float)


def test_ratio_aggregates_equal_their_formulas():
    v = _ratio_values(np.random.default_rng(0), 50)
    ll, cnt = v[:, 0], v[:, 1]
    assert aggregate("ratio", "weighted_perplexity", v) == pytest.approx(math.exp(-ll.sum() / cnt.sum()), rel=1e-13)
    assert aggregate("ratio", "bits_per_byte", v) == pytest.approx(-ll.sum() / cnt.sum() / math.log(2), rel=1e-13)
    assert aggregate("ratio", "perplexity", v) == pytest.approx(math.exp(-ll.mean()), rel=1e-13)


def test_aggregates_equal_lm_eval_exactly():
    metrics = pytest.importorskip("lm_eval.api.metrics", reason="lm-eval is not installed")
    rng = np.random.default_rng(1)
    v = _ratio_values(rng, 300)
    items = [(float(a), int(b)) for a, b in v]
    assert aggregate("ratio", "weighted_perplexity", v) == metrics.weighted_perplexity(items)
    assert aggregate("ratio", "bits_per_byte", v) == metrics.bits_per_byte(items)
    assert aggregate("ratio", "perplexity", v) == metrics.perplexity([a for a, _ in items])
    scores = rng.random(301)
    assert aggregate("mean", "mean", scores) == metrics.mean(scores.tolist())
    refs_preds = np.array(SENTENCES, dtype=object)
    items = [(r, p) for r, p in SENTENCES]
    assert aggregate("corpus", "bleu", refs_preds) == metrics.bleu(items)
    assert aggregate("corpus", "chrf", refs_preds) == metrics.chrf(items)
    assert aggregate("corpus", "ter", refs_preds) == metrics.ter(items)


@pytest.mark.parametrize("aggregation", ["bleu", "chrf", "ter"])
def test_corpus_sufficient_statistics_reproduce_sacrebleu(aggregation):
    pytest.importorskip("sacrebleu", reason="sacrebleu is not installed")
    values = np.array(SENTENCES, dtype=object)
    stats = corpus_mod.sentence_stats(aggregation, values)
    exact = aggregate("corpus", aggregation, values)
    assert corpus_mod.exact_score_from_stats(aggregation, stats) == exact
    # the vectorized formula on random subsets (what a resample sums) matches sacrebleu's formula
    rng = np.random.default_rng(2)
    for _ in range(20):
        idx = rng.integers(0, len(SENTENCES), len(SENTENCES))
        sub = values[idx]
        vec = corpus_mod.SCORE_FNS[aggregation](stats[idx].sum(axis=0)[None, :])[0]
        assert vec == pytest.approx(aggregate("corpus", aggregation, sub), rel=1e-12, abs=1e-12)


def test_corpus_paired_test_uses_exact_scores():
    pytest.importorskip("sacrebleu", reason="sacrebleu is not installed")
    base = np.array(SENTENCES, dtype=object)
    cand = base.copy()
    cand[:, 1] = base[:, 0]  # candidate predicts the reference exactly
    r = paired_test("corpus", "bleu", base, cand, higher_is_better=True, n_resamples=500)
    assert r.baseline == aggregate("corpus", "bleu", base)
    assert r.candidate == pytest.approx(100.0)
    assert r.test == "corpus-permutation"
    # exact: 7 items differ (one prediction already equals its reference); only the identity
    # of the 2^7 swap patterns is as good as observed
    assert r.p_better == pytest.approx(1 / 128)
    assert r.ci_low > 0


def _translations(n: int, lost: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n [reference, prediction] rows, twice: the candidate drops about ``lost`` of the
    baseline's correct words (another word in their place)."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(60)]
    base, cand = np.empty((n, 2), dtype=object), np.empty((n, 2), dtype=object)
    for i in range(n):
        ref = list(rng.choice(words, 6 + rng.integers(0, 14)))
        pred = [w if rng.random() < 0.7 else str(rng.choice(words)) for w in ref]
        worse = [w if rng.random() >= lost else "zz" for w in pred]
        base[i], cand[i] = [" ".join(ref), " ".join(pred)], [" ".join(ref), " ".join(worse)]
    return base, cand


@pytest.mark.parametrize("aggregation", ["bleu", "chrf", "ter"])
def test_corpus_scores_over_many_sentences_take_the_studentized_test(aggregation):
    """BLEU and chrF through their jackknife linearization, TER through its edits' mean
    difference (the same references): the means' calibrated bootstrap-t, in the score's units,
    with sacrebleu's own scores; by cluster, the permutation of whole clusters."""
    pytest.importorskip("sacrebleu", reason="sacrebleu is not installed")
    base, cand = _translations(120, 0.15, seed=3)
    hib = aggregation != "ter"
    r = paired_test("corpus", aggregation, base, cand, higher_is_better=hib)
    assert r.test == "corpus-bootstrap-t"
    assert (r.baseline, r.candidate) == (aggregate("corpus", aggregation, base), aggregate("corpus", aggregation, cand))
    assert r.ci_low < r.delta < r.ci_high and (r.delta < 0) == hib  # worse: BLEU/chrF down, TER up
    assert r.p_worse < 0.01 and r.p_better > 0.99
    same = paired_test("corpus", aggregation, base, base, higher_is_better=hib)
    assert same.p_worse == 1.0
    clusters = np.arange(120) // 4
    assert paired_test("corpus", aggregation, base, cand, higher_is_better=hib,
                       clusters=clusters).test == "cluster-permutation"


def test_jackknife_influence_of_a_linear_score_is_the_centred_difference():
    rng = np.random.default_rng(8)
    xb, xc = rng.normal(size=(50, 3)), rng.normal(size=(50, 3))
    linear = lambda s: 2.0 * s[..., 0] - s[..., 2]  # noqa: E731
    d = 2.0 * (xc[:, 0] - xb[:, 0]) - (xc[:, 2] - xb[:, 2])
    assert np.allclose(jackknife_influence(xb, xc, linear), 49 * (d - d.mean()))
    assert np.allclose(jackknife_influence(xb, xc, linear, block=7), 49 * (d - d.mean()))
    only = np.zeros((50, 1))
    only[0] = 1.0  # without item 0 the baseline's sum is 0: no finite score, the permutation decides
    assert jackknife_influence(only, only + 1, lambda s: np.log(s[..., 0])) is None


def test_multi_reference_rows_follow_lm_eval_format():
    values = np.empty((2, 2), dtype=object)
    values[0] = [["the cat", "a cat"], "the cat"]
    values[1] = [["a dog", "the dog"], "dog"]
    stats = corpus_mod.sentence_stats("bleu", values)
    assert corpus_mod.exact_score_from_stats("bleu", stats) == aggregate("corpus", "bleu", values)


# --- bootstrap interval -------------------------------------------------------------------------

def test_interval_contains_true_shift():
    rng = np.random.default_rng(4)
    base = rng.random(500)
    cand = base + 0.1 + rng.normal(0, 0.05, 500)
    r = paired_test("mean", "mean", base, cand, higher_is_better=True, n_resamples=2000)
    assert r.ci_low < 0.1 < r.ci_high
    assert r.se == pytest.approx(0.05 / math.sqrt(500), rel=0.15)
    assert r.p_better < 0.001


def test_ratio_bootstrap_recomputes_aggregate_not_mean_of_items():
    rng = np.random.default_rng(6)
    n = 2000
    base = _ratio_values(rng, n)
    cand = base.copy()
    # big improvements on a few long documents, small losses on many short ones
    long_docs = base[:, 1] > 180
    base[long_docs, 1] *= 20
    cand[:, 1] = base[:, 1]
    cand[long_docs, 0] += 0.2 * base[long_docs, 1]
    cand[~long_docs, 0] -= 2.0
    r = paired_test("ratio", "weighted_perplexity", base, cand, higher_is_better=False, n_resamples=2000)
    per_item = np.exp(-cand[:, 0] / cand[:, 1]) - np.exp(-base[:, 0] / base[:, 1])
    assert r.delta < 0 < per_item.mean()
    assert r.ci_low < r.delta < r.ci_high < 0


# --- clusters ------------------------------------------------------------------------------------

def test_cluster_warning_below_twenty_clusters():
    rng = np.random.default_rng(7)
    base = (rng.random(400) < 0.6).astype(float)
    cand = np.where(rng.random(400) < 0.1, 1 - base, base)
    few = paired_test("mean", "mean", base, cand, higher_is_better=True, clusters=np.arange(400) % 19)
    many = paired_test("mean", "mean", base, cand, higher_is_better=True, clusters=np.arange(400) % 20)
    assert few.test == many.test == "cluster-permutation"
    assert few.n_clusters == 19 and many.n_clusters == 20
    assert any("19 clusters" in w for w in few.warnings)
    assert many.warnings == ()


def test_cluster_sign_flip_exact_by_hand():
    base = np.zeros(6)
    cand = np.array([1, 1, -1, 0, 0.5, 0.5])  # cluster sums: A=2, B=-1, C=1
    r = paired_test("mean", "mean", base, cand, higher_is_better=True,
                    clusters=np.array(["A", "A", "B", "C", "C", "C"]))
    # flips of (2, 1, 1): 4 2 2 0 0 -2 -2 -4; observed 2 -> P(T >= 2) = 3/8
    assert r.p_better == pytest.approx(3 / 8)
    assert r.p_worse == pytest.approx(7 / 8)


def test_ratio_with_clusters_swaps_whole_clusters():
    rng = np.random.default_rng(8)
    base = _ratio_values(rng, 60)
    cand = base.copy()
    cand[:, 0] -= 5.0
    r = paired_test("ratio", "bits_per_byte", base, cand, higher_is_better=False,
                    clusters=np.arange(60) // 10, n_resamples=500)
    # 6 clusters all worse: only the identity and the all-swapped pattern are as extreme
    assert r.p_worse == pytest.approx(1 / 64)
    assert r.delta > 0 and r.n_clusters == 6


# --- degenerate input, determinism ---------------------------------------------------------------

@pytest.mark.parametrize("kind,agg,values", [
    ("mean", "mean", np.array([1.0, 0.0, 1.0, 1.0])),
    ("mean", "mean", np.array([0.3, 0.7, 0.1])),
    ("ratio", "weighted_perplexity", np.array([[-10.0, 5.0], [-3.0, 2.0]])),
])
def test_identical_runs_are_degenerate_but_defined(kind, agg, values):
    r = paired_test(kind, agg, values, values.copy(), higher_is_better=True)
    assert (r.p_worse, r.p_better, r.ci_low, r.ci_high, r.se, r.delta) == (1.0, 1.0, 0.0, 0.0, 0.0, 0.0)
    assert r.confidence_interval() == (0.0, 0.0)


@pytest.mark.parametrize("base,cand,msg", [
    (np.array([]), np.array([]), "no items"),
    (np.array([0.1, np.nan]), np.array([0.1, 0.2]), "NaN"),
    (np.array([0.1, 0.2]), np.array([0.1, 0.2, 0.3]), "pair row by row"),
    (np.array([0.1, np.inf]), np.array([0.1, 0.2]), "infinite"),
])
def test_bad_input_raises_value_error(base, cand, msg):
    with pytest.raises(ValueError, match=msg):
        paired_test("mean", "mean", base, cand, higher_is_better=True)


def test_bad_kind_and_clusters_raise():
    with pytest.raises(ValueError, match="unknown kind"):
        paired_test("histogram", "histogram", np.ones(3), np.ones(3), higher_is_better=True)
    with pytest.raises(ValueError, match="one label per item"):
        paired_test("mean", "mean", np.ones(3), np.zeros(3), higher_is_better=True, clusters=np.ones(2))


def test_same_seed_same_result_and_seed_matters():
    rng = np.random.default_rng(9)
    base = _ratio_values(rng, 300)
    cand = base.copy()
    cand[:, 0] += rng.normal(0, 1, 300)
    a = paired_test("ratio", "weighted_perplexity", base, cand, higher_is_better=False, seed=11, n_resamples=3000)
    b = paired_test("ratio", "weighted_perplexity", base, cand, higher_is_better=False, seed=11, n_resamples=3000)
    c = paired_test("ratio", "weighted_perplexity", base, cand, higher_is_better=False, seed=12, n_resamples=3000)
    assert a == b
    assert (a.ci_low, a.p_worse) != (c.ci_low, c.p_worse)
    assert isinstance(a, PairedTest)


# --- multiplicity and MDE ------------------------------------------------------------------------

def test_adjust_pvalues_hand_computed():
    p = np.array([0.01, 0.04, 0.03, 0.005])
    np.testing.assert_allclose(adjust_pvalues(p, "holm"), [0.03, 0.06, 0.06, 0.02])
    np.testing.assert_allclose(adjust_pvalues(p, "bh"), [0.02, 0.04, 0.04, 0.02])
    np.testing.assert_allclose(adjust_pvalues(p, "bonferroni"), [0.04, 0.16, 0.12, 0.02])
    np.testing.assert_allclose(adjust_pvalues(p, "none"), p)
    np.testing.assert_allclose(adjust_pvalues(np.array([0.5, 0.6]), "bonferroni"), [1.0, 1.0])
    np.testing.assert_allclose(adjust_pvalues(np.array([0.5, 0.6, 0.9]), "holm"), [1.0, 1.0, 1.0])
    assert adjust_pvalues(np.array([]), "holm").shape == (0,)


@pytest.mark.parametrize("method", ["holm", "bonferroni", "bh", "none"])
def test_adjust_pvalues_is_monotone_and_capped(method):
    p = np.random.default_rng(0).random(40) ** 3
    adj = adjust_pvalues(p, method)
    order = np.argsort(p)
    assert (np.diff(adj[order]) >= -1e-15).all()
    assert (adj >= p - 1e-15).all() and (adj <= 1).all()


def test_adjust_pvalues_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown correction"):
        adjust_pvalues(np.array([0.1]), "sidak")
    with pytest.raises(ValueError, match="NaN"):
        adjust_pvalues(np.array([0.1, np.nan]), "holm")


def test_mde_formula():
    assert mde(1.0, 0.05) == pytest.approx(1.6448536 + 0.8416212, abs=1e-6)
    assert mde(0.01, 0.01, 0.9) == pytest.approx(0.01 * (2.3263479 + 1.2815516), abs=1e-8)
    assert mde(0.0, 0.05) == 0.0


# --- Newcombe's corrected phi, decision levels, intervals at the decision's level ----------------

def _wilson(x: int, n: int, z: float) -> tuple[float, float]:
    p = x / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)


def _newcombe_by_hand(a: int, b: int, c: int, d: int, z: float, phi: float) -> tuple[float, float]:
    n = a + b + c + d
    p1, p2 = (a + c) / n, (a + b) / n  # candidate, baseline
    (l1, u1), (l2, u2) = _wilson(a + c, n, z), _wilson(a + b, n, z)
    lo = (p1 - p2) - math.sqrt((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2)
    hi = (p1 - p2) + math.sqrt((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2)
    return lo, hi


@pytest.mark.parametrize(
    "a, b, c, d, big_a_used",
    [
        (35, 5, 13, 47, 35 * 47 - 5 * 13 - 50),  # A = 1580 > N/2 = 50: A - N/2
        (2, 3, 3, 5, 0),                          # A = 1 in [0, N/2]: 0
        (1, 6, 5, 1, 1 * 1 - 6 * 5),              # A = -29 < 0: kept
    ],
)
def test_newcombe_uses_the_corrected_phi(a, b, c, d, big_a_used):
    from gatekeeper.compare.stats.mcnemar import corrected_phi, newcombe_interval

    phi = big_a_used / math.sqrt((a + b) * (c + d) * (a + c) * (b + d))
    assert corrected_phi(a, b, c, d) == pytest.approx(phi, abs=1e-15)
    expected = _newcombe_by_hand(a, b, c, d, 1.959963984540054, phi)
    np.testing.assert_allclose(newcombe_interval(a, b, c, d, 0.95), expected, rtol=0, atol=1e-12)
    if big_a_used > 0:  # the plain phi overstates the correlation: a narrower interval
        plain = (a * d - b * c) / math.sqrt((a + b) * (c + d) * (a + c) * (b + d))
        lo_plain, hi_plain = _newcombe_by_hand(a, b, c, d, 1.959963984540054, plain)
        assert lo_plain > expected[0] and hi_plain < expected[1]


def test_hand_reference_value_of_the_corrected_interval():
    """Table a=35, b=5, c=13, d=47 worked through by hand (z = 1.96): Wilson 95% for the
    candidate's 48/100 = (0.38464, 0.57684) and the baseline's 40/100 = (0.30940, 0.49800);
    A = 35*47 - 5*13 = 1580 > N/2, so phi = (1580 - 50) / sqrt(40*60*48*52) = 0.62512;
    lower = 0.08 - sqrt(0.0090928 - 0.0116838 + 0.0096048) = -0.0037,
    upper = 0.08 + sqrt(0.0093772 - 0.0109690 + 0.0082084) = 0.1613."""
    from gatekeeper.compare.stats.mcnemar import newcombe_interval

    assert newcombe_interval(35, 5, 13, 47, 0.95) == pytest.approx((-0.0037, 0.1613), abs=1e-4)


def test_no_flip_is_flagged_identical_not_an_interval():
    base = np.array([1.0, 0.0, 1.0, 1.0])
    r = paired_test("mean", "mean", base, base.copy(), higher_is_better=True)
    assert r.identical and r.counts == (3, 0, 0, 1) and r.interval_at(0.9) == (0.0, 0.0)
    moved = paired_test("mean", "mean", base, np.array([1.0, 1.0, 1.0, 1.0]), higher_is_better=True)
    assert not moved.identical


@pytest.mark.parametrize("method", ["holm", "bonferroni", "bh", "none"])
def test_decision_levels_agree_with_adjusted_p(method):
    rng = np.random.default_rng(3)
    for _ in range(200):
        p = rng.random(rng.integers(1, 12)) ** 4
        p[rng.random(p.size) < 0.1] = 0.0
        levels = decision_levels(p, method, 0.05)
        assert ((p < levels) == (adjust_pvalues(p, method) < 0.05)).all()
        assert (levels <= 0.05 + 1e-15).all() and (levels > 0).all()


def test_decision_levels_holm_by_hand():
    p = np.array([0.01, 0.04, 0.03, 0.005])
    # sorted 0.005 x4, 0.01 x3, 0.03 x2 = 0.06, 0.04 x1 -> 0.06 after the running max
    np.testing.assert_allclose(decision_levels(p, "holm", 0.05), [0.05 / 3, 0.05 * 0.04 / 0.06, 0.025, 0.0125])


def test_interval_at_matches_the_reported_interval_and_widens():
    rng = np.random.default_rng(12)
    base = rng.beta(2, 3, 300)
    r = paired_test("mean", "mean", base, base + rng.normal(-0.02, 0.1, 300), higher_is_better=True,
                    confidence=0.95, n_resamples=4000)
    assert r.interval_at(0.95) == pytest.approx((r.ci_low, r.ci_high))
    lo99, hi99 = r.interval_at(0.99)
    assert lo99 < r.ci_low and hi99 > r.ci_high
    b, c = _pairs(b=30, c=12, a=120, d=38)
    m = paired_test("mean", "mean", b, c, higher_is_better=True, confidence=0.9)
    assert m.interval_at(0.9) == pytest.approx((m.ci_low, m.ci_high))


@pytest.mark.parametrize("level", [0.01, 0.025, 0.05])
def test_shifted_p_value_inverts_the_interval(level):
    """p_drop_above(margin) < a exactly when the one-sided level-a bound on the drop is above the
    margin (McNemar: Newcombe inverted; bootstrap: the same draws)."""
    b, c = _pairs(b=40, c=12, a=110, d=38)
    m = paired_test("mean", "mean", b, c, higher_is_better=True)
    rng = np.random.default_rng(1)
    base = rng.beta(2, 3, 200)
    r = paired_test("mean", "mean", base, base + rng.normal(-0.05, 0.1, 200), higher_is_better=True,
                    n_resamples=4000)
    for t in (m, r):
        drop_low = -t.interval_at(1 - 2 * level)[1]
        for margin in np.linspace(drop_low - 0.03, drop_low + 0.03, 13):
            if abs(margin - drop_low) < 2e-3:
                continue  # Monte Carlo / bisection resolution at the boundary
            assert (t.p_drop_above(float(margin), True) < level) == (drop_low > margin)


def test_mcnemar_power_at_no_drop_is_the_size_and_rises():
    from gatekeeper.compare.stats.mcnemar import power

    assert power(1000, 0.1, 0.0, 0.0, 0.05) <= 0.05
    curve = [power(1000, 0.1, d, 0.0, 0.05) for d in (0.0, 0.01, 0.02, 0.03, 0.05)]
    assert curve == sorted(curve) and curve[-1] > 0.95
    assert power(1000, 0.1, 0.03, 0.02, 0.05) < power(1000, 0.1, 0.03, 0.0, 0.05)  # the margin costs power


def _ratio_pair(rng: np.random.Generator, m: int, shift: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    words = rng.integers(20, 400, m).astype(np.float64)
    ll = -words * rng.gamma(3.0, 1.0, m)
    return np.column_stack([ll, words]), np.column_stack([ll + rng.normal(shift, 2.0, m), words])


@pytest.mark.parametrize("keep_counts", [True, False])
def test_a_suites_bootstraps_drawn_together_equal_each_drawn_alone(monkeypatch, keep_counts):
    """``pending_draws`` sums the tests that share a size and seed in one pass over the draw
    counts (kept between calls or not): every test comes out as ``paired_test`` gives it alone."""
    from gatekeeper.compare.stats import pending_draws, plan_test

    if not keep_counts:  # the 1M-item case: counts too big to keep for the next metric
        monkeypatch.setattr(resampling, "COUNTS_CACHE_BYTES", 0)
    rng = np.random.default_rng(7)
    # ratios by passage (clusters of 3 items: tested by resampling clusters; unclustered ratios
    # take the studentized test) and a ratio of few distinct rows (multinomial draws)
    cases = [("ratio", agg, *_ratio_pair(rng, m, shift), np.arange(m) // 3)
             for m, shift in ((300, 0.0), (300, -0.3), (300, 0.2), (451, 0.0)) for agg in ("weighted_perplexity", "bits_per_byte")]
    few = rng.integers(0, 3, (300, 1)).astype(np.float64)
    cases.append(("ratio", "weighted_perplexity", np.column_stack([few[:, 0], np.ones(300)]),
                  np.column_stack([few[::-1, 0], np.ones(300)]), np.arange(300) // 3))
    kw = dict(higher_is_better=False, n_resamples=999, seed=3)
    plans = [plan_test(kind, agg, b, c, clusters=g, **kw) for kind, agg, b, c, g in cases]
    together = [p.finish(d) for p, d in zip(plans, pending_draws(plans), strict=True)]
    alone = [paired_test(kind, agg, b, c, clusters=g, **kw) for kind, agg, b, c, g in cases]
    for t, a in zip(together, alone, strict=True):
        assert (t.p_worse, t.p_better, t.n_resamples) == (a.p_worse, a.p_better, a.n_resamples)
        np.testing.assert_allclose(t.draws, a.draws, rtol=1e-8, atol=1e-12)  # summed in another order
        assert (t.ci_low, t.ci_high) == pytest.approx((a.ci_low, a.ci_high), rel=1e-8)
    assert len({t.ci_low for t in together}) == len(cases)  # the draws are shared, not the answers


@pytest.mark.parametrize("shape", [(10, 20, 3), (1000, 300, 4), (15, 16_667, 54), (157, 1667, 7), (70, 5000, 1)])
def test_blocked_matmul_is_the_product(shape):
    rows, inner, cols = shape
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 4, (rows, inner)).astype(np.float64), rng.normal(size=(inner, cols))
    np.testing.assert_allclose(resampling.matmul(a, b), a @ b, rtol=1e-10, atol=1e-9)


def test_studentized_tests_drawn_together_equal_each_drawn_alone() -> None:
    """Means and ratios over the same texts with as many items share one double bootstrap
    (``bootstrap_t_many``: one pass over the draw counts, equal differences once); each comes
    out as ``paired_test`` gives it alone. A different size draws on its own."""
    from gatekeeper.compare.stats import PendingStudentized, pending_draws, plan_test

    rng = np.random.default_rng(11)
    cases = []
    for m, shift in ((4000, 0.0), (4000, -0.4), (700, 0.3)):  # 4,000: counts too big to keep
        base, cand = _ratio_pair(rng, m, shift)
        cases += [("ratio", agg, base, cand, False) for agg in ("weighted_perplexity", "bits_per_byte")]
        cases.append(("mean", "mean", base[:, 0] / base[:, 1], cand[:, 0] / cand[:, 1], True))
    kw = dict(n_resamples=999, seed=5)
    plans = [plan_test(kind, agg, b, c, higher_is_better=hib, **kw) for kind, agg, b, c, hib in cases]
    assert all(isinstance(p, PendingStudentized) for p in plans)
    together = [p.finish(d) for p, d in zip(plans, pending_draws(plans), strict=True)]
    alone = [paired_test(kind, agg, b, c, higher_is_better=hib, **kw) for kind, agg, b, c, hib in cases]
    for t, a in zip(together, alone, strict=True):
        assert t.test == a.test and t.test in ("ratio-bootstrap-t", "bootstrap-t")
        assert (t.p_worse, t.p_better) == pytest.approx((a.p_worse, a.p_better), abs=1.5 / 1000)
        np.testing.assert_allclose(t.draws, a.draws, rtol=1e-7, atol=1e-12)
    # a task's ratios test one difference: one p-value
    assert together[0].p_worse == together[1].p_worse
