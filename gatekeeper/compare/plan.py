"""``gatekeeper plan``: what a suite can resolve, before a GPU hour is paid for (issue #16).

Per gated metric, from the baseline's own items: n, the margin, the MDE (the smallest true drop
the gate's rule flags with 80% power, at the level the suite's correction leaves it), the items
needed for 80% power against a drop of twice the margin, and the share of the items a
sequential gate is expected to evaluate on a harmless change. A margin the suite cannot resolve
(MDE above twice the margin) is said.

How much a harmless change moves the items is not in one run:

- right/wrong items (McNemar): the share of items that flip either way between two checkpoints
  (``flip_rate``), measured on a second run of the same items when there is one (``against``:
  the anchor, a stored earlier baseline, or a run the user names), else assumed (5%, said so);
  the MDE is the exact one of ``stats.mcnemar.mde``.
- other metrics: the paired test's own spread on that second run (``verdict.mde``, the figure
  the gate's report shows); without a second run there is nothing to measure it on, and the row
  says so instead of guessing.

The sequential figures are simulated (normal approximation of the looks' statistics, seeded):
the looks' levels and the futility rule of ``compare/sequential.py``: the share of items evaluated
on a harmless change, and the power at the fixed design's MDE (the fixed gate's is 80% there).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.special import ndtri

from gatekeeper.compare import family, sequential
from gatekeeper.compare.compare import compare_runs
from gatekeeper.compare.outcome import REGRESSED, Comparison, Outcome
from gatekeeper.compare.stats.mcnemar import mde as mcnemar_mde
from gatekeeper.compare.stats.weighted import until_informed
from gatekeeper.compare.verdict import mde as rule_mde
from gatekeeper.model import MetricSeries, RunResults, SeriesKey
from gatekeeper.results import groups, informative
from gatekeeper.suite.policy import Policy

ASSUMED_FLIP_RATE = 0.05
POWER = 0.8
MAX_ITEMS = 10_000_000


@dataclass(frozen=True)
class PlanRow:
    """One gated metric's figures (NaN where they cannot be known; ``note`` says why)."""

    key: SeriesKey
    n: int
    margin: float
    level: float  # the one-sided level the design starts this row at (its share of alpha: compare/family.py)
    test: str  # "mcnemar" or the paired test that measured the spread
    flip_rate: float | None  # right/wrong items: the harmless flip share used
    spread_from: str  # "measured" (a second run) or "assumed"
    mde: float
    items_needed: float  # for 80% power against a drop of 2 x margin
    sequential_share: float  # expected share of items a sequential gate evaluates, harmless change
    resolves: bool | None  # MDE <= 2 x margin; None: not known (no spread to measure)
    note: str = ""
    group: bool = False  # an lm-eval group's aggregate over all its subtasks' items
    sequential_power: float = math.nan  # a sequential gate's chance of failing a drop of ``mde`` (the fixed: 80%)
    smallest_margin: float = math.nan  # the least margin these items resolve (``smallest_margin``)


@dataclass(frozen=True)
class Plan:
    """``plan``'s result: the rows, the looks the sequential figures assume, what was paired."""

    suite: str
    rows: list[PlanRow]
    looks: int
    alpha: float
    against: str | None  # the second run the spreads were measured on, None: assumed
    sequential_share: float  # item-weighted over the suite's tasks (a task stops with its last metric)
    # Why ``against`` does not look like a harmless pair (it regressed against the baseline), "" if it does.
    against_problem: str = ""
    # ``gate --items informative`` on a harmless change: the expected share of the suite's items read
    # when flips follow the assumed propensity curve (NaN: the baseline kept no margins), and the
    # tasks read whole (why).
    informative_share: float = math.nan
    informative_whole: dict[str, str] = field(default_factory=dict)


