#!/usr/bin/env python3
"""Informative items first (issue #57): false alarms, power and items read, against reading every item.

    python benchmarks/informative_items.py [--n 1000] [--flip-rate 0.05] [--sims 2000] [--seed 57]
        [--until-informed | --sequential]
    (each about 25 s on one core)

One task of n right/wrong items. Its baseline's |margin| ranks the items; a change flips item i
with probability proportional to exp(-rank_i / decay) (at most 1), rank_i in [0, 1) smallest
margin first. The decay is ``--tau``, by default the least concentrated curve the demo's measured
flips allow (results/informative.PROPENSITY_DECAY, 0.06: 96% of the flips in the smallest-margin
fifth; benchmarks/flip_propensity.py fits 0.037, 95% interval 0.025 to 0.060); 0.12 puts 81%
there. The mean flip probability is ``--flip-rate``. A flip is a loss with probability 1/2 on a
harmless change, 1/2 + drop / (2 * flip rate) on a drop.

Per scenario and design, at levels 0.05 and 0.005: the share of simulations whose exact one-sided
p-value is below the level (on a harmless change, the test's size: at most the level for any
pattern of flips), the share whose gate fails (that, and the interval's upper end below -margin,
margin 0.01), and the share of the items read:

- every item, McNemar's exact test (the fixed gate);
- the informative design (results/informative.py) at t = 1 (|margin| eighths read at 1, 1/2,
  1/4, 1/8, then 1/16: 27% of the items) and t = 2 (41%), the weighted flips' exact test.

``--until-informed``: every item against reading the design's stages (scales 1, 2, 4, 8, 16:
27%, 41%, 56%, 75%, 100%) until the read flips hold 95% of the information
(compare/stats/weighted.py ``until_informed``), one test there (exact, and mid-p as the gate by default). ``--sequential``: today's
sequential gate (a random quarter of the items a look) against looks in the informative order,
with the same rules (compare/sequential.py), alpha 0.05.

Scenarios: harmless with flips along the curve, harmless with every flip among the quarter the
baseline was surest of (read at 1/8: the adversarial case), and harmless with flips uniform;
drops of 1.5, 2 and 3 points along the curve, and 3 points with uniform flips.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gatekeeper.compare.stats.mcnemar import mcnemar  # noqa: E402
from gatekeeper.compare.stats.weighted import (  # noqa: E402
    MIN_FLIPS,
    informed_share,
    until_informed,
    weighted_flip_test,
)
from gatekeeper.results import informative  # noqa: E402

LEVELS = (0.05, 0.005)
MARGIN = 0.01
TAU = informative.PROPENSITY_DECAY  # the propensity curve's decay over the |margin| ranks (--tau)


def propensity(n: int, flip_rate: float, shape: str) -> np.ndarray:
    """Each item's flip probability (items in |margin| order, smallest first), mean flip_rate."""
    rank = np.arange(n) / n
    if shape == "curve":  # c * exp(-rank / TAU), at most 1, c such that the mean is flip_rate
        curve = np.exp(-rank / TAU)  # TAU: main() may set it from --tau
        low, high = 0.0, 1.0 / curve.min()
        for _ in range(100):
            c = (low + high) / 2
            low, high = (c, high) if np.minimum(1.0, c * curve).mean() < flip_rate else (low, c)
        return np.minimum(1.0, low * curve)
    elif shape == "uniform":
        q = np.ones(n)
    elif shape == "confident":  # only the quarter the baseline was surest of
        q = (rank >= 0.75).astype(float)
    else:
        raise ValueError(shape)
    q = q * flip_rate / q.mean()
    if q.max() > 1:
        raise ValueError(f"flip rate {flip_rate} too high for the {shape} curve")
    return q


def draw(rng: np.random.Generator, q: np.ndarray, flip_rate: float, drop: float) -> tuple[np.ndarray, np.ndarray]:
    """(baseline, candidate) 0/1 items: item i flips with probability q_i, a loss with
    probability 1/2 + drop / (2 flip_rate); unflipped items right or wrong at 70/30."""
    n = q.size
    base = (rng.random(n) < 0.7).astype(float)
    flips = rng.random(n) < q
    loss = rng.random(n) < 0.5 + drop / (2 * flip_rate)
    base = np.where(flips, loss.astype(float), base)  # a loss starts right, a gain wrong
    cand = np.where(flips, 1 - base, base)
    return base, cand


def fails(p: float, ci_high: float, level: float) -> bool:
    return p < level and ci_high < -MARGIN


