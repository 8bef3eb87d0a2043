"""``gatekeeper run``: the pinned suite through lm-eval 0.4.13's Python API, plus a manifest.

Why the Python API and not the ``lm_eval`` CLI:
- ``TaskManager(include_path, include_defaults=False)`` skips indexing lm-eval's ~14k bundled
  tasks (about 4 s per run) when every suite task lives in the suite's include_path;
- per-task ``num_fewshot`` / ``repeats`` / ``gen_kwargs`` / ``limit`` (the CLI has one global value);
- every check that can fail (lm-eval version, model path, task names, output dir) runs before
  the model is loaded, so a typo costs seconds, not GPU time.

Every evaluation enters here (``run_suite``, ``dry_run``) and runs sealed (``run/sealed.py``): in
a fresh empty folder, with the suite's and the model's paths made absolute first, hub datasets at
their locked commits (``run/pins.py``). The parts it uses each have one home: ``tasks.py`` (lm-eval's
tasks built and described), ``selection.py`` (a shard's or look's documents), ``quiet.py`` (lm-eval's
output), ``manifest.py`` (what the run records).

Output is written with lm-eval's own ``EvaluationTracker``, exactly as the CLI writes it
(``<out>/<model_name_sanitized>/results_<ts>.json`` + one ``samples_<task>_<ts>.jsonl`` per leaf
task), plus ``gatekeeper-manifest.json``. The run is assembled in a temp dir inside ``<out>`` and
renamed into place at the end: a failed run leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gatekeeper.errors import GateError
from gatekeeper.files import write_json_atomic
from gatekeeper.results.layout import MANIFEST_NAME, WARNINGS_LOG
from gatekeeper.run import backends, cache, hardware, sealed
from gatekeeper.run.backends import BackendPlan
from gatekeeper.run.environment import evaluation_env
from gatekeeper.run.looks import Look
from gatekeeper.run.manifest import (
    RunManifest,
    hash_model_files,
    hub_files,
    model_arg_files,
    run_file_digests,
    tokenizer_files,
    utc_now,
    version,
)
from gatekeeper.run.modelref import absolute_model_paths, check_model, check_model_settings
from gatekeeper.run.once import once_per_process
from gatekeeper.run.pins import DatasetPins, pinned
from gatekeeper.run.quiet import Warnings, empty_answers, known_noise, progress, quiet_output
from gatekeeper.run.selection import IndexList, limits, look_manifest, shard_docs, shard_manifest
from gatekeeper.run.shard import Shard
from gatekeeper.run.tasks import (
    group_aggregations,
    item_hashes,
    load_tasks,
    rendered,
    task_files,
    task_manager,
    task_plan,
)
from gatekeeper.suite import names
from gatekeeper.suite.names import RunPlan
from gatekeeper.suite.suite import Suite
from gatekeeper.text import one_line, redact, redact_url

Log = Callable[[str], Any]


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
    items_check: ItemsCheck | None = None,
) -> Path:
    """Run ``suite`` on ``model``; returns the run directory (results, samples, manifest).

    ``cache_dir`` (else ``$GATEKEEPER_CACHE``; default off) keeps lm-eval's request cache, keyed
    by the model files, the suite hash and the backend arguments: a killed run resumes there.

    Once lm-eval has built the tasks, and before it evaluates anything, every name in the
    suite must match a metric/filter/task the tasks produce (``names.check_suite``), and
    ``preflight(plan)`` may refuse the run (``gate`` checks the baseline there), and
    ``items_check`` the documents and targets built now, by their hashes (``built_hashes``):
    a baseline whose items changed is refused before any model loads, not after the whole run.
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
    local = _before_sealing(suite, model, revision)
    try:
        with sealed.sealed():
            target = _run(_absolute_suite(suite), model, local, where, revision=revision, device=device,
                          batch_size=batch_size, dtype=dtype, limit=limit, log=log, preflight=preflight,
                          shard=shard, cache_dir=None if cache_dir is None else sealed.absolute(cache_dir),
                          look=look, reuse_model=reuse_model, pins=DatasetPins(dict(lock or {}), new_data),
                          items_check=items_check)
    except BaseException:
        if fresh and where.is_dir() and not any(where.iterdir()):
            where.rmdir()  # we made it; a failed run leaves nothing behind
        raise
    return out_dir / target.name


