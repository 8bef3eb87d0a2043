"""``gatekeeper merge --out DIR SHARD_DIR...``: N ``run --shard K/N`` folders → one run; and
``gatekeeper run --complete``: the looks of a sequential gate plus the rest → one run.

The shards must belong together: one shard count, every K exactly once, the same suite (hash),
model files (sha256), lm-eval version, seeds, dtype, model arguments, limit and task configs,
and their documents disjoint and together exactly the documents the unsharded run evaluates.
Anything else is one ``GateError`` line naming the shard folder. The looks of a sequential gate
(``run/looks.py``) are parts in the same sense: each owns the documents it added (its manifest's
``look.docs``; the one document a look repeats so lm-eval does not evaluate a whole task is
dropped), one seed and look count, and with the rest (``run --complete``) every document once.

The merged folder has the layout ``gatekeeper run`` writes (``<model>/results_<ts>.json``,
``samples_<task>_<ts>.jsonl``, ``gatekeeper-manifest.json``), so ``compare``, ``gate --run``
and ``baseline record/promote`` read it like any other run:

- samples lines are copied byte for byte, ordered as lm-eval orders them (filter, then doc id);
- each task's metrics are recomputed from the merged per-item values as lm-eval computes them
  (the metric kind's exact aggregate; ``mean_stderr`` for means; "N/A" where lm-eval bootstraps a stderr),
  ``task_hashes`` as ``EvaluationTracker`` does, groups as ``Group.aggregate`` does (size-weighted
  or plain mean, pooled stderr) from the aggregation each shard recorded in its manifest;
- the merged folder is read back with ``results.load_run`` (which recomputes every aggregate)
  before it is renamed into place, so a merge the gate could not read is never left behind.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from gatekeeper.errors import GateError
from gatekeeper.model import is_int
from gatekeeper.results import reader as results
from gatekeeper.results.layout import MANIFEST_NAME, find_results_file, read_manifest, samples_path
from gatekeeper.results.metrics import kind_for
from gatekeeper.run import looks as lookmod
from gatekeeper.run.manifest import run_file_digests
from gatekeeper.run.runner import check_output  # torch-free: runner imports lm-eval lazily
from gatekeeper.run.shard import MAX_SHARDS
from gatekeeper.text import short

# results.json fields that must be equal in every shard (the rest is per-machine context).
_SAME_RESULTS = ("configs", "versions", "n-shot", "higher_is_better", "lm_eval_version",
                 "group_subtasks", "chat_template_sha", "system_instruction_sha", "fewshot_as_multiturn",
                 "model_name", "model_name_sanitized", "transformers_version", "max_length", "eot_token_id",
                 "tokenizer_pad_token", "tokenizer_eos_token", "tokenizer_bos_token")
_SAME_CONFIG = ("model", "model_args", "model_dtype", "bootstrap_iters", "gen_kwargs",
                "random_seed", "numpy_seed", "torch_seed", "fewshot_seed")
_SAME_MANIFEST = ("suite_hash", "suite_name", "model_files", "lm_eval_version", "dtype", "seeds",
                  "limit", "tasks", "revision", "torch_version", "transformers_version", "task_files", "datasets")
# lm-eval bootstraps these aggregations' stderr (random draws): not recomputable, written "N/A".
_CLOSED_FORM_STDERR = {"mean"}
_MERGEABLE_KINDS = {"mean", "ratio", "corpus"}


@dataclass
class ShardRun:
    """One part folder as read for merging: a shard (``kind`` "shard") or a look ("look")."""

    folder: Path
    results_file: Path
    data: dict[str, Any]
    manifest: dict[str, Any]
    kind: str = "shard"

    @property
    def info(self) -> dict[str, Any]:
        return self.manifest[self.kind]

    @property
    def name(self) -> str:
        if self.kind == "look" and self.info.get("rest"):
            return "the rest"
        part = self.info.get("part") if self.kind == "look" else None
        return f"{self.kind} {self.info['index']}/{self.info['count']}" + (f" part {part[0]}/{part[1]}" if part else "")

    def owns(self, task: str) -> Callable[[int], bool]:
        """Whether a document of ``task`` in this part's samples is this part's own."""
        if self.kind == "look":
            docs = frozenset(self.info["docs"].get(task, ()))
            return docs.__contains__
        first, end = self.info["docs"].get(task, (0, 0))
        return lambda doc: first <= doc < end


def merge_shards(shard_dirs: list[Path], out_dir: Path) -> Path:
    """Check that ``shard_dirs`` are the N shards of one run, write the merged run under
    ``out_dir`` (atomically) and return its folder."""
    if not shard_dirs:
        raise GateError("merge: no shard folders given; pass the N folders written by `run --shard K/N`")
    shards = [_load_shard(Path(d)) for d in shard_dirs]
    _check_set(shards)
    return _merge(shards, out_dir)


def merge_looks(look_dirs: list[Path], out_dir: Path) -> Path:
    """The looks of one sequential gate and the rest (``run --complete``) as one whole run under
    ``out_dir``, item for item the run an unsequenced ``gatekeeper run`` writes."""
    return join_looks([load_look(Path(d)) for d in look_dirs], out_dir)


def join_looks(looks: list[ShardRun], out_dir: Path) -> Path:
    """``merge_looks`` on looks already read with ``load_look``."""
    if not looks:
        raise GateError("run --complete: no look folders to join")
    _check_looks(looks)
    return _merge(looks, out_dir)


def _merge(shards: list[ShardRun], out_dir: Path) -> Path:
    check_same(shards)
    merged = {task: _merge_task(shards, task) for task in sorted(shards[0].data["configs"])}
    data = _merged_results(shards, merged)
    lines = {task: [line for line, _ in items] for task, items in merged.items()}
    target = Path(out_dir) / str(data.get("model_name_sanitized") or shards[0].results_file.parent.name)
    fresh = not Path(out_dir).exists()
    check_output(Path(out_dir), target)
    try:
        return _write(shards, data, lines, Path(out_dir), target)
    except BaseException:
        if fresh and Path(out_dir).is_dir() and not any(Path(out_dir).iterdir()):
            Path(out_dir).rmdir()  # we made it; a failed merge leaves nothing behind
        raise


def _write(shards: list[ShardRun], data: dict[str, Any], lines: dict[str, list[str]], out_dir: Path,
           target: Path) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix=".gatekeeper-merge-", dir=out_dir))
    try:
        folder = tmp / target.name
        folder.mkdir()
        stamp = datetime.now().isoformat().replace(":", "-")  # lm-eval's date_id
        results_file = folder / f"results_{stamp}.json"
        samples = {}
        for task, task_lines in lines.items():
            samples[task] = f"samples_{task}_{stamp}.jsonl"
            (folder / samples[task]).write_text("".join(task_lines), encoding="utf-8")
        results_file.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
        manifest = _merged_manifest(shards, results_file.name, samples)
        manifest["files"] = run_file_digests(folder, [results_file, *(folder / n for n in samples.values())])
        (folder / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n",
                                            encoding="utf-8")
        results.load_run(folder)  # the gate must be able to read what we wrote: recomputes everything
        _fsync_tree(folder)
        try:
            os.rename(folder, target)
        except OSError as exc:
            raise GateError(f"{target}: cannot move the merged run into place ({exc.strerror})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


# ----------------------------------------------------------------------------- reading and checks


def _load_shard(folder: Path) -> ShardRun:
    results_file, _ = find_results_file(folder)  # the manifest's own files (results/layout.bound_files)
    results.load_run(results_file)  # internally consistent: aggregates, hashes, counts
    data = json.loads(results_file.read_text(encoding="utf-8"))
    manifest_path = results_file.parent / MANIFEST_NAME
    manifest = read_manifest(results_file.parent)
    if manifest is None:
        raise GateError(f"{folder}: no {MANIFEST_NAME}; merge takes folders written by `gatekeeper run --shard K/N`")
    info = manifest.get("shard") if isinstance(manifest, dict) else None
    if not isinstance(info, dict) or not all(k in info for k in ("index", "count", "docs", "items", "groups")):
        raise GateError(f"{folder}: not a shard (its manifest has no 'shard'); "
                        "merge takes folders written by `gatekeeper run --shard K/N`")
    problem = _shard_problem(info, data)
    if problem:
        raise GateError(f"{manifest_path}: shard.{problem} (edited, or not written by `gatekeeper run --shard`?)")
    return ShardRun(folder, results_file, data, manifest)


def load_look(folder: Path) -> ShardRun:
    """One look of a sequential gate (or a part of one), its manifest checked against its run."""
    results_file, _ = find_results_file(folder)  # the manifest's own files (results/layout.bound_files)
    manifest_path = results_file.parent / MANIFEST_NAME
    manifest = read_manifest(results_file.parent)
    info = manifest.get("look") if isinstance(manifest, dict) else None
    if not isinstance(info, dict) or not all(k in info for k in ("index", "count", "seed", "docs", "items",
                                                                 "groups", "limit")):
        raise GateError(f"{folder}: not a look of a sequential gate (its manifest has no 'look' with the "
                        "documents it added; a gate from before `run --complete` existed cannot be completed)")
    data = json.loads(results_file.read_text(encoding="utf-8"))
    problem = _look_problem(info, data)
    if problem:
        raise GateError(f"{manifest_path}: look.{problem} (edited, or not written by `gatekeeper gate --sequential`?)")
    results.load_run(results_file)  # internally consistent: aggregates, hashes, counts
    return ShardRun(folder, results_file, data, manifest, kind="look")


def _look_problem(info: dict[str, Any], data: dict[str, Any]) -> str | None:
    """What is wrong with a look manifest's shape (as ``_shard_problem``); None when fine. Index
    ``count + 1`` is ``run --complete``'s rest."""
    problem = _part_problem(info, data, info["count"] + 1 if is_int(info["count"]) else 0,
                            "the documents each task added")
    if problem:
        return problem
    items, docs = info["items"], info["docs"]
    for task, ids in docs.items():
        if not (isinstance(ids, list) and all(is_int(x) and 0 <= x < items[task] for x in ids)):
            return f"docs[{task}] is {short(ids)}, expected document numbers below the task's {items[task]} items"
    if not isinstance(info["groups"], dict):
        return f"groups is {short(info['groups'])}, expected an object"
    part, done = info.get("part"), info.get("done", [])
    if part is not None and not (isinstance(part, list) and len(part) == 2 and all(is_int(x) for x in part)
                                 and 1 <= part[0] <= part[1] <= MAX_SHARDS):
        return f"part is {short(part)}, expected [k, N] with 1 <= k <= N"
    if not (isinstance(done, list) and all(isinstance(t, str) and t in items for t in done)):
        return f"done is {short(done)}, expected task names of the run"
    if not is_int(info["seed"]):
        return f"seed is {short(info['seed'])}, expected the suite's integer seed"
    rest = info.get("rest")
    if rest not in (None, False, True) or bool(rest) != (info["index"] == info["count"] + 1):
        return f"rest is {short(rest)} at index {info['index']}, expected true only for run --complete's index count + 1"
    return None if rest else _docs_problem(info)


