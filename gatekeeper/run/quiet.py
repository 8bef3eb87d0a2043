"""lm-eval's output made readable in a CI log, and the two signals read from it.

- ``quiet_output``: lm-eval's INFO chatter becomes short progress lines, a warning is shown the
  first time it is given and counted after that (``Warnings``: one line per kind with its count
  and tasks, the whole text for the run folder's log), no tqdm bars outside a terminal;
- ``known_noise``: the two lines every evaluation printed that say nothing about it;
- ``progress``: rate-limited request progress, and each phase's requests and seconds;
- ``empty_answers``: counts the endpoint's null answers (lm-eval scores them as "").
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from gatekeeper.run import progress as progress_lines

Log = Callable[[str], Any]


# transformers warns once per process when input_ids contain the pad token and no attention
# mask is passed. lm-eval's HF backend pads loglikelihood batches on the right and reads the
# logits of the real tokens only, which a causal model computes without looking right: the
# warning says nothing about the scores, on every run. Generation passes a mask.
_ATTENTION_MASK_WARNING = "We strongly recommend passing in an `attention_mask`"


class _DropMessage(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self._prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self._prefix)


@contextlib.contextmanager
def known_noise() -> Iterator[None]:
    """Silence the two lines every evaluation printed that say nothing about it: transformers'
    attention-mask warning (above) and git's "fatal: not a git repository" (lm-eval runs
    ``git describe`` with our stderr when it records its own commit). Nothing else is hidden:
    lm-eval's and transformers' other warnings and errors pass as before."""
    import lm_eval.evaluator as evaluator

    mask_log = logging.getLogger("transformers.modeling_utils")
    drop = _DropMessage(_ATTENTION_MASK_WARNING)
    mask_log.addFilter(drop)
    saved = evaluator.get_git_commit_hash
    evaluator.get_git_commit_hash = _git_commit_hash
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = saved
        mask_log.removeFilter(drop)


def _git_commit_hash() -> str | None:
    """lm_eval.loggers.utils.get_git_commit_hash with git's stderr captured, same result."""
    from lm_eval.loggers.utils import get_commit_from_path

    try:
        out = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True,  # noqa: S607
                             timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        out = None
    if out is not None and out.returncode == 0:
        return out.stdout.strip()
    return get_commit_from_path(os.getcwd())


class _CountEmpty(logging.Filter):
    """Counts lm-eval's "API returned null content" warnings (an answer replaced by "")."""

    count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if "API returned null content" in str(record.msg):
            self.count += 1
        return True


@contextlib.contextmanager
def empty_answers() -> Iterator[_CountEmpty]:
    counter = _CountEmpty()
    logger = logging.getLogger("lm_eval.models.api_models")
    logger.addFilter(counter)
    try:
        yield counter
    finally:
        logger.removeFilter(counter)


@contextlib.contextmanager
def progress(backend: str, log: Log, t0: float) -> Iterator[progress_lines.Progress]:
    """Rate-limited progress lines (progress.py) unless stderr is a terminal (lm-eval's bars);
    either way the phases' requests and seconds are counted (``Progress.spent``)."""
    from lm_eval.api.registry import get_model

    quiet = sys.stderr.isatty()
    reporter = progress_lines.Progress((lambda _line: None) if quiet else log, t0,
                                       math.inf if quiet else progress_lines.interval_from_env())
    with progress_lines.track(get_model(backend), reporter):
        yield reporter


# Warnings lm-eval gives for every task of a kind, that say nothing about this run.
_NOISE = ("Custom kwargs can be passed", "SHOULD ONLY BE USED FOR TESTING")


class Warnings:
    """lm-eval's warnings of one run. A warning lm-eval gives per request (~900 lines of
    "Combined length of context ..." on MMLU at 5 shots) is shown once and counted; ``summary``
    gives one line per kind with how often and, where lm-eval named it, for which tasks; ``text``
    is every warning in full, for the run folder."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.tasks: dict[str, dict[str, int]] = {}
        self.lines: list[str] = []

    def add(self, message: str, task: str | None) -> bool:
        """Count ``message``; True the first time its kind (its text, numbers aside) is seen."""
        self.lines.append(message)
        kind = re.sub(r"\d+(\.\d+)?", "N", message.splitlines()[0] if message else "")[:300]
        first = kind not in self.counts
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if task:
            per = self.tasks.setdefault(kind, {})
            per[task] = per.get(task, 0) + 1
        return first

    def summary(self) -> list[str]:
        out = []
        for kind, n in self.counts.items():
            if n > 1:
                per = self.tasks.get(kind) or {}
                where = f" ({', '.join(f'{t}: {c}' for t, c in sorted(per.items()))})" if per else ""
                out.append(f"lm-eval warning given {n} times{where}: {kind}")
        return out

    def text(self) -> str:
        return "".join(line.rstrip("\n") + "\n" for line in self.lines)


class _ProgressHandler(logging.Handler):
    """Turns lm-eval's INFO chatter into short progress lines; a warning is passed through the
    first time it is given and counted after that."""

    def __init__(self, log: Log, t0: float, warnings: Warnings) -> None:
        super().__init__(logging.INFO)
        self._log, self._t0, self._warnings = log, t0, warnings
        self._task: str | None = None  # the task lm-eval last named (it builds tasks one by one)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a logging bug must not kill the run
            return
        at = f"[{time.perf_counter() - self._t0:7.1f}s]"
        if m := re.match(r"Building contexts for (\S+)", msg):
            self._task = m.group(1)
            self._log(f"{at} {m.group(1)}: building prompts")
        elif m := re.match(r"Running (\S+) requests", msg):
            self._task = None  # requests of every task are mixed from here on
            self._log(f"{at} running {m.group(1)} requests")
        elif m := re.match(r"Cached requests: (\d+), Requests remaining: (\d+)", msg):
            self._log(f"{at} request cache: {m.group(1)} answered from the cache, {m.group(2)} to run")
        elif record.levelno >= logging.WARNING and not any(n in msg for n in _NOISE):
            if self._warnings.add(msg, self._task):
                self._log(f"{at} lm-eval {record.levelname.lower()}: {msg.splitlines()[0] if msg else ''}")


class _NoBars(io.TextIOBase):
    """stderr without tqdm bars: lm-eval passes ``disable=False`` explicitly, so TQDM_DISABLE
    cannot turn its bars off, and in a CI log every refresh is a new line."""

    def __init__(self, inner: Any) -> None:
        self._inner, self._dropped = inner, False

    def write(self, text: str) -> int:
        if text.startswith("\r") or (self._dropped and text == "\n"):
            self._dropped = text.startswith("\r")
            return len(text)
        self._dropped = False
        return self._inner.write(text)

    def flush(self) -> None:
        self._inner.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._inner.fileno()


@contextlib.contextmanager
def quiet_output(log: Log, t0: float, warnings: Warnings | None = None) -> Iterator[None]:
    """lm-eval's log lines → short progress lines; no progress bars outside a terminal.
    ``warnings`` collects lm-eval's warnings (the caller says when to print its summary)."""
    logger = logging.getLogger("lm_eval")
    handler = _ProgressHandler(log, t0, warnings if warnings is not None else Warnings())
    saved = (logger.level, logger.propagate)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logger.addHandler(handler)
    stderr = sys.stderr
    if not stderr.isatty():
        sys.stderr = _NoBars(stderr)
    try:
        yield
    finally:
        sys.stderr = stderr
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
