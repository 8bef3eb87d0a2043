"""Is a comparison apples to apples? Checks that two runs measured the same items the same way.

``check_compatible`` lists every difference between two ``RunResults``: ``error`` when the items,
prompts or scoring changed (the comparison would measure the change of the task, not of the
model; exit 2), ``context`` when it is harmless but worth showing (batch size, dtype, device,
date, model, library versions, hardware). ``pair_series`` aligns one series of both runs item
by item and refuses items whose hashes differ.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np

from gatekeeper.model import GateError, MetricSeries, Provenance, RunResults

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
    errors += _task_hashes(b, c, common)
    errors += _per_task(
        "version", b.task_versions, c.task_versions, sorted(set(b.task_versions) & set(c.task_versions))
    )
    errors += _per_task("num_fewshot", b.n_shot, c.n_shot, common)
    if _differs(b.limit, c.limit):
        errors.append(f"limit {_fmt(b.limit)} in baseline, {_fmt(c.limit)} in candidate")
    errors += _effective_n(b, c, common)
    errors += _configs(b, c, common)
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
    return [Difference("error", m) for m in errors] + [Difference("context", m) for m in context]


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
    only_b = np.setdiff1d(b_ids, c_ids)
    only_c = np.setdiff1d(c_ids, b_ids)
    if only_b.size or only_c.size:
        raise GateError(
            f"{where}: doc_ids differ: {_count_eg(only_b, 'baseline')}, {_count_eg(only_c, 'candidate')}"
        )
    if len(np.unique(b_ids)) != b_ids.size or len(np.unique(c_ids)) != c_ids.size:
        raise GateError(f"{where}: duplicate doc_ids")
    b_order, c_order = np.argsort(b_ids, kind="stable"), np.argsort(c_ids, kind="stable")
    _check_hashes(
        np.asarray(baseline.hashes, dtype=str).reshape(-1, 3)[b_order],
        np.asarray(candidate.hashes, dtype=str).reshape(-1, 3)[c_order],
        b_ids[b_order],
        where,
    )
    clusters = candidate.clusters if candidate.clusters is not None else baseline.clusters
    if clusters is not None:
        clusters = np.asarray(clusters)[c_order if candidate.clusters is not None else b_order]
    return np.asarray(baseline.values)[b_order], np.asarray(candidate.values)[c_order], clusters


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


def _task_hashes(b: Provenance, c: Provenance, common: list[str]) -> list[str]:
    out = []
    changed = [
        t
        for t in common
        if b.task_hashes.get(t)
        and c.task_hashes.get(t)
        and not _same_prefix(b.task_hashes[t], c.task_hashes[t])
    ]
    if changed:
        out.append(f"task_hashes differ for {_names(changed)} (the items, prompts or targets changed)")
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
    from gatekeeper.store import portable_path

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


def _canon(value: Any) -> str:
    return json.dumps(_norm(value), sort_keys=True)


def _differs(a: Any, b: Any) -> bool:
    return _canon(a) != _canon(b)


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
    for col in range(3):
        bc, cc = b[:, col], c[:, col]
        if not bc.size:
            return
        n = min(int(np.char.str_len(bc).min()), int(np.char.str_len(cc).min()))
        if n == 0:
            continue  # a side without hashes (nothing to check against)
        # Casting to a shorter unicode dtype truncates: compare on the common prefix length.
        bad = np.flatnonzero(bc.astype(f"<U{n}") != cc.astype(f"<U{n}"))
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
        problems = [d.message for d in check_compatible(first, other) if d.severity == "error"]
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
