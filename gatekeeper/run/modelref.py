"""What ``--model`` names: a checkpoint folder, or a model on the Hugging Face hub, decided in
about a second and before anything heavy loads.

``checkpoints/regressed`` is both a relative path and the shape of a hub id. Given from a folder
that has no ``checkpoints/``, lm-eval used to take it for a hub id and fail half a minute later
with a connection error that never named the folder. So a string that is not a folder here is
looked up on the hub (one metadata request, or the cache when the hub is switched off) for the
backends that load weights from it, and an answer of "no such model" names both readings, and
the suite's folder when the path exists there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gatekeeper.errors import GateError
from gatekeeper.run import sealed
from gatekeeper.run.pins import HUB_ID
from gatekeeper.suite.modelpaths import is_path, model_paths


def check_model(model: str, *, hub: bool = True, revision: str | None = None,
                suite_dir: Path | None = None) -> Path | None:
    """A local checkpoint folder (returned) or a model id the hub (or the cache) has (None); else
    GateError. ``hub``: the backend loads weights by this name (hf, vllm); a served backend's
    model name is the server's business and is not looked up."""
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
    if looks_like_path or not HUB_ID.match(model) or ".." in model or "--" in model:
        where = "" if path.is_absolute() else f" under {Path.cwd()}"
        raise GateError(f"{model}: model path not found{where} (and not a Hugging Face model id){_there(model, suite_dir)}")
    if hub:
        problem = hub_problem(model, revision)
        if problem:
            raise GateError(f"{model}: no folder {model!r} under {Path.cwd()}; as a hub id it {problem}"
                            f"{_there(model, suite_dir)}")
    return None


def _there(model: str, suite_dir: Path | None) -> str:
    """A hint when the path exists beside the suite (the user ran from another folder)."""
    if suite_dir is None or Path(model).is_absolute():
        return ""
    beside = Path(os.path.normpath(Path(suite_dir).absolute() / model))
    if not beside.is_dir() or beside == Path(os.path.normpath(Path.cwd() / model)):
        return ""
    return f"; the suite's folder has it: give --model {beside}, or run from {Path(suite_dir).absolute()}"


def hub_problem(model: str, revision: str | None = None, files: tuple[str, ...] = ("config.json",)) -> str | None:
    """Why ``model`` cannot be loaded from the hub (the rest of a sentence), or None when the hub
    (or, offline or out of reach, the Hugging Face cache, holding one of ``files``) has it."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    if constants.HF_HUB_OFFLINE or os.environ.get("TRANSFORMERS_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE"):
        return None if _cached(model, revision, files) else (
            "is not in the Hugging Face cache and the hub is switched off (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)")
    try:
        HfApi().model_info(model, revision=revision, timeout=_timeout())
        return None
    except RevisionNotFoundError:
        return f"has no revision {revision!r} on the hub ({constants.ENDPOINT})"
    except GatedRepoError:
        return f"is gated on the hub ({constants.ENDPOINT}): set HF_TOKEN to a token that has access"
    except RepositoryNotFoundError:
        return f"was not found on the hub ({constants.ENDPOINT}; a private model needs HF_TOKEN)"
    except Exception as exc:  # noqa: BLE001 - httpx, proxies, DNS: any failure to get an answer
        # No answer: transformers would load the cache's copy, so that decides.
        if _cached(model, revision, files):
            return None
        return (f"could not be looked up (the hub {constants.ENDPOINT} did not answer: {type(exc).__name__}) and "
                "the Hugging Face cache does not hold it")


def _cached(model: str, revision: str | None, files: tuple[str, ...] = ("config.json",)) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return any(isinstance(try_to_load_from_cache(model, name, revision=revision or "main"), str) for name in files)


# What the cache holds of a repository a model setting names: a tokenizer repository has no
# config.json of its own; an adapter has adapter_config.json.
_CACHE_FILES = {"tokenizer": ("tokenizer_config.json", "tokenizer.json", "config.json"),
                "peft": ("adapter_config.json",), "delta": ("config.json",)}


def _timeout() -> float:
    try:
        return min(float(os.environ.get("HF_HUB_ETAG_TIMEOUT") or 10), 10.0)
    except ValueError:
        return 10.0


# ----------------------------------------------------------------------------- the suite's own paths
# A tokenizer, an adapter or any model argument written as a path (``./tok``) is the suite's: it
# is read relative to the suite file's folder, as its data files are (on a pull request that
# folder is the base commit's copy), never relative to the working folder, which the PR writes.


def absolute_model_paths(m: dict[str, Any], suite_dir: Path) -> dict[str, Any]:
    """The suite's model settings with each path made absolute against ``suite_dir``; a hub id
    (``org/tok``) stays one, and is never read from a folder of that name."""
    out = dict(m)
    if isinstance(out.get("tokenizer"), str) and is_path(out["tokenizer"]):
        out["tokenizer"] = str(_beside(suite_dir, out["tokenizer"]))
    extra = dict(out.get("model_args") or {})
    for key, value in extra.items():
        if isinstance(value, str) and is_path(value):
            extra[key] = str(_beside(suite_dir, value))
    if extra:
        out["model_args"] = extra
    return out


def _beside(suite_dir: Path, value: str) -> Path:
    return Path(os.path.normpath(Path(suite_dir) / Path(value).expanduser()))


def check_model_settings(m: dict[str, Any], suite_path: Path, *, hub: bool) -> None:
    """Every path the suite's model settings name exists (relative to the suite's folder), and
    every hub id among them is known to the hub or the cache: GateError naming the key, in about
    a second, before anything loads (the dry run makes the same check)."""
    suite_dir = sealed.absolute(suite_path).parent
    for key, value in model_paths(m):
        if is_path(value):
            if not _beside(suite_dir, value).exists():
                raise GateError(f"{suite_path}: {key}: {value} does not exist ({_beside(suite_dir, value)}; paths "
                                "in the suite are relative to the suite's folder)")
            continue
        if not (hub or key.endswith("tokenizer")):
            continue  # a served backend's adapter names are the server's business
        folder = _beside(suite_dir, value)
        hint = f"; the suite's folder has {value}: write it as ./{value}" if folder.is_dir() else ""
        if not HUB_ID.match(value) or ".." in value or "--" in value:
            raise GateError(f"{suite_path}: {key}: {value} is neither a path (write ./{value}) nor a Hugging Face "
                            f"id{hint}")
        problem = hub_problem(value, files=_CACHE_FILES.get(key.rsplit(".", 1)[-1], ("config.json",)))
        if problem:
            raise GateError(f"{suite_path}: {key}: {value} is not a path, and as a hub id it {problem}{hint}")
