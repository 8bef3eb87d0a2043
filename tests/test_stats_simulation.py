"""Simulation checks of the claims users rely on (fixed seeds).

1. Harmless changes (items move both ways with equal probability) trip the suite - any of
   5 comparisons rejected after Holm at alpha 0.05 - at most alpha of the time, for McNemar on
   right/wrong items, the bootstrap-t and sign-flip tests on continuous scores and the ratio
   (perplexity) test.
2. A real 3-point drop on 1,000 right/wrong items (10% of items change) is caught >= 85%.
3. With clustered items, the naive test over-rejects and the cluster test does not.

Tolerances are Monte Carlo allowances: 2.5 standard errors of the simulated rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from gatekeeper.compare.compare import compare_runs
from gatekeeper.compare.stats import adjust_pvalues, paired_test, resampling
from gatekeeper.suite.policy import Policy
from tests.synthetic import fast_series, paired_binary, run

ALPHA = 0.05
N_COMPARISONS = 5


def _allowance(rate: float, n_sims: int) -> float:
    return 2.5 * math.sqrt(rate * (1 - rate) / n_sims)


def _suite_false_alarm_rate(p_worse: np.ndarray) -> float:
    """p_worse: (n_suites, n_comparisons). Share of suites with any Holm-adjusted p < alpha."""
    tripped = [bool((adjust_pvalues(row, "holm") < ALPHA).any()) for row in p_worse]
    return float(np.mean(tripped))


def _paired_binary(rng: np.random.Generator, n: int, p_break: np.ndarray | float,
                   p_fix: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """Right/wrong pairs: each item is discordant right->wrong with prob p_break, wrong->right
    with prob p_fix, else concordant (both right w.p. 0.6 of the rest). Harmless when equal."""
    u = rng.random(n)
    breaks = u < p_break
    fixes = (u >= p_break) & (u < p_break + p_fix)
    both_right = ~breaks & ~fixes & (rng.random(n) < 0.6)
    base = (breaks | both_right).astype(float)
    cand = (fixes | both_right).astype(float)
    return base, cand


def test_mcnemar_suite_false_alarm_rate_at_most_alpha():
    rng = np.random.default_rng(2024)
    n_suites = 1000
    p = np.empty((n_suites, N_COMPARISONS))
    for s in range(n_suites):
        for j in range(N_COMPARISONS):
            base, cand = _paired_binary(rng, 300, 0.075, 0.075)
            p[s, j] = paired_test("mean", "mean", base, cand, higher_is_better=True).p_worse
    rate = _suite_false_alarm_rate(p)
    print(f"suite false-alarm rate {rate:.3f}, per comparison {np.mean(p < ALPHA):.3f}")
    assert rate <= ALPHA + _allowance(ALPHA, n_suites)
    # and each single comparison at its own level
    assert np.mean(p < ALPHA) <= ALPHA + _allowance(ALPHA, p.size)


def test_continuous_suite_false_alarm_rate_at_most_alpha():
    rng = np.random.default_rng(7)
    n_suites = 400
    p = np.empty((n_suites, N_COMPARISONS))
    for s in range(n_suites):
        for j in range(N_COMPARISONS):
            base = rng.beta(2, 3, 60)  # continuous scores (e.g. F1)
            if j < 3:  # a harmless, symmetric change; heavy-tailed for some comparisons
                cand = base + (rng.laplace(0, 0.1, 60) if j % 2 else rng.normal(0, 0.1, 60))
            else:  # partial-credit scores in steps of 1/2: many ties (the binomial sampler)
                base = rng.integers(0, 3, 60) / 2
                cand = base + rng.choice([-0.5, 0.0, 0.5], 60)
            p[s, j] = paired_test("mean", "mean", base, cand, higher_is_better=True,
                                  n_resamples=400, seed=s * 10 + j).p_worse
    rate = _suite_false_alarm_rate(p)
    print(f"suite false-alarm rate {rate:.3f}, per comparison {np.mean(p < ALPHA):.3f}")
    assert rate <= ALPHA + _allowance(ALPHA, n_suites)
    assert np.mean(p < ALPHA) <= ALPHA + _allowance(ALPHA, p.size)


def test_long_tailed_harmless_changes_are_studentized():
    """120 items whose harmless changes have a long tail (most items a little worse, a few much
    better; mean 0): the sign-flip test assumes symmetric changes and fails such a change about
    10% of the time at alpha 0.05; the calibrated bootstrap-t that unclustered means use 6%
    (README: approximate at such sizes with strongly skewed changes; benchmarks/small_levels.py)."""
    rng = np.random.default_rng(21)
    n_sims, n = 600, 120
    flips = studentized = 0
    for s in range(n_sims):
        base = rng.beta(2, 3, n)
        cand = base + (rng.lognormal(0, 1, n) - math.exp(0.5)) * 0.05
        units = resampling.Units(base[:, None], cand[:, None], lambda x: x[:, 0] / n, mean_of_diff=True)
        flips += resampling.permutation_test(units, True, 999, np.random.SeedSequence(s)).p_worse < ALPHA
        t = paired_test("mean", "mean", base, cand, higher_is_better=True, n_resamples=999, seed=s)
        assert t.test == "bootstrap-t"
        studentized += t.p_worse < ALPHA
    print(f"long-tailed harmless, n={n}: sign-flip fails {flips / n_sims:.3f}, bootstrap-t {studentized / n_sims:.3f}")
    assert studentized < flips
    assert studentized / n_sims <= 0.075 + _allowance(0.075, n_sims)


def test_ratio_suite_false_alarm_rate_at_most_alpha():
    rng = np.random.default_rng(11)
    n_suites = 400
    p = np.empty((n_suites, N_COMPARISONS))
    for s in range(n_suites):
        for j in range(N_COMPARISONS):
            count = rng.integers(20, 400, 80).astype(float)
            true_ll = -count * rng.gamma(20, 0.05, 80)  # ~1 nat per word, varying by document
            # two runs = two exchangeable noisy measurements of the same documents
            base = np.column_stack([true_ll + rng.normal(0, 2, 80) * np.sqrt(count), count])
            cand = np.column_stack([true_ll + rng.normal(0, 2, 80) * np.sqrt(count), count])
            p[s, j] = paired_test("ratio", "weighted_perplexity", base, cand, higher_is_better=False,
                                  n_resamples=400, seed=s * 10 + j).p_worse
    rate = _suite_false_alarm_rate(p)
    print(f"suite false-alarm rate {rate:.3f}, per comparison {np.mean(p < ALPHA):.3f}")
    assert rate <= ALPHA + _allowance(ALPHA, n_suites)
    assert np.mean(p < ALPHA) <= ALPHA + _allowance(ALPHA, p.size)


def test_power_three_point_drop_on_1000_items():
    """10% of items change (discordant pairs ~ 10% of items), net 3 points worse:
    6.5% go right -> wrong, 3.5% wrong -> right."""
    rng = np.random.default_rng(99)
    n_sims, n = 600, 1000
    caught = 0
    for _ in range(n_sims):
        base, cand = _paired_binary(rng, n, 0.065, 0.035)
        r = paired_test("mean", "mean", base, cand, higher_is_better=True)
        caught += r.p_worse < ALPHA
    print(f"power {caught / n_sims:.3f}")
    assert caught / n_sims >= 0.85


def _clustered_harmless(rng: np.random.Generator, n_clusters: int, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Items share a passage: a harmless change (zero mean) moves whole clusters together."""
    labels = np.repeat(np.arange(n_clusters), size)
    lean = rng.uniform(0.05, 0.95, n_clusters)[labels]  # cluster-level direction, symmetric
    base, cand = _paired_binary(rng, labels.size, 0.2 * (1 - lean), 0.2 * lean)
    return base, cand, labels


