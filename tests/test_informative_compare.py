"""An informative read through the gate's comparison (issue #57): the items a design read carry
what they stand for (``results/informative.weigh``), and ``compare_runs`` tests such a row with the
weighted flips' exact test of the whole task, proven by fixed-seed simulation against the fixed
gate (every item, ``compare_runs`` as today) on the same data. benchmarks/informative_items.py
measures the test itself with more simulations."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from benchmarks import informative_items as bench
from gatekeeper.compare.compare import _min_p, compare_runs
from gatekeeper.compare.sequential import futile_units, informative_alphas
from gatekeeper.compare.stats.weighted import (
    MIN_FLIPS,
    WEIGHTED_MIDP,
    WEIGHTED_TEST,
    informed_share,
    weighted_flip_test,
)
from gatekeeper.errors import GateError
from gatekeeper.model import RunResults
from gatekeeper.results import informative, subset
from gatekeeper.suite.policy import Policy, Rule
from tests.synthetic import as_group, run, series

ALPHA = 0.05
N = 1000
FLIPS = 0.05


def _runs(base: np.ndarray, cand: np.ndarray, task: str = "t") -> tuple[RunResults, RunResults]:
    return run(series(task, "acc", base), name="base"), run(series(task, "acc", cand), name="cand")


def _read(base_run: RunResults, cand_run: RunResults, designs: dict[str, informative.Design],
          scale: float) -> tuple[RunResults, RunResults]:
    """The pair as an informative gate compares it: both cut to the items the designs read at
    ``scale``, the candidate's weighed."""
    docs = {task: np.flatnonzero(d.read(scale)) for task, d in designs.items()}
    return subset.restrict(base_run, docs), informative.weigh(subset.restrict(cand_run, docs), designs, scale)


def _design(sim: int, n: int = N, task: str = "t") -> informative.Design:
    # margins in rank order (the simulation's items are sorted by |margin|); uniforms drawn anew per simulation
    return informative.design(task, np.arange(n, dtype=float), seed=sim)


@pytest.mark.parametrize("exact", [False, True])
def test_a_read_row_is_the_weighted_flips_test_of_the_whole_task(exact: bool) -> None:
    """Mid-p by default, as the fixed gate's McNemar test; exact with policy.exact_mcnemar."""
    rng = np.random.default_rng(5740)
    base, cand = bench.draw(rng, bench.propensity(N, FLIPS, "curve"), FLIPS, 0.03)
    design = _design(1)
    b, c = _read(*_runs(base, cand), {"t": design}, 1.0)
    outcome = compare_runs(b, c, Policy(alpha=ALPHA, exact_mcnemar=exact))
    (row,) = outcome.comparisons
    read = design.read(1.0)
    weights = design.weights(np.flatnonzero(read), 1.0)
    direct = weighted_flip_test(base[read], cand[read], weights, N, True, 1 - ALPHA, exact=exact)
    assert row.test.test == (WEIGHTED_TEST if exact else WEIGHTED_MIDP) and row.test.n == N
    assert (row.test.p_worse, row.test.delta, row.test.se) == pytest.approx((direct.p_worse, direct.delta, direct.se))
    assert row.test.baseline == pytest.approx(np.sum(weights * base[read]) / N)  # the whole task's estimate
    assert row.p_value == pytest.approx(direct.p_worse)
    # its interval at any level is Wald's on the estimate, the one the decision used
    z = 1.959963984540054
    assert row.test.interval_at(0.95) == pytest.approx((direct.delta - z * direct.se, direct.delta + z * direct.se))
    assert math.isfinite(row.mde) and row.mde > 0
    # the smallest p it can reach, given its read flips (Tarone's admission): every one the worse way
    flips_read = int(np.count_nonzero(base[read] != cand[read]))
    assert row.test.flips_read == flips_read and _min_p(row.test) == 0.5 ** flips_read * (1 if exact else 0.5)
    assert weighted_flip_test(np.ones(flips_read), np.zeros(flips_read), weights[base[read] != cand[read]], N, True,
                              0.9, exact=exact).p_worse == pytest.approx(_min_p(row.test))
    assert row.verdict == "regressed" and outcome.verdict == "fail"
    assert any(f"an informative read: {int(read.sum()):,} of {N:,} items" in note for note in outcome.notes)
    # every item read, each standing for itself: the ordinary test, as before
    whole = compare_runs(*_runs(base, cand), Policy(alpha=ALPHA))
    b_all, c_all = _read(*_runs(base, cand), {"t": informative.Design("t", np.ones(N), design.u)}, 1.0)
    assert compare_runs(b_all, c_all, Policy(alpha=ALPHA)).comparisons[0].test == whole.comparisons[0].test


