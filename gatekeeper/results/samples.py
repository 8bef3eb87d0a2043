"""Per-item values from lm-eval's samples files (one JSON object per line, 100+ MB each).

One reader, on msgspec's typed decoding: each block of whole lines (about 8 MiB) is decoded by
one C call into small structs that hold only what the gate needs (doc_id, filter, the three item
hashes, the wanted metrics, the cluster field, and the fields a kind rebuilds its value from).
Every line is still parsed in full as JSON; the prompts and outputs are checked and skipped,
never built as Python objects.

Two things happen line by line, and only where they must:
- a block msgspec refuses is decoded again line by line, so the error names its line. A line
  with the NaN or Infinity tokens Python's json writes (lm-eval's writer), which msgspec does not
  read, goes through Python's json into the same struct.
- a block whose values a kind cannot take in bulk (a list of numbers for a mean, a value
  missing) is converted item by item, so a bad value is named with its line.

The byte offset of every line is kept, so that the report's few snippets are read by seeking to
their lines (``results/snippets.py``), never by a second pass over the file.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import mmap
import operator
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec
import numpy as np

from gatekeeper.errors import GateError
from gatekeeper.model import HASH_DTYPE
from gatekeeper.results.informative import line_margins
from gatekeeper.results.metrics import MetricKind, Unusual
from gatekeeper.text import json_problem, short

_MAX_DOC_ID = (1 << 53) - 1  # lm-eval's doc_ids are list indices; beyond this float/int64 lose them
_BLOCK_BYTES = 8 << 20
_JSON_SPACE = b" \t\r"
_HEX = b"0123456789abcdef"
_HASH_KEYS = ("doc_hash", "prompt_hash", "target_hash")
_HASHES = operator.attrgetter(*_HASH_KEYS)
_DOC_ID = operator.attrgetter("doc_id")
_FILTER = operator.attrgetter("filter")
_UNSET = msgspec.UNSET


@dataclass
class Wanted:
    """What to collect from one task's samples file."""

    metrics: dict[str, list[str]]  # filter -> metric names (from results.json)
    kinds: dict[str, tuple[MetricKind, str]]  # metric -> (kind, aggregation)
    cluster_field: str | None
    # The filter whose lines give each multiple-choice item's margin (results/informative.py):
    # the one acc is reported under; None for a task without acc.
    margins_filter: str | None = None


@dataclass
class FilterData:
    """One filter's items in file order: doc_ids (int64), hashes ((n, 3) hex prefixes of
    ``HASH_CHARS`` digits), values per metric (the kind's ``as_array`` takes them), clusters
    (str, when asked) and the byte offset of each item's line."""

    doc_ids: np.ndarray
    hashes: np.ndarray
    values: dict[str, Any]
    clusters: np.ndarray | None
    offsets: np.ndarray
    margins: np.ndarray | None = None  # each item's choice margin (NaN: none), for margins_filter


@dataclass
class _Parts:
    """A filter's items as they are read, block by block."""

    doc_ids: list[np.ndarray] = field(default_factory=list)
    hashes: list[np.ndarray] = field(default_factory=list)
    values: dict[str, list[Any]] = field(default_factory=dict)
    clusters: list[str] = field(default_factory=list)
    offsets: list[np.ndarray] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)