def plan(baseline: RunResults, policy: Policy, *, suite: str, against: RunResults | None = None,
         against_name: str | None = None, flip_rate: float | None = None,
         looks: int = sequential.DEFAULT_LOOKS, seed: int = 0, simulate: bool = True, design_seed: int = 0) -> Plan:
    """The plan of ``baseline``'s gated metrics under ``policy`` (see the module docstring).
    ``flip_rate`` overrides the measured or assumed flip share of right/wrong items. Every group
    with an aggregate is a row too, over all its subtasks' items (``results/groups.py``).
    ``simulate=False``: no sequential figures and no items needed (NaN), only the resolution (what
    a gate and the dry run print; the looks' boundaries cost about 0.2 s per distinct level).
    ``design_seed``: the suite's random seed, which draws an informative gate's items."""
    metrics, _ = groups.group_metrics(baseline)
    group_keys = {gm.key for gm in metrics}

    def lookup(k: SeriesKey) -> tuple[float, bool]:
        return policy.lookup(k, baseline.parents(k.task), group=k in group_keys)

    pooled = _with_groups(baseline, metrics)
    gated = [k for k in sorted(pooled.series, key=str) if lookup(k)[1]]
    leaves = {gm.key: gm.leaves for gm in metrics}
    paired, problem = _paired(pooled, _with_groups(against, metrics), policy, gated) if against is not None else ({}, "")
    # The gate's own design: Tarone's admission from each right/wrong row's expected flips, so a
    # row's MDE is at the share the gate tests it at (a row that starts with none: at the smallest
    # share held, as the gate shows it).
    min_p = [_expected_min_p(pooled.series[k], paired.get(k), flip_rate) if policy.test == "superiority" else 0.0
             for k in gated]
    design = family.design([family.Row(k, 0, leaves.get(k, ())) for k in gated], baseline.parents,
                           policy.group_share, "none" if policy.test == "non-inferiority" else policy.correction,
                           min_p, policy.alpha)
    if policy.correction in ("holm", "bonferroni") and policy.test != "non-inferiority":
        weights = design.graph.weights
        floor = float(weights[weights > 0].min()) if (weights > 0).any() else 1.0
        levels = [policy.alpha * (w if w > 0 else floor) for w in weights]
    else:
        levels = [policy.alpha / max(1, len(gated)) if policy.correction != "none" else policy.alpha] * len(gated)
    rng = np.random.default_rng(seed)
    rows = [replace(_row(pooled, k, lookup(k)[0], level, paired.get(k), flip_rate, looks if simulate else 0, rng,
                         _leaf_sizes(baseline, leaves.get(k), k)), group=k in group_keys)
            for k, level in zip(gated, levels, strict=True)]
    share, whole = _informative_share(baseline, rows, design_seed, seed) if simulate else (math.nan, {})
    return Plan(suite, rows, looks, policy.alpha, against_name if against is not None else None,
                _suite_share(rows), problem, share, whole)


INFORMATIVE_SIMS = 200


def _informative_share(baseline: RunResults, rows: list[PlanRow], design_seed: int, seed: int
                       ) -> tuple[float, dict[str, str]]:
    """The expected share of the suite's items ``gate --items informative`` reads on a harmless
    change (``weighted.until_informed`` on each stage unit's design, as the gate decides: a
    size-weighted group's subtasks together; the flips drawn along the assumed propensity curve at
    each row's flip share), and the tasks it reads whole. The stage rule's share: an early pass
    (``sequential.futile_units``) reads less, so the gate reads at most this (1,000 items at 5%
    flips: 38% here, 33% through the gate's rule, tests/test_informative_compare.py). NaN where no
    task can be read informatively."""
    designs, whole = informative.designs_for(baseline, design_seed)
    if len(whole) == len(designs):
        return math.nan, whole
    rates: dict[str, float] = {}
    for r in rows:
        if r.flip_rate is not None and not r.group:
            rates[r.key.task] = max(rates.get(r.key.task, 0.0), r.flip_rate)
    rng = np.random.default_rng([seed, 57])
    read = float(sum(designs[t].pi.size for t in whole))
    for unit in informative.stage_units(baseline, designs, whole):
        parts = []
        for task in unit:  # each task's flip chances along the curve at its flip share
            ranks = informative.margin_ranks(baseline, task, designs[task].pi.size)
            q = np.ones(designs[task].pi.size) if ranks is None else np.exp(-ranks / informative.PROPENSITY_DECAY)
            parts.append(np.minimum(1.0, q * rates.get(task, ASSUMED_FLIP_RATE) / q.mean()))
        q = np.concatenate(parts)
        d = informative.joined(designs, unit)
        flips = rng.random((INFORMATIVE_SIMS, q.size)) < q
        read += float(np.mean([d.read(informative.SCALES[until_informed(f, d)]).sum() for f in flips]))
    return read / sum(d.pi.size for d in designs.values()), whole


