"""Group-sequential gating (compare/sequential.py, issue #16): boundaries against the published
O'Brien–Fleming-type values, and fixed-seed simulations of the whole rule (compare_runs on the
items of each look, at the look's level, futility on conditional power) against the fixed design:
false alarms at alpha, power close to it, items saved on harmless changes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from scipy.stats import norm

from gatekeeper.compare import sequential as seq
from gatekeeper.compare.compare import compare_runs
from gatekeeper.compare.stats.multiplicity import Graph, graph_levels
from gatekeeper.suite.policy import Policy, Rule
from tests.synthetic import fast_series, run

ALPHA = 0.05


def test_levels_match_the_lan_demets_obrien_fleming_boundaries() -> None:
    # Published one-sided nominal levels for alpha 0.05 (e.g. gsDesign sfLDOF, equal looks).
    assert seq.look_levels(seq.fractions(2), ALPHA) == pytest.approx([0.0056, 0.0482], abs=2e-4)
    assert seq.look_levels(seq.fractions(3), ALPHA) == pytest.approx([0.0007, 0.0162, 0.0451], abs=5e-4)
    four = seq.look_levels(seq.fractions(4), ALPHA)
    assert four[0] < 1e-4 and four[-1] > 0.04 and np.all(np.diff(four) > 0)
    assert seq.look_levels(seq.fractions(1), ALPHA) == pytest.approx([ALPHA])
    # The cumulative chance of crossing is the spending function at every look.
    assert seq.spent(1.0, ALPHA) == pytest.approx(ALPHA)
    with pytest.raises(ValueError):
        seq.look_levels(np.array([0.5, 0.4, 1.0]), ALPHA)


def test_the_boundaries_are_gsdesigns_and_the_integration_converged(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recursive integration on a grid (compare/sequential.py): gsDesign's sfLDOF bounds for
    4 equal looks at one-sided 0.025 to their 4 decimals; every level within 1e-7 (relative) of a
    grid ten times finer, 2 to 8 looks, alpha down to an MMLU subject's share (0.05/57) and 1e-4;
    the multivariate normal integration it replaced agrees where that is accurate (2 looks), and
    still computes the designs whose looks lie too close together for the grid."""
    t4 = tuple(seq.fractions(4).tolist())
    assert seq.boundaries(t4, 0.025) == pytest.approx([4.3326, 2.9631, 2.3590, 2.0141], abs=5e-5)
    for looks in (2, 4, 8):
        t = tuple(seq.fractions(looks).tolist())
        for alpha in (0.05, 0.05 / 57, 1e-4):
            increments = np.diff(np.concatenate([[0.0], seq.spent(np.array(t), alpha)]))
            increments[-1] += alpha - increments.sum()
            grid = seq._sf(seq._grid_boundaries(t, increments))
            with monkeypatch.context() as m:
                m.setattr(seq, "_POINTS_PER_SD", 10 * seq._POINTS_PER_SD)
                m.setattr(seq, "_MAX_INTERVALS", 10 * seq._MAX_INTERVALS)
                finer = seq._sf(seq._grid_boundaries(t, increments))
            assert np.max(np.abs(grid / finer - 1)) < 1e-7, (looks, alpha)
            if looks == 2:
                assert seq._sf(seq._mvn_boundaries(t, increments)) == pytest.approx(grid, rel=1e-6)
    close = (0.5, 0.5 + 1e-6, 1.0)  # a look one item after the last, of a million
    increments = np.diff(np.concatenate([[0.0], seq.spent(np.array(close), ALPHA)]))
    assert seq._grid_boundaries(close, increments) is None
    levels = seq.look_levels(np.array(close), ALPHA)
    # a share too small to spend anything at a tiny first look: that look never fails
    tiny = seq.look_levels(np.array([0.01, 1.0]), 1e-6)
    assert tiny[0] == 0.0 and tiny[1] == pytest.approx(1e-6, rel=1e-6)
    # nearly the two-look design: the extra look spends almost nothing
    assert np.all(np.isfinite(levels)) and levels[[0, 2]] == pytest.approx(seq.look_levels(seq.fractions(2), ALPHA),
                                                                           abs=2e-4)


def test_levels_are_the_same_on_every_call() -> None:
    seq.boundaries.cache_clear()
    first = seq.look_levels(seq.fractions(4), ALPHA)
    seq.boundaries.cache_clear()
    assert np.array_equal(first, seq.look_levels(seq.fractions(4), ALPHA))  # seeded integration


