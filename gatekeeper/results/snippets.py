"""Prompt, output and target text of the few items a report shows ("right to wrong").

Read on demand, after the statistics, and only for those items: the samples reader kept the byte
offset of every line, so each wanted line is read by one seek (never the whole file again), and
memory is bounded by one line. Best effort: snippets decorate the report and never fail the gate.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

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


def _line_at(fh: Any, offset: int) -> dict[str, Any] | None:
    """The parsed samples line that starts at byte ``offset``, or None (too long, or not a JSON
    object: the file changed since it was read)."""
    fh.seek(offset)
    line = fh.readline(SNIPPET_LINE_MAX + 1)
    if len(line) > SNIPPET_LINE_MAX:
        return None
    try:
        obj = json.loads(line.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):  # RecursionError: arrays nested thousands deep
        return None
    return obj if isinstance(obj, dict) else None


def attach_snippets(run: RunResults, wanted: dict[tuple[str, str], set[int]]) -> None:
    """Fill ``run.snippets[(task, filter)][doc_id]`` for the wanted items only, reading just
    their lines: the reader kept where each line starts (``run.sample_lines``), so this seeks
    to them in the task's samples file (found beside ``run.provenance.source``).

    Best effort, never raises: a run read from a baseline file (no samples), a samples file
    that is gone or a line that no longer holds its item leave those snippets out.
    """
    source = Path(run.provenance.source)
    if RESULTS_RE.match(source.name) is None or not source.is_file():
        return  # a baseline file, or not an lm-eval results file
    by_task: dict[str, list[tuple[int, str, int]]] = {}
    for (task, filt), ids in wanted.items():
        lines = run.sample_lines.get((task, filt))
        if not ids or lines is None:
            continue
        doc_ids, offsets = lines
        for doc_id in sorted(int(i) for i in ids):
            at = int(np.searchsorted(doc_ids, doc_id))
            if at < doc_ids.size and doc_ids[at] == doc_id:
                by_task.setdefault(task, []).append((int(offsets[at]), filt, doc_id))
    for task, items in sorted(by_task.items()):
        multiple_choice = (run.provenance.configs.get(task) or {}).get("output_type") == "multiple_choice"
        try:
            with samples_path(source, task).open("rb") as fh:
                for offset, filt, doc_id in sorted(items):
                    line = _line_at(fh, offset)
                    if line is None or line.get("doc_id") != doc_id or line.get("filter", "none") != filt:
                        continue
                    run.snippets.setdefault((task, filt), {})[doc_id] = _snippet(line, multiple_choice)
        except OSError:
            continue
