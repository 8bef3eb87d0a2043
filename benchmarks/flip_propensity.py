#!/usr/bin/env python3
"""Which items flip: the share of a change's flips by the baseline's margin (issue #57).

    python benchmarks/flip_propensity.py [--out DIR | --reuse DIR] [--bins 5]
    (about 2 minutes on 2 CPU cores: ten real lm-eval runs of the demo suite)

A paired test learns only from the items that flip. If the baseline already says which items can
flip (a multiple-choice item whose right answer is far above the best wrong one rarely does), a
gate could read those first. This measures it instead of assuming it: the demo's base checkpoint
and its standard variants (``gatekeeper plan --mutants --fixed --keep``: weight noise at 1, 3 and
10%, a dropped layer, a reset norm, swapped embeddings, int4, an fp16 round trip, another batch
size) are evaluated on every item, and for each multiple-choice item of the suite the baseline's
margin is read from its samples file: the log-likelihood of the gold choice less the best other
choice's (acc's margin; negative where the baseline was wrong). Items are cut into ``--bins``
groups of equal size by the margin's absolute value, smallest first, and for each variant the
share of its flipped items (right to wrong or wrong to right, acc) in each group is printed,
then pooled over the harmless variants and over the defects.

Read the first column: under a uniform order each group would hold 1/bins of the flips.

Then the curve ``plan`` and the benchmarks assume, fitted: each small change's flips (a variant
flipping at most 5% of the items; the dropped layer and the swapped embeddings flip items
everywhere) at their |margin| rank r in [0, 1) within their task, smallest first, as draws from a
density proportional to exp(-r / decay); the maximum-likelihood decay and its 95% profile
interval (results/informative.py takes the interval's least concentrated end,
``PROPENSITY_DECAY``).

Then, per variant and multiple-choice task, what the informative design (results/informative.py,
built from the reference run's margins as a baseline stores them, seed 1234) would have read and
decided: the flips among its items, and the one-sided p-value of a drop from the weighted flips'
exact test beside McNemar's exact test on every item.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "examples" / "gatekeeper.yaml"
BASE = ROOT / "examples" / "checkpoints" / "base"


def mutants(out: Path) -> list[dict]:
    """Run ``plan --mutants --fixed --keep`` into ``out``; its JSON rows."""
    env = dict(os.environ, TQDM_DISABLE="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "gatekeeper", "plan", "--suite", str(SUITE), "--mutants", str(BASE),
                           "--fixed", "--keep", "--out", str(out), "--format", "json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"plan --mutants failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    (out / "plan.json").write_text(proc.stdout)
    return json.loads(proc.stdout)["variants"]


def choice_items(run_dir: Path) -> dict[tuple[str, int], tuple[float, float]]:
    """{(task, doc_id): (acc, margin)} of every multiple-choice item of a run: the margins as a
    baseline stores them (``load_run(choice_margins=True)``, results/informative.py)."""
    from gatekeeper.results.reader import load_run

    run = load_run(run_dir, choice_margins=True)
    items = {}
    for task, (doc_ids, margins) in run.choice_margins.items():
        acc = run.series[next(k for k in run.series if k.task == task and k.metric == "acc")]
        right = dict(zip(acc.doc_ids.tolist(), acc.values.tolist(), strict=True))
        items.update({(task, d): (right[d], m) for d, m in zip(doc_ids.tolist(), margins.tolist(), strict=True)
                      if np.isfinite(m)})
    return items


def flip_shares(base: dict, cand: dict, edges: np.ndarray) -> tuple[int, np.ndarray]:
    """(flips, share of them in each |margin| group) of a candidate against the baseline."""
    keys = sorted(base)
    margin = np.array([abs(base[k][1]) for k in keys])
    flipped = np.array([base[k][0] != cand[k][0] for k in keys])
    group = np.searchsorted(edges, margin, side="right")
    counts = np.bincount(group[flipped], minlength=edges.size + 1).astype(float)
    return int(flipped.sum()), counts / max(1.0, counts.sum())


def ranks(base: dict) -> dict[tuple[str, int], float]:
    """Each item's |margin| rank within its task, in (0, 1): (position + 1/2) / items, smallest first."""
    out = {}
    for task in sorted({t for t, _ in base}):
        keys = sorted(k for k in base if k[0] == task)
        order = np.argsort([abs(base[k][1]) for k in keys], kind="stable")
        out.update({keys[i]: (pos + 0.5) / len(keys) for pos, i in enumerate(order)})
    return out


