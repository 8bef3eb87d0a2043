"""The multiplicity design (compare/family.py, issue #37), proven by fixed-seed simulation through
the real comparison (``compare_runs``) on an MMLU-sized group: MMLU's 57 subject sizes (14,042
items), 4% of the items flipping between two harmless runs, against the fixed gate of one flat
Holm family on the same data (``group_share: 0``, the gate before; its verdict from the same raw
p-values). benchmarks/alpha_design.py runs the same scenarios with 2,000 simulations each.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from gatekeeper.compare import family
from gatekeeper.compare.compare import compare_runs
from gatekeeper.compare.stats import Graph, adjust_pvalues, graph_adjusted, graph_levels
from gatekeeper.model import SeriesKey
from gatekeeper.suite.policy import Policy
from tests.synthetic import MMLU_SIZES, group_pair, run, series

ALPHA = 0.05
N = len(MMLU_SIZES)


def _se(rate: float, n: int) -> float:
    return math.sqrt(rate * (1 - rate) / n)


def _both(seed: int, drops: np.ndarray, sims: int) -> tuple[float, float, float]:
    """(the design's catch rate, the flat Holm family's, the group row's own rejection rate)."""
    rng = np.random.default_rng(seed)
    design = flat = group = 0
    for _ in range(sims):
        out = compare_runs(*group_pair(rng, drops), Policy(alpha=ALPHA))
        raw = np.array([c.p_value for c in out.comparisons if c.gated])
        design += out.verdict == "fail"
        flat += bool((adjust_pvalues(raw, "holm") < ALPHA).any())
        group += next(c for c in out.comparisons if c.key.task == "mmlu").verdict == "regressed"
    return design / sims, flat / sims, group / sims


def test_a_diffuse_half_point_loss_is_caught_four_times_in_five() -> None:
    design, flat, _ = _both(3701, np.full(N, 0.005), 100)
    print(f"diffuse -0.5: design {design:.2f}, flat Holm {flat:.2f}")
    assert design >= 0.80 - 2 * _se(0.8, 100), (design, flat)
    assert flat <= 0.5 and design - flat >= 0.25, (design, flat)


def test_one_subject_eight_points_worse_keeps_most_of_its_power() -> None:
    drops = np.where(np.array(MMLU_SIZES) == 265, 0.08, 0.0)
    design, flat, _ = _both(3702, drops, 100)
    print(f"one 265-item subject -8: design {design:.2f}, flat Holm {flat:.2f}")
    assert design >= 0.75 - 2 * _se(0.75, 100), (design, flat)
    assert design >= flat - 0.05, (design, flat)  # Tarone: subjects that cannot reach a share give it up


def test_harmless_changes_keep_the_suite_and_the_group_row_at_alpha() -> None:
    design, flat, group = _both(3703, np.zeros(N), 150)
    print(f"harmless: design {design:.3f}, flat {flat:.3f}, group row {group:.3f}")
    assert design <= ALPHA + 2 * _se(ALPHA, 150) and group <= ALPHA / 2 + 2 * _se(ALPHA / 2, 150)


def test_a_one_point_loss_is_still_caught_every_time() -> None:
    design, _, _ = _both(3704, np.full(N, 0.01), 30)
    assert design == 1.0


def test_the_design_is_holm_without_groups_and_passes_a_group_rows_share_to_its_members() -> None:
    rows = [family.Row(SeriesKey("g", "none", "acc"), 0, ("a", "b")), family.Row(SeriesKey("a", "none", "acc")),
            family.Row(SeriesKey("b", "none", "acc")), family.Row(SeriesKey("c", "none", "acc"))]
    parents = {"a": ("g",), "b": ("g",)}
    d = family.design(rows, lambda t: parents.get(t, ()))
    assert d.graph.weights.tolist() == pytest.approx([0.5, 1 / 6, 1 / 6, 1 / 6])
    assert d.graph.transitions[0].tolist() == pytest.approx([0, 0.5, 0.5, 0])  # to its members only
    assert d.graph.transitions[3].tolist() == pytest.approx([0.5 / (5 / 6), 1 / 6 / (5 / 6), 1 / 6 / (5 / 6), 0])
    # the group row rejects at alpha/2; its members then hold alpha/6 + alpha/4 each
    p = np.array([0.02, 0.02, 0.5, 0.5])
    levels = graph_levels(p, d.graph, ALPHA)
    assert levels[0] == pytest.approx(0.025) and levels[1] == pytest.approx(ALPHA / 6 + ALPHA / 4)
    assert (graph_adjusted(p, d.graph) < ALPHA).tolist() == [True, True, False, False]
    # with no group row, and with group_share 0, it is exactly Holm
    flat = family.design(rows[1:], lambda t: ())
    assert np.allclose(flat.graph.weights, Graph.holm(3).weights) and flat.top_groups == 0
    q = np.random.default_rng(0).random(4) ** 3
    assert np.allclose(graph_adjusted(q, family.design(rows, lambda t: parents.get(t, ()), 0.0).graph),
                       adjust_pvalues(q, "holm"))


def test_nested_groups_pass_alpha_down_level_by_level() -> None:
    rows = [family.Row(SeriesKey("mmlu", "none", "acc"), 0, ("x1", "x2")),
            family.Row(SeriesKey("stem", "none", "acc"), 0, ("x1", "x2")),
            family.Row(SeriesKey("x1", "none", "acc")), family.Row(SeriesKey("x2", "none", "acc"))]
    parents = {"stem": ("mmlu",), "x1": ("stem", "mmlu"), "x2": ("stem", "mmlu")}
    d = family.design(rows, lambda t: parents.get(t, ()))
    assert d.parent == (None, 0, 1, 1) and d.top_groups == 1
    assert d.graph.transitions[0].tolist() == [0, 1, 0, 0] and d.graph.transitions[1].tolist() == [0, 0, 0.5, 0.5]


def test_the_suite_may_set_the_share_and_the_report_says_how_alpha_was_shared() -> None:
    rng = np.random.default_rng(3705)
    base, cand = group_pair(rng, np.full(N, 0.005))
    out = compare_runs(base, cand, Policy(alpha=ALPHA, group_share=0.8))
    row = next(c for c in out.comparisons if c.key.task == "mmlu")
    assert row.share == pytest.approx(0.8)
    assert "1 group row at 0.8 of alpha, the other 57 gated rows share the rest" in out.design
    # the p shown is the adjusted p under that design: p / share at the first step
    assert row.p_adjusted == pytest.approx(min(1.0, row.p_value / 0.8))
    plain = compare_runs(run(series("t", "acc", [1.0, 0.0] * 50)), run(series("t", "acc", [1.0, 0.0] * 50)), Policy())
    assert plain.design == "holm correction over 1 gated metrics"


# ----------------------------------------------------------------------------- Tarone with mid-p (#56)


def _size(test, level: float) -> float:
    """The conditional size, given the row's flips, of the row's McNemar test at ``level``."""
    from gatekeeper.compare.stats.mcnemar import rejection_table, size_at

    flips = test.counts[1] + test.counts[2]
    return size_at(rejection_table(flips, test.test == "mcnemar-exact"), level) if flips else 0.0


def _corner_bound(flips: int, *, before: bool) -> float:
    """The suite's false-alarm bound on a harmless change, exact given the flips: the sum over
    gated rows of each test's conditional size at the share it starts with (the procedure's
    first rejection is at those shares, so this bounds the chance of any)."""
    from unittest import mock

    from benchmarks.tarone_corner import corner_pair
    from gatekeeper.compare import compare

    pair = corner_pair(np.random.default_rng(5600 + flips), flips)
    if before:
        with mock.patch.object(compare, "_discreteness_scale", lambda *a: 1.0):
            out = compare_runs(*pair, Policy(alpha=ALPHA))
    else:
        out = compare_runs(*pair, Policy(alpha=ALPHA))
    return sum(_size(c.test, out.alpha_scale * ALPHA * c.share) for c in out.comparisons if c.gated)


@pytest.mark.parametrize("flips", [14, 10])
def test_tarone_with_mid_p_holds_alpha_given_the_flips_in_its_worst_corner(flips: int) -> None:
    """47 subjects of 100 items with exactly ``flips`` flips and 10 with 2: Tarone admits the 47
    at shares mid-p's smallest value just reaches, where mid-p rejects up to twice as often
    (before: 6.4% of harmless suites failed at 14 flips). The design now runs at the share of
    alpha that brings the bound (exact, given the flips) back to alpha."""
    before, after = _corner_bound(flips, before=True), _corner_bound(flips, before=False)
    print(f"{flips} flips: false-alarm bound {before:.4f} before, {after:.4f} after")
    assert after <= ALPHA < before


def test_the_corner_by_simulation_through_the_gate() -> None:
    """The same corner (14 flips) by fixed-seed simulation of the gate's verdicts: at most alpha
    within Monte Carlo error (benchmarks/tarone_corner.py runs 1,800 and the other scenarios)."""
    from benchmarks.tarone_corner import corner_pair

    rng = np.random.default_rng(5611)
    sims = 100
    failed = sum(compare_runs(*corner_pair(rng, 14), Policy(alpha=ALPHA)).verdict == "fail" for _ in range(sims))
    assert failed / sims <= ALPHA + 2 * _se(ALPHA, sims), failed


def test_plan_gives_each_row_the_share_the_gate_tests_it_at() -> None:
    """Issue #56: plan built the design without the flips' minimum p (no Tarone step), so every
    subject sat at alpha·share/57 in plan while the gate tested the admitted subjects at
    alpha·share/K. Planned against the candidate itself (the flips measured), plan's level is the
    gate's starting share for every row, and so is the MDE the gate prints (plan's)."""
    from gatekeeper.compare.plan import plan

    base, cand = group_pair(np.random.default_rng(5620), np.zeros(N))
    gate = {c.key: c for c in compare_runs(base, cand, Policy(alpha=ALPHA)).comparisons if c.gated}
    planned = plan(base, Policy(alpha=ALPHA), suite="mmlu", against=cand, simulate=False)
    held = min(c.share for c in gate.values() if c.share > 0)
    admitted = [c for c in gate.values() if 0 < c.share < 0.5 and not c.key.task == "mmlu"]
    assert 0 < len(admitted) < N, "the corner the test needs: Tarone admits some subjects, not all"
    for row in planned.rows:
        share = gate[row.key].share or held  # a row that starts with none: at the smallest share held
        assert row.level == pytest.approx(ALPHA * share), row.key


def test_the_conditional_size_is_the_binomial_tail_the_test_rejects_from() -> None:
    """mcnemar's rejection table against a brute-force count: the probability, under H0 given the
    flips, that the test's p-value is at most the level (the corner: 14 flips at 5.3e-4)."""
    from scipy.stats import binom

    from gatekeeper.compare.stats.mcnemar import exact_one_sided, midp_one_sided, rejection_table, size_at

    for n in (1, 2, 10, 14, 60):
        levels = [1e-5, 5.3e-4, 0.003, 0.0125, 0.05, 0.3]
        for exact, one_sided in ((False, midp_one_sided), (True, exact_one_sided)):
            brute = [sum(binom.pmf(k, n, 0.5) for k in range(n + 1) if one_sided(k, n) <= a) for a in levels]
            got = [size_at(rejection_table(n, exact), a) for a in levels]
            assert got == pytest.approx(brute, abs=1e-12), (n, exact)
    assert size_at(rejection_table(14), 0.025 / 47) == pytest.approx(15 / 2**14)  # the corner's excess
