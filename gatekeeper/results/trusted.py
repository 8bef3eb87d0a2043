"""Task-defined (``!function``) aggregations, from trusted code only.

lm-eval writes a ``!function`` aggregation into results.json as the function's Python source.
gatekeeper never executes text found in a results or baseline file: the function is loaded
from the suite's ``include_path`` (or lm-eval's bundled tasks) through lm-eval's own
``TaskManager`` index and YAML loader, exactly as ``lm_eval`` would load it, and used only
when its source is the one the run recorded.

``trusted_code(include_path)`` makes that code available while a suite's runs are read
(``gate.compare_paths``); without it, such metrics are untestable (an error when gated).
lm-eval is imported lazily, only when a run has a ``!function`` aggregation.
"""

from __future__ import annotations

import hashlib
import inspect
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gatekeeper.errors import GateError

PREFIX = "!function "
_DEF = re.compile(r"^\s*def\s+([A-Za-z_]\w*)", re.MULTILINE)


def function_name(source: str) -> str | None:
    """The name a ``!function`` aggregation's source defines (None: not a function source)."""
    match = _DEF.search(source)
    return match.group(1) if match else None


def aggregation_id(source: str) -> str:
    """How a task-defined aggregation is named in series and baselines: ``!function NAME@HASH``
    (12 hex digits of the source's sha256), so a changed function never pairs with the old."""
    return f"{PREFIX}{function_name(source)}@{hashlib.sha256(source.encode('utf-8')).hexdigest()[:12]}"


def is_function_aggregation(aggregation: str) -> bool:
    return aggregation.startswith(PREFIX) or function_name(aggregation) is not None


@dataclass
class TrustedCode:
    """The suite's include_path (and lm-eval's bundled tasks) as the only source of functions."""

    include_path: Path | None
    # The suite's task entries: lm-eval's ~14k bundled tasks are indexed (tens of seconds) only
    # when the suite names one that its include_path does not hold; None: no suite, any task.
    suite_tasks: tuple[str, ...] | None = None
    _managers: dict[bool, Any] = field(default_factory=dict)
    _functions: dict[str, Callable[[list[Any]], Any]] = field(default_factory=dict)

    def _entry(self, task: str) -> Any:
        from lm_eval.tasks import TaskManager

        for defaults in ((False, True) if self.include_path is not None else (True,)):
            if defaults and not self._needs_bundled():
                return None
            if defaults not in self._managers:
                path = str(self.include_path) if self.include_path is not None else None
                self._managers[defaults] = TaskManager(include_path=path, include_defaults=defaults)
            entry = self._managers[defaults].task_index.get(task)
            if entry is not None and entry.yaml_path is not None:
                return entry
        return None

    def _needs_bundled(self) -> bool:
        if self.suite_tasks is None or self.include_path is None:
            return True
        local = self._managers.get(False)
        return local is not None and any(t not in local.task_index for t in self.suite_tasks)

    def find(self, task: str, metric: str, aggregation_id_: str) -> Callable[[list[Any]], Any] | None:
        """The trusted function for ``task``'s ``metric`` whose source hashes to the id, or None."""
        if aggregation_id_ in self._functions:
            return self._functions[aggregation_id_]
        try:
            entry = self._entry(task)
        except ImportError:
            return None  # lm-eval is not installed: nothing trusted to load from
        if entry is None:
            return None
        from lm_eval.tasks._yaml_loader import load_yaml

        try:
            config = load_yaml(entry.yaml_path)
        except Exception as exc:  # noqa: BLE001 - the task's own code failed to import
            raise GateError(f"{entry.yaml_path}: cannot load task {task} ({type(exc).__name__}: {exc})") from None
        for item in config.get("metric_list") or []:
            fn = item.get("aggregation") if isinstance(item, dict) and item.get("metric") == metric else None
            if callable(fn):
                try:
                    source = inspect.getsource(fn)
                except (OSError, TypeError):
                    return None
                if aggregation_id(source) == aggregation_id_:
                    self._functions[aggregation_id_] = fn
                    return fn
                raise GateError(
                    f"{entry.yaml_path}: {task} {metric}: the run used another version of "
                    f"{PREFIX}{function_name(source)} than this task code defines; re-run with the suite's task code"
                )
        return None


_ACTIVE: list[TrustedCode] = []


@contextmanager
def trusted_code(include_path: Path | None, tasks: tuple[str, ...] | None = None) -> Iterator[TrustedCode]:
    """Within the block, readers may load ``!function`` aggregations from ``include_path``
    (and from lm-eval's bundled tasks when ``tasks``, the suite's task entries, names one that
    the include_path does not hold)."""
    code = TrustedCode(include_path, tasks)
    _ACTIVE.append(code)
    try:
        yield code
    finally:
        _ACTIVE.remove(code)


def active() -> TrustedCode | None:
    return _ACTIVE[-1] if _ACTIVE else None


def resolve(task: str, metric: str, aggregation_id_: str) -> Callable[[list[Any]], Any] | None:
    """The trusted function for a series, or None when no trusted code provides it."""
    code = active()
    return code.find(task, metric, aggregation_id_) if code is not None else None
