"""Multiplicity corrections and the minimum detectable effect."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

METHODS = ("holm", "bonferroni", "bh", "none")


def adjust_pvalues(p: np.ndarray, method: str) -> np.ndarray:
    """Adjusted p-values (same order as ``p``), capped at 1.

    holm: step-down Holm-Bonferroni (family-wise error); bonferroni: m * p;
    bh: Benjamini-Hochberg step-up (false discovery rate); none: unchanged.
    Adjusted values are monotone in the raw values, as in statsmodels' ``multipletests``.
    """
    if method not in METHODS:
        raise ValueError(f"unknown correction {method!r}; expected one of {', '.join(METHODS)}")
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 1:
        raise ValueError("p-values must be a 1-D array")
    if np.isnan(p).any() or (p < 0).any() or (p > 1).any():
        raise ValueError("p-values must lie in [0, 1] (no NaN)")
    m = p.shape[0]
    if m == 0 or method == "none":
        return p.copy()
    if method == "bonferroni":
        return np.minimum(1.0, p * m)
    order = np.argsort(p, kind="stable")
    ranked = p[order]
    if method == "holm":
        # Step-down: the i-th smallest is multiplied by (m - i), then made non-decreasing.
        adj = np.maximum.accumulate(ranked * (m - np.arange(m)))
    else:  # bh
        # Step-up: the i-th smallest is multiplied by m / (i + 1), then made non-increasing
        # from the largest down.
        adj = np.minimum.accumulate((ranked * m / np.arange(1, m + 1))[::-1])[::-1]
    out = np.empty(m)
    out[order] = np.minimum(1.0, adj)
    return out


def mde(se: float, alpha: float, power: float = 0.8) -> float:
    """Smallest true drop a one-sided level-``alpha`` test catches with probability ``power``.

    Normal approximation: (z_{1-alpha} + z_power) * se, in the metric's units.
    """
    if not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError("alpha and power must lie strictly between 0 and 1")
    if not np.isfinite(se) or se < 0:
        raise ValueError(f"se must be finite and >= 0, got {se}")
    z = NormalDist().inv_cdf
    return float((z(1 - alpha) + z(power)) * se)


def decision_levels(p: np.ndarray, method: str, alpha: float) -> np.ndarray:
    """The one-sided level each comparison was in effect tested at: ``p[i] < level[i]`` exactly
    when its adjusted p-value is below ``alpha``.

    An interval at this level agrees with the decision (Holm tests the smallest p at alpha/m,
    the next at alpha/(m-1), ...; an unadjusted 1 - alpha interval does not).
    """
    p = np.asarray(p, dtype=np.float64)
    m = p.shape[0]
    if m == 0:
        return np.empty(0)
    if method == "none":
        return np.full(m, alpha)
    if method == "bonferroni":
        return np.full(m, alpha / m)
    order = np.argsort(p, kind="stable")
    ranked = p[order]
    if method == "holm":
        factor = m - np.arange(m)
        adj = np.maximum.accumulate(ranked * factor)
    elif method == "bh":
        factor = m / np.arange(1, m + 1)
        adj = np.minimum.accumulate((ranked * factor)[::-1])[::-1]
    else:
        raise ValueError(f"unknown correction {method!r}; expected one of {', '.join(METHODS)}")
    # adjusted = raw * (effective factor): the level is alpha / that factor (uncapped, so the
    # equivalence holds for p-values whose adjusted value was capped at 1).
    with np.errstate(divide="ignore", invalid="ignore"):
        eff = np.where(ranked > 0, adj / np.where(ranked > 0, ranked, 1), factor)
    out = np.empty(m)
    out[order] = alpha / eff
    return out


def mde_for_rule(margin: float, alpha: float, se_null: Callable[[float], float],
                 se_alt: Callable[[float], float], power: float = 0.8, *, shifted: bool = False) -> float:
    """Smallest true drop d that the gate's rule flags with probability ``power``.

    The rule flags when the observed drop D exceeds both the margin and the test's critical
    value z_{1-alpha} * se_null(d) (alpha: the multiplicity-adjusted per-comparison level).
    With D ~ Normal(d, se_alt(d)^2), power = P(D > max(margin, z_{1-alpha} se_null(d))), so d
    solves d = max(margin, z_{1-alpha} se_null(d)) + z_power se_alt(d). Both spreads may grow
    with d (a real drop adds right-to-wrong flips), hence a root search, not a formula.
    ``shifted`` (noninferiority): the test is against the margin itself, so the observed drop
    must exceed margin + z_{1-alpha} se_null(d) instead.
    """
    if not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError("alpha and power must lie strictly between 0 and 1")
    z = NormalDist().inv_cdf
    za, zp = z(1 - alpha), z(power)

    def gap(d: float) -> float:
        threshold = margin + za * se_null(d) if shifted else max(margin, za * se_null(d))
        return d - threshold - zp * se_alt(d)

    lo, hi = 0.0, max(margin + za * se_null(0.0) + zp * se_alt(0.0), 1e-300) * 2
    for _ in range(200):  # widen until the rule has the power (spreads grow slower than d)
        if gap(hi) >= 0:
            break
        lo, hi = hi, hi * 2
    else:
        return math.inf
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if gap(mid) >= 0:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * hi:
            break
    return float(hi)


@dataclass(frozen=True)
class Graph:
    """A graphical multiple test procedure (Bretz, Maurer, Brannath & Posch 2009): each hypothesis
    starts with a share ``weights[i]`` of alpha (summing to at most 1); when it is rejected its
    share passes on, ``transitions[i, j]`` of it to hypothesis j (rows summing to at most 1). Holm
    is the graph of equal weights and equal transitions. Any such graph keeps the chance of any
    false rejection at alpha (it is a shortcut of a closed test of weighted Bonferroni tests)."""

    weights: np.ndarray  # (m,)
    transitions: np.ndarray  # (m, m), zero diagonal

    @classmethod
    def holm(cls, m: int) -> Graph:
        g = np.full((m, m), 1.0 / max(1, m - 1))
        np.fill_diagonal(g, 0.0)
        return cls(np.full(m, 1.0 / max(1, m)), g)

    def check(self) -> None:
        w, g = self.weights, self.transitions
        m = w.shape[0]
        if g.shape != (m, m) or (w < 0).any() or w.sum() > 1 + 1e-9 or (g < 0).any() \
                or (g.sum(axis=1) > 1 + 1e-9).any() or np.diag(g).any():
            raise ValueError("a graph needs weights >= 0 summing to at most 1 and transitions >= 0, "
                             "rows summing to at most 1, none to itself")


def _reject(w: np.ndarray, g: np.ndarray, j: int, alive: np.ndarray) -> None:
    """Algorithm 1 of Bretz et al. (2009), in place: hypothesis j is rejected; its weight passes
    along its edges, and each path l -> j -> k joins the edge l -> k:
    g_lk = (g_lk + g_lj g_jk) / (1 - g_lj g_jl)."""
    alive[j] = False
    w[alive] += w[j] * g[j, alive]
    into, out = g[:, j].copy(), g[j, :].copy()
    scale = 1.0 - into * out  # 1 - g_lj g_jl, per l
    joined = g + np.outer(into, out)
    with np.errstate(divide="ignore", invalid="ignore"):
        g[:] = np.where(scale[:, None] > 1e-12, joined / scale[:, None], 0.0)
    np.fill_diagonal(g, 0.0)
    g[j, :] = 0.0
    g[:, j] = 0.0
    w[j] = 0.0


def graph_levels(p: np.ndarray, graph: Graph, alpha: float,
                 level_of: Callable[[float], float] | None = None) -> np.ndarray:
    """The level each hypothesis is tested at by the graph's sequentially rejective procedure at
    ``alpha``: ``p[i] < level[i]`` exactly when it is rejected. A hypothesis holding the share
    ``w`` of alpha is tested at ``level_of(alpha * w)`` (default: ``alpha * w``; a sequential look
    passes its group-sequential boundary for that share). Rejected ones keep the level they were
    rejected at, the rest the level they hold when no more can be rejected (0 for a hypothesis
    that holds no share then, e.g. a subgroup whose group was not rejected)."""
    p = np.asarray(p, dtype=np.float64)
    w, g = graph.weights.astype(np.float64).copy(), graph.transitions.astype(np.float64).copy()
    alive = np.ones(p.shape[0], dtype=bool)
    levels = np.zeros(p.shape[0])
    level = level_of or (lambda share: share)
    while alive.any():
        idx = np.flatnonzero(alive)
        now = np.array([level(alpha * x) if x > 0 else 0.0 for x in w[idx]])
        levels[idx] = now
        ok = p[idx] < now
        if not ok.any():
            break
        # among those rejectable, the one furthest inside its level first (the order the
        # adjusted p-values use; the set rejected does not depend on it)
        with np.errstate(divide="ignore"):
            j = int(idx[ok][np.argmin(p[idx][ok] / now[ok])])
        _reject(w, g, j, alive)
    return levels


def graph_adjusted(p: np.ndarray, graph: Graph) -> np.ndarray:
    """Adjusted p-values of the graph's procedure (Bretz et al. 2011, the sequentially rejective
    algorithm): ``adjusted[i] < alpha`` exactly when it is rejected at ``alpha``. For Holm's
    graph they are Holm's adjusted p-values."""
    p = np.asarray(p, dtype=np.float64)
    m = p.shape[0]
    w, g = graph.weights.astype(np.float64).copy(), graph.transitions.astype(np.float64).copy()
    alive = np.ones(m, dtype=bool)
    out = np.ones(m)
    running = 0.0
    while alive.any():
        idx = np.flatnonzero(alive)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(w[idx] > 0, p[idx] / w[idx], np.inf)
        k = int(np.argmin(q))
        if not np.isfinite(q[k]):
            break  # nothing left holds a share of alpha: never rejected (adjusted 1)
        running = max(running, float(q[k]))
        out[idx[k]] = min(1.0, running)
        _reject(w, g, int(idx[k]), alive)
    return out
