"""Is a comparison apples to apples? Every comparability check, in one place.

Run vs run: ``check_compatible`` lists every difference between two ``RunResults``: ``error`` when the items,
prompts or scoring changed (the comparison would measure the change of the task, not of the
model; exit 2), ``context`` when it is harmless but worth showing (batch size, dtype, device,
date, model, library versions, hardware). ``pair_series`` aligns one series of both runs item
by item and refuses items whose hashes differ.

Run (or stored baseline) vs the suite: ``check_run_matches_suite`` (suite hash, task set,
lm-eval pin, n-shot, seeds, limit, chat template; what ``gate``, ``compare --suite`` and
``baseline record|promote`` require), ``check_baseline_before`` (the stored baseline vs the
suite and lm-eval's built tasks, before the model runs) and ``check_suite_hash``.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from gatekeeper.errors import GateError
from gatekeeper.files import portable_path
from gatekeeper.model import MetricSeries, Provenance, RunResults
from gatekeeper.suite import taskcode
from gatekeeper.suite.names import RunPlan, from_run
from gatekeeper.suite.suite import Suite, hash_changes

# Config keys reported by their own, clearer check (so one change gives one message).
_CONFIG_KEYS_CHECKED_ELSEWHERE = {"num_fewshot"}
# What lm-eval merges into a task config's metadata from the model side; the reader strips it
# already, this guards baselines written by older readers.
_MODEL_METADATA = {"pretrained", "dtype", "config_source"}
_ALL_SEEDS = ("random_seed", "numpy_seed", "torch_seed", "fewshot_seed")


@dataclass(frozen=True)
class Difference:
    severity: str  # "error" (items or prompts changed → exit 2) | "context" (harmless)
    message: str  # one line, e.g. "task arc_easy: num_fewshot 5 in baseline, 0 in candidate"


def check_compatible(baseline: RunResults, candidate: RunResults) -> list[Difference]:
    """Every difference between two runs, errors first, each group in a fixed order."""
    b, c = baseline.provenance, candidate.provenance
    b_tasks, c_tasks = _tasks(baseline), _tasks(candidate)
    common = sorted(b_tasks & c_tasks)
    errors: list[str] = []
    context: list[str] = []

    errors += _task_set(b_tasks, c_tasks)
    errors += _metric_set(baseline, candidate, set(common))
    errors += _task_hashes(b, c, common, baseline, candidate)
    errors += _per_task(
        "version", b.task_versions, c.task_versions, sorted(set(b.task_versions) & set(c.task_versions))
    )
    errors += _per_task("num_fewshot", b.n_shot, c.n_shot, common)
    if _differs(b.limit, c.limit):
        errors.append(f"limit {_fmt(b.limit)} in baseline, {_fmt(c.limit)} in candidate")
    errors += _effective_n(b, c, common)
    errors += _configs(b, c, common)
    errors += _task_code(b.manifest.get("task_files"), c.manifest.get("task_files"))
    errors += _model_setting_files(b.manifest, c.manifest)
    few_shot_used = any(_as_int(b.n_shot.get(t)) or _as_int(c.n_shot.get(t)) for t in common)
    for seed in _ALL_SEEDS:
        bv, cv = b.seeds.get(seed), c.seeds.get(seed)
        if _differs(bv, cv):
            # The fewshot seed picks the examples in the prompt; the others only matter to sampling.
            target = errors if seed == "fewshot_seed" and few_shot_used else context
            target.append(f"{seed} {_fmt(bv)} in baseline, {_fmt(cv)} in candidate")
    if b.lm_eval_version != c.lm_eval_version:
        # Unknown on one side is not "same": the check must not be skippable by leaving it out.
        errors.append(
            f"lm-eval version {_fmt(b.lm_eval_version)} in baseline, {_fmt(c.lm_eval_version)} in candidate"
        )
    if _differs(b.chat_template_sha, c.chat_template_sha):
        errors.append(
            f"chat template differs (sha {_fmt(b.chat_template_sha, 12)} in baseline, "
            f"{_fmt(c.chat_template_sha, 12)} in candidate)"
        )

    for label, bv, cv in (
        ("model", _model_id(b.model_name), _model_id(c.model_name)),
        ("dtype", b.model_dtype, c.model_dtype),
        ("batch size", _batch_size(b.batch_size), _batch_size(c.batch_size)),
        ("device", b.device, c.device),
        ("transformers version", b.transformers_version, c.transformers_version),
    ):
        if _differs(bv, cv):
            context.append(f"{label}: {_fmt(bv)} in baseline, {_fmt(cv)} in candidate")
    if _differs(b.date, c.date):
        context.append(f"date: {_fmt(_date(b.date))} in baseline, {_fmt(_date(c.date))} in candidate")
    context += _manifest(b.manifest, c.manifest)
    context += [f"dataset {name}: revision {bs[:7]} in baseline, {cs[:7]} in candidate"
                for name, bs, cs in dataset_moves(b.manifest, c.manifest)]
    return [Difference("error", m) for m in errors] + [Difference("context", m) for m in context]


def compatibility_errors(baseline: RunResults, candidate: RunResults) -> list[str]:
    """What makes two runs not comparable: the messages of ``check_compatible``'s errors."""
    return [d.message for d in check_compatible(baseline, candidate) if d.severity == "error"]


