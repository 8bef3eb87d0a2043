"""A task YAML's relative ``dataset_kwargs.data_files``, read against the YAML, from any folder.

lm-eval hands ``data_files`` to ``datasets.load_dataset`` as written, so a relative path resolves
against the process's working directory: a suite that works from the repository root fails, or
reads another file, from anywhere else. While gatekeeper builds a suite's tasks, a relative path
in a task of the include_path is read against that task's YAML folder instead. The file must lie
inside the include_path (it is then hashed with the task code, and a pull request's checkout
cannot point it elsewhere); the task's config keeps the path as written, so results and
baselines stay portable. A path that only exists relative to the working directory is an error
that says how to write it.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gatekeeper.errors import GateError
from gatekeeper.run import sealed
from gatekeeper.suite.suite import map_data_files


@contextmanager
def data_files_beside_yaml(tm: Any, include_path: Path | None,
                           suite_datasets: dict[str, Path] | None = None) -> Iterator[None]:
    """While loading tasks from ``tm``, resolve relative data files: an include_path task's
    against its YAML's folder, a task with the suite's ``dataset:`` (``suite_datasets``: task ->
    the suite's folder) against the suite's folder."""
    suite_datasets = suite_datasets or {}
    if include_path is None and not suite_datasets:
        yield
        return
    from lm_eval.api.task import ConfigurableTask

    original = ConfigurableTask.download
    root = Path(os.path.abspath(include_path)) if include_path is not None else None

    def resolver(task: str | None) -> Any:
        if task in suite_datasets:
            return lambda p: _in_suite(p, task, suite_datasets[task])
        entry = tm.task_index.get(task)
        yaml_path = Path(os.path.abspath(entry.yaml_path)) if entry is not None and entry.yaml_path else None
        if root is not None and yaml_path is not None and root in yaml_path.parents:
            return lambda p: _beside(p, yaml_path, root)
        return None

    def download(self: Any, dataset_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        resolve = resolver(getattr(self.config, "task", None)) if dataset_kwargs else None
        if resolve is None or not dataset_kwargs.get("data_files"):
            original(self, dataset_kwargs, **kwargs)
            return
        resolved = dict(dataset_kwargs)
        resolved["data_files"] = map_data_files(dataset_kwargs["data_files"], resolve)
        original(self, resolved, **kwargs)
        if "trust_remote_code" not in resolved:  # lm-eval pops it from the config's own dict
            dataset_kwargs.pop("trust_remote_code", None)

    ConfigurableTask.download = download
    try:
        yield
    finally:
        ConfigurableTask.download = original


def _in_suite(path: str, task: str, folder: Path) -> str:
    if os.path.isabs(path):
        return path
    full = Path(os.path.normpath(folder / path))
    if glob.glob(str(full)):
        return str(full)
    raise GateError(f"task {task}: dataset data_files {path!r} not found relative to the suite's folder {folder}")


def _beside(path: str, yaml_path: Path, root: Path) -> str:
    if os.path.isabs(path):
        return path  # the runner's own file: not the checkout's to choose
    full = Path(os.path.normpath(yaml_path.parent / path))
    if root != full and root not in full.parents:
        raise GateError(f"{yaml_path}: data_files {path!r} points outside the include_path {root}; keep a task's "
                        "data under the include_path (it is hashed with the task), or give the task a "
                        "`dataset:` in the suite")
    if glob.glob(str(full)):
        return str(full)
    if glob.glob(str(sealed.origin() / path)):
        raise GateError(f"{yaml_path}: data_files {path!r} exists relative to the working directory, not to the "
                        f"task file; write it relative to {yaml_path.parent} (gatekeeper reads a task's relative "
                        "data_files against its YAML, so the suite runs the same from any folder)")
    raise GateError(f"{yaml_path}: data_files {path!r} not found relative to the task file's folder "
                    f"{yaml_path.parent}")