def _docs_problem(info: dict[str, Any]) -> str | None:
    """A look's documents are not the manifest's to choose: they are recomputed from the seeded
    order, the look plan and the tasks already stopped (``run/looks.py``), so a look cannot keep
    only the items where the candidate did well."""
    part = info.get("part")
    look = lookmod.Look(info["index"], info["count"], info["seed"], done=frozenset(info.get("done") or ()),
                        part=tuple(part) if part else None)
    if set(info["docs"]) != set(info["items"]):
        return f"docs names {len(info['docs'])} tasks, expected the run's {len(info['items'])}"
    for task, size in sorted(info["items"].items()):
        if info["docs"][task] != lookmod.chunk(task, size, look):
            return (f"docs[{task}] are not the documents look {info['index']}/{info['count']} evaluates "
                    f"in the order of seed {info['seed']}")
    return None


def _check_looks(looks: list[ShardRun]) -> None:
    first = looks[0]
    for s in looks[1:]:
        for key in ("count", "seed", "items"):
            if s.info[key] != first.info[key]:
                raise GateError(f"{s.folder}: look {key} differs from {first.folder}'s; "
                                "join the looks of one sequential gate")
    seen: dict[str, list[int]] = {}
    for s in looks:
        if not s.info.get("rest"):
            for task, docs in s.info["docs"].items():
                seen.setdefault(task, []).extend(docs)
    expected = lookmod.rest(first.info["items"], seen)
    for s in looks:
        if s.info.get("rest") and {t: sorted(d) for t, d in s.info["docs"].items() if d} != \
                {t: d for t, d in expected.items() if d}:
            raise GateError(f"{s.folder / MANIFEST_NAME}: look.docs of the rest are not the documents the looks "
                            "skipped (edited, or not written by `gatekeeper run --complete`?)")
    given: dict[tuple[int, int], Path] = {}
    for s in looks:
        k = (s.info["index"], (s.info.get("part") or [1])[0])
        if k in given:
            raise GateError(f"{s.folder}: {s.name} given twice (also {given[k]})")
        given[k] = s.folder
    looks.sort(key=lambda s: (s.info["index"], (s.info.get("part") or [1])[0]))


