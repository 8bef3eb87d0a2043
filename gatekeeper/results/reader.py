"""Read what ``lm_eval ... --output_path DIR --log_samples`` wrote into a ``RunResults``.

Layout (lm-eval 0.4.13)::

    DIR/<model_name_sanitized>/results_<ts>.json
    DIR/<model_name_sanitized>/samples_<task>_<ts>.jsonl     one per leaf task

``load_run`` accepts DIR, the model subfolder, or one results file. Every aggregate in
results.json is recomputed from the per-item values; a mismatch means this reader is wrong or
the files do not belong together, and is an error rather than a silent wrong answer.

Samples files are streamed line by line (they can be 100+ MB); only the per-item values,
hashes and short snippets are kept. Imports neither torch nor lm-eval.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from gatekeeper.errors import GateError
from gatekeeper.files import TooLarge, conflict_hint, merge_conflicted, read_limited
from gatekeeper.model import MetricSeries, Provenance, RunResults, SeriesKey, is_finite, is_int
from gatekeeper.results import trusted
from gatekeeper.results.layout import MANIFEST_NAME, find_results_file, samples_path
from gatekeeper.results.metrics import MetricKind, bind_function, kind_for, kind_named
from gatekeeper.results.samples import FilterData, Wanted, read_samples
from gatekeeper.results.snippets import attach_snippets
from gatekeeper.results.trusted import aggregation_id, function_name
from gatekeeper.text import json_problem, short

_REQUIRED_KEYS = ("results", "configs", "versions", "n-samples")
# Keys in a results[task] entry that are not metric values.
NON_METRIC_KEYS = {"name", "alias", "sample_len", "sample_count", "samples"}
# lm-eval's default aggregation when metric_list gives none (api/metrics.py registrations).
DEFAULT_AGGREGATION = {
    "word_perplexity": "weighted_perplexity",
    "byte_perplexity": "weighted_perplexity",
    "bits_per_byte": "bits_per_byte",
    "perplexity": "perplexity",
    "bleu": "bleu",
    "chrf": "chrf",
    "chrf++": "chrf++",
    "ter": "ter",
    "f1": "f1",
    "mcc": "matthews_corrcoef",
    "brier_score": "brier_score",
}
_REL_TOL, _ABS_TOL = 1e-9, 1e-12


# ---------------------------------------------------------------- results.json


# lm-eval writes about 4 KB per task to results.json (configs included): a 500-task suite is
# about 2 MB. Parsing JSON takes several times its size in memory, so a file over this cap is
# refused before it is read rather than parsed into gigabytes.
MAX_RESULTS_BYTES = 32 << 20


def _read_json(path: Path, what: str = "") -> Any:
    try:
        text = read_limited(path, MAX_RESULTS_BYTES).decode("utf-8")
    except TooLarge:
        raise GateError(
            f"{path}: larger than {MAX_RESULTS_BYTES >> 20} MiB; lm-eval results files are a few MB "
            "(about 4 KB per task): pass the run's results_<timestamp>.json, not another file"
        ) from None
    except OSError as exc:
        raise GateError(f"{path}: cannot read{what} ({exc.strerror})") from None
    except UnicodeDecodeError:
        if merge_conflicted(read_limited(path, MAX_RESULTS_BYTES)):
            raise GateError(f"{path}: not valid UTF-8 text: {conflict_hint(path)}") from None
        raise GateError(f"{path}: not valid UTF-8 text") from None
    if not text.strip():
        raise GateError(f"{path}: empty file")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data" and _looks_like_samples(text):
            raise GateError(
                f"{path}: this is an lm-eval samples file (one JSON object per line); pass the "
                "run's results_<timestamp>.json or its output folder instead"
            ) from None
        raise GateError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:
        # ValueError: an integer of more than 4300 digits; RecursionError: arrays nested
        # thousands deep. Both are valid JSON no lm-eval writes.
        raise GateError(f"{path}: not usable JSON ({json_problem(exc)})") from None


def _looks_like_samples(text: str) -> bool:
    """True when the first line is one JSON object with a doc_id (lm-eval's samples lines)."""
    first = text.lstrip().split("\n", 1)[0]
    try:
        obj = json.loads(first)
    except (ValueError, RecursionError):
        return False
    return isinstance(obj, dict) and "doc_id" in obj


def _load_results_json(path: Path) -> dict[str, Any]:
    data = _read_json(path)
    if not isinstance(data, dict):
        raise GateError(f"{path}: expected a JSON object (lm-eval results), got {type(data).__name__}")
    missing = [k for k in _REQUIRED_KEYS if k not in data]
    if missing:
        raise GateError(f"{path}: missing required key(s) {', '.join(missing)}; not an lm-eval results file?")
    for key in _REQUIRED_KEYS:
        if not isinstance(data[key], dict):
            raise GateError(f"{path}: '{key}' should be an object")
    _check_types(path, data)
    return data


# ---------------------------------------------------------------- field types
# Every field this reader uses, with the type lm-eval 0.4.13 writes (lm_eval/result_schema.py):
# a file that is valid JSON but has another shape is refused here, naming the field, instead of
# crashing (or being misread) wherever the field is used.

_HEX64 = re.compile(r"[0-9a-f]{64}")
_MAX_DATE = 253402300799.0  # 9999-12-31T23:59:59Z: datetime cannot go further


def _bad_field(path: Path, field: str, value: Any, want: str) -> GateError:
    return GateError(
        f"{path}: {field} is {short(value)}, expected {want} "
        "as lm-eval 0.4.13 writes it (file edited or not lm-eval output; re-run lm-eval)"
    )


def _objects(path: Path, data: dict[str, Any], key: str, check: Any, want: str) -> None:
    """``data[key]`` (when present) is an object whose every value passes ``check``."""
    if key not in data:
        return
    value = data[key]
    if not isinstance(value, dict):
        raise _bad_field(path, f"'{key}'", value, "an object")
    for name, item in value.items():
        if not check(item):
            raise _bad_field(path, f"{key}[{name}]", item, want)


def _check_types(path: Path, data: dict[str, Any]) -> None:
    _objects(path, data, "results", lambda v: isinstance(v, dict), "an object")
    _objects(path, data, "groups", lambda v: isinstance(v, dict), "an object")
    _objects(path, data, "configs", lambda v: isinstance(v, dict), "an object (a task config)")
    _objects(path, data, "versions", lambda v: v is None or isinstance(v, str) or is_finite(v),
             "a version (string or number)")
    _objects(path, data, "n-shot", lambda v: v is None or (is_int(v) and 0 <= v < 1 << 31),
             "a number of few-shot examples")
    _objects(path, data, "higher_is_better",
             lambda v: isinstance(v, dict) and all(h is None or isinstance(h, bool) for h in v.values()),
             "an object of true/false per metric")
    _objects(path, data, "n-samples",
             lambda v: isinstance(v, dict) and all(is_int(v.get(k)) and 0 <= v[k] < 1 << 53
                                                   for k in ("original", "effective")),
             'an object {"original": N, "effective": N}')
    _objects(path, data, "task_hashes", lambda v: isinstance(v, str) and _HEX64.fullmatch(v) is not None,
             "a sha256 (64 hex digits)")
    _objects(path, data, "group_subtasks",
             lambda v: isinstance(v, list) and all(isinstance(t, str) for t in v), "a list of task names")
    for key in ("lm_eval_version", "transformers_version", "model_name"):
        if key in data and not isinstance(data[key], str):
            raise _bad_field(path, f"'{key}'", data[key], "a string")
    if data.get("chat_template_sha") is not None and not isinstance(data["chat_template_sha"], str):
        raise _bad_field(path, "'chat_template_sha'", data["chat_template_sha"], "a string or null")
    date = data.get("date")
    if date is not None and not (is_finite(date) and 0 <= float(date) <= _MAX_DATE):
        raise _bad_field(path, "'date'", date, "a Unix time in seconds")
    _check_config(path, data.get("config"))
    for section in ("results", "groups"):
        for task, entry in (data.get(section) or {}).items():
            for (metric, filt), value in _reported_metrics(entry).items():
                if isinstance(value, (int, float)) and not is_finite(value):
                    raise _bad_field(path, f"{section}[{task}] {metric},{filt}", value, "a finite number")


def _check_config(path: Path, config: Any) -> None:
    if config is None:
        return
    if not isinstance(config, dict):
        raise _bad_field(path, "'config'", config, "an object")
    want = {
        "model": (str,), "model_dtype": (str,), "device": (str,),
        "model_args": (str, dict), "batch_size": (str, int),
        "limit": (int, float), "random_seed": (int,), "numpy_seed": (int,),
        "torch_seed": (int,), "fewshot_seed": (int,),
    }
    for key, types in want.items():
        value = config.get(key)
        if value is None:
            continue
        if not isinstance(value, types) or isinstance(value, bool) or (
            isinstance(value, (int, float)) and not is_finite(value)
        ):
            names = " or ".join("an object" if t is dict else f"a{'n' if t is int else ''} {t.__name__}"
                                for t in types)
            raise _bad_field(path, f"config.{key}", value, f"{names} or null")


def _parse_model_args(model_args: Any) -> dict[str, Any]:
    """config.model_args: a dict (CLI) or the raw ``k=v,k=v`` string (Python API)."""
    if isinstance(model_args, dict):
        return dict(model_args)
    out: dict[str, Any] = {}
    if isinstance(model_args, str):
        for part in model_args.split(","):
            key, sep, value = part.partition("=")
            if sep and key.strip():
                out[key.strip()] = value.strip()
    return out


def _strip_config(config: dict[str, Any], model_args: dict[str, Any]) -> dict[str, Any]:
    """Remove what lm-eval merged into ``metadata`` from the model side, so two models
    evaluated on the same task have equal configs."""
    config = dict(config)
    meta = config.get("metadata")
    if isinstance(meta, dict):
        drop = set(model_args) | {"pretrained", "dtype", "config_source"}
        config["metadata"] = {k: v for k, v in meta.items() if k not in drop}
    return config


def _load_manifest(results_file: Path) -> dict[str, Any]:
    for folder in (results_file.parent, results_file.parent.parent):
        candidate = folder / MANIFEST_NAME
        if candidate.is_file():
            data = _read_json(candidate)
            if not isinstance(data, dict):
                raise GateError(f"{candidate}: expected a JSON object")
            problem = manifest_problem(data)
            if problem:
                raise GateError(f"{candidate}: {problem} (edited, or not written by gatekeeper run?)")
            return data
    return {}


def is_lock(value: Any) -> bool:
    """A manifest's ``datasets``: {hub dataset: 40-hex commit sha} (run/pins.py)."""
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str)
                                           and re.fullmatch("[0-9a-f]{40}", v) for k, v in value.items())


