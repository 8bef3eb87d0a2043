#!/usr/bin/env python3
"""The multiplicity design (compare/family.py) on an MMLU-sized group, before and after.

    python benchmarks/alpha_design.py [--sims 2000] [--flip 0.04] [--share 0.5] [--gate]

MMLU's 57 test subjects at their real sizes (14,042 items), accuracies between 0.3 and 0.9, a
share ``--flip`` of each subject's items flipping between two harmless runs (half each way). Each
simulation tests the 57 subjects and the pooled group row with the gate's own tests
(``stats.paired_test``: McNemar mid-p) and decides with both designs on the same p-values:

- before: one flat Holm family of the 58 rows (``group_share: 0``);
- after: the group row first at ``--share`` of alpha (``family.design``, ``graph_adjusted``).

Those two columns count "any adjusted p below alpha". ``--gate`` adds the gate's own verdicts
on the same data (``compare_runs``, group design and flat Holm): a row fails only when its
decision interval also excludes the margin, and the discreteness scale applies
(``compare._discreteness_scale``). docs/statistics.md quotes the gate's columns (issue #56).

Scenarios (issue #37's targets at alpha 0.05, margin 0): a diffuse 0.5-point loss (>= 80%), one
265-item subject 8 points worse (>= 75%), harmless (<= alpha, the group row's own rate too) and a
diffuse 1-point loss (>= 99%). The same scenarios run through ``compare_runs`` in
tests/test_alpha_design.py at sizes CI can afford.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gatekeeper.compare import family  # noqa: E402
from gatekeeper.compare.stats import adjust_pvalues, graph_adjusted, paired_test  # noqa: E402
from gatekeeper.model import SeriesKey  # noqa: E402
from tests.synthetic import MMLU_SIZES  # noqa: E402

ALPHA = 0.05


def _pair(rng: np.random.Generator, drops: np.ndarray, flip: float) -> tuple[list[np.ndarray], list[np.ndarray]]:
    base, cand = [], []
    for n, d in zip(MMLU_SIZES, drops, strict=True):
        acc = rng.uniform(0.3, 0.9)
        b = (rng.random(n) < acc).astype(float)
        u = rng.random(n)
        breaks = (b == 1) & (u < (flip / 2 + d) / acc)
        fixes = (b == 0) & (u < (flip / 2) / (1 - acc))
        base.append(b)
        cand.append(np.where(breaks, 0.0, np.where(fixes, 1.0, b)))
    return base, cand


def _p(b: np.ndarray, c: np.ndarray) -> tuple[float, float]:
    """The row's p-value and the smallest its McNemar test could reach (``compare._min_p``)."""
    t = paired_test("mean", "mean", b, c, higher_is_better=True)
    return t.p_worse, 0.5 ** (t.counts[1] + t.counts[2] + 1)


def _runs(base: list[np.ndarray], cand: list[np.ndarray]) -> tuple:
    """The pair as the gate reads it: the subjects as subtasks of an lm-eval group ``mmlu``."""
    from dataclasses import replace

    from tests.synthetic import as_group, fast_series, run

    def side(values: list[np.ndarray], name: str):
        series = [replace(fast_series(f"s{i:02d}", v), key=SeriesKey(f"s{i:02d}", "none", "acc"))
                  for i, v in enumerate(values)]
        return as_group(run(*series, name=name), "mmlu")

    return side(base, "base"), side(cand, "cand")


def scenario(rng: np.random.Generator, drops: np.ndarray, sims: int, flip: float, share: float,
             gate: bool = False) -> dict[str, float]:
    """Rates of "any adjusted p below alpha" (the graph); with ``gate``, also the gate's own
    verdicts on the same data (``compare_runs``: a row fails only when its decision interval
    excludes the margin too), under the group design and under one flat Holm family."""
    from gatekeeper.compare.compare import compare_runs
    from gatekeeper.suite.policy import Policy

    subjects = [f"s{i:02d}" for i in range(len(MMLU_SIZES))]
    rows = [family.Row(SeriesKey("mmlu", "none", "acc"), 0, tuple(subjects))]
    rows += [family.Row(SeriesKey(s, "none", "acc")) for s in subjects]
    before = after = group = gate_before = gate_after = 0
    for _ in range(sims):
        base, cand = _pair(rng, drops, flip)
        p, min_p = np.array([_p(np.concatenate(base), np.concatenate(cand)),
                             *(_p(b, c) for b, c in zip(base, cand, strict=True))]).T
        graph = family.design(rows, lambda t: ("mmlu",) if t != "mmlu" else (), share, "holm", list(min_p), ALPHA).graph
        before += bool((adjust_pvalues(p, "holm") < ALPHA).any())
        adjusted = graph_adjusted(p, graph)
        after += bool((adjusted < ALPHA).any())
        group += bool(adjusted[0] < ALPHA)
        if gate:
            pair = _runs(base, cand)
            gate_after += compare_runs(*pair, Policy(alpha=ALPHA, group_share=share)).verdict == "fail"
            gate_before += compare_runs(*pair, Policy(alpha=ALPHA, group_share=0.0)).verdict == "fail"
    out = {"before": before / sims, "after": after / sims, "group": group / sims}
    if gate:
        out.update(gate_before=gate_before / sims, gate_after=gate_after / sims)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sims", type=int, default=2000)
    ap.add_argument("--flip", type=float, default=0.04)
    ap.add_argument("--share", type=float, default=family.DEFAULT_GROUP_SHARE)
    ap.add_argument("--seed", type=int, default=37)
    ap.add_argument("--gate", action="store_true",
                    help="also the gate's own verdicts (compare_runs) on the same data: what docs/statistics.md quotes")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    n = len(MMLU_SIZES)
    cases = [
        ("diffuse -0.5 point", np.full(n, 0.005), ">= 80%"),
        ("one 265-item subject -8 points", np.where(np.array(MMLU_SIZES) == 265, 0.08, 0.0), ">= 75%"),
        ("harmless", np.zeros(n), "<= 5%"),
        ("diffuse -1 point", np.full(n, 0.01), ">= 99%"),
    ]
    se = 1 / math.sqrt(args.sims) / 2
    print(f"MMLU-sized group: {n} subjects, {sum(MMLU_SIZES):,} items, flips {args.flip:.0%}, alpha {ALPHA}, "
          f"{args.sims} simulations per row (Monte Carlo error <= {se:.1%}); group share {args.share:g}")
    gate_head = f" {'gate: flat Holm':>16} {'gate: group first':>18}" if args.gate else ""
    print(f"{'scenario':34} {'flat Holm (before)':>19} {'group first (after)':>20} {'group row':>10}{gate_head}  target")
    for name, drops, target in cases:
        t0 = time.time()
        r = scenario(rng, drops, args.sims, args.flip, args.share, gate=args.gate)
        gate_cols = f" {r['gate_before']:>16.1%} {r['gate_after']:>18.1%}" if args.gate else ""
        print(f"{name:34} {r['before']:>19.1%} {r['after']:>20.1%} {r['group']:>10.1%}{gate_cols}  {target}"
              f"  ({time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