def _expected_min_p(s: MetricSeries, paired: Comparison | None, flip_rate: float | None) -> float:
    """The smallest p-value a right/wrong row's McNemar test is expected to reach: 0.5^(flips+1)
    at the flip share ``_row`` uses (given, measured on a second run, else assumed); 0 for any
    other test (what ``compare._min_p`` gives the gate's rows)."""
    if not (s.kind == "mean" and s.clusters is None and _is_binary(s.values)):
        return 0.0
    rate, _ = _flip_share(s.n, paired, flip_rate)
    return 0.5 ** (int(round(rate * s.n)) + 1)


def _flip_share(n: int, paired: Comparison | None, flip_rate: float | None) -> tuple[float, str]:
    """The share of right/wrong items flipping between harmless runs, and where it came from."""
    if flip_rate is not None:
        rate, source = flip_rate, "given"
    elif paired is not None and paired.test.counts is not None:
        c = paired.test.counts
        rate, source = (c[1] + c[2]) / max(1, paired.test.n), "measured"
    else:
        rate, source = ASSUMED_FLIP_RATE, "assumed"
    if rate < 1.0 / n:  # no flip seen: at least one item's worth, not a perfect copy
        rate, source = 1.0 / n, ("none flipped: one item assumed" if source == "measured" else source)
    return rate, source


def _leaf_sizes(run: RunResults, leaves: tuple[str, ...] | None, key: SeriesKey) -> list[int] | None:
    """A group's subtask sizes, when each subtask's items are right/wrong (its spread then follows
    from the same flip model as theirs); None otherwise."""
    if not leaves:
        return None
    series = [run.series.get(SeriesKey(t, key.filter, key.metric)) for t in leaves]
    if any(s is None or s.kind != "mean" or s.clusters is not None or not _is_binary(s.values) for s in series):
        return None
    return [s.n for s in series]


def _with_groups(run: RunResults, metrics: list[groups.GroupMetric]) -> RunResults:
    """``run`` with each group metric as one more series (its pooled items), and no group
    structure left for ``compare_runs`` to add them again."""
    series = dict(run.series)
    for gm in metrics:
        if all(k in run.series for k in gm.leaf_keys):
            series[gm.key] = groups.pooled(run, gm)
    manifest = {k: v for k, v in (run.provenance.manifest or {}).items() if k != "groups"}
    return replace(run, series=series, groups={}, group_subtasks={},
                   provenance=replace(run.provenance, manifest=manifest))


