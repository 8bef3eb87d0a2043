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

import hashlib
import itertools
import json
import math
import operator
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from gatekeeper import trusted
from gatekeeper.metrics import MetricKind, Unusual, bind_function, kind_for, kind_named
from gatekeeper.metrics import short as _short
from gatekeeper.model import (
    GateError,
    ItemSnippet,
    MetricSeries,
    Provenance,
    RunResults,
    SeriesKey,
    is_finite,
    is_int,
)
from gatekeeper.trusted import aggregation_id, function_name

MANIFEST_NAME = "gatekeeper-manifest.json"
SNIPPET_CHARS = 300
# lm-eval: datetime.now().isoformat().replace(":", "-"), e.g. 2026-11-30T01-57-33.954527
_TS = r"\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}(?:\.\d+)?"
_RESULTS_RE = re.compile(rf"^(?P<stem>.+)_(?P<ts>{_TS})\.json$")
_REQUIRED_KEYS = ("results", "configs", "versions", "n-samples")
# Keys in a results[task] entry that are not metric values.
_NON_METRIC_KEYS = {"name", "alias", "sample_len", "sample_count", "samples"}
# lm-eval's default aggregation when metric_list gives none (api/metrics.py registrations).
_DEFAULT_AGGREGATION = {
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


# ---------------------------------------------------------------- locating the files


def _timestamp(name: str) -> datetime | None:
    m = _RESULTS_RE.match(name)
    if not m:
        return None
    ts = m.group("ts")
    for fmt in ("%Y-%m-%dT%H-%M-%S.%f", "%Y-%m-%dT%H-%M-%S"):
        try:
            return datetime.strptime(ts, fmt)
        except ValueError:
            continue
    return None


def _results_files(folder: Path) -> list[Path]:
    """Timestamped aggregate files in one folder (results_<ts>.json, or X_<ts>.json from
    ``--output_path X.json``); samples files never match because they end in .jsonl."""
    found = [
        p
        for p in folder.iterdir()
        if p.is_file() and not p.name.startswith("samples_") and _timestamp(p.name) is not None
    ]
    preferred = [p for p in found if p.name.startswith("results_")]
    return preferred or found


def find_results_file(path: Path) -> tuple[Path, list[str]]:
    """The results file to read under ``path`` (newest run when several), and notes about it.

    ``path`` is a results file, a folder holding one (lm-eval's model folder), lm-eval's
    ``--output_path`` (one model folder down), or ``gatekeeper run --out`` (two down:
    ``run-<id>-<attempt>-<ts>/<model>/``, what the fork workflow's artifact holds). Below the
    folder given, exactly one folder with results must exist: two are refused, never guessed.
    """
    path = Path(path)
    if not path.exists():
        raise GateError(f"{path}: no such file or directory")
    if path.is_file():
        if path.name.startswith("samples_") and path.suffix == ".jsonl":
            raise GateError(
                f"{path}: this is an lm-eval samples file; pass the run's results_<timestamp>.json "
                "or its output folder instead"
            )
        return path, []
    if not path.is_dir():
        raise GateError(f"{path}: not a file or directory")
    try:
        if not any(path.iterdir()):
            raise GateError(f"{path}: directory is empty (expected lm-eval --output_path output)")
        folder, notes = _results_folder(path)
        files = _results_files(folder)
    except OSError as exc:  # an unreadable subfolder, or one removed while looking
        raise GateError(f"{exc.filename or path}: cannot read directory ({exc.strerror})") from None
    # Timestamps are local time and all files of one run share one; newest wins, like
    # lm_eval.utils.get_latest_filename.
    files.sort(key=lambda p: (_timestamp(p.name), p.name))
    chosen = files[-1]
    if len(files) > 1:
        notes.append(f"{len(files)} runs in {folder}; using the newest, {chosen.name}")
    return chosen, notes


def _subfolders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir())


