"""Which task names lm-eval knows, fast: the suite's include_path, then lm-eval's bundled tasks.

lm-eval's ``TaskManager`` indexes all ~14k bundled task YAMLs whenever ``include_defaults`` is on
(seconds idle, minutes on a busy runner), and a suite naming one task that its include_path does
not hold used to pay that before a typo was even reported. Here the bundled names are indexed
once per lm-eval installation and kept in a cache file (name -> kind and top-level folder under
``lm_eval/tasks``); then

- a name in neither the include_path nor the bundled index is an error at once, with a "did you
  mean" from the suite's own tasks first, then the bundled ones;
- a bundled *task*, *tag* or *group* is loaded by indexing only its folders (plus the
  include_path, which overrides them, as in lm-eval); a group's members in other folders add
  theirs, followed until every member is indexed.

The cache only speeds things up: a stale or edited one is rebuilt, and a folder that turns out
not to hold the task falls back to the full index. lm-eval is imported lazily.
"""

from __future__ import annotations

import difflib
import hashlib
from importlib.metadata import version
from pathlib import Path
from typing import Any

from gatekeeper.errors import GateError
from gatekeeper.files import cache_dir, cached_json

CACHE_VERSION = 1


def _tasks_dir() -> Path:
    import lm_eval.tasks

    # Not resolved: the run's manifest recognises bundled task files by this same path.
    return Path(lm_eval.tasks.__file__).parent


def _cache_file(tasks_dir: Path) -> Path:
    st = tasks_dir.stat()
    key = f"{CACHE_VERSION}|{version('lm_eval')}|{tasks_dir}|{st.st_mtime_ns}"
    return cache_dir() / f"lm-eval-tasks-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def bundled_index() -> dict[str, dict[str, Any]]:
    """{name: {"kind": "task"|"group"|"tag", "folders": [top-level folders]}} of lm-eval's tasks."""
    tasks_dir = _tasks_dir()
    return cached_json(
        _cache_file(tasks_dir),
        lambda data: isinstance(data, dict) and data.get("version") == CACHE_VERSION and _valid(data.get("names"), tasks_dir),
        lambda: {"version": CACHE_VERSION, "tasks_dir": str(tasks_dir), "names": _build_index(tasks_dir)})["names"]


def _valid(names: Any, tasks_dir: Path) -> bool:
    """A cached index as _build_index writes it: every folder one of lm-eval's own task folders.
    The folders are indexed, so one anywhere else (an absolute path, ``..``) would load task
    files lm-eval does not ship: such a file (damaged, or written by someone else) is made again."""
    if not isinstance(names, dict):
        return False
    folders: set[str] = set()
    for entry in names.values():
        if not isinstance(entry, dict) or entry.get("kind") not in ("task", "group", "tag") \
                or not isinstance(entry.get("folders"), list):
            return False
        if not all(isinstance(f, str) for f in entry["folders"]):
            return False
        folders.update(entry["folders"])
    return all(f not in ("", ".", "..") and "/" not in f and "\\" not in f and (tasks_dir / f).is_dir()
               for f in folders)


def _build_index(tasks_dir: Path) -> dict[str, dict[str, Any]]:
    from lm_eval.tasks import TaskManager

    names: dict[str, dict[str, Any]] = {}
    for name, entry in TaskManager(include_defaults=True)._index.items():
        kind = getattr(entry.kind, "name", str(entry.kind)).lower()
        folder = _folder(entry.yaml_path, tasks_dir)
        names[name] = {"kind": "group" if kind == "group" else ("tag" if kind == "tag" else "task"),
                       "folders": [folder] if folder else []}
        for tag in getattr(entry, "tags", None) or ():
            tag_entry = names.setdefault(tag, {"kind": "tag", "folders": []})
            if folder and folder not in tag_entry["folders"]:
                tag_entry["folders"].append(folder)
    for entry in names.values():
        entry["folders"].sort()
    return names


def _folder(yaml_path: Any, tasks_dir: Path) -> str | None:
    if yaml_path is None:
        return None
    try:
        return Path(yaml_path).resolve().relative_to(tasks_dir.resolve()).parts[0]
    except (ValueError, IndexError):
        return None