def _shard_problem(info: dict[str, Any], data: dict[str, Any]) -> str | None:
    """What is wrong with a shard manifest's shape, bounded by the run's own results.json: a
    count beyond MAX_SHARDS or item counts beyond the task's documents would make the merge
    loop for minutes or run out of memory. None when it is fine."""
    problem = _part_problem(info, data, info["count"], "the document range of each task")
    if problem:
        return problem
    items, docs = info["items"], info["docs"]
    for task, rng in docs.items():
        if not (isinstance(rng, list) and len(rng) == 2 and all(is_int(x) for x in rng)
                and 0 <= rng[0] <= rng[1] <= items[task]):
            return f"docs[{task}] is {short(rng)}, expected [first, end] within the task's {items[task]} items"
    if not isinstance(info["groups"], dict):
        return f"groups is {short(info['groups'])}, expected an object"
    return None


def _part_problem(info: dict[str, Any], data: dict[str, Any], last: int, docs_are: str) -> str | None:
    """The checks a shard's and a look's manifest share: count, index (1 to ``last``), item
    counts bounded by the run's own documents, a ``docs`` object over the run's tasks."""
    index, count = info["index"], info["count"]
    if not (is_int(count) and 1 <= count <= MAX_SHARDS):
        return f"count is {short(count)}, expected 1 to {MAX_SHARDS}"
    if not (is_int(index) and 1 <= index <= last):
        return f"index is {short(index)}, expected 1 to {last}"
    items, docs = info["items"], info["docs"]
    if not isinstance(items, dict) or set(items) != set(data.get("configs") or {}):
        return f"items is {short(items)}, expected the item count of each of the run's tasks"
    for task, n in items.items():
        original = ((data.get("n-samples") or {}).get(task) or {}).get("original")
        if not (is_int(n) and 0 <= n <= (original if is_int(original) else 0)):
            return f"items[{task}] is {short(n)}, expected at most the task's {original} documents"
    if not isinstance(docs, dict) or not set(docs) <= set(items):
        return f"docs is {short(docs)}, expected {docs_are}"
    return None