def _before_sealing(suite: Suite, model: str, revision: str | None) -> Path | None:
    """What must be read in the user's working folder: the model's path (the checkpoint, the one
    thing a pull request may bring; a hub id is looked up now, not after lm-eval has loaded), and
    no Hugging Face cache inside the repository."""
    sealed.check_caches(sealed.repositories(Path(suite.path).parent))
    hub = str(suite.model.get("backend") or backends.HF) in (backends.HF, backends.VLLM)
    check_model_settings(suite.model, Path(suite.path), hub=hub)
    local = check_model(model, hub=hub, revision=revision, suite_dir=Path(suite.path).parent)
    return None if local is None else sealed.absolute(local)


def _absolute_suite(suite: Suite) -> Suite:
    """The suite with its paths absolute: inside the sealed folder a relative one means nothing."""
    path = sealed.absolute(suite.path)
    return dataclasses.replace(
        suite, path=path, baseline_path=sealed.absolute(suite.baseline_path),
        include_path=None if suite.include_path is None else sealed.absolute(suite.include_path),
        model=absolute_model_paths(suite.model, path.parent))


def _run(suite: Suite, model: str, local: Path | None, out_dir: Path, *, revision: str | None,
         device: str | None, batch_size: Any, dtype: str | None, limit: Any, log: Log,
         preflight: Callable[[RunPlan], Any] | None, shard: Shard | None = None,
         cache_dir: Path | str | None = None, look: Look | None = None, reuse_model: bool = False,
         pins: DatasetPins | None = None, items_check: ItemsCheck | None = None) -> Path:
    """The run, inside the sealed folder: every path here is absolute; ``model`` is the name the
    user gave (recorded), ``local`` its checkpoint folder (what lm-eval loads), None for a hub id.
    A local model needs no network, and gatekeeper never switches it off: a bundled task's
    dataset comes from the hub (or from the HF cache where the user set HF_DATASETS_OFFLINE)."""
    started, t0 = utc_now(), time.perf_counter()
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
    warned = Warnings()
    with quiet_output(log, t0, warned):
        tm, top, leaves, plan = _built(suite, settings, preflight, pins)
        if items_check is not None:
            items_check(built_hashes(leaves, plan))
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
        with quiet_output(log, t0, warned):
            docs = shard_docs(picked) if picked is not None else (
                {t: IndexList(d) for t, d in looked.pop("samples").items()} if looked is not None else None)
            produced, results, timing = _evaluate(suite, settings, tm, top, leaves, tmp, log, t0, docs,
                                                  reuse_model and settings.backend.local_device)
        _as_given(results, {str(local): model, _sanitize_model_name(str(local)): _sanitize_model_name(model)}
                  if local is not None else {})
        for line in warned.summary():
            log(line)
        if warned.lines:  # every warning in full, beside the results (the log showed each kind once)
            (produced / WARNINGS_LOG).write_text(warned.text(), encoding="utf-8")
        ended = utc_now()
        manifest = RunManifest(
            model=model,
            model_path=str(local.resolve()) if local is not None else None,
            revision=revision,
            model_files=files or hub_files(model, revision),
            lm_eval_version=lm_eval_version,
            torch_version=version("torch"),
            transformers_version=version("transformers"),
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
            groups=group_aggregations(top),
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
            tokenizer_files=tokenizer_files(_tokenizer(settings)),
            model_arg_files=model_arg_files(suite.model),
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
    # leaf task -> (context, continuations, target) as lm-eval builds them; a sample of the tasks
    # when there are many (``preview_tasks``)
    prompts: dict[str, list[tuple[str, str, str]]]
    plan: RunPlan
    datasets: dict[str, str] = field(default_factory=dict)  # hub dataset -> the commit it would evaluate
    # leaf task -> (doc_hash, target_hash) of each of its documents, as lm-eval logs them (``built_hashes``)
    hashes: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    # group -> its leaves and aggregation, as lm-eval will aggregate it (``tasks.group_aggregations``)
    groups: dict[str, Any] = field(default_factory=dict)


def dry_run(suite: Suite, model: str, *, revision: str | None = None, device: str | None = None,
            log: Log = print, preflight: Callable[[RunPlan], Any] | None = None, examples: int = 3,
            lock: dict[str, str] | None = None) -> DryRun:
    """Every check ``run_suite`` makes before the model is loaded: lm-eval pin, backend, model
    path, task names, datasets (lm-eval builds every task, downloading what it needs), the
    suite's names, ``preflight`` (the baseline), the device; then ``examples`` rendered requests
    per task. Loads no weights and writes no run."""
    local = _before_sealing(suite, model, revision)
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
    with quiet_output(log, t0):
        _, top, leaves, plan = _built(suite, settings, preflight, pins)
        where = _resolve_device(settings.device) if settings.backend.local_device else settings.backend.name
        prompts = {name: rendered(leaves[name][0], examples) for name in preview_tasks(sorted(leaves))}
    items = {name: int(n["effective"]) for name, n in sorted(plan.n_samples.items())}
    hashes = built_hashes(leaves, plan)
    return DryRun(lm_eval_version, settings.backend.name, where, items, prompts, plan, dict(sorted(pins.used.items())),
                  hashes, group_aggregations(top))


ItemsCheck = Callable[[dict[str, list[tuple[str, str]]]], Any]


def built_hashes(leaves: dict[str, tuple[Any, Any]], plan: RunPlan) -> dict[str, list[tuple[str, str]]]:
    """Leaf task -> (doc_hash, target_hash) of each of its documents, as lm-eval will log them,
    from the built tasks alone (no model). Every document, whatever a --limit, shard or look will
    evaluate of them: the check is of the dataset the baseline was measured on."""
    with once_per_process():  # each target template compiled once, not once a document
        return {name: item_hashes(task, int(plan.n_samples[name]["original"]))
                for name, (task, _) in sorted(leaves.items())}


PREVIEW_TASKS = 8  # MMLU's 57 subjects at 5 shots: 171 previews that all begin alike


def preview_tasks(names: list[str], limit: int = PREVIEW_TASKS) -> list[str]:
    """The tasks a dry run shows prompts of: all, or ``limit`` spread evenly over the sorted names."""
    if len(names) <= limit:
        return names
    step = len(names) / limit
    return [names[int(i * step)] for i in range(limit)]


def _built(suite: Suite, settings: _Settings, preflight: Callable[[RunPlan], Any] | None, pins: DatasetPins
           ) -> tuple[Any, list[Any], dict[str, tuple[Any, Any]], RunPlan]:
    """lm-eval's tasks built (datasets read, hub ones at their pinned commits), the suite's names
    checked against them, then ``preflight``: (task manager, top-level tasks, leaves, plan)."""
    tm = task_manager(suite, settings.model_args)
    with pinned(pins):
        top, leaves, groups = load_tasks(suite, tm)
    plan = task_plan(leaves, groups, settings.limit)
    plan.task_files = task_files(suite, tm, leaves)
    names.check_suite(suite, plan.produced, what="the tasks lm-eval built")
    if preflight is not None:
        preflight(plan)
    return tm, top, leaves, plan



# ----------------------------------------------------------------------------- pre-flight checks


def check_lm_eval(suite: Suite) -> str:
    """The installed lm-eval version, which must equal the suite's pin."""
    if importlib.util.find_spec("lm_eval") is None:
        raise GateError("lm-eval is not installed; from a gatekeeper checkout: pip install -e '.[eval]' "
                        "(pins torch==2.13.0 and lm-eval[hf,api]==0.4.13; scripts/setup.sh eval does it with "
                        "the CPU build of torch)")
    installed = version("lm_eval") or version("lm-eval")
    if installed != suite.lm_eval_version:
        raise GateError(
            f"{suite.path}: suite pins lm_eval_version {suite.lm_eval_version!r} but lm-eval "
            f"{installed} is installed; results from different lm-eval versions are not comparable"
        )
    return installed


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

    limit, samples = limits(leaves, s.limit, get_sample_size) if docs is None else (None, docs)
    tracker = EvaluationTracker(output_path=str(tmp))
    seeds = suite.seeds
    caching = cache.safe_caching(s.cache_id, s.cache_key) if s.cache is not None else contextlib.nullcontext()
    try:
        with (evaluation_env(s.backend.name), caching, known_noise(), progress(s.backend.name, log, t0) as timed,
              empty_answers() as empty, _reused_model(s) if reuse else contextlib.nullcontext(), once_per_process()):
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
                        f"{redact_url(one_line(exc))}") from None
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



# ----------------------------------------------------------------------------- shards (run --shard K/N)








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













# ----------------------------------------------------------------------------- manifest helpers




def _tokenizer(s: _Settings) -> str | None:
    """The tokenizer the suite names apart from the model (hf and vLLM backends), if any."""
    value = None if s.backend.served else s.backend.args.get("tokenizer")
    return value if isinstance(value, str) and value else None


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





def _sanitize_model_name(model: str) -> str:
    # lm_eval.utils.sanitize_model_name, which EvaluationTracker uses for the run folder.
    return re.sub(r"[\"<>:/|\\?*\[\]]+", "__", model)
