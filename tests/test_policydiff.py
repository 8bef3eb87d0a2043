"""policy_changes: what a pull request changes in the gate policy, as the reviewer reads it."""

from __future__ import annotations

from gatekeeper.model import SeriesKey
from gatekeeper.suite.policy import Policy, Rule
from gatekeeper.suite.policydiff import PolicyChange, policy_changes

ACC = SeriesKey("arith_mc", "none", "acc")
NORM = SeriesKey("arith_mc", "none", "acc_norm")
EM = SeriesKey("gen", "strict-match", "exact_match")
KEYS = [ACC, NORM, EM]


def base() -> Policy:
    return Policy(alpha=0.05, correction="holm", margin=0.02, resamples=10000,
                  rules=[Rule(task="arith_mc", metric="acc", margin=0.05), Rule(metric="acc_norm", gate=False)])


def described(head: Policy, keys=KEYS, parents=None) -> list[str]:
    return [c.describe() for c in policy_changes(base(), head, keys, parents)]


def test_no_change_is_no_change():
    assert policy_changes(base(), base(), KEYS) == []


def test_a_looser_margin_on_one_metric_is_named_with_both_values():
    head = base()
    head.rules[0] = Rule(task="arith_mc", metric="acc", margin=0.2)
    assert policy_changes(base(), head, KEYS) == [
        PolicyChange("arith_mc / none / acc", "loosened", "margin 0.05", "margin 0.2")
    ]


def test_a_tighter_default_margin_reaches_every_metric_that_uses_it():
    head = base()
    head.margin = 0.01
    assert described(head) == [
        "default margin: tightened (0.02 → 0.01)",
        "gen / strict-match / exact_match: tightened (margin 0.02 → margin 0.01)",
    ]  # acc has its own margin; acc_norm is not gated


def test_ungating_and_gating_metrics():
    head = base()
    head.rules = [Rule(task="arith_mc", metric="acc", gate=False), Rule(task="gen", gate=False)]
    assert described(head) == [
        "arith_mc / none / acc: no longer gated (informational)",
        "arith_mc / none / acc_norm: now gated",
        "gen / strict-match / exact_match: no longer gated (informational)",
    ]


def test_alpha_and_correction_directions():
    # A smaller alpha or a more conservative correction lets more drops pass: looser.
    head = base()
    head.alpha, head.correction = 0.01, "bonferroni"
    assert described(head) == ["alpha: loosened (0.05 → 0.01)", "correction: loosened (holm → bonferroni)"]
    head.alpha, head.correction = 0.1, "none"
    assert described(head) == ["alpha: tightened (0.05 → 0.1)", "correction: tightened (holm → none)"]


def test_group_rules_apply_through_parents():
    # A rule on the group `demo_mc` covers its subtask `capitals` (which has no rule of its own).
    capitals = SeriesKey("capitals", "none", "acc")
    head = base()
    head.rules = [Rule(task="demo_mc", metric="acc", margin=0.3), *base().rules]
    assert described(head, [capitals], {"capitals": ("demo_mc",)}) == [
        "capitals / none / acc: loosened (margin 0.02 → margin 0.3)"
    ]
    assert described(head, [capitals]) == ["rules: changed (2 rules → 3 rules)"]  # not in the group: no effect


def test_rule_edits_without_effect_on_known_series_are_still_reported():
    head = base()
    head.rules = [*base().rules, Rule(task="other_task", margin=1.0)]
    assert described(head) == ["rules: changed (2 rules → 3 rules)"]
    assert described(head, keys=[]) == ["rules: changed (2 rules → 3 rules)"]


def test_resamples_change_is_listed_as_neutral():
    head = base()
    head.resamples = 2000
    assert described(head) == ["resamples: changed (10000 → 2000)"]