def _check_set(shards: list[ShardRun]) -> None:
    counts = {s.info["count"] for s in shards}
    if len(counts) > 1:
        raise GateError(f"{shards[0].folder}: shards of different splits ({', '.join(_names(shards))}); "
                        "pass the shards of one `--shard K/N` run")
    n = counts.pop()
    seen: dict[int, Path] = {}
    for s in shards:
        k = s.info["index"]
        if k in seen:
            raise GateError(f"{s.folder}: shard {k}/{n} given twice (also {seen[k]}); pass each shard once")
        seen[k] = s.folder
    missing = [f"{k}/{n}" for k in range(1, n + 1) if k not in seen]
    if missing:
        raise GateError(f"{shards[0].folder}: shard(s) {', '.join(missing)} missing; "
                        f"pass all {n} shard folders")
    shards.sort(key=lambda s: s.info["index"])


def check_same(shards: list[ShardRun]) -> None:
    """The parts are of one model, suite and settings (manifests, results.json, config)."""
    first = shards[0]
    for s in shards[1:]:
        for key in _SAME_MANIFEST:
            if s.manifest.get(key) != first.manifest.get(key):
                raise GateError(f"{s.folder}: {key} differs from {first.kind} {first.info['index']}'s "
                                f"({first.folder}); merge {s.kind}s of one model, suite and settings")
        for key in ("items", "limit", "groups"):
            if s.info.get(key) != first.info.get(key):
                raise GateError(f"{s.folder}: {s.kind} {key} differs from {first.folder}; "
                                f"re-run every {s.kind} with the same suite")
        for key in _SAME_RESULTS:
            if _comparable(key, s.data.get(key)) != _comparable(key, first.data.get(key)):
                raise GateError(f"{s.results_file}: {key} differs from {first.results_file}; "
                                "merge shards of one model, suite and settings")
        for key in _SAME_CONFIG:
            if (s.data.get("config") or {}).get(key) != (first.data.get("config") or {}).get(key):
                raise GateError(f"{s.results_file}: config.{key} differs from {first.results_file}; "
                                "merge shards of one model, suite and settings")