def pair_series(
    baseline: MetricSeries, candidate: MetricSeries, where: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Aligned (base_values, cand_values, clusters) of one series; the items must be the same
    docs with the same hashes (compared on the shorter stored length)."""
    if baseline.kind != candidate.kind or baseline.aggregation != candidate.aggregation:
        raise GateError(
            f"{where}: aggregated as {baseline.kind}/{baseline.aggregation} in baseline, "
            f"{candidate.kind}/{candidate.aggregation} in candidate"
        )
    b_ids, c_ids = np.asarray(baseline.doc_ids), np.asarray(candidate.doc_ids)
    if np.array_equal(b_ids, c_ids) and (np.diff(b_ids) > 0).all():
        b_order = c_order = np.arange(b_ids.size)  # the usual case: the same ids, increasing (so unique)
    else:
        b_order, c_order = _aligned(b_ids, c_ids, where)
    _check_hashes(
        np.asarray(baseline.hashes).reshape(-1, 3)[b_order],
        np.asarray(candidate.hashes).reshape(-1, 3)[c_order],
        b_ids[b_order],
        where,
    )
    clusters = candidate.clusters if candidate.clusters is not None else baseline.clusters
    if clusters is not None:
        clusters = np.asarray(clusters)[c_order if candidate.clusters is not None else b_order]
    return np.asarray(baseline.values)[b_order], np.asarray(candidate.values)[c_order], clusters


def _aligned(b_ids: np.ndarray, c_ids: np.ndarray, where: str) -> tuple[np.ndarray, np.ndarray]:
    """The orders that sort both runs' doc ids, which must be the same unique ids."""
    only_b = np.setdiff1d(b_ids, c_ids)
    only_c = np.setdiff1d(c_ids, b_ids)
    if only_b.size or only_c.size:
        raise GateError(
            f"{where}: doc_ids differ: {_count_eg(only_b, 'baseline')}, {_count_eg(only_c, 'candidate')}"
        )
    if len(np.unique(b_ids)) != b_ids.size or len(np.unique(c_ids)) != c_ids.size:
        raise GateError(f"{where}: duplicate doc_ids")
    return np.argsort(b_ids, kind="stable"), np.argsort(c_ids, kind="stable")


# ---------------------------------------------------------------- run or baseline vs the suite

_SEED_KEYS = {"random": "random_seed", "numpy": "numpy_seed", "torch": "torch_seed", "fewshot": "fewshot_seed"}


def check_suite_hash(baseline: RunResults, suite: Suite) -> None:
    """Refuse a baseline recorded for another suite hash (tasks, shots, seeds, lm-eval pin)."""
    recorded = baseline.provenance.suite_hash
    if recorded and recorded != suite.hash:
        raise GateError(
            f"{baseline.provenance.source}: baseline was recorded for suite hash {recorded[:12]}, "
            f"but {suite.path} now has hash {suite.hash[:12]} (changed: {_what_changed(baseline.provenance.manifest or {}, suite)}); the suite "
            "changed what it measures, so re-record the baseline (gatekeeper baseline promote RUN_DIR --suite ...)"
        )


def _what_changed(manifest: dict[str, Any], suite: Suite) -> str:
    """The suite fields that differ from those a run (or baseline) was made with, named."""
    then = manifest.get("suite_hashed")
    if isinstance(then, dict) and then:
        changes = hash_changes(then, suite.hashed)
    else:  # recorded before manifests kept the hashed fields: compare what the manifest does keep
        changes = hash_changes(_legacy_view(manifest), _legacy_view(suite.hashed))
        if not changes:
            return "a field an older run does not record: the model settings or include_path"
    return "; ".join(changes[:4]) + (f"; and {len(changes) - 4} more" if len(changes) > 4 else "")


_LEGACY_TASK_KEYS = ("name", "num_fewshot", "limit", "gen_kwargs", "repeats", "dataset")


def _legacy_view(doc: dict[str, Any]) -> dict[str, Any]:
    """The hashed fields an older run manifest also holds: lm-eval pin, seeds, per-task settings."""
    tasks = [t for t in doc.get("tasks") or [] if isinstance(t, dict)]
    return {"lm_eval_version": doc.get("lm_eval_version"), "seeds": doc.get("seeds"),
            "tasks": [{k: t.get(k) for k in _LEGACY_TASK_KEYS if k != "dataset" or t.get(k) is not None}
                      for t in tasks]}


def check_run_matches_suite(run: RunResults, suite: Suite, *, what: str = "run", fix: str | None = None) -> None:
    """Refuse a run (or stored baseline) measured under other conditions than ``suite``:
    suite hash, task set (the suite's tasks expanded through the run's groups), lm-eval version
    vs the pin, n-shot per task, seeds, limit, chat template. One line per difference."""
    fix = fix or f"re-run it with this suite (gatekeeper run --suite {suite.path} ...)"
    recorded = (run.provenance.manifest or {}).get("suite_name")
    if isinstance(recorded, str) and recorded and recorded != suite.name:
        # Another suite's run: re-recording would not help, the --suite is the mistake.
        raise GateError(f"{run.provenance.source}: the {what} belongs to suite {recorded!r}, not {suite.name!r} "
                        f"({suite.path}): pass that suite's file with --suite, or run this suite")
    diffs = _run_differences(run, suite, f"the {what}")
    if diffs:
        src = run.provenance.source
        raise GateError("\n".join(f"{src}: {what} does not match suite {suite.path}: {d}; {fix}" for d in diffs))


def _run_differences(run: RunResults, suite: Suite, side: str) -> list[str]:
    prov = run.provenance
    man = prov.manifest or {}
    out: list[str] = []
    look = man.get("look")
    if isinstance(look, dict):  # one look of a sequential gate: a sample of the items, never a baseline
        out.append(f"{side} is look {look.get('index')}/{look.get('count')} of a sequential gate, a sample of "
                   "the items, not a whole run (run the suite without --sequential to record or promote it)")
    shard = man.get("shard")
    if isinstance(shard, dict):  # part of a run: gating it alone would judge 1/N of the items
        out.append(f"{side} is shard {shard.get('index')}/{shard.get('count')} of a run, not a whole run "
                   "(join the shards first: gatekeeper merge --out DIR SHARD_DIR...)")
        return out
    produced = from_run(run)
    leaves = set(prov.configs) | set(produced.leaves)
    covered: set[str] = set()
    for spec in suite.tasks:
        under = produced.leaves_under(spec.name)
        if not under:
            out.append(f"suite task {spec.name!r} is not in {side} (its tasks: {', '.join(sorted(leaves))})")
            continue
        covered.update(under)
        if spec.num_fewshot is not None:
            for leaf in under:
                if leaf in prov.n_shot and _shots(prov.n_shot[leaf]) != spec.num_fewshot:
                    out.append(f"task {leaf}: num_fewshot {_shots(prov.n_shot[leaf])} in {side}, "
                               f"{spec.num_fewshot} in the suite")
    extra = sorted(leaves - covered)
    if extra:
        out.append(f"{side} has task(s) the suite does not list: {', '.join(extra)}")
    if prov.lm_eval_version and prov.lm_eval_version != suite.lm_eval_version:
        out.append(f"lm-eval {prov.lm_eval_version} in {side}, suite pins {suite.lm_eval_version}")
    out += _seed_differences(prov.seeds, suite, side)
    if man.get("limit") is not None:
        out.append(f"{side} was made with --limit {man['limit']} (debugging only)")
    expected = _global_limit(suite)
    if not _same_number(prov.limit, expected):
        out.append(f"limit {prov.limit} in {side}, {expected} in the suite")
    out += _chat_template_difference(prov.chat_template_sha, suite, side)
    if isinstance(man.get("task_files"), dict) and man["task_files"] and suite.include_path is not None:
        out += _task_code(_local_part(man["task_files"]), _suite_task_files(suite))
    ran_dtype = man.get("dtype")
    if isinstance(ran_dtype, str) and ran_dtype != str(suite.model.get("dtype")):
        # `run --dtype` overrides what the suite pins (dtype is hashed): another measurement
        out.append(f"dtype {ran_dtype} in {side} (a command-line override), the suite pins "
                   f"{suite.model.get('dtype')}")
    ran_with = man.get("suite_hash") or prov.suite_hash
    if ran_with and ran_with != suite.hash and not out:
        out.append(f"suite hash {ran_with[:12]} in {side}, {suite.hash[:12]} in the suite "
                   f"(the suite changed what it measures: {_what_changed(man, suite)})")
    return list(dict.fromkeys(out))


def check_baseline_before(stored: RunResults, suite: Suite, plan: RunPlan) -> None:
    """Before lm-eval evaluates: is the stored baseline comparable with this suite and these
    built tasks? lm-eval version, task set, task versions, n-shot, item counts (limit), seeds,
    chat template, the suite's gen_kwargs/repeats, suite hash. One line per difference."""
    diffs = baseline_differences(stored, suite, plan)
    if diffs:
        fix = f"re-record the baseline: gatekeeper baseline promote RUN_DIR --suite {suite.path}"
        src = stored.provenance.source
        raise GateError("\n".join(f"{src}: not comparable with suite {suite.path}: {d}; {fix}" for d in diffs))


def baseline_differences(stored: RunResults, suite: Suite, plan: RunPlan) -> list[str]:
    prov = stored.provenance
    out: list[str] = []
    if prov.lm_eval_version and prov.lm_eval_version != suite.lm_eval_version:
        out.append(f"lm-eval {prov.lm_eval_version} in the baseline, suite pins {suite.lm_eval_version}")
    base_tasks = set(prov.configs) | set(from_run(stored).leaves)
    run_tasks = set(plan.produced.leaves)
    if base_tasks - run_tasks:
        out.append(f"task(s) in the baseline, not in the suite: {', '.join(sorted(base_tasks - run_tasks))}")
    if run_tasks - base_tasks:
        out.append(f"task(s) in the suite, not in the baseline: {', '.join(sorted(run_tasks - base_tasks))}")
    for task in sorted(base_tasks & run_tasks):
        out += _task_differences(task, prov, plan)
    out += _seed_differences(prov.seeds, suite, "the baseline")
    out += _chat_template_difference(prov.chat_template_sha, suite, "the baseline")
    out += _spec_differences((prov.manifest or {}), suite)
    out += _task_code((prov.manifest or {}).get("task_files"), plan.task_files)
    if prov.suite_hash and prov.suite_hash != suite.hash and not out:
        out.append(f"suite hash {prov.suite_hash[:12]} in the baseline, {suite.hash[:12]} in the suite "
                   f"(the suite changed what it measures: {_what_changed(prov.manifest or {}, suite)})")
    return list(dict.fromkeys(out))


def _task_differences(task: str, prov: Any, plan: RunPlan) -> list[str]:
    out = []
    if task in prov.task_versions and not _same_version(prov.task_versions[task], plan.versions.get(task)):
        out.append(f"task {task}: version {prov.task_versions[task]} in the baseline, "
                   f"{plan.versions.get(task)} in the suite's tasks")
    if task in prov.n_shot and _shots(prov.n_shot[task]) != _shots(plan.n_shot.get(task)):
        out.append(f"task {task}: num_fewshot {_shots(prov.n_shot[task])} in the baseline, "
                   f"{_shots(plan.n_shot.get(task))} in the suite")
    b, p = prov.n_samples.get(task) or {}, plan.n_samples.get(task) or {}
    if b and p and (b.get("original"), b.get("effective")) != (p["original"], p["effective"]):
        out.append(f"task {task}: {b.get('effective')} of {b.get('original')} items in the baseline, "
                   f"{p['effective']} of {p['original']} in this run (the limit or the data changed)")
    return out


def _task_code(recorded: Any, current: Any) -> list[str]:
    """The task code's identity (``suite.taskcode``), where both sides recorded it: a helper,
    template or data file edited since is another measurement, whatever lm-eval's hashes say."""
    if not (isinstance(recorded, dict) and recorded and isinstance(current, dict) and current):
        return []
    changed = taskcode.changed_paths(recorded, current)
    if not changed:
        return []
    return [taskcode.describe_changes(changed) + ": record a new baseline on purpose"]


def _model_setting_files(b: dict[str, Any], c: dict[str, Any]) -> list[str]:
    """A tokenizer or adapter the suite names apart from the model is part of the measurement:
    a file of it that differs from the baseline's (added, removed, edited) is another
    measurement. Compared where both runs recorded the same setting's files."""
    pairs = [("model.tokenizer", b.get("tokenizer_files"), c.get("tokenizer_files"))]
    b_args, c_args = b.get("model_arg_files") or {}, c.get("model_arg_files") or {}
    if isinstance(b_args, dict) and isinstance(c_args, dict):
        pairs += [(f"model.model_args.{k}", b_args[k], c_args[k]) for k in sorted(set(b_args) & set(c_args))]
    out = []
    for label, before, after in pairs:
        if not (isinstance(before, dict) and before and isinstance(after, dict) and after):
            continue
        changed = sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))
        if changed:
            out.append(f"{label} files changed since the baseline ({_names(changed)}): the suite's "
                       f"{label.rsplit('.', 1)[-1]} is part of the measurement; record a new baseline on purpose")
    return out