def simulate(n: int, flip_rate: float, shape: str, drop: float, sims: int, seed: int) -> dict[str, np.ndarray]:
    """{design: [failed at each level..., share read]} averaged over the simulations."""
    rng = np.random.default_rng(seed)
    q = propensity(n, flip_rate, shape)
    design = informative.design("t", np.arange(n, dtype=float), seed=seed)  # margins in rank order
    width = 2 * len(LEVELS) + 1  # p below each level, failed at each level, share read
    out = {name: np.zeros(width) for name in ("every item", "informative t=1", "informative t=2")}
    for sim in range(sims):
        base, cand = draw(rng, q, flip_rate, drop)
        # the design's uniforms are fixed by the seed: redraw them per simulation (another seed)
        u = informative.uniforms("t", n, seed * 100_003 + sim)
        for level_i, level in enumerate(LEVELS):
            full = mcnemar(base, cand, True, 1 - 2 * level, exact=True)
            out["every item"][level_i] += full.p_worse < level
            out["every item"][len(LEVELS) + level_i] += fails(full.p_worse, full.ci_high, level)
        out["every item"][-1] += 1.0
        for t, name in ((1.0, "informative t=1"), (2.0, "informative t=2")):
            drawn = informative.Design("t", design.pi, u)
            read = drawn.read(t)
            weights = drawn.weights(np.flatnonzero(read), t)
            for level_i, level in enumerate(LEVELS):
                r = weighted_flip_test(base[read], cand[read], weights, n, True, 1 - 2 * level)
                out[name][level_i] += r.p_worse < level
                out[name][len(LEVELS) + level_i] += fails(r.p_worse, r.ci_high, level)
            out[name][-1] += read.mean()
    return {k: v / sims for k, v in out.items()}


SCENARIOS = (("harmless, flips along the curve", "curve", 0.0),
             ("harmless, flips only where the baseline was surest", "confident", 0.0),
             ("harmless, flips uniform", "uniform", 0.0),
             ("drop 1.5 points, along the curve", "curve", 0.015),
             ("drop 2 points, along the curve", "curve", 0.02),
             ("drop 3 points, along the curve", "curve", 0.03),
             ("drop 3 points, flips uniform", "uniform", 0.03))


# ----------------------------------------------------------------------------- sequential looks

LOOKS = 4
SCALES = informative.SCALES  # the informative looks: 27%, 41%, 56%, 75%, 100% of the items


def planned_fractions(pi: np.ndarray) -> np.ndarray:
    """Each informative look's information fraction were flips uniform (the least the design can
    know): the variance of reading every item over that of the look's weighted estimate."""
    return np.array([1.0 / np.mean(1.0 / np.minimum(1.0, s * pi)) for s in SCALES])


def sequential_trial(base: np.ndarray, cand: np.ndarray, read_at: list[np.ndarray], weights_at: list[np.ndarray],
                     t: np.ndarray, alpha: float = 0.05) -> tuple[bool, float]:
    """(failed, share of the items read) of one sequential gate over looks reading ``read_at[k]``
    with ``weights_at[k]``: the gate's rules (compare/sequential.py) on one task: an interim look
    fails on p below its O'Brien-Fleming level with the interval's near end past the margin,
    passes when the drop is shown below the design alternative (futility), the last look decides
    as the fixed rule at its level; exact p-values at interim looks, mid-p at the last."""
    from gatekeeper.compare import sequential as seq

    n = base.size
    levels = seq.look_levels(t, alpha)
    final = float(levels[-1])
    for k, (read, w) in enumerate(zip(read_at, weights_at, strict=True)):
        last = k == len(read_at) - 1
        r = weighted_flip_test(base[read], cand[read], w, n, True, 1 - 2 * float(levels[k]), exact=not last)
        if r.p_worse < levels[k] and r.ci_high < -MARGIN:
            return True, read.size / n
        if last:
            return False, 1.0
        if seq.futile(-r.delta, r.se, n, MARGIN, float(t[k]), len(read_at), final):
            return False, read.size / n
    raise AssertionError("the last look decides")


