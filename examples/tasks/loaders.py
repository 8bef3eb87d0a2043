"""Datasets for the demo tasks, read relative to this file.

lm-eval resolves a relative ``dataset_kwargs.data_files`` against the process's working directory,
so the task YAMLs use ``custom_dataset: !function loaders.<fn>`` instead: the suite then runs the
same from any directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"


def _load(name: str) -> dict[str, Any]:
    import datasets  # lm-eval's own dependency; imported here so this module imports without it

    with open(DATA / name, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return {"test": datasets.Dataset.from_list(rows)}


def load_arith(**kwargs: Any) -> dict[str, Any]:
    """225 facts ``Q: a+b= A:`` (a, b in 0..14) with 4 numeric choices."""
    return _load("arith.jsonl")


def load_capitals(**kwargs: Any) -> dict[str, Any]:
    """200 invented countries with 4 candidate capitals; ``region`` groups them (10 regions)."""
    return _load("capitals.jsonl")


def load_synth_ppl(**kwargs: Any) -> dict[str, Any]:
    """100 held-out grammar paragraphs for rolling perplexity."""
    return _load("synth_ppl.jsonl")
