"""The sealed evaluation: lm-eval, and everything it starts, runs where no pull request writes.

lm-eval and the libraries under it resolve names in the working folder before anywhere else:
``evaluate.load(NAME)`` imports ``./NAME/NAME.py``; ``datasets.load_dataset("org/name")`` reads a
folder ``./org/name/`` instead of the hub; transformers loads a tokenizer ``org/tok`` from
``./org/tok/``; torch's ``collect_env`` (lm-eval's environment report) starts ``python -m pip``,
which imports ``./pip/__main__.py``. On a pull request the working folder is the PR's checkout.
So while a suite is evaluated (``sealed``):

- the process works in a fresh, empty folder of its own (``mkdtemp``: mode 0700, a random name,
  removed afterwards), and so does every subprocess it starts; the suite's and the model's paths
  are made absolute before the switch (``absolute``);
- ``PYTHONSAFEPATH=1`` for every Python child (a second wall: ``-m`` and ``-c`` put no folder
  first on ``sys.path``), and this process's own ``sys.path`` loses the working folder (``''``, or
  the folder ``python -m gatekeeper`` was started in) for the imports made meanwhile;
- a Hugging Face cache inside the repository is refused (``check_caches``): the cache holds
  ``evaluate`` and ``datasets`` modules, which are code, and the data the suite measures.

What still reaches the evaluation from the working tree is listed in docs/action.md (trust
table): the model checkpoint, which is what is judged, and nothing else on a pull request.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from gatekeeper import names_folder
from gatekeeper.errors import GateError

# Where each Hugging Face library keeps what it downloads, and the variable that moves it. The
# defaults follow huggingface_hub, datasets, evaluate and transformers: all under HF_HOME.
_UNDER_HOME = {"HF_HUB_CACHE": "hub", "HF_DATASETS_CACHE": "datasets", "HF_MODULES_CACHE": "modules",
               "HF_EVALUATE_CACHE": "evaluate"}
CACHE_VARIABLES = ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE",
                   "HF_MODULES_CACHE", "HF_EVALUATE_CACHE", "TRANSFORMERS_CACHE", "XDG_CACHE_HOME")
_ORIGIN: list[Path] = []  # the working folder a sealed evaluation left, innermost last


def origin() -> Path:
    """The working folder the user started in (inside ``sealed``, the one it switched from)."""
    return _ORIGIN[-1] if _ORIGIN else Path.cwd()


def absolute(path: str | os.PathLike[str]) -> Path:
    """``path`` against the user's working folder, ``~`` expanded, not resolved (links kept)."""
    return Path(os.path.normpath(origin() / Path(path).expanduser()))


def repositories(*paths: str | os.PathLike[str]) -> list[Path]:
    """The checkouts a pull request can write: the git work tree around the working folder and
    around each of ``paths`` (the suite's folder), and ``$GITHUB_WORKSPACE``."""
    found: list[Path] = []
    workspace = os.environ.get("GITHUB_WORKSPACE")
    if workspace:
        found.append(Path(os.path.realpath(workspace)))
    for start in (origin(), *paths):
        folder = Path(os.path.realpath(absolute(start)))
        for candidate in (folder, *folder.parents):
            if (candidate / ".git").exists():
                found.append(candidate)
                break
    return list(dict.fromkeys(found))


def cache_locations(env: Mapping[str, str] | None = None) -> list[tuple[str, Path]]:
    """(the variable that sets it, folder) of every Hugging Face cache the evaluation may use."""
    env = os.environ if env is None else env
    if env.get("HF_HOME"):
        home, home_var = env["HF_HOME"], "HF_HOME"
    elif env.get("XDG_CACHE_HOME"):
        home, home_var = os.path.join(env["XDG_CACHE_HOME"], "huggingface"), "XDG_CACHE_HOME"
    else:
        home, home_var = os.path.join(env.get("HOME") or "~", ".cache", "huggingface"), "HOME"
    out = [(home_var, home)]
    for var, sub in _UNDER_HOME.items():
        legacy = "HUGGINGFACE_HUB_CACHE" if var == "HF_HUB_CACHE" else None
        if env.get(var):
            out.append((var, env[var]))
        elif legacy and env.get(legacy):
            out.append((legacy, env[legacy]))
        else:
            out.append((home_var, os.path.join(home, sub)))
    if env.get("TRANSFORMERS_CACHE"):
        out.append(("TRANSFORMERS_CACHE", env["TRANSFORMERS_CACHE"]))
    return [(var, absolute(folder)) for var, folder in dict.fromkeys(out)]


def check_caches(roots: Iterable[Path], env: Mapping[str, str] | None = None) -> None:
    """GateError when a Hugging Face cache lies inside one of ``roots`` (the repository)."""
    env = os.environ if env is None else env
    for var, folder in cache_locations(env):
        real = Path(os.path.realpath(folder))
        for root in roots:
            if real == root or root in real.parents:
                shown = f"{var}={env[var]}" if var in env else var
                raise GateError(
                    f"{shown}: the Hugging Face cache {folder} lies inside the repository {root}, which a pull "
                    "request writes (the cache holds evaluate and datasets modules, which are code, and the data "
                    "the suite measures); keep it outside the checkout, e.g. HF_HOME=$RUNNER_TEMP/hf-cache or the "
                    "runner's home, and point actions/cache there (docs/action.md#the-hugging-face-cache)")


@contextmanager
def sealed() -> Iterator[Path]:
    """Work in a fresh empty folder (yielded) until the block ends; PYTHONSAFEPATH=1 for the
    children; the working folder off ``sys.path``. Everything is restored afterwards."""
    here = Path.cwd()
    folder = Path(tempfile.mkdtemp(prefix="gatekeeper-sealed-"))
    safe = os.environ.get("PYTHONSAFEPATH")
    saved_path = list(sys.path)
    sys.path[:] = [p for p in sys.path if not names_folder(p, here)]
    os.environ["PYTHONSAFEPATH"] = "1"
    _ORIGIN.append(here)
    os.chdir(folder)
    try:
        yield folder
    finally:
        os.chdir(here)
        _ORIGIN.pop()
        added = [p for p in sys.path if p not in saved_path]  # what the evaluation itself added
        sys.path[:] = saved_path + added
        if safe is None:
            os.environ.pop("PYTHONSAFEPATH", None)
        else:
            os.environ["PYTHONSAFEPATH"] = safe
        shutil.rmtree(folder, ignore_errors=True)
