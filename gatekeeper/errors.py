"""Errors and exit codes: the one vocabulary every stage uses to say "bad input".

Exit codes (pip's ``cli/status_codes.py`` is the model): 0 no regression, 1 regression, 2
invalid input or usage. Only the front doors (``cli.py``, ``action.py``) turn a ``GateError``
(or any other exception) into an exit code.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_INVALID = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader of stdout went away


class GateError(Exception):
    """Bad input or usage: the CLI prints ``str(err)`` as one line and exits 2.

    Messages name the file (or flag) and the problem, e.g.
    ``runs/cand/results_x.json: not valid JSON (line 3, column 1)``.
    """

    exit_code = EXIT_INVALID
