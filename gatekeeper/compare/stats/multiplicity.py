"""Multiplicity corrections and the minimum detectable effect."""

from __future__ import annotations

import math
from collections.abc import Callable
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
