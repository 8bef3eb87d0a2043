"""``gatekeeper run --complete DIR``: turn a stopped sequential gate into a whole run.

A sequential gate (``gate --sequential --out DIR``) writes one folder per look, ``DIR/look-K``,
each holding only the documents that look added; its items are a sample, so
``baseline record|promote`` refuse them. Completing evaluates every document no look evaluated,
as one more look with the documents given (``DIR/rest``), and joins the looks and the rest item
for item (``merge.merge_looks``) into ``DIR/complete/<model>``: the run an unsequenced
``gatekeeper run`` of the same model writes, with the same per-item values and hashes, which
can then be recorded or promoted.

The model is the one the looks evaluated, named as their manifest names it (lm-eval records the
name in results.json, and the parts must agree on it; the merge also compares the files' sha256):
a relative path is read from the current folder, so complete from where the gate ran.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gatekeeper.errors import GateError
from gatekeeper.results.layout import MANIFEST_NAME, read_manifest
from gatekeeper.run import looks as lookmod
from gatekeeper.run import merge, pins, runner
from gatekeeper.suite.suite import Suite

REST = "rest"
COMPLETE = "complete"


def look_folders(folder: Path, *, rest: bool = False) -> list[Path]:
    """The run folders of a sequential gate's looks under ``folder`` (``look-K/<model>``, or a
    sharded workflow's ``look-K/part-k/<model>``: any folder up to three levels down whose manifest
    has a ``look``), in look order; ``rest``: also ``run --complete``'s rest. Links are not followed."""
    if not folder.is_dir():
        raise GateError(f"{folder}: no such folder; pass the --out folder of `gatekeeper gate --sequential`")
    found = []
    for here, dirs, files in os.walk(folder):
        depth = len(Path(here).relative_to(folder).parts)
        dirs[:] = sorted(d for d in dirs if depth < 3 and d != COMPLETE and not (Path(here) / d).is_symlink())
        if MANIFEST_NAME not in files or Path(here, MANIFEST_NAME).is_symlink():
            continue
        look = (read_manifest(Path(here)) or {}).get("look")
        if isinstance(look, dict) and (rest or look.get("rest") is not True):
            index, part = look.get("index"), look.get("part")
            k = part[0] if isinstance(part, list) and part and isinstance(part[0], int) else 1
            found.append(((index if isinstance(index, int) else 0, k), Path(here)))
    if not found:
        raise GateError(f"{folder}: no looks of a sequential gate in it; pass the --out folder of "
                        "`gatekeeper gate --sequential` (or the folder holding the look-K folders)")
    return [p for _, p in sorted(found)]


def complete(folder: Path, suite: Suite, *, device: str | None = None, log: Callable[[str], Any] = print) -> Path:
    """Evaluate what the sequential gate in ``folder`` skipped and write the whole run; returns
    its folder (``folder/complete/<model>``)."""
    folder = Path(folder)
    parts = look_folders(folder)
    target = folder / COMPLETE
    if target.exists():
        raise GateError(f"{target}: already exists; this gate was completed (remove the folder to complete it again)")
    loaded = [merge.load_look(p) for p in parts]  # each bound to its files, its documents recomputed
    first = loaded[0].manifest
    if first.get("suite_hash") != suite.hash:
        raise GateError(f"{parts[0]}: the looks ran suite hash {str(first.get('suite_hash'))[:12]}, "
                        f"{suite.path} is {suite.hash[:12]}; complete with the suite the gate ran")
    info = first["look"]
    seen: dict[str, list[int]] = {}
    for part in loaded:
        for task, docs in part.info["docs"].items():
            seen.setdefault(task, []).extend(int(d) for d in docs)
    rest = lookmod.rest(info["items"], seen)
    rest_dir = folder / REST
    if rest_dir.exists():
        raise GateError(f"{rest_dir}: left by an earlier `run --complete` that did not finish; remove it and run again")
    left = sum(len(d) for d in rest.values())
    log(f"complete: {left:,} of {sum(info['items'].values()):,} items left to evaluate")
    model = first.get("model")
    if not isinstance(model, str) or not model:
        raise GateError(f"{parts[0]}: the manifest names no model")
    if first.get("model_path") and not Path(model).expanduser().is_dir():
        raise GateError(f"{parts[0]}: the looks evaluated {model}, which is not there from {Path.cwd()}; "
                        "run `gatekeeper run --complete` from the folder the gate ran in")
    if left:
        look = lookmod.Look(int(info["count"]) + 1, int(info["count"]), int(info["seed"]), docs=rest)
        # The looks' dataset commits, whatever the hub's head says now: the rest joins them.
        lock = pins.check_lock(first.get("datasets"), str(parts[0]))
        rest_run = runner.run_suite(suite, model, rest_dir, revision=first.get("revision"), device=device,
                                    log=log, look=look, lock=lock)
        loaded.append(merge.load_look(rest_run))
    return merge.join_looks(loaded, target)