def _simulate(shape: str, drop: float, sims: int, seed: int, scale: float | None = None) -> tuple[float, float, float]:
    """(the informative gate's failure rate, the fixed gate's on the same pairs, the share of items
    read): the stage the gate stops at (until informed, shown futile, or failed early; or the
    design at ``scale``), one test there at the alpha the stages leave; margin 0.01."""
    rng = np.random.default_rng(seed)
    q = bench.propensity(N, FLIPS, shape)
    policy = Policy(alpha=ALPHA, margin=0.01)
    final = replace(policy, alpha=informative_alphas(ALPHA, len(informative.SCALES))[1])
    informed = fixed = read = 0.0
    for sim in range(sims):
        pair = _runs(*bench.draw(rng, q, FLIPS, drop))
        design = _design(seed * 1000 + sim)
        b, c = pair[0].series[next(iter(pair[0].series))].values, pair[1].series[next(iter(pair[1].series))].values
        at, early = (scale, False) if scale else bench.read_stage(np.asarray(b), np.asarray(c), design)
        informed += early or compare_runs(*_read(*pair, {"t": design}, at), final).verdict == "fail"
        fixed += compare_runs(*pair, policy).verdict == "fail"
        read += float(design.read(at).mean())
    return informed / sims, fixed / sims, read / sims


def _allowance(rate: float, sims: int) -> float:
    return 2.5 * math.sqrt(rate * (1 - rate) / sims)


@pytest.mark.parametrize(("shape", "scale"), [("curve", None), ("confident", None), ("confident", 1.0)])
def test_harmless_changes_fail_an_informative_gate_at_most_alpha(shape: str, scale: float | None) -> None:
    """Along the measured curve, and with every flip among the items the baseline was surest of:
    read until informed (which then reads every item) and, forced, at the design's first stage
    (27% of the items, each flip read standing for 16). The false-alarm rate holds whatever flips
    (measured, 300 simulations each: 0.053 reading 33%, the fixed gate 0.050; 0.060 reading 95%,
    0.060; 0.007 at the first stage)."""
    informed, fixed, read = _simulate(shape, 0.0, 300, seed=5741 + len(shape), scale=scale)
    print(f"{shape}: informative {informed:.3f} reading {read:.0%}, fixed {fixed:.3f}")
    assert informed <= ALPHA + _allowance(ALPHA, 300), (informed, fixed)


def test_a_real_drop_is_caught_about_as_often_as_reading_every_item() -> None:
    """A 2-point drop at margin 0.01 along the measured curve (seed 5743, 200 simulations: 87.5%
    reading 38% of the items, the fixed gate 89.5%); flips spread evenly read every item and keep
    the power (87.5% against 88.0%)."""
    informed, fixed, read = _simulate("curve", 0.02, 200, seed=5743)
    print(f"2-point drop: informative {informed:.3f} reading {read:.0%}, fixed {fixed:.3f}")
    assert read <= 0.44 and informed >= fixed - 0.03, (informed, fixed, read)
    informed, fixed, read = _simulate("uniform", 0.02, 200, seed=5747)
    print(f"2-point drop, flips spread evenly: informative {informed:.3f} reading {read:.0%}, fixed {fixed:.3f}")
    assert read >= 0.95 and informed >= fixed - 0.03, (informed, fixed, read)


