"""Per-item values from lm-eval's samples files (one JSON object per line, 100+ MB each).

Two readers give the same ``FilterData``: the fast one parses whole 8 MiB blocks with C-level
loops and skips the prompts and outputs in the middle of each line; anything it does not
expect (a blank line, list values, a broken line) hands over to the careful one, which parses
line by line and names the offending line. Both rebuild lm-eval's ``task_hashes`` entry.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import operator
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gatekeeper.errors import GateError
from gatekeeper.results.metrics import MetricKind, Unusual
from gatekeeper.text import json_problem, short

_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass
class Wanted:
    """What to collect from one task's samples file."""

    metrics: dict[str, list[str]]  # filter -> metric names (from results.json)
    kinds: dict[str, tuple[MetricKind, str]]  # metric -> (kind, aggregation)
    cluster_field: str | None


@dataclass
class FilterData:
    """One filter's items in file order. ``values[metric]`` is a list of items (careful reader)
    or an array of them (fast reader); the kind's ``as_array`` takes either."""

    doc_ids: list[int] = field(default_factory=list)
    hashes: list[tuple[str, str, str]] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)
    clusters: list[str] = field(default_factory=list)


def read_samples(path: Path, task: str, wanted: Wanted) -> tuple[dict[str, FilterData], str, bool]:
    """Per-filter items of one samples file, lm-eval's task hash rebuilt from its lines, and
    whether the fast reader produced them."""
    try:
        return (*read_samples_fast(path, wanted), True)
    except (Unusual, ValueError, KeyError, TypeError, OverflowError, IndexError, RecursionError):
        # Anything the fast reader does not expect (a blank line, list values, a bad line, ...):
        # the careful reader accepts every valid variant and names the offending line.
        return (*read_samples_careful(path, task, wanted), False)


# -------------------------------------------- fast reader: whole blocks, no per-line Python


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
        raise Unusual
    return objs


def read_samples_fast(path: Path, wanted: Wanted) -> tuple[dict[str, FilterData], str]:
    """Like ``read_samples_careful`` on an ordinary lm-eval file, with C-level loops only.
    Raises ``Unusual`` (or a lookup/type error) on anything else, without a message."""
    task_hash = hashlib.sha256()
    all_ids: list[int] = []
    all_filters: list[str] = []
    chunks: dict[str, dict[str, list[Any]]] = {}  # filter -> metric -> value arrays per block
    out: dict[str, FilterData] = {}
    for text in _blocks(path):
        if not text.strip():
            continue
        objs = _parse_block(text, wanted.cluster_field is not None)
        ids, filters = zip(*map(_DOC_ID, objs), strict=True)
        if set(map(type, ids)) != {int} or set(map(type, filters)) != {str}:
            raise Unusual
        if min(ids) < 0 or max(ids) > _MAX_DOC_ID:
            raise Unusual
        hashes = list(map(_HASHES, objs))
        joined = "".join(itertools.chain.from_iterable(hashes))  # TypeError unless all str
        if set(map(len, itertools.chain.from_iterable(hashes))) != {64} or not _HEX_ONLY.fullmatch(joined):
            raise Unusual  # not lm-eval's sha256 hex digests
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
            fd = out.setdefault(filt, FilterData())
            fd.doc_ids.extend(sel_ids)
            fd.hashes.extend(sel_hashes)
            per_metric = chunks.setdefault(filt, {m: [] for m in wanted.metrics[filt]})
            for metric, parts in per_metric.items():
                kind, agg = wanted.kinds[metric]
                parts.append(kind.fast_values(agg, list(map(operator.itemgetter(metric), sel))))
            if wanted.cluster_field is not None:
                docs = list(map(operator.itemgetter("doc"), sel))
                if set(map(type, docs)) != {dict}:
                    raise Unusual
                fd.clusters.extend(map(str, map(operator.itemgetter(wanted.cluster_field), docs)))
    if len(set(zip(all_ids, all_filters, strict=True))) != len(all_ids):
        raise Unusual  # a duplicate (doc_id, filter): the careful reader names its line
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
                    raise GateError(f"{path} line {lineno}: not usable JSON ({json_problem(exc)})") from None
                if not isinstance(obj, dict):
                    raise GateError(f"{path} line {lineno}: expected a JSON object")
                yield lineno, obj
        except UnicodeDecodeError:
            raise GateError(f"{path} line {lineno + 1}: not valid UTF-8") from None


def read_samples_careful(
    path: Path, task: str, wanted: Wanted
) -> tuple[dict[str, FilterData], str]:
    """One ``json.loads`` per line and every check per line, so errors name the line."""
    out: dict[str, FilterData] = {}
    seen: set[tuple[int, str]] = set()
    # lm-eval: task_hashes[task] = sha256("".join(doc_hash + prompt_hash + target_hash per line))
    task_hash = hashlib.sha256()
    spath = str(path)
    for lineno, line in _iter_lines(path):
        where = f"{spath} line {lineno}"
        doc_id, filt = line.get("doc_id"), line.get("filter", "none")
        if not isinstance(doc_id, int) or isinstance(doc_id, bool):
            raise GateError(f"{where}: doc_id is {short(doc_id)}, not an integer")
        if not 0 <= doc_id <= _MAX_DOC_ID:
            raise GateError(f"{where}: doc_id {short(doc_id)} is out of range (lm-eval numbers docs from 0)")
        if not isinstance(filt, str):
            raise GateError(f"{where}: filter is {short(filt)}, not a string")
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
            data = out[filt] = FilterData(values={m: [] for m in metrics})
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
