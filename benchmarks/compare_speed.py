"""How fast is `gatekeeper compare` on a large suite, against lm-eval's own bootstrap?

Builds a synthetic 60-task suite in lm-eval 0.4.13's on-disk format (results_*.json +
samples_*.jsonl, hashes and task_hashes consistent, aggregates exact): 100,000 items in total,
10% of them in ratio-of-sums metrics (loglikelihood_rolling: word/byte perplexity, bits per
byte), the rest right/wrong (acc). Then, in the same run:

  A1. `gatekeeper compare BASE_RUN CAND_RUN --resamples 10000` as a subprocess (the whole
      command: interpreter start, reading both lm-eval runs, statistics, snippets, reports);
  A2. the realistic gate: the baseline stored as a gatekeeper baseline file
      (`store.save_baseline`) against the candidate run dir;
  B.  lm-eval's `bootstrap_stderr` with the same number of resamples on the same data (one call
      per task and metric on the candidate run: lm-eval's own per-run stderr, not even paired);
  C.  the plain paired bootstrap a team would write itself (numpy, in this process, data already
      in memory: resample item indices, recompute both runs' aggregates, per task and metric;
      the approach of paired-evalkit and similar tools), with the same number of resamples.

Each gatekeeper figure is the best of 3 runs, wall and CPU (user+sys of the subprocess, which
is what to trust on a shared machine). Prints the ratios B/A and C/A. Goal on 2 cores: A < 5 s
and B/A >= 20; C/A says how gatekeeper's whole command (reading, tests, MDE, reports) compares
with only the resampling loop a naive gate would run.
Usage: python benchmarks/compare_speed.py [--resamples 10000] [--lmeval-iters N] [--keep DIR] [--confusion]
                                         [--groups N]
`--lmeval-iters` runs lm-eval with fewer resamples and extrapolates linearly (it says so).
`--confusion`: 20% of the items are in two-choice tasks that also report f1 and mcc
(matthews_corrcoef), tested through per-item confusion counts.
`--groups N`: the acc tasks in N lm-eval groups under one outer group; every group's aggregate is
gated too (issue #24: run with and without it to compare wall time and peak memory).
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
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import figures as figures_mod  # noqa: E402

N_TASKS, N_ITEMS, RATIO_SHARE = 60, 100_000, 0.10
CONFUSION_SHARE = 0.0  # --confusion: 0.20
GROUPS = 0  # --groups N: the acc tasks in N lm-eval groups under one outer group (issue #24)
TS = "2026-01-01T00-00-00.000000"
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
            doc = {"q": f"{task} item {i}"}
            dh = _sha(json.dumps(doc, indent=2, ensure_ascii=False))
            ph, th = _sha(f"prompt {task} {i}"), _sha(f"target {task} {i}")
            joined.append(dh + ph + th)
            line = {"doc_id": i, "doc": doc, "target": "0", "arguments": {}, "resps": [], "filtered_resps": [],
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


def _child_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def time_gatekeeper(base: Path, cand: Path, resamples: int, out: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one whole `gatekeeper compare` subprocess."""
    cmd = [sys.executable, "-m", "gatekeeper", "compare", str(base), str(cand), "--resamples", str(resamples),
           "--json", str(out / "report.json"), "--markdown", str(out / "report.md")]
    cpu0, t0 = _child_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, _child_cpu() - cpu0
    if proc.returncode not in (0, 1):
        sys.exit(f"gatekeeper compare failed (exit {proc.returncode}):\n{proc.stderr}")
    return wall, cpu


def save_baseline_file(base: Path, root: Path) -> Path:
    from gatekeeper.baseline import store
    from gatekeeper.results import reader as results

    path = root / "baseline.json.gz"
    store.save_baseline(results.load_run(base), path, suite_name="bench", suite_hash=None)
    return path


def best_of(n: int, base: Path, cand: Path, resamples: int, out: Path) -> tuple[float, float, list]:
    runs = [time_gatekeeper(base, cand, resamples, out) for _ in range(n)]
    return min(w for w, _ in runs), min(c for _, c in runs), runs


