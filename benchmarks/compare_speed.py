"""How fast is `gatekeeper compare` on a large suite, against the bootstrap a team would write?

Builds a synthetic 60-task suite in lm-eval 0.4.13's on-disk format (results_*.json +
samples_*.jsonl, hashes and task_hashes consistent, aggregates exact), with lines shaped like
lm-eval's multiple-choice lines (the prompt once per choice, the loglikelihoods, the doc: about
1.8 KB a line): 100,000 items in total by default, 10% of them in ratio-of-sums metrics
(loglikelihood_rolling: word/byte perplexity, bits per byte), the rest right/wrong (acc). Then,
in the same run:

  A1. `gatekeeper compare BASE_RUN CAND_RUN --resamples 10000` as a subprocess (the whole
      command: interpreter start, reading both lm-eval runs, statistics, snippets, reports);
  A2. the realistic gate: the baseline stored as a gatekeeper baseline file
      (`store.save_baseline`) against the candidate run dir;
  parts: the same compare in one process, timed stage by stage (imports, reading both sides,
      statistics, snippets, reports);
  B.  lm-eval's `bootstrap_stderr` with the same number of resamples on the same data (one call
      per task and metric on the candidate run: lm-eval's own per-run stderr, not even paired);
  C.  the anchor: the plain paired bootstrap a team would write itself (numpy, in this process,
      data already in memory: resample item indices, recompute both runs' aggregates, per task
      and metric; the approach of paired-evalkit and similar tools), same number of resamples.

Each gatekeeper figure is the best of 3 runs: wall, CPU (user+sys of the subprocess, which is
what to trust on a shared machine) and peak RSS of that process. The subprocesses run with
bytecode written and read (as in the action's image, where pip compiles it at install), after
one warm-up run. Ratios are against anchor C measured in the same run. Goals on 2 cores
(issue #39): C/A >= 3, peak RSS at most half of the previous reader's, cost linear in items.

Usage: python benchmarks/compare_speed.py [--items N] [--resamples 10000] [--lmeval-iters N | --no-lmeval]
                                         [--keep DIR] [--confusion] [--groups N] [--against DIR] [--record]
       python benchmarks/compare_speed.py --scale     A1, parts and C at 10k, 100k and 1M items
`--lmeval-iters` runs lm-eval with fewer resamples and extrapolates linearly (it says so).
`--confusion`: 20% of the items are in two-choice tasks that also report f1 and mcc
(matthews_corrcoef), tested through per-item confusion counts.
`--groups N`: the acc tasks in N lm-eval groups under one outer group; every group's aggregate is
gated too (issue #24: run with and without it to compare wall time and peak memory).
`--against DIR`: also time the `gatekeeper compare` of another checkout (e.g. a git worktree of
an older commit) on the same files, for before/after figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import figures as figures_mod  # noqa: E402

N_TASKS, N_ITEMS, RATIO_SHARE = 60, 100_000, 0.10
CONFUSION_SHARE = 0.0  # --confusion: 0.20
GROUPS = 0  # --groups N: the acc tasks in N lm-eval groups under one outer group (issue #24)
TS = "2026-01-01T00-00-00.000000"
_FILLER = ("Which of the following best explains the observation described in the passage above, given "
           "the conditions stated in the second paragraph and the measurements reported in the table?")
_CHOICES = ("A", "B", "C", "D")
RATIO_METRICS = {"word_perplexity": "weighted_perplexity", "byte_perplexity": "weighted_perplexity",
                 "bits_per_byte": "bits_per_byte"}


def _sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def _layout() -> list[tuple[str, str, int]]:
    """(task, kind, n_items): 6 ratio tasks holding 10% of the items, 54 acc tasks the rest."""
    n_ratio_tasks = round(N_TASKS * RATIO_SHARE)
    ratio_items = int(N_ITEMS * RATIO_SHARE)
    out = [(f"ppl_{i:02d}", "ratio", ratio_items // n_ratio_tasks) for i in range(n_ratio_tasks)]
    n_conf_tasks = round(N_TASKS * CONFUSION_SHARE)
    conf_items = int(N_ITEMS * CONFUSION_SHARE)
    out += [(f"cls_{i:02d}", "confusion", conf_items // n_conf_tasks) for i in range(n_conf_tasks)]
    n_mc = N_TASKS - n_ratio_tasks - n_conf_tasks
    per = (N_ITEMS - ratio_items - conf_items) // n_mc
    out += [(f"mc_{i:02d}", "mean", per) for i in range(n_mc)]
    return out


def _write_run(root: Path, name: str, data: dict[str, dict[str, np.ndarray]]) -> Path:
    model_dir = root / name / "bench__model"
    model_dir.mkdir(parents=True)
    results, configs, versions, nshot, hib, nsamp, task_hashes = {}, {}, {}, {}, {}, {}, {}
    for task, cols in data.items():
        n = len(cols["ids"])
        kind = "ratio" if "ll" in cols else "mean"
        lines, joined = [], []
        entry = {"alias": task, "name": task, "sample_len": n}
        for i in range(n):
            doc = {"question": f"{task} item {i}: {_FILLER}", "choices": list(_CHOICES), "answer": i % 4}
            dh = _sha(json.dumps(doc, indent=2, ensure_ascii=False))
            ph, th = _sha(f"prompt {task} {i}"), _sha(f"target {task} {i}")
            joined.append(dh + ph + th)
            # lm-eval's multiple-choice line: the prompt once per choice, one loglikelihood each
            prompt = f"Question: {doc['question']}\nAnswer:"
            lls = [[round(-1.0 - 0.37 * k - (i % 7) * 0.11, 6), k == 0] for k in range(4)]
            line = {"doc_id": i, "doc": doc, "target": i % 4,
                    "arguments": {f"gen_args_{k}": {"arg_0": prompt, "arg_1": f" {c}"} for k, c in enumerate(_CHOICES)},
                    "resps": [[[str(ll), str(g)]] for ll, g in lls], "filtered_resps": [[ll, g] for ll, g in lls],
                    "filter": "none", "doc_hash": dh, "prompt_hash": ph, "target_hash": th}
            if "gold" in cols:
                g, p = int(cols["gold"][i]), int(cols["pred"][i])
                line.update(metrics=["acc", "f1", "mcc"], acc=float(cols["acc"][i]), f1=[g, p], mcc=[g, p])
            elif kind == "mean":
                line.update(metrics=["acc"], acc=float(cols["acc"][i]))
            else:
                ll, w, b = float(cols["ll"][i]), int(cols["words"][i]), int(cols["bytes"][i])
                line.update(metrics=list(RATIO_METRICS), word_perplexity=[ll, w], byte_perplexity=[ll, b],
                            bits_per_byte=[ll, b])
            lines.append(json.dumps(line))
        (model_dir / f"samples_{task}_{TS}.jsonl").write_text("\n".join(lines) + "\n")
        task_hashes[task] = _sha("".join(joined))
        if kind == "mean":
            entry["acc,none"] = sum(cols["acc"].tolist()) / n
            entry["acc_stderr,none"] = 0.0
            metric_list = [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}]
            hib[task] = {"acc": True}
            output_type = "multiple_choice"
            if "gold" in cols:  # f1 and mcc exactly as lm-eval (sklearn) computes them
                from gatekeeper.results.metrics import kind_named

                pairs = np.column_stack([cols["gold"], cols["pred"]])
                for metric, agg in (("f1", "f1"), ("mcc", "matthews_corrcoef")):
                    entry[f"{metric},none"] = kind_named("confusion").aggregate(agg, pairs)
                    metric_list.append({"metric": metric, "aggregation": agg, "higher_is_better": True})
                    hib[task][metric] = True
        else:
            ll_sum = float(np.sum(cols["ll"]))
            entry["word_perplexity,none"] = math.exp(-ll_sum / float(np.sum(cols["words"])))
            entry["byte_perplexity,none"] = math.exp(-ll_sum / float(np.sum(cols["bytes"])))
            entry["bits_per_byte,none"] = -ll_sum / float(np.sum(cols["bytes"])) / math.log(2)
            metric_list = [{"metric": m, "aggregation": a, "higher_is_better": False} for m, a in RATIO_METRICS.items()]
            hib[task] = dict.fromkeys(RATIO_METRICS, False)
            output_type = "loglikelihood_rolling"
        results[task] = entry
        configs[task] = {"task": task, "output_type": output_type, "num_fewshot": 0, "metric_list": metric_list,
                         "metadata": {"version": 1.0}}
        versions[task], nshot[task], nsamp[task] = 1.0, 0, {"original": n, "effective": n}
    groups, group_subtasks = _groups(data, results)
    doc = {"results": results, "groups": groups, "group_subtasks": {**{t: [] for t in data}, **group_subtasks},
           "configs": configs,
           "versions": versions, "n-shot": nshot, "higher_is_better": hib, "n-samples": nsamp,
           "config": {"model": "hf", "model_args": {"pretrained": name}, "batch_size": 16, "limit": None,
                      "random_seed": 0, "numpy_seed": 1234, "torch_seed": 1234, "fewshot_seed": 1234},
           "lm_eval_version": "0.4.13", "task_hashes": task_hashes, "model_name": name, "date": 0.0}
    (model_dir / f"results_{TS}.json").write_text(json.dumps(doc))
    return root / name


def _groups(data: dict[str, dict[str, np.ndarray]], results: dict) -> tuple[dict, dict]:
    """--groups N: the acc tasks cut into N groups, all N in one outer group, each with lm-eval's
    size-weighted acc (the mean over its items), written as lm-eval writes them."""
    if not GROUPS:
        return {}, {}
    mc = sorted(t for t in data if t.startswith("mc_"))
    inner = {f"grp_{g}": mc[g::GROUPS] for g in range(GROUPS)}
    groups, subtasks = {}, {}
    for name, leaves in [*inner.items(), ("grp_all", mc)]:
        n = sum(len(data[t]["acc"]) for t in leaves)
        value = sum(float(np.sum(data[t]["acc"])) for t in leaves) / n
        groups[name] = {"alias": name, "name": name, "sample_len": n, "acc,none": value, "acc_stderr,none": "N/A",
                        "sample_count": {"acc,none": n}}
        subtasks[name] = leaves
    subtasks["grp_all"] = list(inner)
    results.update(groups)
    return groups, subtasks


def make_suite(root: Path, seed: int = 0) -> tuple[Path, Path, dict, dict]:
    rng = np.random.default_rng(seed)
    base, cand = {}, {}
    for task, kind, n in _layout():
        ids = np.arange(n)
        if kind == "confusion":
            gold = rng.integers(0, 2, n)
            pb = np.where(rng.random(n) < 0.8, gold, 1 - gold)
            redraw = np.where(rng.random(n) < 0.8, gold, 1 - gold)
            pc = np.where(rng.random(n) < 0.10, redraw, pb)  # 10% of items answered afresh: noise
            base[task] = {"ids": ids, "acc": (pb == gold).astype(float), "gold": gold, "pred": pb}
            cand[task] = {"ids": ids, "acc": (pc == gold).astype(float), "gold": gold, "pred": pc}
        elif kind == "mean":
            b = (rng.random(n) < 0.6).astype(float)
            flip = rng.random(n) < 0.10  # 10% of items flip, both ways: noise
            c = np.where(flip, 1 - b, b)
            base[task], cand[task] = {"ids": ids, "acc": b}, {"ids": ids, "acc": c}
        else:
            words = rng.integers(20, 200, n)
            nbytes = words * 6
            ll = -rng.gamma(4.0, words / 4.0)
            base[task] = {"ids": ids, "ll": ll, "words": words, "bytes": nbytes}
            cand[task] = {"ids": ids, "ll": ll * rng.normal(1.0, 0.02, n), "words": words, "bytes": nbytes}
    return _write_run(root, "base", base), _write_run(root, "cand", cand), base, cand


def _env(root: Path | None = None) -> dict[str, str]:
    """The subprocesses' environment: bytecode written and read, as in the action's image."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if root is not None:
        env["PYTHONPATH"] = str(root)
    return env