def manifest_problem(manifest: dict[str, Any]) -> str | None:
    """What is wrong with the types of the manifest fields the gate reads (None when fine)."""
    for key in ("suite_hash", "model", "model_path", "suite_name"):
        value = manifest.get(key)
        if value is not None and not isinstance(value, str):
            return f"{key} is {short(value)}, expected a string"
    for key in ("model_files", "task_files"):
        files = manifest.get(key)
        if files is not None and not (isinstance(files, dict) and all(
                isinstance(k, str) and (isinstance(v, str) or v is None) for k, v in files.items())):
            return f"{key} is {short(files)}, expected an object of sha256 digests"
    locked = manifest.get("datasets")
    if locked is not None and not is_lock(locked):
        return f"datasets is {short(locked)}, expected an object of dataset commit shas"
    hashed = manifest.get("suite_hashed")
    if hashed is not None and not isinstance(hashed, dict):
        return f"suite_hashed is {short(hashed)}, expected an object (the suite's hashed fields)"
    return None


def _provenance(path: Path, data: dict[str, Any], manifest: dict[str, Any]) -> Provenance:
    config = data.get("config") if isinstance(data.get("config"), dict) else {}
    model_args = _parse_model_args(config.get("model_args"))
    configs = {
        task: _strip_config(cfg, model_args) if isinstance(cfg, dict) else cfg
        for task, cfg in data["configs"].items()
    }
    seeds = {k: config.get(k) for k in ("random_seed", "numpy_seed", "torch_seed", "fewshot_seed")}
    date = data.get("date")
    return Provenance(
        source=str(path),
        lm_eval_version=data.get("lm_eval_version"),
        task_versions=dict(data.get("versions") or {}),
        n_shot=dict(data.get("n-shot") or {}),
        configs=configs,
        seeds=seeds,
        limit=config.get("limit"),
        n_samples=dict(data.get("n-samples") or {}),
        task_hashes=dict(data.get("task_hashes") or {}),
        model_name=data.get("model_name") or model_args.get("pretrained") or config.get("model"),
        model_dtype=config.get("model_dtype") or model_args.get("dtype"),
        batch_size=config.get("batch_size"),
        device=config.get("device"),
        chat_template_sha=data.get("chat_template_sha"),
        transformers_version=data.get("transformers_version"),
        date=float(date) if isinstance(date, (int, float)) else None,
        suite_hash=manifest.get("suite_hash"),
        manifest=manifest,
    )


