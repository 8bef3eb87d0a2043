"""lm-eval's tasks as a suite names them: built, with the suite's overrides, and described.

- ``task_manager`` / ``load_tasks``: the suite's tasks built by lm-eval (its include_path first,
  the bundled index only where needed), every leaf with the suite's n-shot, repeats and
  generation settings, a task's ``dataset:`` override in place of its YAML's (``_with_dataset``);
- ``task_plan``: what the built tasks will produce (names, aggregations, versions, items), for the
  suite's name checks and the baseline's pre-run checks;
- ``task_files``: the task code's identity (``suite/taskcode.py``), hashed into the manifest;
- ``group_aggregations``: every group's leaves and aggregation (results.json does not record it);
- ``rendered``: a task's first requests as lm-eval builds them (``gate --dry-run``);
- ``item_hashes``: each document's doc and target hash as lm-eval logs them, without evaluating
  (``gate --dry-run`` holds them against the baseline's).

lm-eval is imported lazily, here as everywhere in run/.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from gatekeeper.errors import GateError
from gatekeeper.results import taskindex
from gatekeeper.run.taskdata import data_files_beside_yaml
from gatekeeper.suite import taskcode
from gatekeeper.suite.names import Produced, RunPlan
from gatekeeper.suite.suite import Suite, local_data_files
from gatekeeper.text import one_line


def task_manager(suite: Suite, model_args: dict[str, Any]) -> Any:
    # The CLI merges model_args into task metadata; do the same so configs match CLI output.
    where = {t.name: t.where or str(suite.path) for t in suite.tasks}
    return taskindex.task_manager(where, suite.include_path, suite.task_names, dict(model_args))


def load_tasks(suite: Suite, tm: Any) -> tuple[list[Any], dict[str, tuple[Any, Any]], dict[str, list[str]]]:
    """Top-level Task/Group objects for simple_evaluate, with the suite's per-task overrides
    applied to every leaf; also {leaf name: (task object, suite TaskSpec)} and
    {group: direct children} (what lm-eval writes as ``group_subtasks``)."""
    top: list[Any] = []
    leaves: dict[str, tuple[Any, Any]] = {}
    groups: dict[str, list[str]] = {}
    # Read once (group entries' members are read from their YAMLs), inside the first entry's
    # error handling: a broken group YAML is reported as that entry's load error.
    datasets: dict[str, Path] | None = None
    for spec in suite.tasks:
        try:
            datasets = _suite_datasets(suite, tm) if datasets is None else datasets
            with data_files_beside_yaml(tm, suite.include_path, datasets):
                loaded = tm.load([_with_dataset(tm, spec, suite) if spec.dataset is not None else spec.name])
        except GateError:
            raise
        except Exception as exc:  # noqa: BLE001 - lm-eval raises anything from YAML, datasets, jinja
            unknown = _unknown_member(tm, spec.name)
            if unknown:
                raise GateError(unknown) from None
            missing = _missing_column(exc, spec)
            if missing:
                raise GateError(f"{suite.path}: {missing}") from None
            raise GateError(f"{suite.path}: task {spec.name!r} failed to load: {one_line(exc)}") from None
        if spec.name in loaded["groups"]:
            top.append(loaded["groups"][spec.name])
        elif spec.name in loaded["tasks"]:
            top.append(loaded["tasks"][spec.name])
        else:  # a tag: its tasks
            top.extend(loaded["tasks"].values())
        for name, task in loaded["tasks"].items():
            if name in leaves:
                raise GateError(_twice(name, leaves[name][1], spec, suite))
            _apply_overrides(task, spec)
            leaves[name] = (task, spec)
        groups.update({g: list(children) for g, children in (loaded.get("group_map") or {}).items()})
    return top, leaves, groups


def _twice(name: str, first: Any, second: Any, suite: Suite) -> str:
    """A leaf two suite entries reach: which entries, where (a task is gated once, under one rule)."""
    def entry(spec: Any) -> str:
        how = "itself" if spec.name == name else f"group {spec.name!r}"
        return f"{how} at {(spec.where or str(suite.path)).split(': ')[0]}"
    return (f"{second.where or suite.path}: task {name!r} is in the suite twice, as {entry(first)} and as "
            f"{entry(second)}; keep one entry (a group's rules apply to its tasks, or list the tasks alone)")


def _unknown_member(tm: Any, name: str, seen: tuple[str, ...] = ()) -> str | None:
    """Why a group failed to build, when the cause is a member name no index knows (lm-eval says
    only ``TypeError: expected str ... not NoneType``): the group file and line, and the closest
    name. Nested groups are followed."""
    from lm_eval.tasks._yaml_loader import load_yaml

    entry = tm.task_index.get(name)
    if entry is None or not entry.yaml_path or entry.kind.name != "GROUP" or name in seen:
        return None
    try:
        members = load_yaml(entry.yaml_path, resolve_func=False).get("task")
    except Exception:  # noqa: BLE001 - the YAML's own error is lm-eval's message
        return None
    members = [members] if isinstance(members, str) else members if isinstance(members, list) else []
    local = sorted(tm.all_tasks)
    for member in (m for m in members if isinstance(m, str)):
        if member in tm.task_index:
            deeper = _unknown_member(tm, member, (*seen, name))
            if deeper:
                return deeper
            continue
        bundled = taskindex.bundled_index()
        if member in bundled:
            continue
        return (f"{entry.yaml_path}:{_line_of(Path(entry.yaml_path), member)}: group {name!r} lists task {member!r}, "
                "which is neither in the include_path nor among lm-eval's bundled tasks"
                f"{taskindex.suggestion(member, local, sorted(bundled))}")
    return None


def _line_of(path: Path, member: str) -> int:
    """The line of ``path`` that lists ``member`` (1 when none is found: the file is named anyway)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return 1
    for n, line in enumerate(lines, start=1):
        if line.strip().lstrip("-").strip().strip("'\"") == member:
            return n
    return 1