def test_cluster_test_holds_level_where_naive_test_does_not():
    rng = np.random.default_rng(5)
    n_sims = 400
    naive = cluster = 0
    for s in range(n_sims):
        base, cand, labels = _clustered_harmless(rng, 30, 25)
        naive += paired_test("mean", "mean", base, cand, higher_is_better=True).p_worse < ALPHA
        cluster += paired_test("mean", "mean", base, cand, higher_is_better=True, clusters=labels,
                               n_resamples=400, seed=s).p_worse < ALPHA
    naive_rate, cluster_rate = naive / n_sims, cluster / n_sims
    print(f"clustered harmless change: naive {naive_rate:.3f}, cluster {cluster_rate:.3f}")
    assert naive_rate > 2 * ALPHA  # the demonstration: ignoring clusters over-rejects
    assert cluster_rate <= ALPHA + _allowance(ALPHA, n_sims)


# ---------------------------------------------------------------- MDE: power of the rule at the reported MDE
#
# The reported MDE must be the smallest true drop that *the gate's rule* (drop > margin, Holm-
# adjusted one-sided p < alpha, interval agreeing) flags with 80% power. Each case simulates
# whole comparisons through ``compare_runs``: the MDE is read off harmless pilot runs (their
# median of 25: one pilot's spread is itself noisy), then the same kind of run with that true drop
# is gated ``n_sims`` times (300 for the 20-comparison suite, 500 otherwise: Monte Carlo error
# about 0.02). The other gated comparisons of the suite are harmless
# right/wrong tasks, so Holm splits alpha across all of them.