def _paired(baseline: RunResults, other: RunResults, policy: Policy,
            keys: list[SeriesKey]) -> tuple[dict[SeriesKey, Comparison], str]:
    """The gate's own comparison of the baseline with a second run of its items (its spreads), and
    why that run does not look like a harmless change ("" when it does): a run that regressed
    against the baseline moves the items more than a harmless change does, and every spread
    measured on it overstates the MDE."""
    common = {k: baseline.series[k] for k in keys if k in other.series}
    out = compare_runs(replace(baseline, series=common), replace(other, series={k: other.series[k] for k in common}),
                       policy)
    bad = [c for c in out.comparisons if c.gated and c.verdict == "regressed"]
    problem = ""
    if bad:
        worst = ", ".join(f"{c.key.task} {c.key.metric} {c.test.delta:+.4g}" for c in bad[:3])
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        problem = (f"it regressed against the baseline ({worst}{more}): not a harmless pair, so the spreads "
                   "measured on it overstate the MDE; plan against a run of the baseline's own checkpoint "
                   "(another seed, batch size or machine)")
    return {c.key: c for c in out.comparisons}, problem


def _is_binary(values: np.ndarray) -> bool:
    try:
        v = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    return v.ndim == 1 and bool(np.all((v == 0) | (v == 1)))


def _row(baseline: RunResults, key: SeriesKey, margin: float, level: float, paired: Comparison | None,
         flip_rate: float | None, looks: int, rng: np.random.Generator,
         leaf_sizes: list[int] | None = None) -> PlanRow:
    s = baseline.series[key]
    n = s.n
    binary = s.kind == "mean" and s.clusters is None and _is_binary(s.values)
    if leaf_sizes and not binary and (paired is None or paired.test.counts is None):
        # An unweighted group of right/wrong subtasks: the mean of T subtask means moves like the
        # mean of n_eff = T^2 / sum(1 / n_t) right/wrong items under the same flip model.
        n = max(1, int(round(len(leaf_sizes) ** 2 / sum(1.0 / x for x in leaf_sizes))))
        binary = True
    if binary:
        rate, source = _flip_share(n, paired, flip_rate)

        def mde_of(size: float, margin: float) -> float:
            return mcnemar_mde(int(size), rate, margin, level, POWER)

        se_full = math.sqrt(rate / n)
        test, note = "mcnemar", ""
    elif paired is not None and paired.test.se > 0:
        t = paired.test
        rate, source, test, note = None, "measured", t.test, ""

        def mde_of(size: float, margin: float) -> float:
            f = math.sqrt(n / size)
            scaled = replace(t, n=int(size), se=t.se * f, se_null=t.se_null * f)
            return rule_mde(scaled, margin, level, s.aggregation, False, False)

        se_full = t.se
    else:
        why = ("no second run of these items to measure the spread on (pass --against RUN_DIR, or keep an anchor)"
               if paired is None else "the second run changed no item: no spread to measure")
        return PlanRow(key, n, margin, level, s.kind, None, "none", math.nan, math.nan, math.nan, None, why)

    def mde_at(size: float) -> float:
        return mde_of(size, margin)

    mde = mde_at(n)
    resolves = math.isfinite(mde) and (margin <= 0 or mde <= 2 * margin)
    # the smallest margin is said where a row does not resolve (and in plan's own table)
    smallest = smallest_margin(lambda m: mde_of(n, m)) if looks or not resolves else math.nan
    needed = _items_for(mde_at, 2 * margin, n) * (s.n / n) if margin > 0 and looks else math.nan  # in real items
    share, power = math.nan, math.nan
    if looks:  # 0: no sequential figures asked for
        share, _ = _sequential_sim(se_full, n, margin, 0.0, looks, level, rng)
        # A true drop d of right/wrong items adds d flips per item: the spread at the MDE is wider.
        se_mde = math.sqrt((rate + mde) / n) if binary and math.isfinite(mde) else se_full
        power = _sequential_sim(se_mde, n, margin, mde, looks, level, rng)[1] if math.isfinite(mde) else math.nan
    if not resolves:
        note = (f"the margin {margin:g} is below what {s.n} items resolve: a drop must reach {mde:.3g} "
                f"to be caught 4 times in 5; the smallest margin {s.n:,} items can gate is about {smallest:.2g}")
    return PlanRow(key, s.n, margin, level, test, rate, source, mde, needed, share, resolves, note,
                   sequential_power=power, smallest_margin=smallest)


