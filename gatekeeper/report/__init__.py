"""Stage: report. Renders an ``Outcome`` for machines (``json``), reviewers (``markdown``: the
PR comment and job summary) and people at a terminal (``terminal``), all under one headline.

May import: the ground floor and ``compare`` (the outcome it renders). Nothing here does I/O.
"""

from gatekeeper.report.headline import ReportContext, headline
from gatekeeper.report.json import SCHEMA_VERSION, comparison_json, error_json, to_json
from gatekeeper.report.markdown import GITHUB_COMMENT_LIMIT, render_markdown
from gatekeeper.report.numbers import fmt_num, fmt_p
from gatekeeper.report.terminal import render_terminal

__all__ = [
    "GITHUB_COMMENT_LIMIT", "SCHEMA_VERSION", "ReportContext", "comparison_json", "error_json", "fmt_num", "fmt_p",
    "headline",
    "render_markdown", "render_terminal", "to_json",
]