@dataclass
class Measured:
    wall: float
    cpu: float
    rss_mib: float


def time_gatekeeper(base: Path, cand: Path, resamples: int, out: Path, root: Path | None = None) -> Measured:
    """One whole `gatekeeper compare` subprocess (``root``: another checkout's gatekeeper)."""
    cmd = [sys.executable, "-c", _PEAK, "compare", str(base), str(cand), "--resamples", str(resamples),
           "--json", str(out / "report.json"), "--markdown", str(out / "report.md")]
    measured, proc = _wait_measured(cmd, root)
    if proc.returncode not in (0, 1):
        sys.exit(f"gatekeeper compare failed (exit {proc.returncode}):\n{proc.stderr}")
    return measured


# The child's own peak RSS. Its rusage would not do: Linux carries the high-water mark across
# fork and exec, so a child of this process (which holds the synthetic suite) starts "at" our size.
# VmHWM belongs to the memory map that exec made fresh.
_PEAK = """
import atexit, runpy, sys
def peak():
    with open("/proc/self/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    sys.stderr.write(f"\\nVmHWM {kib}\\n")
atexit.register(peak)
sys.argv[0] = "gatekeeper"
runpy.run_module("gatekeeper", run_name="__main__", alter_sys=True)
"""


def _wait_measured(cmd: list[str], root: Path | None) -> tuple[Measured, subprocess.CompletedProcess]:
    """Runs ``cmd``, reaping it with os.wait4 so its own CPU time is read; RSS from its VmHWM line."""
    import threading

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(root),
                            cwd=root or Path(__file__).resolve().parent.parent)
    chunks: dict[str, str] = {}
    readers = [threading.Thread(target=lambda n=n, f=f: chunks.__setitem__(n, f.read()))
               for n, f in (("out", proc.stdout), ("err", proc.stderr))]
    for t in readers:
        t.start()
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    for t in readers:
        t.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    done = subprocess.CompletedProcess(cmd, proc.returncode, chunks.get("out", ""), chunks.get("err", ""))
    peaks = [line.split()[1] for line in done.stderr.splitlines() if line.startswith("VmHWM ")]
    rss = int(peaks[-1]) / 1024 if peaks else float("nan")
    return Measured(wall, ru.ru_utime + ru.ru_stime, rss), done


