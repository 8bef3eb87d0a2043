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
    here = os.getcwd()
    sys.path[:] = [p for p in sys.path if not names_folder(p, here)]


def names_folder(entry: str, folder: str | os.PathLike[str]) -> bool:
    """Whether the ``sys.path`` entry ``entry`` names ``folder`` (``''`` and ``.`` always name the
    working folder, which is what ``folder`` is where this is used)."""
    if entry in ("", "."):
        return True
    try:
        return os.path.realpath(entry) == os.path.realpath(folder)
    except (OSError, ValueError):
        return False