Make = Callable[[np.random.Generator, float], tuple[np.ndarray, np.ndarray, dict]]


def _right_wrong(n: int, flip_rate: float) -> Make:
    """A share ``flip_rate`` of items flip either way; a true drop d adds d right-to-wrong flips."""
    def make(rng: np.random.Generator, d: float):
        base, cand = paired_binary(rng, n, flip_rate / 2 + d, flip_rate / 2)
        return base, cand, {}
    return make


def _continuous(n: int, noise: float) -> Make:
    def make(rng: np.random.Generator, d: float):
        base = rng.beta(2, 3, n)  # e.g. F1 per item
        return base, base + rng.normal(0, noise, n) - d, {}
    return make


def _ratio(n: int) -> Make:
    """Word perplexity (lower is better): a true drop d raises the perplexity by d."""
    def make(rng: np.random.Generator, d: float):
        count = rng.integers(20, 400, n).astype(float)
        true_ll = -count * rng.gamma(20, 0.05, n)
        base = np.column_stack([true_ll + rng.normal(0, 2, n) * np.sqrt(count), count])
        shift = np.log1p(d / np.exp(-base[:, 0].sum() / count.sum()))  # nats per word
        cand = np.column_stack([true_ll + rng.normal(0, 2, n) * np.sqrt(count) - shift * count, count])
        return base, cand, {"kind": "ratio", "aggregation": "weighted_perplexity", "higher_is_better": False}
    return make


def _clustered(n_clusters: int, size: int) -> Make:
    labels = np.repeat(np.arange(n_clusters), size)

    def make(rng: np.random.Generator, d: float):
        lean = rng.uniform(0.05, 0.95, n_clusters)[labels]  # whole clusters move together
        base, cand = paired_binary(rng, labels.size, 0.2 * (1 - lean) + d, 0.2 * lean)
        return base, cand, {"clusters": labels}
    return make


def _gate_once(rng: np.random.Generator, make: Make, d: float, n_gated: int, margin: float):
    base, cand, kw = make(rng, d)
    a, b = [fast_series("target", base, **kw)], [fast_series("target", cand, **kw)]
    for j in range(n_gated - 1):  # the rest of the suite: harmless right/wrong tasks
        nb, nc = paired_binary(rng, 100, 0.1, 0.1)
        a.append(fast_series(f"other{j:02d}", nb))
        b.append(fast_series(f"other{j:02d}", nc))
    out = compare_runs(run(*a), run(*b), Policy(margin=margin, resamples=1000), seed=int(rng.integers(2**31)))
    return next(c for c in out.comparisons if c.key.task == "target")