def _reported_metrics(entry: dict[str, Any]) -> dict[tuple[str, str], Any]:
    """{(metric, filter): value} from one results[task] entry, stderr and labels left out."""
    out = {}
    for key, value in entry.items():
        if key in NON_METRIC_KEYS or "," not in key:
            continue
        metric, _, filt = key.partition(",")
        if metric.endswith("_stderr"):
            continue
        out[(metric, filt)] = value
    return out


def metric_aggregations(config: dict[str, Any]) -> dict[str, str]:
    out = {}
    for item in config.get("metric_list") or []:
        if isinstance(item, dict) and isinstance(item.get("metric"), str):
            agg = item.get("aggregation")
            out[item["metric"]] = (
                agg if isinstance(agg, str) else DEFAULT_AGGREGATION.get(item["metric"], "mean")
            )
    return out


def aggregation_name(agg: str) -> str:
    """A short name for an aggregation: lm-eval writes a ``!function`` aggregation's whole
    Python source into results.json; its ``def`` line names it."""
    match = re.search(r"^\s*def\s+([A-Za-z_]\w*)", agg, re.MULTILINE)
    if match:
        return f"!function {match.group(1)}"
    first = agg.strip().splitlines()[0] if agg.strip() else agg
    return first if len(first) <= 60 else first[:57] + "..."


