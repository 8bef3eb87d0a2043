"""GitHub Actions runner plumbing: workflow commands, job summary, step outputs.

Workflow commands are lines on stdout (``::error::msg``); their data must have ``%``, ``\\r`` and
``\\n`` escaped, and property values also ``:`` and ``,``. Untrusted text printed to the log
(e.g. the eval log, which can contain model generations) is wrapped in ``::stop-commands::`` so a
generation that reads ``::set-env ...`` is not executed by the runner.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

SUMMARY_LIMIT = 1024 * 1024  # GitHub rejects a step summary over 1 MiB
MAX_ERROR_ANNOTATIONS = 10  # GitHub shows at most 10 error annotations per step


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def command(name: str, message: str = "", **props: str | None) -> str:
    """One workflow command line, escaped."""
    shown = {k: v for k, v in props.items() if v is not None}
    prop_text = ",".join(f"{k}={escape_property(str(v))}" for k, v in shown.items())
    return f"::{name}{' ' + prop_text if prop_text else ''}::{escape_data(message)}"


class Console:
    """Writes workflow commands and log lines; ``out`` defaults to sys.stdout at call time."""

    def __init__(self, out: TextIO | None = None) -> None:
        self._out = out

    @property
    def out(self) -> TextIO:
        return self._out or sys.stdout

    def line(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def mask(self, secret: str) -> None:
        # Each line of a multi-line secret is masked separately by the runner.
        for part in secret.splitlines():
            if part.strip():
                self.line(f"::add-mask::{part}")

    def annotate(self, level: str, message: str, *, title: str | None = None) -> None:
        self.line(command(level, message, title=title))

    def error_annotations(self, messages: list[str], *, title: str = "gatekeeper") -> int:
        """At most MAX_ERROR_ANNOTATIONS ::error:: lines (the rest summarised); returns how many."""
        shown = messages[:MAX_ERROR_ANNOTATIONS]
        if len(messages) > len(shown):
            shown = shown[:-1] + [f"... and {len(messages) - len(shown) + 1} more regression(s); see the job summary"]
        for msg in shown:
            self.annotate("error", msg, title=title)
        return len(shown)

    @contextmanager
    def group(self, title: str, *, untrusted: bool = True) -> Iterator[Callable[[str], None]]:
        """A folded log group; inside, workflow commands are disabled when ``untrusted``."""
        self.line(command("group", title))
        token = secrets.token_hex(16) if untrusted else None
        if token:
            self.line(f"::stop-commands::{token}")
        try:
            yield self.line
        finally:
            if token:
                self.line(f"::{token}::")
            self.line("::endgroup::")


def write_outputs(path: str | os.PathLike | None, values: dict[str, str]) -> None:
    """Append outputs to $GITHUB_OUTPUT using the multi-line ``name<<DELIM`` form.

    The delimiter has a random suffix and is checked against the value, so a value cannot end
    the block early and inject another output.
    """
    if not path:
        return
    chunks = []
    for name, value in values.items():
        value = "" if value is None else str(value)
        delim = f"ghadelimiter_{secrets.token_hex(12)}"
        while delim in value:
            delim = f"ghadelimiter_{secrets.token_hex(12)}"
        chunks.append(f"{name}<<{delim}\n{value}\n{delim}\n")
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("".join(chunks))


def trim_utf8(text: str, max_bytes: int, note: str = "") -> str:
    """Text cut so that text + note fits in max_bytes of UTF-8, never splitting a character."""
    raw = text.encode("utf-8")
    if len(raw) <= max_bytes:
        return text
    budget = max(max_bytes - len(note.encode("utf-8")), 0)
    return raw[:budget].decode("utf-8", errors="ignore") + note


def append_summary(path: str | os.PathLike | None, markdown: str) -> bool:
    """Append markdown to $GITHUB_STEP_SUMMARY, trimmed so the file stays under 1 MiB."""
    if not path:
        return False
    p = Path(path)
    existing = p.stat().st_size if p.exists() else 0
    budget = SUMMARY_LIMIT - existing - 1024  # headroom for later appends by other steps' lines
    if budget <= 0:
        return False
    note = "\n\n_(gatekeeper: summary trimmed to stay under GitHub's 1 MiB limit)_\n"
    text = trim_utf8(markdown.rstrip("\n") + "\n", budget, note)
    with open(p, "a", encoding="utf-8") as fh:
        fh.write(text)
    return True
