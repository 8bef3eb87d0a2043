"""``gatekeeper run``: the pinned suite through lm-eval 0.4.13's Python API, plus a manifest.

Why the Python API and not the ``lm_eval`` CLI:
- ``TaskManager(include_path, include_defaults=False)`` skips indexing lm-eval's ~14k bundled
  tasks (about 4 s per run) when every suite task lives in the suite's include_path;
- per-task ``num_fewshot`` / ``repeats`` / ``gen_kwargs`` / ``limit`` (the CLI has one global value);
- every check that can fail (lm-eval version, model path, task names, output dir) runs before
  the model is loaded, so a typo costs seconds, not GPU time.

Output is written with lm-eval's own ``EvaluationTracker``, exactly as the CLI writes it
(``<out>/<model_name_sanitized>/results_<ts>.json`` + one ``samples_<task>_<ts>.jsonl`` per leaf
task), plus ``gatekeeper-manifest.json`` (model file hashes, versions, hardware, timings). The
run is assembled in a temp dir inside ``<out>`` and renamed into place at the end: a failed run
leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib.metadata
import importlib.util
import io
import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gatekeeper import __version__
from gatekeeper.errors import GateError
from gatekeeper.files import write_json_atomic
from gatekeeper.results import layout, taskindex
from gatekeeper.results.layout import MANIFEST_NAME
from gatekeeper.run import backends, cache, hardware, looks, packages, sealed
from gatekeeper.run import progress as progress_lines
from gatekeeper.run.backends import BackendPlan
from gatekeeper.run.environment import evaluation_env
from gatekeeper.run.looks import Look
from gatekeeper.run.once import once_per_process
from gatekeeper.run.pins import DatasetPins, pinned
from gatekeeper.run.shard import Shard, selection
from gatekeeper.run.taskdata import data_files_beside_yaml
from gatekeeper.suite import names, taskcode
from gatekeeper.suite.names import Produced, RunPlan
from gatekeeper.suite.suite import Suite, local_data_files
from gatekeeper.text import redact, redact_url

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")

Log = Callable[[str], Any]


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
    format: str = "gatekeeper-manifest"
    version: int = 1


@dataclass
class _Settings:
    model_args: dict[str, Any]
    dtype: str
    batch_size: int | str
    device: str
    limit: int | float | None
    chat_template: bool
    backend: BackendPlan
    cache: Path | None = None  # lm-eval's use_cache path (it appends "_rank0.db")
    cache_id: str = ""  # what the cache's entries are signed for (cache.identity)
    cache_key: bytes = b""  # the runner's secret (cache.secret_key)


def run_suite(
    suite: Suite,
    model: str,
    out_dir: Path,
    *,
    revision: str | None = None,
    device: str | None = None,
    batch_size: int | str | None = None,
    dtype: str | None = None,
    limit: int | float | str | None = None,
    log: Log = print,
    preflight: Callable[[RunPlan], Any] | None = None,
    shard: Shard | None = None,
    cache_dir: Path | str | None = None,
    look: Look | None = None,
    reuse_model: bool = False,
    lock: dict[str, str] | None = None,
    new_data: bool = False,
) -> Path:
    """Run ``suite`` on ``model``; returns the run directory (results, samples, manifest).

    ``cache_dir`` (else ``$GATEKEEPER_CACHE``; default off) keeps lm-eval's request cache, keyed
    by the model files, the suite hash and the backend arguments: a killed run resumes there.

    Once lm-eval has built the tasks, and before it evaluates anything, every name in the
    suite must match a metric/filter/task the tasks produce (``names.check_suite``), and
    ``preflight(plan)`` may refuse the run (``gate`` checks the baseline there).
    ``shard`` evaluates only that shard's documents (``gatekeeper merge`` joins the shards);
    ``look`` only that look's documents of a sequential gate (``run/looks.py``). ``reuse_model``:
    keep the loaded model for the next run in this process with the same backend arguments (a
    sequential gate's looks load it once; ``release_models`` frees it). ``lock``: the baseline's
    hub dataset commits, evaluated whatever the hub's head says now (``run/pins.py``); ``new_data``
    takes each dataset's head instead (to re-record on purpose). The run works in a sealed folder
    (``run/sealed.py``): nothing in the user's working folder but the model reaches lm-eval."""
    out_dir = Path(out_dir)
    where = sealed.absolute(out_dir)
    fresh = not where.exists()
    cache_dir = cache_dir if cache_dir is not None else os.environ.get(CACHE_ENV) or None
    local = _before_sealing(suite, model)
    try:
        with sealed.sealed():
            target = _run(_absolute_suite(suite), model, local, where, revision=revision, device=device,
                          batch_size=batch_size, dtype=dtype, limit=limit, log=log, preflight=preflight,
                          shard=shard, cache_dir=None if cache_dir is None else sealed.absolute(cache_dir),
                          look=look, reuse_model=reuse_model, pins=DatasetPins(dict(lock or {}), new_data))
    except BaseException:
        if fresh and where.is_dir() and not any(where.iterdir()):
            where.rmdir()  # we made it; a failed run leaves nothing behind
        raise
    return out_dir / target.name


def _before_sealing(suite: Suite, model: str) -> Path | None:
    """What must be read in the user's working folder: the model's path (the checkpoint, the one
    thing a pull request may bring), and no Hugging Face cache inside the repository."""
    sealed.check_caches(sealed.repositories(Path(suite.path).parent))
    local = check_model(model)
    return None if local is None else sealed.absolute(local)


def _absolute_suite(suite: Suite) -> Suite:
    """The suite with its paths absolute: inside the sealed folder a relative one means nothing."""
    return dataclasses.replace(
        suite, path=sealed.absolute(suite.path), baseline_path=sealed.absolute(suite.baseline_path),
        include_path=None if suite.include_path is None else sealed.absolute(suite.include_path),
        model=_absolute_model_paths(suite.model))


def _absolute_model_paths(m: dict[str, Any]) -> dict[str, Any]:
    """The suite's model settings with a tokenizer or adapter written as a path (``./tok``) made
    absolute; a hub id (``org/tok``) stays one, and is never read from a folder of that name."""
    out = dict(m)
    if isinstance(out.get("tokenizer"), str) and sealed.is_path(out["tokenizer"]):
        out["tokenizer"] = str(sealed.absolute(out["tokenizer"]))
    extra = dict(out.get("model_args") or {})
    for key in _PATH_ARGS:
        if isinstance(extra.get(key), str) and sealed.is_path(extra[key]):
            extra[key] = str(sealed.absolute(extra[key]))
    if extra:
        out["model_args"] = extra
    return out


# model_args that name a folder or a hub repository (lm-eval's HFLM: tokenizer, peft, delta).
_PATH_ARGS = ("tokenizer", "peft", "delta")


def _run(suite: Suite, model: str, local: Path | None, out_dir: Path, *, revision: str | None,
         device: str | None, batch_size: Any, dtype: str | None, limit: Any, log: Log,
         preflight: Callable[[RunPlan], Any] | None, shard: Shard | None = None,
         cache_dir: Path | str | None = None, look: Look | None = None, reuse_model: bool = False,
         pins: DatasetPins | None = None) -> Path:
    """The run, inside the sealed folder: every path here is absolute; ``model`` is the name the
    user gave (recorded), ``local`` its checkpoint folder (what lm-eval loads), None for a hub id.
    A local model needs no network, and gatekeeper never switches it off: a bundled task's
    dataset comes from the hub (or from the HF cache where the user set HF_DATASETS_OFFLINE)."""
    started, t0 = _utc_now(), time.perf_counter()
    lm_eval_version = check_lm_eval(suite)
    settings = _settings(suite, str(local) if local is not None else model, revision, device, batch_size,
                         dtype, limit)
    backends.check_available(settings.backend.name, str(suite.path))
    target = out_dir / _sanitize_model_name(model)
    check_output(out_dir, target)
    if not sys.stderr.isatty():
        os.environ.setdefault("TQDM_DISABLE", "1")  # progress bars make unreadable CI logs
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # as the lm_eval CLI does

    files = hash_model_files(local) if local is not None else {}
    if cache_dir is not None:
        settings.cache = request_cache_path(Path(cache_dir), suite, settings, files, model)
        settings.cache_key = cache.secret_key()
        log(f"request cache: {settings.cache}_rank0.db")
    pins = pins or DatasetPins()
    with _quiet_output(log, t0):
        task_manager, top, leaves, plan = _built(suite, settings, preflight, pins)
        picked = shard_manifest(shard, top, leaves, settings.limit) if shard is not None else None
        looked = look_manifest(look, top, leaves, settings.limit) if look is not None else None
        if settings.backend.local_device:
            settings.device = _resolve_device(settings.device)
            log(f"device: {settings.device}" + (" (auto)" if (device or suite.model["device"]) == "auto" else ""))
        else:
            log(f"backend: {settings.backend.name}" + (f" at {redact_url(str(settings.backend.args['base_url']))}"
                                                      if settings.backend.served else ""))
        tmp = Path(tempfile.mkdtemp(prefix=".gatekeeper-run-", dir=out_dir))
    try:
        with _quiet_output(log, t0):
            docs = shard_docs(picked) if picked is not None else (
                {t: _IndexList(d) for t, d in looked.pop("samples").items()} if looked is not None else None)
            produced, results, timing = _evaluate(suite, settings, task_manager, top, leaves, tmp, log, t0, docs,
                                                  reuse_model and settings.backend.local_device)
        _as_given(results, {str(local): model, _sanitize_model_name(str(local)): _sanitize_model_name(model)}
                  if local is not None else {})
        ended = _utc_now()
        manifest = RunManifest(
            model=model,
            model_path=str(local.resolve()) if local is not None else None,
            revision=revision,
            model_files=files or _hub_files(model, revision),
            lm_eval_version=lm_eval_version,
            torch_version=_version("torch"),
            transformers_version=_version("transformers"),
            dtype=settings.dtype,
            batch_size=settings.batch_size,
            device=settings.device,
            seeds=dict(suite.seeds),
            suite_name=suite.name,
            suite_hash=suite.hash,
            suite_path=str(suite.path),
            tasks=[t.portable() for t in suite.tasks],
            limit=settings.limit,
            hardware=hardware.describe(),
            start=started,
            end=ended,
            wall_seconds=round(time.perf_counter() - t0, 3),
            results_file=results.name,
            samples_files={t: p.name for t, p in _samples_files(produced, results).items()},
            files=run_file_digests(produced, [results, *_samples_files(produced, results).values()]),
            shard=picked,
            look=looked,
            groups=_group_aggregations(top),
            model_load_seconds=_LOADED.pop("seconds", None),
            request_seconds=timing.spent,
            task_requests=timing.tasks,
            backend=settings.backend.name,
            backend_versions=backends.versions(settings.backend.name),
            model_args=redact(backends.public_args(settings.backend.args)),
            cache=None if settings.cache is None else {"path": f"{settings.cache}_rank0.db"},
            task_files=plan.task_files,
            suite_hashed=suite.hashed,
            datasets=dict(sorted(pins.used.items())),
        )
        write_json_atomic(produced / MANIFEST_NAME, asdict(manifest))
        try:
            os.rename(produced, target)
        except OSError as exc:
            raise GateError(f"{target}: cannot move the finished run into place ({exc.strerror})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"run complete in {time.perf_counter() - t0:.1f}s: {target}")
    return target


# ----------------------------------------------------------------------------- dry run


@dataclass
class DryRun:
    """What ``gate --dry-run`` checked and would evaluate: no weights loaded, nothing written."""

    lm_eval_version: str
    backend: str
    device: str
    items: dict[str, int]  # leaf task -> documents it would evaluate
    prompts: dict[str, list[tuple[str, str]]]  # leaf task -> (context, continuation) as lm-eval builds them
    plan: RunPlan
    datasets: dict[str, str] = field(default_factory=dict)  # hub dataset -> the commit it would evaluate


def dry_run(suite: Suite, model: str, *, revision: str | None = None, device: str | None = None,
            log: Log = print, preflight: Callable[[RunPlan], Any] | None = None, examples: int = 3,
            lock: dict[str, str] | None = None) -> DryRun:
    """Every check ``run_suite`` makes before the model is loaded: lm-eval pin, backend, model
    path, task names, datasets (lm-eval builds every task, downloading what it needs), the
    suite's names, ``preflight`` (the baseline), the device; then ``examples`` rendered requests
    per task. Loads no weights and writes no run."""
    local = _before_sealing(suite, model)
    with sealed.sealed():
        return _dry_run(_absolute_suite(suite), str(local) if local is not None else model, revision=revision,
                        device=device, log=log, preflight=preflight, examples=examples,
                        pins=DatasetPins(dict(lock or {})))


def _dry_run(suite: Suite, model: str, *, revision: str | None, device: str | None, log: Log,
             preflight: Callable[[RunPlan], Any] | None, examples: int, pins: DatasetPins) -> DryRun:
    t0 = time.perf_counter()
    lm_eval_version = check_lm_eval(suite)
    settings = _settings(suite, model, revision, device, None, None, None)
    backends.check_available(settings.backend.name, str(suite.path))
    with _quiet_output(log, t0):
        _, _, leaves, plan = _built(suite, settings, preflight, pins)
        where = _resolve_device(settings.device) if settings.backend.local_device else settings.backend.name
        prompts = {name: _rendered(task, examples) for name, (task, _) in sorted(leaves.items())}
    items = {name: int(n["effective"]) for name, n in sorted(plan.n_samples.items())}
    return DryRun(lm_eval_version, settings.backend.name, where, items, prompts, plan, dict(sorted(pins.used.items())))


def _built(suite: Suite, settings: _Settings, preflight: Callable[[RunPlan], Any] | None, pins: DatasetPins
           ) -> tuple[Any, list[Any], dict[str, tuple[Any, Any]], RunPlan]:
    """lm-eval's tasks built (datasets read, hub ones at their pinned commits), the suite's names
    checked against them, then ``preflight``: (task manager, top-level tasks, leaves, plan)."""
    task_manager = _task_manager(suite, settings.model_args)
    with pinned(pins):
        top, leaves, groups = _load_tasks(suite, task_manager)
    plan = task_plan(leaves, groups, settings.limit)
    plan.task_files = task_files(suite, task_manager, leaves)
    names.check_suite(suite, plan.produced, what="the tasks lm-eval built")
    if preflight is not None:
        preflight(plan)
    return task_manager, top, leaves, plan


def _rendered(task: Any, examples: int) -> list[tuple[str, str]]:
    """The first ``examples`` documents' requests as lm-eval builds them (few-shot included)."""
    try:
        task.build_all_requests(limit=examples, rank=0, world_size=1)
    except Exception as exc:  # noqa: BLE001 - a template that does not render is the user's to see
        raise GateError(f"task {task.config.task}: its prompts do not render: {_one_line(exc)}") from None
    by_doc: dict[int, tuple[str, list[str]]] = {}
    for inst in task.instances:  # a multiple-choice document has one request per choice
        context = str(inst.args[0]) if inst.args else ""
        choices = by_doc.setdefault(inst.doc_id, (context, []))[1]
        if len(inst.args) > 1 and isinstance(inst.args[1], str):
            choices.append(inst.args[1].strip())
    task._instances = None  # lm-eval builds them again for a real run
    return [(context, " | ".join(choices)) for _, (context, choices) in sorted(by_doc.items())][:examples]


# ----------------------------------------------------------------------------- pre-flight checks


def check_lm_eval(suite: Suite) -> str:
    """The installed lm-eval version, which must equal the suite's pin."""
    if importlib.util.find_spec("lm_eval") is None:
        raise GateError("lm-eval is not installed; from a gatekeeper checkout: pip install -e '.[eval]' "
                        "(pins torch==2.13.0 and lm-eval[hf,api]==0.4.13; scripts/setup.sh eval does it with "
                        "the CPU build of torch)")
    installed = _version("lm_eval") or _version("lm-eval")
    if installed != suite.lm_eval_version:
        raise GateError(
            f"{suite.path}: suite pins lm_eval_version {suite.lm_eval_version!r} but lm-eval "
            f"{installed} is installed; results from different lm-eval versions are not comparable"
        )
    return installed


def check_model(model: str) -> Path | None:
    """A local checkpoint directory (returned) or a plausible hub id (None); else GateError."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise GateError(f"{model}: model directory has no config.json (expected a save_pretrained checkpoint)")
        return path
    if path.exists():
        raise GateError(f"{model}: is a file; --model takes a checkpoint directory or a hub id")
    # "checkpoints/next" is also the shape of a hub id: it is a path when its first folder is here
    # (a typo in the last part), so the user hears "not found" now, not a hub error a minute later.
    first = model.split("/", 1)[0]
    looks_like_path = (model.startswith((".", "/", "~")) or "\\" in model or model.count("/") > 1
                       or ("/" in model and Path(first).expanduser().is_dir()))
    if looks_like_path or not _HUB_ID.match(model) or ".." in model or "--" in model:
        where = "" if path.is_absolute() else f" under {Path.cwd()}"
        raise GateError(f"{model}: model path not found{where} (and not a Hugging Face model id)")
    return None


def check_output(out_dir: Path, target: Path) -> None:
    """Fail before any work when the run cannot be written."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GateError(f"{out_dir}: cannot create output directory ({exc.strerror})") from None
    if not out_dir.is_dir():
        raise GateError(f"{out_dir}: output path is not a directory")
    try:  # os.access lies for root and on some mounts; really create something
        probe = tempfile.NamedTemporaryFile(dir=out_dir, prefix=".gatekeeper-probe-")
        probe.close()
    except OSError as exc:
        raise GateError(f"{out_dir}: output directory is not writable ({exc.strerror})") from None
    if target.exists():
        raise GateError(
            f"{target}: already holds a run; choose a fresh --out or remove it (runs are never written over)"
        )


def _task_manager(suite: Suite, model_args: dict[str, Any]):
    # The CLI merges model_args into task metadata; do the same so configs match CLI output.
    where = {t.name: t.where or str(suite.path) for t in suite.tasks}
    return taskindex.task_manager(where, suite.include_path, suite.task_names, dict(model_args))


def _load_tasks(suite: Suite, tm) -> tuple[list[Any], dict[str, tuple[Any, Any]], dict[str, list[str]]]:
    """Top-level Task/Group objects for simple_evaluate, with the suite's per-task overrides
    applied to every leaf; also {leaf name: (task object, suite TaskSpec)} and
    {group: direct children} (what lm-eval writes as ``group_subtasks``)."""
    top: list[Any] = []
    leaves: dict[str, tuple[Any, Any]] = {}
    groups: dict[str, list[str]] = {}
    for spec in suite.tasks:
        try:
            with data_files_beside_yaml(tm, suite.include_path, _suite_datasets(suite)):
                loaded = tm.load([_with_dataset(tm, spec, suite) if spec.dataset is not None else spec.name])
        except GateError:
            raise
        except Exception as exc:  # noqa: BLE001 - lm-eval raises anything from YAML, datasets, jinja
            raise GateError(f"{suite.path}: task {spec.name!r} failed to load: {_one_line(exc)}") from None
        if spec.name in loaded["groups"]:
            top.append(loaded["groups"][spec.name])
        elif spec.name in loaded["tasks"]:
            top.append(loaded["tasks"][spec.name])
        else:  # a tag: its tasks
            top.extend(loaded["tasks"].values())
        for name, task in loaded["tasks"].items():
            if name in leaves:
                raise GateError(f"{suite.path}: task {name!r} is part of {spec.name!r} and of another suite task")
            _apply_overrides(task, spec)
            leaves[name] = (task, spec)
        groups.update({g: list(children) for g, children in (loaded.get("group_map") or {}).items()})
    return top, leaves, groups


def _suite_datasets(suite: Suite) -> dict[str, Path]:
    """{task: folder its ``dataset:`` data files are relative to} (the suite's folder)."""
    folder = Path(os.path.abspath(Path(suite.path).parent))
    return {t.name: folder for t in suite.tasks if t.dataset is not None}


def _with_dataset(tm: Any, spec: Any, suite: Suite) -> dict[str, Any]:
    """The task's own config (its YAML with includes and ``!function``s resolved, as lm-eval
    builds it) with the suite's ``dataset`` in place of the YAML's: lm-eval 0.4.13 takes such a
    dict as an inline task. Only a task, not a group or tag, has one dataset."""
    from lm_eval.tasks._yaml_loader import load_yaml

    entry = tm.task_index.get(spec.name)
    if entry is None or entry.yaml_path is None or entry.kind.name != "TASK":
        what = entry.kind.name.lower() if entry is not None else "unknown task"
        raise GateError(f"{suite.path}: tasks {spec.name}: dataset applies to one task defined by a YAML, and "
                        f"{spec.name!r} is a {what}; set it on each of its tasks")
    cfg = dict(load_yaml(entry.yaml_path, resolve_func=True))
    cfg.pop("custom_dataset", None)
    cfg.update(dataset_path=spec.dataset["path"], dataset_name=spec.dataset.get("name"),
               dataset_kwargs=dict(spec.dataset.get("kwargs") or {}))
    return cfg


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


def _settings(suite: Suite, model: str, revision: str | None, device: str | None,
              batch_size: Any, dtype: str | None, limit: Any) -> _Settings:
    m = suite.model
    dtype = dtype or m["dtype"]
    batch = _batch_size(batch_size if batch_size is not None else m["batch_size"])
    backend = backends.plan(m, model, dtype=dtype, revision=revision, where=str(suite.path))
    return _Settings(backend.args, dtype, batch, device or m["device"], _limit(limit),
                     bool(m["chat_template"]), backend)


# ----------------------------------------------------------------------------- request cache

CACHE_ENV = "GATEKEEPER_CACHE"
# model_args that do not change a response (transport, parallelism): left out of the cache key.
_CACHE_NEUTRAL = ("pretrained", "timeout", "max_retries", "num_concurrent", "auth_token", "header",
                  "verify_certificate", "ca_cert_path", "parallelize", "tensor_parallel_size",
                  "data_parallel_size", "gpu_memory_utilization", "max_batch_size")


def request_cache_path(cache_dir: Path, suite: Suite, s: _Settings, files: dict[str, str],
                       model: str) -> Path:
    """``<cache_dir>/<suite>-<key>``: the key is the sha256 of the model files' sha256s, the
    suite hash, the lm-eval version, the backend and the arguments that change a response
    (dtype, tokenizer, max_length, the endpoint's URL, ...). lm-eval's cache keys a request by
    its arguments only, so everything that can change the answer must be in the file name."""
    if not files:
        raise GateError(f"{model}: --cache needs a local checkpoint directory (its files' sha256 "
                        "key the cache); run without --cache for a hub id")
    if cache_dir.exists() and not cache_dir.is_dir():
        raise GateError(f"{cache_dir}: --cache is a file; give a directory")
    key = {
        "model_files": files,
        "suite_hash": suite.hash,
        "lm_eval": suite.lm_eval_version,
        "backend": s.backend.name,
        "model_args": {k: v for k, v in s.backend.args.items() if k not in _CACHE_NEUTRAL},
    }
    digest = cache.identity(key["model_files"], key["suite_hash"], key["lm_eval"], key["backend"], key["model_args"])
    s.cache_id = digest
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GateError(f"{cache_dir}: cannot create the cache directory ({exc.strerror})") from None
    return cache_dir / f"{suite.name}-{digest[:24]}"


def _batch_size(value: Any) -> int | str:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int) and value >= 1:
        return value
    if isinstance(value, str) and re.fullmatch(r"auto(:\d+)?", value):
        return value
    raise GateError(f"--batch-size: expected an integer >= 1 or 'auto', got {value!r}")


def _limit(value: Any) -> int | float | None:
    if value is None:
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise GateError(f"--limit: expected a number, got {value!r}") from None
    if f <= 0:
        raise GateError(f"--limit: must be > 0, got {value!r}")
    return f if f < 1 else int(f)


def _resolve_device(requested: str) -> str:
    import torch

    cuda = torch.cuda.is_available()
    if requested == "auto":
        return "cuda" if cuda else "cpu"
    if requested.startswith("cuda"):
        if not cuda:
            raise GateError(f"--device {requested}: CUDA is not available here (torch {torch.__version__})")
        index = int(requested.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise GateError(f"--device {requested}: only {torch.cuda.device_count()} CUDA device(s) here")
    return requested


# ----------------------------------------------------------------------------- evaluation


@dataclass
class _Timing:
    spent: dict[str, dict[str, float]]  # request phase -> {"requests", "seconds"}
    tasks: dict[str, dict[str, Any]]  # leaf task -> {"type", "items", "requests"}


def _evaluate(suite: Suite, s: _Settings, tm, top: list, leaves: dict, tmp: Path, log: Log,
              t0: float, docs: dict[str, list[int]] | None = None, reuse: bool = False) -> tuple[Path, Path, _Timing]:
    import lm_eval
    from lm_eval.evaluator_utils import get_sample_size
    from lm_eval.loggers import EvaluationTracker

    limit, samples = _limits(leaves, s.limit, get_sample_size) if docs is None else (None, docs)
    tracker = EvaluationTracker(output_path=str(tmp))
    seeds = suite.seeds
    caching = cache.safe_caching(s.cache_id, s.cache_key) if s.cache is not None else contextlib.nullcontext()
    try:
        with (evaluation_env(s.backend.name), caching, _known_noise(), _progress(s.backend.name, log, t0) as timed,
              _empty_answers() as empty, _reused_model(s) if reuse else contextlib.nullcontext(), once_per_process()):
            results = lm_eval.simple_evaluate(
                model=s.backend.name,
                model_args=dict(s.model_args),
                tasks=top,
                num_fewshot=None,  # per task, already set on the task objects
                batch_size=s.batch_size,
                device=s.device if s.backend.local_device else None,  # vLLM, servers: their own
                limit=limit,
                samples=samples,
                log_samples=True,
                evaluation_tracker=tracker,
                apply_chat_template=s.chat_template,
                fewshot_as_multiturn=True if s.chat_template else None,
                task_manager=tm,
                random_seed=seeds["random"],
                numpy_random_seed=seeds["numpy"],
                torch_random_seed=seeds["torch"],
                fewshot_random_seed=seeds["fewshot"],
                use_cache=None if s.cache is None else str(s.cache),
            )
    except GateError:
        raise
    except Exception as exc:  # noqa: BLE001 - surface lm-eval / model failures as one line
        raise GateError(f"lm-eval failed while evaluating {s.model_args['pretrained']}: "
                        f"{redact_url(_one_line(exc))}") from None
    if results is None:
        raise GateError("lm-eval returned no results (not rank 0?)")
    if empty.count:
        raise GateError(f"{redact_url(str(s.backend.args.get('base_url', s.backend.name)))}: the endpoint answered {empty.count} "
                        "request(s) with null content, which lm-eval scores as empty text; no verdict on "
                        "partial answers: check the server's logs and generation limits, then re-run")
    samples_out = results.pop("samples")
    timing = _Timing(timed.spent, _task_requests(results, samples_out))
    # Exactly what lm_eval/_cli/run.py does after simple_evaluate.
    tracker.save_results_aggregated(results=results, samples=samples_out)
    for task_name in results["configs"]:
        tracker.save_results_samples(task_name=task_name, samples=samples_out[task_name])
    produced = tmp / str(tracker.general_config_tracker.model_name_sanitized)
    results_file = _verify_output(produced, results)
    _redact_results(results_file)
    for task in sorted(results["configs"]):
        n = results.get("n-samples", {}).get(task, {})
        log(f"[{time.perf_counter() - t0:7.1f}s] {task}: {n.get('effective', '?')}/{n.get('original', '?')} items done")
    return produced, results_file, timing


def _task_requests(results: dict[str, Any], samples: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per leaf task: its items, the request type they were sent as, and how many requests (lm-eval
    logs an item once per filter; its requests were sent once)."""
    out = {}
    for task, rows in samples.items():
        kind = str((results.get("configs", {}).get(task) or {}).get("output_type", ""))
        phase = "loglikelihood" if kind == "multiple_choice" else kind
        per_doc = {r.get("doc_id"): len(r.get("arguments") or ()) for r in rows}
        out[task] = {"type": phase, "items": len(per_doc), "requests": sum(per_doc.values())}
    return out


# The model a sequential gate's looks share (``run_suite(reuse_model=True)``): one entry, keyed by
# everything lm-eval builds it from, so a look never gets a model loaded with other arguments.
_MODELS: dict[str, Any] = {}
_LOADED: dict[str, float] = {}  # the last reused run's model loading time, for its manifest


@contextlib.contextmanager
def _reused_model(s: _Settings) -> Iterator[None]:
    """lm-eval builds the model from its name and arguments (``create_from_arg_obj``) on every
    ``simple_evaluate``; this hands back the one built by the previous look instead. The model
    name and arguments lm-eval records (results.json ``config``) are unchanged: the same call."""
    from lm_eval.api import registry

    cls = registry.get_model(s.backend.name)
    key = json.dumps([s.backend.name, s.model_args, str(s.batch_size), str(s.device)], sort_keys=True, default=str)
    own = cls.__dict__.get("create_from_arg_obj")
    real = cls.create_from_arg_obj

    def create(arg_dict: dict[str, Any], additional_config: dict[str, Any] | None = None) -> Any:
        started = time.perf_counter()
        if key not in _MODELS:
            release_models()
            _MODELS[key] = real(arg_dict, additional_config)
        _LOADED["seconds"] = round(time.perf_counter() - started, 3)
        return _MODELS[key]

    cls.create_from_arg_obj = create
    try:
        yield
    finally:
        if own is not None:
            cls.create_from_arg_obj = own
        else:
            del cls.create_from_arg_obj


def release_models() -> None:
    """Free the model kept by ``reuse_model`` runs."""
    _MODELS.clear()
    gc.collect()


def _limits(leaves: dict, cli_limit: Any, get_sample_size: Callable) -> tuple[Any, dict | None]:
    """lm-eval has one global ``limit``; per-task limits go through ``samples`` (first N docs)."""
    if cli_limit is not None:
        return cli_limit, None
    per_task = {name: spec.limit for name, (_, spec) in leaves.items()}
    distinct = set(per_task.values())
    if len(distinct) == 1:
        return distinct.pop(), None
    samples = {}
    for name, lim in per_task.items():
        if lim is None:
            continue
        task = leaves[name][0]
        n = min(get_sample_size(task, lim), len(task.eval_docs))
        samples[name] = list(range(n))
    return None, samples


# ----------------------------------------------------------------------------- shards (run --shard K/N)


def shard_manifest(shard: Shard, top: list, leaves: dict, cli_limit: Any) -> dict[str, Any]:
    """Which documents shard K/N evaluates, and what ``gatekeeper merge`` needs to rebuild the
    whole run: the per-task item counts, the ``limit`` the unsharded run would hand lm-eval, and
    each group's aggregation (results.json does not record it). Also makes few-shot prompts
    identical to the unsharded run's (``_replay_fewshot``)."""
    from lm_eval.evaluator_utils import get_sample_size

    sizes = {}
    for name, (task, spec) in leaves.items():
        original = len(task.eval_docs)
        lim = cli_limit if cli_limit is not None else spec.limit
        sizes[name] = original if lim is None else min(get_sample_size(task, lim), original)
    ranges = selection(sizes, shard)
    for name, (first, end) in ranges.items():
        _replay_fewshot(leaves[name][0], range(first, end))
    return {
        "index": shard.index,
        "count": shard.count,
        "docs": {name: list(r) for name, r in sorted(ranges.items())},
        "items": dict(sorted(sizes.items())),
        "limit": _limits(leaves, cli_limit, get_sample_size)[0],
        "groups": _group_aggregations(top),
    }


def look_manifest(look: Look, top: list, leaves: dict, cli_limit: Any) -> dict[str, Any]:
    """Which documents look K of a sequential gate evaluates (``run/looks.py``), with few-shot
    prompts made identical to a whole run's (``_replay_fewshot``). ``samples`` (lm-eval's
    argument) is popped by the caller; ``docs`` (the new documents per task) stays in the manifest,
    with what ``run --complete`` needs to join the looks into the whole run (as a shard's)."""
    from lm_eval.evaluator_utils import get_sample_size

    sizes = {}
    for name, (task, spec) in leaves.items():
        original = len(task.eval_docs)
        lim = cli_limit if cli_limit is not None else spec.limit
        sizes[name] = original if lim is None else min(get_sample_size(task, lim), original)
    lm_samples, new = looks.samples(sizes, look)
    for name, docs in lm_samples.items():
        _replay_fewshot(leaves[name][0], docs)
    unknown = sorted(look.done - set(sizes))
    if unknown:
        raise GateError(f"--done {','.join(unknown)}: not a task of this suite (tasks: {', '.join(sorted(sizes))})")
    return {"index": look.index, "count": look.count, "seed": look.seed, "done": sorted(look.done),
            "part": list(look.part) if look.part else None, "rest": look.is_rest, "docs": new, "items": dict(sorted(sizes.items())),
            "limit": _limits(leaves, cli_limit, get_sample_size)[0], "groups": _group_aggregations(top),
            "samples": lm_samples}


def _replay_fewshot(task: Any, docs: Sequence[int]) -> None:
    """lm-eval draws few-shot examples from one seeded RNG, document after document, so the
    examples for document i depend on the documents before it. For a selection of documents (a
    shard's range, a look's sorted sample), the prompts of the unselected documents before each
    selected one are built (and thrown away) first, so its prompts, and their prompt_hash, equal
    a whole run's. lm-eval 0.4.13 builds one context per selected document, in order (a shard's
    range replays only before its first); a wrong replay changes the prompt hashes, which the
    comparison with the baseline refuses (fail closed)."""
    if not task.get_config("num_fewshot") or not docs:
        return
    real = task.fewshot_context
    calls = [0]

    def fewshot_context(doc: Any, *args: Any, **kwargs: Any) -> Any:
        j = calls[0]
        calls[0] += 1
        if j < len(docs):
            start = docs[j - 1] + 1 if j else 0
            all_docs = task.eval_docs
            for i in range(start, docs[j]):
                kw = dict(kwargs)
                if "gen_prefix" in kw:  # the prefix belongs to the document
                    kw["gen_prefix"] = task.doc_to_prefix(all_docs[i])
                real(all_docs[i], *args, **kw)
        return real(doc, *args, **kwargs)

    task.fewshot_context = fewshot_context


def shard_docs(picked: dict[str, Any]) -> dict[str, list[int]]:
    """lm-eval's ``samples`` argument for a shard: sorted document indices per task (lm-eval
    labels the i-th selected document with ``samples[task][i]``, so they must be sorted)."""
    return {name: _IndexList(range(first, end)) for name, (first, end) in picked["docs"].items()}


class _IndexList(list):
    """A list whose ``in`` is a set lookup: lm-eval 0.4.13 tests ``i in samples`` for every
    document of the task, which is quadratic on a plain list of 12k indices."""

    def __init__(self, items: Any) -> None:
        super().__init__(items)
        self._set = frozenset(self)

    def __contains__(self, item: object) -> bool:
        return item in self._set


def _group_aggregations(top: list) -> dict[str, Any]:
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


def _verify_output(produced: Path, results: dict) -> Path:
    """lm-eval logs a warning and carries on when it cannot write; we do not."""
    found = sorted(produced.glob("results_*.json")) if produced.is_dir() else []
    if len(found) != 1:
        raise GateError(f"{produced}: lm-eval wrote {len(found)} results file(s), expected 1")
    try:
        data = json.loads(found[0].read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise GateError(f"{found[0]}: lm-eval wrote an unreadable results file ({exc})") from None
    if not isinstance(data, dict) or "results" not in data:
        raise GateError(f"{found[0]}: lm-eval wrote a results file without 'results'")
    files = _samples_files(produced, found[0])
    for task in results["configs"]:
        path = files.get(task)
        if path is None:
            raise GateError(f"{produced}: lm-eval wrote no samples file for task {task!r}")
        try:
            with path.open(encoding="utf-8") as fh:
                n = sum(1 for line in fh if json.loads(line) is not None)
        except (OSError, ValueError) as exc:
            raise GateError(f"{path}: lm-eval wrote an unreadable samples file ({exc})") from None
        if n == 0:
            raise GateError(f"{path}: lm-eval wrote an empty samples file")
    return found[0]


def _samples_files(produced: Path, results_file: Path) -> dict[str, Path]:
    stamp = results_file.name[len("results_"):-len(".json")]
    out = {}
    for p in produced.glob(f"samples_*_{stamp}.jsonl"):
        out[p.name[len("samples_"):-len(f"_{stamp}.jsonl")]] = p
    return out


# transformers warns once per process when input_ids contain the pad token and no attention
# mask is passed. lm-eval's HF backend pads loglikelihood batches on the right and reads the
# logits of the real tokens only, which a causal model computes without looking right: the
# warning says nothing about the scores, on every run. Generation passes a mask.
_ATTENTION_MASK_WARNING = "We strongly recommend passing in an `attention_mask`"


class _DropMessage(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self._prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self._prefix)


@contextlib.contextmanager
def _known_noise() -> Iterator[None]:
    """Silence the two lines every evaluation printed that say nothing about it: transformers'
    attention-mask warning (above) and git's "fatal: not a git repository" (lm-eval runs
    ``git describe`` with our stderr when it records its own commit). Nothing else is hidden:
    lm-eval's and transformers' other warnings and errors pass as before."""
    import lm_eval.evaluator as evaluator

    mask_log = logging.getLogger("transformers.modeling_utils")
    drop = _DropMessage(_ATTENTION_MASK_WARNING)
    mask_log.addFilter(drop)
    saved = evaluator.get_git_commit_hash
    evaluator.get_git_commit_hash = _git_commit_hash
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = saved
        mask_log.removeFilter(drop)


def _git_commit_hash() -> str | None:
    """lm_eval.loggers.utils.get_git_commit_hash with git's stderr captured, same result."""
    from lm_eval.loggers.utils import get_commit_from_path

    try:
        out = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True,  # noqa: S607
                             timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        out = None
    if out is not None and out.returncode == 0:
        return out.stdout.strip()
    return get_commit_from_path(os.getcwd())


class _CountEmpty(logging.Filter):
    """Counts lm-eval's "API returned null content" warnings (an answer replaced by "")."""

    count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if "API returned null content" in str(record.msg):
            self.count += 1
        return True


@contextlib.contextmanager
def _empty_answers() -> Iterator[_CountEmpty]:
    counter = _CountEmpty()
    logger = logging.getLogger("lm_eval.models.api_models")
    logger.addFilter(counter)
    try:
        yield counter
    finally:
        logger.removeFilter(counter)


@contextlib.contextmanager
def _progress(backend: str, log: Log, t0: float) -> Iterator[progress_lines.Progress]:
    """Rate-limited progress lines (progress.py) unless stderr is a terminal (lm-eval's bars);
    either way the phases' requests and seconds are counted (``Progress.spent``)."""
    from lm_eval.api.registry import get_model

    quiet = sys.stderr.isatty()
    reporter = progress_lines.Progress((lambda _line: None) if quiet else log, t0,
                                       math.inf if quiet else progress_lines.interval_from_env())
    with progress_lines.track(get_model(backend), reporter):
        yield reporter


# Warnings lm-eval gives for every task of a kind, that say nothing about this run.
_NOISE = ("Custom kwargs can be passed", "SHOULD ONLY BE USED FOR TESTING")


class _ProgressHandler(logging.Handler):
    """Turns lm-eval's INFO chatter into short progress lines; passes warnings through."""

    def __init__(self, log: Log, t0: float) -> None:
        super().__init__(logging.INFO)
        self._log, self._t0 = log, t0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a logging bug must not kill the run
            return
        at = f"[{time.perf_counter() - self._t0:7.1f}s]"
        if m := re.match(r"Building contexts for (\S+)", msg):
            self._log(f"{at} {m.group(1)}: building prompts")
        elif m := re.match(r"Running (\S+) requests", msg):
            self._log(f"{at} running {m.group(1)} requests")
        elif m := re.match(r"Cached requests: (\d+), Requests remaining: (\d+)", msg):
            self._log(f"{at} request cache: {m.group(1)} answered from the cache, {m.group(2)} to run")
        elif record.levelno >= logging.WARNING and not any(n in msg for n in _NOISE):
            self._log(f"{at} lm-eval {record.levelname.lower()}: {msg.splitlines()[0] if msg else ''}")


class _NoBars(io.TextIOBase):
    """stderr without tqdm bars: lm-eval passes ``disable=False`` explicitly, so TQDM_DISABLE
    cannot turn its bars off, and in a CI log every refresh is a new line."""

    def __init__(self, inner: Any) -> None:
        self._inner, self._dropped = inner, False

    def write(self, text: str) -> int:
        if text.startswith("\r") or (self._dropped and text == "\n"):
            self._dropped = text.startswith("\r")
            return len(text)
        self._dropped = False
        return self._inner.write(text)

    def flush(self) -> None:
        self._inner.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._inner.fileno()


@contextlib.contextmanager
def _quiet_output(log: Log, t0: float) -> Iterator[None]:
    """lm-eval's log lines → short progress lines; no progress bars outside a terminal."""
    logger = logging.getLogger("lm_eval")
    handler = _ProgressHandler(log, t0)
    saved = (logger.level, logger.propagate)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logger.addHandler(handler)
    stderr = sys.stderr
    if not stderr.isatty():
        sys.stderr = _NoBars(stderr)
    try:
        yield
    finally:
        sys.stderr = stderr
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


# ----------------------------------------------------------------------------- manifest helpers


def hash_model_files(folder: Path) -> dict[str, str]:
    """{path relative to the checkpoint: sha256} of every file of the checkpoint folder: weights,
    shard index, tokenizer, configs, remote code, adapters. Everything that can change an answer
    is in the manifest and in the request cache's identity (a checkpoint that differs only in
    ``model.safetensors.index.json`` answers differently)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if name.startswith(".") or not path.is_file():
                continue
            out[path.relative_to(folder).as_posix()] = sha256_file(path)
    if not any(name.endswith(WEIGHT_SUFFIXES) for name in out):
        raise GateError(f"{folder}: no weight files (*.safetensors, *.bin, *.pt, *.gguf) in the model directory")
    return out


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


def _as_given(results_file: Path, given: dict[str, str]) -> None:
    """lm-eval was handed the checkpoint's absolute path (the sealed folder is elsewhere); its
    results.json names the model as the user gave it, as if it had run in the user's folder."""
    if not given:
        return
    data = json.loads(results_file.read_text(encoding="utf-8"))

    def swap(value: Any) -> Any:
        if isinstance(value, str):
            return given.get(value, value)
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        if isinstance(value, list):
            return [swap(v) for v in value]
        return value

    clean = swap(data)
    if clean != data:
        write_json_atomic(results_file, clean)


def _redact_results(results_file: Path) -> None:
    """Rewrite lm-eval's results.json without credentials (``auth_token``, a ``base_url``'s
    ``?api-key=``): lm-eval writes the model arguments into its config and into every task's
    metadata, and this file is kept, copied into baselines and uploaded as an artifact."""
    data = json.loads(results_file.read_text(encoding="utf-8"))
    clean = redact(data)
    if clean != data:
        write_json_atomic(results_file, clean)


def sha256_file(path: Path) -> str:
    try:
        return layout.sha256_file(path)
    except OSError as exc:
        raise GateError(f"{path}: cannot read model file ({exc.strerror})") from None


def run_file_digests(folder: Path, paths: Sequence[Path]) -> dict[str, str]:
    """{name: sha256} of a run's results and samples files (the manifest's ``files``)."""
    return {p.name: layout.sha256_file(folder / p.name) for p in sorted(paths)}


def _hub_files(model: str, revision: str | None) -> dict[str, str]:
    """Hashes of a hub model's files from the local HF cache, when lm-eval just loaded them."""
    try:
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(model, revision=revision, local_files_only=True))
        return hash_model_files(folder)
    except Exception:  # noqa: BLE001 - provenance is best effort for hub ids
        return {}


def _sanitize_model_name(model: str) -> str:
    # lm_eval.utils.sanitize_model_name, which EvaluationTracker uses for the run folder.
    return re.sub(r"[\"<>:/|\\?*\[\]]+", "__", model)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