def decay_fit(flip_ranks: np.ndarray) -> tuple[float, float, float]:
    """(maximum-likelihood decay, 95% profile interval's low and high end) of ranks drawn from a
    density proportional to exp(-r / decay) on [0, 1)."""
    r = np.asarray(flip_ranks, dtype=float)
    decays = np.linspace(0.005, 1.0, 4000)
    loglik = -r.sum() / decays - r.size * np.log(decays * -np.expm1(-1.0 / decays))
    kept = decays[loglik >= loglik.max() - 1.92]  # chi-square(1) 95% / 2
    return float(decays[loglik.argmax()]), float(kept.min()), float(kept.max())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="a new folder for the runs (default: a temporary one)")
    ap.add_argument("--reuse", type=Path, help="the --out folder of an earlier run: read it, evaluate nothing")
    ap.add_argument("--bins", type=int, default=5)
    args = ap.parse_args()
    if args.reuse:
        out = args.reuse
        rows = json.loads((out / "plan.json").read_text())["variants"]
    else:
        out = args.out or Path(tempfile.mkdtemp(prefix="flip-propensity-"))
        rows = mutants(out)
    base = choice_items(out / "reference")
    if not base:
        raise SystemExit(f"{out / 'reference'}: no multiple-choice item with choice log-likelihoods")
    margins = np.array([abs(m) for _, m in base.values()])
    edges = np.quantile(margins, np.arange(1, args.bins) / args.bins)
    print(f"{len(base)} multiple-choice items (demo suite); |margin| group edges (nats): "
          + ", ".join(f"{e:.2f}" for e in edges))
    print(f"share of each variant's flipped items by the baseline's |margin|, smallest first ({args.bins} groups "
          f"of {len(base) // args.bins} items; uniform: {1 / args.bins:.2f} each)")
    pooled: dict[str, np.ndarray] = {}
    for row in rows:
        cand = choice_items(out / "gates" / row["name"])
        if set(cand) != set(base):
            print(f"  {row['name']:<15} skipped: its items are not the reference's")
            continue
        flips, shares = flip_shares(base, cand, edges)
        kind = "harmless" if not row["should_fail"] else "defect"
        pooled.setdefault(kind, np.zeros(args.bins))
        pooled[kind] += shares * flips
        print(f"  {row['name']:<15} {kind:<8} {flips:>4} flips: " + " ".join(f"{s:.2f}" for s in shares))
    for kind, counts in pooled.items():
        total = counts.sum()
        if total:
            print(f"  all {kind:<19} {int(total):>4} flips: " + " ".join(f"{c / total:.2f}" for c in counts))
    rank = ranks(base)
    small = []
    for row in rows:
        cand = choice_items(out / "gates" / row["name"])
        flipped = [rank[k] for k in sorted(base) if k in cand and base[k][0] != cand[k][0]]
        if flipped and len(flipped) <= 0.05 * len(base):
            small += flipped
    if small:
        best, low, high = decay_fit(np.array(small))
        print(f"the small changes' {len(small)} flips by |margin| rank: decay {best:.3f} (95% interval {low:.3f} to "
              f"{high:.3f}); {-np.expm1(-0.2 / high):.0%} to {-np.expm1(-0.2 / low):.0%} of the flips in the "
              "smallest-margin fifth")
    designed(out, rows)
    return 0


def designed(out: Path, rows: list[dict]) -> None:
    """Each variant's flips and p-value under the informative design, beside every item's."""
    from gatekeeper.compare.stats.mcnemar import mcnemar
    from gatekeeper.compare.stats.weighted import weighted_flip_test
    from gatekeeper.results import informative
    from gatekeeper.results.reader import load_run

    reference = load_run(out / "reference", choice_margins=True)
    designs = {task: informative.design(task, margins, seed=1234)
               for task, (_, margins) in reference.choice_margins.items()}
    share = sum(d.read().sum() for d in designs.values()) / sum(d.pi.size for d in designs.values())
    print(f"informative design (seed 1234): reads {share:.0%} of the multiple-choice items; per variant and task, "
          "flips read / all, and p of a drop: weighted on the design's items | McNemar exact on every item")
    for row in rows:
        cand = load_run(out / "gates" / row["name"])
        cells = []
        for task, design in sorted(designs.items()):
            key = next(k for k in reference.series if k.task == task and k.metric == "acc")
            if key not in cand.series:
                continue
            base, other = reference.series[key].values, cand.series[key].values
            read = np.flatnonzero(design.read())
            w = weighted_flip_test(base[read], other[read], design.weights(read), base.size, True, 0.95)
            full = mcnemar(base, other, True, 0.95, exact=True)
            cells.append(f"{task} {w.flips}/{full.b + full.c} p {w.p_worse:.2g} | {full.p_worse:.2g}")
        print(f"  {row['name']:<15} " + "; ".join(cells))


if __name__ == "__main__":
    raise SystemExit(main())