def _local_part(files: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in files.items() if not k.startswith("lm_eval/tasks/")}


def _suite_task_files(suite: Suite) -> dict[str, str]:
    """The include_path part of the task code's identity, as ``run.tasks.task_files`` records it."""
    return taskcode.include_hashes(Path(suite.include_path))


def _spec_differences(manifest: dict[str, Any], suite: Suite) -> list[str]:
    """gen_kwargs / repeats per suite task, from the baseline run's manifest, and a --limit run."""
    out = []
    if manifest.get("limit") is not None:
        out.append(f"the baseline run was made with --limit {manifest['limit']} (debugging only)")
    recorded = {t.get("name"): t for t in manifest.get("tasks") or [] if isinstance(t, dict)}
    for spec in suite.tasks:
        old = recorded.get(spec.name)
        if old is None:
            continue
        for key in ("gen_kwargs", "repeats"):
            if old.get(key) != getattr(spec, key):
                out.append(f"tasks {spec.name}: {key} {old.get(key)} in the baseline, {getattr(spec, key)} in the suite")
    return out


def _seed_differences(seeds: dict[str, Any], suite: Suite, side: str) -> list[str]:
    out = []
    for short, long in _SEED_KEYS.items():
        if long in seeds and seeds[long] != suite.seeds.get(short):
            out.append(f"seed {short} {seeds[long]} in {side}, {suite.seeds.get(short)} in the suite")
    return out