def smallest_margin(mde_with: Callable[[float], float]) -> float:
    """The smallest margin the items resolve: the least ``m`` whose MDE is at most ``2 m`` (what
    ``resolves`` means: a drop of twice the margin is caught 4 times in 5). Bisection; the MDE
    grows with the margin more slowly than ``2 m`` does. inf when no margin up to 1e6 resolves."""
    if not math.isfinite(mde_with(0.0)):
        return math.inf
    lo, hi = 0.0, max(mde_with(0.0), 1e-12)
    while not mde_with(hi) <= 2 * hi:
        lo, hi = hi, hi * 2
        if hi > 1e6:
            return math.inf
    while hi - lo > 1e-3 * hi:  # printed to 2 or 3 figures, and called "about" that
        mid = (lo + hi) / 2
        if mde_with(mid) <= 2 * mid:
            hi = mid
        else:
            lo = mid
    return hi


def _items_for(mde_at, target: float, n: int) -> float:
    """The fewest items whose MDE is at most ``target`` (bisection on a log scale)."""
    lo, hi = 2.0, float(max(n, 16))
    while mde_at(hi) > target:
        lo, hi = hi, hi * 4
        if hi > MAX_ITEMS:
            return math.inf
    while hi / lo > 1.02:
        mid = math.sqrt(lo * hi)
        if mde_at(mid) <= target:
            hi = mid
        else:
            lo = mid
    return float(math.ceil(hi))


def _sequential_sim(se: float, n: int, margin: float, drop: float, looks: int, share: float,
                    rng: np.random.Generator, sims: int = 4000) -> tuple[float, float]:
    """(expected share of items, chance of failing) of a sequential gate when the true drop is
    ``drop``: the drop estimate after each look is a Brownian path with spread ``se`` at the end;
    an interim look fails when the drop is shown beyond the margin at its level (the boundary of
    the row's starting share of alpha, ``share``), stops with no regression where ``sequential.futile``
    says so, and the last look applies the fixed rule. Same paths for every call with one seed."""
    t = sequential.fractions(looks)
    levels = sequential.look_levels(t, share)
    steps = rng.normal(size=(sims, looks)) * np.sqrt(np.diff(np.concatenate([[0.0], t])))
    paths = np.cumsum(steps, axis=1)  # B(t) with var t; the estimate at t is drop + se * B(t) / t
    used, failed = np.ones(sims), np.zeros(sims, dtype=bool)
    live = np.ones(sims, dtype=bool)
    for k in range(looks):
        se_k = se / math.sqrt(t[k])
        est = drop + se * paths[:, k] / t[k]
        z = -ndtri(levels[k])
        if k == looks - 1:
            failed |= live & (est > z * se_k) & (est > margin)
            break
        fail = est - z * se_k > margin
        futile = sequential.futile(est, np.full(sims, se_k), np.full(sims, n * t[k]), np.full(sims, margin),
                                   float(t[k]), looks, float(levels[-1]))
        stop = live & (fail | futile)
        used[stop] = t[k]
        failed |= live & fail
        live &= ~stop
    return float(used.mean()), float(failed.mean())


def _suite_share(rows: list[PlanRow]) -> float:
    """Item-weighted share over tasks: a task stops when its last gated metric does."""
    tasks: dict[str, tuple[int, float]] = {}
    for r in rows:
        if math.isfinite(r.sequential_share) and not r.group:  # a group's items are its subtasks
            n, share = tasks.get(r.key.task, (r.n, 0.0))
            tasks[r.key.task] = (max(n, r.n), max(share, r.sequential_share))
    total = sum(n for n, _ in tasks.values())
    return sum(n * s for n, s in tasks.values()) / total if total else math.nan


