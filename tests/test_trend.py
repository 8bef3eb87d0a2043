"""The history beside the baseline (baseline/trend.py), its charts (report/trend.py), and the
anchor family's error rates by fixed-seed simulation (issue #15)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from gatekeeper.baseline import trend
from gatekeeper.compare.compare import compare_runs
from gatekeeper.errors import GateError
from gatekeeper.model import TrendEntry, TrendRow
from gatekeeper.report import trend as draw
from gatekeeper.suite.policy import Policy, Rule
from gatekeeper.suite.suite import load_suite
from tests.synthetic import fast_series, run

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def suite(tmp_path: Path):
    (tmp_path / ".git").mkdir()
    text = (ROOT / "examples" / "gatekeeper.yaml").read_text().replace("include_path: tasks\n", "")
    (tmp_path / "gatekeeper.yaml").write_text(text)
    (tmp_path / ".gatekeeper" / "baselines").mkdir(parents=True)
    return load_suite(tmp_path / "gatekeeper.yaml")


def _entry(day: int, value: float, *, anchor: float | None = None, event: str = "gate", hib: bool = True) -> TrendEntry:
    return TrendEntry(date=f"2026-11-{day:02d}T03:00:00Z", event=event, verdict="pass",
                      rows=[TrendRow(key="t/acc,none", value=value, baseline=value + 0.01, anchor=anchor,
                                     margin=0.02, higher_is_better=hib, verdict="unchanged")])


def test_history_keeps_the_newest_entries_and_summarises_the_rest(suite) -> None:
    base = suite.baseline_path
    for day in range(1, 6):
        kept = trend.append(base, _entry(day, 0.5 + day / 100), suite, keep=3)
    assert [e.date[:10] for e in kept] == ["2026-11-03", "2026-11-04", "2026-11-05"]
    entries, summary = trend.read_trend(base)
    assert entries == kept
    assert summary["entries"] == 2
    folded = summary["metrics"]["t/acc,none"]
    assert folded["entries"] == 2 and folded["min"] == pytest.approx(0.51) and folded["max"] == pytest.approx(0.52)
    assert folded["mean"] == pytest.approx(0.515) and folded["first"].startswith("2026-11-01")
    lines = trend.trend_path(base).read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[0])["format"] == "gatekeeper-trend"


@pytest.mark.parametrize("line, problem", [
    ("{not json", ":2: not JSON"),
    ('{"date": "x", "event": "gate", "verdict": "pass", "evil": 1}', ":2: unknown field 'evil'"),
    ('{"date": "x", "event": "gate", "verdict": "pass", "rows": [{"key": "k", "value": "NaN"}]}',
     ":2: rows[0].value is not a finite number"),
    ('{"date": "x", "event": "gate", "verdict": "pass", "rows": [{"key": "k", "value": true}]}',
     ":2: rows[0].value is not a finite number"),
    ('{"date": 5, "event": "gate", "verdict": "pass"}', ":2: date is missing or not a string"),
    ("[1, 2]", ":2: expected an object"),
    ('{"date": "x", "event": "gate", "verdict": "pass", "rows": [{"key": "k", "value": 0.5, "margin": NaN}]}',
     ":2: NaN is not a finite number; gatekeeper never writes one"),
    ('{"date": "x", "event": "gate", "verdict": "pass", "rows": [{"key": "k", "margin": 1e999}]}',
     ":2: rows[0].margin is not a finite number"),
])
def test_a_hostile_history_is_refused_naming_the_line(suite, line: str, problem: str) -> None:
    path = trend.trend_path(suite.baseline_path)
    path.write_text('{"format": "gatekeeper-trend", "version": 1, "summary": {}}\n' + line + "\n")
    with pytest.raises(GateError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        trend.read_trend(suite.baseline_path)
    with pytest.raises(GateError):  # and nothing is appended to it
        trend.append(suite.baseline_path, _entry(1, 0.5), suite)
    assert path.read_text().count("\n") == 2


def test_a_symlinked_or_foreign_history_is_refused(suite, tmp_path: Path) -> None:
    path = trend.trend_path(suite.baseline_path)
    path.write_text('{"format": "something-else"}\n')
    with pytest.raises(GateError, match="not a gatekeeper history"):
        trend.read_trend(suite.baseline_path)
    path.unlink()
    os.symlink(tmp_path / "elsewhere.jsonl", path)
    with pytest.raises(GateError, match="is a symlink"):
        trend.append(suite.baseline_path, _entry(1, 0.5), suite)
    assert not (tmp_path / "elsewhere.jsonl").exists()


def test_the_chart_draws_the_values_the_anchor_and_the_margin_edge() -> None:
    entries = [_entry(1, 0.90), _entry(2, 0.88, anchor=0.91), _entry(3, 0.86, anchor=0.91),
               _entry(3, 0.0, event="promote")]  # promotions are not points: the gate measured them
    chart = draw.mermaid(entries)
    assert chart.startswith(f"{draw.legend(True)}\n\n```mermaid\n%%{{init:") and chart.endswith("```")
    assert "\nxychart-beta\n" in chart
    plots = [line.strip() for line in chart.splitlines() if line.strip().startswith(("line [", "bar ["))]
    # issue #38: the values are bars, so a value equal to the anchor is not hidden under its line
    assert plots == ["bar [0.9, 0.88, 0.86]", "line [0.91, 0.91, 0.91]", "line [0.89, 0.89, 0.89]"]
    assert 'x-axis ["2026-11-01", "2026-11-02", "2026-11-03"]' in chart
    lower = draw.mermaid([_entry(1, 6.3, anchor=6.2, hib=False)])
    assert "bar [6.3]" in lower and "line [6.22]" in lower  # lower is better: the edge is above
    assert lower.startswith("bars (blue): each night's value · lower line (amber): the anchor · upper line (red)")
    assert draw.sparkline([0.9, 0.88, 0.86]) == "█▅▁"  # halfway is the 5th of 8 steps
    assert draw.sparkline([0.9, 0.9, 0.9]) == "▄▄▄"  # constant: mid-height, not "at the minimum"


def test_gates_in_one_minute_number_the_axis_and_the_legend_reads_without_colour() -> None:
    """Issue #38: eight gates in one minute gave eight overlapping "12-03 14:36 (k)" labels."""
    same = [dataclasses.replace(_entry(1, 0.9), date=f"2026-12-03T14:36:0{k}Z") for k in range(8)]
    assert 'x-axis "gate, 2026-12-03 to 2026-12-03" 1 --> 8' in draw.mermaid(same)
    two = [dataclasses.replace(_entry(1, 0.9), date=d) for d in ("2026-12-03T09:00:00Z", "2026-12-03T14:36:00Z")]
    assert 'x-axis ["12-03 09:00", "12-03 14:36"]' in draw.mermaid(two)
    text = draw.legend(True)
    assert "bars" in text and "upper line" in text and "lower line" in text and "🟨" not in text


