"""Versions of the installed packages that can change an evaluation's results.

The action's image installs them from ``requirements/runtime.txt`` (exact versions and file
hashes, compiled from pyproject.toml). The run manifest records what was actually installed, so
that ``compare`` can name a difference as context: a tokenizer or transformers upgrade moves
scores without any change to the model.
"""

from __future__ import annotations

import importlib.metadata

# Packages on the evaluation path: model loading and numerics (torch, transformers, tokenizers,
# safetensors, accelerate, peft), data and prompts (datasets, huggingface-hub, jinja2 for chat
# templates), metrics (evaluate, sacrebleu, rouge-score, nltk, scikit-learn) and statistics
# (numpy, scipy). Every one except torch is in requirements/runtime.txt (tests/test_lockfile.py).
RESULT_PACKAGES: tuple[str, ...] = (
    "torch", "transformers", "tokenizers", "safetensors", "accelerate", "peft", "datasets",
    "huggingface-hub", "jinja2", "evaluate", "sacrebleu", "rouge-score", "nltk", "scikit-learn",
    "numpy", "scipy",
)


def installed_versions(names: tuple[str, ...] = RESULT_PACKAGES) -> dict[str, str | None]:
    """{distribution name: installed version, or None when it is not installed}."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out
