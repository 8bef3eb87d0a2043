#!/usr/bin/env python3
"""What a new user waits for: README's two commands on a fresh clone in an empty folder.

    python benchmarks/first_run.py [--tests] [--record]

In a temporary folder, on a clone of this repository (HEAD plus uncommitted changes):

1. ``bash scripts/setup.sh eval``: the first set-up, a new .venv (pip's own cache as it is on this
   machine: the output says whether it was empty);
2. ``bash scripts/demo.sh regressed``: the gate on the demo, set-up already done: the first run
   (which writes the bytecode of what it imports: the set-up compiles none) and the median of 3;
3. ``bash scripts/setup.sh eval`` again: the set-up when nothing changed (median of 3);
4. with ``--tests``: ``bash scripts/test.sh``, the README's test command (what .ci/run runs),
   wall and CPU (user + sys of everything it started).

Prints each figure; ``--record`` writes them to benchmarks/figures.json for README.md.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import figures  # noqa: E402
from tests.fresh_clone import fresh_clone, user_env  # noqa: E402


def timed(command: str, cwd: Path, expect: int = 0) -> tuple[float, float, str]:
    """(wall s, CPU s of the command and its children, stdout) of a shell command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=user_env(), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != expect:
        sys.exit(f"`{command}` exited {proc.returncode}, expected {expect}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc.stdout


def pip_cache_state() -> str:
    proc = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True)
    folder = Path(proc.stdout.strip()) if proc.returncode == 0 else None
    if folder is None or not folder.is_dir():
        return "pip cache empty"
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    return f"pip cache {size / 2**20:.0f} MiB" if size > 2**20 else "pip cache empty"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--tests", action="store_true", help="also time the README's test command")
    ap.add_argument("--record", action="store_true", help="write the figures to benchmarks/figures.json")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="gk-first-run-"))
    found: dict[str, tuple[str, float]] = {}
    try:
        clone = fresh_clone(scratch / "clone")
        cache = pip_cache_state()
        print(f"machine: {figures.machine()}; {cache}")
        wall, cpu, out = timed("bash scripts/setup.sh eval", clone)
        torch_line = next((line for line in out.splitlines() if line.startswith("== setup: torch")), "")
        print(f"first set-up: {wall:.1f} s wall, {cpu:.1f} s CPU ({torch_line.removeprefix('== setup: ')})")
        found["setup_first"] = (f"{figures.seconds(wall)} ({cache.replace('pip cache', 'pip cache:')})", wall)

        demo = [timed("bash scripts/demo.sh regressed", clone, expect=1)[0] for _ in range(3)]
        gate = statistics.median(demo)
        print(f"demo gate (set-up done): median {gate:.1f} s of {', '.join(f'{w:.1f}' for w in demo)}")
        found["demo_gate"] = (f"{figures.seconds(gate)} on {figures.cores()} CPU cores", gate)
        found["demo_gate_first"] = (figures.seconds(demo[0]), demo[0])

        noop = statistics.median(timed("bash scripts/setup.sh eval", clone)[0] for _ in range(3))
        print(f"set-up with nothing to do: {noop:.2f} s")
        found["setup_noop"] = (f"{noop:.1f} s", noop)

        if args.tests:
            load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
            wall, cpu, out = timed("bash scripts/test.sh", clone)
            tail = out.strip().splitlines()[-1] if out.strip() else ""
            print(f"README's test command: {wall / 60:.1f} min wall, {cpu / 60:.1f} min CPU ({tail})")
            # A figure of fewer tests is not the suite's: only the opt-in slow tests may skip (the
            # container test skips where no Docker daemon answers, and takes a minute of CPU).
            skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
            print("\n".join(skipped))
            if args.record and any("GATEKEEPER_SLOW" not in line for line in skipped):
                sys.exit("not recorded: tests skipped that run on a complete set-up (above); start what they need")
            # Whether the machine was busy is part of the figure: the same suite takes longer under load.
            found["tests_wall"] = (f"{figures.seconds(wall)} wall ({figures.seconds(cpu)} of CPU) on "
                                   f"{figures.cores()} cores, load {load_before:.1f} before", wall)
        if args.record:
            figures.record("benchmarks/first_run.py", found)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