def _chat_template_difference(sha: str | None, suite: Suite, side: str) -> list[str]:
    used, wanted = bool(sha), bool(suite.model.get("chat_template"))
    if used == wanted:
        return []
    return [f"chat template {'applied' if used else 'not applied'} in {side}, "
            f"chat_template: {str(wanted).lower()} in the suite"]


def _global_limit(suite: Suite) -> Any:
    # selection.limits: one limit for every task goes to lm-eval as `limit`, else per-task samples.
    distinct = {t.limit for t in suite.tasks}
    return distinct.pop() if len(distinct) == 1 else None


def _shots(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return -1


def _same_number(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    try:
        return math.isclose(float(a), float(b))
    except (TypeError, ValueError):
        return str(a) == str(b)


def _same_version(a: Any, b: Any) -> bool:
    # lm-eval writes a version as 1.0 for a task and "1.0" for a group.
    return _same_number(a, b) if a is not None and b is not None else a == b


# ---------------------------------------------------------------- helpers


def _tasks(run: RunResults) -> set[str]:
    return {k.task for k in run.series} | set(run.provenance.configs)


def _task_set(b_tasks: set[str], c_tasks: set[str]) -> list[str]:
    only_b, only_c = sorted(b_tasks - c_tasks), sorted(c_tasks - b_tasks)
    if not (only_b or only_c):
        return []
    return [f"tasks differ: only in baseline: {_names(only_b)}; only in candidate: {_names(only_c)}"]


def _metric_set(baseline: RunResults, candidate: RunResults, common: set[str]) -> list[str]:
    out = []
    b_keys = {k for k in baseline.series if k.task in common}
    c_keys = {k for k in candidate.series if k.task in common}
    for key in sorted(b_keys - c_keys, key=str):
        out.append(f"{key}: only in baseline")
    for key in sorted(c_keys - b_keys, key=str):
        out.append(f"{key}: only in candidate")
    return out


def _task_hashes(b: Provenance, c: Provenance, common: list[str], baseline: RunResults | None = None,
                 candidate: RunResults | None = None) -> list[str]:
    out = []
    changed = [
        t
        for t in common
        if b.task_hashes.get(t)
        and c.task_hashes.get(t)
        and not _same_prefix(b.task_hashes[t], c.task_hashes[t])
    ]
    for task in changed[:3]:
        what, kinds = _item_changes(baseline, candidate, task)
        out.append(f"task {task}: its items changed since the baseline ({what}); "
                   f"likely cause: {_likely_cause(b, c, task, kinds)}; fix: evaluate the baseline's data and tasks "
                   "(a pull request's run uses the base commit's), or record a new baseline on purpose "
                   "(gatekeeper run --new-data ..., then gatekeeper baseline promote RUN_DIR)")
    if len(changed) > 3:
        out.append(f"task_hashes differ for {_names(changed[3:])} too (the items, prompts or targets changed)")
    # A prefix of a few characters matches by chance: compared hashes need 16 hex digits each
    # (what the baseline store keeps). The readers refuse shorter ones; this guards hand-built runs.
    short = [
        t
        for t in common
        for h in (b.task_hashes.get(t), c.task_hashes.get(t))
        if h is not None and len(str(h)) < _MIN_HASH_CHARS
    ]
    if short:
        out.append(f"task_hashes too short to compare for {_names(sorted(set(short)))} (need 16 hex digits)")
    return out


_MIN_HASH_CHARS = 16


def _model_id(name: str | None) -> str | None:
    """The model path as the baseline store writes it: an absolute path in a git checkout is
    relative to the repository (so /github/workspace/ckpt and ckpt are the same model)."""
    if not isinstance(name, str):
        return name
    return portable_path(name) if name.startswith("/") else os.path.normpath(name) if "/" in name else name


def _batch_size(value: Any) -> Any:
    """lm-eval's CLI writes batch_size as the string "16", its Python API as the int 16."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return value


def _per_task(label: str, b: dict[str, Any], c: dict[str, Any], tasks: Iterable[str]) -> list[str]:
    return [
        f"task {t}: {label} {_fmt(b.get(t))} in baseline, {_fmt(c.get(t))} in candidate"
        for t in tasks
        if t in b and t in c and _differs(_version(b[t]), _version(c[t]))
    ]


def _version(v: Any) -> Any:
    """lm-eval writes leaf versions as floats and group versions as strings ("1.0")."""
    try:
        return float(v) if isinstance(v, str) else v
    except ValueError:
        return v


def _effective_n(b: Provenance, c: Provenance, common: list[str]) -> list[str]:
    out = []
    for t in common:
        bn = (b.n_samples.get(t) or {}).get("effective")
        cn = (c.n_samples.get(t) or {}).get("effective")
        if bn is not None and cn is not None and _differs(bn, cn):
            out.append(f"task {t}: {bn} items (n-samples effective) in baseline, {cn} in candidate")
    return out


def _configs(b: Provenance, c: Provenance, common: list[str]) -> list[str]:
    out = []
    for t in common:
        bc, cc = b.configs.get(t), c.configs.get(t)
        if not isinstance(bc, dict) or not isinstance(cc, dict):
            continue  # a baseline without configs: nothing to compare
        bc, cc = _flatten_config(bc), _flatten_config(cc)
        for key in sorted(set(bc) | set(cc)):
            if key in _CONFIG_KEYS_CHECKED_ELSEWHERE or key == "metadata.version":
                continue
            bv, cv = bc.get(key, _MISSING), cc.get(key, _MISSING)
            if not _differs(bv, cv):
                continue
            if key == "filter_list":
                out.append(
                    f"task {t}: filters (filter_list) differ: {_filter_names(bv)} in baseline, {_filter_names(cv)} in candidate"
                )
            else:
                out.append(f"task {t}: config {key} differs: {_fmt(bv)} in baseline, {_fmt(cv)} in candidate")
    return out


class _Missing:
    def __repr__(self) -> str:
        return "absent"


_MISSING = _Missing()


def _flatten_config(config: dict[str, Any]) -> dict[str, Any]:
    """Top-level keys, with ``metadata`` spread out as ``metadata.<key>`` (model args removed)."""
    out = {k: v for k, v in config.items() if k != "metadata"}
    meta = config.get("metadata")
    if isinstance(meta, dict):
        out.update({f"metadata.{k}": v for k, v in meta.items() if k not in _MODEL_METADATA})
    elif meta is not None:
        out["metadata"] = meta
    return out


def _filter_names(filters: Any) -> str:
    if isinstance(filters, list):
        names = [f.get("name", "?") if isinstance(f, dict) else "?" for f in filters]
        return "[" + ", ".join(names) + "]"
    return _fmt(filters)


# Manifest fields worth a line of context; the rest (timestamps, file names, the command line)
# differ on every run and would bury what matters.
_MANIFEST_CONTEXT = ("revision", "torch_version", "gatekeeper_version", "hardware")


def _manifest(b: dict[str, Any], c: dict[str, Any]) -> list[str]:
    if not b or not c:
        return []  # only one side has a manifest: nothing meaningful to compare
    out = []
    # A manifest without "backend" predates the key: those runs all used lm-eval's hf.
    b_backend, c_backend = b.get("backend") or "hf", c.get("backend") or "hf"
    if b_backend != c_backend:
        out.append(f"backend: {b_backend} in baseline, {c_backend} in candidate (another engine's "
                   "numerical noise; the margins are there for it)")
    b_files, c_files = b.get("model_files") or {}, c.get("model_files") or {}
    changed = sorted(name for name in set(b_files) | set(c_files) if b_files.get(name) != c_files.get(name))
    if changed:
        out.append(f"model files differ (sha256): {', '.join(changed)}")
    bf = _flatten({k: b[k] for k in _MANIFEST_CONTEXT if k in b}, prefix="")
    cf = _flatten({k: c[k] for k in _MANIFEST_CONTEXT if k in c}, prefix="")
    out += [
        f"{key}: {_fmt(bf.get(key, _MISSING))} in baseline, {_fmt(cf.get(key, _MISSING))} in candidate"
        for key in sorted(set(bf) | set(cf))
        if _differs(bf.get(key, _MISSING), cf.get(key, _MISSING))
    ]
    return out + _packages(b.get("package_versions"), c.get("package_versions"))


def _packages(b: Any, c: Any) -> list[str]:
    """Runtime package versions (gatekeeper/packages.py), compared only where both runs recorded
    them: a baseline from before they were recorded must not bury the report in "unset" lines.
    torch and transformers are already named from their own fields."""
    if not isinstance(b, dict) or not isinstance(c, dict):
        return []
    return [
        f"{name} version: {_fmt(b.get(name))} in baseline, {_fmt(c.get(name))} in candidate"
        for name in sorted(set(b) | set(c))
        if name not in ("torch", "transformers") and _differs(b.get(name), c.get(name))
    ]


def _flatten(d: dict[str, Any], prefix: str = "manifest ") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _norm(value: Any) -> Any:
    # Numbers as floats (CLI writes limit 20.0, the API 20) and tuples as lists (a baseline that
    # went through a JSON file), so that only real differences differ.
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dict):
        return {str(k): _norm(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_norm(v) for v in value]
    return repr(value)


# lm-eval writes a task's ``!function`` callables (doc_to_choice, process_docs, ...) into its
# config with their address, which changes every run: only the name says what the code is (its
# content is the task code's identity, compared on its own).
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")


def _canon(value: Any) -> str:
    return _ADDRESS.sub(">", json.dumps(_norm(value), sort_keys=True))


def _differs(a: Any, b: Any) -> bool:
    return _canon(a) != _canon(b)


def check_items_before(stored: RunResults, built: dict[str, list[tuple[str, str]]]) -> int:
    """``gate --dry-run``: the baseline's items against the documents the suite's tasks build now
    (``built``: leaf task -> (doc_hash, target_hash) by doc_id), before any model runs. Returns how
    many items were checked; GateError naming the task, the items and the likely cause otherwise."""
    checked, problems = 0, []
    for task, rows in sorted(built.items()):
        keys = sorted((k for k in stored.series if k.task == task), key=str)
        if not keys:
            continue
        s = stored.series[keys[0]]
        before = {int(d): (h[0], h[2]) for d, h in _rows(s).items()}
        differ, kinds = _changed_items(list(before), before, dict(enumerate(rows)), ("doc", "target"))
        checked += s.n
        if differ:
            cause = _DOCUMENTS_CHANGED if kinds & {"doc", "doc_id"} else "the task's target template or a !function helper"
            # Only a manifest without the key predates them; {} means the tasks load no hub dataset.
            if "datasets" not in (stored.provenance.manifest or {}) and kinds & {"doc", "doc_id"}:
                cause += "; this baseline predates recorded dataset revisions"
            elif (stored.provenance.manifest or {}).get("datasets") == {} and kinds & {"doc", "doc_id"}:
                cause = (f"the documents of {task} changed (it loads no hub dataset: a local data file or the task's "
                         "YAML was edited since the baseline)")
            problems.append(f"task {task}: {len(differ)} of {s.n} of the baseline's items differ from the documents "
                            f"built now in their {_kinds(kinds)} hash, the first doc_id {differ[0]}; likely cause: "
                            f"{cause}; fix: record a new baseline on purpose (gatekeeper run --new-data ..., then "
                            "gatekeeper baseline promote RUN_DIR)")
    if problems:
        raise GateError(f"{stored.provenance.source}: " + "; ".join(problems[:3])
                        + (f" (and {len(problems) - 3} more tasks)" if len(problems) > 3 else ""))
    return checked


def _item_changes(baseline: RunResults | None, candidate: RunResults | None, task: str) -> tuple[str, set[str]]:
    """('N of M items differ in their doc hash, the first doc_id D', the hashes that differ) for
    one of the task's series."""
    keys = sorted((k for k in (baseline.series if baseline else {}) if k.task == task
                   and candidate is not None and k in candidate.series), key=str)
    if not keys:
        return "lm-eval's task hash differs", set()
    b_rows, c_rows = _rows(baseline.series[keys[0]]), _rows(candidate.series[keys[0]])
    docs = sorted(set(b_rows) | set(c_rows))
    differ, kinds = _changed_items(docs, b_rows, c_rows, ("doc", "prompt", "target"))
    if not differ:
        return "every item's hashes agree; lm-eval's task hash differs", kinds
    return f"{len(differ)} of {len(docs)} items differ in their {_kinds(kinds)} hash, the first doc_id {differ[0]}", kinds


_DOCUMENTS_CHANGED = ("the documents changed (a hub dataset without a recorded revision, a local data file, or the "
                      "task's YAML)")
_HASH_KINDS = ("doc_id", "doc", "prompt", "target")


def _rows(s: MetricSeries) -> dict[int, tuple[str, ...]]:
    """{doc_id: (doc_hash, prompt_hash, target_hash)} of a series."""
    return {int(d): tuple(h) for d, h in zip(s.doc_ids, np.asarray(s.hashes, dtype=str).reshape(-1, 3), strict=True)}


def _changed_items(docs: list[int], before: dict[int, tuple[str, ...]], after: dict[int, tuple[str, ...]],
                   names: tuple[str, ...]) -> tuple[list[int], set[str]]:
    """(the docs, in ``docs``' order, whose hashes differ or that one side lacks, and which of
    ``names`` or "doc_id" differ); hashes compare on their common prefix, an empty one on nothing."""
    differ: list[int] = []
    kinds: set[str] = set()
    for doc in docs:
        if doc not in before or doc not in after:
            found = {"doc_id"}
        else:
            found = {name for name, x, y in zip(names, before[doc], after[doc], strict=True) if not _same_prefix(x, y)}
        if found:
            differ.append(doc)
            kinds |= found
    return differ, kinds


def _kinds(kinds: set[str]) -> str:
    return "/".join(k for k in _HASH_KINDS if k in kinds)


def _likely_cause(b: Provenance, c: Provenance, task: str, kinds: set[str]) -> str:
    """The recorded difference that explains changed items, most specific first."""
    moved = [f"dataset {name} at revision {bs[:7]} in the baseline, {cs[:7]} in the candidate"
             for name, bs, cs in dataset_moves(b.manifest, c.manifest)]
    if moved:
        return "; ".join(moved)
    changed = taskcode.changed_paths((b.manifest or {}).get("task_files") or {}, (c.manifest or {}).get("task_files") or {}) \
        if (b.manifest or {}).get("task_files") and (c.manifest or {}).get("task_files") else []
    if changed:
        return taskcode.describe_changes(changed)
    if b.lm_eval_version != c.lm_eval_version:
        return f"lm-eval {b.lm_eval_version} in the baseline, {c.lm_eval_version} in the candidate"
    if kinds and not kinds & {"doc", "doc_id"}:
        return (f"the prompts or targets {task} builds from the same documents (its YAML's templates, a "
                "!function helper, the few-shot settings or the chat template)")
    return _DOCUMENTS_CHANGED.replace("the documents", f"the documents of {task}", 1)


def dataset_moves(b: dict[str, Any] | None, c: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """(dataset, commit in ``b``, commit in ``c``) of each hub dataset both manifests recorded at
    different commits (run/pins.py): new data, not a new model."""
    bd, cd = (b or {}).get("datasets"), (c or {}).get("datasets")
    if not (isinstance(bd, dict) and isinstance(cd, dict)):
        return []
    return [(name, str(bd[name]), str(cd[name])) for name in sorted(set(bd) & set(cd)) if bd[name] != cd[name]]


def _same_prefix(a: str, b: str) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def _as_int(v: Any) -> int:
    try:
        return int(v or 0)
    except (TypeError, ValueError):
        return 0


def _date(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _fmt(value: Any, limit: int = 60) -> str:
    if value is None:
        return "unset"
    text = (
        value
        if isinstance(value, str)
        else repr(value)
        if isinstance(value, _Missing)
        else json.dumps(value, default=repr)
    )
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _names(items: list[str], limit: int = 8) -> str:
    if not items:
        return "none"
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _count_eg(ids: np.ndarray, side: str) -> str:
    if not ids.size:
        return f"0 only in {side}"
    eg = ", ".join(str(int(i)) for i in ids[:3])
    return f"{ids.size} only in {side} (e.g. {eg})"


def _check_hashes(b: np.ndarray, c: np.ndarray, doc_ids: np.ndarray, where: str) -> None:
    names = ("doc", "prompt", "target")
    if b.dtype == c.dtype and b.shape == c.shape and np.array_equal(b, c):
        return  # the usual case, the same items: one comparison, not a prefix cut per column
    if b.dtype.kind != c.dtype.kind or b.dtype.kind not in "SU":  # bytes beside str: compare as str
        b, c = b.astype(str), c.astype(str)
    kind = b.dtype.kind
    for col in range(3):
        bc, cc = b[:, col], c[:, col]
        if not bc.size:
            return
        n = min(int(np.char.str_len(bc).min()), int(np.char.str_len(cc).min()))
        if n == 0:
            continue  # a side without hashes (nothing to check against)
        # Casting to a shorter dtype truncates: compare on the common prefix length.
        bad = np.flatnonzero(bc.astype(f"{kind}{n}") != cc.astype(f"{kind}{n}"))
        if bad.size:
            more = f" (and {bad.size - 1} more items)" if bad.size > 1 else ""
            raise GateError(f"{where} doc_id {int(doc_ids[bad[0]])}: {names[col]} hash differs{more}")


def check_repeats(runs: list[RunResults], flag: str) -> None:
    """Refuse a repeated run (``--also-baseline/--also-candidate``) that is not another run of
    the same model under the same settings as the first: everything ``check_compatible`` calls
    an error (items, prompts, n-shot, lm-eval version, ...) plus the model, its files (sha256,
    from the manifests) and dtype. Averaging such a run in would blend two models or two
    measurements and could halve a real drop."""
    first = runs[0]
    for other in runs[1:]:
        problems = compatibility_errors(first, other)
        problems += _same_model(first.provenance, other.provenance)
        if problems:
            text = "; ".join(problems).replace(" in baseline", " in the first run").replace(
                " in candidate", " in this one")
            raise GateError(
                f"{other.provenance.source}: not a repeat of {first.provenance.source} ({text}); "
                f"{flag} takes another run of the same model with the same suite (e.g. another seed)"
            )


def _same_model(first: Provenance, other: Provenance) -> list[str]:
    out = []
    for label, a, b in (("model", _model_id(first.model_name), _model_id(other.model_name)),
                        ("dtype", first.model_dtype, other.model_dtype)):
        if _differs(a, b):
            out.append(f"{label} {_fmt(a)} in baseline, {_fmt(b)} in candidate")
    a_files = (first.manifest or {}).get("model_files") or {}
    b_files = (other.manifest or {}).get("model_files") or {}
    if a_files and b_files and a_files != b_files:
        changed = sorted(n for n in set(a_files) | set(b_files) if a_files.get(n) != b_files.get(n))
        out.append(f"model files differ (sha256): {', '.join(changed)}")
    return out