_PARTS = """
import json, sys, time
t0 = time.perf_counter()
import numpy
from gatekeeper import report
from gatekeeper.baseline.store import load_any
from gatekeeper.compare.compare import attach_snippets, compare_runs
from gatekeeper.suite.policy import Policy
t1 = time.perf_counter()
base, cand = load_any(sys.argv[1]), load_any(sys.argv[2])
t2 = time.perf_counter()
outcome = compare_runs(base, cand, Policy(resamples=int(sys.argv[3])), seed=0)
t3 = time.perf_counter()
attach_snippets(outcome)
t4 = time.perf_counter()
json.dumps(report.to_json(outcome)); report.render_markdown(outcome); report.render_terminal(outcome)
t5 = time.perf_counter()
# Not a stage: would reading the two sides in two forked processes pay? (Threads do not: the
# decoding holds the GIL.)
import multiprocessing
t6 = time.perf_counter()
with multiprocessing.get_context("fork").Pool(2) as pool:
    pool.map(load_any, sys.argv[1:3])
t7 = time.perf_counter()
print(json.dumps({"imports": t1 - t0, "reading": t2 - t1, "statistics": t3 - t2, "snippets": t4 - t3,
                  "reports": t5 - t4, "reading in 2 processes": t7 - t6}))
"""


