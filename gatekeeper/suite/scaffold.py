"""``gatekeeper init``: a suite, task templates and a pull-request workflow for a set of tasks.

Every named task must exist (the suite's include_path, then lm-eval's bundled tasks; a typo is an
error with a suggestion); its metrics and filters come from the task's own config, so the suite
gates what the task really produces: the first metric of each task at the first filter, a margin
of 0.02 for right/wrong scores (two points), 1 point for sacrebleu's 0-100 scores, 0 (any
significant rise) for perplexities; the other metrics are informational. ``--new-task NAME``
writes a multiple-choice task template reading a JSON-lines file beside it.

This module builds texts (path -> content); the CLI writes them, never over an existing file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from gatekeeper.errors import GateError
from gatekeeper.results import taskindex

LM_EVAL_PIN = "0.4.13"
NAME = re.compile(r"^[a-z0-9._-]+$")
_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}
# lm-eval 0.4.13's metrics when a task's YAML lists none (api/task.py, by output_type).
_DEFAULT_METRICS = {
    "multiple_choice": ["acc", "acc_norm"],
    "loglikelihood": ["perplexity", "acc"],
    "loglikelihood_rolling": ["word_perplexity", "byte_perplexity", "bits_per_byte"],
    "generate_until": ["exact_match"],
}
_LOWER_IS_BETTER = {"perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte", "ter", "brier_score"}
_POINTS = {"bleu", "chrf", "chrf++", "ter"}  # sacrebleu's scores: 0-100


@dataclass(frozen=True)
class Metric:
    metric: str
    filters: tuple[str, ...]
    margin: float
    note: str


@dataclass(frozen=True)
class Plan:
    """What ``gatekeeper init`` writes, by path relative to the output folder."""

    files: dict[str, str]


def plan(tasks: list[str], new_tasks: list[str], *, name: str, include_path: str | None,
         model: str, out: Path, workflow: bool = True) -> Plan:
    """The files for a suite over ``tasks`` (existing) and ``new_tasks`` (templates to fill in).

    ``include_path`` is relative to ``out`` (where the suite file goes)."""
    if not NAME.match(name):
        raise GateError(f"--name {name!r}: a suite name is lowercase letters, digits, '.', '_' or '-'")
    every = tasks + new_tasks
    if not every:
        raise GateError("init: name at least one task (--tasks a,b) or a task to write (--new-task NAME)")
    seen = sorted({t for t in every if every.count(t) > 1})
    if seen:
        raise GateError(f"init: task {seen[0]!r} is named twice")
    for task in new_tasks:
        if not _PLAIN.match(task):
            raise GateError(f"--new-task {task!r}: a task name is letters, digits, '_', '.' or '-'")
    include = include_path or ("tasks" if new_tasks else None)
    if include_path is not None and not (out / include_path).is_dir():
        raise GateError(f"--include-path {include_path}: no such folder under {out}")
    folder = out / include if include and (out / include).is_dir() else None
    tm = taskindex.task_manager({t: f"--tasks {t}" for t in tasks}, folder, tasks, {}) if tasks else None
    metrics = {t: _task_metrics(tm, t) for t in tasks}
    files: dict[str, str] = {}
    for task in new_tasks:
        files[f"{include}/{task}.yaml"] = _task_template(task)
        files[f"{include}/data/{task}.jsonl"] = _data_template()
        # Informational until the template's three items are replaced: no margin resolves on 3 items.
        metrics[task] = [Metric("acc", ("none",), -1, "the template's 3 items resolve no margin: once the data is "
                                                      "yours, replace `gate: false` by `margin: 0.02` (two points)"),
                         Metric("acc_norm", ("none",), -1, "")]
    files["gatekeeper.yaml"] = _suite_text(name, include, every, metrics)
    if workflow:
        files[".github/workflows/gatekeeper.yml"] = workflow_text(
            suite="gatekeeper.yaml", model=model, include_path=include)
    return Plan(files)


def _task_metrics(tm: Any, task: str) -> list[Metric]:
    found: dict[str, list[str]] = {}
    for leaf in _leaves(tm, task, set()):
        cfg = leaf.cfg or {}
        listed = [m.get("metric") for m in cfg.get("metric_list") or [] if isinstance(m, dict)]
        filters = [f.get("name") for f in cfg.get("filter_list") or [] if isinstance(f, dict)] or ["none"]
        for metric in [m for m in listed if isinstance(m, str)] or _DEFAULT_METRICS.get(cfg.get("output_type"), []):
            for f in filters:
                if isinstance(f, str) and f not in found.setdefault(metric, []):
                    found[metric].append(f)
    if not found:
        raise GateError(f"--tasks {task}: lm-eval's config of {task!r} names no metric gatekeeper can gate; "
                        "write its metrics into the suite by hand")
    out = []
    for i, (metric, filters) in enumerate(found.items()):
        if i > 0:
            out.append(Metric(metric, tuple(filters), -1, ""))
            continue
        if metric in _POINTS:
            out.append(Metric(metric, tuple(filters), 1.0, "one point (0-100 scale)"))
        elif metric in _LOWER_IS_BETTER:
            out.append(Metric(metric, tuple(filters), 0.0,
                              "lower is better; any significant rise fails: set the rise you accept"))
        else:
            out.append(Metric(metric, tuple(filters), 0.02, "two points"))
    return out


def _leaves(tm: Any, name: str, seen: set[str]) -> list[Any]:
    """The task entries under ``name`` (a task, a group's tasks, a tag's tasks)."""
    if name in seen:
        return []
    seen.add(name)
    entry = tm._index.get(name)  # lm-eval 0.4.13's TaskIndex: the only place configs are listed
    if entry is None:
        return []
    kind = getattr(entry.kind, "name", "")
    if kind == "GROUP":
        children = (entry.cfg or {}).get("task") or []
        out = []
        for child in children if isinstance(children, list) else [children]:
            child_name = child.get("task") if isinstance(child, dict) else child
            if isinstance(child_name, str):
                out += _leaves(tm, child_name, seen)
        return out
    if kind == "TAG":
        return [e for e in tm._index.values() if name in (getattr(e, "tags", None) or ()) and e.cfg]
    return [entry]


def _q(text: str) -> str:
    """A YAML scalar: plain when safe, else JSON-quoted (valid YAML)."""
    if _PLAIN.match(text) and text.lower() not in _YAML_WORDS:
        return text
    return json.dumps(text)


def _suite_text(name: str, include: str | None, tasks: list[str], metrics: dict[str, list[Metric]]) -> str:
    lines = [
        "# yaml-language-server: $schema=https://raw.githubusercontent.com/your-org/gatekeeper/main/"
        "gatekeeper/suite/schemas/suite.schema.json",
        "# A gatekeeper suite written by `gatekeeper init`: see docs/suite.md for every key. Record the",
        "# first baseline on the runner that will gate (same GPU type), then commit it:",
        "#   gatekeeper gate --suite gatekeeper.yaml --model BASE_CHECKPOINT --record-missing",
        f"name: {_q(name)}",
        f'lm_eval_version: "{LM_EVAL_PIN}"',
    ]
    if include:
        lines.append(f"include_path: {_q(include)}   # task YAMLs of your own, relative to this file")
    lines += [
        "model:",
        "  backend: hf",
        "  dtype: auto          # pinned and hashed: float32, bfloat16, ... are other measurements",
        "  batch_size: 8        # not hashed: change freely",
        "  device: auto",
        "seeds: {random: 0, numpy: 1234, torch: 1234, fewshot: 1234}   # lm-eval's defaults",
        "policy:",
        "  alpha: 0.05          # false-alarm rate of the whole suite",
        "  correction: holm",
        "  margin: 0.0          # default drop tolerated, in each metric's own units",
        "  # Is a margin too small for the items? After the first baseline, `gatekeeper plan --suite",
        "  # THIS_FILE` prints each metric's MDE and the smallest margin its items can gate.",
        "tasks:",
    ]
    for task in tasks:
        lines += [f"  - name: {_q(task)}", "    num_fewshot: 0       # hashed; null means the task's own default",
                  "    metrics:"]
        for m in metrics[task]:
            where = "" if m.filters == ("none",) or len(m.filters) > 1 else f", filter: {_q(m.filters[0])}"
            if m.margin < 0:
                note = f"   # {m.note}" if m.note else ""
                lines.append(f"      - {{metric: {_q(m.metric)}, gate: false}}{note}")
                continue
            if len(m.filters) > 1:  # gate the first filter; the others are informational
                lines.append(f"      - {{metric: {_q(m.metric)}, filter: {_q(m.filters[0])}, margin: {m.margin:g}}}"
                             f"   # {m.note}")
                lines += [f"      - {{metric: {_q(m.metric)}, filter: {_q(f)}, gate: false}}" for f in m.filters[1:]]
                continue
            lines.append(f"      - {{metric: {_q(m.metric)}{where}, margin: {m.margin:g}}}   # {m.note}")
    return "\n".join(lines) + "\n"


def _task_template(task: str) -> str:
    return (
        f"# A multiple-choice task for lm-eval {LM_EVAL_PIN}, written by `gatekeeper init`. Replace\n"
        f"# data/{task}.jsonl with your documents (one JSON object per line: question, choices, label).\n"
        "# data_files is read relative to this file (gatekeeper's rule; plain lm-eval reads it\n"
        "# relative to the working directory) and must stay inside the include_path.\n"
        f"task: {_q(task)}\n"
        "dataset_path: json\n"
        "dataset_kwargs:\n"
        f"  data_files: {{test: data/{task}.jsonl}}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "Question: {{question}}\\nAnswer:"\n'
        "doc_to_choice: choices\n"
        "doc_to_target: label\n"
        "metric_list:\n"
        "  - {metric: acc, aggregation: mean, higher_is_better: true}\n"
        "  - {metric: acc_norm, aggregation: mean, higher_is_better: true}\n"
        "metadata:\n"
        "  version: 1.0\n"
    )


def _data_template() -> str:
    rows = [
        {"question": "What is 2 + 3?", "choices": [" 4", " 5", " 6", " 7"], "label": 1},
        {"question": "Which is a primary colour?", "choices": [" green", " red", " purple", " orange"], "label": 1},
        {"question": "How many legs has a spider?", "choices": [" six", " four", " eight", " ten"], "label": 2},
    ]
    return "".join(json.dumps(r) + "\n" for r in rows)


def workflow_text(*, suite: str, model: str, include_path: str | None) -> str:
    """The pull-request workflow (docs/workflows/pull-request.yml is this with the defaults)."""
    template = resources.files("gatekeeper.suite").joinpath("templates/pull-request.yml").read_text(encoding="utf-8")
    paths = [f'      - "{model.rstrip("/")}/**"', f'      - "{suite}"', '      - ".gatekeeper/**"']
    if include_path:
        paths.insert(2, f'      - "{include_path.rstrip("/")}/**"')
    return (template.replace("@@PATHS@@", "\n".join(paths)).replace("@@SUITE@@", suite)
            .replace("@@MODEL@@", model))