def simulate_sequential(n: int, flip_rate: float, shape: str, drop: float, sims: int, seed: int) -> dict[str, np.ndarray]:
    """{design: [failed, share read, failed at the fixed gate on the same data]} averaged: today's
    sequential gate (a random quarter of the items a look) and the informative one (SCALES)."""
    rng = np.random.default_rng(seed)
    q = propensity(n, flip_rate, shape)
    pi = informative.design("t", np.arange(n, dtype=float), seed=seed).pi
    t_informative = planned_fractions(pi)
    t_uniform = np.arange(1, LOOKS + 1) / LOOKS
    out = {"uniform looks": np.zeros(3), "informative looks": np.zeros(3)}
    for sim in range(sims):
        base, cand = draw(rng, q, flip_rate, drop)
        full = mcnemar(base, cand, True, 0.9)
        fixed = full.p_worse < 0.05 and full.ci_high < -MARGIN
        order = rng.permutation(n)
        uniform = [order[: round(n * f)] for f in t_uniform]
        u = informative.uniforms("t", n, seed * 100_003 + sim)
        drawn = informative.Design("t", pi, u)
        chosen = [np.flatnonzero(drawn.read(s)) for s in SCALES]
        for name, reads, weights, t in (
                ("uniform looks", uniform, [np.full(r.size, n / r.size) for r in uniform], t_uniform),
                ("informative looks", chosen, [drawn.weights(r, s) for s, r in zip(SCALES, chosen, strict=True)],
                 t_informative)):
            failed, share = sequential_trial(base, cand, reads, weights, t)
            out[name] += (failed, share, fixed)
    return {k: v / sims for k, v in out.items()}


# ----------------------------------------------------------------------------- reading until informed


def read_stage(base: np.ndarray, cand: np.ndarray, drawn: informative.Design, alpha: float = 0.05,
               exact: bool = False) -> tuple[float, bool]:
    """(the scale an informative gate stops one task at, whether it failed there early): gate.py
    ``_informative_stages`` on one task. Before the first stage informed (``until_informed``),
    each stage's comparison at its share of alpha (``informative_alphas``) fails on a drop shown
    beyond the margin, and passes early where its read flips (at least MIN_FLIPS) show no drop the
    gate is designed to catch (``futile_units``'s rule at the final alpha: the informative
    futility beta, the information fraction estimated from the read flips)."""
    from gatekeeper.compare import sequential as seq

    stage_alpha, final_alpha = seq.informative_alphas(alpha, len(SCALES))
    flipped = base != cand
    informed = until_informed(flipped, drawn)
    n = base.size
    for scale in SCALES[:informed]:
        read = np.flatnonzero(drawn.read(scale))
        weights = drawn.weights(read, scale)
        r = weighted_flip_test(base[read], cand[read], weights, n, True, 1 - 2 * stage_alpha, exact=exact)
        if fails(r.p_worse, r.ci_high, stage_alpha):
            return scale, True
        changed = flipped[read]
        if changed.sum() >= MIN_FLIPS and seq.futile(-r.delta, r.se, n, MARGIN, informed_share(weights[changed]),
                                                     len(SCALES), final_alpha, seq.INFORMATIVE_FUTILITY_BETA):
            return scale, False
    return SCALES[informed], False


def simulate_adaptive(n: int, flip_rate: float, shape: str, drop: float, sims: int, seed: int) -> dict[str, np.ndarray]:
    """{design: [p below each level..., failed at each level..., share read]} for every item and
    for the informative gate's read of one task (``read_stage``: stage by stage until informed,
    shown futile, or failed early; the final test at the level less the stages' share), on the
    same data; each with the exact test and with mid-p (the gate's default, policy.exact_mcnemar
    false). "p below" counts an early failure as a rejection. The share read is at level 0.05."""
    from gatekeeper.compare.sequential import informative_alphas

    rng = np.random.default_rng(seed)
    q = propensity(n, flip_rate, shape)
    pi = informative.design("t", np.arange(n, dtype=float), seed=seed).pi
    width = 2 * len(LEVELS) + 1
    names = ("every item", "until informed", "every item, mid-p", "until informed, mid-p")
    out = {name: np.zeros(width) for name in names}
    for sim in range(sims):
        base, cand = draw(rng, q, flip_rate, drop)
        u = informative.uniforms("t", n, seed * 100_003 + sim)
        drawn = informative.Design("t", pi, u)
        for level_i, level in enumerate(LEVELS):
            for exact, suffix in ((True, ""), (False, ", mid-p")):
                full = mcnemar(base, cand, True, 1 - 2 * level, exact=exact)
                out[f"every item{suffix}"][level_i] += full.p_worse < level
                out[f"every item{suffix}"][len(LEVELS) + level_i] += fails(full.p_worse, full.ci_high, level)
                s, early = read_stage(base, cand, drawn, level, exact)
                read = np.flatnonzero(drawn.read(s))
                final = informative_alphas(level, len(SCALES))[1]
                r = weighted_flip_test(base[read], cand[read], drawn.weights(read, s), n, True, 1 - 2 * final,
                                       exact=exact)
                out[f"until informed{suffix}"][level_i] += early or r.p_worse < final
                out[f"until informed{suffix}"][len(LEVELS) + level_i] += early or fails(r.p_worse, r.ci_high, final)
                if level_i == 0:
                    out[f"until informed{suffix}"][-1] += read.size / n
        out["every item"][-1] += 1.0
        out["every item, mid-p"][-1] += 1.0
    return {k: v / sims for k, v in out.items()}