def _comparable(key: str, value: Any) -> Any:
    """A results.json field as shards must agree on it: a task config's ``metadata.config_source``
    is where its YAML was on that runner (another checkout path, or the base commit's tree in a
    temporary folder), not what it measures."""
    if key != "configs" or not isinstance(value, dict):
        return value
    out = {}
    for task, cfg in value.items():
        meta = cfg.get("metadata") if isinstance(cfg, dict) else None
        if isinstance(meta, dict) and "config_source" in meta:
            cfg = {**cfg, "metadata": {k: v for k, v in meta.items() if k != "config_source"}}
        out[task] = cfg
    return out


def _merge_task(shards: list[ShardRun], task: str) -> list[tuple[str, dict[str, Any]]]:
    """The task's samples (line, parsed) from every shard, in lm-eval's order; checks the
    documents are disjoint, complete and those each shard's manifest says."""
    total = shards[0].info["items"].get(task)
    if not isinstance(total, int):
        raise GateError(f"{shards[0].folder}: shard manifest has no item count for task {task}")
    by_filter: dict[str, dict[int, tuple[str, dict[str, Any]]]] = {}
    owner: dict[tuple[str, int], Path] = {}
    for s in shards:
        path = samples_path(s.results_file, task)
        owns = s.owns(task)
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                    filt, doc = item["filter"], item["doc_id"]
                except (ValueError, KeyError, TypeError):
                    raise GateError(f"{path}: a line is not an lm-eval sample (no filter/doc_id); "
                                    "re-run this shard") from None
                if not is_int(doc) or not owns(doc):
                    if s.kind == "look":
                        continue  # the document a look repeats so lm-eval evaluates no whole task
                    first, end = s.info["docs"].get(task, (0, 0))
                    raise GateError(f"{path}: doc {doc} is outside this shard's documents [{first}, {end}) "
                                    "(shard edited or mixed up?)")
                if (filt, doc) in owner:
                    raise GateError(f"{path}: doc {doc} ({filt}) is also in {owner[(filt, doc)]}; "
                                    f"{s.kind}s overlap, pass each {s.kind} once")
                owner[(filt, doc)] = path
                by_filter.setdefault(filt, {})[doc] = (line if line.endswith("\n") else line + "\n", item)
    out = []
    for filt, docs in by_filter.items():
        if len(docs) != total:
            missing = sorted(set(range(total)) - set(docs))[:5]
            raise GateError(f"{shards[0].folder}: task {task} ({filt}) has {len(docs)} of {total} documents "
                            f"over the {shards[0].kind}s (missing e.g. {missing}); pass every {shards[0].kind}")
        out.extend(docs[d] for d in sorted(docs))
    return out


