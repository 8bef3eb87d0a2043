"""Speed of gatekeeper.compare.stats against lm-eval's own bootstrap, on the same synthetic data.

Prints figures; it is not a test. Run:  python benchmarks/stats_speed.py [--full]

Workload ("the suite"): 60 tasks, 100,000 items. 54 tasks (90,000 items) are right/wrong
(acc); 6 tasks (10,000 items, 10%) are perplexity tasks with lm-eval's three ratio metrics each
(word_perplexity, byte_perplexity, bits_per_byte). Every comparison uses 10,000 resamples.

lm-eval side: ``lm_eval.api.metrics.bootstrap_stderr(agg, items, iters=10000)`` on the same
items, with DISABLE_MULTIPROC unset (its default: a multiprocessing pool of cpu_count workers).
It bootstraps ONE run; gatekeeper's figure covers a paired test (permutation p-value + paired
bootstrap of both runs), so the comparison favours lm-eval. lm-eval is slow, so by default it
runs ``--lmeval-iters`` (2,000: two chunks of 1,000, so both pool workers are busy) on one task
of each kind and the time is extrapolated linearly to 10,000 iterations and to all tasks;
``--full`` runs the full 10,000 iterations on those tasks instead (still extrapolated to 60).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import time

import numpy as np

from gatekeeper.compare.stats import paired_test

N_RESAMPLES = 10_000
BINARY_TASKS, BINARY_ITEMS = 54, 90_000
PPL_TASKS, PPL_ITEMS = 6, 10_000
RATIO_METRICS = (("word_perplexity", "weighted_perplexity", 0), ("byte_perplexity", "weighted_perplexity", 1),
                 ("bits_per_byte", "bits_per_byte", 1))


def make_binary(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    base = (rng.random(n) < 0.6).astype(float)
    cand = np.where(rng.random(n) < 0.08, 1 - base, base)
    return base, cand


def make_ppl(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per document: loglikelihood of both runs, word count, byte count."""
    words = rng.integers(50, 800, n).astype(float)
    true_ll = -words * rng.gamma(30, 0.1, n)
    ll_b = true_ll + rng.normal(0, 1.5, n) * np.sqrt(words)
    ll_c = true_ll + rng.normal(0.1, 1.5, n) * np.sqrt(words)
    return ll_b, ll_c, words, words * 5.3


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def gatekeeper_suite(rng: np.random.Generator) -> dict[str, float]:
    binary = [make_binary(rng, BINARY_ITEMS // BINARY_TASKS) for _ in range(BINARY_TASKS)]
    ppl = [make_ppl(rng, PPL_ITEMS // PPL_TASKS) for _ in range(PPL_TASKS)]
    cpu0 = time.process_time()
    t_bin = timed(lambda: [paired_test("mean", "mean", b, c, higher_is_better=True) for b, c in binary])
    def ratio_all() -> None:
        for ll_b, ll_c, words, nbytes in ppl:
            for _, agg, col in RATIO_METRICS:
                count = (words, nbytes)[col]
                paired_test("ratio", agg, np.column_stack([ll_b, count]), np.column_stack([ll_c, count]),
                            higher_is_better=False, n_resamples=N_RESAMPLES)
    t_ratio = timed(ratio_all)
    return {"binary": t_bin, "ratio": t_ratio, "total": t_bin + t_ratio, "cpu": time.process_time() - cpu0}


def lmeval_time(fn, items: list, iters: int) -> float:
    from lm_eval.api.metrics import bootstrap_stderr

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return timed(lambda: bootstrap_stderr(fn, items, iters=iters))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lmeval-iters", type=int, default=2000)
    ap.add_argument("--full", action="store_true", help="run lm-eval with the full 10,000 iterations")
    args = ap.parse_args()
    lm_iters = N_RESAMPLES if args.full else args.lmeval_iters
    os.environ.pop("DISABLE_MULTIPROC", None)

    print(f"cpus: {os.cpu_count()}  load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rng = np.random.default_rng(0)

    # 1. one ratio metric: 10,000 items x 10,000 resamples
    ll_b, ll_c, words, _ = make_ppl(rng, 10_000)
    base, cand = np.column_stack([ll_b, words]), np.column_stack([ll_c, words])
    paired_test("ratio", "weighted_perplexity", base[:100], cand[:100], higher_is_better=False)  # warm-up
    cpu0 = time.process_time()
    t_one = timed(lambda: paired_test("ratio", "weighted_perplexity", base, cand, higher_is_better=False,
                                      n_resamples=N_RESAMPLES))
    cpu_one = time.process_time() - cpu0
    print(f"\n[1] ratio metric, 10,000 items x {N_RESAMPLES:,} resamples (permutation + paired bootstrap)")
    print(f"    gatekeeper paired_test : {t_one:7.3f} s wall  ({cpu_one:.3f} s CPU)")
    try:
        from lm_eval.api.metrics import weighted_perplexity
    except ImportError:
        print("    lm-eval not installed: no comparison")
        return
    items = [(float(a), int(b)) for a, b in base]
    t_lm = lmeval_time(weighted_perplexity, items, lm_iters) * N_RESAMPLES / lm_iters
    note = "" if lm_iters == N_RESAMPLES else f" (ran {lm_iters:,} iters, x{N_RESAMPLES / lm_iters:g} extrapolated)"
    print(f"    lm-eval bootstrap_stderr: {t_lm:7.3f} s wall{note}, one run only")
    print(f"    speed-up: {t_lm / t_one:5.1f}x")

    # 2. the whole suite
    g = gatekeeper_suite(rng)
    print(f"\n[2] suite: 60 tasks, 100,000 items ({BINARY_TASKS} right/wrong tasks, {PPL_TASKS} perplexity tasks"
          f" x 3 ratio metrics), {N_RESAMPLES:,} resamples")
    print(f"    gatekeeper: right/wrong (McNemar, no resampling) {g['binary']:.3f} s, ratio {g['ratio']:.3f} s,"
          f" total {g['total']:.3f} s wall ({g['cpu']:.3f} s CPU)")
    b, _ = make_binary(rng, BINARY_ITEMS // BINARY_TASKS)
    from lm_eval.api.metrics import bits_per_byte, mean

    t_bin = lmeval_time(mean, b.tolist(), lm_iters) * N_RESAMPLES / lm_iters
    ll_b, _, words, nbytes = make_ppl(rng, PPL_ITEMS // PPL_TASKS)
    t_wp = lmeval_time(weighted_perplexity, [(float(a), int(c)) for a, c in zip(ll_b, words, strict=True)], lm_iters)
    t_bpb = lmeval_time(bits_per_byte, [(float(a), int(c)) for a, c in zip(ll_b, nbytes, strict=True)], lm_iters)
    t_ppl = (2 * t_wp + t_bpb) * N_RESAMPLES / lm_iters
    lm_total = BINARY_TASKS * t_bin + PPL_TASKS * t_ppl
    print(f"    lm-eval bootstrap_stderr: one right/wrong task {t_bin:.2f} s, one perplexity task (3 metrics)"
          f" {t_ppl:.2f} s -> suite {lm_total:.1f} s{note}")
    print(f"    speed-up: {lm_total / g['total']:5.1f}x")


if __name__ == "__main__":
    main()
