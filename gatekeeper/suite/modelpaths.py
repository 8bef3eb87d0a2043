"""The paths and hub ids a suite's model settings name (a tokenizer, an adapter, any model
argument written as a path).

A value written as a path (``./tok``) is the suite's own file, read relative to the suite file's
folder as its data files are (on a pull request, from the base commit's copy). Anything else in
a hub argument (``org/tok``) is a hub id, never a folder of that name in the working folder.
"""

from __future__ import annotations

from typing import Any

# model_args that name a folder or a hub repository (lm-eval's HFLM: tokenizer, peft, delta).
HUB_ARGS = ("tokenizer", "peft", "delta")


def is_path(value: str) -> bool:
    """A model argument written as a path (``./x``, ``../x``, ``/x``, ``~/x``), not a hub id."""
    return value.startswith(("./", "../", "/", "~")) or value in (".", "..") or "\\" in value


def model_paths(m: dict[str, Any]) -> list[tuple[str, str]]:
    """(key as the suite writes it, value) of every model setting that names a path or a hub
    repository: ``model.tokenizer``, ``model.model_args.*`` strings written as paths, and the hub
    arguments (tokenizer, peft, delta) whatever their shape."""
    out = []
    if isinstance(m.get("tokenizer"), str) and m["tokenizer"]:
        out.append(("model.tokenizer", m["tokenizer"]))
    for key, value in (m.get("model_args") or {}).items():
        if isinstance(value, str) and value and (is_path(value) or key in HUB_ARGS):
            out.append((f"model.model_args.{key}", value))
    return out