def _results_folder(path: Path) -> tuple[Path, list[str]]:
    """The one folder at or below ``path`` (at most two levels) that holds results files."""
    if _results_files(path):
        return path, []
    found = [p for p in _subfolders(path) if _results_files(p)]
    depth = 1
    if not found:  # gatekeeper run --out: run-*/<model>/
        found = [q for p in _subfolders(path) for q in _subfolders(p) if _results_files(q)]
        depth = 2
    if len(found) > 1:
        shown = ", ".join(str(p.relative_to(path)) for p in found[:5]) + (", ..." if len(found) > 5 else "")
        what = "model folders" if depth == 1 else "run folders with results"
        raise GateError(f"{path}: {len(found)} {what} ({shown}); pass one of them")
    if not found:
        raise GateError(
            f"{path}: no results_*.json here or in a model subfolder, nor in a run-*/<model> folder "
            "(was lm-eval or gatekeeper run given this output folder, and did it finish?)"
        )
    notes = [f"using {found[0].relative_to(path)} under {path}"] if depth == 2 else []
    return found[0], notes


def _samples_path(results_file: Path, task: str) -> Path:
    ts = _RESULTS_RE.match(results_file.name)
    if ts is None:
        raise GateError(
            f"{results_file}: cannot find the run's timestamp in the file name "
            "(lm-eval names it results_<timestamp>.json)"
        )
    return results_file.parent / f"samples_{task}_{ts.group('ts')}.jsonl"


# ---------------------------------------------------------------- results.json


# lm-eval writes about 4 KB per task to results.json (configs included): a 500-task suite is
# about 2 MB. Parsing JSON takes several times its size in memory, so a file over this cap is
# refused before it is read rather than parsed into gigabytes.
MAX_RESULTS_BYTES = 32 << 20


def _read_json(path: Path, what: str = "") -> Any:
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_RESULTS_BYTES + 1)  # bounded even where st_size lies (a FIFO, /proc)
        if len(raw) > MAX_RESULTS_BYTES:
            raise GateError(
                f"{path}: larger than {MAX_RESULTS_BYTES >> 20} MiB; lm-eval results files are a few MB "
                "(about 4 KB per task): pass the run's results_<timestamp>.json, not another file"
            )
        text = raw.decode("utf-8")
        del raw
    except OSError as exc:
        raise GateError(f"{path}: cannot read{what} ({exc.strerror})") from None
    except UnicodeDecodeError:
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
        raise GateError(f"{path}: not usable JSON ({_json_problem(exc)})") from None