def _kind(aggregation: str) -> MetricKind | None:
    return kind_for(aggregation)


def _kind_of(task: str, metric: str, aggregation: str) -> tuple[MetricKind | None, str]:
    """(kind, aggregation as the series records it). A ``!function`` aggregation, which
    results.json holds as Python source, is never executed from there: it is testable only
    when trusted task code (``trusted.trusted_code``: the suite's include_path or lm-eval's
    bundled tasks) defines the same function, and is then recorded by its id."""
    kind = kind_for(aggregation)
    if kind is not None or function_name(aggregation) is None:
        return kind, aggregation
    agg_id = aggregation_id(aggregation)
    fn = trusted.resolve(task, metric, agg_id)
    if fn is None:
        return None, aggregation
    bind_function(agg_id, fn)
    return kind_named("function"), agg_id


# ---------------------------------------------------------------- aggregates


def close_enough(a: float, b: float) -> bool:
    """Equal within rounding; an infinite value only matches itself (``inf`` must never be
    within a relative tolerance of everything)."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return a == b
    return abs(a - b) <= max(_ABS_TOL, _REL_TOL * abs(b))


def out_of_range(metric: str, kind: str, values: np.ndarray) -> str | None:
    """Why ``values`` cannot be per-item values of ``metric`` (None when they can): only ranges
    lm-eval guarantees are checked, by the kind (``gatekeeper.results.metrics``)."""
    return kind_named(kind).out_of_range(metric, values)


# ---------------------------------------------------------------- assembling RunResults


def _task_series(
    results_file: Path,
    data: dict[str, Any],
    task: str,
    cluster_field: str | None,
    untestable: dict[SeriesKey, str],
    sample_lines: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]],
    choice_margins: dict[str, tuple[np.ndarray, np.ndarray]] | None,
) -> dict[SeriesKey, MetricSeries]:
    config = data["configs"].get(task) or {}
    entry = data["results"].get(task)
    if not isinstance(entry, dict):
        raise GateError(f"{results_file}: task {task} has a config but no entry in 'results'")
    aggregations = metric_aggregations(config)
    hib_map = (data.get("higher_is_better") or {}).get(task) or {}
    reported: dict[tuple[str, str], float] = {}
    kinds: dict[str, tuple[MetricKind, str]] = {}
    per_filter: dict[str, list[str]] = {}
    for (metric, filt), value in sorted(_reported_metrics(entry).items()):
        agg = aggregations.get(metric, DEFAULT_AGGREGATION.get(metric, "mean"))
        kind, agg = _kind_of(task, metric, agg)
        if kind is None:
            # Recorded, not dropped: whoever gates this metric must hear that it cannot be tested.
            untestable[SeriesKey(task, filt, metric)] = aggregation_name(agg)
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise GateError(f"{results_file}: {task} {metric},{filt} is {short(value)}, not a number")
        reported[(metric, filt)] = float(value)
        kinds[metric] = (kind, agg)
        per_filter.setdefault(filt, []).append(metric)
    if not reported:
        return {}
    path = samples_path(results_file, task)
    if not path.is_file():
        raise GateError(f"{path}: samples file missing for task {task} (was lm-eval run with --log_samples?)")
    # acc's margins (results/informative.py), when asked: from the filter acc is a per-item mean under
    margins_filter = None if choice_margins is None else next(
        (f for f, ms in per_filter.items() if "acc" in ms and kinds["acc"][0].name == "mean"), None)
    by_filter, task_hash = read_samples(path, task, Wanted(per_filter, kinds, cluster_field, margins_filter))
    effective = ((data.get("n-samples") or {}).get(task) or {}).get("effective")
    series = _check_and_build(
        by_filter, task_hash, path, task, data, per_filter, kinds, reported, hib_map, cluster_field, effective,
        sample_lines,
    )
    fd = by_filter.get(margins_filter) if margins_filter is not None else None
    if choice_margins is not None and fd is not None and fd.margins is not None and np.isfinite(fd.margins).any():
        order = np.argsort(fd.doc_ids, kind="stable")
        choice_margins[task] = (fd.doc_ids[order], fd.margins[order])
    return series


def _check_and_build(
    by_filter: dict[str, FilterData],
    task_hash: str,
    path: Path,
    task: str,
    data: dict[str, Any],
    per_filter: dict[str, list[str]],
    kinds: dict[str, tuple[MetricKind, str]],
    reported: dict[tuple[str, str], float],
    hib_map: dict[str, Any],
    cluster_field: str | None,
    effective: Any,
    sample_lines: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]],
) -> dict[SeriesKey, MetricSeries]:
    """Series of one task from its samples, after checking them against results.json; records
    where each item's line starts in ``sample_lines``."""
    series: dict[SeriesKey, MetricSeries] = {}
    for filt, metrics in per_filter.items():
        fd = by_filter.get(filt)
        if fd is None or fd.doc_ids.size == 0:
            raise GateError(
                f"{path}: results.json reports {metrics[0]},{filt} but no sample line has filter {filt}"
            )
        if isinstance(effective, int) and len(fd.doc_ids) != effective:
            raise GateError(
                f"{path}: {len(fd.doc_ids)} docs for filter {filt}, but results.json n-samples "
                f"says {effective} (effective)"
            )
        order = np.argsort(fd.doc_ids, kind="stable")
        doc_ids, hashes = fd.doc_ids[order], fd.hashes[order]
        clusters = fd.clusters[order] if fd.clusters is not None else None
        sample_lines[(task, filt)] = (doc_ids, fd.offsets[order])
        for metric in metrics:
            kind, agg = kinds[metric]
            values = kind.as_array(agg, fd.values[metric])[order]
            try:
                recomputed = kind.aggregate(agg, values)
            except ValueError as exc:
                raise GateError(
                    f"{path}: {metric},{filt}: cannot aggregate the per-item values ({exc})"
                ) from None
            problem = kind.out_of_range(metric, values)
            if problem:
                raise GateError(f"{path}: {metric},{filt}: {problem}")
            want = reported[(metric, filt)]
            if not close_enough(recomputed, want):
                raise GateError(
                    f"{path}: {metric},{filt} recomputed from the samples is {recomputed!r}, "
                    f"but results.json says {want!r} (files from different runs?)"
                )
            key = SeriesKey(task, filt, metric)
            hib = hib_map.get(metric)
            series[key] = MetricSeries(
                key=key,
                kind=kind.name,  # type: ignore[arg-type]
                aggregation=agg,
                higher_is_better=bool(hib) if isinstance(hib, bool) else agg not in kind.lower_is_better,
                doc_ids=doc_ids,
                values=values,
                hashes=hashes,
                reported=want,
                clusters=clusters,
            )
    # After the per-filter checks, whose messages say more about a cut or mixed-up file.
    recorded = (data.get("task_hashes") or {}).get(task)
    if isinstance(recorded, str) and recorded and recorded != task_hash:
        raise GateError(
            f"{path}: item hashes do not match task_hashes[{task}] in results.json "
            "(samples file edited or from another run?)"
        )
    return series