def time_parts(base: Path, cand: Path, resamples: int, root: Path | None = None) -> dict[str, float]:
    """The compare's stages, timed in one process (best of 3 per stage)."""
    runs = []
    for _ in range(3):
        _, proc = _wait_measured([sys.executable, "-c", _PARTS, str(base), str(cand), str(resamples)], root)
        if proc.returncode != 0:
            sys.exit(f"parts failed:\n{proc.stderr}")
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {k: min(r[k] for r in runs) for k in runs[0]}


def save_baseline_file(base: Path, root: Path) -> Path:
    from gatekeeper.baseline import store
    from gatekeeper.results import reader as results

    path = root / "baseline.json.gz"
    store.save_baseline(results.load_run(base), path, suite_name="bench", suite_hash=None)
    return path


def best_of(n: int, base: Path, cand: Path, resamples: int, out: Path, root: Path | None = None) -> list[Measured]:
    """``n`` timed runs after one warm-up (bytecode written, files in the page cache)."""
    time_gatekeeper(base, cand, resamples, out, root)
    return [time_gatekeeper(base, cand, resamples, out, root) for _ in range(n)]


def best(runs: list[Measured]) -> Measured:
    return Measured(min(r.wall for r in runs), min(r.cpu for r in runs), min(r.rss_mib for r in runs))