class _Shape:
    """The struct one task's lines decode into: lm-eval's keys, the wanted metrics (under field
    names of their own, since a metric name need not be a Python identifier), the fields kinds
    rebuild values from, and the doc's cluster field."""

    def __init__(self, task: str, wanted: Wanted) -> None:
        self.task, self.wanted = task, wanted
        self.attr: dict[str, str] = {key: key for key in ("doc_id", "filter", *_HASH_KEYS)}
        fields: list[tuple[Any, ...]] = [
            ("doc_id", Annotated[int, msgspec.Meta(ge=0, le=_MAX_DOC_ID)]),
            *((key, str) for key in _HASH_KEYS),
            ("filter", str, "none"),
        ]
        names = {m for ms in wanted.metrics.values() for m in ms}
        names |= {key for m in names for key in wanted.kinds[m][0].line_fields}
        if wanted.margins_filter is not None:
            names |= {"filtered_resps", "target", "acc"}
        for key in sorted(names - set(self.attr)):
            self.attr[key] = f"f{len(self.attr)}"
            fields.append((self.attr[key], Any, _UNSET))
        if wanted.cluster_field is not None:
            doc = msgspec.defstruct("Doc", [("key", Any, _UNSET)], rename={"key": wanted.cluster_field})
            fields.append(("doc", doc))
        rename = {a: key for key, a in self.attr.items()}
        self.line = msgspec.defstruct("SampleLine", fields, rename=rename, kw_only=True, gc=False)
        self.decoder = msgspec.json.Decoder(self.line)

    def decode(self, path: Path, raw: memoryview, first: int) -> tuple[list[Any], list[int] | None]:
        """The block's lines as structs, and their line numbers when they were decoded one by one
        (else None: ``numbers`` finds them if an error needs them)."""
        try:
            lines = self.decoder.decode_lines(raw)
            if np.frombuffer(raw, dtype=np.uint8).max(initial=0) > 127:
                str(raw, "utf-8")  # msgspec skips the prompts without checking their UTF-8
            return lines, None
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            pairs = [(self.one(path, n, line), n) for n, line in _numbered(raw, first)]
            return [obj for obj, _ in pairs], [n for _, n in pairs]

    def one(self, path: Path, lineno: int, line: bytes) -> Any:
        """One line as a struct, or GateError naming the line and what is wrong with it."""
        where = f"{path} line {lineno}"
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            raise GateError(f"{where}: not valid UTF-8") from None
        try:
            return self.decoder.decode(line)
        except (msgspec.DecodeError, RecursionError):
            pass  # a syntax error, a NaN token, a number beyond float range, a wrong type, depth
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            raise GateError(f"{where}: truncated or invalid JSON") from None
        except (ValueError, RecursionError) as exc:
            raise GateError(f"{where}: not usable JSON ({json_problem(exc)})") from None
        if not isinstance(obj, dict):
            raise GateError(f"{where}: expected a JSON object")
        try:
            return msgspec.convert(obj, self.line)
        except msgspec.ValidationError as exc:
            raise GateError(f"{where}: {self.problem(obj) or exc}") from None

    def problem(self, obj: dict[str, Any]) -> str | None:
        """What is wrong with a line's keys, in the words of lm-eval's format."""
        doc_id, filt = obj.get("doc_id"), obj.get("filter", "none")
        if not isinstance(doc_id, int) or isinstance(doc_id, bool):
            return f"doc_id is {short(doc_id)}, not an integer"
        if not 0 <= doc_id <= _MAX_DOC_ID:
            return f"doc_id {short(doc_id)} is out of range (lm-eval numbers docs from 0)"
        if not isinstance(filt, str):
            return f"filter is {short(filt)}, not a string"
        if not all(_is_hash(obj.get(k)) for k in _HASH_KEYS):
            return "doc_hash, prompt_hash and target_hash must be sha256 hex digests (64 hex digits)"
        doc, key = obj.get("doc"), self.wanted.cluster_field
        if key is not None and not (isinstance(doc, dict) and key in doc):
            return f"doc has no field {key!r} (cluster key for {self.task})"
        return None