def test_untrusted_text_cannot_break_out_of_a_chart_label() -> None:
    entry = _entry(1, 0.5)
    entry.rows[0].key = 't"\n```\n<script>/acc'
    chart = draw.mermaid([entry])
    assert chart.count("```") == 2 and "<script>" not in chart and '"t_ ___ _script_/acc"' in chart


# ----------------------------------------------------------------------------- simulation

N_ITEMS = 1000
POLICY = Policy(alpha=0.05, correction="holm", margin=0.0, resamples=1000,
                rules=[Rule(task="t", metric="*", margin=0.02)])


def _nights(rng: np.random.Generator, nights: int, p_break: float, p_fix: float, *, anchor: bool) -> str | None:
    """Nights of a model whose items break/fix at these rates, gated as the nightly does:
    promoted when it passes with nothing inconclusive. The first failing verdict, or None."""
    truth = (rng.random(N_ITEMS) < 0.7).astype(float)
    first = run(fast_series("t", truth))
    baseline = first
    for _ in range(nights):
        u = rng.random(N_ITEMS)
        truth = np.where(truth == 1, (u >= p_break).astype(float), (u < p_fix).astype(float))
        cand = run(fast_series("t", truth))
        out = compare_runs(baseline, cand, POLICY, anchor=first if anchor and baseline is not first else None)
        if out.verdict != "pass":
            return out.verdict
        if not out.inconclusive:
            baseline = cand
    return None


def test_false_alarms_over_30_harmless_nights_stay_at_alpha() -> None:
    """Harmless nights (items flip both ways at 2%) against the last night and the anchor, as one
    Holm family: the share of nights with a false alarm stays at alpha (0.05) within Monte-Carlo
    error, and the share of 30-night sequences with any false alarm is what 30 looks cost."""
    rng = np.random.default_rng(15)
    alarms = nights_total = 0
    for _ in range(60):
        verdict = _nights(rng, 30, 0.02, 0.02 * 0.7 / 0.3, anchor=True)
        alarms += verdict is not None
        nights_total += 30
    per_night = alarms / nights_total
    assert per_night <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / nights_total), per_night


def test_the_anchor_catches_a_steady_decline_the_nightly_baseline_misses() -> None:
    """Each night breaks 1.2% of right items and fixes 0.8% of wrong ones (~ -0.6 points a
    night against a 2-point margin): night over night it passes, the anchor fails it."""
    rng = np.random.default_rng(1515)
    caught_with = caught_without = 0
    runs = 40
    for _ in range(runs):
        state = rng.bit_generator.state
        caught_with += _nights(rng, 15, 0.012, 0.008, anchor=True) is not None
        rng.bit_generator.state = state  # the same nights, judged without an anchor
        caught_without += _nights(rng, 15, 0.012, 0.008, anchor=False) is not None
    assert caught_with / runs >= 0.9, (caught_with, caught_without)
    assert caught_without / runs <= 0.5, (caught_with, caught_without)


