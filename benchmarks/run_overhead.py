#!/usr/bin/env python3
"""Wall time of `gatekeeper run` against the plain `lm_eval` CLI on the same suite and model.

    python benchmarks/run_overhead.py [--suite FILE --model DIR] [--reps 2] [--no-cli]

Without --suite/--model it uses examples/gatekeeper.yaml + examples/checkpoints/base when they
exist, else a throwaway tiny GPT-2 and the runner test tasks (tests/fixtures/runner_tasks).
Both commands run as fresh subprocesses (imports included), alternating, offline, on the same
device; the script prints each wall time, the medians and their ratio.

Then the request cache (``gatekeeper run --cache DIR``): a cold run (empty cache) and a warm
re-run of the unchanged checkpoint, with the number of requests answered from the cache.
``--no-cli`` skips the lm_eval CLI comparison (the cache figures only).
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
from gatekeeper.suite.suite import load_suite  # noqa: E402

FALLBACK_SUITE = """\
name: overhead
lm_eval_version: "0.4.13"
include_path: {tasks}
model: {{dtype: float32, batch_size: 8}}
seeds: {{random: 1234, numpy: 1234, torch: 1234, fewshot: 1234}}
tasks:
  - name: rt_mc
  - name: rt_gen
  - name: rt_group
"""


def _tiny_model(out: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_runner import _make_model  # the same throwaway model the runner tests use

    return _make_model(out)


def _inputs(args: argparse.Namespace, scratch: Path) -> tuple[Path, str]:
    if args.suite and args.model:
        return Path(args.suite), args.model
    example_suite, example_model = ROOT / "examples" / "gatekeeper.yaml", ROOT / "examples" / "checkpoints" / "base"
    if example_suite.is_file() and example_model.is_dir():
        return example_suite, str(example_model)
    suite = scratch / "gatekeeper.yaml"
    suite.write_text(FALLBACK_SUITE.format(tasks=ROOT / "tests" / "fixtures" / "runner_tasks"))
    return suite, str(_tiny_model(scratch / "tiny"))


def _lm_eval_cmd(suite_path: Path, model: str, out: Path, device: str) -> list[str]:
    suite = load_suite(suite_path)
    shots = {t.num_fewshot for t in suite.tasks}
    if len(shots) > 1 or any(t.limit or t.repeats or t.gen_kwargs for t in suite.tasks):
        print("note: the suite has per-task settings the lm_eval CLI cannot express; the CLI runs defaults")
    s, m = suite.seeds, suite.model
    cmd = [sys.executable, "-m", "lm_eval", "run", "--model", "hf",
           "--model_args", f"pretrained={model},dtype={m['dtype']}",
           "--tasks", ",".join(suite.task_names), "--batch_size", str(m["batch_size"]),
           "--device", device, "--output_path", str(out), "--log_samples",
           "--seed", f"{s['random']},{s['numpy']},{s['torch']},{s['fewshot']}"]
    if suite.include_path:
        cmd += ["--include_path", str(suite.include_path)]
    if len(shots) == 1 and None not in shots:
        cmd += ["--num_fewshot", str(shots.pop())]
    return cmd


def _time(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU seconds of the child): CPU time is less sensitive to a busy machine."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _shown(path: Path) -> str:
    """A path as figures.json records it: relative to the repository, no machine's own folders."""
    try:
        return Path(path).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return Path(path).name


def _cache_figures(suite: Path, model: str, device: str, env: dict[str, str], scratch: Path,
                   record: bool = False) -> None:
    """Cold (empty cache) vs warm (everything cached) `gatekeeper run --cache`."""
    cache = scratch / "cache"
    walls = []
    for label in ("cold", "warm"):
        cmd = [sys.executable, "-m", "gatekeeper", "run", "--suite", str(suite), "--model", model,
               "--out", str(scratch / f"cache-{label}"), "--device", device, "--cache", str(cache)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
        walls.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
        hits = sum(int(line.split("request cache: ")[1].split()[0])
                   for line in proc.stdout.splitlines() if "answered from the cache" in line)
        print(f"request cache {label}: {walls[-1]:6.2f} s wall, {hits} requests answered from the cache")
    print(f"request cache: warm re-run {walls[1]:.2f} s vs cold {walls[0]:.2f} s "
          f"({100 * (1 - walls[1] / walls[0]):.0f}% saved)")
    if record:
        figures.record("benchmarks/run_overhead.py", {
            "cache_runs": (f"{walls[0]:.1f} s cold, {walls[1]:.1f} s warm, {hits:,} requests from the cache",
                           walls[1]),
        }, note=f"{_shown(suite)}, {_shown(Path(model))}, device {device}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite")
    ap.add_argument("--model")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--device", default=None, help="default: cuda if available else cpu")
    ap.add_argument("--no-cli", action="store_true", help="only the request-cache figures")
    ap.add_argument("--record", action="store_true", help="write the cache figures to benchmarks/figures.json")
    args = ap.parse_args()
    device = args.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": str(ROOT)}
    scratch = Path(tempfile.mkdtemp(prefix="gk-overhead-"))
    try:
        suite, model = _inputs(args, scratch)
        print(f"suite {suite}\nmodel {model}\ndevice {device}")
        gk_t, cli_t = [], []
        for rep in range(0 if args.no_cli else args.reps):
            gk_out, cli_out = scratch / f"gk{rep}", scratch / f"cli{rep}"
            gk = [sys.executable, "-m", "gatekeeper", "run", "--suite", str(suite), "--model", model,
                  "--out", str(gk_out), "--device", device]
            gk_t.append(_time(gk, env))
            cli_t.append(_time(_lm_eval_cmd(suite, model, cli_out, device), env))
            print(f"rep {rep + 1}: gatekeeper run {gk_t[-1][0]:6.2f} s wall {gk_t[-1][1]:6.2f} s CPU   "
                  f"lm_eval CLI {cli_t[-1][0]:6.2f} s wall {cli_t[-1][1]:6.2f} s CPU")
        for i, what in enumerate(("wall", "CPU") if gk_t else ()):
            g, c = statistics.median(t[i] for t in gk_t), statistics.median(t[i] for t in cli_t)
            print(f"median {what}: gatekeeper run {g:.2f} s, lm_eval CLI {c:.2f} s, ratio gatekeeper/CLI {g / c:.2f}")
        _cache_figures(suite, model, device, env, scratch, args.record)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
