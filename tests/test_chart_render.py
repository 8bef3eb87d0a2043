"""The history charts (report/trend.py) rendered by the real Mermaid in a real browser (issue #15):
@mermaid-js/mermaid-cli driving Debian's chromium, both installed by scripts/setup_render.sh
(which scripts/test.sh runs). A chart that does not parse fails; the SVG's three lines are
checked point by point against the history's values."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gatekeeper.model import TrendEntry, TrendRow
from gatekeeper.report import trend as draw

ROOT = Path(__file__).resolve().parents[1]
MMDC = ROOT / ".venv" / "mermaid" / "node_modules" / ".bin" / "mmdc"
CHROMIUM = shutil.which("chromium")
PUPPETEER = ('{"executablePath": "%s", "args": ["--no-sandbox", "--disable-gpu", "--headless", "--no-first-run", '
             '"--disable-background-networking", "--disable-component-update", "--disable-sync"]}')

pytestmark = pytest.mark.skipif(not (MMDC.exists() and CHROMIUM),
                                reason="mermaid-cli or chromium is not installed (bash scripts/setup_render.sh)")

VALUES = [0.935, 0.915, 0.91, 0.905, 0.875]


def _entries() -> list[TrendEntry]:
    out = []
    for i, v in enumerate(VALUES):  # two gates on the same day: the labels must still differ
        day = 3 + i if i < 3 else 6
        rows = [TrendRow(key="demo_capitals_mc/acc,none", value=v, baseline=VALUES[max(i - 1, 0)],
                         anchor=None if i == 0 else VALUES[0], margin=0.02, verdict="unchanged")]
        out.append(TrendEntry(date=f"2026-11-{day:02d}T0{i}:00:00Z", event="gate", verdict="pass", rows=rows))
    return out


def _render(text: str, tmp_path: Path) -> str:
    (tmp_path / "chart.mmd").write_text(text)
    (tmp_path / "puppeteer.json").write_text(PUPPETEER % CHROMIUM)
    proc = subprocess.run([str(MMDC), "-i", "chart.mmd", "-o", "chart.svg", "-p", "puppeteer.json", "-q"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return (tmp_path / "chart.svg").read_text()


def _lines(svg: str) -> dict[int, list[tuple[float, float]]]:
    found = re.findall(r'class="line-plot-(\d)"[^>]*>\s*<path d="([^"]+)"', svg)
    return {int(i): [(float(x), float(y)) for x, y in re.findall(r"[ML]([\d.]+),([\d.]+)", d)] for i, d in found}


def _bars(svg: str) -> list[tuple[float, float]]:
    """(x, top) of each value bar."""
    group = re.search(r'class="bar-plot-0">(.*?)</g>', svg, re.S)
    assert group, "no bars"
    return [(float(x), float(y)) for x, y in re.findall(r'<rect x="([\d.]+)" y="([\d.]+)"', group.group(1))]


def test_the_trend_chart_renders_with_its_values_anchor_and_margin_edge(tmp_path: Path) -> None:
    markdown = draw.markdown(_entries())
    block = re.search(r"```mermaid\n(.*?)```", markdown, re.S)
    assert block, markdown
    svg = _render(block.group(1), tmp_path)
    assert "demo_capitals_mc/acc,none" in svg and "Syntax error" not in svg
    lines = _lines(svg)
    assert sorted(lines) == [1, 2]
    anchor, edge = lines[1], lines[2]
    values = _bars(svg)
    assert len(values) == len(VALUES)
    xs = [x for x, _ in values]
    assert xs == sorted(xs) and len(set(xs)) == len(xs)  # one x per night, none merged
    # y grows downwards: the order of the bars' tops is the order of the values
    ys = [y for _, y in values]
    assert ys[0] == pytest.approx(anchor[0][1])  # the first night equals the anchor: its bar top is the line
    assert sorted(range(len(ys)), key=lambda i: ys[i]) == sorted(range(len(VALUES)), key=lambda i: -VALUES[i])
    assert len({y for _, y in anchor}) == 1 and len({y for _, y in edge}) == 1  # flat: one anchor
    assert edge[0][1] > anchor[0][1]  # anchor - margin is drawn below the anchor
    # the scale: (anchor - edge) / (first - last value) in pixels is 0.02 / 0.06
    ratio = (edge[0][1] - anchor[0][1]) / (ys[-1] - ys[0])
    assert ratio == pytest.approx(0.02 / (VALUES[0] - VALUES[-1]), rel=0.02)


def test_a_chart_that_does_not_parse_fails(tmp_path: Path) -> None:
    (tmp_path / "chart.mmd").write_text("xychart-beta\n    line [0.9, oops]\n")
    (tmp_path / "puppeteer.json").write_text(PUPPETEER % CHROMIUM)
    proc = subprocess.run([str(MMDC), "-i", "chart.mmd", "-o", "chart.svg", "-p", "puppeteer.json", "-q"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0


def test_a_summary_with_charts_for_many_metrics_stays_under_1_mib() -> None:
    entries = []
    for night in range(365):
        rows = [TrendRow(key=f"task_{m:03d}/acc,none", value=0.5 + (night % 7) / 100, baseline=0.5, anchor=0.5,
                         margin=0.02) for m in range(100)]
        entries.append(TrendEntry(date=f"2026-{1 + night // 31 % 12:02d}-{1 + night % 28:02d}T00:00:00Z",
                                  event="gate", verdict="pass", rows=rows))
    text = draw.markdown(entries)
    assert text.count("xychart-beta") == 100 and len(text.encode()) < 1 << 20


def test_a_long_history_renders_numbered_nights_in_the_legend_colours(tmp_path: Path) -> None:
    """Issue #27: the three lines in the legend's colours (blue, amber, red: readable on GitHub's
    light and dark backgrounds), and eleven nights numbered instead of eleven overlapping dates."""
    entries = [TrendEntry(date=f"2026-11-{i + 1:02d}T03:00:00Z", event="gate", verdict="pass",
                          rows=[TrendRow(key="demo_capitals_mc/acc,none", value=0.935 - i / 200, baseline=0.935,
                                         anchor=0.935, margin=0.05)]) for i in range(11)]
    block = re.search(r"```mermaid\n(.*?)```", draw.markdown(entries), re.S)
    svg = _render(block.group(1), tmp_path)
    strokes = [re.search(r'stroke="([^"]+)"', m).group(1).lower()
               for m in re.findall(r'class="line-plot-\d"[^>]*>\s*<path[^>]*>', svg)]
    fills = set(re.findall(r'class="bar-plot-0"><rect[^>]*fill="([^"]+)"', svg))
    assert [*fills, *strokes] == [c.lower() for c in draw.PALETTE], (fills, strokes)
    assert "night, 2026-11-01 to 2026-11-11" in svg and "2026-11-05" not in svg
    assert len(_bars(svg)) == 11
