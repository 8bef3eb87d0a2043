"""Every name in the suite must match something the run produces.

A metric, filter or task named in the suite (``tasks[i].metrics[j]``, ``policy.rules[k]``, a
group's entry) that matches nothing would make its rule dead: the metric it meant to gate
falls back to another rule (often "informational"), and a real drop passes with exit 0. So a
name that matches nothing is an error with a "did you mean", checked twice:

- before the evaluation, from lm-eval's built Task objects (``runner`` turns them into
  ``Produced``): metric_list and filter_list are known once the tasks are built;
- after it, from the ``RunResults`` that will be compared (``from_run``).

Pure: no lm-eval, no I/O except reading the suite file again for line numbers.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gatekeeper.errors import GateError
from gatekeeper.model import RunResults, SeriesKey, ancestors
from gatekeeper.results.metrics import kind_for, known_aggregations
from gatekeeper.results.trusted import PREFIX as FUNCTION_PREFIX
from gatekeeper.suite.policy import Policy, Rule
from gatekeeper.suite.suite import Suite, fill_defaults, suite_hash
from gatekeeper.yamlsafe import line_of, load_yaml_bounded, path_str, read_bounded

# Whether gatekeeper has a paired test for an aggregation is decided by gatekeeper.results.metrics.kind_for.
_GLOB = set("*?[")


@dataclass
class Produced:
    """What a run produces (or will produce): per leaf task its (filter, metric) pairs and each
    pair's aggregation name; per group its direct children (lm-eval's ``group_subtasks``)."""

    leaves: dict[str, dict[tuple[str, str], str]]
    groups: dict[str, list[str]] = field(default_factory=dict)

    def parents(self, task: str) -> tuple[str, ...]:
        # The same rule as RunResults.parents: the groups that hold the task, nearest first.
        return ancestors(self.groups, task)

    def leaves_under(self, name: str) -> list[str]:
        """The leaf tasks a suite task entry stands for: itself, or a group's leaves (nested too)."""
        if name in self.leaves:
            return [name]
        out: list[str] = []
        for child in self.groups.get(name, []):
            if child != name:
                out.extend(t for t in self.leaves_under(child) if t not in out)
        return out


@dataclass
class RunPlan:
    """What a run will be, known once lm-eval has built the tasks and before it evaluates."""

    produced: Produced
    versions: dict[str, Any]  # leaf task -> lm-eval task version
    n_shot: dict[str, int]  # leaf task -> num_fewshot (None read as 0, as lm-eval writes it)
    n_samples: dict[str, dict[str, int]]  # leaf task -> {"original": N, "effective": n}
    task_files: dict[str, str] = field(default_factory=dict)  # suite.taskcode: the task code's identity


@dataclass(frozen=True)
class Entry:
    """One name-bearing entry of the suite or policy, and where it is written."""

    where: str  # "gatekeeper.yaml:27: tasks[0].metrics[1]" or "policy.yaml: rules[2]"
    task: str
    filter: str
    metric: str
    exact_task: bool  # a tasks[i].metrics entry names its task exactly; rules may use globs


def from_run(run: RunResults) -> Produced:
    """The names a loaded run holds: its testable series and the metrics it could not test."""
    leaves: dict[str, dict[tuple[str, str], str]] = {}
    for key, s in run.series.items():
        leaves.setdefault(key.task, {})[(key.filter, key.metric)] = s.aggregation
    for key, agg in run.untestable.items():
        leaves.setdefault(key.task, {})[(key.filter, key.metric)] = agg
    return Produced(leaves, {g: list(subs) for g, subs in run.group_subtasks.items()})


def union(*runs: Produced) -> Produced:
    """Everything any of ``runs`` produces (a policy rule must match something in one of them)."""
    leaves: dict[str, dict[tuple[str, str], str]] = {}
    groups: dict[str, list[str]] = {}
    for p in runs:
        for task, pairs in p.leaves.items():
            leaves.setdefault(task, {}).update(pairs)
        for g, subs in p.groups.items():
            groups.setdefault(g, [])
            groups[g] += [s for s in subs if s not in groups[g]]
    return Produced(leaves, groups)


def suite_entries(suite: Suite) -> list[Entry]:
    """Every tasks[i].metrics[j] and policy.rules[k] entry of a suite, with file:line."""
    root = _yaml_root(suite)
    out: list[Entry] = []
    for i, spec in enumerate(suite.tasks):
        for j, m in enumerate(spec.metrics or []):
            where = _where(suite.path, root, ("tasks", i, "metrics", j))
            out.append(Entry(where, spec.name, str(m.get("filter", "*")), str(m["metric"]), True))
    for k, rule in enumerate(_policy_rules(suite)):
        where = _where(suite.path, root, ("policy", "rules", k))
        out.append(Entry(where, rule.task, rule.filter, rule.metric, False))
    return out


def policy_entries(policy: Policy, source: str) -> list[Entry]:
    """The rules of a plain policy file (``compare --policy policy.yaml``)."""
    return [Entry(f"{source}: rules[{k}]", r.task, r.filter, r.metric, False) for k, r in enumerate(policy.rules)]


def unmatched(entries: Iterable[Entry], produced: Produced, what: str = "the run") -> list[str]:
    """One message per entry that matches nothing in ``produced``; empty when all match."""
    return [msg for e in entries if (msg := _check_entry(e, produced, what))]


