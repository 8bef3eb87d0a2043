#!/usr/bin/env python3
"""The nightly slide (issue #56.6): on which night do the fixed and the sequential gate catch it?

    python benchmarks/nightly_slide.py [--nights 5] [--step 0.012] [--group-share DEFAULT|0]

The demo's drift checkpoints (scripts/make_drift_checkpoints.py: night k loses the capitals
answers of night k-1 and a few more) gated night after night, as a nightly workflow with
promote-on-green does, along two chains that each keep their own baseline store:

- fixed: ``run`` every item, ``gate --run``; a green night's run is promoted;
- sequential: ``gate --sequential --out DIR`` (looks until every task stops); a green night is
  finished with ``run --complete DIR`` and that completed run is promoted (what
  docs/baselines.md tells a sequential nightly to do).

Both chains start from the demo's recorded baseline (the anchor). Each night prints both
verdicts (regressed against the night before, drift against the anchor), the capitals row's
change and p-value, and for the sequential chain the look it stopped at and the items it read.
The first red night of each chain is the figure docs/statistics.md quotes. About 4 minutes on 2
CPU cores (each night is one full run and up to four looks plus the rest of the items).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1",
       "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "GITHUB_ACTOR": "nightly-slide"}
CAPITALS = ("demo_capitals_mc", "acc")
FRESH = shutil.ignore_patterns("checkpoints", "*.trend.jsonl", "*.anchor.json.gz", "history", "__pycache__")


def _gk(*args: str, cwd: Path, expect: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "gatekeeper", *args], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=900)
    if proc.returncode not in expect:
        sys.exit(f"gatekeeper {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return proc


def project(root: Path, group_share: str) -> Path:
    """A copy of the demo suite and its recorded baseline, with nothing another run left."""
    shutil.copytree(ROOT / "examples", root / "examples", ignore=FRESH)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    suite = root / "examples" / "gatekeeper.yaml"
    if group_share != "DEFAULT":
        suite.write_text(suite.read_text().replace("  correction: holm\n",
                                                   f"  correction: holm\n  group_share: {group_share}\n"))
    return root / "examples"


def _capitals(report: dict) -> str:
    rows = [c for c in report["comparisons"] if (c["task"], c["metric"]) == CAPITALS and c["filter"] == "none"]
    if not rows:
        return "capitals not compared"
    row = rows[0]
    p = row.get("p_adjusted", row.get("p_value"))
    return f"capitals {row['delta']:+.3f} (p {p:.3g})" if p is not None else f"capitals {row['delta']:+.3f}"


def _verdict(report: dict) -> str:
    """The verdict, and the capitals row's change since the anchor once there is one."""
    anchor = report.get("anchor") or {}
    rows = [c for c in anchor.get("comparisons", []) if (c["task"], c["metric"]) == CAPITALS and c["filter"] == "none"]
    since = f" (capitals {rows[0]['delta']:+.3f} since the anchor)" if rows else ""
    return f"{report['verdict']}{since}"


def fixed_night(proj: Path, model: Path, work: Path) -> tuple[bool, str]:
    run = work / "run"
    _gk("run", "--suite", "gatekeeper.yaml", "--model", str(model), "--out", str(run), cwd=proj)
    proc = _gk("gate", "--suite", "gatekeeper.yaml", "--run", str(run), "--json", str(work / "report.json"),
               cwd=proj, expect=(0, 1))
    report = json.loads((work / "report.json").read_text())
    if proc.returncode == 0:
        _gk("baseline", "promote", str(run), "--suite", "gatekeeper.yaml", cwd=proj)
    return proc.returncode == 1, f"{_verdict(report)}; {_capitals(report)}"


def sequential_night(proj: Path, model: Path, work: Path) -> tuple[bool, str]:
    seq = work / "seq"
    proc = _gk("gate", "--suite", "gatekeeper.yaml", "--model", str(model), "--sequential", "--out", str(seq),
               "--json", str(work / "report.json"), cwd=proj, expect=(0, 1))
    report = json.loads((work / "report.json").read_text())
    looks = report.get("sequential") or {}
    read = (f"stopped at look {looks.get('stopped_at')} of {looks.get('looks')}, "
            f"{looks.get('evaluated')} of {looks.get('total')} items")
    if proc.returncode == 0:
        _gk("run", "--suite", "gatekeeper.yaml", "--complete", str(seq), cwd=proj)
        _gk("baseline", "promote", str(seq / "complete"), "--suite", "gatekeeper.yaml", cwd=proj)
    return proc.returncode == 1, f"{_verdict(report)}; {_capitals(report)}; {read}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nights", type=int, default=5)
    ap.add_argument("--step", type=float, default=None, help="make_drift_checkpoints.py's --step (its default)")
    ap.add_argument("--group-share", default="DEFAULT", help="the suite's policy.group_share (DEFAULT: unset)")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="gk-nightly-slide-"))
    try:
        make = [sys.executable, str(ROOT / "scripts" / "make_drift_checkpoints.py"), "--out", str(scratch / "nights"),
                "--nights", str(args.nights)] + (["--step", str(args.step)] if args.step is not None else [])
        made = subprocess.run(make, env=ENV, capture_output=True, text=True, timeout=900)
        if made.returncode != 0:
            sys.exit(made.stderr[-2000:])
        print(made.stdout.strip())
        chains = {"fixed": (fixed_night, project(scratch / "fixed", args.group_share)),
                  "sequential": (sequential_night, project(scratch / "sequential", args.group_share))}
        caught: dict[str, int | None] = dict.fromkeys(chains)
        for night in range(1, args.nights + 1):
            model = scratch / "nights" / f"night{night}"
            for name, (step, proj) in chains.items():
                if caught[name] is not None:
                    continue
                work = scratch / f"{name}-night{night}"
                work.mkdir()
                red, line = step(proj, model, work)
                print(f"night {night} {name:>10}: {line}", flush=True)
                if red:
                    caught[name] = night
        print("first red night: " + ", ".join(f"{k} {v if v is not None else 'none'}" for k, v in caught.items()))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