def time_lmeval(cand: dict, iters: int) -> tuple[float, float]:
    """(wall, CPU) of lm-eval's bootstrap_stderr; CPU counts its multiprocessing pool too."""
    from lm_eval.api.metrics import bits_per_byte, bootstrap_stderr, mean, weighted_perplexity

    cpu0, t0 = time.process_time() + _children_cpu(), time.perf_counter()
    from lm_eval.api.metrics import f1_score, matthews_corrcoef

    for cols in cand.values():
        if "gold" in cols:
            pairs = list(zip(cols["gold"].tolist(), cols["pred"].tolist(), strict=True))
            bootstrap_stderr(f1_score, pairs, iters)
            bootstrap_stderr(matthews_corrcoef, pairs, iters)
        if "acc" in cols:
            bootstrap_stderr(mean, cols["acc"].tolist(), iters)
        else:
            ll = cols["ll"].tolist()
            bootstrap_stderr(weighted_perplexity, list(zip(ll, cols["words"].tolist(), strict=True)), iters)
            bootstrap_stderr(weighted_perplexity, list(zip(ll, cols["bytes"].tolist(), strict=True)), iters)
            bootstrap_stderr(bits_per_byte, list(zip(ll, cols["bytes"].tolist(), strict=True)), iters)
    return time.perf_counter() - t0, time.process_time() + _children_cpu() - cpu0


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def time_naive_paired_bootstrap(base: dict, cand: dict, resamples: int, seed: int = 0) -> tuple[float, float]:
    """(wall, CPU) of anchor C: per task and metric, ``resamples`` draws of item indices and both
    runs' aggregates recomputed from the drawn items (chunks of 500 draws bound the memory)."""
    rng = np.random.default_rng(seed)
    cpu0, t0 = time.process_time(), time.perf_counter()

    def draws(n: int, stat) -> None:
        for start in range(0, resamples, 500):
            idx = rng.integers(0, n, size=(min(500, resamples - start), n))
            stat(idx)

    for task, b in base.items():
        c, n = cand[task], len(b["ids"])
        if "acc" in b:
            draws(n, lambda i, b=b, c=c: c["acc"][i].mean(1) - b["acc"][i].mean(1))
        if "gold" in b:
            for _ in ("f1", "mcc"):  # confusion counts per draw, both runs
                draws(n, lambda i, b=b, c=c: ((b["pred"][i] == 1) & (b["gold"][i] == 1)).sum(1)
                      - ((c["pred"][i] == 1) & (c["gold"][i] == 1)).sum(1))
        if "ll" in b:
            for count in ("words", "bytes", "bytes"):  # word/byte perplexity, bits per byte
                draws(n, lambda i, b=b, c=c, k=count: np.exp(-c["ll"][i].sum(1) / c[k][i].sum(1))
                      - np.exp(-b["ll"][i].sum(1) / b[k][i].sum(1)))
    return time.perf_counter() - t0, time.process_time() - cpu0


def _suite(root: Path) -> tuple[Path, Path, dict, dict]:
    t0 = time.perf_counter()
    base, cand_dir, base_cols, cand = make_suite(root)
    size = samples_bytes(root)
    print(f"suite: {N_TASKS} tasks, {N_ITEMS:,} items ({RATIO_SHARE:.0%} ratio-of-sums, "
          f"{CONFUSION_SHARE:.0%} two-choice with f1 and mcc"
          + (f", the acc tasks in {GROUPS} groups under one more" if GROUPS else "") + "), "
          f"samples files {size / 2**20:.0f} MiB for both runs, built in {time.perf_counter() - t0:.0f} s")
    return base, cand_dir, base_cols, cand


def samples_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("samples_*") if p.is_file())


def _say(label: str, runs: list[Measured], report: dict | None = None) -> None:
    b = best(runs)
    extra = f"; {len(report['comparisons'])} comparisons, verdict {report['verdict']}" if report else ""
    print(f"{label}: wall {b.wall:.2f} s, CPU {b.cpu:.2f} s, peak RSS {b.rss_mib:.0f} MiB (best of {len(runs)}; "
          f"walls {', '.join(f'{r.wall:.2f}' for r in runs)}){extra}")