def test_a_deleted_anchor_the_history_remembers_is_an_error_and_a_broken_history_costs_no_verdict(
        tmp_path: Path) -> None:
    """Issue #27: deleting the anchor file must not turn a drift into a pass; a broken history
    line is said with its repair, and the gate's verdict (exit 1 here) still comes out."""
    import shutil
    import subprocess
    import sys

    (tmp_path / ".git").mkdir()
    shutil.copy(ROOT / "examples" / "gatekeeper.yaml", tmp_path / "gatekeeper.yaml")
    shutil.copytree(ROOT / "examples" / "tasks", tmp_path / "tasks", ignore=shutil.ignore_patterns("__pycache__"))
    suite = load_suite(tmp_path / "gatekeeper.yaml")
    baseline = suite.baseline_path
    baseline.parent.mkdir(parents=True)
    shutil.copy(ROOT / "examples" / ".gatekeeper" / "baselines" / "demo.json.gz", baseline)
    regressed = ROOT / "tests" / "fixtures" / "demo-regressed-run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def gate() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "gatekeeper", "gate", "--suite", str(suite.path), "--run",
                               str(regressed), "--json", str(tmp_path / "r.json")], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
    path = trend.trend_path(baseline)
    entry = {"date": "2026-11-01T00:00:00Z", "event": "pin", "verdict": "pinned", "baseline_id": "aaaaaaaaaaaa",
             "anchor_id": "bbbbbbbbbbbb", "rows": []}
    path.write_text(json.dumps({"format": "gatekeeper-trend", "version": 1, "summary": {}}) + "\n"
                    + json.dumps(entry) + "\n")
    proc = gate()
    assert proc.returncode == 2 and "demo.anchor.json.gz: missing, but the history" in proc.stderr, proc.stderr
    assert "records anchor bbbbbbbbbbbb" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    path.write_text(path.read_text() + "<<<<<<< HEAD\n")  # a merge conflict left in the file
    proc = gate()  # issue #38: the guard does not depend on the history parsing (it was a silent pass)
    assert proc.returncode == 2 and "records anchor bbbbbbbbbbbb (in its last readable entry" in proc.stderr, proc.stderr
    assert ":3: a git merge-conflict marker" in proc.stderr and "git checkout --" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    own = {**entry, "event": "promote", "anchor_id": "aaaaaaaaaaaa"}  # no anchor expected: the verdict comes out
    path.write_text(path.read_text() + json.dumps(own) + "\n")
    proc = gate()
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]  # the verdict, not an error
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verdict"] == "fail"
    (warning,) = [w for w in report["warnings"] if w.startswith("history not updated")]
    assert f"{path}:3: a git merge-conflict marker" in warning and "--no-history" in warning


def _git(cwd: Path, *args: str) -> None:
    import subprocess

    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True)


@pytest.mark.skipif(not shutil.which("git"), reason="needs git")
def test_tracked_gatekeeper_files_deleted_from_the_working_tree_never_pass_silently(tmp_path: Path) -> None:
    """Issue #38: with the anchor and its history both deleted nothing local remembers the anchor,
    but git does; a deleted baseline is never re-recorded as a first one."""
    import subprocess
    import sys

    shutil.copy(ROOT / "examples" / "gatekeeper.yaml", tmp_path / "gatekeeper.yaml")
    shutil.copytree(ROOT / "examples" / "tasks", tmp_path / "tasks", ignore=shutil.ignore_patterns("__pycache__"))
    baselines = tmp_path / ".gatekeeper" / "baselines"
    baselines.mkdir(parents=True)
    shutil.copy(ROOT / "examples" / ".gatekeeper" / "baselines" / "demo.json.gz", baselines / "demo.json.gz")
    shutil.copy(ROOT / "examples" / ".gatekeeper" / "baselines" / "demo.json.gz", baselines / "demo.anchor.json.gz")
    (baselines / "demo.trend.jsonl").write_text('{"format": "gatekeeper-trend", "version": 1, "summary": {}}\n')
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "suite")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def gate(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "gatekeeper", "gate", "--suite", "gatekeeper.yaml", "--run",
                               str(ROOT / "tests" / "fixtures" / "demo-regressed-run"), "--no-history", *extra],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert gate().returncode == 1  # a verdict
    (baselines / "demo.anchor.json.gz").unlink()
    (baselines / "demo.trend.jsonl").unlink()
    proc = gate()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "demo.anchor.json.gz and " in proc.stderr and "demo.trend.jsonl: deleted from the working tree but " \
        "tracked by git" in proc.stderr and "git checkout -- " in proc.stderr, proc.stderr
    _git(tmp_path, "rm", "-q", "--cached", ".gatekeeper/baselines/demo.anchor.json.gz",
         ".gatekeeper/baselines/demo.trend.jsonl")
    assert gate().returncode == 1  # removed on purpose: the baseline is its own anchor
    (baselines / "demo.json.gz").unlink()
    proc = gate()
    assert proc.returncode == 2 and "demo.json.gz: deleted from the working tree but tracked by git" in proc.stderr