# ----------------------------------------------------------------------------- recomputation


def _merged_results(shards: list[ShardRun], merged: dict[str, list[tuple[str, dict[str, Any]]]]) -> dict[str, Any]:
    data = copy.deepcopy(shards[0].data)
    config = data.setdefault("config", {})
    boot = config.get("bootstrap_iters")
    task_hashes = {}
    for task, pairs in merged.items():
        items = [item for _, item in pairs]
        entry = data["results"][task]
        n = _recompute_task(task, data["configs"][task], entry, items, boot)
        data["n-samples"][task] = {"original": data["n-samples"][task]["original"], "effective": n}
        task_hashes[task] = _sha256("".join(i["doc_hash"] + i["prompt_hash"] + i["target_hash"] for i in items))
    for name, spec in shards[0].info["groups"].items():
        if name in data["results"]:
            _recompute_group(name, spec, data)
    data["task_hashes"] = task_hashes
    config["limit"] = shards[0].info.get("limit")  # what the unsharded run hands lm-eval
    dates = [s.data.get("date") for s in shards if isinstance(s.data.get("date"), (int, float))]
    if dates:
        data["date"] = min(dates)
    times = [_float(s.data.get("total_evaluation_time_seconds")) for s in shards]
    # Shards run side by side; looks one after another.
    data["total_evaluation_time_seconds"] = str(sum(times) if shards[0].kind == "look" else max(times))
    return data


def _recompute_task(task: str, config: dict[str, Any], entry: dict[str, Any], items: list[dict[str, Any]],
                    boot: Any) -> int:
    """Replace ``entry``'s metric values (and stderrs) by those of the merged items; returns
    lm-eval's ``sample_len`` (the largest number of values of any metric)."""
    aggregations = results.metric_aggregations(config)
    sample_len = 0
    for key in list(entry):
        if key in results.NON_METRIC_KEYS or "," not in key or key.partition(",")[0].endswith("_stderr"):
            continue
        metric, _, filt = key.partition(",")
        agg = aggregations.get(metric, results.DEFAULT_AGGREGATION.get(metric, "mean"))
        kind = kind_for(agg)
        # Per-item means, ratios of sums and corpus statistics merge exactly; confusion-matrix,
        # median and task-defined aggregations are not recomputed here (yet).
        if kind is None or kind.name not in _MERGEABLE_KINDS:
            raise GateError(f"task {task}: metric {metric} has aggregation {results.aggregation_name(agg)}, "
                            "which merge cannot recompute from per-item values; run this suite unsharded")
        raw = [i[metric] for i in items if i["filter"] == filt and metric in i]
        values = [kind.item_value(agg, v, task, metric) for v in raw]
        entry[key] = kind.aggregate(agg, kind.as_array(agg, values))
        stderr_key = f"{metric}_stderr,{filt}"
        if stderr_key in entry:
            closed = agg in _CLOSED_FORM_STDERR and isinstance(boot, int) and boot > 0 and len(raw) > 1
            entry[stderr_key] = _mean_stderr(raw) if closed else "N/A"
        sample_len = max(sample_len, len(raw))
    if "sample_len" in entry:
        entry["sample_len"] = sample_len
    return sample_len


def _mean_stderr(values: list[Any]) -> float:
    # lm_eval.api.metrics.mean_stderr, operation for operation (same float results).
    arr = [float(v) for v in values]
    mu = sum(arr) / len(arr)
    return math.sqrt(sum([(x - mu) ** 2 for x in arr]) / (len(arr) - 1)) / math.sqrt(len(arr))