def _say_parts(label: str, parts: dict[str, float], samples_mib: float | None = None) -> None:
    stages = {k: v for k, v in parts.items() if k != "reading in 2 processes"}
    print(f"{label} parts: " + ", ".join(f"{k} {v:.2f} s" for k, v in stages.items())
          + f" (sum {sum(stages.values()):.2f} s)")
    if samples_mib:
        print(f"{label} reading: {samples_mib / parts['reading']:.0f} MiB/s of samples "
              f"({parts['reading'] / samples_mib * 121e6 / 2**20:.2f} s per 121 MB, the issue's one side); "
              f"both sides in 2 forked processes: {parts['reading in 2 processes']:.2f} s")


def scale(args: argparse.Namespace) -> None:
    """A1, its parts and anchor C at 10k, 100k and 1M items: how the cost grows."""
    global N_ITEMS
    rows = []
    for n in (10_000, 100_000, 1_000_000):
        N_ITEMS = n
        root = Path(tempfile.mkdtemp(prefix=f"gk-bench-{n}-"))
        base, cand_dir, base_cols, cand = _suite(root)
        runs = best_of(1 if n >= 1_000_000 else 3, base, cand_dir, args.resamples, root)
        _say(f"A1 {n:>9,} items", runs, json.loads((root / "report.json").read_text()))
        parts = time_parts(base, cand_dir, args.resamples)
        if parts:
            _say_parts(f"   {n:>9,} items", parts, samples_bytes(root) / 2**20)
        naive, _ = time_naive_paired_bootstrap(base_cols, cand, args.resamples)
        print(f"C  {n:>9,} items: wall {naive:.2f} s")
        rows.append((n, best(runs), naive))
        subprocess.run(["rm", "-rf", str(root)], check=False)
    print("\nitems       A1 wall   per 100k items   A1 RSS    C wall   C/A1")
    for n, m, naive in rows:
        print(f"{n:>9,}  {m.wall:7.2f} s  {m.wall / n * 1e5:9.2f} s   {m.rss_mib:6.0f} MiB  {naive:7.2f} s  "
              f"{naive / m.wall:4.1f}x")
    (_, mid, _), (_, big, _) = rows[1], rows[2]
    growth = big.wall / mid.wall
    print(f"goal: linear cost from 100k to 1M items, i.e. at most 10x the time: {growth:.1f}x")
    if args.record:
        figures_mod.record("benchmarks/compare_speed.py", {
            "compare_wall_1m": (f"{big.wall:.1f} s", big.wall),
            "compare_growth_1m": (f"{growth:.1f}×", growth),
        }, note=f"--scale, {args.resamples:,} resamples")


