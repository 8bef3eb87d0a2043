"""Multiplicity corrections and the minimum detectable effect."""

from __future__ import annotations

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