@pytest.mark.parametrize(
    "make, n_gated, margin, n_sims",
    [
        pytest.param(_right_wrong(1000, 0.1), 1, 0.0, 500, id="right/wrong n=1000"),
        pytest.param(_right_wrong(1000, 0.1), 20, 0.0, 300, id="right/wrong 1 of 20 Holm"),
        pytest.param(_right_wrong(1000, 0.1), 1, 0.02, 500, id="right/wrong margin 0.02"),
        pytest.param(_right_wrong(200, 0.06), 3, 0.05, 500, id="right/wrong demo-like"),
        pytest.param(_continuous(200, 0.15), 3, 0.02, 500, id="continuous"),
        pytest.param(_ratio(150), 3, 0.3, 500, id="ratio perplexity"),
        pytest.param(_clustered(40, 25), 2, 0.0, 500, id="clustered"),
    ],
)
def test_power_at_reported_mde_is_80_percent(make: Make, n_gated: int, margin: float, n_sims: int):
    rng = np.random.default_rng(20261201)
    mde = float(np.median([_gate_once(rng, make, 0.0, n_gated, margin).mde for _ in range(25)]))
    assert mde > margin
    hits = sum(_gate_once(rng, make, mde, n_gated, margin).verdict == "regressed" for _ in range(n_sims))
    power = hits / n_sims
    print(f"mde {mde:.4g}, power there {power:.3f}")
    assert 0.75 <= power <= 0.85


# ---------------------------------------------------------------- inferiority and non-inferiority


@pytest.mark.parametrize("make, margin", [
    pytest.param(_right_wrong(1000, 0.1), 0.02, id="right/wrong"),
    pytest.param(_continuous(200, 0.15), 0.02, id="continuous"),
])
def test_inferiority_fails_a_drop_equal_to_the_margin_at_most_alpha(make: Make, margin: float):
    """policy.test: inferiority tests H0 "drop <= margin": a true drop exactly at the margin
    fails at most alpha of the time. The default rule (drop > margin and significantly > 0)
    fails it about half the time: that is the difference the README explains."""
    rng = np.random.default_rng(77)
    n_sims = 400
    fails = {"inferiority": 0, "superiority": 0}
    for s in range(n_sims):
        base, cand, kw = make(rng, margin)
        a, b = run(fast_series("target", base, **kw)), run(fast_series("target", cand, **kw))
        for mode in fails:
            out = compare_runs(a, b, Policy(margin=margin, resamples=1000, test=mode), seed=s)
            fails[mode] += out.exit_code == 1
    ni, sup = fails["inferiority"] / n_sims, fails["superiority"] / n_sims
    print(f"drop = margin: inferiority fails {ni:.3f}, superiority {sup:.3f}")
    assert ni <= ALPHA + _allowance(ALPHA, n_sims)
    assert sup > 0.3


@pytest.mark.parametrize("make, margin", [
    pytest.param(_right_wrong(1000, 0.1), 0.03, id="right/wrong"),
    pytest.param(_continuous(200, 0.15), 0.03, id="continuous"),
])
def test_textbook_noninferiority_passes_a_drop_at_the_margin_at_most_alpha(make: Make, margin: float):
    """policy.test: non-inferiority (H0: drop >= margin) passes a candidate whose true drop is
    exactly the margin at most alpha of the time, here on one of three gated metrics without a
    correction (the suite passes only when all three pass: intersection-union); and it passes
    a harmless change (drop 0, three metrics) most of the time at these sizes."""
    rng = np.random.default_rng(78)
    n_sims = 400
    passed_at_margin = passed_harmless = 0
    for s in range(n_sims):
        drop = margin if s % 2 == 0 else 0.0
        pairs = [make(rng, drop if j == 0 else 0.0) for j in range(3)]
        a = run(*(fast_series(f"t{j}", base, **kw) for j, (base, _, kw) in enumerate(pairs)))
        b = run(*(fast_series(f"t{j}", cand, **kw) for j, (_, cand, kw) in enumerate(pairs)))
        out = compare_runs(a, b, Policy(margin=margin, resamples=1000, test="non-inferiority"), seed=s)
        if drop:
            passed_at_margin += out.exit_code == 0
        else:
            passed_harmless += out.exit_code == 0
    half = n_sims // 2
    print(f"non-inferiority: passes {passed_at_margin / half:.3f} at drop = margin, {passed_harmless / half:.3f} at 0")
    assert passed_at_margin / half <= ALPHA + _allowance(ALPHA, half)
    assert passed_harmless / half > 0.5


