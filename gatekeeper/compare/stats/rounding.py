"""The rounding floor: per-item differences that are floating-point noise count as none.

The same checkpoint on another CPU, batch size or device sums its log-probabilities in a
different order: per-item values move by ~1e-7 relative (measured: 2.6e-7 on the demo's
float32 perplexity task, Intel vs AMD), never by a real amount. Without a floor those pairs look
like tiny changes, the interval around a 1e-8 delta reaches past a margin of 0 and the
comparison is "inconclusive" (or, with enough items, "regressed").
"""

from __future__ import annotations

import numpy as np

from gatekeeper.results.metrics import kind_named

ABS_FLOOR = 1e-12  # for values at or near 0, where a relative tolerance means nothing


def snap_rounding(kind: str, baseline: np.ndarray, candidate: np.ndarray,
                  rel: float) -> tuple[np.ndarray, int]:
    """(candidate with rounding-level differences replaced by the baseline's values, how many).

    A candidate item counts as equal to its baseline item when
    ``|c - b| <= rel * max(|b|, |c|) + ABS_FLOOR``. For "ratio" items the log-likelihood column
    is compared and the item snaps only when its count (words, bytes) is the same. "corpus"
    items are text: equal or not, nothing to round. The kind decides which (``rounding``).
    ``rel`` 0 switches the floor off.
    """
    mode = kind_named(kind).rounding
    if mode == "none" or rel <= 0:
        return candidate, 0
    b = np.asarray(baseline, dtype=np.float64)
    c = np.asarray(candidate, dtype=np.float64)
    if mode == "loglik":
        bv, cv = b[:, 0], c[:, 0]
        same_count = b[:, 1] == c[:, 1]
    else:
        bv, cv = b, c
        same_count = np.ones(bv.shape[0], dtype=bool)
    with np.errstate(invalid="ignore"):
        close = np.abs(cv - bv) <= rel * np.maximum(np.abs(bv), np.abs(cv)) + ABS_FLOOR
    snap = close & same_count & (cv != bv)
    n = int(np.count_nonzero(snap))
    if n == 0:
        return candidate, 0
    out = c.copy()
    if mode == "loglik":
        out[snap, 0] = bv[snap]
    else:
        out[snap] = bv[snap]
    return out, n


def within_floor(delta: float, baseline: float, candidate: float, rel: float) -> bool:
    """An aggregate-level change no larger than rounding (relative to the scores' magnitude)."""
    if rel <= 0 or not np.isfinite(delta):
        return False
    return abs(delta) <= rel * max(abs(baseline), abs(candidate)) + ABS_FLOOR


def aggregate_within_floor(kind: str, baseline: np.ndarray, candidate: np.ndarray, delta: float,
                           b_score: float, c_score: float, rel: float) -> bool:
    """Whether the aggregate moved by no more than rounding, judged where the numbers are made.

    For log-likelihood ratios (perplexities, bits per byte) that is the summed log-likelihood:
    word_perplexity, byte_perplexity and bits_per_byte of one task come from the same sums, so
    they get the same answer (a floor relative to each aggregate would not: byte_perplexity is
    near 1, word_perplexity near 6, and a shift of 1.1e-5 relative passed one and failed the
    others). The word/byte counts must be equal: other text is not rounding. Elsewhere, the
    aggregate itself (``within_floor``)."""
    if kind_named(kind).rounding != "loglik":
        return within_floor(delta, b_score, c_score, rel)
    if rel <= 0 or not np.isfinite(delta):
        return False
    b, c = np.asarray(baseline, dtype=np.float64), np.asarray(candidate, dtype=np.float64)
    if not np.array_equal(b[:, 1], c[:, 1]):
        return False
    sb, sc = float(b[:, 0].sum()), float(c[:, 0].sum())
    return abs(sc - sb) <= rel * max(abs(sb), abs(sc)) + ABS_FLOOR