def _json_problem(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return "a number with too many digits" if "digits" in str(exc) else _short(str(exc), 80)


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
        f"{path}: {field} is {_short(value)}, expected {want} "
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


def manifest_problem(manifest: dict[str, Any]) -> str | None:
    """What is wrong with the types of the manifest fields the gate reads (None when fine)."""
    for key in ("suite_hash", "model", "model_path", "suite_name"):
        value = manifest.get(key)
        if value is not None and not isinstance(value, str):
            return f"{key} is {_short(value)}, expected a string"
    files = manifest.get("model_files")
    if files is not None and not (
        isinstance(files, dict) and all(isinstance(v, str) or v is None for v in files.values())
    ):
        return f"model_files is {_short(files)}, expected an object of sha256 digests"
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
        if key in _NON_METRIC_KEYS or "," not in key:
            continue
        metric, _, filt = key.partition(",")
        if metric.endswith("_stderr"):
            continue
        out[(metric, filt)] = value
    return out


def _aggregations(config: dict[str, Any]) -> dict[str, str]:
    out = {}
    for item in config.get("metric_list") or []:
        if isinstance(item, dict) and isinstance(item.get("metric"), str):
            agg = item.get("aggregation")
            out[item["metric"]] = (
                agg if isinstance(agg, str) else _DEFAULT_AGGREGATION.get(item["metric"], "mean")
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


def _close(a: float, b: float) -> bool:
    """Equal within rounding; an infinite value only matches itself (``inf`` must never be
    within a relative tolerance of everything)."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return a == b
    return abs(a - b) <= max(_ABS_TOL, _REL_TOL * abs(b))


def out_of_range(metric: str, kind: str, values: np.ndarray) -> str | None:
    """Why ``values`` cannot be per-item values of ``metric`` (None when they can): only ranges
    lm-eval guarantees are checked, by the kind (``gatekeeper.metrics``)."""
    return kind_named(kind).out_of_range(metric, values)


# ---------------------------------------------------------------- samples files


@dataclass
class _Wanted:
    """What to collect from one task's samples file."""

    metrics: dict[str, list[str]]  # filter -> metric names (from results.json)
    kinds: dict[str, tuple[MetricKind, str]]  # metric -> (kind, aggregation)
    cluster_field: str | None


@dataclass
class _FilterData:
    """One filter's items in file order. ``values[metric]`` is a list of items (careful reader)
    or an array of them (fast reader); the kind's ``as_array`` takes either."""

    doc_ids: list[int] = field(default_factory=list)
    hashes: list[tuple[str, str, str]] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)
    clusters: list[str] = field(default_factory=list)


def _read_samples(path: Path, task: str, wanted: _Wanted) -> tuple[dict[str, _FilterData], str, bool]:
    """Per-filter items of one samples file, lm-eval's task hash rebuilt from its lines, and
    whether the fast reader produced them."""
    try:
        return (*_read_samples_fast(path, wanted), True)
    except (_Unusual, ValueError, KeyError, TypeError, OverflowError, IndexError, RecursionError):
        # Anything the fast reader does not expect (a blank line, list values, a bad line, ...):
        # the careful reader accepts every valid variant and names the offending line.
        return (*_read_samples_careful(path, task, wanted), False)


# -------------------------------------------- fast reader: whole blocks, no per-line Python


_Unusual = Unusual  # the fast reader met something it does not handle; the careful reader takes over


_BLOCK_BYTES = 8 << 20
# lm-eval writes each line as {"doc_id": N, "doc": ..., "target": ..., "arguments": ...,
# "resps": ..., "filtered_resps": ..., "filter": ..., "metrics": [...], "doc_hash": ...,
# "prompt_hash": ..., "target_hash": ..., <metric>: <value>, ...}. Everything between doc_id and
# filter (the prompts and model outputs: most of the bytes) is never needed for the gate.
_FILTER_SEP = ', "filter": '
_DOC_ID = operator.itemgetter("doc_id", "filter")
_HASHES = operator.itemgetter("doc_hash", "prompt_hash", "target_hash")
_MAX_DOC_ID = (1 << 53) - 1  # lm-eval's doc_ids are list indices; beyond this float/int64 lose them
_HEX_ONLY = re.compile(r"[0-9a-f]*")


def _blocks(path: Path) -> Iterator[str]:
    """The file as text blocks of whole lines (about 8 MiB each), strictly UTF-8."""
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise GateError(f"{path}: cannot read ({exc.strerror})") from None
    with fh:
        rest = b""
        while chunk := fh.read(_BLOCK_BYTES):
            chunk = rest + chunk if rest else chunk
            cut = chunk.rfind(b"\n") + 1  # a newline byte never sits inside a UTF-8 sequence
            rest = chunk[cut:]
            if cut:
                yield chunk[:cut].decode("utf-8")
        if rest:
            yield rest.decode("utf-8")


def _parse_block(text: str, keep_doc: bool) -> list[dict[str, Any]]:
    """One ``json.loads`` for a whole block of lines. Unless the doc is needed (cluster keys),
    each line is cut to ``{"doc_id": N`` + everything from its last ``, "filter": `` on, which
    is still one JSON object per line only when the cut points are the top-level keys: a line
    of another shape makes the block fail to parse (or miss a key) and the careful reader runs.
    The skipped middle of a line is not checked for JSON syntax here; when a broken line still
    cuts into a valid object (two lines glued together), the count, hash or aggregate checks
    fail and ``_task_series`` re-reads the file carefully to name the line."""
    lines = text.rstrip().split("\n")
    if not keep_doc:
        lines = [line[: line.find(", ")] + line[line.rfind(_FILTER_SEP) :] for line in lines]
    objs = json.loads("[" + ",".join(lines) + "]")
    # Exactly one object per line: a line holding "{...}, {...}" would add one.
    if len(objs) != len(lines) or set(map(type, objs)) != {dict}:
        raise _Unusual
    return objs


def _read_samples_fast(path: Path, wanted: _Wanted) -> tuple[dict[str, _FilterData], str]:
    """Like ``_read_samples_careful`` on an ordinary lm-eval file, with C-level loops only.
    Raises ``_Unusual`` (or a lookup/type error) on anything else, without a message."""
    task_hash = hashlib.sha256()
    all_ids: list[int] = []
    all_filters: list[str] = []
    chunks: dict[str, dict[str, list[Any]]] = {}  # filter -> metric -> value arrays per block
    out: dict[str, _FilterData] = {}
    for text in _blocks(path):
        if not text.strip():
            continue
        objs = _parse_block(text, wanted.cluster_field is not None)
        ids, filters = zip(*map(_DOC_ID, objs), strict=True)
        if set(map(type, ids)) != {int} or set(map(type, filters)) != {str}:
            raise _Unusual
        if min(ids) < 0 or max(ids) > _MAX_DOC_ID:
            raise _Unusual
        hashes = list(map(_HASHES, objs))
        joined = "".join(itertools.chain.from_iterable(hashes))  # TypeError unless all str
        if set(map(len, itertools.chain.from_iterable(hashes))) != {64} or not _HEX_ONLY.fullmatch(joined):
            raise _Unusual  # not lm-eval's sha256 hex digests
        task_hash.update(joined.encode("utf-8"))
        all_ids.extend(ids)
        all_filters.extend(filters)
        for filt in set(filters).intersection(wanted.metrics):
            if len(set(filters)) == 1:
                sel, sel_ids, sel_hashes = objs, ids, hashes
            else:
                keep = [i for i, f in enumerate(filters) if f == filt]
                sel = [objs[i] for i in keep]
                sel_ids, sel_hashes = [ids[i] for i in keep], [hashes[i] for i in keep]
            fd = out.setdefault(filt, _FilterData())
            fd.doc_ids.extend(sel_ids)
            fd.hashes.extend(sel_hashes)
            per_metric = chunks.setdefault(filt, {m: [] for m in wanted.metrics[filt]})
            for metric, parts in per_metric.items():
                kind, agg = wanted.kinds[metric]
                parts.append(kind.fast_values(agg, list(map(operator.itemgetter(metric), sel))))
            if wanted.cluster_field is not None:
                docs = list(map(operator.itemgetter("doc"), sel))
                if set(map(type, docs)) != {dict}:
                    raise _Unusual
                fd.clusters.extend(map(str, map(operator.itemgetter(wanted.cluster_field), docs)))
    if len(set(zip(all_ids, all_filters, strict=True))) != len(all_ids):
        raise _Unusual  # a duplicate (doc_id, filter): the careful reader names its line
    for filt, per_metric in chunks.items():
        for metric, parts in per_metric.items():
            out[filt].values[metric] = wanted.kinds[metric][0].join(parts)
    return out, task_hash.hexdigest()


# -------------------------------------------- careful reader: line by line, exact messages


def _iter_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        fh = path.open("r", encoding="utf-8")
    except OSError as exc:
        raise GateError(f"{path}: cannot read ({exc.strerror})") from None
    with fh:
        lineno = 0
        try:
            for lineno, line in enumerate(fh, start=1):  # noqa: B007 - lineno used in except
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    raise GateError(f"{path} line {lineno}: truncated or invalid JSON") from None
                except (ValueError, RecursionError) as exc:
                    raise GateError(f"{path} line {lineno}: not usable JSON ({_json_problem(exc)})") from None
                if not isinstance(obj, dict):
                    raise GateError(f"{path} line {lineno}: expected a JSON object")
                yield lineno, obj
        except UnicodeDecodeError:
            raise GateError(f"{path} line {lineno + 1}: not valid UTF-8") from None


def _read_samples_careful(
    path: Path, task: str, wanted: _Wanted
) -> tuple[dict[str, _FilterData], str]:
    """One ``json.loads`` per line and every check per line, so errors name the line."""
    out: dict[str, _FilterData] = {}
    seen: set[tuple[int, str]] = set()
    # lm-eval: task_hashes[task] = sha256("".join(doc_hash + prompt_hash + target_hash per line))
    task_hash = hashlib.sha256()
    spath = str(path)
    for lineno, line in _iter_lines(path):
        where = f"{spath} line {lineno}"
        doc_id, filt = line.get("doc_id"), line.get("filter", "none")
        if not isinstance(doc_id, int) or isinstance(doc_id, bool):
            raise GateError(f"{where}: doc_id is {_short(doc_id)}, not an integer")
        if not 0 <= doc_id <= _MAX_DOC_ID:
            raise GateError(f"{where}: doc_id {_short(doc_id)} is out of range (lm-eval numbers docs from 0)")
        if not isinstance(filt, str):
            raise GateError(f"{where}: filter is {_short(filt)}, not a string")
        if (doc_id, filt) in seen:
            raise GateError(f"{where}: duplicate doc_id {doc_id} (filter {filt})")
        seen.add((doc_id, filt))
        hashes = tuple(line.get(k) for k in ("doc_hash", "prompt_hash", "target_hash"))
        if not all(isinstance(h, str) and _HEX64.fullmatch(h) for h in hashes):
            raise GateError(
                f"{where}: doc_hash, prompt_hash and target_hash must be sha256 hex digests (64 hex digits)"
            )
        task_hash.update("".join(hashes).encode("utf-8"))  # type: ignore[arg-type]
        metrics = wanted.metrics.get(filt)
        if metrics is None:
            continue  # a filter with no reported metric (nothing to gate on)
        data = out.get(filt)
        if data is None:
            data = out[filt] = _FilterData(values={m: [] for m in metrics})
        data.doc_ids.append(doc_id)
        data.hashes.append(hashes)  # type: ignore[arg-type]
        for metric in metrics:
            if metric not in line:
                raise GateError(f"{where}: no value for {metric} (results.json reports {metric},{filt})")
            kind, agg = wanted.kinds[metric]
            data.values[metric].append(kind.line_value(agg, line, where, metric))
        if wanted.cluster_field is not None:
            doc = line.get("doc")
            if not isinstance(doc, dict) or wanted.cluster_field not in doc:
                raise GateError(
                    f"{where}: doc has no field {wanted.cluster_field!r} (cluster key for {task})"
                )
            data.clusters.append(str(doc[wanted.cluster_field]))
    return out, task_hash.hexdigest()


# ---------------------------------------------------------------- snippets (on demand)


def _clip(text: Any) -> str:
    text = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False)
    return text if len(text) <= SNIPPET_CHARS else text[: SNIPPET_CHARS - 1] + "…"


