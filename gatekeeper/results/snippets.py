"""Prompt, output and target text of the few items a report shows ("right to wrong").

Read on demand, after the statistics, and only for those items: a samples line with another
doc_id is skipped after its first bytes, so memory is bounded by one line, not the file.
Best effort: snippets decorate the report and never fail the gate.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gatekeeper.model import ItemSnippet, RunResults
from gatekeeper.results.layout import RESULTS_RE, samples_path

SNIPPET_CHARS = 300


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
    if RESULTS_RE.match(source.name) is None or not source.is_file():
        return  # a baseline file, or not an lm-eval results file
    by_task: dict[str, dict[str, set[int]]] = {}
    for (task, filt), ids in wanted.items():
        if ids:
            by_task.setdefault(task, {})[filt] = {int(i) for i in ids}
    for task, filters in sorted(by_task.items()):
        path = samples_path(source, task)
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
