"""What a run records beside lm-eval's output: ``gatekeeper-manifest.json`` (``RunManifest``).

The model's files and the run's own files by sha256, the versions, the hardware, the timings,
the suite's identity, the commits of the hub datasets the tasks read, and how a shard or look
was cut. ``compare`` reads it to name what changed between two runs; the baseline keeps it.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gatekeeper import __version__
from gatekeeper.errors import GateError
from gatekeeper.results import layout
from gatekeeper.run import packages

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


@dataclass
class RunManifest:
    model: str
    model_path: str | None
    revision: str | None
    model_files: dict[str, str]
    lm_eval_version: str
    torch_version: str | None
    transformers_version: str | None
    dtype: str
    batch_size: int | str
    device: str
    seeds: dict[str, Any]
    suite_name: str
    suite_hash: str
    suite_path: str
    tasks: list[dict[str, Any]]
    limit: int | float | None
    hardware: dict[str, Any]
    start: str
    end: str
    wall_seconds: float
    gatekeeper_version: str = __version__
    # Versions of the locked runtime packages (gatekeeper/packages.py); compare names a difference.
    package_versions: dict[str, str | None] = field(default_factory=packages.installed_versions)
    command: list[str] = field(default_factory=lambda: list(sys.argv))
    results_file: str | None = None
    samples_files: dict[str, str] = field(default_factory=dict)
    # sha256 of the results file and each samples file, by name: a shard or look carried to
    # another job is read only as it was written (results/layout.bound_files).
    files: dict[str, str] = field(default_factory=dict)
    # ``run --shard K/N``: which documents this run covers (``shard_manifest``); None when whole.
    shard: dict[str, Any] | None = None
    # A look of ``gate --sequential``: its index, count, seed and new documents (``look_manifest``).
    look: dict[str, Any] | None = None
    # Every group's leaves and aggregate list as lm-eval built them (results.json does not record
    # the weighting): {group: {"leaves": [...], "aggregate": [...]}} (``results/groups.py``).
    groups: dict[str, Any] = field(default_factory=dict)
    # A run that shared its model with the next (``reuse_model``): seconds this run spent loading
    # it (0 when the previous run had), so the time per item is the evaluation's own.
    model_load_seconds: float | None = None
    # The model's own time: per request phase (loglikelihood, ...) its requests and seconds
    # (run/progress.py), and per task its items, request type and requests. A sequential gate's
    # saving is the skipped items' requests at these rates, not a share of the wall time.
    request_seconds: dict[str, dict[str, float]] = field(default_factory=dict)
    task_requests: dict[str, dict[str, Any]] = field(default_factory=dict)
    backend: str = "hf"
    backend_versions: dict[str, str] = field(default_factory=dict)
    model_args: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, Any] | None = None
    # sha256 of every file the suite's tasks are built from (suite/taskcode.py), by path
    # relative to the suite's folder; lm-eval's bundled tasks under lm_eval/tasks/.
    task_files: dict[str, str] = field(default_factory=dict)
    # The suite fields suite_hash is the hash of (suite.hashed_document): a later suite whose hash
    # differs is told which field changed.
    suite_hashed: dict[str, Any] = field(default_factory=dict)
    # The commit sha of every hub dataset the tasks loaded (run/pins.py): the baseline keeps it as
    # the lock later gates evaluate at.
    datasets: dict[str, str] = field(default_factory=dict)
    # sha256 of the files of a tokenizer the suite names apart from the model (model.tokenizer).
    tokenizer_files: dict[str, str] = field(default_factory=dict)
    # The same for every other model argument the suite writes as a path (an adapter: peft,
    # delta), by key: {"peft": {file: sha256}}. compare names a file that differs.
    model_arg_files: dict[str, dict[str, str]] = field(default_factory=dict)
    format: str = "gatekeeper-manifest"
    version: int = 1


def hash_model_files(folder: Path) -> dict[str, str]:
    """{path relative to the checkpoint: sha256} of every file of the checkpoint folder: weights,
    shard index, tokenizer, configs, remote code, adapters. Everything that can change an answer
    is in the manifest and in the request cache's identity (a checkpoint that differs only in
    ``model.safetensors.index.json`` answers differently)."""
    out = _hash_folder(folder)
    if not any(name.endswith(WEIGHT_SUFFIXES) for name in out):
        raise GateError(f"{folder}: no weight files (*.safetensors, *.bin, *.pt, *.gguf) in the model directory")
    return out


def _hash_folder(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if name.startswith(".") or not path.is_file() or (skip and name.endswith(skip)):
                continue
            out[path.relative_to(folder).as_posix()] = sha256_file(path)
    return out


def tokenizer_files(tokenizer: str | None, revision: str | None = None) -> dict[str, str]:
    """{file: sha256} of a tokenizer the suite names apart from the model: a folder (``./tok``,
    already absolute here) or a hub id, read from the HF cache it was just loaded from (never a
    folder of that name in the working folder: the evaluation is sealed). Weights are left out:
    a tokenizer named by a model repository shares its folder."""
    if not tokenizer:
        return {}
    try:
        folder = Path(tokenizer) if os.path.isabs(tokenizer) else _cached_snapshot(tokenizer, revision)
        return _hash_folder(folder, WEIGHT_SUFFIXES)
    except Exception:  # noqa: BLE001 - provenance: what the cache holds, else nothing
        return {}


def model_arg_files(m: dict[str, Any]) -> dict[str, dict[str, str]]:
    """{model_args key: {file: sha256}} of each model argument that names a local folder or file
    (already absolute here): adapters, deltas, any path the suite gives its model."""
    out = {}
    for key, value in (m.get("model_args") or {}).items():
        if key == "tokenizer" or not isinstance(value, str) or not os.path.isabs(value):
            continue
        path = Path(value)
        if path.is_dir():
            out[key] = _hash_folder(path)
        elif path.is_file():
            out[key] = {path.name: sha256_file(path)}
    return out


def sha256_file(path: Path) -> str:
    try:
        return layout.sha256_file(path)
    except OSError as exc:
        raise GateError(f"{path}: cannot read model file ({exc.strerror})") from None


def run_file_digests(folder: Path, paths: Sequence[Path]) -> dict[str, str]:
    """{name: sha256} of a run's results and samples files (the manifest's ``files``)."""
    return {p.name: layout.sha256_file(folder / p.name) for p in sorted(paths)}


def hub_files(model: str, revision: str | None) -> dict[str, str]:
    """Hashes of a hub model's files from the local HF cache, when lm-eval just loaded them."""
    try:
        return hash_model_files(_cached_snapshot(model, revision))
    except Exception:  # noqa: BLE001 - provenance is best effort for hub ids
        return {}


def _cached_snapshot(repo: str, revision: str | None) -> Path:
    """The HF cache's folder of a hub repository lm-eval just loaded (never downloads)."""
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo, revision=revision, local_files_only=True))


def version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
