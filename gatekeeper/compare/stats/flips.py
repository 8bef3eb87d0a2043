"""A test for scores of confusion counts (f1, matthews_corrcoef) from how many items flipped
between which cells, for harmless changes that are not symmetric.

The swap permutation assumes that an item flips one way as often as the other. A harmless change
need not: a classifier that calls more items positive turns true negatives into false positives
at 6% and false negatives into true positives at a rate that keeps F1 where it was; many small
losses, few large gains. Swapping rejected such pairs at 0.042 where the level was 0.01
(benchmarks/small_levels.py --swap f1).

Here each kind of flip (from one cell to another, for items of the same gold label) is counted.
"No change" is the set of rates whose expected change of the score is 0, to first order:
sum_k w_k rate_k = 0, w_k the score's change when one item flips so. The rates of that set most
likely to have given the counts (Poisson maximum likelihood under the constraint: rate_k = n_k /
(1 + theta w_k); they sum to the flips seen) give each kind's share of the flips; given how many
items flipped, draws of the kinds' counts (multinomial) have the score recomputed on each, and p
is the share of draws at least as bad as the change observed, ties counted half (mid-p, as
McNemar's; +1 rule). With two kinds this is the exact binomial test of their split at the share
no change implies. A small pseudo-count on every kind the data show possible lets the null
explain a run of losses by a gain that did not happen to occur. Measured on that skewed change
over 500 items (benchmarks/small_levels.py --swap f1|mcc): see docs/statistics.md.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gatekeeper.compare.stats.resampling import PermutationResult, spread, tail_counts, tolerance

PSEUDO_COUNT = 0.02  # a fiftieth of a flip: enough to keep the constraint solvable, too little to move it
MAX_KINDS = 4096  # kinds of flip drawn at once; more (many classes) keep the permutation
DRAW_CELLS = 1 << 20  # Poisson draws per block


def flip_test(xb: np.ndarray, xc: np.ndarray, strata: np.ndarray, score: Callable[[np.ndarray], np.ndarray],
              higher_is_better: bool, n_resamples: int, seed_seq: np.random.SeedSequence) -> PermutationResult | None:
    """One-sided p-values of the change ``score(sum xc) - score(sum xb)`` from the flips' kinds.

    ``xb``, ``xc``: each item's cell as a row of statistics (one-hot confusion cells, or F1's
    [tp, fp, fn]); ``strata``: each item's gold label (an item flips only between the cells of its
    own label). None when no flip could make the score better, or none worse (the constraint has
    no solution), or too many kinds: the caller keeps the permutation then."""
    cells, codes = np.unique(np.concatenate([xb, xc]), axis=0, return_inverse=True)
    codes = codes.reshape(-1)
    code_b, code_c = codes[: xb.shape[0]], codes[xb.shape[0]:]
    source, target = _kinds(code_b, code_c, strata)
    if source.size == 0 or source.size > MAX_KINDS:
        return None
    index = {(a, b): i for i, (a, b) in enumerate(zip(source.tolist(), target.tolist(), strict=True))}
    counts = np.zeros(source.size)
    moved = code_b != code_c
    for a, b in zip(code_b[moved].tolist(), code_c[moved].tolist(), strict=True):
        counts[index[(a, b)]] += 1
    delta = cells[target] - cells[source]
    sb = xb.sum(axis=0)
    s0 = float(score(sb[None, :])[0])
    with np.errstate(divide="ignore", invalid="ignore"):
        w = score(sb[None, :] + delta) - s0
    if not np.isfinite(w).all():
        return None
    rates = _null_rates(counts + PSEUDO_COUNT, w)
    if rates is None:
        return None
    t_obs = float(score(xc.sum(axis=0)[None, :])[0]) - s0
    rng = np.random.default_rng(seed_seq)
    block = max(1, DRAW_CELLS // rates.size)
    parts = []
    for start in range(0, n_resamples, block):
        draws = rng.multinomial(int(counts.sum()), rates / rates.sum(),
                                size=min(block, n_resamples - start)).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            parts.append(score(sb[None, :] + draws @ delta) - s0)
    t_star = np.concatenate(parts)
    level = max(abs(s0), abs(s0 + t_obs))
    tol = tolerance(t_star, level)
    # mid-p, as McNemar's: the draws tied with the change observed count half (the counts are
    # discrete; counting them whole held 0.05 at 0.025 on 500 items, and 0.0003 on 100)
    ties = int(np.count_nonzero(np.abs(t_star - t_obs) <= tol))
    worse, better = tail_counts(t_star, t_obs, tol, higher_is_better)
    b = t_star.size
    return PermutationResult((1 + worse - ties / 2) / (b + 1), (1 + better - ties / 2) / (b + 1), False, b,
                             spread(t_star))


def _kinds(code_b: np.ndarray, code_c: np.ndarray, strata: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(source, target) cells of every flip the data show possible: from a cell an item of a
    label holds in the baseline to another cell items of that label hold in either run."""
    pairs: set[tuple[int, int]] = set()
    for label in np.unique(strata):
        mine = strata == label
        held = np.unique(code_b[mine])
        seen = np.unique(np.concatenate([code_b[mine], code_c[mine]]))
        pairs.update((int(a), int(b)) for a in held for b in seen if a != b)
        if len(pairs) > MAX_KINDS:
            break
    ordered = sorted(pairs)
    return (np.array([a for a, _ in ordered], dtype=np.int64), np.array([b for _, b in ordered], dtype=np.int64))


def _null_rates(counts: np.ndarray, w: np.ndarray) -> np.ndarray | None:
    """Poisson rates most likely to give ``counts`` with sum_k w_k rate_k = 0: rate_k =
    counts_k / (1 + theta w_k), theta the root of sum_k w_k counts_k / (1 + theta w_k), which
    falls in theta across the range keeping every rate positive. None when no kind moves the
    score up, or none down."""
    up, down = w > 0, w < 0
    if not up.any() or not down.any():
        return None
    lo, hi = -1.0 / w[up].max(), 1.0 / (-w[down]).max()
    for _ in range(200):  # bisection to float precision: the root's function is monotone
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if float((w * counts / (1.0 + mid * w)).sum()) > 0:
            lo = mid
        else:
            hi = mid
    return counts / (1.0 + 0.5 * (lo + hi) * w)