@dataclass(frozen=True)
class MutantRow:
    """How the gate judged one variant of the checkpoint (``plan --mutants``)."""

    name: str
    defect: bool  # a defect the gate should fail; else a harmless variant it should pass
    what: str
    verdict: str  # the gate's verdict, or "error" (the variant could not be evaluated)
    exit_code: int
    items: float | None  # share of the items evaluated (a sequential gate stops early)
    look: int | None  # the look it stopped at (sequential)
    worst: str  # the gated comparison that moved most, e.g. "demo_capitals_mc acc -0.4300"
    error: str | None = None
    # Measured once on every item of the suite, whatever mode is graded: some gated drop beyond
    # its margin. How a variant was made says what it should do to a model; this says what it did
    # to the suite: 1% weight noise that changes one item in 225 is nothing a gate should fail.
    # Never the items a sequential gate chose to read: a gate that stops early would grade itself.
    beyond_margin: bool | None = None
    # Within one standard error of a margin on every item: the label could go either way, so the
    # rates leave it out and the summary lists it.
    borderline: str = ""  # e.g. "demo_capitals_mc acc -0.0222 against a margin of 0.02"
    items_needed: str = ""  # the items a gated row beyond its margin needs to be caught 80% of the time

    @property
    def flagged(self) -> bool:
        return self.exit_code == 1

    @property
    def counted(self) -> bool:
        return self.error is None and not self.borderline

    @property
    def should_fail(self) -> bool:
        """The gate should fail it: its measured effect is beyond a margin (else, before it was
        measured, how it was made)."""
        return self.defect if self.beyond_margin is None else self.beyond_margin

    @property
    def right(self) -> bool:
        """The gate did what it should: failed a variant that moved a gated metric beyond its
        margin, passed one that did not."""
        return self.flagged == self.should_fail and self.error is None


CATCH_BAR = 0.8  # of the defects a suite should catch, with no false alarm (the project's bar)


@dataclass(frozen=True)
class MutantsPlan:
    suite: str
    model: str
    sequential: bool
    rows: list[MutantRow]
    items: str = "uniform"  # "informative": ``gate --items informative`` was graded (not the sequential gate)

    @property
    def due(self) -> list[MutantRow]:
        """The counted variants whose effect on every item is beyond a margin."""
        return [r for r in self.rows if r.should_fail and r.counted]

    @property
    def within(self) -> list[MutantRow]:
        """The counted variants that moved no gated metric beyond its margin."""
        return [r for r in self.rows if not r.should_fail and r.counted]

    @property
    def caught(self) -> int:
        return sum(r.flagged for r in self.due)

    @property
    def catch_rate(self) -> float:
        """Flagged among the variants whose measured effect is beyond a margin."""
        return self.caught / len(self.due) if self.due else math.nan

    @property
    def false_alarm_rate(self) -> float:
        """Flagged among the variants that moved no gated metric beyond its margin."""
        return sum(r.flagged for r in self.within) / len(self.within) if self.within else math.nan

    @property
    def meets_bar(self) -> bool:
        return bool(self.due) and self.catch_rate >= CATCH_BAR and not any(r.flagged for r in self.within)


def mutant_label(gated: list[Comparison]) -> tuple[bool, str]:
    """(some gated drop beyond its margin, the borderline comparison or ""): a variant is
    borderline when no drop is beyond its margin by more than one standard error and some drop
    lies within one standard error of it (one item can move it across)."""
    def near(c: Comparison) -> bool:
        return abs(c.drop - c.margin) <= c.test.se

    beyond = [c for c in gated if c.drop > c.margin]
    if any(not near(c) for c in beyond):
        return True, ""
    close = [c for c in gated if near(c) and c.test.se > 0]
    if not close:
        return bool(beyond), ""
    c = min(close, key=lambda c: abs(c.drop - c.margin) / c.test.se)
    return bool(beyond), f"{c.key.task} {c.key.metric} {c.test.delta:+.4f} against a margin of {c.margin:g}"


