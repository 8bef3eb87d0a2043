#!/usr/bin/env python3
"""Items and wall time a sequential gate saves against the fixed design, side by side in one run.

    python benchmarks/sequential.py [--looks 3] [--skip-demo] [--trials 200] [--record]

1. The demo (real lm-eval runs, examples/): ``gate`` (every item) and ``gate --sequential`` on the
   regressed and the harmless checkpoints, each as a fresh subprocess; prints the verdicts, items
   evaluated and wall times, and the ratio sequential / fixed.
2. A larger synthetic suite (no model): 10 tasks of 2,000 right/wrong items (3% of the items flip
   between two checkpoints, margin 0.01), harmless and with a 3-point drop in one task; the gate's
   own comparison after each look (``compare_runs`` at the look's level, ``sequential.decide``),
   against the fixed design on the same items. Items are what a GPU pays for: the evaluation
   time saved is the items saved times the per-item time measured on the demo in part 1.

``--record`` writes the demo figures to benchmarks/figures.json (README quotes them).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import figures  # noqa: E402
from gatekeeper.compare import sequential as seq  # noqa: E402
from gatekeeper.compare.compare import compare_runs  # noqa: E402
from gatekeeper.suite.policy import Policy, Rule  # noqa: E402
from tests.synthetic import fast_series, run  # noqa: E402

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "TQDM_DISABLE": "1", "PYTHONPATH": str(ROOT)}


def _gate(model: str, out: Path, sequential: bool, looks: int) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "gatekeeper", "gate", "--suite", "gatekeeper.yaml", "--model", f"checkpoints/{model}",
           "--out", str(out), "--json", str(out.with_suffix(".json")), "--no-history"]
    if sequential:
        cmd += ["--sequential", "--looks", str(looks)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT / "examples", env=ENV, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return wall, json.loads(out.with_suffix(".json").read_text())


def demo(looks: int, scratch: Path) -> dict[str, float]:
    print(f"demo suite (examples/gatekeeper.yaml), {looks} looks, real lm-eval runs on this machine")
    print(f"{'checkpoint':<10} {'design':<10} {'verdict':<8} {'items':>11} {'wall s':>7}")
    found: dict[str, float] = {}
    for model in ("regressed", "harmless"):
        fixed_wall, fixed = _gate(model, scratch / f"{model}-fixed", False, looks)
        seq_wall, sequential = _gate(model, scratch / f"{model}-seq", True, looks)
        info = sequential["sequential"]
        total = info["total"]
        print(f"{model:<10} {'fixed':<10} {fixed['verdict']:<8} {total:>5}/{total:<5} {fixed_wall:7.1f}")
        print(f"{model:<10} {'sequential':<10} {sequential['verdict']:<8} {info['evaluated']:>5}/{total:<5} "
              f"{seq_wall:7.1f}   stopped at look {info['stopped_at']}: items x{info['evaluated'] / total:.2f}, "
              f"wall x{seq_wall / fixed_wall:.2f}")
        found[f"{model}_items"] = info["evaluated"] / total
        found[f"{model}_wall"] = seq_wall / fixed_wall
        found[f"{model}_look"] = info["stopped_at"]
        per_item = [s for s in info["steps"]]
        found["per_item_s"] = max(found.get("per_item_s", 0.0),
                                  sum(s["wall_seconds"] - s.get("model_load_seconds", 0.0) for s in per_item)
                                  / max(1, info["evaluated"]))
    return found


def _trial(rng: np.random.Generator, tasks: int, n: int, drop: float, flip: float, margin: float,
           looks: int) -> tuple[bool, bool, float]:
    policy = lambda alpha: Policy(alpha=alpha, correction="holm", margin=0.0, resamples=200,  # noqa: E731
                                  rules=[Rule(task="*", metric="*", margin=margin)])
    base = (rng.random((tasks, n)) < 0.7).astype(float)
    u = rng.random((tasks, n))
    d = np.zeros((tasks, 1))
    d[0] = drop
    cand = np.where(base == 1, (u >= (flip / 2 + d) / 0.7), (u < (flip / 2) / 0.3)).astype(float)
    fixed = compare_runs(run(*[fast_series(f"t{j}", base[j]) for j in range(tasks)]),
                         run(*[fast_series(f"t{j}", cand[j]) for j in range(tasks)]), policy(0.05)).verdict
    t = seq.fractions(looks)
    levels = seq.look_levels(t, 0.05)
    order = rng.permutation(n)
    used = dict.fromkeys(range(tasks), 0)
    stopped: set[int] = set()
    for k in range(1, looks + 1):
        for j in used:
            if j not in stopped:
                used[j] = round(n * t[k - 1])
        take = {j: np.sort(order[:used[j]]) for j in used}
        out = compare_runs(run(*[fast_series(f"t{j}", base[j][take[j]]) for j in used]),
                           run(*[fast_series(f"t{j}", cand[j][take[j]]) for j in used]), policy(float(levels[k - 1])))
        decision = seq.decide(out, k, t, 0.05)
        if decision.decision != "continue":
            return fixed == "fail", decision.decision == "fail", sum(used.values()) / (tasks * n)
        stopped |= {int(name[1:]) for name in decision.done_tasks}
    raise AssertionError("the last look decides")


def synthetic(looks: int, trials: int, per_item_s: float) -> None:
    tasks, n = 10, 2000
    print(f"\nsynthetic suite: {tasks} tasks x {n:,} right/wrong items, flips 3%, margin 0.01, {looks} looks, "
          f"{trials} runs each")
    print(f"{'change':<22} {'fixed fails':>11} {'seq fails':>9} {'items used':>10} {'evaluation saved':>17}")
    rng = np.random.default_rng(2026)
    for label, drop in (("harmless", 0.0), ("3-point drop, 1 task", 0.03)):
        res = [_trial(rng, tasks, n, drop, 0.03, 0.01, looks) for _ in range(trials)]
        fixed = np.mean([r[0] for r in res])
        sequential = np.mean([r[1] for r in res])
        items = float(np.mean([r[2] for r in res]))
        saved = (1 - items) * tasks * n * per_item_s
        print(f"{label:<22} {fixed:11.3f} {sequential:9.3f} {items:10.0%} {saved:12.0f} s/run"
              f"{'' if per_item_s else ' (no per-item time measured)'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--looks", type=int, default=3)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--skip-demo", action="store_true")
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    found: dict[str, float] = {}
    if not args.skip_demo:
        with tempfile.TemporaryDirectory(prefix="gk-seq-") as scratch:
            found = demo(args.looks, Path(scratch))
    synthetic(args.looks, args.trials, found.get("per_item_s", 0.0))
    if args.record and found:
        figures.record("benchmarks/sequential.py", {
            "sequential_demo": (
                f"the regressed checkpoint fails at look {found['regressed_look']:.0f} on "
                f"{found['regressed_items']:.0%} of the items ({found['regressed_wall']:.2f}x the fixed gate's wall "
                f"time), the harmless one passes at look {found['harmless_look']:.0f} on {found['harmless_items']:.0%} "
                f"({found['harmless_wall']:.2f}x)", found["regressed_items"]),
        }, note=f"examples/gatekeeper.yaml, {args.looks} looks, CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
