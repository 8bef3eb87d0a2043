"""Group-sequential gating: decide after part of the items when the verdict is already known.

The items are evaluated in ``looks`` chunks of a fixed, seeded order. After look k, with
information fraction t_k (items so far / all items), the comparison on the items so far decides:

- **fail early**: a gated metric regressed at the look's nominal one-sided level. The levels
  come from the Lan–DeMets O'Brien–Fleming spending function ``A(t) = 2 − 2Φ(z_{1−α/2} / √t)``
  (``A(1) = α``): look k's critical value ``c_k`` is solved so that, for the statistics of the
  looks (Brownian motion: correlation √(t_i / t_j)), P(no earlier crossing, crossing at k) =
  ``A(t_k) − A(t_{k−1})`` (multivariate normal probabilities), and its nominal level is
  ``1 − Φ(c_k)``. The overall chance of a false alarm is then α, not the union bound's
  less: α = 0.05, 4 looks: nominal 9e-5, 0.0055, 0.0219, 0.0427, so only a clear collapse stops
  at look 1 and the last look is nearly the fixed design. The suite's multiplicity correction
  applies within each look, at that look's nominal level.
- **pass early** (futility): every gated comparison's drop is *shown* smaller than the drop the
  gate is designed to catch, ``δ₁`` = the fixed design's 80%-power MDE at its margin
  (``alternative``): the upper end of its one-sided interval at level ``β / (looks − 1)`` is below
  ``δ₁`` (a non-binding beta-spending bound, Bonferroni over the interim looks,
  ``β = FUTILITY_BETA``). Under a true drop of ``δ₁`` or more the chance that an interim look
  passes early is at most ``β``, so early passes cost at most ``β`` of power there (0.5 points);
  they never add a false alarm. The rule it replaces (conditional power under the current trend)
  read the noisy first look as the true effect and cost 1.9 points of power at twice the margin;
  an alternative of twice the margin passed a slide the fixed gate catches (a drift of 1.3x the
  margin) a night late in 24 of 40 sequences.

Pure functions on numbers and ``Outcome``s: the runner (run/) evaluates the chunks, ``gate.py``
calls these between them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache, partial

import numpy as np
from scipy.special import ndtr, ndtri

from gatekeeper.compare.outcome import Outcome

# scipy.special's ufuncs, not scipy.stats.norm (the same functions underneath): scipy.stats and
# scipy.optimize cost ~1.5 s to import, and a plain compare computes no boundary. The boundary
# solver imports them when it runs.

DEFAULT_LOOKS = 4
FUTILITY_BETA = 0.005  # the most power early passes may cost at the design alternative
# An informative gate's stages (gate --items informative, issue #57) spend up to 2 points there:
# the bound on its power against the fixed gate, measured well inside it
# (benchmarks/informative_items.py), and what lets flips spread evenly stop where a sequential
# gate's looks do (88% of the items).
INFORMATIVE_FUTILITY_BETA = 0.02
# They may also fail early on a drop already shown: the stages before the last spend this share of
# alpha, split evenly (Bonferroni over the stages: valid whatever stage the flips choose to test
# at), and the one comparison at the end tests at the rest. A collapse stops at the first stage;
# the final test loses almost nothing (alpha 0.04975 for 0.05: no power lost in the simulations).
INFORMATIVE_EARLY_SHARE = 0.005


def informative_alphas(alpha: float, stages: int) -> tuple[float, float]:
    """(each stage's alpha before the last, the final comparison's) of an informative gate."""
    early = alpha * INFORMATIVE_EARLY_SHARE
    return early / max(1, stages - 1), alpha - early


def shown_beyond(outcome: Outcome) -> bool:
    """A gated drop (or the anchor's drift) *shown* beyond its margin, the interval's near end
    past it: what fails an interim look or stage, never a point estimate beyond it (early looks
    see few items)."""
    return any(c.drop_bounds[0] > c.margin for c in [*outcome.regressions, *outcome.drifted])
POWER = 0.80  # the power the design alternative's MDE is computed at


def _sf(x: np.ndarray | float) -> np.ndarray:
    """The standard normal's upper tail P(Z > x)."""
    return ndtr(-np.asarray(x, dtype=np.float64))


def _isf(p: np.ndarray | float) -> np.ndarray:
    """x with P(Z > x) = p."""
    return -ndtri(np.asarray(p, dtype=np.float64))


def spent(t: np.ndarray | float, alpha: float) -> np.ndarray:
    """Alpha spent by information fraction ``t`` (Lan–DeMets O'Brien–Fleming, one-sided)."""
    t = np.clip(np.asarray(t, dtype=np.float64), 0.0, 1.0)
    z = _isf(alpha / 2)
    with np.errstate(divide="ignore"):
        out = 2.0 * _sf(z / np.sqrt(t))
    return np.where(t <= 0, 0.0, np.minimum(out, alpha))


def fractions(looks: int) -> np.ndarray:
    """Equal looks: t = 1/L, 2/L, ..., 1."""
    if looks < 1:
        raise ValueError("looks must be at least 1")
    return np.arange(1, looks + 1, dtype=np.float64) / looks


def look_levels(t: np.ndarray, alpha: float) -> np.ndarray:
    """The nominal one-sided level each look tests at (see the module docstring): P(the look's
    p-value < level | no earlier look stopped) spends exactly the spending function's increment."""
    t = np.asarray(t, dtype=np.float64)
    if t.size == 0 or np.any(np.diff(t) <= 0) or t[0] <= 0 or t[-1] != 1.0:
        raise ValueError("information fractions must increase to 1")
    return _sf(boundaries(tuple(t.tolist()), alpha))


def share_level(t: np.ndarray, look: int) -> Callable[[float], float]:
    """The level look ``look`` tests a hypothesis at when it holds ``a`` of alpha: the O'Brien–
    Fleming boundary of ``a`` at that look. A graphical procedure (``stats.graph_levels``) then
    tests each row on its own group-sequential boundary and, after a rejection, the rows that
    received its share on the boundary of their new share (Maurer & Bretz 2013), not the look's
    level for alpha divided among the rows: O'Brien–Fleming's early levels shrink much faster than
    alpha does, so dividing them spends too much at the first looks (10 metrics, 4 looks: 0.0535
    suite-wide). With Holm's graph, the smallest p is tested at the boundary of alpha/m, the next
    at that of alpha/(m-1), ..."""
    fractions = tuple(np.asarray(t, dtype=np.float64).tolist())

    def level(a: float) -> float:
        return float(look_levels(np.asarray(fractions), a)[look - 1])
    return level


@lru_cache(maxsize=1024)
def boundaries(t: tuple[float, ...], alpha: float) -> np.ndarray:
    """Critical values c_k of the standardized statistics at fractions ``t``: each solved so that
    P(no crossing before look k, crossing at k) is the spending function's increment."""
    cum = spent(np.array(t), alpha)
    cum[-1] = alpha
    increments = np.diff(np.concatenate([[0.0], cum]))
    grid = _grid_boundaries(t, increments)
    return grid if grid is not None else _mvn_boundaries(t, increments)


# The recursive integration (Armitage, McPherson & Rowe 1969; Jennison & Turnbull 2000, ch. 19):
# on the score scale S_k = Z_k √t_k the looks are a random walk with independent N(0, t_k − t_{k−1})
# steps, so the density of S_k on the paths that have not crossed yet is the last look's density,
# cut at its boundary, convolved with one step. Simpson's rule on a grid finer than the steps
# makes each level exact to about 1e-8, relative (tests/test_sequential.py checks it against
# a grid ten times finer and against the multivariate normal integration), deterministic, in
# milliseconds: the integration by scipy's randomized quasi-Monte Carlo took 0.5 s of CPU per
# (fractions, alpha), which every sequential gate and each share of alpha of a graphical design
# paid in every process.
_TAIL_SD = 8.5  # the grid starts this many standard deviations of S_k below 0: the rest is < 1e-16
_POINTS_PER_SD = 24  # grid points per standard deviation of the narrowest step that meets the grid
_MAX_INTERVALS = 6000  # a design with far smaller steps than that (looks a few items apart) integrates by mvn


def _grid_boundaries(t: tuple[float, ...], increments: np.ndarray) -> np.ndarray | None:
    """The critical values by recursive integration; None where the steps need a grid too fine."""
    from scipy.optimize import brentq

    steps = np.diff(np.concatenate([[0.0], np.asarray(t, dtype=np.float64)]))
    cs = [float(_isf(increments[0]))]  # inf where nothing is spent (a tiny share at a tiny fraction)
    points, weights = _sub_density(None, None, math.sqrt(t[0]), cs[0] * math.sqrt(t[0]), steps[0], steps[:2])
    for k in range(1, len(t)):
        if points is None:
            return None
        root_t = math.sqrt(t[k])
        excess = partial(_crossing_excess, points=points, weights=weights, root_t=root_t,
                         sd=math.sqrt(steps[k]), inc=float(increments[k]))
        # c = 40 leaves nothing to cross (40 sd of the step above the highest path): below that
        # the crossing probability falls through every increment a double can hold
        cs.append(float(brentq(excess, -2.0, 40.0, xtol=1e-10)) if excess(40.0) < 0 else math.inf)
        if k + 1 < len(t):
            points, weights = _sub_density(points, weights, root_t, cs[k] * root_t, steps[k], steps[k:k + 2])
    return np.array(cs)


def _crossing_excess(c: float, *, points: np.ndarray, weights: np.ndarray, root_t: float, sd: float,
                     inc: float) -> float:
    """P(no crossing before this look, crossing at c) - the increment: decreasing in c."""
    return float(weights @ _sf((c * root_t - points) / sd)) - inc


def _sub_density(points: np.ndarray | None, weights: np.ndarray | None, root_t: float, bound: float,
                 step: float, near: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(grid points, Simpson weights times the density there) of S_k below ``bound`` on the paths
    that never crossed: one step of variance ``step`` from the last look's (``points``,
    ``weights``), or from 0 at the first look (``points`` None). ``near``: the steps that meet this
    grid, which set its spacing. (None, None) where that needs more than _MAX_INTERVALS."""
    low = -_TAIL_SD * root_t
    bound = min(bound, _TAIL_SD * root_t)  # an infinite boundary (nothing spent): the rest is < 1e-16
    h = math.sqrt(float(np.min(near))) / _POINTS_PER_SD
    intervals = 2 * math.ceil((bound - low) / h / 2)
    if intervals > _MAX_INTERVALS:
        return None, None
    grid = np.linspace(low, bound, intervals + 1)
    simpson = np.ones(grid.size)
    simpson[1:-1:2], simpson[2:-1:2] = 4.0, 2.0
    simpson *= (bound - low) / intervals / 3.0
    sd = math.sqrt(step)
    if points is None:
        density = _normal_pdf(grid / sd) / sd
    else:
        density = np.array([weights @ _normal_pdf((x - points) / sd) for x in grid]) / sd
    return grid, simpson * density


def _normal_pdf(x: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def _mvn_boundaries(t: tuple[float, ...], increments: np.ndarray) -> np.ndarray:
    """The critical values by scipy's multivariate normal integration (seeded): for designs whose
    looks lie too close together for the grid."""
    from scipy.optimize import brentq

    cs: list[float] = []
    for k, inc in enumerate(increments):
        if k == 0:
            cs.append(float(_isf(inc)))
            continue
        cov = np.sqrt(np.minimum.outer(t[: k + 1], t[: k + 1]) / np.maximum.outer(t[: k + 1], t[: k + 1]))
        none_before = _below(cs, cov[:k, :k])
        # P(no crossing before k, crossing at k) - increment, decreasing in c
        excess = partial(_excess, cs=tuple(cs), cov=cov, none_before=none_before, inc=float(inc))
        cs.append(float(brentq(excess, -2.0, 12.0, xtol=1e-7)))
    return np.array(cs)


def _excess(c: float, *, cs: tuple[float, ...], cov: np.ndarray, none_before: float, inc: float) -> float:
    return none_before - _below([*cs, c], cov) - inc


def _below(cs: list[float], cov: np.ndarray) -> float:
    """P(Z_1 < c_1, ..., Z_k < c_k); seeded (scipy integrates by randomized quasi-Monte Carlo), so
    every machine computes the same levels."""
    if len(cs) == 1:
        return float(ndtr(cs[0]))
    from scipy.stats import multivariate_normal

    k = len(cs)
    mvn = multivariate_normal(mean=np.zeros(k), cov=cov[:k, :k], seed=0, abseps=1e-7, releps=1e-5,
                              maxpts=20_000 * k)
    return float(mvn.cdf(np.array(cs)))


def alternative(se: np.ndarray, n: np.ndarray, margin: np.ndarray, t: float, level: np.ndarray | float) -> np.ndarray:
    """The drop the gate is designed to catch: the fixed design's MDE at its margin, the drop its
    rule (significant at ``level`` one-sided, and beyond the margin) flags with probability
    ``POWER``: ``max(margin, z_level·σ) + z_power·σ`` with ``σ = se·√t`` the whole suite's spread
    (normal approximation). Never above what the fixed gate itself catches 4 times in 5, so a
    drift or regression the fixed gate sees is not passed early. A look whose items all agree
    (``se`` 0) counts one item's worth of spread (``1/n``)."""
    sigma = _floored(se, n) * math.sqrt(t)
    margin = np.asarray(margin, dtype=np.float64)
    return np.maximum(margin, _isf(level) * sigma) + _isf(1.0 - POWER) * sigma


def futile(drop: np.ndarray, se: np.ndarray, n: np.ndarray, margin: np.ndarray, t: float, looks: int,
           level: np.ndarray | float, beta: float = FUTILITY_BETA) -> np.ndarray:
    """Where the drop seen on the items so far (estimate ``drop``, spread ``se``, ``n`` items at
    fraction ``t``) is shown below the design alternative (``alternative``) at the interim
    level ``beta / (looks − 1)``: then the comparison may stop with no regression. Never at the
    last look, which the fixed rule decides."""
    drop, se, n = (np.asarray(x, dtype=np.float64) for x in (drop, se, n))
    if t >= 1.0 or looks < 2:
        return np.zeros(drop.shape, dtype=bool)
    upper = drop + _isf(beta / (looks - 1)) * _floored(se, n)
    return upper < alternative(se, n, margin, t, level)


def _floored(se: np.ndarray, n: np.ndarray) -> np.ndarray:
    se, n = np.asarray(se, dtype=np.float64), np.asarray(n, dtype=np.float64)
    with np.errstate(divide="ignore"):
        floor = np.where(n > 0, 1.0 / n, np.inf)
    return np.where(np.isfinite(se) & (se > 0), se, floor)


@dataclass(frozen=True)
class LookDecision:
    """What one look decided: ``fail`` (stop, regressed), ``pass`` (stop, every drop shown below
    the one the gate is designed to catch), or ``continue``; with the level it tested at, which
    gated comparisons are futile (by key), and the tasks whose every gated comparison is futile:
    their items stop here while other tasks go on (``done_tasks``)."""

    look: int
    fraction: float
    level: float
    decision: str
    futile: dict[str, bool]
    done_tasks: frozenset[str] = frozenset()


def decide(outcome: Outcome, look: int, t: np.ndarray, alpha: float, beta: float = FUTILITY_BETA) -> LookDecision:
    """The decision after look ``look`` (1-based) of fractions ``t``, from the comparison on the
    items so far (``outcome``, compared at ``look_levels(t, alpha)[look - 1]``)."""
    levels = look_levels(t, alpha)
    frac, level = float(t[look - 1]), float(levels[look - 1])
    # Every gated comparison, the anchor's too: a slow drift within each night's margin must not
    # pass early on the baseline comparison alone.
    gated = [c for c in outcome.comparisons if c.gated] + [c for c in outcome.anchor_comparisons if c.gated]
    if look == len(t):
        return LookDecision(look, frac, level, "fail" if outcome.verdict in ("fail", "drift") else "pass", {})
    # An interim look fails only on a drop shown beyond its margin at the look's level: a drop
    # within the margin must fail no more often than under the fixed gate.
    if shown_beyond(outcome):
        return LookDecision(look, frac, level, "fail", {})
    # Each row's final-look level for the share of alpha it starts with: its MDE's level. A row
    # that starts with none at this look (Tarone: too few flips among the items read so far) is
    # judged at the smallest share held, as its MDE is: at share 0 its alternative was infinite,
    # so it was always "futile" and its task stopped before the rest of its items could flip.
    held = [c.share for c in gated if c.share > 0]
    floor = min(held) if held else 1.0
    final = np.array([float(look_levels(t, alpha * (c.share or floor))[-1]) for c in gated])
    stops = futile([c.drop for c in gated], [c.test.se for c in gated], [c.test.n for c in gated],
                   [c.margin for c in gated], frac, len(t), final, beta)
    flags = {str(c.key): bool(f) for c, f in zip(gated, stops, strict=True)}
    # A task stops when every gated comparison its items are in is futile: its own, and those of
    # the groups that hold it (a group's items are its subtasks': stopping one freezes its part).
    tasks: dict[str, bool] = {}
    for c, f in zip(gated, stops, strict=True):
        for task in (c.subtasks or (c.key.task,)):
            tasks[task] = tasks.get(task, True) and bool(f)
    done = frozenset(task for task, all_futile in tasks.items() if all_futile)
    stop = bool(gated) and len(done) == len(tasks)
    return LookDecision(look, frac, level, "pass" if stop else "continue", flags, done)


def futile_units(outcome: Outcome, fractions: Mapping[tuple[str, ...], float], alpha: float, looks: int,
                 beta: float = INFORMATIVE_FUTILITY_BETA) -> list[tuple[str, ...]]:
    """An informative gate's stage (issue #57): the units (tasks that stop together) of
    ``fractions`` whose every gated comparison, the anchor's too, shows its drop below the design
    alternative (``futile``) at the unit's estimated information fraction. ``outcome``: the
    comparison of the items read so far, each standing for what the design says. A stage's test
    spends no alpha, so each row's level is its share of alpha. A pass, never a failure: it only
    removes failures, never adds one."""
    gated = [c for c in outcome.comparisons if c.gated] + [c for c in outcome.anchor_comparisons if c.gated]
    held = [c.share for c in gated if c.share > 0]
    floor = min(held) if held else 1.0
    out: list[tuple[str, ...]] = []
    for unit, t in fractions.items():
        rows = [c for c in gated if set(c.subtasks or (c.key.task,)) & set(unit)]
        if not rows or not 0.0 < t < 1.0:
            continue
        stops = futile([c.drop for c in rows], [c.test.se for c in rows], [c.test.n for c in rows],
                       [c.margin for c in rows], t, looks, np.array([alpha * (c.share or floor) for c in rows]), beta)
        if bool(np.all(stops)):
            out.append(unit)
    return out
