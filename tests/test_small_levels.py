"""The test of a continuous mean at the small levels a multiplicity design uses (issue #37):
Hall's transformation plus a fast double bootstrap (compare/stats/studentized.py), against the
plain bootstrap-t the gate used before, on the same data. benchmarks/small_levels.py runs the
same at n = 100, 500 and 2,000 with up to 20,000 simulations each.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from scipy import stats as scipy_stats

from benchmarks import small_levels
from gatekeeper.compare.stats import paired_test, studentized
from gatekeeper.results.metrics import kind_named


def _allowance(level: float, sims: int) -> float:
    return 2.5 * math.sqrt(level * (1 - level) / sims)


def _rates(draw: Callable[[np.random.Generator], tuple[np.ndarray, np.ndarray]],
           p_value: Callable[[np.ndarray, np.ndarray], float], sims: int, seed: int) -> np.ndarray:
    """P(p < level) for each of small_levels.LEVELS, over ``sims`` pairs drawn by ``draw``."""
    rng = np.random.default_rng(seed)
    levels = np.array(small_levels.LEVELS)
    return sum((p_value(*draw(rng)) < levels).astype(float) for _ in range(sims)) / sims


def _assert_level_kept_and_leak_closed(after: np.ndarray, after_sims: int, before: np.ndarray,
                                       before_sims: int) -> None:
    """The gate's test within Monte Carlo error of 0.05 and 0.01; the old test above both by more
    than two Monte Carlo errors (the leak the gate's test closes)."""
    levels = np.array(small_levels.LEVELS)
    print(f"P(p < {levels}): the gate's test {after}, the test before (heavier tail) {before}")
    for level, a, b in zip(levels[:2], after[:2], before[:2], strict=True):
        assert a <= level + _allowance(level, after_sims), (level, a)
        assert b > level + 2 * math.sqrt(level * (1 - level) / before_sims), (level, b)


@pytest.mark.parametrize("a", [-0.4, -0.05, 1e-12, 0.02, 0.3])
def test_hall_transform_is_increasing_and_inverts_exactly(a: float) -> None:
    t = np.linspace(-40, 40, 2001)
    b = a / 2
    g = t + a * t * t + a * a * t**3 / 3 + b
    assert np.all(np.diff(g) >= 0)  # (1 + a t)^2 >= 0: never a fold, so p-values keep their order
    assert np.allclose(studentized._g_inverse(g, np.float64(a), np.float64(b)), t, atol=1e-6 * (1 + np.abs(t)))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_symmetric_changes_read_like_the_t_test(seed: int) -> None:
    """Without skew the corrections do nothing to speak of: p within 0.02 of Student's t (the two
    levels of resampling each add Monte Carlo error of about 0.005 at p near 0.5)."""
    rng = np.random.default_rng(seed)
    base = rng.beta(2, 3, 400)
    cand = base + rng.normal(-0.008, 0.1, 400)
    r = paired_test("mean", "mean", base, cand, higher_is_better=True)
    t = scipy_stats.ttest_rel(cand, base, alternative="less")
    assert r.test == "bootstrap-t"
    assert abs(r.p_worse - t.pvalue) < 0.02, (r.p_worse, t.pvalue)
    assert r.ci_low < r.delta < r.ci_high


def test_skewed_harmless_changes_keep_their_level() -> None:
    """500 items whose harmless changes are lognormal (sigma 0.75: most items a little worse,
    a few much better; mean 0), the hard direction for a test of "worse". The gate's test keeps
    each level within Monte Carlo error (750 simulations, fixed seed: they cannot tell 0.005
    from 0.006). The plain bootstrap-t the gate used before rejects above them on such data:
    benchmarks/small_levels.py runs both on the same data, in 12,000 simulations and more."""
    sims, levels = 750, np.array(small_levels.LEVELS)
    rng = np.random.default_rng(2026)
    after = np.zeros(levels.size)
    for _ in range(sims):
        after += small_levels.gate_p(small_levels.skewed_change(rng, 500, 0.75), rng) < levels
    after /= sims
    print(f"P(p < {levels}): the gate's test {after}")
    for level, a in zip(levels[:3], after[:3], strict=True):
        assert a <= level + _allowance(level, sims), (level, a)


def test_power_on_the_same_data_is_kept() -> None:
    """A real drop of about three standard errors at level 0.005: the calibrated test catches it
    nearly as often as the plain bootstrap-t, which paid for its power with false alarms."""
    sims = 300
    rng = np.random.default_rng(7)
    caught = np.zeros(2)
    for _ in range(sims):
        d = small_levels.skewed_change(rng, 500, 0.75) - 0.0075
        caught += [small_levels.plain_bootstrap_t(d) < 0.005, small_levels.gate_p(d, rng) < 0.005]
    before, after = caught / sims
    print(f"power at level 0.005: plain bootstrap-t {before:.3f}, the gate's test {after:.3f}")
    assert after >= before - 0.08 and after >= 0.4


def test_a_ratio_of_sums_keeps_its_level_where_the_permutation_did_not() -> None:
    """Bits per byte over 500 texts whose log-likelihood per byte moves by a harmless lognormal
    change (mean 0). The sign-swap permutation of the ratio the gate used before assumes the two
    runs' values exchangeable, and a skewed change is not: it rejects far above each level
    (shown on a heavy tail, sigma 1.5, where 200 simulations leave no doubt). The studentized
    test of the log-likelihoods (the means' test, mapped to the ratio) keeps 0.05 and 0.01
    within Monte Carlo error at sigma 0.75 (400 simulations). benchmarks/small_levels.py --ratio
    runs both tests on the same data, heavier tails and 100 to 2,000 texts, in 20,000."""
    after = _rates(lambda rng: small_levels.skewed_ratio_pair(rng, 500, 0.75), small_levels.ratio_gate_p,
                   sims=400, seed=3701)
    before = _rates(lambda rng: small_levels.skewed_ratio_pair(rng, 500, 1.5), small_levels.ratio_permutation_p,
                    sims=200, seed=3701)
    _assert_level_kept_and_leak_closed(after, 400, before, 200)


def test_a_ratio_is_tested_as_its_log_likelihoods_mean_and_shares_one_bootstrap() -> None:
    """Perplexity and bits per byte of the same texts are monotone in the summed log-likelihood
    (the counts are the texts'): one p-value for all three, the interval mapped through each
    aggregate, 0 at no change; counts that differ between the runs keep the permutation."""
    rng = np.random.default_rng(41)
    base, cand = small_levels.skewed_ratio_pair(rng, 300, 0.75, drop=0.01)
    tests = {agg: paired_test("ratio", agg, base, cand, higher_is_better=False)
             for agg in ("weighted_perplexity", "bits_per_byte", "perplexity")}
    assert {t.test for t in tests.values()} == {"ratio-bootstrap-t"}
    assert tests["weighted_perplexity"].p_worse == tests["bits_per_byte"].p_worse < 0.05
    for agg, t in tests.items():
        assert t.ci_low < t.delta < t.ci_high and t.delta > 0, agg  # worse: perplexity and bits up
        lo, hi = t.interval_at(0.999)
        assert lo < t.ci_low and hi > t.ci_high
    bpb = tests["bits_per_byte"]
    scale = -1 / (base[:, 1].sum() * math.log(2))  # bits per byte moves linearly with the summed change
    d = cand[:, 0] - base[:, 0]
    assert bpb.delta == pytest.approx(scale * d.sum(), rel=1e-9)
    same = paired_test("ratio", "bits_per_byte", base, base, higher_is_better=False)
    assert same.identical and same.p_worse == 1.0
    other = cand.copy()
    other[0, 1] += 1  # another count for one text: not the same texts
    assert paired_test("ratio", "bits_per_byte", base, other, higher_is_better=False).test == "ratio-permutation"


@pytest.mark.parametrize("aggregation", ["bleu", "chrf"])
def test_a_corpus_score_keeps_its_level_where_the_permutation_did_not(aggregation: str) -> None:
    """BLEU and chrF over 500 sentences whose matched n-grams move by a harmless lognormal change
    (mean 0: the expected statistics, and so the score, unchanged). The permutation swapping the
    two runs' statistics within sentences, the corpus scores' test before, rejects above each
    level (shown on a heavy tail, sigma 1.5, 200 simulations); the studentized test of the
    change's jackknife linearization keeps 0.05 and 0.01 within Monte Carlo error at sigma 0.75
    (400 simulations). benchmarks/small_levels.py --corpus runs both tests on the same data,
    heavier tails and 100 to 2,000 sentences, in up to 6,000."""
    def gate_p(xb: np.ndarray, xc: np.ndarray) -> float:
        return small_levels.corpus_gate_p(xb, xc, aggregation)

    def permutation_p(xb: np.ndarray, xc: np.ndarray) -> float:
        return small_levels.corpus_permutation_p(xb, xc, aggregation)

    after = _rates(lambda rng: small_levels.skewed_corpus_pair(rng, 500, 0.75, aggregation), gate_p,
                   sims=400, seed=3702)
    before = _rates(lambda rng: small_levels.skewed_corpus_pair(rng, 500, 1.5, aggregation), permutation_p,
                    sims=200, seed=3702)
    _assert_level_kept_and_leak_closed(after, 400, before, 200)


def test_the_benchmarks_corpus_test_is_the_gates() -> None:
    """corpus_gate_p, which the simulations run on statistics, is paired_test's p on texts."""
    pytest.importorskip("sacrebleu", reason="sacrebleu is not installed")
    from gatekeeper.results import corpus

    rng = np.random.default_rng(12)
    words = [f"w{i}" for i in range(40)]
    base, cand = np.empty((80, 2), dtype=object), np.empty((80, 2), dtype=object)
    for i in range(80):
        ref = list(rng.choice(words, 5 + rng.integers(0, 12)))
        base[i] = [" ".join(ref), " ".join(w if rng.random() < 0.7 else "x" for w in ref)]
        cand[i] = [base[i, 0], " ".join(w if rng.random() < 0.65 else "y" for w in ref)]
    for aggregation in ("bleu", "chrf"):
        xb, xc = corpus.sentence_stats(aggregation, base), corpus.sentence_stats(aggregation, cand)
        gate = paired_test("corpus", aggregation, base, cand, higher_is_better=True)
        assert gate.test == "corpus-bootstrap-t"
        assert small_levels.corpus_gate_p(xb, xc, aggregation) == pytest.approx(gate.p_worse, abs=1e-12)


def test_nanmean_is_tested_as_a_mean_of_its_judged_items() -> None:
    """nanmean: where the same items are judged in both runs, the studentized test of the judged
    values' sum (a mean's test); where judging changed, the jackknife linearization of the ratio
    of sums; the exact permutation up to 16 differing items, as for every kind."""
    rng = np.random.default_rng(43)
    base = rng.beta(2, 3, 400)
    cand = base + rng.normal(-0.03, 0.1, 400)
    base[:40], cand[:40] = np.nan, np.nan
    same = paired_test("nanmean", "nanmean", base, cand, higher_is_better=True)
    assert same.test == "nanmean-bootstrap-t" and same.p_worse < 0.01
    assert same.delta == pytest.approx(np.nanmean(cand) - np.nanmean(base), abs=1e-15)
    judged = ~np.isnan(base)
    mean = paired_test("mean", "mean", base[judged], cand[judged], higher_is_better=True)
    assert mean.p_worse < 0.01  # the same evidence as the judged items' mean: resampled over 400 items, not 360
    assert same.interval_at(0.9) == pytest.approx(mean.interval_at(0.9), rel=0.05)
    moved = cand.copy()
    moved[40:45] = np.nan
    other = paired_test("nanmean", "nanmean", base, moved, higher_is_better=True)
    assert other.test == "nanmean-bootstrap-t" and other.ci_low < other.delta < other.ci_high
    few = base.copy()
    few[50:60] -= 0.2
    assert paired_test("nanmean", "nanmean", base, few, higher_is_better=True).test == "nanmean-permutation"


@pytest.mark.parametrize("name", ["f1", "mcc"])
def test_f1_and_mcc_keep_their_level_where_the_permutation_did_not(name: str) -> None:
    """lm-eval's f1 and matthews_corrcoef over 500 items, 30% positive (F1 about 0.46), whose true
    negatives become false positives at 6%, balanced by false negatives becoming true positives
    so that the score of the expected counts does not move (issue #56.5): many small losses, few
    large gains. The permutation that swaps the two runs' cells within items assumes flips as
    likely one way as the other, and rejected above the level; the flips' test keeps 0.05 and
    0.01 within Monte Carlo error (benchmarks/small_levels.py --swap f1|mcc runs 100 to 2,000
    items and more simulations)."""
    kind, aggregation = small_levels.SWAP_KINDS[name]
    sims, levels = 300, np.array(small_levels.LEVELS)
    before, after = small_levels.swap_rates(kind, aggregation, 500, sims, seed=3705)
    print(f"{name} P(p < {levels}): permutation {before}, the gate's test {after}")
    for level, b, a in zip(levels[:2], before[:2], after[:2], strict=True):
        assert a <= level + _allowance(level, sims), (level, a, b)
    assert after[0] < before[0] and after[1] <= before[1], (after, before)
    if name == "f1":  # the leak this closes (mcc's is smaller: 0.064 at 0.05 in 3,000 simulations)
        assert before[0] > levels[0] + 2 * math.sqrt(levels[0] * (1 - levels[0]) / sims), before


def test_the_flips_test_counts_each_kind_and_keeps_the_permutation_where_it_cannot_apply() -> None:
    """Only flips between cells of one gold label are drawn; the null's rates give no expected
    change; a clear loss is caught and a clear gain is not; labels that differ between the runs,
    clusters, and flips that only one direction of the score could explain keep the permutation."""
    from gatekeeper.compare.stats import flips

    rng = np.random.default_rng(44)
    base, cand = small_levels.skewed_confusion_pair(rng, 600, "f1")
    kind = kind_named("confusion")
    xb, xc = kind.unit_stats("f1", base, cand)
    cells, codes = np.unique(np.concatenate([xb, xc]), axis=0, return_inverse=True)
    codes = codes.reshape(-1)
    source, target = flips._kinds(codes[:600], codes[600:], base[:, 0])
    gold_of = {int(c): int(g) for c, g in zip(codes[:600], base[:, 0], strict=True)}
    assert source.size == 4 and all(gold_of[a] == gold_of[b] for a, b in zip(source, target, strict=True))
    w = kind.score_fn("f1")(xb.sum(axis=0)[None, :] + cells[target] - cells[source]) - kind.aggregate("f1", base)
    rates = flips._null_rates(np.array([3.0, 10.0, 0.5, 7.0]), w)
    assert rates is not None and (rates > 0).all() and abs(float(w @ rates)) < 1e-9
    assert flips._null_rates(np.ones(2), np.array([-0.1, -0.2])) is None  # no flip could make it better

    gold = base[:, 0]
    worse = base.copy()
    worse[(gold == 1) & (base[:, 1] == 1) & (rng.random(600) < 0.3), 1] = 0  # true positives lost
    for aggregation in ("f1", "matthews_corrcoef"):
        t = paired_test("confusion", aggregation, base, worse, higher_is_better=True)
        assert t.test == "confusion-flips" and t.p_worse < 0.001 and t.p_better > 0.99, aggregation
        back = paired_test("confusion", aggregation, worse, base, higher_is_better=True)
        assert back.p_better < 0.001 and back.p_worse > 0.99
    relabelled = cand.copy()
    relabelled[0, 0] = 1 - relabelled[0, 0]
    assert paired_test("confusion", "f1", base, relabelled, higher_is_better=True).test == "confusion-permutation"
    clusters = np.arange(600) // 3
    assert paired_test("confusion", "f1", base, cand, higher_is_better=True,
                       clusters=clusters).test == "cluster-permutation"
    few = base.copy()
    few[:10, 1] = 1 - few[:10, 1]  # however few flipped: the exact permutation assumed them symmetric
    assert paired_test("confusion", "f1", base, few, higher_is_better=True).test == "confusion-flips"
    negatives = base[base[:, 0] == 0]
    negatives[:, 1] = 0
    one_way = negatives.copy()
    one_way[:5, 1] = 1  # only true negatives, only losses: nothing the null could balance them by
    assert paired_test("confusion", "f1", negatives, one_way, higher_is_better=True).test == "confusion-permutation"