def test_futility_stops_only_a_drop_shown_below_the_design_alternative() -> None:
    # se 0.01 at half the items: the whole suite's spread is 0.01 * sqrt(0.5). The alternative is
    # the fixed rule's 80%-power drop: significant at 0.04 and beyond the margin.
    sigma = 0.01 * np.sqrt(0.5)
    alt = seq.alternative([0.01], [500], [0.005], 0.5, 0.04)[0]
    assert alt == pytest.approx((norm.isf(0.04) + norm.isf(0.2)) * sigma)  # the test binds
    assert seq.alternative([0.01], [500], [0.02], 0.5, 0.04)[0] == pytest.approx(0.02 + norm.isf(0.2) * sigma)
    z = norm.isf(seq.FUTILITY_BETA / 3)
    assert seq.futile([alt - z * 0.01 - 1e-9, alt - z * 0.01 + 1e-9], [0.01, 0.01], [500, 500], [0.005, 0.005],
                      0.5, 4, 0.04).tolist() == [True, False]
    assert not seq.futile([-1.0], [0.01], [500], [0.01], 1.0, 4, 0.04)[0]  # the last look is the fixed rule's
    # Every item the same so far: one item's worth of spread, not none.
    assert seq.futile([0.0], [0.0], [1000], [0.01], 0.5, 4, 0.04)[0]
    assert not seq.futile([0.0], [0.0], [50], [0.01], 0.5, 4, 0.04)[0]


def test_early_passes_cost_at_most_beta_of_power_at_the_design_alternative() -> None:
    """Normal theory, 200,000 runs of one metric (se 0.0055 at the end, margin 0.01, 4 looks): at a
    true drop of 2 and 3 x margin (both above the design alternative, the fixed rule's 80%-power
    drop) the futility bound passes early at most FUTILITY_BETA of the runs, and
    the regressions the fixed rule would have caught and an early pass lost are fewer still. The
    rule before (conditional power under the current trend, 0.003) lost 1.9 points here."""
    rng = np.random.default_rng(2626)
    t, se, margin, runs = seq.fractions(4), 0.0055, 0.01, 200_000
    levels = seq.look_levels(t, ALPHA)
    for drop in (2 * margin, 3 * margin):
        paths = np.cumsum(rng.normal(size=(runs, 4)) * np.sqrt(np.diff(np.concatenate([[0.0], t]))), axis=1)
        est = drop + se * paths / t
        se_k = se / np.sqrt(t)
        passed = np.zeros(runs, dtype=bool)
        for k in range(3):
            passed |= seq.futile(est[:, k], np.full(runs, se_k[k]), np.full(runs, 1000 * t[k]),
                                 np.full(runs, margin), float(t[k]), 4, float(levels[-1]))
        fixed = (est[:, 3] > norm.isf(ALPHA) * se) & (est[:, 3] > margin)
        lost = float((passed & fixed).mean())
        assert passed.mean() <= seq.FUTILITY_BETA, (drop, passed.mean())
        assert lost <= seq.FUTILITY_BETA, (drop, lost)


def _policy(alpha: float, margin: float) -> Policy:
    return Policy(alpha=alpha, correction="holm", margin=0.0, resamples=500,
                  rules=[Rule(task="*", metric="*", margin=margin)])


def _look_policy(k: int, t: np.ndarray, margin: float) -> Policy:
    """The policy ``gate --sequential`` compares look ``k`` with (gate._sequential_looks)."""
    return replace(_policy(float(seq.look_levels(t, ALPHA)[k - 1]), margin), exact_mcnemar=k < len(t),
                   look=(k, tuple(float(x) for x in t), ALPHA))


def _binary(rng: np.random.Generator, n: int, drop: float, flip: float) -> tuple[np.ndarray, np.ndarray]:
    base = (rng.random(n) < 0.7).astype(float)
    u = rng.random(n)
    cand = np.where(base == 1, (u >= (flip / 2 + drop) / 0.7).astype(float), (u < (flip / 2) / 0.3).astype(float))
    return base, cand


def _continuous(rng: np.random.Generator, n: int, drop: float, flip: float) -> tuple[np.ndarray, np.ndarray]:
    base = rng.beta(4, 2, n)
    return base, np.clip(base - drop + rng.normal(0, flip, n), 0, 1)