def _suite_datasets(suite: Suite, tm: Any) -> dict[str, Path]:
    """{task: folder its ``dataset:`` data files are relative to} (the suite's folder): the
    entries that set one, and each task of a group entry that does."""
    folder = Path(os.path.abspath(Path(suite.path).parent))
    out = {}
    for t in suite.tasks:
        if t.dataset is not None:
            out[t.name] = folder
            out.update({leaf: folder for leaf in group_datasets(tm, t.name) if leaf != t.name})
    return out


def _missing_column(exc: BaseException, spec: Any) -> str | None:
    """A template naming a field the documents lack (jinja's ``'country' is undefined``): with a
    ``dataset:`` override that is almost always the override's file, so name the task, the file
    and the column."""
    if type(exc).__name__ != "UndefinedError":
        return None
    m = re.search(r"'([^']+)' is undefined", str(exc))
    column = m.group(1) if m else str(exc)
    if spec.dataset is None:
        return f"task {spec.name!r}: its template uses the field {column!r}, which its documents lack"
    files = local_data_files((spec.dataset.get("kwargs") or {}).get("data_files"))
    where = f"the data file(s) {', '.join(files)}" if files else f"the dataset {spec.dataset.get('path')!r}"
    return (f"tasks {spec.name}: dataset: {where} of this override lack the column {column!r}, which the task's "
            "prompt or target uses; add it to the data (or rename it), or drop the override")