def items_to_catch(gated: list[Comparison], power: float = 0.8) -> str:
    """How many items the easiest-to-catch drop beyond its margin would need for the gate to catch
    it with ``power`` (the spread shrinks as 1/sqrt(items), at the row's level), e.g.
    "demo_capitals_mc acc: about 1,400 items (has 225)"; "" when no drop is beyond its margin."""
    need = []
    for c in gated:
        if c.drop > c.margin and c.test.se > 0 and c.test.n > 0:
            level = c.level if 0 < c.level < 1 else 0.05 / max(1, len(gated))
            z = float(ndtri(1 - level) + ndtri(power))
            need.append((math.ceil(c.test.n * (z * c.test.se / c.drop) ** 2), c))
    if not need:
        return ""
    n, c = min(need, key=lambda x: x[0])
    return f"{c.key.task} {c.key.metric}: about {n:,} items (has {c.test.n:,})"


def source(p: Plan) -> str:
    """Where ``p``'s harmless spreads come from, in a few words."""
    return (f"the harmless spread measured against {p.against}" if p.against else
            "right/wrong flips assumed at 5%, other spreads need a second run")


SHOWN_UNRESOLVED = 6  # rows named in the gate's one "does not resolve" warning; plan lists them all


def _unresolved(rows: list[PlanRow], p: Plan) -> str:
    """The gate's one warning naming the gated rows whose margin their items do not resolve."""
    def named(r: PlanRow) -> str:
        where = "" if r.key.filter == "none" else f" ({r.key.filter})"
        return (f"{r.key.task} {r.key.metric}{where}: margin {r.margin:g}, MDE {r.mde:.3g}, "
                f"smallest margin about {r.smallest_margin:.3g}")

    many = len(rows) > 1
    spread = f"spread measured against {p.against}" if p.against else "flips assumed at 5%"
    more = len(rows) - SHOWN_UNRESOLVED
    return (f"{len(rows)} gated row{'s' if many else ''} cannot resolve {'their' if many else 'its'} margin (a drop "
            f"of the MDE is caught 4 times in 5; `gatekeeper plan`'s figures, {spread}): "
            + "; ".join(named(r) for r in rows[:SHOWN_UNRESOLVED])
            + (f"; and {more} more (`gatekeeper plan` lists them)" if more > 0 else "")
            + "; add items or widen the margins")


def with_plan(outcome: Outcome, p: Plan) -> Outcome:
    """The gate's MDE and resolution warning from ``plan``'s model (issue #41): one figure per row
    in the gate, ``gatekeeper plan`` and the dry run. The spread measured on the gated pair itself
    depends on the candidate (a regressed one flips more items, so its MDE read larger), and a
    failing gate said nothing; plan's figure is the suite's own, the same whatever is gated. The
    rows whose margin it does not resolve are said in one warning, on a failing gate too. Rows
    plan cannot know (a continuous metric with no second run) keep the pair's figure and warning."""
    if outcome.policy.test != "superiority":
        return outcome  # plan models the default rule; the others keep the gate's own figures
    rows = {r.key: r for r in p.rows if r.resolves is not None}
    said = {line for key, lines in outcome.resolution.items() if key in rows for line in lines}
    comparisons = [replace(c, mde=rows[c.key].mde) if c.gated and c.key in rows else c for c in outcome.comparisons]
    gated = {c.key for c in comparisons if c.gated}
    unresolved = [r for r in p.rows if r.key in gated and r.resolves is False]
    warnings = [w for w in outcome.warnings if w not in said]
    if unresolved:
        warnings.append(_unresolved(unresolved, p))
    regressions = [c for c in comparisons if c.gated and c.verdict == REGRESSED]
    return replace(outcome, comparisons=comparisons, regressions=regressions, warnings=warnings,
                   resolution={k: v for k, v in outcome.resolution.items() if k not in rows})
