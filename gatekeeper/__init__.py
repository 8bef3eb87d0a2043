"""gatekeeper: stop a language-model regression from landing.

The gate (results, compare, report, publish) imports without torch or lm-eval; only
``gatekeeper.runner`` needs them, and imports them lazily.
"""

import os
import sys

__version__ = "0.1.0"


def drop_working_folder() -> None:
    """Take the working folder off ``sys.path``: called first by ``python -m gatekeeper`` and
    ``python -m gatekeeper.action``, before any third-party import.

    ``-m`` puts the working folder first on ``sys.path`` (unless ``-P`` / ``PYTHONSAFEPATH``), and
    on a pull request that folder is the PR's checkout: its ``numpy/__init__.py`` would run when
    the CLI imports numpy, long before the evaluation is sealed. This package is already imported
    by then, so its own submodules still load from where it was found."""
    here = os.path.realpath(os.getcwd())

    def is_here(entry: str) -> bool:
        if entry in ("", "."):
            return True
        try:
            return os.path.realpath(entry) == here
        except (OSError, ValueError):
            return False

    sys.path[:] = [p for p in sys.path if not is_here(p)]
