#!/usr/bin/env python3
"""Size of the test for continuous means at the small levels a multiplicity design uses, before
and after (compare/stats/studentized.py).

    python benchmarks/small_levels.py [--sims 4000] [--quick]
        [--ratio | --corpus bleu|chrf | --swap f1|mcc|nanmean | --cell SIGMA N [--seed S]]
    (about an hour on one core; --quick 5 min)

Harmless, skewed changes: each item's change is a lognormal draw minus its mean (most items a
little worse, a few much better; mean 0), scaled to 0.05. That is the hard direction for a test
of "worse": the t statistic's lower tail is the long one. For each size and skew it prints
P(p_worse < level) at 0.05, 0.01, 0.005 and 0.001:

- before: the plain studentized bootstrap (bootstrap-t) the gate used until now;
- after: the gate's test (``stats.paired_test``), Hall-transformed and calibrated by a fast
  double bootstrap.

Then a suite of ten such metrics under Holm at alpha 0.05 (its false-alarm rate), and the power
of both on the same data against a real drop. Both tests use the gate's fixed seed and 10,000
resamples, as a gate does; the Monte Carlo error of each rate is printed beside it.

``--ratio``: the same for bits per byte, a ratio of sums over texts of 20 to 400 bytes whose
log-likelihood per byte moves by such a change: before, the permutation swapping the two runs'
values within texts (the test ratios had until now); after, the gate's test (the studentized
test of the log-likelihoods' mean difference, mapped to the ratio), and the power of both at a
drop of about three standard errors.

``--corpus bleu`` / ``--corpus chrf``: the same for a corpus score, on sacrebleu's per-sentence
statistics (BLEU: lengths, matches and totals per n-gram order; chrF: hypothesis, reference and
matched character n-grams per order) of sentences whose matches move by such a change, in
proportion to their n-grams (the expected sums are unchanged, so the corpus score is): before,
the permutation swapping the two runs' statistics within sentences; after, the gate's test (the
calibrated bootstrap-t of the change's jackknife linearization, ``paired.jackknife_influence``).

``--swap f1`` / ``--swap mcc``: the same for lm-eval's f1 and matthews_corrcoef on [gold,
prediction] labels (``skewed_confusion_pair``: 30% positive, F1 about 0.46; true negatives become
false positives at 6%, balanced by false negatives becoming true positives so that the score of
the expected counts does not move), and ``--swap nanmean`` for a mean with unjudged items
(``nanmean_pair``): before, the permutation swapping the two runs' statistics within items; after,
the gate's test (f1, mcc: the flips' test, compare/stats/flips.py; nanmean: the studentized test
of the judged values' sum where the same items are judged on both sides, else of the jackknife
linearization). Then the power of both on the same data against a real drop.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gatekeeper.compare.stats import adjust_pvalues, paired, paired_test, pending_draws, resampling  # noqa: E402
from gatekeeper.results import corpus  # noqa: E402
from gatekeeper.results.metrics import kind_named  # noqa: E402

LEVELS = (0.05, 0.01, 0.005, 0.001)
RESAMPLES = 10_000
SCALE = 0.05


def skewed_change(rng: np.random.Generator, n: int, sigma: float) -> np.ndarray:
    return (rng.lognormal(0.0, sigma, n) - math.exp(sigma**2 / 2)) * SCALE


def plain_bootstrap_t(diff: np.ndarray, n_resamples: int = RESAMPLES, seed: int = 0) -> float:
    """p_worse of the plain bootstrap-t (the test before), with the gate's seed and +1 rule."""
    m = diff.size
    mean, se = diff.mean(), diff.std(ddof=1) / math.sqrt(m)
    x = np.column_stack([diff, diff * diff])
    _, ss_boot = np.random.SeedSequence(seed).spawn(2)
    sums = np.concatenate([c.astype(np.float64) @ x for c in resampling.count_chunks(m, n_resamples, ss_boot)])
    mu = sums[:, 0] / m
    var = np.maximum(sums[:, 1] - m * mu**2, 0.0) / (m - 1)
    t = (mu - mean) / np.maximum(np.sqrt(var / m), 1e-12)
    return (1 + np.count_nonzero(t <= mean / se)) / (n_resamples + 1)