def _perplexity(rng: np.random.Generator, n: int, drop: float, flip: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-item (loglikelihood, word count) pairs: weighted perplexity about e^2; the candidate's
    loglikelihoods move by noise (``flip`` nats per word) and ``drop`` nats per word worse."""
    words = rng.integers(20, 60, n).astype(float)
    base_ll = -words * rng.gamma(8, 0.25, n)
    cand_ll = base_ll + words * (rng.normal(0, flip, n) - drop)
    return np.column_stack([base_ll, words]), np.column_stack([cand_ll, words])


def _series(task: str, values: np.ndarray):
    if values.ndim == 2:  # (loglikelihood, words): a perplexity, lower is better
        return fast_series(task, values, kind="ratio", aggregation="weighted_perplexity", higher_is_better=False)
    return fast_series(task, values)


def _trial(rng, make, m: int, n: int, drop: float, flip: float, margin: float,
           looks: int = 4) -> tuple[str, str, float, int]:
    """(fixed verdict, sequential decision, share of items used, the look it stopped at); one task
    per metric, the drop in task t0 only. A task whose metrics are futile stops; its items so far
    stay in the family."""
    pairs = [make(rng, n, drop if j == 0 else 0.0, flip) for j in range(m)]
    base = run(*[_series(f"t{j}", b) for j, (b, _) in enumerate(pairs)])
    cand = run(*[_series(f"t{j}", c) for j, (_, c) in enumerate(pairs)])
    fixed = compare_runs(base, cand, _policy(ALPHA, margin)).verdict
    order = rng.permutation(n)
    t = seq.fractions(looks)
    used = {f"t{j}": 0 for j in range(m)}
    for k in range(1, looks + 1):
        for task in used:
            if used[task] >= 0:  # still running: this look's items are evaluated
                used[task] = round(n * t[k - 1])
        take = {task: np.sort(order[:abs(u)]) for task, u in used.items()}
        out = compare_runs(run(*[_series(f"t{j}", b[take[f"t{j}"]]) for j, (b, _) in enumerate(pairs)]),
                           run(*[_series(f"t{j}", c[take[f"t{j}"]]) for j, (_, c) in enumerate(pairs)]),
                           _look_policy(k, t, margin))
        d = seq.decide(out, k, t, ALPHA)
        if d.decision != "continue":
            return fixed, d.decision, sum(abs(u) for u in used.values()) / (n * m), k
        for task in d.done_tasks:
            used[task] = -abs(used[task])  # stopped: negative marks it, the count stays
    raise AssertionError("the last look always decides")


def _trials(seed: int, trials: int, make, m: int, drop: float, flip: float, margin: float,
            n: int = 1000) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per trial: (the fixed design failed, the sequential gate failed, share of items used, an
    interim look passed it)."""
    rng = np.random.default_rng(seed)
    res = [_trial(rng, make, m, n, drop, flip, margin) for _ in range(trials)]
    return (np.array([r[0] == "fail" for r in res]), np.array([r[1] == "fail" for r in res]),
            np.array([r[2] for r in res]), np.array([r[1] == "pass" and r[3] < 4 for r in res]))


def _rates(seed: int, trials: int, make, m: int, drop: float, flip: float, margin: float,
           n: int) -> tuple[float, float, float]:
    fixed, sequential, items, _ = _trials(seed, trials, make, m, drop, flip, margin, n)
    return float(fixed.mean()), float(sequential.mean()), float(items.mean())


@pytest.mark.parametrize("make, m, n, margin, share", [(_binary, 1, 2000, 0.02, 0.60), (_binary, 10, 2000, 0.02, 0.60),
                                                       (_continuous, 1, 1000, 0.01, 0.60),
                                                       (_perplexity, 1, 1000, 0.05, 0.60),
                                                       (_binary, 1, 1000, 0.01, 0.97)])
def test_harmless_changes_stop_early_without_more_false_alarms(make, m: int, n: int, margin: float,
                                                                share: float) -> None:
    """The share of items evaluated is the price of the futility bound's guarantee (at most 0.5
    points of power at twice the margin): at margin 0.02 over 2,000 right/wrong items a harmless
    change stops after 37% of them (measured, 300 runs), over 1,000 items at margin 0.01 after 85%."""
    trials = 300 if m == 1 else 40
    flip = {_binary: 0.03, _continuous: 0.05, _perplexity: 0.02}[make]
    fixed, sequential, items = _rates(16 + m + n, trials, make, m, 0.0, flip, margin, n)
    se = np.sqrt(ALPHA * (1 - ALPHA) / trials)
    assert sequential <= ALPHA + 3 * se, (fixed, sequential)
    assert items <= share, items  # the mean share of items evaluated


@pytest.mark.parametrize("drop", [0.02, 0.03])
def test_power_stays_within_two_points_of_the_fixed_design(drop: float) -> None:
    fixed, sequential, items, passed = _trials(1600 + round(drop * 100), 300, _binary, 1, drop, 0.03, 0.01)
    # Both designs see the same items, so the Monte-Carlo error is that of the paired difference.
    gap = fixed.astype(float) - sequential.astype(float)
    se = gap.std(ddof=1) / np.sqrt(gap.size)
    # Measured (600 runs each, two seeds): 2 points 0.880 and 0.912 vs 0.868 and 0.892; the final
    # look's level is 0.0427, not 0.05, which costs most of that. The futility rule before
    # (conditional power under the current trend, 0.003) cost 1.9 points by itself.
    assert gap.mean() <= 0.02 + 2 * se, (fixed.mean(), sequential.mean(), se)
    # A regression stops early only once it is *shown* beyond the margin (issue #26): near twice
    # the margin that takes most of the items (measured: 94% at a 2-point drop, margin 0.01).
    assert items.mean() < 0.97, items.mean()
    # Regressions the fixed gate catches and an early pass loses: at most FUTILITY_BETA in normal
    # theory (the test above). Measured here over 1,200 runs at a 2-point drop: none; early passes
    # of any kind 0-0.17%.
    lost = float((passed & fixed).mean())
    assert lost <= seq.FUTILITY_BETA + 2 * np.sqrt(seq.FUTILITY_BETA * (1 - seq.FUTILITY_BETA) / passed.size), lost


def test_the_suite_key_turns_it_on_is_checked_and_not_hashed(tmp_path) -> None:
    from pathlib import Path

    from gatekeeper.errors import GateError
    from gatekeeper.suite.suite import load_suite

    root = Path(__file__).resolve().parents[1] / "examples"
    text = (root / "gatekeeper.yaml").read_text().replace("include_path: tasks\n", "")
    plain = tmp_path / "plain.yaml"
    plain.write_text(text)
    on = tmp_path / "on.yaml"
    on.write_text(text.replace("  test: superiority", "  sequential: {looks: 3}\n  test: superiority"))
    assert load_suite(on).policy.sequential_looks == 3 and load_suite(plain).policy.sequential_looks is None
    assert load_suite(on).hash == load_suite(plain).hash  # how results are judged, not what is measured
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("  test: superiority", "  sequential: {looks: 1}\n  test: superiority"))
    with pytest.raises(GateError, match=r"bad.yaml:\d+: policy.sequential.looks"):
        load_suite(bad)