def _snippet(line: dict[str, Any], multiple_choice: bool) -> ItemSnippet:
    args = line.get("arguments")
    args = args if isinstance(args, dict) else {}
    first = args.get("gen_args_0") if isinstance(args.get("gen_args_0"), dict) else {}
    prompt = first.get("arg_0", "")
    filtered = line.get("filtered_resps")
    target = line.get("target", "")
    output: Any = filtered[0] if isinstance(filtered, list) and filtered else filtered
    if multiple_choice:
        choices = [a.get("arg_1") if isinstance(a, dict) else None for a in args.values()]
        best = _argmax_loglik(filtered)
        if best is not None and best < len(choices) and isinstance(choices[best], str):
            output = choices[best].strip()  # the chosen choice's text (lm-eval stores only lls)
        if isinstance(target, str) and target.isdigit() and int(target) < len(choices):
            gold = choices[int(target)]
            target = gold.strip() if isinstance(gold, str) else target
    return ItemSnippet(
        prompt=_clip(prompt), output=_clip(output if output is not None else ""), target=_clip(target)
    )


def _argmax_loglik(filtered: Any) -> int | None:
    """Index of the highest loglikelihood in MC filtered_resps ``[[ll, is_greedy], ...]``."""
    if not isinstance(filtered, list) or not filtered:
        return None
    try:
        lls = [float(r[0] if isinstance(r, list) else r) for r in filtered]
    except (TypeError, ValueError, IndexError):
        return None
    return max(range(len(lls)), key=lls.__getitem__)  # first maximum, like np.argmax