def main() -> int:
    global TAU  # --tau: the curve every simulation below draws from
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--flip-rate", type=float, default=0.05)
    ap.add_argument("--sims", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=57)
    ap.add_argument("--tau", type=float, default=TAU,
                    help="the curve's decay over the |margin| ranks: 0.06 (the default, measured) puts 96%% of the "
                         "flips in the smallest-margin fifth, 0.12 81%%, 0.25 56%%, 0.5 38%% (uniform: 20%%)")
    ap.add_argument("--sequential", action="store_true",
                    help="instead: today's sequential gate (a random quarter a look) against looks in the informative "
                         "order (27%%, 41%%, 56%%, 75%%, 100%% of the items), the same rules; alpha 0.05")
    ap.add_argument("--record", action="store_true",
                    help="instead: the README's figure (fig:informative_read): harmless pairs along the measured curve, "
                         "the share read until informed and by today's sequential gate, and a 3-point drop caught by "
                         "each read against every item (mid-p, as the gate); into benchmarks/figures.json")
    ap.add_argument("--until-informed", action="store_true",
                    help="instead: every item against reading the design's stages (27%%, 41%%, 56%%, 75%%, 100%%) until "
                         "the read flips hold 95%% of the information, one test there (exact, and mid-p)")
    args = ap.parse_args()
    TAU = args.tau
    if args.record:
        return _record(args)
    if args.sequential:
        return _sequential_main(args)
    return _levels_main(args, simulate_adaptive if args.until_informed else simulate)


def _levels_main(args: argparse.Namespace, simulation) -> int:
    """Each scenario's rates per design: P(p < level), the gate failed at each level, items read."""
    print(f"n {args.n}, flip rate {args.flip_rate}, margin {MARGIN}, curve tau {TAU}, {args.sims} simulations, "
          f"seed {args.seed}; P(p < {' / '.join(map(str, LEVELS))}); the gate failed at each; share of items read")
    k = len(LEVELS)
    for i, (label, shape, drop) in enumerate(SCENARIOS):
        t0 = time.perf_counter()
        rates = simulation(args.n, args.flip_rate, shape, drop, args.sims, args.seed + i)
        print(f"{label} ({time.perf_counter() - t0:.0f} s)")
        for name, r in rates.items():
            print(f"  {name:<22} p below: " + " / ".join(f"{x:.4f}" for x in r[:k]) + "; failed: "
                  + " / ".join(f"{x:.4f}" for x in r[k:2 * k]) + f"; read {r[-1]:.0%}")
    return 0


def _sequential_main(args: argparse.Namespace) -> int:
    print(f"sequential gates, n {args.n}, flip rate {args.flip_rate}, margin {MARGIN}, alpha 0.05, {LOOKS} looks, "
          f"{args.sims} simulations, seed {args.seed}: failed, share of items read (the fixed gate failed)")
    for i, (label, shape, drop) in enumerate(SCENARIOS):
        t0 = time.perf_counter()
        rates = simulate_sequential(args.n, args.flip_rate, shape, drop, args.sims, args.seed + i)
        print(f"{label} ({time.perf_counter() - t0:.0f} s)")
        for name, r in rates.items():
            print(f"  {name:<18} failed {r[0]:.3f}, read {r[1]:.0%} (fixed gate {r[2]:.3f})")
    return 0

def _record(args: argparse.Namespace) -> int:
    """fig:informative_read, from the same simulations as --until-informed and --sequential print."""
    from benchmarks import figures

    harmless = simulate_adaptive(args.n, args.flip_rate, "curve", 0.0, args.sims, args.seed)
    drop = simulate_adaptive(args.n, args.flip_rate, "curve", 0.03, args.sims, args.seed + 5)
    sequential = simulate_sequential(args.n, args.flip_rate, "curve", 0.0, args.sims, args.seed)
    k = len(LEVELS)
    read, today = harmless["until informed"][-1], sequential["uniform looks"][1]
    caught, every = drop["until informed, mid-p"][k], drop["every item, mid-p"][k]
    text = (f"{read:.0%} of the items, where today's sequential gate reads {today:.0%}; a 3-point drop is caught "
            f"{caught:.1%} of the time (reading every item: {every:.1%})")
    figures.record("benchmarks/informative_items.py", {"informative_read": (text, float(read))},
                   note=f"{args.n} items, {args.flip_rate:.0%} flipping along decay {TAU}, margin {MARGIN}, "
                        f"{args.sims} simulations, seed {args.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