def _is_hash(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and value.isascii() and not value.encode().translate(None, _HEX)


def _numbered(raw: memoryview, first: int) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of a block's lines that are not blank (as msgspec skips them)."""
    for n, line in enumerate(bytes(raw).split(b"\n"), start=first):
        if line.strip(_JSON_SPACE):
            yield n, line


def _blocks(path: Path) -> Iterator[tuple[memoryview, int, int, np.ndarray]]:
    """(block of whole lines, its byte offset, its first line number, where its newlines are),
    about 8 MiB each, as views of the file mapped into memory: no copy of the file is made (a
    block copied out of a 58 MB file and completed to its last line cost a third of the time of
    reading it). A line longer than a block makes a longer block."""
    try:
        with path.open("rb") as fh:
            mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(fh.fileno()).st_size else None
    except (OSError, ValueError) as exc:  # ValueError: mmap of a file emptied since fstat
        raise GateError(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    if mapped is None:
        return
    # The map is never closed by hand: it goes with the last view of it (an error message may
    # still hold one), and closing it while a view is alive would raise.
    data, size = memoryview(mapped), len(mapped)
    offset, lineno = 0, 1
    while offset < size:
        end = mapped.find(b"\n", min(offset + _BLOCK_BYTES, size) - 1)
        end = size if end < 0 else end + 1
        block = data[offset:end]
        ends = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
        yield block, offset, lineno, ends
        offset, lineno = end, lineno + len(ends)


def _line_starts(raw: memoryview, ends: np.ndarray, offset: int, count: int, numbers: list[int] | None,
                 first: int) -> np.ndarray:
    """Byte offsets of the block's ``count`` non-blank lines (``ends``: its newlines)."""
    starts = np.concatenate([[0], ends + 1])[: len(ends) + (raw[-1:] != b"\n")]
    if len(starts) != count:  # blank lines: keep the starts of the others
        keep = np.asarray(numbers if numbers is not None else [n for n, _ in _numbered(raw, first)])
        starts = starts[keep - first]
    return starts.astype(np.int64) + offset


def read_samples(path: Path, task: str, wanted: Wanted) -> tuple[dict[str, FilterData], str]:
    """Per-filter items of one samples file and lm-eval's task hash rebuilt from its lines
    (``task_hashes[task]``: sha256 of the doc, prompt and target hashes of every line, in order).
    GateError naming the file and line on anything lm-eval would not have written."""
    shape = _Shape(task, wanted)
    task_hash = hashlib.sha256()
    parts: dict[str, _Parts] = {}
    ids_by_filter: dict[str, list[int]] = {}
    for raw, offset, first, ends in _blocks(path):
        lines, numbers = shape.decode(path, raw, first)
        if not lines:
            continue

        def where(i: int, raw: memoryview = raw, first: int = first, numbers: list[int] | None = numbers) -> str:
            nums = numbers if numbers is not None else [n for n, _ in _numbered(raw, first)]
            return f"{path} line {nums[i]}"

        ids = list(map(_DOC_ID, lines))
        filters = list(map(_FILTER, lines))
        joined = _hash_text(lines, shape, where)
        task_hash.update(joined)
        hashes = np.frombuffer(joined, dtype="S64").reshape(-1, 3).astype(HASH_DTYPE)
        starts = _line_starts(raw, ends, offset, len(lines), numbers, first)
        distinct = set(filters)
        for filt in distinct:
            rows = None if len(distinct) == 1 else [i for i, f in enumerate(filters) if f == filt]
            sel_ids = ids if rows is None else [ids[i] for i in rows]
            ids_by_filter.setdefault(filt, []).extend(sel_ids)
            if filt not in wanted.metrics:
                continue  # a filter with no reported metric (nothing to gate on)
            part = parts.setdefault(filt, _Parts(values={m: [] for m in wanted.metrics[filt]}))
            sel = lines if rows is None else [lines[i] for i in rows]
            at = (lambda i: where(i)) if rows is None else (lambda i, rows=rows: where(rows[i]))
            part.doc_ids.append(np.asarray(sel_ids, dtype=np.int64))
            part.hashes.append(hashes if rows is None else hashes[rows])
            part.offsets.append(starts if rows is None else starts[rows])
            for metric in wanted.metrics[filt]:
                value = _values(shape, metric, filt, sel, at)
                if len(value):
                    part.values[metric].append(value)
            if wanted.cluster_field is not None:
                part.clusters.extend(_clusters(shape, sel, at))
            if filt == wanted.margins_filter:
                part.margins.extend(_margins(shape, sel))
    _no_duplicates(path, shape, ids_by_filter)
    return {filt: _finish(p, wanted) for filt, p in parts.items()}, task_hash.hexdigest()


def _hash_text(lines: list[Any], shape: _Shape, where: Any) -> bytes:
    """The block's doc, prompt and target hashes concatenated, as ASCII; GateError naming the
    first line whose hashes are not lm-eval's sha256 hex digests."""
    flat = list(itertools.chain.from_iterable(map(_HASHES, lines)))
    joined = "".join(flat)
    if len(joined) == 64 * len(flat) and set(map(len, flat)) == {64} and joined.isascii():
        raw = joined.encode("ascii")
        if not raw.translate(None, _HEX):
            return raw
    bad = next(i for i, obj in enumerate(lines) if not all(map(_is_hash, _HASHES(obj))))
    raise GateError(f"{where(bad)}: doc_hash, prompt_hash and target_hash must be sha256 hex digests (64 hex digits)")


def _values(shape: _Shape, metric: str, filt: str, lines: list[Any], where: Any) -> Any:
    """One metric's values for a block's lines of one filter: in bulk where the kind takes them
    so, else item by item (a value missing or of an unusual shape), naming a bad line."""
    kind, agg = shape.wanted.kinds[metric]
    items = list(map(operator.attrgetter(shape.attr[metric]), lines))
    if not items.count(_UNSET):
        try:
            return kind.fast_values(agg, items)
        except (Unusual, ValueError, TypeError, OverflowError, IndexError):
            pass
    out = []
    for i, obj in enumerate(lines):
        if items[i] is _UNSET:
            raise GateError(f"{where(i)}: no value for {metric} (results.json reports {metric},{filt})")
        view = {key: getattr(obj, shape.attr[key]) for key in kind.line_fields}
        view = {key: v for key, v in view.items() if v is not _UNSET}
        out.append(kind.line_value(agg, {**view, metric: items[i]}, where(i), metric))
    return out


def _clusters(shape: _Shape, lines: list[Any], where: Any) -> list[str]:
    keys = [obj.doc.key for obj in lines]
    if keys.count(_UNSET):
        raise GateError(f"{where(keys.index(_UNSET))}: doc has no field {shape.wanted.cluster_field!r} "
                        f"(cluster key for {shape.task})")
    return list(map(str, keys))


def _margins(shape: _Shape, lines: list[Any]) -> list[float]:
    """Each line's choice margin; NaN where the line does not give one (never an error: an item
    without a margin is read with certainty by an informative design)."""
    resps, targets, accs = ([getattr(obj, shape.attr[key]) for obj in lines] for key in ("filtered_resps", "target", "acc"))
    return line_margins(resps, targets, accs).tolist()


def _no_duplicates(path: Path, shape: _Shape, ids_by_filter: dict[str, list[int]]) -> None:
    """GateError naming the first line that repeats a (doc_id, filter). Found in bulk; only then
    is the file read again, line by line, to name the line."""
    if all(len(set(ids)) == len(ids) for ids in ids_by_filter.values()):
        return
    seen: set[tuple[int, str]] = set()
    for raw, _, first, _ in _blocks(path):
        for n, line in _numbered(raw, first):
            obj = shape.one(path, n, line)
            if (obj.doc_id, obj.filter) in seen:
                raise GateError(f"{path} line {n}: duplicate doc_id {obj.doc_id} (filter {obj.filter})")
            seen.add((obj.doc_id, obj.filter))


def _finish(p: _Parts, wanted: Wanted) -> FilterData:
    values = {m: wanted.kinds[m][0].join(parts) if parts else [] for m, parts in p.values.items()}
    return FilterData(
        doc_ids=np.concatenate(p.doc_ids),
        hashes=np.concatenate(p.hashes),
        values=values,
        clusters=np.asarray(p.clusters, dtype=str) if wanted.cluster_field is not None else None,
        offsets=np.concatenate(p.offsets),
        margins=np.asarray(p.margins, dtype=float) if p.margins else None,
    )