# Snippets decorate the report; a samples line longer than this (a real one is at most a few
# MB, even with long few-shot prompts) is skipped, so memory stays bounded whatever the file.
SNIPPET_LINE_MAX = 16 << 20
_HEAD_BYTES = 64  # enough for lm-eval's line start {"doc_id": N, (N < 2**53)
_SKIP_BYTES = 1 << 20
_DOC_ID_HEAD = re.compile(rb'\{"doc_id": (\d{1,16}), ')


def _snippet_lines(path: Path, doc_ids: set[int]) -> Iterator[dict[str, Any]]:
    """The parsed lines of a samples file whose doc_id is in ``doc_ids``, streamed: lm-eval
    starts every line with ``{"doc_id": N, ``, so a line with another N is skipped after its
    first bytes without being kept or parsed; a line that starts otherwise is parsed to find
    its doc_id. Memory is bounded by ``SNIPPET_LINE_MAX`` (longer lines are skipped), not by
    the file. Lines that do not parse are skipped too: snippets only decorate the report."""
    with path.open("rb") as fh:
        while head := fh.readline(_HEAD_BYTES):
            m = _DOC_ID_HEAD.match(head)
            if m is not None and int(m.group(1)) not in doc_ids:
                _skip_rest(fh, head)
                continue
            line = _rest_of_line(fh, head)
            obj = _loads_or_none(line) if line is not None else None
            doc_id = obj.get("doc_id") if obj is not None else None
            if isinstance(doc_id, int) and not isinstance(doc_id, bool) and doc_id in doc_ids:
                yield obj


