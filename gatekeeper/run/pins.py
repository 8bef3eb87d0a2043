"""Hub datasets as a lock: every dataset a task loads from the hub is evaluated at one commit.

A hub dataset's ``main`` moves whenever its owner pushes. A gate that evaluated the new head
would spend the whole evaluation and then find that the items differ from the baseline's. So
while the tasks are built, every ``datasets.load_dataset`` of a hub repository (``org/name``)
goes through ``DatasetPins``:

- the revision is resolved to its commit sha before anything is downloaded, and recorded
  (the run manifest's ``datasets``, kept in the baseline by ``baseline record|promote``);
- with a lock (the baseline's recorded shas) the dataset is loaded at the locked commit, whatever
  ``main`` says now; a revision the suite or task pins itself (``dataset_kwargs.revision``) is
  used as written and must resolve to the locked commit;
- ``new_data`` ignores the lock: the run takes each dataset's current head (to re-record on
  purpose; the report then names every moved revision).

Offline (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``), ``datasets`` 5.2 loads the newest cached
copy whatever revision it is asked for, so the commit's snapshot folder in the hub cache is loaded
instead, and a commit the cache lacks is an error naming it. Local builders (``json``, ``csv``,
...) and absolute folders are not hub datasets and pass through unchanged.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gatekeeper.errors import GateError
from gatekeeper.results.reader import is_lock

# A hub repository id, ``org/name`` or a bare ``name`` (models too: run/modelref.check_model).
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
SHA = re.compile(r"^[0-9a-f]{40}$")
FIX = ("to evaluate the dataset's current data on purpose, re-record the baseline: gatekeeper run --new-data "
       "... then gatekeeper baseline promote RUN_DIR")


def check_lock(value: Any, where: str) -> dict[str, str]:
    """A recorded lock ({dataset: 40-hex sha}) as read from a manifest; GateError otherwise."""
    if value is None:
        return {}
    if not is_lock(value):
        raise GateError(f"{where}: datasets is {str(value)[:80]!r}, expected {{dataset: commit sha}}")
    return dict(value)


@dataclass
class DatasetPins:
    """The lock a run follows and the commits it used (``used``: {dataset: sha})."""

    lock: dict[str, str] = field(default_factory=dict)
    new_data: bool = False
    used: dict[str, str] = field(default_factory=dict)
    _resolved: dict[tuple[str, str], str] = field(default_factory=dict, repr=False)
    _unreachable: set[str] = field(default_factory=set, repr=False)

    def revision(self, dataset: str, asked: Any) -> str:
        """The commit sha ``dataset`` is evaluated at (``asked``: the task's own revision or None)."""
        if asked is not None and (not isinstance(asked, str) or not asked.strip()):
            raise GateError(f"dataset {dataset}: dataset_kwargs.revision is {asked!r}, expected a string (a commit "
                            f"sha, tag or branch); quote it in the task's YAML: revision: \"{asked}\"")
        locked = None if self.new_data else self.lock.get(dataset)
        if asked is not None:
            sha = self._sha(dataset, asked)
            if locked is not None and sha != locked:
                raise GateError(f"dataset {dataset}: the task pins revision {asked} ({sha[:7]}), the baseline was "
                                f"recorded at {locked[:7]}; pin the baseline's commit, or {FIX}")
        elif locked is not None:
            sha = self._sha(dataset, locked)
        else:
            sha = self._sha(dataset, "main")
        seen = self.used.setdefault(dataset, sha)
        if seen != sha:
            raise GateError(f"dataset {dataset}: two tasks load it at different commits ({seen[:7]} and {sha[:7]}); "
                            "pin one revision for every task that reads it")
        return sha

    def from_cache(self, dataset: str) -> bool:
        """The hub did not answer for ``dataset`` (or is switched off): its commit comes from the cache."""
        return offline() or dataset in self._unreachable

    def _sha(self, dataset: str, revision: str) -> str:
        key = (dataset, revision)
        if key not in self._resolved:
            if offline():
                self._resolved[key] = _offline_sha(dataset, revision)
            else:
                sha, answered = _hub_sha(dataset, revision)
                if not answered:
                    self._unreachable.add(dataset)
                self._resolved[key] = sha
        return self._resolved[key]


def is_hub_dataset(path: Any) -> bool:
    """``org/name`` (or a bare ``name``) that is not one of ``datasets``' local builders."""
    if not isinstance(path, str) or not HUB_ID.match(path):
        return False
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

    return path not in _PACKAGED_DATASETS_MODULES


def offline() -> bool:
    import datasets.config

    return bool(datasets.config.HF_HUB_OFFLINE)


@contextmanager
def pinned(pins: DatasetPins) -> Iterator[None]:
    """While tasks are built: every hub ``datasets.load_dataset`` at the commit ``pins`` gives."""
    import datasets

    real = datasets.load_dataset

    def load_dataset(*args: Any, **kwargs: Any) -> Any:
        path = kwargs.get("path", args[0] if args else None)
        if not is_hub_dataset(path):
            return real(*args, **kwargs)
        sha = pins.revision(path, kwargs.get("revision"))
        if pins.from_cache(path):  # datasets would load its newest cached copy: load the commit's own files
            kwargs = {k: v for k, v in kwargs.items() if k not in ("path", "revision")}
            return real(str(snapshot(path, sha)), *args[1:], **kwargs)
        return real(*args, **{**kwargs, "revision": sha})

    datasets.load_dataset = load_dataset
    try:
        yield
    finally:
        datasets.load_dataset = real


def snapshot(dataset: str, sha: str) -> Path:
    """The hub cache's folder of ``dataset`` at ``sha``; GateError when the cache lacks it."""
    folder = _cache_folder(dataset) / "snapshots" / sha
    if not folder.is_dir():
        raise GateError(f"dataset {dataset}: revision {sha[:7]} ({sha}) is not in the Hugging Face cache "
                        f"({_cache_folder(dataset).parent}) and the hub is switched off (HF_HUB_OFFLINE / "
                        "HF_DATASETS_OFFLINE): run once with the hub reachable to fill the cache, or copy a cache "
                        f"that holds this commit; if the dataset really moved on purpose, {FIX}")
    return folder


def _cache_folder(dataset: str) -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE) / ("datasets--" + dataset.replace("/", "--"))


