"""Every timing README.md states was measured by a benchmark in this repository (issue #17, 3).

A timing sits between ``<!-- fig:ID -->`` and ``<!-- /fig -->``; its text is the one that
``benchmarks/figures.json`` recorded for ID, with the script that measured it and the machine it
ran on (benchmarks/figures.py). Any other number with a unit of time in README is an error,
unless it is a setting (a timeout, a progress interval), listed here with why.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import figures  # noqa: E402

README = ROOT / "README.md"
TIMING = re.compile(r"(?<![\w.])~?\d[\d.,½]*\s?(?:ms|s|sec|seconds?|min|minutes?|hours?)\b"
                    r"|\b(?:a|an|one|two|three|a few)\s+(?:seconds?|minutes?|hours?)\b", re.IGNORECASE)
# Settings and limits, not measurements: what the code is configured to do.
SETTINGS = {
    "60 s",  # a task-defined aggregation's time budget per test (results/metrics.py)
    "30 s",  # the progress line interval, GATEKEEPER_PROGRESS_SECONDS (run/progress.py)
    "5 s",   # how long scripts/setup.sh waits for PyTorch's CPU index
}
GENERATED = re.compile(r"<!-- demo-output:(\w+) -->.*?<!-- /demo-output:\1 -->", re.S)


def _outside_spans(text: str) -> str:
    return figures.SPAN.sub(" ", GENERATED.sub(" ", text))


def _pages_text() -> str:
    """README and the docs pages it was split into (benchmarks.figures.PAGES), one text."""
    assert README in figures.PAGES
    return "\n".join(p.read_text(encoding="utf-8") for p in figures.PAGES)


def test_every_figure_span_is_a_recorded_measurement() -> None:
    text = _pages_text()
    data = figures.load()
    spans = figures.SPAN.findall(text)
    assert len(spans) >= 6, "README's timings are expected inside <!-- fig:ID --> spans"
    for fid, shown in spans:
        assert fid in data, f"README figure {fid!r} is not in benchmarks/figures.json: run its benchmark with --record"
        record = data[fid]
        assert shown == record["text"], f"README says {shown!r} for {fid}, the benchmark recorded {record['text']!r}: " \
                                        "run python scripts/update_readme.py --figures-only"
        script = ROOT / record["script"]
        assert script.is_file() and fid.removesuffix("_confusion") in script.read_text(), \
            f"{fid}: {record['script']} does not record it"
        assert record["machine"] and record["date"], f"{fid}: the record names no machine or date"
    assert text == figures.render(text, data)


def test_no_timing_in_readme_outside_a_figure() -> None:
    rest = _outside_spans(_pages_text())
    loose = [m.group(0) for m in TIMING.finditer(rest) if m.group(0).lstrip("~") not in SETTINGS]
    assert not loose, f"timings in README.md or its docs pages that no benchmark recorded: {loose}"


def test_the_checker_sees_timings() -> None:
    found = [m.group(0) for m in TIMING.finditer("about 2½ minutes on 2 cores; gate about 10 s; 6–8 minutes more; "
                                                  "took 0.7 s; 12ms; a minute")]
    assert found == ["2½ minutes", "10 s", "8 minutes", "0.7 s", "12ms", "a minute"]
