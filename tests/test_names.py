"""names.py: every name in the suite or policy must match something the run produces.

Pure tests on small suites written to tmp files (for the file:line in messages); the runs'
side is a ``Produced`` as lm-eval's built tasks or a loaded run give it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gatekeeper.errors import GateError
from gatekeeper.suite import names
from gatekeeper.suite.names import Produced
from gatekeeper.suite.policy import Policy, Rule
from gatekeeper.suite.suite import load_suite

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# What the demo suite's tasks produce (as run.tasks.task_plan reports it for examples/).
DEMO = Produced(
    leaves={
        "demo_arith_mc": {("none", "acc"): "mean", ("none", "acc_norm"): "mean"},
        "demo_capitals_mc": {("none", "acc"): "mean", ("none", "acc_norm"): "mean"},
        "demo_arith_gen": {("strict-match", "exact_match"): "mean", ("flexible-extract", "exact_match"): "mean"},
        "demo_synth_ppl": {("none", "word_perplexity"): "weighted_perplexity",
                           ("none", "byte_perplexity"): "weighted_perplexity",
                           ("none", "bits_per_byte"): "bits_per_byte"},
    },
    groups={"demo_mc": ["demo_arith_mc", "demo_capitals_mc"]},
)


def _suite(tmp_path: Path, old: str, new: str):
    """The demo suite with one piece of text replaced (include_path kept valid)."""
    text = (EXAMPLES / "gatekeeper.yaml").read_text()
    assert old in text
    (tmp_path / "tasks").mkdir(exist_ok=True)
    path = tmp_path / "gatekeeper.yaml"
    path.write_text(text.replace(old, new))
    return load_suite(path), path.read_text().splitlines()


def _problems(suite) -> list[str]:
    return names.unmatched(names.suite_entries(suite), DEMO)


def test_the_demo_suite_matches_its_tasks():
    suite = load_suite(EXAMPLES / "gatekeeper.yaml")
    assert _problems(suite) == []
    names.check_suite(suite, DEMO)  # no raise


def test_metric_typo_names_file_line_and_did_you_mean(tmp_path):
    suite, lines = _suite(tmp_path, "{metric: acc, filter: none, margin: 0.02}",
                          "{metric: accuracy, filter: none, margin: 0.02}")
    [msg] = _problems(suite)
    line = next(i for i, ln in enumerate(lines, 1) if "accuracy" in ln)
    assert msg.startswith(f"{tmp_path / 'gatekeeper.yaml'}:{line}: tasks[0].metrics[0]: metric 'accuracy'")
    assert "did you mean" in msg and "'acc'" in msg


def test_filter_typo_is_an_error_too(tmp_path):
    suite, _ = _suite(tmp_path, "{metric: word_perplexity, filter: none, margin: 0.1}",
                      "{metric: word_perplexity, filter: nnone, margin: 0.1}")
    [msg] = _problems(suite)
    assert "tasks[2].metrics[0]: filter 'nnone'" in msg and "did you mean 'none'?" in msg


def test_filter_of_another_metric_does_not_count(tmp_path):
    # strict-match exists in the task, but not for word_perplexity's task: pairs, not names, match.
    suite, _ = _suite(tmp_path, "{metric: word_perplexity, filter: none, margin: 0.1}",
                      "{metric: word_perplexity, filter: strict-match, margin: 0.1}")
    [msg] = _problems(suite)
    assert "filter 'strict-match'" in msg


@pytest.mark.parametrize("rule, needle", [
    ("{task: demo_mcc, margin: 0.1}", "task 'demo_mcc' matches no task or group of the run; did you mean 'demo_mc'?"),
    ("{task: 'demo_*', metric: word_perplexty}", "metric 'word_perplexty'"),
    ("{task: demo_synth_ppl, filter: nnone}", "filter 'nnone'"),
    ("{task: 'nothing_*'}", "task 'nothing_*'"),
])
def test_policy_rule_typos(tmp_path, rule, needle):
    suite, lines = _suite(tmp_path, "resamples: 10000", f"resamples: 10000\n  rules:\n    - {rule}")
    [msg] = _problems(suite)
    line = next(i for i, ln in enumerate(lines, 1) if rule in ln)
    assert msg.startswith(f"{tmp_path / 'gatekeeper.yaml'}:{line}: policy.rules[0]: ")
    assert needle in msg


def test_group_rules_and_globs_that_match_pass(tmp_path):
    suite, _ = _suite(tmp_path, "resamples: 10000",
                      "resamples: 10000\n  rules:\n    - {task: demo_mc, metric: acc_norm, margin: 0.1}\n"
                      "    - {task: '*_mc', metric: 'acc*'}\n    - {metric: bits_per_byte, gate: false}")
    assert _problems(suite) == []


def test_group_entry_typo_in_tasks_metrics(tmp_path):
    # The suite's group entry (demo_mc) has metrics; its leaves produce acc and acc_norm only.
    suite, _ = _suite(tmp_path, "{metric: acc_norm, gate: false}", "{metric: acc_nrom, gate: false}")
    [msg] = _problems(suite)
    assert "tasks[0].metrics[1]: metric 'acc_nrom' matches no metric of the 2 tasks of 'demo_mc'" in msg
    assert "did you mean 'acc_norm'?" in msg


def test_a_suite_task_the_run_lacks_is_named():
    suite = load_suite(EXAMPLES / "gatekeeper.yaml")
    partial = Produced({k: v for k, v in DEMO.leaves.items() if k != "demo_synth_ppl"}, DEMO.groups)
    msgs = names.unmatched(names.suite_entries(suite), partial)
    assert msgs and all("task 'demo_synth_ppl' is no task or group of the run" in m for m in msgs)


def test_every_problem_is_reported_at_once(tmp_path):
    suite, _ = _suite(tmp_path, "resamples: 10000",
                      "resamples: 10000\n  rules:\n    - {task: demo_mcc}\n    - {metric: exact_mach}")
    with pytest.raises(GateError) as err:
        names.check_suite(suite, DEMO)
    assert len(str(err.value).splitlines()) == 2


def test_gated_untestable_aggregation_names_it():
    suite = load_suite(EXAMPLES / "gatekeeper.yaml")
    produced = Produced({**DEMO.leaves, "demo_synth_ppl": {("none", "word_perplexity"): "bypass",
                                                           ("none", "byte_perplexity"): "weighted_perplexity",
                                                           ("none", "bits_per_byte"): "bits_per_byte"}},
                        DEMO.groups)
    with pytest.raises(GateError, match=r"word_perplexity,none is gated but its aggregation 'bypass' cannot be tested"):
        names.check_suite(suite, produced)
    # A task's own !function aggregation is testable with the suite (its trusted code).
    produced.leaves["demo_synth_ppl"][("none", "word_perplexity")] = "!function agg_inst_level_acc"
    names.check_suite(suite, produced)
    # byte_perplexity is informational in the suite: an untestable aggregation there is fine.
    produced.leaves["demo_synth_ppl"] = {("none", "word_perplexity"): "weighted_perplexity",
                                         ("none", "byte_perplexity"): "bypass",
                                         ("none", "bits_per_byte"): "bits_per_byte"}
    names.check_suite(suite, produced)


def test_plain_policy_rules_must_match_the_runs():
    policy = Policy(rules=[Rule(metric="acc_norm", gate=False), Rule(task="demo_arith_gen", filter="stict-match")])
    with pytest.raises(GateError) as err:
        names.check_policy(policy, "policy.yaml", DEMO)
    assert str(err.value) == ("policy.yaml: rules[1]: filter 'stict-match' matches no filter of metric '*' of task "
                              "'demo_arith_gen' in the runs; did you mean 'strict-match'?")


def test_no_close_name_lists_the_known_ones():
    policy = Policy(rules=[Rule(task="demo_arith_gen", metric="accuracy")])
    [msg] = names.unmatched(names.policy_entries(policy, "p.yaml"), DEMO)
    assert "did you mean one of 'exact_match'?" in msg


def test_nested_groups_expand_to_their_leaves():
    produced = Produced({"a": {("none", "acc"): "mean"}, "b": {("none", "f1"): "mean"}},
                        {"outer": ["inner", "b"], "inner": ["a"]})
    assert produced.leaves_under("outer") == ["a", "b"]
    assert produced.parents("a") == ("inner", "outer")  # nearest first: a rule for outer applies to a too


def test_union_of_two_runs():
    a = Produced({"t": {("none", "acc"): "mean"}}, {"g": ["t"]})
    b = Produced({"t": {("none", "f1"): "mean"}, "u": {}}, {"g": ["u"]})
    u = names.union(a, b)
    assert set(u.leaves["t"]) == {("none", "acc"), ("none", "f1")} and u.groups == {"g": ["t", "u"]}


def test_suite_read_from_other_text_gets_no_line_numbers(tmp_path):
    # A suite loaded from a PR base commit's text: the file on disk differs, so no (wrong) lines.
    from gatekeeper.suite.suite import load_suite_text

    text = (EXAMPLES / "gatekeeper.yaml").read_text().replace("{metric: acc, filter: none", "{metric: acx, filter: none")
    suite = load_suite_text(text, EXAMPLES / "gatekeeper.yaml")
    [msg] = _problems(suite)
    assert msg.startswith(f"{EXAMPLES / 'gatekeeper.yaml'}: tasks[0].metrics[0]: metric 'acx'")