def main() -> None:
    global CONFUSION_SHARE, GROUPS, N_ITEMS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=N_ITEMS)
    ap.add_argument("--resamples", type=int, default=10_000)
    ap.add_argument("--lmeval-iters", type=int, default=None,
                    help="run lm-eval with this many resamples and extrapolate to --resamples")
    ap.add_argument("--no-lmeval", action="store_true", help="skip B (lm-eval's bootstrap)")
    ap.add_argument("--keep", type=Path, help="write the synthetic runs here and keep them")
    ap.add_argument("--confusion", action="store_true", help="20%% of the items in f1/mcc tasks")
    ap.add_argument("--groups", type=int, default=0, metavar="N",
                    help="put the acc tasks in N lm-eval groups under one outer group (gated too)")
    ap.add_argument("--against", type=Path, metavar="DIR", help="also time this checkout's gatekeeper")
    ap.add_argument("--scale", action="store_true", help="A1, parts and C at 10k, 100k and 1M items")
    ap.add_argument("--record", action="store_true", help="write the figures to benchmarks/figures.json")
    args = ap.parse_args()
    CONFUSION_SHARE = 0.20 if args.confusion else 0.0
    GROUPS = max(0, args.groups)
    N_ITEMS = args.items
    print(f"cores: {figures_mod.cores()}")
    if args.scale:
        scale(args)
        return
    root = args.keep or Path(tempfile.mkdtemp(prefix="gk-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    base, cand_dir, base_cols, cand = _suite(root)
    baseline_file = save_baseline_file(base, root)
    print(f"baseline file: {baseline_file.stat().st_size / 2**20:.1f} MiB ({baseline_file.name})")

    figures: dict[str, Measured] = {}
    for label, left in (("A1 run vs run          ", base), ("A2 baseline file vs run", baseline_file)):
        runs = best_of(3, left, cand_dir, args.resamples, root)
        figures[label] = best(runs)
        _say(label, runs, json.loads((root / "report.json").read_text()))
    parts = time_parts(base, cand_dir, args.resamples)
    _say_parts("A1", parts, samples_bytes(root) / 2**20)
    if args.against:
        runs = best_of(3, base, cand_dir, args.resamples, root, root=args.against.resolve())
        figures["A0 run vs run, --against"] = best(runs)
        _say(f"A0 run vs run, {args.against}", runs, json.loads((root / "report.json").read_text()))
        _say_parts("A0", time_parts(base, cand_dir, args.resamples, root=args.against.resolve()),
                   samples_bytes(root) / 2**20)

    naive_wall, naive_cpu = time_naive_paired_bootstrap(base_cols, cand, args.resamples)
    print(f"C  plain numpy paired bootstrap, {args.resamples:,} resamples, data in memory: wall {naive_wall:.2f} s, "
          f"CPU {naive_cpu:.2f} s")
    lm_wall = lm_cpu = None
    if not args.no_lmeval:
        lm_wall, lm_cpu = _lmeval(cand, args)
    for label, m in figures.items():
        name = label.split()[0]
        lm = f"B/{name}: wall {lm_wall / m.wall:.1f}x, CPU {lm_cpu / m.cpu:.1f}x; " if lm_wall else ""
        print(f"ratio {lm}C/{name}: wall {naive_wall / m.wall:.1f}x, CPU {naive_cpu / m.cpu:.1f}x")
    print("goals: C/A >= 3x on 2 cores (issue #39), B/A >= 20x; peak RSS at most half the previous reader's")
    if args.record:
        tag = "_confusion" if args.confusion else ""
        a1, a2 = figures["A1 run vs run          "], figures["A2 baseline file vs run"]
        found = {
            f"compare_wall{tag}": (f"{a2.wall:.1f} s", a2.wall),
            f"naive_ratio{tag}": (f"{naive_wall / a1.wall:.1f}×", naive_wall / a1.wall),
        }
        if lm_wall is not None:
            found[f"lmeval_bootstrap{tag}"] = (f"~{lm_wall:.0f} s", lm_wall)
        if not tag:
            found["compare_rss"] = (f"{a1.rss_mib:.0f} MiB", a1.rss_mib)
            found["compare_read"] = (f"{parts['reading']:.2f} s", parts["reading"])
        figures_mod.record("benchmarks/compare_speed.py", found,
                           note=f"{N_ITEMS:,} items, {args.resamples:,} resamples, {CONFUSION_SHARE:.0%} f1/mcc")


def _lmeval(cand: dict, args: argparse.Namespace) -> tuple[float, float]:
    if args.lmeval_iters is None or args.lmeval_iters >= args.resamples:
        lm_wall, lm_cpu = time_lmeval(cand, args.resamples)
        how = "measured"
    else:
        # Two sizes give lm-eval's fixed cost (a process pool per call) and its cost per
        # resample; only the latter scales. Its pool spreads chunks of 1000 resamples over the
        # cores, so at full size its wall can be up to `cores` times lower than its CPU: the
        # wall figure below assumes that best case for lm-eval.
        n1 = args.lmeval_iters
        w1, c1 = time_lmeval(cand, n1)
        w2, c2 = time_lmeval(cand, 2 * n1)
        per = max(c2 - c1, 0.0) / n1
        fixed = max(c1 - per * n1, 0.0)
        lm_cpu = fixed + per * args.resamples
        lm_wall = fixed + per * args.resamples / figures_mod.cores()
        how = (f"extrapolated from {n1:,} and {2 * n1:,} resamples (CPU {c1:.2f} s and {c2:.2f} s): "
               f"fixed {fixed:.2f} s + {per * 1000:.3f} s per 1000 resamples; wall assumes all "
               f"{figures_mod.cores()} cores busy")
    print(f"B  lm-eval bootstrap_stderr, {args.resamples:,} resamples: wall {lm_wall:.2f} s, "
          f"CPU {lm_cpu:.2f} s ({how})")
    return lm_wall, lm_cpu


if __name__ == "__main__":
    main()