def test_what_cannot_be_weighted_exactly_is_an_error_naming_it() -> None:
    rng = np.random.default_rng(5744)
    design = _design(2, 200)
    base, cand = rng.random(200), rng.random(200)  # not right/wrong
    with pytest.raises(GateError, match=r"t/acc,none: an informative read of \d+ of its 200 items cannot be weighted "
                                        r"exactly: its values are not right/wrong \(mean\)"):
        compare_runs(*_read(*_runs(base, cand), {"t": design}, 1.0), Policy(alpha=ALPHA))
    flips = (rng.random(200) < 0.7).astype(float)
    b, c = _runs(flips, 1 - flips)
    clustered = run(series("t", "acc", flips, clusters=np.arange(200) // 4), name="base")
    with pytest.raises(GateError, match="its items are clustered"):
        compare_runs(*_read(clustered, c, {"t": design}, 1.0), Policy(alpha=ALPHA))
    with pytest.raises(GateError, match=r"policy test inferiority reads items uniformly: gate with --items uniform"):
        compare_runs(*_read(b, c, {"t": design}, 1.0), Policy(alpha=ALPHA, test="inferiority"))
    # the run must hold exactly the design's items at that scale: more, fewer, or another task
    docs = np.flatnonzero(design.read(1.0))
    with pytest.raises(GateError, match=r"holds document \d+, which the informative design does not read at scale 1"):
        informative.weigh(subset.restrict(c, {"t": np.append(docs, np.flatnonzero(~design.read(1.0))[0])}), {"t": design}, 1.0)
    with pytest.raises(GateError, match=r"lacks document \d+, which the informative design reads at scale 1"):
        informative.weigh(subset.restrict(c, {"t": docs[1:]}), {"t": design}, 1.0)
    with pytest.raises(GateError, match="task t has no informative design"):
        informative.weigh(c, {"other": design}, 1.0)


def test_a_size_weighted_group_is_tested_on_its_subtasks_read_items() -> None:
    rng = np.random.default_rng(5745)
    sizes = {"s1": 300, "s2": 500}
    base_parts, cand_parts, designs = [], [], {}
    for i, (task, n) in enumerate(sizes.items()):
        b, c = bench.draw(rng, bench.propensity(n, FLIPS, "curve"), FLIPS, 0.04)
        base_parts.append(series(task, "acc", b))
        cand_parts.append(series(task, "acc", c))
        designs[task] = _design(10 + i, n, task)
    base_run, cand_run = run(*base_parts, name="base"), run(*cand_parts, name="cand")
    b, c = _read(as_group(base_run, "g"), as_group(cand_run, "g"), designs, 1.0)
    outcome = compare_runs(b, c, Policy(alpha=ALPHA))
    group = next(r for r in outcome.comparisons if r.key.task == "g")
    assert group.test.test == WEIGHTED_MIDP and group.test.n == sum(sizes.values())
    rows = {r.key.task: r for r in outcome.comparisons}
    # the group's estimate is its subtasks' estimates, weighted by their sizes
    assert group.test.delta == pytest.approx(sum(rows[t].test.delta * n for t, n in sizes.items()) / sum(sizes.values()))
    b, c = _read(as_group(base_run, "g", weighted=False), as_group(cand_run, "g", weighted=False), designs, 1.0)
    with pytest.raises(GateError, match="group g: an informative read of its subtasks cannot be weighted exactly"):
        compare_runs(b, c, Policy(alpha=ALPHA))


def test_rules_still_apply_to_a_read_row() -> None:
    base, cand = bench.draw(np.random.default_rng(5746), bench.propensity(N, FLIPS, "curve"), FLIPS, 0.03)
    b, c = _read(*_runs(base, cand), {"t": _design(3)}, 1.0)
    outcome = compare_runs(b, c, Policy(alpha=ALPHA, rules=[Rule(metric="acc", gate=False)]))
    assert not outcome.comparisons[0].gated and outcome.verdict == "pass"


def test_plan_expects_the_share_an_informative_gate_reads() -> None:
    """``plan`` prints what ``gate --items informative`` is expected to read on a harmless change:
    on 1,000 items at 5% flips along the curve, the stage rule's share (38%), at most what the
    gate's rule reads with its early passes (measured: 33%) plus a few points; on a baseline
    without margins the task is read uniformly, and the stage rule reads every item."""
    from gatekeeper.compare.plan import plan

    rng = np.random.default_rng(5748)
    base = (rng.random(N) < 0.7).astype(float)
    baseline = run(series("t", "acc", base), name="base")
    with_margins = replace(baseline, choice_margins={"t": (np.arange(N), np.arange(N, dtype=float))})
    p = plan(with_margins, Policy(alpha=ALPHA, margin=0.01), suite="s", flip_rate=FLIPS, looks=4, design_seed=7)
    _, _, read = _simulate("curve", 0.0, 100, seed=5749)
    print(f"plan {p.informative_share:.3f}, the gate's simulation {read:.3f}")
    assert read <= p.informative_share < read + 0.06 and p.informative_whole == {}, (p.informative_share, read)
    bare = plan(baseline, Policy(alpha=ALPHA, margin=0.01), suite="s", flip_rate=FLIPS, looks=4)
    # no margins: read uniformly; with flips anywhere the stage rule reads every item (an early pass may stop sooner)
    assert bare.informative_share == 1.0 and bare.informative_whole == {}


def test_flips_only_in_one_subjects_surest_items_keep_the_suites_level() -> None:
    """The adversarial pattern for a group: ten subjects of 200 items read by their designs at the
    first stage (27%), every harmless flip in one subject's quarter the baseline was surest of
    (each read one standing for 16); the suite (group row and subjects, one family) fails at most
    alpha of the time."""
    rng = np.random.default_rng(5750)
    sims, n, subjects = 300, 200, 10
    alarms = 0
    for sim in range(sims):
        base_parts, cand_parts, designs = [], [], {}
        for i in range(subjects):
            task = f"s{i}"
            b = (rng.random(n) < 0.7).astype(float)
            c = b.copy()
            if i == 0:  # 20 flips among the surest quarter (ranks 150..199), a coin each way
                flips = rng.choice(np.arange(150, 200), 20, replace=False)
                c[flips] = 1 - b[flips]
            base_parts.append(series(task, "acc", b))
            cand_parts.append(series(task, "acc", c))
            designs[task] = _design(sim * subjects + i, n, task)
        pair = as_group(run(*base_parts, name="base"), "g"), as_group(run(*cand_parts, name="cand"), "g")
        alarms += compare_runs(*_read(*pair, designs, 1.0), Policy(alpha=ALPHA)).verdict == "fail"
    print(f"one subject's surest items: {alarms / sims:.3f}")
    assert alarms / sims <= ALPHA + _allowance(ALPHA, sims), alarms


def test_a_size_weighted_groups_subtasks_choose_their_stage_together() -> None:
    """stage_units: the outermost size-weighted group's subtasks form one unit (its subgroups'
    inside it), a task of no such group is its own, a task read whole is in none."""
    rng = np.random.default_rng(5751)
    parts = [series(t, "acc", (rng.random(100) < 0.7).astype(float)) for t in ("a", "b", "c", "d", "e")]
    r = run(*parts, name="base")
    manifest = {"groups": {
        "top": {"leaves": ["a", "b", "c"], "aggregate": [{"metric": "acc", "filter_list": ["none"],
                                                          "weight_by_size": True, "aggregation": "mean"}]},
        "sub": {"leaves": ["a", "b"], "aggregate": [{"metric": "acc", "filter_list": ["none"],
                                                     "weight_by_size": True, "aggregation": "mean"}]}}}
    r = replace(r, group_subtasks={"top": ["sub", "c"], "sub": ["a", "b"]},
                provenance=replace(r.provenance, manifest=manifest),
                choice_margins={t: (np.arange(100), np.arange(100, dtype=float)) for t in ("a", "b", "c", "d")})
    designs, whole = informative.designs_for(r, 3)
    assert whole == {} and designs["e"].uniform and not designs["d"].uniform  # e: no margins, read uniformly
    assert informative.stage_units(r, designs, whole) == [("a", "b", "c"), ("d",), ("e",)]
    joined = informative.joined(designs, ("a", "b", "c"))
    assert joined.pi.size == 300 and np.array_equal(joined.u[100:200], designs["b"].u)


def test_a_stage_passes_early_only_where_no_drop_is_to_be_found() -> None:
    """``sequential.futile_units`` on a stage's comparison (what gate.py asks before reading on):
    harmless pairs with flips spread evenly (the stage rule alone would read every item) pass
    early at some stage in many simulations (17 of these 40), and where one does its row is no regression at that
    stage (a pass only removes failures); a 4-point drop never passes early; a unit with no
    fraction (fewer than 20 read flips) is not judged."""
    rng = np.random.default_rng(5760)
    policy = Policy(alpha=ALPHA, margin=0.01)
    passed = 0
    for sim in range(40):
        base, cand = bench.draw(rng, bench.propensity(N, FLIPS, "uniform"), FLIPS, 0.0)
        design = _design(100 + sim)
        for scale in informative.SCALES[:-1]:
            outcome = compare_runs(*_read(*_runs(base, cand), {"t": design}, scale), policy)
            changed = np.flatnonzero(design.read(scale) & (base != cand))
            if changed.size < MIN_FLIPS:
                continue
            t = informed_share(design.weights(changed, scale))
            if futile_units(outcome, {("t",): t}, ALPHA, len(informative.SCALES)):
                assert outcome.comparisons[0].verdict != "regressed"
                passed += 1
                break
    assert passed >= 12, passed
    base, cand = bench.draw(rng, bench.propensity(N, FLIPS, "uniform"), FLIPS, 0.04)
    for scale in informative.SCALES[:-1]:
        outcome = compare_runs(*_read(*_runs(base, cand), {"t": _design(7)}, scale), policy)
        assert futile_units(outcome, {("t",): 0.5}, ALPHA, len(informative.SCALES)) == [], scale
    assert futile_units(outcome, {}, ALPHA, len(informative.SCALES)) == []


def test_a_baseline_with_nothing_to_read_in_part_is_an_error_naming_why(tmp_path: Path) -> None:
    """Only right/wrong items without clusters can be read in part: a baseline of none is exit 2
    naming the first task and why (a right/wrong task without margins is read uniformly)."""
    from gatekeeper.gate import _informative_designs
    from gatekeeper.suite.suite import load_suite

    rng = np.random.default_rng(5761)
    continuous = run(series("ppl", "bits_per_byte", rng.random(50)), name="base")
    suite = load_suite(Path(__file__).resolve().parents[1] / "examples" / "gatekeeper.yaml")
    with pytest.raises(GateError, match=r"base.json.gz: no task can be read informatively \(task ppl: bits_per_byte "
                                        r"is not right/wrong\); only right/wrong items without clusters can be read "
                                        r"in part and weighted exactly: gate with --items uniform"):
        _informative_designs(suite, continuous, tmp_path / "base.json.gz", Policy(alpha=ALPHA))
    designs, whole = _informative_designs(suite, run(series("t", "acc", (rng.random(50) < 0.5).astype(float)),
                                                     name="base"), tmp_path / "base.json.gz", Policy(alpha=ALPHA))
    assert whole == {} and designs["t"].uniform and designs["t"].expected_share() == informative.UNIFORM_SHARE


def test_tarones_corner_holds_alpha_for_weighted_mid_p_rows_too() -> None:
    """Issue #56's corner (47 subjects of 100 items with 14 flips, 10 with 2), each subject read
    informatively but every read item standing for itself: the weighted mid-p test given 14
    flips of weight 1 is McNemar's mid-p, and the suite's discreteness bound counts it as such
    (its exact size given the read flips), so the design runs at the same scale, under 1, and
    the bound is alpha. Counted as a continuous test, as the exact weighted test may be, the
    bound would exceed alpha."""
    from dataclasses import replace as with_

    from benchmarks.tarone_corner import corner_pair
    from gatekeeper.compare.stats.mcnemar import size_at
    from gatekeeper.model import Sample

    base, cand = corner_pair(np.random.default_rng(5614), 14)
    fixed = compare_runs(base, cand, Policy(alpha=ALPHA))
    # each subject stands for 16 more items than it read (read at 1/16, none drawn): weighted rows
    weighed = with_(cand, series={k: with_(s, sample=Sample(np.ones(s.n), s.n + 16)) for k, s in cand.series.items()})
    out = compare_runs(base, weighed, Policy(alpha=ALPHA))
    rows = [c for c in out.comparisons if c.gated]
    assert all(c.test.test == WEIGHTED_MIDP for c in rows)
    assert out.alpha_scale == pytest.approx(fixed.alpha_scale) and out.alpha_scale < 1
    bound = sum(size_at(c.test.null_table, out.alpha_scale * ALPHA * c.share) for c in rows)
    naive = sum(size_at(c.test.null_table, ALPHA * c.share) for c in rows)
    assert bound <= ALPHA < naive, (bound, naive)


def test_the_stages_spend_a_small_share_of_alpha_on_early_failures() -> None:
    """Each stage before the last may fail the gate on a drop shown beyond its margin at its share
    of alpha, and the one comparison at the end tests at the rest: the shares add up to alpha
    (Bonferroni over the stages, whatever stage the flips choose), the final one 99.5% of it."""
    stage, final = informative_alphas(ALPHA, len(informative.SCALES))
    assert (len(informative.SCALES) - 1) * stage + final == pytest.approx(ALPHA)
    assert final == pytest.approx(0.995 * ALPHA) and stage == pytest.approx(ALPHA * 0.005 / 4)