def check_suite(suite: Suite, produced: Produced, *, what: str = "the run",
                policy: Policy | None = None) -> None:
    """Raise GateError listing every suite name that matches nothing, and every gated metric
    whose aggregation gatekeeper cannot test."""
    problems = unmatched(suite_entries(suite), produced, what)
    problems += untestable_gated(produced, policy or suite.policy, str(suite.path))
    if problems:
        raise GateError("\n".join(problems))


def check_policy(policy: Policy, source: str, produced: Produced, *, what: str = "the runs") -> None:
    problems = unmatched(policy_entries(policy, source), produced, what)
    if problems:
        raise GateError("\n".join(problems))


def untestable_gated(produced: Produced, policy: Policy, source: str) -> list[str]:
    """A gated metric that cannot be tested would silently pass: one message per metric."""
    out = []
    for task in sorted(produced.leaves):
        for (filt, metric), agg in sorted(produced.leaves[task].items()):
            # A task's own !function aggregation is testable with the suite: its include_path (or
            # lm-eval's bundled tasks) is the trusted code the run loads it from. Should that
            # code not provide it after all, compare refuses the gated metric.
            if kind_for(agg) is not None or agg.startswith(FUNCTION_PREFIX):
                continue
            key = SeriesKey(task, filt, metric)
            if policy.lookup(key, produced.parents(task))[1]:
                out.append(
                    f"{source}: {key} is gated but its aggregation {agg!r} cannot be tested by gatekeeper "
                    f"(it tests {', '.join(known_aggregations())}); mark it informational "
                    f"(metrics: [{{metric: {metric}, gate: false}}]) or drop it from the suite"
                )
    return out


# ----------------------------------------------------------------------------- matching


def _check_entry(e: Entry, produced: Produced, what: str) -> str | None:
    if e.exact_task:
        tasks = produced.leaves_under(e.task)
        if not tasks:
            names = sorted({*produced.leaves, *produced.groups})
            return f"{e.where}: task {e.task!r} is no task or group of {what}{_hint(e.task, names)}"
    else:
        tasks = [t for t in produced.leaves
                 if any(fnmatch.fnmatchcase(n, e.task) for n in (t, *produced.parents(t)))]
        if not tasks:
            names = sorted({*produced.leaves, *produced.groups})
            return f"{e.where}: task {e.task!r} matches no task or group of {what}{_hint(e.task, names)}"
    pairs = {p for t in tasks for p in produced.leaves[t]}
    scope = f"task {e.task!r}" if len(tasks) == 1 and tasks[0] == e.task else f"{_plural(tasks)} of {e.task!r}"
    metrics = sorted({m for _, m in pairs})
    if not any(fnmatch.fnmatchcase(m, e.metric) for m in metrics):
        return f"{e.where}: metric {e.metric!r} matches no metric of {scope} in {what}{_hint(e.metric, metrics)}"
    filters = sorted({f for f, m in pairs if fnmatch.fnmatchcase(m, e.metric)})
    if not any(fnmatch.fnmatchcase(f, e.filter) for f in filters):
        return (f"{e.where}: filter {e.filter!r} matches no filter of metric {e.metric!r} of {scope} "
                f"in {what}{_hint(e.filter, filters)}")
    return None


def _hint(name: str, known: list[str]) -> str:
    if not known:
        return " (it produces none)"
    probe = name if not (_GLOB & set(name)) else name.replace("*", "").replace("?", "")
    close = difflib.get_close_matches(probe, known, n=1, cutoff=0.5)
    if close:
        return f"; did you mean {close[0]!r}?"
    shown = ", ".join(repr(k) for k in known[:8]) + (", ..." if len(known) > 8 else "")
    return f"; did you mean one of {shown}?"


def _plural(tasks: list[str]) -> str:
    return f"task {tasks[0]!r}" if len(tasks) == 1 else f"the {len(tasks)} tasks"


# ----------------------------------------------------------------------------- suite file


def _policy_rules(suite: Suite) -> list[Rule]:
    """The suite's own ``policy.rules``: suite.policy lists each tasks[i].metrics entry first,
    then one closing informational rule per task with metrics, then policy.rules."""
    derived = sum(len(t.metrics) + 1 for t in suite.tasks if t.metrics)
    return list(suite.policy.rules[derived:])


def _yaml_root(suite: Suite) -> Any:
    """The suite file's YAML node tree, for line numbers; None when the file on disk is not
    the text this suite was loaded from (e.g. a suite read from a PR's base commit)."""
    try:
        data, root = load_yaml_bounded(read_bounded(Path(suite.path)))  # the file may not be the text loaded: bound it too
        if not isinstance(data, dict) or suite_hash(data) != suite.hash:
            return None
        doc = fill_defaults(data)  # the hash leaves out metrics and rules: compare them too
        if [t["metrics"] or [] for t in doc["tasks"]] != [t.metrics for t in suite.tasks]:
            return None
        rules = [(r["task"], r["filter"], r["metric"]) for r in doc["policy"]["rules"]]
        if rules != [(r.task, r.filter, r.metric) for r in _policy_rules(suite)]:
            return None
        return root
    except (OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        return None


def _where(path: Path, root: Any, where: tuple) -> str:
    line = f":{line_of(root, where)}" if root is not None else ""
    return f"{path}{line}: {path_str(where)}"
