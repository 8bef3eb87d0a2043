"""Work lm-eval 0.4.13 redoes on every evaluation although its result cannot change, done once.

- ``add_env_info``: the environment report in results.json (torch's ``collect_env``, which starts
  ``pip list``, ``lscpu``, ``nvidia-smi`` and more: about 0.6 s and as much CPU an evaluation on a
  CPU machine). Kept per process and the folder above the working one (the report names its git
  commit): every evaluation works in a fresh sealed folder (run/sealed.py), all of them in the same
  temporary folder. torch's part is also kept on disk (``~/.cache/gatekeeper/env-report-*.json``)
  for the processes that come after, as long as nothing it describes can have changed: the same
  boot of the machine (hardware, driver, kernel), interpreter, installed packages (the mtimes of
  the folders they are installed in) and the variables and ``PATH`` it reads.
- ``apply_template``: lm-eval compiles a prompt's Jinja template again for every document and
  every field (``doc_to_text``, ``doc_to_target``, ``doc_to_choice``); compiling is most of what
  building a prompt costs. Compiled once per template text, with lm-eval's own environment.

Both hand back exactly what lm-eval's own functions do; only the repeats go. A sequential gate's
looks and ``plan --mutants`` evaluate up to 24 times in one process; any real suite has thousands
of documents a template.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import os
import site
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gatekeeper.files import cache_dir, cached_json

_ENV_INFO: dict[str, dict[str, Any]] = {}  # the working directory's parent -> what add_env_info adds
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
# What torch's collect_env reads besides the machine and the installed packages: the tools it
# starts (found on PATH: nvidia-smi, gcc, lscpu, conda, ...) and the variables it reports.
_ENV_REPORT_VARS = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH")
_ENV_REPORT_PREFIXES = ("CUDA_", "PYTORCH_", "NVIDIA_", "HIP_", "ROCM_", "CONDA_", "TORCH_")


@contextlib.contextmanager
def once_per_process() -> Iterator[None]:
    """While lm-eval evaluates: its environment report and compiled templates, reused."""
    import lm_eval.evaluator as evaluator
    from lm_eval import utils

    add_env_info, apply_template = evaluator.add_env_info, utils.apply_template
    compiled = functools.lru_cache(maxsize=4096)(utils.env.from_string)

    def env_info_once(storage: dict[str, Any]) -> None:
        folder = os.path.dirname(os.getcwd())
        if folder not in _ENV_INFO:
            report: dict[str, Any] = {}
            with _torch_report_kept():
                add_env_info(report)
            _ENV_INFO[folder] = report
        storage.update(copy.deepcopy(_ENV_INFO[folder]))

    def template_once(template: str, doc: dict) -> str:
        return compiled(template).render(**doc)

    evaluator.add_env_info, utils.apply_template = env_info_once, template_once
    try:
        yield
    finally:
        evaluator.add_env_info, utils.apply_template = add_env_info, apply_template


@contextlib.contextmanager
def _torch_report_kept() -> Iterator[None]:
    """While lm-eval's add_env_info runs: torch's report read from disk where this environment
    made one before (it imports the function by name at each call)."""
    try:
        from torch.utils import collect_env
    except ImportError:
        yield  # lm-eval reports "torch not installed" itself
        return
    own = collect_env.get_pretty_env_info
    collect_env.get_pretty_env_info = functools.partial(kept_env_report, own)
    try:
        yield
    finally:
        collect_env.get_pretty_env_info = own


def kept_env_report(compute: Callable[[], str]) -> str:
    """``compute()``'s report, from the cache where this machine's boot, interpreter, packages and
    variables made it before; else computed and kept. Never a report of another environment: a
    key that cannot be made (no boot id) computes every time."""
    path = _env_report_path()
    if path is None:
        return compute()
    return cached_json(path, lambda data: isinstance(data, dict) and isinstance(data.get("pretty_env_info"), str),
                       lambda: {"pretty_env_info": compute()})["pretty_env_info"]


def _env_report_path() -> Path | None:
    try:
        boot = BOOT_ID.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    folders = sorted({*site.getsitepackages(), site.getusersitepackages(),
                      *(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))})
    installed = [f"{p}:{os.stat(p).st_mtime_ns}" for p in folders if os.path.isdir(p)]
    variables = sorted(f"{k}={v}" for k, v in os.environ.items()
                       if k in _ENV_REPORT_VARS or k.startswith(_ENV_REPORT_PREFIXES))
    key = "\0".join([boot, sys.executable, sys.version, str(os.getuid()), *installed, *variables])
    return cache_dir() / f"env-report-{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"