def _offline_sha(dataset: str, revision: str) -> str:
    if SHA.match(revision):
        return revision
    ref = _cache_folder(dataset) / "refs" / revision
    try:
        sha = ref.read_text(encoding="utf-8").strip()
    except OSError:
        sha = ""
    if not SHA.match(sha):
        raise GateError(f"dataset {dataset}: revision {revision!r} is not in the Hugging Face cache ({ref} is "
                        "missing) and the hub is switched off (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE): run once "
                        "with the hub reachable, or pin a commit sha the cache holds")
    return sha


def _hub_sha(dataset: str, revision: str) -> tuple[str, bool]:
    """The commit ``revision`` names on the hub now (one API request), and whether the hub
    answered (False: the cache's commit, the hub out of reach)."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        return str(HfApi().dataset_info(dataset, revision=revision, timeout=_timeout()).sha), True
    except RevisionNotFoundError:
        raise GateError(f"dataset {dataset}: the hub ({constants.ENDPOINT}) has no revision {revision!r}; "
                        + (f"the baseline was recorded at {revision}, which its owner removed or rewrote: {FIX}"
                           if SHA.match(revision) else "check the task's dataset_kwargs.revision")) from None
    except GatedRepoError:
        raise GateError(f"dataset {dataset}: gated on the hub; set HF_TOKEN to a token that has access") from None
    except RepositoryNotFoundError:
        raise GateError(f"dataset {dataset}: not found on the hub ({constants.ENDPOINT}); check the task's "
                        "dataset_path (a private dataset needs HF_TOKEN)") from None
    except Exception as exc:  # noqa: BLE001 - httpx, proxies, DNS: any failure to get an answer
        # No answer (no network, a proxy): the cache decides, as it would for datasets itself.
        try:
            return _offline_sha(dataset, revision), False
        except GateError:
            raise GateError(f"dataset {dataset}: cannot ask the hub ({constants.ENDPOINT}) for revision "
                            f"{revision!r} ({type(exc).__name__}) and the Hugging Face cache does not hold it; "
                            "check the network, or set HF_DATASETS_OFFLINE=1 with a filled cache") from None


def _timeout() -> float:
    try:
        return float(os.environ.get("HF_HUB_ETAG_TIMEOUT") or 10)
    except ValueError:
        return 10.0
