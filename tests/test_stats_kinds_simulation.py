"""Fixed-seed simulations for the kinds added with the metric-kind registry: f1 and
matthews_corrcoef (confusion counts), brier_score and median (item resampling), and the corpus
scores (BLEU and chrF through their jackknife linearization, TER through its edits).

- false alarms: when the two runs are exchangeable item by item (a harmless change: each
  item's two outputs are independent draws from the same distribution), the one-sided test
  rejects "candidate worse" at most alpha of the time, within Monte Carlo error;
- power: a real drop is caught (rates measured here, asserted with margin).

Allowance: 2.5 standard errors of the simulated rate at alpha.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from gatekeeper.compare.stats import paired_test

ALPHA = 0.05
N_ITEMS = 300
RESAMPLES = 500


def _allowance(rate: float, n_sims: int) -> float:
    return 2.5 * math.sqrt(rate * (1 - rate) / n_sims)


def _confusion(agg: str, k: int, drop: float) -> Callable[[np.random.Generator], tuple]:
    def make(rng: np.random.Generator) -> tuple:
        gold = rng.integers(0, k, N_ITEMS)
        # a per-item difficulty shared by both runs: items are not all alike
        p_item = np.clip(rng.beta(4, 1.5, N_ITEMS), 0, 1)
        u_b, u_c = rng.random(N_ITEMS), rng.random(N_ITEMS)
        wrong_b, wrong_c = rng.integers(0, k, N_ITEMS), rng.integers(0, k, N_ITEMS)
        base = np.column_stack([gold, np.where(u_b < p_item, gold, wrong_b)])
        cand = np.column_stack([gold, np.where(u_c < p_item - drop, gold, wrong_c)])
        return "confusion", agg, base, cand, True
    return make


def _brier(drop: float) -> Callable[[np.random.Generator], tuple]:
    def make(rng: np.random.Generator) -> tuple:
        skill = rng.normal(1.5, 1.0, N_ITEMS)  # per-item margin of the gold answer

        def rows(shift: float) -> np.ndarray:
            logit = skill + rng.normal(0, 0.7, N_ITEMS) - shift
            p = 1 / (1 + np.exp(-logit))
            return 2 * (1 - p) ** 2  # two-choice brier row
        return "brier", "brier_score", rows(0.0), rows(drop), False
    return make


def _median(drop: float) -> Callable[[np.random.Generator], tuple]:
    def make(rng: np.random.Generator) -> tuple:
        mu = rng.normal(0, 1, N_ITEMS)
        base = mu + rng.normal(0, 0.5, N_ITEMS)
        cand = mu + rng.normal(0, 0.5, N_ITEMS) - drop
        return "median", "median", base, cand, True
    return make


def _corpus(agg: str, drop: float, n: int = 40) -> Callable[[np.random.Generator], tuple]:
    """n translations, twice: each word of the reference kept with the sentence's own chance
    (shared by both runs), less ``drop`` in the candidate; a third of the predictions one word
    short. Few sentences: where the jackknife's linearization is least accurate."""
    words = np.array([f"w{i}" for i in range(50)])

    def make(rng: np.random.Generator) -> tuple:
        base, cand = np.empty((n, 2), dtype=object), np.empty((n, 2), dtype=object)
        for i in range(n):
            ref = words[rng.integers(0, words.size, 4 + rng.integers(0, 16))]
            keep = rng.beta(3, 1.5)
            rows = []
            for chance in (keep, keep - drop):  # a sentence's words drawn at once: a third of the test's time
                pred = np.where(rng.random(ref.size) < chance, ref, words[rng.integers(0, words.size, ref.size)])
                rows.append(" ".join(pred[:-1] if rng.random() < 0.3 else pred))
            base[i], cand[i] = [" ".join(ref), rows[0]], [" ".join(ref), rows[1]]
        return "corpus", agg, base, cand, agg != "ter"
    return make


def _rejection_rate(make: Callable[[np.random.Generator], tuple], n_sims: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    hits = 0
    for i in range(n_sims):
        kind, agg, base, cand, hib = make(rng)
        t = paired_test(kind, agg, base, cand, higher_is_better=hib, n_resamples=RESAMPLES, seed=i)
        hits += t.p_worse < ALPHA
    return hits / n_sims


HARMLESS = {
    "f1": _confusion("f1", 2, 0.0),
    "mcc-binary": _confusion("matthews_corrcoef", 2, 0.0),
    "mcc-4-class": _confusion("matthews_corrcoef", 4, 0.0),
    "brier": _brier(0.0),
    "median": _median(0.0),
    "bleu": _corpus("bleu", 0.0),
    "chrf": _corpus("chrf", 0.0),
    "ter": _corpus("ter", 0.0),
}


@pytest.mark.parametrize("name", list(HARMLESS))
def test_false_alarm_rate_at_most_alpha(name):
    n_sims = 400
    rate = _rejection_rate(HARMLESS[name], n_sims, seed=11)
    assert rate <= ALPHA + _allowance(ALPHA, n_sims), rate


# Drops chosen so the measured power is about 0.9-1.0 at 300 items (fixed seeds).
POWER = {
    "f1": (_confusion("f1", 2, 0.2), 0.85),
    "mcc-4-class": (_confusion("matthews_corrcoef", 4, 0.15), 0.85),
    "brier": (_brier(0.4), 0.85),
    "median": (_median(0.25), 0.85),
    "bleu": (_corpus("bleu", 0.25, n=100), 0.85),
}


@pytest.mark.parametrize("name", list(POWER))
def test_power_against_a_real_drop(name):
    make, floor = POWER[name]
    rate = _rejection_rate(make, 100, seed=7)
    assert rate >= floor, rate
