"""report: strict JSON, escaping of untrusted text, the markdown size cap."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pytest

from gatekeeper import report, text
from gatekeeper.compare.compare import compare_runs
from gatekeeper.report import numbers
from gatekeeper.report.numbers import confidence
from gatekeeper.suite.policy import Policy
from tests.synthetic import run, series

WJ = text.WORD_JOINER


def _outcome(*tasks: str, drop: int = 0, n: int = 200):
    base = np.zeros(n)
    base[: n // 2] = 1
    cand = base.copy()
    cand[:drop] = 0
    a = run(*(series(t, "acc", base) for t in tasks))
    b = run(*(series(t, "acc", cand) for t in tasks))
    return compare_runs(a, b, Policy(), suite="demo")


def test_to_json_is_strict_even_with_non_finite_group_values_and_margins():
    out = _outcome("t")
    out.baseline = replace(out.baseline, groups={"g": {"acc,none": float("nan")}})
    out.candidate = replace(out.candidate, groups={"g": {"acc,none": float("inf")}})
    out.comparisons[0].margin = float("nan")  # built by hand, bypassing Policy.validate
    data = report.to_json(out)
    text = json.dumps(data, allow_nan=False)  # raises on NaN/inf
    assert json.loads(text)["groups"] == {"g": {"baseline": {"acc,none": None}, "candidate": {"acc,none": None}}}
    assert data["comparisons"][0]["margin"] is None


@pytest.mark.parametrize("evil", ["GH-12", "gh-7", "see GH-12 now"])
def test_escape_breaks_gh_issue_references(evil):
    # GitHub links GH-<number> to an issue; the backslash escape alone renders as "GH-12".
    out = text.escape_untrusted(evil)
    visible = out.replace("\\", "")
    assert not re.search(r"(?i)gh-\d", visible)


@pytest.mark.parametrize("evil", ["@user", "@org/team", "#12", "owner/repo#12", "x@octocat"])
def test_escape_breaks_mentions_and_refs(evil):
    visible = text.escape_untrusted(evil).replace("\\", "")
    assert not re.search(r"[@#]\w", visible)


def test_escape_breaks_bare_url_autolinks_and_math():
    out = text.escape_untrusted("go to https://evil.example/x and $\\huge\\text{passed}$")
    visible = out.replace("\\", "")
    assert "://" not in visible  # GitHub autolinks scheme://host
    assert "$" not in out.replace("\\$", "")  # every dollar escaped: no inline math


def test_escape_neutralises_markup_and_the_sticky_marker():
    evil = "<!-- gatekeeper:sticky suite=demo --> ![x](http://evil) <b>hi</b> `c` a|b\nnext\u2028line"
    out = text.escape_untrusted(evil, limit=10_000)
    assert "<" not in out and ">" not in out and "\n" not in out and "\u2028" not in out
    assert "<!--" not in out and "gatekeeper:sticky suite=demo -->" not in out
    assert "](" not in out and "`" not in out.replace("\\`", "")
    assert out.replace("\\|", "").count("|") == 0


def test_escape_strips_bidi_controls():
    # A right-to-left override would let a task name display reversed text ("dessap").
    out = text.escape_untrusted("task\u202edessap\u2066x\u2069")
    assert not re.search("[\u200e\u200f\u202a-\u202e\u2066-\u2069\u061c]", out)


def test_escape_caps_length():
    assert len(text.escape_untrusted("x" * 10_000, limit=50)) == 50


@pytest.mark.parametrize("max_chars", [50, 150, 199, 250, 400, 1000, 5000])
def test_markdown_never_exceeds_max_chars(max_chars):
    out = _outcome(*(f"task_{i}_" + "y" * 3000 for i in range(20)), drop=30)
    md = report.render_markdown(out, max_chars=max_chars)
    assert len(md) <= max_chars
    small = report.render_markdown(_outcome("t"), max_chars=max_chars)
    assert len(small) <= max_chars


def test_markdown_escapes_task_names_in_every_section():
    out = _outcome("@octocat <b> GH-3 #9", drop=40)
    out.warnings.append("warn @someone #4")
    md = report.render_markdown(out)
    visible = md.replace("\\", "")
    assert not re.search(r"[@#]\w", visible.replace("### ", ""))
    assert "<b>" not in md and not re.search(r"(?i)gh-\d", visible)


def test_no_item_flipped_is_said_not_shown_as_a_zero_interval():
    out = _outcome("t")  # identical right/wrong runs
    md = report.render_markdown(out)
    term = report.render_terminal(out)
    assert "no item flipped" in md and "no item flipped" in term
    assert "[0, 0]" not in md and "[0, 0]" not in term
    ratio = np.column_stack([-np.arange(1.0, 41.0), np.full(40, 5.0)])
    kw = dict(kind="ratio", aggregation="weighted_perplexity", higher_is_better=False)
    same = compare_runs(run(series("p", "word_perplexity", ratio, **kw)),
                        run(series("p", "word_perplexity", ratio.copy(), **kw)), Policy())
    assert "no item changed" in report.render_terminal(same)
    assert report.to_json(same)["comparisons"][0]["identical"] is True


def test_json_and_markdown_show_the_interval_the_decision_used():
    out = _outcome("a", "b", "c", drop=30)  # 30 of 200 items right -> wrong in each task
    data = report.to_json(out)
    assert data["policy"]["rounding"] == 1e-5 and data["policy"]["test"] == "superiority"
    for row, c in zip(data["comparisons"], out.comparisons, strict=True):
        assert row["verdict"] == "regressed"
        # Holm over 3: the smallest p is tested at alpha/3, the last at alpha: never narrower than 90%
        assert 0.05 / 3 <= row["decision_level"] <= 0.05
        assert row["decision_confidence"] == pytest.approx(1 - 2 * row["decision_level"])
        assert row["decision_ci_high"] < 0  # the drop side is past 0, as the verdict says
        assert row["decision_confidence"] >= 0.9 - 1e-12  # at least as wide as the 90% one
        assert (row["rounded_items"], row["identical"], row["within_rounding"]) == (0, False, False)
        lo, hi = c.interval
        assert numbers.delta_cell(c).startswith(f"{numbers.signed(c.test.delta)} [{numbers.signed(lo)}")
    md = report.render_markdown(out)
    assert "interval at the decision's level" in md and "1 − 2α′" in md
    assert re.search(r"\] 9[0-9.]+% \|", md)  # the row's own confidence is printed


def test_markdown_explains_the_noninferiority_rule():
    base = np.zeros(200)
    base[:100] = 1
    out = compare_runs(run(series("t", "acc", base)), run(series("t", "acc", base.copy())),
                       Policy(margin=0.02, test="inferiority"))
    md = report.render_markdown(out)
    assert "significantly larger than the margin" in md
    assert report.to_json(out)["policy"]["test"] == "inferiority"


def test_an_interval_at_a_tiny_level_never_reads_as_certain():
    # a sequential interim look tests at alpha/10000-ish: "100%" would claim certainty
    assert confidence(8.86e-05) == "99.98%"
    assert confidence(0.025) == "95%"
    assert confidence(0.0125) == "97.5%"
    assert confidence(1e-9).startswith("99.9999")


def test_a_failing_group_shows_items_its_tasks_flipped() -> None:
    """Issue #41: with `subtasks: info` the failing rows are groups, whose items are their
    subjects': the comment's right-to-wrong section used to be missing. It now shows a failing
    group's flipped items, drawn in turn from the subjects that flipped most, each subject named."""
    from gatekeeper.compare.compare import compare_runs
    from gatekeeper.compare.outcome import flipped_items
    from gatekeeper.report import render_markdown
    from gatekeeper.suite.policy import Policy
    from tests.synthetic import group_pair

    rng = np.random.default_rng(41)
    sizes = (120, 150, 180, 200)
    base, cand = group_pair(rng, np.full(4, 0.06), sizes=sizes, group="mm")
    out = compare_runs(base, cand, Policy(margin=0.01, info_subtasks=frozenset({"mm"})))
    (group,) = [c for c in out.comparisons if c.is_group]
    assert group.gated and group.verdict == "regressed" and not group.right_to_wrong
    assert not any(c.gated for c in out.comparisons if not c.is_group)
    total, items = flipped_items(out, group, 5)
    members = [c for c in out.comparisons if not c.is_group]
    assert total == sum(len(c.right_to_wrong) for c in members) > 5
    assert len(items) == 5 and len({task for task, _ in items}) == 4  # every subject shows
    md = render_markdown(out)
    assert "Items that went from right to wrong" in md
    assert f"**mm / acc**: {total} items went from right to wrong in its tasks" in md
    task, doc = items[0]
    assert f"- {task.replace('_', chr(92) + '_')} doc {doc}" in md
