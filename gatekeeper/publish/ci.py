"""GitHub Actions runner plumbing: workflow commands, job summary, step outputs.

Workflow commands are lines on stdout (``::error::msg``); their data must have ``%``, ``\\r`` and
``\\n`` escaped, and property values also ``:`` and ``,``. Every other line goes through
``one_line``: an untrusted value (a task name, a model name, an API's ``html_url``) stays on its
line and cannot start a workflow command. The eval log, which can quote model generations, is
also wrapped in ``::stop-commands::``.
"""

from __future__ import annotations

import os
import re
import secrets
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

SUMMARY_LIMIT = 1024 * 1024  # GitHub rejects a step summary over 1 MiB
SUMMARY_RESERVE = 16 * 1024  # kept free by the report for the publishing notes appended after it
SUMMARY_CHARS = SUMMARY_LIMIT - 2 * SUMMARY_RESERVE  # the report's size when rendered for the summary
MAX_ERROR_ANNOTATIONS = 10  # GitHub shows at most 10 error annotations per step


# Control characters (tab kept) and Unicode line/paragraph separators: a log viewer may break
# a line at any of them.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def _visible(match: re.Match[str]) -> str:
    ch = match.group()
    return _NAMED.get(ch) or (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")


def escape_controls(text: str) -> str:
    """CR, LF and other control characters as visible escapes (``\\n``, ``\\x1b``); tab kept."""
    return _CONTROL.sub(_visible, text) if _CONTROL.search(text) else text


def one_line(text: str) -> str:
    """``text`` as one harmless log line: CR, LF and other control characters become visible
    escapes (``\\n``), a leading ``::`` (the runner's workflow-command form) becomes ``\\x3a:``
    and ``##[`` (its older form, read anywhere in a line) becomes ``#\\x23[``."""
    text = escape_controls(str(text)).replace("##[", "#\\x23[")
    stripped = text.lstrip()
    if stripped.startswith("::"):
        text = text[: len(text) - len(stripped)] + "\\x3a" + stripped[1:]
    return text


def one_line_each(text: str) -> str:
    """Several lines of ours (``\\n``-separated), each made harmless with ``one_line``."""
    return "\n".join(one_line(line) for line in str(text).split("\n"))


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
        """One log line of (possibly untrusted) text: never more than one, never a command."""
        self._raw(one_line(text))

    def _raw(self, line: str) -> None:
        """A workflow command built here (escaped by ``command``), or a fixed marker."""
        print(line, file=self.out, flush=True)

    def mask(self, secret: str) -> None:
        # Each line of a multi-line secret is masked separately by the runner.
        for part in secret.splitlines():
            if part.strip():
                self._raw(f"::add-mask::{part}")

    def annotate(self, level: str, message: str, *, title: str | None = None) -> None:
        self._raw(command(level, message, title=title))

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
        self._raw(command("group", title))
        token = secrets.token_hex(16) if untrusted else None
        if token:
            self._raw(f"::stop-commands::{token}")
        try:
            yield self.line
        finally:
            if token:
                self._raw(f"::{token}::")
            self._raw("::endgroup::")


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


def append_summary(path: str | os.PathLike | None, markdown: str, *, reserve: int = 0) -> bool:
    """Append markdown to $GITHUB_STEP_SUMMARY, trimmed (with a note) so the file stays under
    1 MiB less ``reserve`` bytes kept for later appends. False when there is no summary file;
    raises OSError when the file has no room left at all, so the caller says so."""
    if not path:
        return False
    p = Path(path)
    existing = p.stat().st_size if p.exists() else 0
    budget = SUMMARY_LIMIT - reserve - existing
    note = "\n\n_(gatekeeper: summary trimmed to stay under GitHub's 1 MiB limit)_\n"
    if budget < len(note.encode("utf-8")) + 64:
        raise OSError(f"{p.name}: the job summary already holds {existing} bytes, too close to GitHub's "
                      "1 MiB limit to add more")
    text = trim_utf8(markdown.rstrip("\n") + "\n", budget, note)
    with open(p, "a", encoding="utf-8") as fh:
        fh.write(text)
    return True
