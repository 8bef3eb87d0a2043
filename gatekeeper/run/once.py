"""Work lm-eval 0.4.13 redoes on every evaluation although its result cannot change, done once.

- ``add_env_info``: the environment report in results.json (torch's ``collect_env``, which starts
  ``pip list`` and more: about 0.8 s and a second of CPU an evaluation). Kept per process and
  the folder above the working one (the report names its git commit): every evaluation works in
  a fresh sealed folder (run/sealed.py), all of them in the same temporary folder.
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
import os
from collections.abc import Iterator
from typing import Any

_ENV_INFO: dict[str, dict[str, Any]] = {}  # the working directory's parent -> what add_env_info adds


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