def test_promoting_a_worse_run_says_what_got_worse_and_the_history_keeps_it(tmp_path: Path) -> None:
    """Issue #27: a person may promote a worse run on purpose, but never silently."""
    import shutil
    import subprocess
    import sys

    (tmp_path / ".git").mkdir()
    shutil.copy(ROOT / "examples" / "gatekeeper.yaml", tmp_path / "gatekeeper.yaml")
    shutil.copytree(ROOT / "examples" / "tasks", tmp_path / "tasks", ignore=shutil.ignore_patterns("__pycache__"))
    suite = load_suite(tmp_path / "gatekeeper.yaml")
    suite.baseline_path.parent.mkdir(parents=True)
    shutil.copy(ROOT / "examples" / ".gatekeeper" / "baselines" / "demo.json.gz", suite.baseline_path)
    proc = subprocess.run([sys.executable, "-m", "gatekeeper", "baseline", "promote",
                           str(ROOT / "tests" / "fixtures" / "demo-regressed-run"), "--suite", str(suite.path)],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "promote: this run is worse than the baseline it replaces: demo_mc acc -0.2024 (regressed); " \
           "demo_capitals_mc acc -0.4300 (regressed)" in proc.stdout, proc.stdout
    entries, _ = trend.read_trend(suite.baseline_path)
    rows = {r.key: r for r in entries[-1].rows}
    assert entries[-1].event == "promote" and rows["demo_capitals_mc/acc,none"].verdict == "regressed"
    assert rows["demo_capitals_mc/acc,none"].baseline == pytest.approx(0.935)
    assert rows["demo_mc/acc,none"].value == pytest.approx(0.7576470588, rel=1e-9)  # the group's row too


def test_the_pr_comment_trend_is_a_sparkline_per_gated_metric() -> None:
    """Issue #27: the PR comment carries the trend (a compact sparkline table) when history exists."""
    entries = [_entry(d, 0.90 - d / 100, anchor=0.90) for d in range(1, 8)]
    table = draw.compact(entries, ["t/acc,none"])
    assert table.startswith("#### Trend on the default branch (last 20 gates)")
    (row,) = [ln for ln in table.splitlines() if ln.startswith("| t/acc,none")]
    assert row == "| t/acc,none | █▇▆▄▃▂▁ | 0.83 | 0.9 |"
    assert draw.compact(entries, ["other/acc,none"]) == "" and draw.compact([], None) == ""


def test_long_histories_number_the_nights_and_every_chart_has_a_legend() -> None:
    entries = [_entry(d, 0.9) for d in range(1, 13)]
    text = draw.markdown(entries)
    assert 'x-axis "night, 2026-11-01 to 2026-11-12" 1 --> 12' in text
    assert draw.legend(True) in text
    assert '"plotColorPalette": "#2f81f7, #d4a72c, #e5534b"' in text
    short = draw.markdown(entries[:3])
    assert 'x-axis ["2026-11-01", "2026-11-02", "2026-11-03"]' in short


def test_a_drift_comment_shows_the_rows_that_decide_it_first() -> None:
    """Issue #38: the ❌ rows against the anchor sat under an all-✅ table against the promoted
    baseline; a skimmer saw green first."""
    from gatekeeper.report.markdown import render_markdown

    rng = np.random.default_rng(38)
    anchor_items = (rng.random(N_ITEMS) < 0.8).astype(float)
    now = np.where(rng.random(N_ITEMS) < 0.15, 0.0, anchor_items)  # 15% of the right items broke since
    baseline = run(fast_series("t", now))
    out = compare_runs(baseline, run(fast_series("t", now)), POLICY, anchor=run(fast_series("t", anchor_items)))
    assert out.verdict == "drift"
    text = render_markdown(out)
    at_anchor, at_baseline = text.index("**Against the anchor of"), text.index("**Against the baseline**")
    assert at_anchor < text.index("❌ regressed") < at_baseline and "✅ unchanged" in text[at_baseline:]
    assert text.index("\n|", at_anchor) < at_baseline  # the anchor's table, then the baseline's
