#!/usr/bin/env python3
"""Informative items first (issue #57) on an MMLU-sized group, through the gate's own comparison.

    python benchmarks/informative_group.py [--sims 200] [--flip 0.04] [--tau 0.06] [--seed 57]
    (about 1 s a simulation on one core)

MMLU's 57 test subjects at their real sizes (14,042 items) as one size-weighted group, each
subject's items ranked by the baseline's |margin|; a share ``--flip`` of each subject's items flips
between the runs, item i with a chance proportional to exp(-rank_i / tau) (the propensity curve of
benchmarks/informative_items.py: by default the least concentrated the demo's measured flips
allow, results/informative.PROPENSITY_DECAY, 96% of the flips in the smallest-margin fifth; 81% at
tau 0.12), a coin each way. Per scenario, on the
same pairs, ``compare_runs`` (alpha 0.05, margin 0, the group row and the subjects one family);
a drop adds losses of right items along the same curve (a drop flips more items, not other ones):

- the fixed gate: every item;
- the informative gate: each subject's design (results/informative.py), the group's stage chosen
  by ``until_informed`` (compare/stats/weighted.py) on all its subjects' flips together, or an
  earlier one whose comparison so far shows no drop to find (``sequential.futile_units``) or
  fails on a drop shown beyond the margin at the stage's share of alpha, the final comparison at
  the rest, as the gate does (``informative.stage_units``; ``--per-task``: each subject on its own, the stage
  rule only), the items weighed (``informative.weigh``).

Scenarios (issue #57's list): harmless; a diffuse 0.5-point loss; one 265-item subject 8 points
worse. Printed: the share of simulations that fail, and the share of the items read.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gatekeeper.compare import sequential  # noqa: E402
from gatekeeper.compare.compare import compare_runs  # noqa: E402
from gatekeeper.compare.stats.weighted import MIN_FLIPS, informed_share, until_informed  # noqa: E402
from gatekeeper.results import informative, subset  # noqa: E402
from gatekeeper.suite.policy import Policy  # noqa: E402
from tests.synthetic import MMLU_SIZES, as_group, run, series  # noqa: E402

ALPHA = 0.05


def _subject(rng: np.random.Generator, n: int, flip: float, drop: float, tau: float) -> tuple[np.ndarray, np.ndarray]:
    """(baseline, candidate) of one subject, items in |margin| order: harmless flips along the
    curve, a coin each way; a drop adds losses of right items along the same curve (``drop`` of the
    subject on average)."""
    q = np.exp(-(np.arange(n) / n) / tau)
    q = q / q.mean()
    acc = rng.uniform(0.3, 0.9)
    base = (rng.random(n) < acc).astype(float)
    flips = rng.random(n) < np.minimum(1.0, q * flip)
    loss = rng.random(n) < 0.5
    base = np.where(flips, loss.astype(float), base)  # a loss starts right, a gain wrong
    extra = ~flips & (rng.random(n) < np.minimum(1.0, q * drop / acc)) & (base == 1)
    return base, np.where(flips | extra, 1 - base, base)


def simulate(drops: np.ndarray, sims: int, flip: float, tau: float, seed: int, per_task: bool = False
             ) -> tuple[float, float, float]:
    """(the informative gate's failure rate, the fixed gate's, the share of items the informative read)."""
    rng = np.random.default_rng(seed)
    policy = Policy(alpha=ALPHA)
    stage_alpha, final_alpha = sequential.informative_alphas(ALPHA, len(informative.SCALES))
    stage_policy, final_policy = Policy(alpha=stage_alpha), Policy(alpha=final_alpha)
    informed = fixed = read = 0.0
    total = sum(MMLU_SIZES)
    for sim in range(sims):
        base_parts, cand_parts, designs, scales = [], [], {}, {}
        for i, (n, d) in enumerate(zip(MMLU_SIZES, drops, strict=True)):
            task = f"s{i:02d}"
            b, c = _subject(rng, n, flip, d, tau)
            base_parts.append(series(task, "acc", b))
            cand_parts.append(series(task, "acc", c))
            designs[task] = informative.design(task, np.arange(n, dtype=float), seed=seed * 100_003 + sim * 64 + i)
            scales[task] = informative.SCALES[until_informed(b != c, designs[task])]
        early = False
        if not per_task:  # one stage for the whole group (the gate's rule): its subjects' flips together
            whole = informative.Design("g", np.concatenate([d.pi for d in designs.values()]),
                                       np.concatenate([d.u for d in designs.values()]))
            flips = np.concatenate([np.asarray(b.values) != np.asarray(c.values)
                                    for b, c in zip(base_parts, cand_parts, strict=True)])
            group_stage = until_informed(flips, whole)
            base_g, cand_g = as_group(run(*base_parts, name="base"), "g"), as_group(run(*cand_parts, name="cand"), "g")
            for i, scale in enumerate(informative.SCALES[:group_stage]):  # a stage first, as the gate's _interim
                docs = {t: np.flatnonzero(d.read(scale)) for t, d in designs.items()}
                outcome = compare_runs(subset.restrict(base_g, docs),
                                       informative.weigh(subset.restrict(cand_g, docs), designs, scale), stage_policy)
                if sequential.shown_beyond(outcome):  # a drop shown beyond its margin: fails here
                    early, group_stage = True, i
                    break
                changed = np.flatnonzero(whole.read(scale) & flips)
                if changed.size >= MIN_FLIPS and sequential.futile_units(
                        outcome, {tuple(designs): informed_share(whole.weights(changed, scale))}, final_policy.alpha,
                        len(informative.SCALES)):
                    group_stage = i
                    break
            scales = dict.fromkeys(designs, informative.SCALES[group_stage])
        base, cand = as_group(run(*base_parts, name="base"), "g"), as_group(run(*cand_parts, name="cand"), "g")
        fixed += compare_runs(base, cand, policy).verdict == "fail"
        docs = {t: np.flatnonzero(d.read(scales[t])) for t, d in designs.items()}
        read += sum(v.size for v in docs.values()) / total
        weighed = informative.weigh(subset.restrict(cand, docs), designs, scales)
        informed += early or compare_runs(subset.restrict(base, docs), weighed, final_policy).verdict == "fail"
    return informed / sims, fixed / sims, read / sims


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=200)
    ap.add_argument("--flip", type=float, default=0.04)
    ap.add_argument("--tau", type=float, default=informative.PROPENSITY_DECAY)
    ap.add_argument("--seed", type=int, default=57)
    ap.add_argument("--per-task", action="store_true", help="each subject chooses its own stage (the gate's rule: "
                    "one stage for the group, from all its subjects' flips)")
    args = ap.parse_args()
    k = len(MMLU_SIZES)
    scenarios = (("harmless", np.zeros(k)), ("diffuse -0.5 point", np.full(k, 0.005)),
                 ("one 265-item subject -8 points", np.where(np.array(MMLU_SIZES) == 265, 0.08, 0.0)))
    print(f"MMLU-sized group, {sum(MMLU_SIZES):,} items, flips {args.flip:.0%} along exp(-rank/{args.tau}), "
          f"{args.sims} simulations, alpha {ALPHA}")
    for name, drops in scenarios:
        t0 = time.perf_counter()
        informed, fixed, read = simulate(drops, args.sims, args.flip, args.tau, args.seed, args.per_task)
        print(f"{name:32s} fails: informative {informed:.3f}, fixed {fixed:.3f}; informative read {read:.0%} "
              f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