def _recompute_group(name: str, spec: dict[str, Any], data: dict[str, Any]) -> None:
    """lm_eval.api.group.Group.aggregate on the merged leaf results."""
    leaves = [data["results"][t] for t in spec["leaves"] if t in data["results"]]
    entry = data["results"][name]
    if not spec["aggregate"]:
        return
    entry["sample_len"] = sum(t.get("sample_len", 0) for t in leaves)
    sample_count = {}
    for agg in spec["aggregate"]:
        if agg.get("aggregation") != "mean":
            raise GateError(f"group {name}: aggregation {agg.get('aggregation')} of {agg['metric']} cannot be "
                            "recomputed by merge; run this suite unsharded")
        filters = agg["filter_list"] or sorted({k.partition(",")[2] for t in leaves for k in t
                                                if k.startswith(f"{agg['metric']},")})
        for filt in filters:
            key, skey = f"{agg['metric']},{filt}", f"{agg['metric']}_stderr,{filt}"
            have = [t for t in leaves if key in t]
            if not have:
                continue
            values, sizes = [t[key] for t in have], [t.get("sample_len", 0) for t in have]
            stderrs = [t[skey] for t in have if t.get(skey) is not None]
            weights = sizes if agg["weight_by_size"] else [1] * len(sizes)
            entry[key] = sum([v * w for v, w in zip(values, weights, strict=True)]) / sum(weights)
            sample_count[key] = sum(sizes)
            if len(stderrs) == len(values) and "N/A" not in stderrs:
                entry[skey] = (_pooled_stderr(stderrs, sizes) if agg["weight_by_size"]
                               else math.sqrt(sum(s**2 for s in stderrs)) / len(stderrs))
            else:
                entry[skey] = "N/A"
    if sample_count:
        entry["sample_count"] = sample_count
    if name in (data.get("groups") or {}):
        data["groups"][name] = copy.deepcopy(entry)


def _pooled_stderr(stderrs: list[float], sizes: list[int]) -> float:
    # lm_eval.api.metrics.pooled_sample_stderr (numpy sqrt, as there).
    var = sum([(size - 1) * se**2 * size for size, se in zip(sizes, stderrs, strict=True)]) / (sum(sizes) - len(sizes))
    return float(np.sqrt(var / sum(sizes)))


# ----------------------------------------------------------------------------- output


def _merged_manifest(shards: list[ShardRun], results_name: str, samples: dict[str, str]) -> dict[str, Any]:
    manifest = copy.deepcopy(shards[0].manifest)
    manifest.pop("shard", None)
    manifest.pop("look", None)
    manifest["merged_from"] = [
        {s.kind: "rest" if s.kind == "look" and s.info.get("rest") else f"{s.info['index']}/{s.info['count']}",
         "part": s.info.get("part") if s.kind == "look" else None, "folder": str(s.folder),
         "docs": s.info["docs"],
         "device": s.manifest.get("device"), "hardware": s.manifest.get("hardware"),
         "start": s.manifest.get("start"), "end": s.manifest.get("end"),
         "wall_seconds": s.manifest.get("wall_seconds")}
        for s in shards
    ]
    starts = [s.manifest.get("start") for s in shards if isinstance(s.manifest.get("start"), str)]
    ends = [s.manifest.get("end") for s in shards if isinstance(s.manifest.get("end"), str)]
    manifest["start"], manifest["end"] = (min(starts) if starts else None), (max(ends) if ends else None)
    walls = [_float(s.manifest.get("wall_seconds")) for s in shards]
    manifest["wall_seconds"] = sum(walls) if shards[0].kind == "look" else max(walls)
    manifest["command"] = list(sys.argv)
    manifest["results_file"], manifest["samples_files"] = results_name, dict(sorted(samples.items()))
    return manifest


def _fsync_tree(folder: Path) -> None:
    for path in [*folder.iterdir(), folder]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _names(shards: list[ShardRun]) -> list[str]:
    return [f"{s.info['index']}/{s.info['count']}" for s in shards]


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