def _skip_rest(fh: Any, head: bytes) -> None:
    chunk = head
    while chunk and not chunk.endswith(b"\n"):
        chunk = fh.readline(_SKIP_BYTES)


def _rest_of_line(fh: Any, head: bytes) -> bytes | None:
    """The whole line that starts with ``head``, or None (and skipped) when over the cap."""
    if head.endswith(b"\n"):
        return head
    rest = fh.readline(SNIPPET_LINE_MAX - len(head) + 1)
    line = head + rest
    if len(line) > SNIPPET_LINE_MAX and not line.endswith(b"\n"):
        _skip_rest(fh, line[-1:])
        return None
    return line


def _loads_or_none(line: bytes) -> dict[str, Any] | None:
    try:
        obj = json.loads(line.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):  # RecursionError: arrays nested thousands deep
        return None
    return obj if isinstance(obj, dict) else None


def attach_snippets(run: RunResults, wanted: dict[tuple[str, str], set[int]]) -> None:
    """Fill ``run.snippets[(task, filter)][doc_id]`` for the wanted items only, re-reading just
    those tasks' samples files (found beside ``run.provenance.source``).

    Best effort, never raises: a run read from a baseline file (no samples), a samples file
    that is gone or a line that does not parse leave those snippets out.
    """
    source = Path(run.provenance.source)
    if _RESULTS_RE.match(source.name) is None or not source.is_file():
        return  # a baseline file, or not an lm-eval results file
    by_task: dict[str, dict[str, set[int]]] = {}
    for (task, filt), ids in wanted.items():
        if ids:
            by_task.setdefault(task, {})[filt] = {int(i) for i in ids}
    for task, filters in sorted(by_task.items()):
        path = _samples_path(source, task)
        multiple_choice = (run.provenance.configs.get(task) or {}).get("output_type") == "multiple_choice"
        all_ids = set().union(*filters.values())
        try:
            for line in _snippet_lines(path, all_ids):
                filt = line.get("filter", "none")
                if isinstance(filt, str) and line["doc_id"] in filters.get(filt, ()):
                    run.snippets.setdefault((task, filt), {})[line["doc_id"]] = _snippet(
                        line, multiple_choice
                    )
        except OSError:
            continue


# ---------------------------------------------------------------- assembling RunResults