def time_lmeval(cand: dict, iters: int) -> tuple[float, float]:
    """(wall, CPU) of lm-eval's bootstrap_stderr; CPU counts its multiprocessing pool too."""
    from lm_eval.api.metrics import bits_per_byte, bootstrap_stderr, mean, weighted_perplexity

    cpu0, t0 = time.process_time() + _child_cpu(), time.perf_counter()
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
    return time.perf_counter() - t0, time.process_time() + _child_cpu() - cpu0


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--resamples", type=int, default=10_000)
    ap.add_argument("--lmeval-iters", type=int, default=None,
                    help="run lm-eval with this many resamples and extrapolate to --resamples")
    ap.add_argument("--keep", type=Path, help="write the synthetic runs here and keep them")
    ap.add_argument("--confusion", action="store_true", help="20%% of the items in f1/mcc tasks")
    ap.add_argument("--groups", type=int, default=0, metavar="N",
                    help="put the acc tasks in N lm-eval groups under one outer group (gated too)")
    ap.add_argument("--record", action="store_true", help="write the figures to benchmarks/figures.json")
    args = ap.parse_args()
    global CONFUSION_SHARE, GROUPS
    CONFUSION_SHARE = 0.20 if args.confusion else 0.0
    GROUPS = max(0, args.groups)
    root = args.keep or Path(tempfile.mkdtemp(prefix="gk-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    base, cand_dir, base_cols, cand = make_suite(root)
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    print(f"suite: {N_TASKS} tasks, {N_ITEMS:,} items ({RATIO_SHARE:.0%} ratio-of-sums, "
          f"{CONFUSION_SHARE:.0%} two-choice with f1 and mcc"
          + (f", the acc tasks in {GROUPS} groups under one more" if GROUPS else "") + "), "
          f"{size / 2**20:.1f} MiB on disk per two runs, built in {time.perf_counter() - t0:.1f} s")
    print(f"cores: {os.cpu_count()}")

    baseline_file = save_baseline_file(base, root)
    print(f"baseline file: {baseline_file.stat().st_size / 2**20:.1f} MiB ({baseline_file.name})")

    figures = {}
    for label, left in (("A1 run vs run          ", base), ("A2 baseline file vs run", baseline_file)):
        wall, cpu, runs = best_of(3, left, cand_dir, args.resamples, root)
        figures[label] = (wall, cpu)
        report = json.loads((root / "report.json").read_text())
        print(f"{label}: wall {wall:.2f} s, CPU {cpu:.2f} s (best of 3; walls "
              f"{', '.join(f'{w:.2f}' for w, _ in runs)}); {len(report['comparisons'])} comparisons, "
              f"verdict {report['verdict']}")
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"peak RSS of a gatekeeper subprocess: {rss:.0f} MiB")

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
        lm_wall = fixed + per * args.resamples / (os.cpu_count() or 1)
        how = (f"extrapolated from {n1:,} and {2 * n1:,} resamples (CPU {c1:.2f} s and {c2:.2f} s): "
               f"fixed {fixed:.2f} s + {per * 1000:.3f} s per 1000 resamples; wall assumes all "
               f"{os.cpu_count()} cores busy")
    print(f"B  lm-eval bootstrap_stderr, {args.resamples:,} resamples: wall {lm_wall:.2f} s, "
          f"CPU {lm_cpu:.2f} s ({how})")
    naive_wall, naive_cpu = time_naive_paired_bootstrap(base_cols, cand, args.resamples)
    print(f"C  plain numpy paired bootstrap, {args.resamples:,} resamples, data in memory: wall {naive_wall:.2f} s, "
          f"CPU {naive_cpu:.2f} s")
    for label, (wall, cpu) in figures.items():
        name = label.split()[0]
        print(f"ratio B/{name}: wall {lm_wall / wall:.1f}x, CPU {lm_cpu / cpu:.1f}x; "
              f"C/{name}: wall {naive_wall / wall:.1f}x, CPU {naive_cpu / cpu:.1f}x")
    print("goal: A wall < 5 s on 2 cores, B/A >= 20x, C/A > 1")
    if args.record:
        tag = "_confusion" if args.confusion else ""
        wall = figures["A2 baseline file vs run"][0]
        figures_mod.record("benchmarks/compare_speed.py", {
            f"compare_wall{tag}": (f"{wall:.1f} s", wall),
            f"lmeval_bootstrap{tag}": (f"~{lm_wall:.0f} s", lm_wall),
            f"naive_ratio{tag}": (f"{naive_wall / wall:.1f}×", naive_wall / wall),
        }, note=f"{N_ITEMS:,} items, {args.resamples:,} resamples, {CONFUSION_SHARE:.0%} f1/mcc")


if __name__ == "__main__":
    main()