def suggestion(name: str, local: list[str], bundled: list[str]) -> str:
    """'; did you mean 'x'?' from the suite's own tasks first, then lm-eval's; '' when none is close."""
    close = difflib.get_close_matches(name, local, n=1, cutoff=0.6)
    if not close:
        close = difflib.get_close_matches(name, bundled, n=3, cutoff=0.75)
    if not close:
        return ""
    if len(close) == 1:
        return f"; did you mean {close[0]!r}?"
    return "; did you mean one of " + ", ".join(repr(c) for c in close) + "?"


def task_manager(where: dict[str, str], include_path: Path | None, names: list[str], metadata: dict[str, Any]) -> Any:
    """A ``TaskManager`` that knows every name in ``names``, indexing as little as it can.

    ``where[name]`` (the suite line naming it) starts the error for a name no index holds."""
    from lm_eval.tasks import TaskManager

    include = str(include_path) if include_path is not None else None
    local: list[str] = []
    members: list[str] = []
    if include:
        tm = TaskManager(include_path=include, include_defaults=False, metadata=dict(metadata))
        # A group of the include_path may list bundled tasks (arc_easy, hellaswag, ...): those
        # need their folders indexed too.
        members = [m for m in _group_members(tm, names) if m not in tm.all_tasks]
        if all(n in tm.all_tasks for n in names) and not members:
            return tm
        local = list(tm.all_tasks)
    bundled = bundled_index()
    missing = [n for n in names if n not in local]
    for name in missing:
        if name not in bundled:
            places = f"include_path {include_path}" if include else "the suite (no include_path)"
            raise GateError(f"{where.get(name, 'suite')}: task {name!r} is not in {places} nor among lm-eval's "
                            f"{len(bundled):,} bundled tasks{suggestion(name, local, sorted(bundled))}")
    # A member no index knows is left to lm-eval, whose failure run/tasks.py explains (file:line).
    missing += [m for m in dict.fromkeys(members) if m in bundled and m not in missing]
    if any(not bundled[n]["folders"] for n in missing):
        return TaskManager(include_path=include, include_defaults=True, metadata=dict(metadata))
    tasks_dir = _tasks_dir()
    folders = {f for n in missing for f in bundled[n]["folders"]}
    # A bundled group may list tasks of other folders (pythia: arc, lambada, mmlu, ...): its
    # members' folders are added until every member is indexed. mmlu alone: 0.3 s, not the 9 s
    # (minutes on a busy runner) of all ~14k YAMLs.
    for _ in range(8):
        # The include_path last: it overrides bundled tasks of the same name, as in lm-eval.
        paths = [str(tasks_dir / f) for f in sorted(folders)] + ([include] if include else [])
        tm = TaskManager(include_path=paths, include_defaults=False, metadata=dict(metadata))
        unindexed = [m for m in _group_members(tm, [*names, *missing]) if m not in tm.all_tasks and m in bundled]
        more = {f for m in unindexed for f in bundled[m]["folders"]} - folders
        if not more:
            break
        folders |= more
    if all(n in tm.all_tasks for n in [*names, *missing]) and not unindexed:
        return tm
    return TaskManager(include_path=include, include_defaults=True, metadata=dict(metadata))


def _group_members(tm: Any, names: list[str]) -> list[str]:
    """The task names the include_path's groups among ``names`` list, nested groups followed."""
    from lm_eval.tasks._yaml_loader import load_yaml

    out: list[str] = []
    todo, seen = list(names), set()
    while todo:
        name = todo.pop()
        entry = tm.task_index.get(name)
        if name in seen or entry is None or not entry.yaml_path or entry.kind.name != "GROUP":
            continue
        seen.add(name)
        try:
            listed = load_yaml(entry.yaml_path, resolve_func=False).get("task")
        except Exception:  # noqa: BLE001 - lm-eval reports a broken YAML when it loads it
            continue
        for member in _listed(listed):
            out.append(member)
            todo.append(member)
    return out


def _listed(listed: Any) -> list[str]:
    """The names a group's ``task:`` lists: strings, and inside an entry given as a mapping (a
    task with overrides, or a group written inline) its own ``task:``, followed down."""
    items = listed if isinstance(listed, list) else [listed]
    out: list[str] = []
    for item in items:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            out += _listed(item.get("task"))
    return out