def _task_series(
    results_file: Path,
    data: dict[str, Any],
    task: str,
    cluster_field: str | None,
    untestable: dict[SeriesKey, str],
) -> dict[SeriesKey, MetricSeries]:
    config = data["configs"].get(task) or {}
    entry = data["results"].get(task)
    if not isinstance(entry, dict):
        raise GateError(f"{results_file}: task {task} has a config but no entry in 'results'")
    aggregations = _aggregations(config)
    hib_map = (data.get("higher_is_better") or {}).get(task) or {}
    reported: dict[tuple[str, str], float] = {}
    kinds: dict[str, tuple[MetricKind, str]] = {}
    per_filter: dict[str, list[str]] = {}
    for (metric, filt), value in sorted(_reported_metrics(entry).items()):
        agg = aggregations.get(metric, _DEFAULT_AGGREGATION.get(metric, "mean"))
        kind, agg = _kind_of(task, metric, agg)
        if kind is None:
            # Recorded, not dropped: whoever gates this metric must hear that it cannot be tested.
            untestable[SeriesKey(task, filt, metric)] = aggregation_name(agg)
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise GateError(f"{results_file}: {task} {metric},{filt} is {_short(value)}, not a number")
        reported[(metric, filt)] = float(value)
        kinds[metric] = (kind, agg)
        per_filter.setdefault(filt, []).append(metric)
    if not reported:
        return {}
    path = _samples_path(results_file, task)
    if not path.is_file():
        raise GateError(f"{path}: samples file missing for task {task} (was lm-eval run with --log_samples?)")
    wanted = _Wanted(per_filter, kinds, cluster_field)
    by_filter, task_hash, fast = _read_samples(path, task, wanted)
    effective = ((data.get("n-samples") or {}).get(task) or {}).get("effective")
    args = (path, task, data, per_filter, kinds, reported, hib_map, cluster_field, effective)
    try:
        return _check_and_build(by_filter, task_hash, *args)
    except GateError:
        if not fast:
            raise
        # The fast reader skips the middle of each line; read again line by line, so that a
        # broken line is reported as such rather than as the mismatch it caused.
        by_filter, task_hash = _read_samples_careful(path, task, wanted)
        return _check_and_build(by_filter, task_hash, *args)


def _check_and_build(
    by_filter: dict[str, _FilterData],
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
) -> dict[SeriesKey, MetricSeries]:
    """Series of one task from its samples, after checking them against results.json."""
    series: dict[SeriesKey, MetricSeries] = {}
    for filt, metrics in per_filter.items():
        fd = by_filter.get(filt)
        if fd is None or not fd.doc_ids:
            raise GateError(
                f"{path}: results.json reports {metrics[0]},{filt} but no sample line has filter {filt}"
            )
        if isinstance(effective, int) and len(fd.doc_ids) != effective:
            raise GateError(
                f"{path}: {len(fd.doc_ids)} docs for filter {filt}, but results.json n-samples "
                f"says {effective} (effective)"
            )
        order = np.argsort(np.asarray(fd.doc_ids), kind="stable")
        doc_ids = np.asarray(fd.doc_ids, dtype=np.int64)[order]
        hashes = np.asarray(fd.hashes, dtype=str)[order]
        clusters = np.asarray(fd.clusters, dtype=str)[order] if cluster_field is not None else None
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
            if not _close(recomputed, want):
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
    path: str | Path, *, cluster_keys: dict[str, str] | None = None, snippets: bool = False
) -> RunResults:
    """Read one lm-eval run (output dir, model subfolder or results file) into ``RunResults``.

    ``cluster_keys`` maps a task to the doc field whose value labels each item's cluster.
    ``snippets=True`` also fills ``run.snippets`` for every item (slow on big runs: prefer
    ``attach_snippets`` for the few items a report shows).
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
    for task in leaf_tasks:
        series.update(_task_series(results_file, data, task, cluster_keys.get(task), untestable))
    groups, group_subtasks = _groups(data)
    run = RunResults(
        provenance=_provenance(results_file, data, manifest),
        series=series,
        groups=groups,
        group_subtasks=group_subtasks,
        notes=notes,
        untestable=untestable,
    )
    if snippets:
        wanted: dict[tuple[str, str], set[int]] = {}
        for key, s in series.items():
            wanted.setdefault((key.task, key.filter), set()).update(s.doc_ids.tolist())
        attach_snippets(run, wanted)
    return run
