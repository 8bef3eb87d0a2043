#!/usr/bin/env python3
"""Tarone's admission and mid-p, through the real gate (``compare_runs``), before and after (#56).

    python benchmarks/tarone_corner.py [--sims 1800] [--seed 5601]

The group design gives its subtasks' half of alpha only to those whose McNemar test can reach a
share at all (Tarone 1990), judged on mid-p's smallest value 0.5^(flips+1). Such a share lies
just above that value, where mid-p rejects more often than the share: given 14 flips, at
0.025/47 = 5.3e-4 mid-p rejects at 13 or more wrong-way flips, which happens with probability
15/2^14 = 9.2e-4. The gate now runs the design at the share of alpha that keeps the sum of the
rows' exact conditional sizes at alpha (``compare._discreteness_scale``); "before" is the same
gate at scale 1, on the same data.

Scenarios (alpha 0.05, margin 0, the gate's verdict "fail" counted):
- corner 14: 47 subjects of 100 items with exactly 14 flips (half each way on average: harmless)
  and 10 with 2 flips; corner 10: the same with 10 flips;
- harmless MMLU: MMLU's 57 subject sizes, 4% of items flipping at random (tests/synthetic.py);
- diffuse -0.5 pt, and one 265-item subject -8 pts, on the MMLU sizes.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gatekeeper.compare import compare  # noqa: E402
from gatekeeper.compare.compare import compare_runs  # noqa: E402
from gatekeeper.model import SeriesKey  # noqa: E402
from gatekeeper.suite.policy import Policy  # noqa: E402
from tests.synthetic import MMLU_SIZES, as_group, fast_series, group_pair, run  # noqa: E402

ALPHA = 0.05


def corner_pair(rng: np.random.Generator, flips: int, subjects: int = 47, small: int = 10,
                n: int = 100) -> tuple:
    """Harmless runs of a group: ``subjects`` subtasks of ``n`` items at accuracy 0.5 with exactly
    ``flips`` discordant items each (each way with probability 1/2), and ``small`` with 2."""
    base, cand = [], []
    for t in range(subjects + small):
        k = flips if t < subjects else 2
        b = np.zeros(n)
        b[: n // 2] = 1.0
        rng.shuffle(b)
        c = b.copy()
        which = rng.choice(n, size=k, replace=False)
        c[which] = rng.integers(0, 2, size=k).astype(float)  # a flipped item's new answer: fair coin
        # exactly k discordant: an item whose coin kept its answer is flipped the other way
        same = which[c[which] == b[which]]
        c[same] = 1.0 - b[same]
        name = f"g_{t:02d}"
        base.append(replace(fast_series(name, b), key=SeriesKey(name, "none", "acc")))
        cand.append(replace(fast_series(name, c), key=SeriesKey(name, "none", "acc")))
    return as_group(run(*base, name="base"), "g"), as_group(run(*cand, name="cand"), "g")


def failed(pair: tuple, *, before: bool) -> bool:
    if before:
        with mock.patch.object(compare, "_discreteness_scale", lambda *a: 1.0):
            return compare_runs(*pair, Policy(alpha=ALPHA)).verdict == "fail"
    return compare_runs(*pair, Policy(alpha=ALPHA)).verdict == "fail"


def rates(make, sims: int, seed: int) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    before = after = 0
    for _ in range(sims):
        pair = make(rng)
        before += failed(pair, before=True)
        after += failed(pair, before=False)
    return before / sims, after / sims


SCENARIOS = {
    "corner 14 flips (harmless)": lambda rng: corner_pair(rng, 14),
    "corner 10 flips (harmless)": lambda rng: corner_pair(rng, 10),
    "MMLU sizes, 4% random flips (harmless)": lambda rng: group_pair(rng, np.zeros(len(MMLU_SIZES))),
    "MMLU sizes, diffuse -0.5 pt": lambda rng: group_pair(rng, np.full(len(MMLU_SIZES), 0.005)),
    "MMLU sizes, one 265-item subject -8 pt": lambda rng: group_pair(
        rng, np.where(np.array(MMLU_SIZES) == 265, 0.08, 0.0)),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=1800)
    ap.add_argument("--seed", type=int, default=5601)
    ap.add_argument("--only", help="run the scenarios whose name contains this")
    args = ap.parse_args()
    print(f"{'scenario':42} {'before':>8} {'after':>8}  (sims {args.sims}, seed {args.seed}; MC se at 5%: "
          f"{math.sqrt(0.05 * 0.95 / args.sims):.4f})")
    for i, (name, make) in enumerate(SCENARIOS.items()):
        if args.only and args.only not in name:
            continue
        before, after = rates(make, args.sims, args.seed + i)
        print(f"{name:42} {before:8.4f} {after:8.4f}", flush=True)


if __name__ == "__main__":
    main()
