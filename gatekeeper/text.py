"""Untrusted text made harmless, and short renderings of values for one-line messages.

Task names, prompts, model outputs and file contents are untrusted: in a PR comment a
generation must not ping people, link issues or inject markup (``escape_untrusted``); in an
error message a hostile value must not fill the screen (``short``).

Ground floor: imports nothing of gatekeeper.
"""

from __future__ import annotations

import html
import re
from typing import Any

WORD_JOINER = "\u2060"  # invisible; breaks GitHub's @mention and #ref autolinking
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|~$])")  # ">" and "<" become HTML entities; "$": math
# Bidi controls would let untrusted text display reordered (e.g. a fake "passed").
_BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def escape_untrusted(text: str, limit: int = 200) -> str:
    """Make arbitrary text safe inside markdown (tables included): one line, no markup."""
    text = " ".join(_BIDI.sub("", str(text)).split())  # newlines would break a table row
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    # Markdown first, then HTML: html.escape's entities must not get backslashes.
    text = _MD_SPECIAL.sub(r"\\\1", text)
    text = html.escape(text, quote=False)
    # Neutralise @mentions, #refs and team/user refs after escaping so the joiner survives.
    text = re.sub(r"@(?=\w)", "@" + WORD_JOINER, text)
    text = re.sub(r"#(?=\w)", "#" + WORD_JOINER, text)
    # GitHub links GH-123 to an issue (the backslash before "-" is gone once rendered) and
    # autolinks scheme://host URLs.
    text = re.sub(r"(?i)(gh\\-)(?=\d)", "\\1" + WORD_JOINER, text)
    text = text.replace("://", ":" + WORD_JOINER + "//")
    return text


def short(value: Any, limit: int = 40) -> str:
    """``repr(value)``, cut to ``limit`` characters (for one-line error messages)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def json_problem(exc: BaseException) -> str:
    """Why valid JSON is still unusable: nested too deeply (RecursionError) or an integer of
    more than 4300 digits (ValueError); both are JSON no lm-eval or gatekeeper writes."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return "a number with too many digits" if "digits" in str(exc) else short(str(exc), 80)


# Query parameters and arguments whose values are credentials (api-key, key, token, ...).
_SECRET_NAME = r"(?:api[-_]?key|apikey|key|token|access[-_]?token|auth|auth[-_]?token|password|passwd|secret|sig|signature|code)"
_SECRET_QUERY = re.compile(rf"(?i)([?&;]{_SECRET_NAME}=)[^&#;\s]*")
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s?#]+@")
SECRET_ARGS = frozenset({"auth_token", "api_key", "header", "headers", "authorization", "token", "password"})
REDACTED = "<redacted>"


def redact_url(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced by ``***``: user:password@ and
    query values named like keys and tokens (``?api-key=...``, ``&token=...``)."""
    if "://" not in text and "=" not in text:
        return text
    return _SECRET_QUERY.sub(r"\1***", _USERINFO.sub(r"\1***@", text))


def redact(value: Any) -> Any:
    """A copy of a JSON-like value with secrets out: entries named like credentials
    (``auth_token``, ``api_key``, ``header``) become ``<redacted>``, strings lose URL credentials."""
    if isinstance(value, dict):
        return {k: (REDACTED if isinstance(k, str) and k.lower() in SECRET_ARGS and v not in (None, "")
                    else redact(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return _redact_arg_string(redact_url(value))
    return value


def _redact_arg_string(text: str) -> str:
    """lm-eval's ``k=v,k=v`` model_args string: the values of credential arguments out."""
    if "=" not in text or "," not in text and not any(text.startswith(f"{k}=") for k in SECRET_ARGS):
        return text
    parts = []
    for part in text.split(","):
        key, sep, val = part.partition("=")
        parts.append(f"{key}={REDACTED}" if sep and key.strip().lower() in SECRET_ARGS and val else part)
    return ",".join(parts)


def one_line(exc: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