def _margin_trials(seed: int, trials: int, n: int, drop: float, margin: float) -> tuple[float, float, float]:
    rng = np.random.default_rng(seed)
    res = [_trial(rng, _binary, 1, n, drop, 0.03, margin) for _ in range(trials)]
    fixed = np.array([r[0] == "fail" for r in res], dtype=float)
    sequential = np.array([r[1] == "fail" for r in res], dtype=float)
    gap = sequential - fixed
    return float(fixed.mean()), float(sequential.mean()), float(gap.std(ddof=1) / np.sqrt(trials))


@pytest.mark.parametrize(("n", "margin", "drop"), [(2000, 0.02, 0.0), (2000, 0.02, 0.01), (2000, 0.02, 0.015),
                                                   (2000, 0.02, 0.02), (1000, 0.01, 0.0), (1000, 0.01, 0.005),
                                                   (1000, 0.01, 0.01)])
def test_drops_within_the_margin_fail_no_more_often_than_under_the_fixed_gate(n: int, margin: float,
                                                                               drop: float) -> None:
    """Issue #26: an interim look fails only on a drop shown beyond the margin at its level. Before
    (the point estimate beyond the margin was enough): 24.5% vs 10.0% at drop 0.015, margin 0.02."""
    fixed, sequential, se = _margin_trials(2600 + round(drop * 1000), 200, n, drop, margin)
    assert sequential <= fixed + 0.01 + 2 * se, (fixed, sequential, se)