# ---------------------------------------------------------------- the interval agrees with the verdict


def test_interval_shown_agrees_with_every_verdict():
    """Suites of 4 gated comparisons (right/wrong and continuous; no drop, small and large
    drops; margins 0 and 0.02; both test modes). For every comparison the interval shown (at
    the level the decision used) must agree with the label: regressed => its drop-side end is
    past 0; a drop-side end past the margin => regressed; improved => entirely on the better
    side; unchanged => the worst end within the margin; inconclusive => beyond it; worse within
    margin => the whole interval a drop, none beyond the margin. The audit
    found 45% of false "regressed" rows with an interval containing 0, and an interval
    entirely past 0 labelled inconclusive."""
    rng = np.random.default_rng(31)
    # the third: many precise items, where a small drop is significant yet within a margin
    makes = [_right_wrong(300, 0.1), _continuous(100, 0.15), _continuous(2000, 0.02)]
    seen = {"regressed": 0, "improved": 0, "unchanged": 0, "inconclusive": 0, "worse_within_margin": 0}
    false_alarms = false_alarms_containing_0 = 0
    for s in range(150):
        margin = (0.0, 0.02)[s % 2]
        mode = ("superiority", "inferiority")[(s // 2) % 2]
        a, b, drops = [], [], []
        for j in range(4):
            d = float(rng.choice([0.0, 0.0, 0.01, 0.02, 0.06, -0.04]))
            base, cand, kw = makes[j % 2 if j < 3 else 2](rng, d)
            a.append(fast_series(f"t{j}", base, **kw))
            b.append(fast_series(f"t{j}", cand, **kw))
            drops.append(d)
        out = compare_runs(run(*a), run(*b), Policy(margin=margin, resamples=1000, test=mode), seed=s)
        for c in out.comparisons:
            low, high = c.drop_bounds
            assert low <= high
            seen[c.verdict] += 1
            if c.verdict == "regressed":
                assert low > 0, (c.key, c.interval)
            if low > c.margin:
                assert c.verdict == "regressed"
            if c.verdict == "improved":
                assert high < 0
            if c.verdict == "unchanged":
                assert high <= c.margin or c.within_rounding
            if c.verdict == "inconclusive":
                assert high > c.margin and low <= c.margin
            if c.verdict == "worse_within_margin":
                assert 0 < low <= high <= c.margin + 1e-9, (c.key, c.interval)
            if c.verdict == "regressed" and drops[int(c.key.task[1:])] <= 0:
                false_alarms += 1
                false_alarms_containing_0 += low <= 0 <= high
    print(seen, f"false alarms {false_alarms}, with 0 inside the interval {false_alarms_containing_0}")
    assert min(seen.values()) > 0  # every label occurred
    assert false_alarms_containing_0 == 0


def test_harmless_changes_fail_the_gate_at_most_alpha():
    """The whole rule through compare_runs (verdicts, not just p-values): suites of 5 gated
    comparisons where nothing really changed fail at most alpha of the time. An earlier draft
    that also failed whenever the bootstrap interval alone cleared the margin measured 0.07;
    this rule measured 0.044 and 0.048 over 1,000 suites each (seeds 1, 2)."""
    rng = np.random.default_rng(1)
    n_suites = 600
    fails = 0
    for s in range(n_suites):
        a, b = [], []
        for j in range(5):
            if j % 2:
                base = rng.beta(2, 3, 60)
                cand = base + rng.normal(0, 0.1, 60)
            else:
                base, cand = paired_binary(rng, 300, 0.075, 0.075)
            a.append(fast_series(f"t{j}", base))
            b.append(fast_series(f"t{j}", cand))
        fails += compare_runs(run(*a), run(*b), Policy(resamples=1000), seed=s).exit_code
    print(f"suite false-alarm rate {fails / n_suites:.3f}")
    assert fails / n_suites <= ALPHA + _allowance(ALPHA, n_suites)