def gate_p(diff: np.ndarray, rng: np.random.Generator) -> float:
    base = rng.beta(2, 3, diff.size)
    return paired_test("mean", "mean", base, base + diff, higher_is_better=True, n_resamples=RESAMPLES).p_worse


def size_rates(n: int, sigma: float, sims: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(before, after): P(p_worse < level) for each of LEVELS on harmless skewed changes."""
    rng = np.random.default_rng(seed)
    before, after = np.zeros(len(LEVELS)), np.zeros(len(LEVELS))
    for _ in range(sims):
        d = skewed_change(rng, n, sigma)
        before += plain_bootstrap_t(d) < np.array(LEVELS)
        after += gate_p(d, rng) < np.array(LEVELS)
    return before / sims, after / sims


def suite_rates(n: int, sigma: float, metrics: int, sims: int, seed: int, drop: float = 0.0,
                alpha: float = 0.05) -> tuple[float, float]:
    """(before, after): how often a suite of ``metrics`` such changes fails under Holm at
    ``alpha``; with ``drop`` every metric's mean moves down by it (the power on the same data)."""
    rng = np.random.default_rng(seed)
    fails = np.zeros(2)
    for _ in range(sims):
        p = np.empty((2, metrics))
        for j in range(metrics):
            d = skewed_change(rng, n, sigma) - drop
            p[0, j], p[1, j] = plain_bootstrap_t(d), gate_p(d, rng)
        fails += [bool((adjust_pvalues(row, "holm") < alpha).any()) for row in p]
    return float(fails[0] / sims), float(fails[1] / sims)


def skewed_ratio_pair(rng: np.random.Generator, n: int, sigma: float,
                      drop: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """[loglikelihood, bytes] of n texts, before and after a harmless skewed change: each text's
    log-likelihood per byte moves by a lognormal draw minus its mean, scaled to 0.05 nats (most
    texts a little worse, a few much better; mean 0), less ``drop`` nats per byte."""
    count = rng.integers(20, 400, n).astype(np.float64)
    base = -count * (0.6 + 0.3 * rng.random(n))
    change = (rng.lognormal(0.0, sigma, n) - math.exp(sigma**2 / 2)) * SCALE - drop
    return np.column_stack([base, count]), np.column_stack([base + count * change, count])


def ratio_permutation_p(base: np.ndarray, cand: np.ndarray, aggregation: str = "bits_per_byte") -> float:
    """p_worse of the test before: swapping the two runs' values within items, the ratio of sums
    recomputed on each of 10,000 permutations (the gate's seed and +1 rule)."""
    kind = kind_named("ratio")
    xb, xc = kind.unit_stats(aggregation, base, cand)
    units = resampling.Units(xb, xc, kind.score_fn(aggregation), mean_of_diff=False)
    seed, _ = np.random.SeedSequence(0).spawn(2)
    return resampling.permutation_test(units, False, RESAMPLES, seed).p_worse


def ratio_gate_p(base: np.ndarray, cand: np.ndarray, aggregation: str = "bits_per_byte") -> float:
    return paired_test("ratio", aggregation, base, cand, higher_is_better=False, n_resamples=RESAMPLES).p_worse


def ratio_rates(n: int, sigma: float, sims: int, seed: int, drop: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(before, after): P(p_worse < level) of bits per byte for each of LEVELS."""
    rng = np.random.default_rng(seed)
    before, after = np.zeros(len(LEVELS)), np.zeros(len(LEVELS))
    for _ in range(sims):
        base, cand = skewed_ratio_pair(rng, n, sigma, drop)
        before += ratio_permutation_p(base, cand) < np.array(LEVELS)
        after += ratio_gate_p(base, cand) < np.array(LEVELS)
    return before / sims, after / sims


def skewed_corpus_pair(rng: np.random.Generator, n: int, sigma: float, aggregation: str,
                       drop: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """sacrebleu's sentence statistics of n sentences (``corpus.sentence_stats``' columns),
    before and after a harmless skewed change: each sentence's matches move by SCALE of its
    n-grams times a lognormal draw minus its mean (most sentences lose a few matches, a few gain
    many; less for longer n-grams), less ``drop`` times SCALE. The expected summed statistics
    are unchanged, and with them the corpus score."""
    quality = rng.beta(4, 3, n)
    change = skewed_change(rng, n, sigma) - drop * SCALE
    if aggregation == "bleu":  # [sys_len, ref_len, correct1-4, total1-4]
        length = 8 + rng.poisson(18, n)
        total = np.column_stack([np.maximum(length - k, 0) for k in range(4)])
        correct = rng.binomial(total, quality[:, None] ** np.arange(1, 5))
        base = np.column_stack([length, length + rng.integers(-3, 4, n), correct, total]).astype(np.float64)
        matched, room, weight = slice(2, 6), total, np.array([1.0, 0.8, 0.6, 0.4])
    else:  # chrf: [hyp, ref, match] per character order 1 to 6
        chars = 40 + rng.poisson(80, n)
        hyp = np.column_stack([chars - k for k in range(6)])
        ref = np.column_stack([chars + rng.integers(-10, 11, n) - k for k in range(6)])
        room = np.minimum(hyp, ref)
        match = rng.binomial(room, quality[:, None] ** (0.5 + 0.25 * np.arange(6)))
        base = np.stack([hyp, ref, match], axis=2).reshape(n, 18).astype(np.float64)
        matched, weight = slice(2, 18, 3), 1.0 - 0.1 * np.arange(6)
    cand = base.copy()
    cand[:, matched] += room * change[:, None] * weight
    return base, cand


def corpus_permutation_p(xb: np.ndarray, xc: np.ndarray, aggregation: str) -> float:
    """p_worse of the test before: swapping the two runs' statistics within sentences, the score
    recomputed on each of 10,000 permutations (the gate's seed and +1 rule)."""
    units = resampling.Units(xb, xc, corpus.SCORE_FNS[aggregation], mean_of_diff=False)
    seed, _ = np.random.SeedSequence(0).spawn(2)
    return resampling.permutation_test(units, True, RESAMPLES, seed).p_worse


def corpus_gate_p(xb: np.ndarray, xc: np.ndarray, aggregation: str) -> float:
    """p_worse of the gate's test on sentences' statistics (``paired.studentized_smooth``, as
    ``plan_test`` calls it; tests/test_small_levels.py checks that it is ``paired_test``'s on texts)."""
    score = corpus.SCORE_FNS[aggregation]
    b_score, c_score = (float(score(x.sum(axis=0)[None, :])[0]) for x in (xb, xc))
    _, seed = np.random.SeedSequence(0).spawn(2)
    plan = paired.studentized_smooth(xb, xc, score, b_score, c_score, True, 0.95, RESAMPLES, seed,
                                     "corpus-bootstrap-t", ())
    return plan.finish(pending_draws([plan])[0]).p_worse


def corpus_rates(n: int, sigma: float, aggregation: str, sims: int, seed: int,
                 drop: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(before, after): P(p_worse < level) of the corpus score for each of LEVELS."""
    rng = np.random.default_rng(seed)
    before, after = np.zeros(len(LEVELS)), np.zeros(len(LEVELS))
    for _ in range(sims):
        xb, xc = skewed_corpus_pair(rng, n, sigma, aggregation, drop)
        before += corpus_permutation_p(xb, xc, aggregation) < np.array(LEVELS)
        after += corpus_gate_p(xb, xc, aggregation) < np.array(LEVELS)
    return before / sims, after / sims


def skewed_confusion_pair(rng: np.random.Generator, n: int, aggregation: str, flip: float = 0.06,
                          drop: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """[gold, prediction] of n items, before and after a harmless skewed change of a binary
    classifier: 30% positive, the baseline finds half of them and calls 2 in 7 negatives positive
    (F1 about 0.46). Then ``flip`` of its true negatives become false positives, balanced by as
    many false negatives becoming true positives (a share found by bisection) as keep the score
    (``aggregation``: f1 or matthews_corrcoef) of the expected counts where it was: the score does
    not move, but many items flip one way and few the other. ``drop``: that share of the
    balancing flips is withheld (a real loss)."""
    gold = (rng.random(n) < 0.3).astype(np.int64)
    pred = np.where(gold == 1, rng.random(n) < 0.5, rng.random(n) < 2 / 7).astype(np.int64)
    kind = kind_named("confusion")
    score = kind.score_fn(aggregation)
    xb, _ = kind.unit_stats(aggregation, np.column_stack([gold, pred]), np.column_stack([gold, pred]))
    tn, fn = (gold == 0) & (pred == 0), (gold == 1) & (pred == 0)

    def expected_score(share: float) -> float:  # of the expected cells after the change
        p_positive = np.where(tn, flip, np.where(fn, share, pred))
        ones, zeros = (np.column_stack([gold, np.full_like(gold, v)]) for v in (1, 0))
        x1, x0 = (kind.unit_stats(aggregation, a, a)[0] for a in (ones, zeros))
        expected = p_positive[:, None] * x1 + (1 - p_positive[:, None]) * x0
        return float(score(expected.sum(axis=0)[None, :])[0])

    target, lo, hi = float(score(xb.sum(axis=0)[None, :])[0]), 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_score(mid) < target else (lo, mid)
    share = lo * (1 - drop)
    cand = pred.copy()
    cand[tn & (rng.random(n) < flip)] = 1
    cand[fn & (rng.random(n) < share)] = 1
    return np.column_stack([gold, pred]), np.column_stack([gold, cand])


def nanmean_pair(rng: np.random.Generator, n: int, sigma: float,
                 drop: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Scores in [0, 1] with some unjudged (NaN) items, before and after a harmless skewed change
    (``skewed_change``, mean 0, less ``drop``): a tenth unjudged in both runs, and 1% more
    unjudged in each run, independently (at random, so the expected mean is unchanged)."""
    base = rng.beta(2, 3, n)
    cand = base + skewed_change(rng, n, sigma) - drop
    both = rng.random(n) < 0.1
    base[both], cand[both] = np.nan, np.nan
    base[rng.random(n) < 0.01], cand[rng.random(n) < 0.01] = np.nan, np.nan
    return base, cand


def swap_permutation_p(kind: str, aggregation: str, base: np.ndarray, cand: np.ndarray) -> float:
    """p_worse of the test before: swapping the two runs' statistics within items, the score
    recomputed on each of 10,000 permutations (the gate's seed and +1 rule)."""
    k = kind_named(kind)
    xb, xc = k.unit_stats(aggregation, base, cand)
    units = resampling.Units(xb, xc, k.score_fn(aggregation), mean_of_diff=False)
    seed, _ = np.random.SeedSequence(0).spawn(2)
    perm = resampling.permutation_test(units, True, RESAMPLES, seed)
    return 1.0 if perm is None else perm.p_worse  # None: no item differs


def swap_rates(kind: str, aggregation: str, n: int, sims: int, seed: int, sigma: float = 1.0,
               drop: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(before, after): P(p_worse < level) for each of LEVELS, on ``skewed_confusion_pair`` (kind
    confusion) or ``nanmean_pair``: the swap permutation, and the gate's ``paired_test``."""
    rng = np.random.default_rng(seed)
    before, after = np.zeros(len(LEVELS)), np.zeros(len(LEVELS))
    for _ in range(sims):
        if kind == "confusion":
            base, cand = skewed_confusion_pair(rng, n, aggregation, drop=drop)
        else:
            base, cand = nanmean_pair(rng, n, sigma, drop=drop)
        before += swap_permutation_p(kind, aggregation, base, cand) < np.array(LEVELS)
        after += paired_test(kind, aggregation, base, cand, higher_is_better=True,
                             n_resamples=RESAMPLES).p_worse < np.array(LEVELS)
    return before / sims, after / sims


def _se(rate: float, sims: int) -> float:
    return math.sqrt(max(rate * (1 - rate), 1e-12) / sims)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=4000,
                    help="simulations at 500 items x 3 (README: 20,000 / 12,000 / 3,000 at 100 / 500 / 2,000)")
    ap.add_argument("--quick", action="store_true", help="n = 100 and 500 only, a tenth of the sims")
    ap.add_argument("--ratio", action="store_true",
                    help="bits per byte instead (a ratio of sums): the sign-swap permutation before, the "
                         "studentized test of the log-likelihoods after")
    ap.add_argument("--corpus", choices=("bleu", "chrf"),
                    help="a corpus score instead: the sign-swap permutation before, the studentized test of "
                         "its jackknife linearization after")
    ap.add_argument("--swap", choices=("f1", "mcc", "nanmean"),
                    help="f1, matthews_corrcoef or nanmean instead: the swap permutation before, the gate's "
                         "studentized test after")
    ap.add_argument("--cell", nargs=2, type=float, metavar=("SIGMA", "N"),
                    help="one cell of the means' table only, with the seed the full run gives it "
                         "(int(100 * SIGMA) + N): what docs/statistics.md quotes for that cell")
    ap.add_argument("--seed", type=int, help="with --cell: this seed instead (an independent re-run)")
    args = ap.parse_args()
    if args.cell:
        sigma, n = args.cell[0], int(args.cell[1])
        seed = int(100 * sigma) + n if args.seed is None else args.seed
        t0 = time.perf_counter()
        before, after = size_rates(n, sigma, args.sims, seed=seed)
        err = " ".join(f"{_se(lv, args.sims):.4f}" for lv in LEVELS)
        print(f"lognormal sigma {sigma}, n {n}, {args.sims} sims, seed {seed} ({time.perf_counter() - t0:.0f} s), "
              f"P(p < {', '.join(map(str, LEVELS))}): before {' '.join(f'{r:.4f}' for r in before)} | after "
              f"{' '.join(f'{r:.4f}' for r in after)} | Monte Carlo error {err}")
        return 0
    if args.swap:
        return _swap_main(args.swap, args.sims // 10 if args.quick else args.sims, args.quick)
    if args.corpus:
        return _corpus_main(args.corpus, args.sims // 10 if args.quick else args.sims, args.quick)
    if args.ratio:
        return _ratio_main(args.sims // 10 if args.quick else args.sims, args.quick)
    base = args.sims // 10 if args.quick else args.sims
    cells = [(100, base * 5), (500, base * 3)] + ([] if args.quick else [(2000, base * 3 // 4)])
    print(f"P(p < level) on harmless skewed changes (levels {', '.join(map(str, LEVELS))}): before | after")
    for sigma in (0.75, 1.0):
        for n, sims in cells:
            t0 = time.perf_counter()
            before, after = size_rates(n, sigma, sims, seed=int(100 * sigma) + n)
            err = " ".join(f"{_se(lv, sims):.4f}" for lv in LEVELS)
            print(f"  lognormal sigma {sigma}, n {n:>4}, {sims} sims ({time.perf_counter() - t0:.0f} s): "
                  f"{' '.join(f'{r:.4f}' for r in before)} | {' '.join(f'{r:.4f}' for r in after)}"
                  f" | Monte Carlo error {err}")
    suites = max(100, base * 2 // 5)
    before, after = suite_rates(500, 0.75, 10, suites, seed=5)
    print(f"10 metrics, n 500, harmless, Holm at 0.05 ({suites} suites): before {before:.3f}, after {after:.3f}"
          f" (Monte Carlo error {_se(0.05, suites):.3f})")
    drop = 0.0075  # about three standard errors of the mean change at 500 items
    before, after = suite_rates(500, 0.75, 1, suites // 2, seed=6, drop=drop, alpha=0.005)
    print(f"power, one metric, n 500, a {drop} drop at level 0.005 ({suites // 2} sims): "
          f"before {before:.3f}, after {after:.3f}")
    return 0


def _ratio_main(base: int, quick: bool) -> int:
    cells = [(100, base * 5), (500, base * 5)] + ([] if quick else [(2000, base * 5 // 4)])
    print(f"bits per byte, P(p < level) on harmless skewed changes (levels {', '.join(map(str, LEVELS))}): "
          "before | after")
    for sigma in (1.0, 1.5):
        for n, sims in cells:
            t0 = time.perf_counter()
            before, after = ratio_rates(n, sigma, sims, seed=int(100 * sigma) + n + 1)
            err = " ".join(f"{_se(lv, sims):.4f}" for lv in LEVELS)
            print(f"  lognormal sigma {sigma}, n {n:>4}, {sims} sims ({time.perf_counter() - t0:.0f} s): "
                  f"{' '.join(f'{r:.4f}' for r in before)} | {' '.join(f'{r:.4f}' for r in after)}"
                  f" | Monte Carlo error {err}", flush=True)
    sims = max(200, base // 4)
    drop = 0.015  # nats per byte: about three standard errors at 500 texts, sigma 1
    before, after = ratio_rates(500, 1.0, sims, seed=8, drop=drop)
    print(f"power, n 500, sigma 1, a drop of {drop} nats per byte ({sims} sims): at 0.05 before {before[0]:.3f}, "
          f"after {after[0]:.3f}; at 0.005 before {before[2]:.3f}, after {after[2]:.3f}")
    return 0


def _corpus_main(aggregation: str, base: int, quick: bool) -> int:
    cells = [(100, base * 3 // 2), (500, base * 3 // 2)] + ([] if quick else [(2000, base // 2)])
    print(f"{aggregation}, P(p < level) on harmless skewed changes (levels {', '.join(map(str, LEVELS))}): "
          "before | after")
    for sigma in (1.0, 1.5):
        for n, sims in cells:
            t0 = time.perf_counter()
            before, after = corpus_rates(n, sigma, aggregation, sims, seed=int(100 * sigma) + n + 2)
            err = " ".join(f"{_se(lv, sims):.4f}" for lv in LEVELS)
            print(f"  lognormal sigma {sigma}, n {n:>4}, {sims} sims ({time.perf_counter() - t0:.0f} s): "
                  f"{' '.join(f'{r:.4f}' for r in before)} | {' '.join(f'{r:.4f}' for r in after)}"
                  f" | Monte Carlo error {err}", flush=True)
    sims = max(200, base // 4)
    drop = 0.3  # of the change's scale: about three standard errors at 500 sentences, sigma 1
    before, after = corpus_rates(500, 1.0, aggregation, sims, seed=9, drop=drop)
    print(f"power, n 500, sigma 1, a drop of {drop} ({sims} sims): at 0.05 before {before[0]:.3f}, "
          f"after {after[0]:.3f}; at 0.005 before {before[2]:.3f}, after {after[2]:.3f}")
    return 0


SWAP_KINDS = {"f1": ("confusion", "f1"), "mcc": ("confusion", "matthews_corrcoef"), "nanmean": ("nanmean", "nanmean")}


def _swap_main(name: str, base: int, quick: bool) -> int:
    kind, aggregation = SWAP_KINDS[name]
    cells = [(100, base), (500, base)] + ([] if quick else [(2000, base // 2)])
    print(f"{aggregation}, P(p < level) on harmless skewed changes (levels {', '.join(map(str, LEVELS))}): "
          "before | after")
    for n, sims in cells:
        t0 = time.perf_counter()
        before, after = swap_rates(kind, aggregation, n, sims, seed=n + 4)
        err = " ".join(f"{_se(lv, sims):.4f}" for lv in LEVELS)
        print(f"  n {n:>4}, {sims} sims ({time.perf_counter() - t0:.0f} s): "
              f"{' '.join(f'{r:.4f}' for r in before)} | {' '.join(f'{r:.4f}' for r in after)}"
              f" | Monte Carlo error {err}", flush=True)
    sims = max(200, base // 4)
    drop = 0.5 if kind == "confusion" else 0.01  # half the balancing flips withheld; 0.01 off each score
    before, after = swap_rates(kind, aggregation, 500, sims, seed=10, drop=drop)
    print(f"power, n 500, a drop ({drop}) ({sims} sims): at 0.05 before {before[0]:.3f}, after {after[0]:.3f}; "
          f"at 0.005 before {before[2]:.3f}, after {after[2]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