def _drift_trial(rng: np.random.Generator, n: int, since_anchor: float, since_baseline: float, margin: float,
                 looks: int = 4) -> tuple[str, str]:
    """(fixed verdict, sequential decision) for a candidate within ``margin`` of the baseline but
    ``since_anchor`` worse than the anchor (the baseline was promoted in between)."""
    anchor = (rng.random(n) < 0.7).astype(float)
    u = rng.random(n)
    base = np.where((anchor == 1) & (u < (since_anchor - since_baseline) / 0.7), 0.0, anchor)
    v = rng.random(n)
    cand = np.where((base == 1) & (v < since_baseline / base.mean()), 0.0, base)
    runs = [run(_series("t0", x)) for x in (anchor, base, cand)]
    fixed = compare_runs(runs[1], runs[2], _policy(ALPHA, margin), anchor=runs[0]).verdict
    order = rng.permutation(n)
    t = seq.fractions(looks)
    for k in range(1, looks + 1):
        take = np.sort(order[:round(n * t[k - 1])])
        a, b, c = (run(_series("t0", x[take])) for x in (anchor, base, cand))
        out = compare_runs(b, c, _look_policy(k, t, margin), anchor=a)
        d = seq.decide(out, k, t, ALPHA)
        if d.decision != "continue":
            return fixed, d.decision
    raise AssertionError("the last look always decides")


def test_a_drift_since_the_anchor_is_not_passed_early() -> None:
    """Issue #26: futility looks at the anchor comparisons too. A candidate 0.005 below its
    baseline (margin 0.05) but 0.15 below the anchor drifted: the fixed gate says so every time,
    and the sequential gate must not stop at look 1 on the baseline comparison alone."""
    rng = np.random.default_rng(2605)
    res = [_drift_trial(rng, 1000, 0.15, 0.005, 0.05) for _ in range(40)]
    fixed = sum(f == "drift" for f, _ in res)
    sequential = sum(s == "fail" for _, s in res)
    assert fixed == 40 and sequential >= fixed - 1, (fixed, sequential)


@pytest.mark.parametrize(("m", "looks"), [(10, 4), (20, 5)])
def test_the_suite_wide_false_alarm_rate_stays_at_alpha_over_looks_and_metrics(m: int, looks: int) -> None:
    """Issue #26: m independent continuous metrics, no change, normal theory (each metric's
    statistic a Brownian path over the looks), 200,000 runs. Holm with each rank on its own
    O'Brien-Fleming boundary (``share_level`` on Holm's graph, what the gate uses) keeps the suite at alpha;
    dividing the look's level by m (the gate before) did not: 0.0535 at m = 10, 4 looks."""
    rng = np.random.default_rng(2600 + m)
    t = seq.fractions(looks)
    runs = 200_000
    steps = rng.normal(size=(runs, m, looks)) * np.sqrt(np.diff(np.concatenate([[0.0], t])))
    z = np.cumsum(steps, axis=2) / np.sqrt(t)  # each look's standardized statistic
    p = norm.sf(z)
    first = np.array([seq.look_levels(t, ALPHA / m)[k] for k in range(looks)])  # Holm's first rank
    divided = seq.look_levels(t, ALPHA) / m
    exact = float((p < first).any(axis=(1, 2)).mean())  # a false alarm = the first rank rejected at some look
    before = float((p < divided).any(axis=(1, 2)).mean())
    se = np.sqrt(ALPHA * (1 - ALPHA) / runs)
    assert exact <= ALPHA + 2 * se, exact
    assert before > ALPHA + 2 * se, before  # the old split was over alpha
    # The gate's function gives exactly these levels: the smallest p at the first rank's boundary.
    levels = graph_levels(np.linspace(1e-6, 0.5, m), Graph.holm(m), ALPHA, seq.share_level(t, 1))
    assert levels[0] == pytest.approx(first[0], rel=1e-12)


def test_a_looks_warnings_and_mde_are_the_whole_suites() -> None:
    """Issue #26: 16 items of a 400-item task at look 1 resolve nothing (MDE 0.85 on the sample),
    but the suite resolves a 3-point drop: the look's report must not warn that only a collapse
    fails, and its MDE is the whole suite's, the fixed gate's."""
    rng = np.random.default_rng(1)
    base, cand = _binary(rng, 400, 0.0, 0.03)
    t = seq.fractions(4)
    take = np.sort(rng.permutation(400)[:16])
    sample = (run(_series("t0", base[take])), run(_series("t0", cand[take])))
    policy = _look_policy(1, t, 0.02)
    alone = compare_runs(*sample, policy)
    assert any("only a collapse fails" in w for w in alone.warnings) and alone.comparisons[0].mde > 0.5
    look = compare_runs(*sample, replace(policy, look_sizes={"t0": 400}))
    fixed = compare_runs(run(_series("t0", base)), run(_series("t0", cand)), _policy(ALPHA, 0.02))
    assert look.warnings == fixed.warnings == []
    assert look.comparisons[0].mde == pytest.approx(fixed.comparisons[0].mde, rel=0.15)
    assert look.comparisons[0].test.n == 16  # the values and the test stay the sample's