def _with_dataset(tm: Any, spec: Any, suite: Suite) -> Any:
    """The task's own config (its YAML with includes and ``!function``s resolved, as lm-eval
    builds it) with the suite's ``dataset`` in place of the YAML's: lm-eval 0.4.13 takes such a
    dict as an inline task. A group's override applies to each of its tasks (``_group_with_dataset``)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    entry = tm.task_index.get(spec.name)
    if entry is not None and entry.yaml_path is not None and entry.kind.name == "GROUP":
        return _group_with_dataset(tm, spec, suite)
    if entry is None or entry.yaml_path is None or entry.kind.name != "TASK":
        what = entry.kind.name.lower() if entry is not None else "unknown task"
        raise GateError(f"{suite.path}: tasks {spec.name}: dataset applies to a task or a group defined by a YAML, "
                        f"and {spec.name!r} is a {what}; set it on each of its tasks")
    cfg = dict(load_yaml(entry.yaml_path, resolve_func=True))
    cfg.pop("custom_dataset", None)
    cfg.update(dataset_path=spec.dataset["path"], dataset_name=spec.dataset.get("name"),
               dataset_kwargs=dict(spec.dataset.get("kwargs") or {}))
    return cfg


def _group_with_dataset(tm: Any, spec: Any, suite: Suite) -> Any:
    """The group built with the suite's ``dataset`` as an override lm-eval hands down to every
    member task (nested groups and tags too): its path and kwargs (a revision, data files), and
    its name only when given (MMLU's subjects each load their own config of one dataset). Every
    member must load that dataset: the ones that load another are named."""
    wanted = spec.dataset["path"]
    other = {name: path for name, path in group_datasets(tm, spec.name).items() if path != wanted}
    if other:
        named = ", ".join(f"{name} ({path or 'a custom loader'})" for name, path in sorted(other.items())[:5])
        more = f" and {len(other) - 5} more" if len(other) > 5 else ""
        raise GateError(f"{spec.where or suite.path}: tasks {spec.name}: dataset {wanted!r} applies to each of the "
                        f"group's tasks, and {named}{more} load another; set it on those tasks' own entries, or "
                        "list the group's tasks that load it")
    overrides = {"dataset_path": wanted, "dataset_kwargs": dict(spec.dataset.get("kwargs") or {})}
    if spec.dataset.get("name") is not None:
        overrides["dataset_name"] = spec.dataset["name"]
    # lm-eval 0.4.13's factory hands a group's overrides to each member it builds; its public
    # load() would take an inline group dict as overrides too, structure keys and all.
    return tm._factory.build(tm.task_index[spec.name], overrides=overrides, registry=tm.task_index)


def group_datasets(tm: Any, name: str, seen: tuple[str, ...] = ()) -> dict[str, str | None]:
    """{leaf task: the dataset_path it loads (None: a custom loader)} under group or tag ``name``,
    read from the YAMLs (includes followed), nothing built."""
    from lm_eval.tasks._yaml_loader import load_yaml

    entry = tm.task_index.get(name)
    if entry is None or name in seen:
        return {}
    kind = entry.kind.name
    if kind in ("TASK", "PY_TASK"):
        cfg = load_yaml(entry.yaml_path, resolve_func=False, recursive=True) if entry.yaml_path else entry.cfg
        cfg = cfg or {}
        return {name: None if "custom_dataset" in cfg else cfg.get("dataset_path")}
    if kind == "TAG":
        members: list[Any] = sorted(n for n, e in tm.task_index.items() if name in (e.tags or ()))
    else:
        cfg = load_yaml(entry.yaml_path, resolve_func=False) if entry.yaml_path else entry.cfg or {}
        task = cfg.get("task") or []
        members = [task] if isinstance(task, str) else list(task)
    out: dict[str, str | None] = {}
    for member in members:
        if isinstance(member, dict):  # a member with its own overrides, or an inline task
            ref = member.get("task") or member.get("group")
            if ref in tm.task_index:
                found = group_datasets(tm, ref, (*seen, name))
                out.update({k: member.get("dataset_path", v) for k, v in found.items()})
            elif member.get("task"):
                out[member["task"]] = member.get("dataset_path")
        elif isinstance(member, str):
            out.update(group_datasets(tm, member, (*seen, name)))
    return out


def task_plan(leaves: dict[str, tuple[Any, Any]], groups: dict[str, list[str]], cli_limit: Any) -> RunPlan:
    """What the built tasks will produce, as ``names`` and the gate's pre-run checks need it."""
    from lm_eval.evaluator_utils import get_sample_size

    outputs, versions, n_shot, n_samples = {}, {}, {}, {}
    for name, (task, spec) in leaves.items():
        filters = [f.name for f in getattr(task, "_filters", [])] or ["none"]
        outputs[name] = {(f, metric): _aggregation_name(task, metric, agg)
                         for metric, agg in task.aggregation().items() for f in filters}
        versions[name] = task.VERSION
        n_shot[name] = task.get_config("num_fewshot") or 0
        original = len(task.eval_docs)
        lim = cli_limit if cli_limit is not None else spec.limit
        effective = original if lim is None else min(get_sample_size(task, lim), original)
        n_samples[name] = {"original": original, "effective": effective}
    return RunPlan(Produced(outputs, groups), versions, n_shot, n_samples)


def _aggregation_name(task: Any, metric: str, agg: Any) -> str:
    """The registered name of a metric's aggregation, as results/reader.py will read it back."""
    from lm_eval.api.registry import AGGREGATION_REGISTRY

    for item in task.config.metric_list or []:
        if isinstance(item, dict) and item.get("metric") == metric and isinstance(item.get("aggregation"), str):
            return item["aggregation"]
    for name, fn in AGGREGATION_REGISTRY.items():
        if fn is agg:
            return name
    return f"!function {getattr(agg, '__name__', type(agg).__name__)}"


def _apply_overrides(task: Any, spec: Any) -> None:
    if spec.num_fewshot is not None:
        task.set_config(key="num_fewshot", value=spec.num_fewshot)
    if spec.repeats is not None:
        task.set_config(key="repeats", value=spec.repeats)
    if spec.gen_kwargs and task.get_config("output_type") == "generate_until":
        task.set_config(key="generation_kwargs", value=dict(spec.gen_kwargs), update=True)


def task_files(suite: Suite, tm: Any, leaves: dict[str, tuple[Any, Any]]) -> dict[str, str]:
    """The task code's identity (``suite.taskcode``): every file under the include_path (named
    ``<its folder's name>/<path inside it>``, wherever the suite file is), the local data files
    of ``dataset:`` overrides (relative to the suite's folder), and for lm-eval's bundled tasks
    the files beside each task's YAML (its includes and ``utils.py``), under ``lm_eval/tasks/``."""
    out: dict[str, str] = {}
    suite_dir = Path(os.path.abspath(suite.path)).parent
    if suite.include_path is not None:
        out.update(taskcode.include_hashes(Path(suite.include_path)))
    import lm_eval.tasks  # lazily, as everywhere in this module: lm-eval only where it runs

    for spec in suite.tasks:  # the documents are what is measured too
        for path in local_data_files(((spec.dataset or {}).get("kwargs") or {}).get("data_files")):
            full = Path(os.path.normpath(suite_dir / path))
            rel = os.path.relpath(full, suite_dir).replace(os.sep, "/")
            out[rel] = taskcode.file_hash(full)
    bundled = Path(lm_eval.tasks.__file__).parent
    for name in sorted(leaves):
        entry = tm.task_index.get(name)
        yaml_path = Path(entry.yaml_path) if entry is not None and entry.yaml_path else None
        if yaml_path is None or bundled not in yaml_path.parents:
            continue
        folder = yaml_path.parent
        rel = folder.relative_to(bundled).as_posix()
        for path in sorted(folder.iterdir()):
            if path.is_file() and not path.name.endswith((".pyc", ".pyo")):
                out[f"lm_eval/tasks/{rel}/{path.name}"] = taskcode.file_hash(path)
    return dict(sorted(out.items()))


def group_aggregations(top: list) -> dict[str, Any]:
    """{group: {"leaves": [...], "aggregate": [{metric, filter_list, weight_by_size, aggregation}]}}
    for every group (nested too), as lm-eval's ``Group.aggregate`` will use them."""
    out: dict[str, Any] = {}
    groups = [g for g in top if hasattr(g, "get_all_groups")]
    for group in groups + [sub for g in groups for sub in g.get_all_groups()]:
        out[group.name] = {
            "leaves": [t.task_name for t in group.get_all_tasks()],
            "aggregate": [
                {"metric": a.metric, "filter_list": a.filter_list, "weight_by_size": bool(a.weight_by_size),
                 "aggregation": a.aggregation if isinstance(a.aggregation, str)
                 else f"!function {getattr(a.aggregation, '__name__', '?')}"}
                for a in group.aggregate_metric_list or []
            ],
        }
    return out


def rendered(task: Any, examples: int) -> list[tuple[str, str, str]]:
    """The first ``examples`` documents' requests as lm-eval builds them (few-shot included):
    (context, the continuations scored, the target's text)."""
    try:
        task.build_all_requests(limit=examples, rank=0, world_size=1)
    except Exception as exc:  # noqa: BLE001 - a template that does not render is the user's to see
        raise GateError(f"task {task.config.task}: its prompts do not render: {one_line(exc)}") from None
    by_doc: dict[int, tuple[str, list[str], Any]] = {}
    for inst in task.instances:  # a multiple-choice document has one request per choice
        context = str(inst.args[0]) if inst.args else ""
        choices = by_doc.setdefault(inst.doc_id, (context, [], inst.doc))[1]
        if len(inst.args) > 1 and isinstance(inst.args[1], str):
            choices.append(inst.args[1].strip())
    task._instances = None  # lm-eval builds them again for a real run
    return [(context, " | ".join(choices), _target_text(task, doc, choices))
            for _, (context, choices, doc) in sorted(by_doc.items())][:examples]


def _target_text(task: Any, doc: Any, choices: list[str]) -> str:
    """The document's target as text: a multiple-choice index names its choice."""
    try:
        target = task.doc_to_target(doc)
    except Exception:  # noqa: BLE001 - the preview shows what it can; the run reports real errors
        return ""
    if isinstance(target, list):
        target = target[0] if target else ""
    if isinstance(target, int) and not isinstance(target, bool) and 0 <= target < len(choices):
        return choices[target]
    return str(target).strip()


def item_hashes(task: Any, n: int) -> list[tuple[str, str]]:
    """(doc_hash, target_hash) of the task's first ``n`` documents, computed exactly as lm-eval
    0.4.13 logs them (evaluator.py): sha256 of the document's JSON and of its target's text."""
    from lm_eval.utils import handle_non_serializable, hash_string

    out = []
    for i, doc in enumerate(task.eval_docs):
        if i >= n:
            break
        text = json.dumps(doc, indent=2, default=handle_non_serializable, ensure_ascii=False)
        out.append((hash_string(text), hash_string(str(task.doc_to_target(doc)))))
    return out
