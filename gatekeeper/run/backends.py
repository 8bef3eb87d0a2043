"""Which lm-eval model type runs the suite, and the ``model_args`` it gets.

The suite's ``model.backend`` is an lm-eval 0.4.13 model type: ``hf`` (default), ``vllm``,
``local-completions``, ``local-chat-completions``, or any other registered type (passed through).
The first-class keys map onto each backend's own constructor arguments; ``model.model_args`` is
passed through last, so it can set anything the backend accepts. A first-class key that the
backend does not take is an error, not silently dropped: a typo must not open the gate.

Every check here runs before lm-eval loads a model (seconds, not GPU minutes).
"""

from __future__ import annotations

import difflib
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatekeeper.errors import GateError

HF, VLLM = "hf", "vllm"
API = ("local-completions", "local-chat-completions")
KNOWN = (HF, VLLM, *API)

# First-class suite keys and the backends that take them (lm-eval's argument of the same name).
FIRST_CLASS: dict[str, tuple[str, ...]] = {
    "tensor_parallel_size": (VLLM,),
    "data_parallel_size": (VLLM,),
    "gpu_memory_utilization": (VLLM,),
    "max_model_len": (VLLM,),
    "parallelize": (HF,),
    "base_url": API,
    "num_concurrent": API,
    "tokenizer": (HF, VLLM, *API),
}
# Packages each backend needs beyond lm-eval[hf]: checked before anything loads.
_NEEDS: dict[str, tuple[str, ...]] = {
    VLLM: ("vllm",),
    API[0]: ("aiohttp", "tenacity", "requests"),
    API[1]: ("aiohttp", "tenacity", "requests"),
}
_INSTALL = {VLLM: "pip install 'lm-eval[vllm]==0.4.13' (needs a CUDA GPU)",
            API[0]: "pip install 'lm-eval[api]==0.4.13'", API[1]: "pip install 'lm-eval[api]==0.4.13'"}
# Versions the run manifest records per backend (besides lm-eval, torch, transformers).
_VERSIONED = ("vllm", "openai", "aiohttp", "requests", "tenacity", "accelerate")


@dataclass(frozen=True)
class BackendPlan:
    """What lm-eval is asked to build: ``simple_evaluate(model=name, model_args=args)``."""

    name: str
    args: dict[str, Any]

    @property
    def served(self) -> bool:
        """Scored by a server, not in this process (no device, no local weights loaded)."""
        return self.name in API

    @property
    def local_device(self) -> bool:
        """This process places the model on ``--device`` (hf and unknown types); vLLM and
        servers choose their own devices."""
        return self.name not in (VLLM, *API)


def plan(m: dict[str, Any], model: str, *, dtype: str, revision: str | None,
         where: str = "suite") -> BackendPlan:
    """The backend and model_args for ``m`` (the suite's defaults-filled ``model`` section)."""
    name = str(m.get("backend") or HF)
    for key, takes in FIRST_CLASS.items():
        if m.get(key) not in (None, False) and name in KNOWN and name not in takes:
            raise GateError(f"{where}: model.{key} applies to backend {' / '.join(takes)}, not {name}; "
                            "remove it (or pass it through model.model_args)")
    if name in API:
        args = _api_args(m, model, where)
    else:
        args = {"pretrained": model, "dtype": dtype}
        if revision:
            args["revision"] = revision
        if m.get("trust_remote_code"):
            args["trust_remote_code"] = True
        if m.get("max_length") is not None:
            args["max_length"] = m["max_length"]
        for key in ("tokenizer", "tensor_parallel_size", "data_parallel_size",
                    "gpu_memory_utilization", "max_model_len"):
            if m.get(key) is not None:
                args[key] = m[key]
        if m.get("parallelize"):
            args["parallelize"] = True
    extra = m.get("model_args") or {}
    clash = sorted(k for k in extra if k in args and k != "pretrained" and extra[k] != args[k])
    if clash:
        raise GateError(f"{where}: model.model_args sets {', '.join(clash)}, which the suite's own "
                        "model keys already set; keep one of them")
    if "pretrained" in extra:
        raise GateError(f"{where}: model.model_args.pretrained: the model comes from --model; remove it")
    return BackendPlan(name, {**args, **extra})


def _api_args(m: dict[str, Any], model: str, where: str) -> dict[str, Any]:
    if not m.get("base_url"):
        raise GateError(f"{where}: model.base_url is required for backend {m['backend']} "
                        "(e.g. http://127.0.0.1:8000/v1/completions)")
    # ``pretrained`` is the model name sent to the server, as lm-eval's TemplateAPI reads it.
    args: dict[str, Any] = {"pretrained": model, "base_url": m["base_url"]}
    tokenizer = m.get("tokenizer")
    if tokenizer is None and Path(model).expanduser().is_dir():
        tokenizer = model  # the checkpoint the server serves: its tokenizer, no hub look-up
    if m["backend"] == API[0]:
        # lm-eval scores loglikelihood client-side from token ids: it needs the model's
        # tokenizer. "huggingface" skips the remote-tokenizer probe ("auto" sends requests).
        if tokenizer is None:
            raise GateError(f"{where}: model.tokenizer is required for backend {m['backend']} when "
                            "--model is not a local checkpoint (a tokenizer dir or hub id)")
        args["tokenizer_backend"] = "huggingface"
    if tokenizer is not None:
        args["tokenizer"] = str(tokenizer)
    if m.get("num_concurrent") is not None:
        args["num_concurrent"] = m["num_concurrent"]
    if m.get("max_length") is not None:
        args["max_length"] = m["max_length"]
    if m.get("trust_remote_code"):
        args["trust_remote_code"] = True
    return args


def check_available(name: str, where: str = "suite") -> None:
    """The backend's packages are installed and lm-eval knows the name; else GateError.
    Runs before lm-eval loads anything (vLLM's own check comes after task building)."""
    missing = [pkg for pkg in _NEEDS.get(name, ()) if importlib.util.find_spec(pkg) is None]
    if missing:
        raise GateError(f"{where}: model.backend {name} needs {', '.join(missing)}, which is not "
                        f"installed; {_INSTALL[name]}")
    if name in KNOWN:
        return
    from lm_eval.api.registry import get_model

    try:
        get_model(name)
    except Exception:  # noqa: BLE001 - an unknown name, or a backend whose import fails
        from lm_eval.api.registry import MODEL_REGISTRY

        hint = difflib.get_close_matches(name, list(MODEL_REGISTRY.keys()), n=1)
        tip = f"did you mean {hint[0]!r}?" if hint else "see lm-eval's model types"
        raise GateError(f"{where}: model.backend {name!r} is not an lm-eval 0.4.13 model type "
                        f"(or cannot be imported); {tip}") from None


def versions(name: str) -> dict[str, str]:
    """{package: version} of the backend's own libraries that are installed (provenance)."""
    out = {}
    for pkg in _VERSIONED:
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            continue
    if name == HF:
        out = {k: v for k, v in out.items() if k == "accelerate"}
    elif name == VLLM:
        out = {k: v for k, v in out.items() if k == "vllm"}
    return out


def public_args(args: dict[str, Any]) -> dict[str, Any]:
    """model_args as the manifest records them: secrets (auth_token, header) left out."""
    return {k: ("<redacted>" if k in ("auth_token", "header", "api_key") else v) for k, v in args.items()}