def _groups(data: dict[str, Any]) -> tuple[dict[str, dict[str, float]], dict[str, list[str]]]:
    subtasks = {
        g: [str(t) for t in subs]
        for g, subs in (data.get("group_subtasks") or {}).items()
        if isinstance(subs, list)
    }
    names = set(subtasks) | set(data.get("groups") or {})
    names |= {t for t in data["results"] if t not in data["configs"]}
    groups: dict[str, dict[str, float]] = {}
    for name in sorted(names):
        entry = (data.get("groups") or {}).get(name) or data["results"].get(name) or {}
        groups[name] = {
            f"{m},{f}": float(v)
            for (m, f), v in _reported_metrics(entry).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
    return groups, subtasks


def load_run(
    path: str | Path, *, cluster_keys: dict[str, str] | None = None, snippets: bool = False,
    choice_margins: bool = False,
) -> RunResults:
    """Read one lm-eval run (output dir, model subfolder or results file) into ``RunResults``.

    ``cluster_keys`` maps a task to the doc field whose value labels each item's cluster.
    ``snippets=True`` also fills ``run.snippets`` for every item (slow on big runs: prefer
    ``attach_snippets`` for the few items a report shows). ``choice_margins=True`` also fills
    ``run.choice_margins`` (what a baseline stores; half again the time to read a multiple-choice run).
    Raises ``GateError`` (one line, naming the file) on anything missing or inconsistent.
    """
    results_file, notes = find_results_file(Path(path))
    data = _load_results_json(results_file)
    manifest = _load_manifest(results_file)
    cluster_keys = dict(cluster_keys or {})
    leaf_tasks = sorted(data["configs"])
    for task in sorted(set(cluster_keys) - set(leaf_tasks)):
        notes.append(f"cluster key given for {task}, which is not a task of this run; ignored")

    series: dict[SeriesKey, MetricSeries] = {}
    untestable: dict[SeriesKey, str] = {}
    sample_lines: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
    margins: dict[str, tuple[np.ndarray, np.ndarray]] | None = {} if choice_margins else None
    for task in leaf_tasks:
        series.update(_task_series(results_file, data, task, cluster_keys.get(task), untestable, sample_lines,
                                   margins))
    groups, group_subtasks = _groups(data)
    run = RunResults(
        provenance=_provenance(results_file, data, manifest),
        series=series,
        groups=groups,
        group_subtasks=group_subtasks,
        notes=notes,
        untestable=untestable,
        sample_lines=sample_lines,
        choice_margins=margins or {},
    )
    if snippets:
        wanted: dict[tuple[str, str], set[int]] = {}
        for key, s in series.items():
            wanted.setdefault((key.task, key.filter), set()).update(s.doc_ids.tolist())
        attach_snippets(run, wanted)
    return run
