"""What a pull request changes in the suite and its gate policy, for the reviewer (pure, no I/O).

A pull request is gated with its base commit's policy; the changes it makes to margins,
gating, alpha or the correction take effect only once merged, so the comment lists them.
"Loosened" means the gate becomes easier to pass (fewer regressions flagged), "tightened" harder.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gatekeeper.model import SeriesKey
from gatekeeper.suite.policy import Policy
from gatekeeper.suite.suite import fill_defaults
from gatekeeper.text import redact_url, short

# How readily each correction flags a regression, least first: moving right tightens the gate
# (Holm is uniformly more powerful than Bonferroni, Benjamini-Hochberg more than Holm).
_CORRECTION_ORDER = ("bonferroni", "holm", "bh", "none")


@dataclass(frozen=True)
class PolicyChange:
    what: str  # "alpha", "correction", "default margin", "resamples", "rules" or "task / filter / metric"
    change: str  # loosened | tightened | ungated | gated | changed
    before: str
    after: str

    def describe(self) -> str:
        if self.change in ("ungated", "gated"):
            verb = "no longer gated (informational)" if self.change == "ungated" else "now gated"
            return f"{self.what}: {verb}"
        return f"{self.what}: {self.change} ({self.before} → {self.after})"


def _direction(before: float, after: float, *, looser_when_higher: bool) -> str:
    return "loosened" if (after > before) == looser_when_higher else "tightened"


def _global_changes(base: Policy, head: Policy) -> list[PolicyChange]:
    out = []
    if head.alpha != base.alpha:  # a smaller alpha needs stronger evidence: looser gate
        out.append(PolicyChange("alpha", _direction(base.alpha, head.alpha, looser_when_higher=False),
                                f"{base.alpha:g}", f"{head.alpha:g}"))
    if head.correction != base.correction:
        rank = {name: i for i, name in enumerate(_CORRECTION_ORDER)}
        before, after = rank.get(base.correction, 0), rank.get(head.correction, 0)
        out.append(PolicyChange("correction", "tightened" if after > before else "loosened",
                                base.correction, head.correction))
    if head.group_share != base.group_share:
        out.append(PolicyChange("group_share", "changed", f"{base.group_share:g}", f"{head.group_share:g}"))
    if head.margin != base.margin:
        out.append(PolicyChange("default margin", _direction(base.margin, head.margin, looser_when_higher=True),
                                f"{base.margin:g}", f"{head.margin:g}"))
    if head.resamples != base.resamples:
        out.append(PolicyChange("resamples", "changed", str(base.resamples), str(head.resamples)))
    return out


def _key_change(key: SeriesKey, base: Policy, head: Policy, parents: tuple[str, ...]) -> PolicyChange | None:
    (m0, g0), (m1, g1) = base.lookup(key, parents), head.lookup(key, parents)
    name = f"{key.task} / {key.filter} / {key.metric}"
    if g0 and not g1:
        return PolicyChange(name, "ungated", "gated", "informational")
    if g1 and not g0:
        return PolicyChange(name, "gated", "informational", "gated")
    if g0 and m0 != m1:
        return PolicyChange(name, _direction(m0, m1, looser_when_higher=True), f"margin {m0:g}", f"margin {m1:g}")
    return None


def policy_changes(
    base: Policy,
    head: Policy,
    keys: Iterable[SeriesKey] = (),
    parents: Mapping[str, tuple[str, ...]] | None = None,
) -> list[PolicyChange]:
    """Changes from ``base`` to ``head``: alpha, correction, default margin, resamples, then the
    effective margin / gating of every series in ``keys`` (``parents``: task → its groups).
    Rule edits that change no listed series are reported once as "rules changed"."""
    parents = parents or {}
    out = _global_changes(base, head)
    for key in sorted(set(keys), key=lambda k: (k.task, k.filter, k.metric)):
        change = _key_change(key, base, head, tuple(parents.get(key.task, ())))
        if change is not None:
            out.append(change)
    per_key = any(c.what not in ("alpha", "correction", "group_share", "default margin", "resamples") for c in out)
    if head.rules != base.rules and not per_key:
        out.append(PolicyChange("rules", "changed", f"{len(base.rules)} rules", f"{len(head.rules)} rules"))
    return out


def suite_key_changes(base: dict[str, Any], head: dict[str, Any]) -> list[str]:
    """Every key a pull request changes in the suite document besides the policy (listed by
    ``policy_changes``): what it measures (tasks, n-shot, limits, model settings, the endpoint),
    how items are grouped (``cluster``), where files are. Both documents are filled with the
    defaults; tasks are named, not numbered, and a task added or removed is one line. Values
    that are URLs show no credentials."""
    b, h = fill_defaults(base), fill_defaults(head)
    b_tasks, h_tasks = _tasks(b), _tasks(h)
    out = [f"tasks[{name}]: {'added' if name in h_tasks else 'removed'}"
           for name in sorted(set(b_tasks) ^ set(h_tasks))]
    flat_b = _flat({**_top(b), "tasks": {n: t for n, t in b_tasks.items() if n in h_tasks}})
    flat_h = _flat({**_top(h), "tasks": {n: t for n, t in h_tasks.items() if n in b_tasks}})
    for key in sorted(set(flat_b) | set(flat_h)):
        if flat_b.get(key, _ABSENT) != flat_h.get(key, _ABSENT):
            out.append(f"{key}: {_show(flat_b.get(key, _ABSENT))} → {_show(flat_h.get(key, _ABSENT))}")
    return out


_ABSENT = object()


def _top(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in ("policy", "tasks")}


def _tasks(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: {k: v for k, v in t.items() if k not in ("name", "metrics")} for t in doc["tasks"]}


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            name = f"{prefix}[{k}]" if prefix == "tasks" else (f"{prefix}.{k}" if prefix else str(k))
            out.update(_flat(v, name))
        return out
    return {prefix: value}


def _show(value: Any) -> str:
    if value is _ABSENT:
        return "absent"
    if isinstance(value, str):
        return short(redact_url(value), 80)
    return short(value, 80)