def _slide(rng: np.random.Generator, n: int, nights: int, step: float) -> list[np.ndarray]:
    """Nightly right/wrong items of a model that loses ``step`` of accuracy every night (items
    go right to wrong), with 2% harmless flips either way each night."""
    models = [(rng.random(n) < 0.7).astype(float)]
    for _ in range(nights):
        last = models[-1]
        u = rng.random(n)
        lose = (last == 1) & (u < step / last.mean())
        noise = rng.random(n) < 0.02
        models.append(np.where(lose, 0.0, np.where(noise, 1.0 - last, last)))
    return models


def _night_flagged(models: list[np.ndarray], margin: float, sequential: bool, rng: np.random.Generator,
                   looks: int = 4) -> int | None:
    """The first night the gate flags (fail or drift), promoting every green night; None: never."""
    anchor, baseline = models[0], models[0]
    t = seq.fractions(looks)
    for night, cand in enumerate(models[1:], start=1):
        runs = [run(_series("t0", x)) for x in (anchor, baseline, cand)]
        if not sequential:
            flagged = compare_runs(runs[1], runs[2], _policy(ALPHA, margin), anchor=runs[0]).verdict != "pass"
        else:
            order = rng.permutation(cand.size)
            for k in range(1, looks + 1):
                take = np.sort(order[:round(cand.size * t[k - 1])])
                a, b, c = (run(_series("t0", x[take])) for x in (anchor, baseline, cand))
                d = seq.decide(compare_runs(b, c, _look_policy(k, t, margin), anchor=a), k, t, ALPHA)
                if d.decision != "continue":
                    break
            flagged = d.decision == "fail"
        if flagged:
            return night
        baseline = cand  # green: promoted
    return None


def test_a_slow_nightly_slide_is_caught_as_early_under_the_sequential_gate() -> None:
    """Issue #26: nights of -0.025 each (margin 0.05), promoted when green. Before (futility on the
    baseline comparison only): by night 5 the fixed gate flagged 98-100% of the sliding models, the
    sequential gate 75-76%, and 3.6-5.1% were never flagged in 8 nights. With the alternative at twice
    the margin, 24 of these 40 sequences were flagged a night late; now none is (measured)."""
    rng = np.random.default_rng(2627)
    fixed, sequential = [], []
    for _ in range(40):
        models = _slide(rng, 1000, 8, 0.025)
        fixed.append(_night_flagged(models, 0.05, False, rng))
        sequential.append(_night_flagged(models, 0.05, True, rng))
    by5 = [sum(1 for x in res if x is not None and x <= 5) for res in (fixed, sequential)]
    assert by5[1] >= by5[0] - 2, (fixed, sequential)
    assert None not in sequential and None not in fixed, (fixed, sequential)
    late = sum(1 for f, s in zip(fixed, sequential, strict=True) if s > f)
    assert late <= 4, (fixed, sequential)  # the same night in nearly every sequence


def test_a_row_that_starts_with_no_share_is_not_futile_by_default() -> None:
    """Issue #56: under the group design a subtask with too few flips among a look's items starts
    with no share of alpha (Tarone). Its futility bound was then infinite, so it was always
    "futile" and its task stopped at look 1, before the rest of its items could flip: a drop there
    was never read. It is now judged at the smallest share held, as its MDE is."""
    from gatekeeper.model import SeriesKey
    from tests.synthetic import as_group

    def acc(task: str, values: np.ndarray):
        return replace(_series(task, values), key=SeriesKey(task, "none", "acc"))

    rng = np.random.default_rng(5660)
    t = seq.fractions(4)
    big_b, big_c = _binary(rng, 2000, 0.0, 0.04)
    small = (rng.random(120) < 0.7).astype(float)  # look 1 of a task whose items have not flipped yet
    runs = [as_group(run(acc("big", b), acc("small", s)), "g") for b, s in ((big_b, small), (big_c, small))]
    out = compare_runs(*runs, _look_policy(1, t, 0.02))
    row = next(c for c in out.comparisons if c.key.task == "small")
    assert row.share == 0 and row.test.counts[1] + row.test.counts[2] == 0
    d = seq.decide(out, 1, t, ALPHA)
    assert not d.futile[str(row.key)] and "small" not in d.done_tasks, d
