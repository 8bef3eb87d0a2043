"""Orchestration: ``gatekeeper gate`` and the other commands that wire the stages together.

``gate`` runs the pinned suite, compares with the stored baseline and decides; ``record_run``
and ``promote_run`` store a run as the baseline once it is shown to belong to the suite. This
module only calls the stages (suite, run, results, compare, baseline, report); the checks
themselves live in them.

No baseline is never a pass: without one the gate stops with exit 2 before evaluating, unless
the caller explicitly asks to record the first baseline (``record_missing``, the CLI's
``--record-missing``, the action's ``bootstrap`` input, never on a pull request).

One path: ``gate``, ``compare --suite`` and the action's compare command all end in
``compare_for_suite``: both runs must belong to the suite (suite hash, task set, lm-eval pin,
n-shot, seeds, limit, chat template), every name in the suite must match something the
candidate produced, then the comparison and the report snippets.

What can be known before lm-eval evaluates (the suite, the stored baseline's provenance, the
built tasks) is checked before it starts (``check_baseline_before``); item and prompt hashes
after (``compat.check_compatible``, inside ``compare_runs``).
"""

from __future__ import annotations

import dataclasses
import math
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gatekeeper import report
from gatekeeper.baseline import anchor as anchors
from gatekeeper.baseline import gitbase, store, trend
from gatekeeper.compare import margins, sequential
from gatekeeper.compare import plan as plans
from gatekeeper.compare.compare import attach_snippets, compare_runs, merge_repeats
from gatekeeper.compare.compat import (
    check_baseline_before,
    check_items_before,
    check_repeats,
    check_run_matches_suite,
    check_suite_hash,
    compatibility_errors,
    dataset_moves,
)
from gatekeeper.compare.outcome import Outcome
from gatekeeper.compare.stats.weighted import MIN_FLIPS, informed_share, until_informed
from gatekeeper.errors import GateError
from gatekeeper.files import portable_path
from gatekeeper.model import RunResults, TrendEntry
from gatekeeper.results import informative, subset
from gatekeeper.results.reader import load_run
from gatekeeper.results.trusted import trusted_code
from gatekeeper.run import complete, merge, mutants, pins, runner
from gatekeeper.run.looks import Look, chunk, samples
from gatekeeper.suite import names
from gatekeeper.suite.names import RunPlan
from gatekeeper.suite.policy import Policy
from gatekeeper.suite.suite import Suite, load_suite


@dataclass
class GateResult:
    exit_code: int  # 0 pass / 1 regression
    outcome: Outcome | None  # None when this run became the first baseline
    notice: str | None
    run_dir: Path | None
    report_json: dict[str, Any] = field(default_factory=dict)
    # The suite's history with this gate appended (``history=True``), oldest first.
    trend: list[TrendEntry] = field(default_factory=list)


def run_gate(
    suite_path: str | Path,
    model: str,
    *,
    out_dir: str | Path,
    baseline: str | Path | None = None,
    policy: Policy | None = None,
    record_missing: bool = False,
    revision: str | None = None,
    device: str | None = None,
    log: Callable[[str], Any] = print,
    history: bool = False,
    commit: str | None = None,
    batch_size: int | str | None = None,
) -> GateResult:
    """Evaluate ``model`` on the suite and compare with the stored baseline and its anchor.
    ``history``: append this gate to the suite's history (``baseline/trend.py``), ``commit``
    naming the evaluated commit there."""
    suite = load_suite(suite_path)
    baseline_path = Path(baseline) if baseline else suite.baseline_path
    if baseline_path.exists() and not baseline_path.is_file():
        raise GateError(f"{baseline_path}: baseline path is a directory, expected a .json.gz file")
    check_baseline_path(baseline_path, record_missing=record_missing)
    stored, anchor, preflight = _reference(suite, baseline_path, policy)
    run_dir = runner.run_suite(suite, model, Path(out_dir), revision=revision, device=device, log=log,
                               preflight=preflight, batch_size=batch_size, lock=dataset_lock(stored),
                               items_check=items_checker(stored))
    if stored is None:
        written = record_run(run_dir, suite, path=baseline_path)
        notice = (
            f"No baseline yet: recorded this run as the first baseline ({written}). "
            "Commit it so later runs are compared against it."
        )
        return GateResult(0, None, notice, run_dir, {"verdict": "pass", "notice": notice, "comparisons": []})
    with trusted_code(suite.include_path, tuple(suite.task_names)):
        candidate = load_run(run_dir, cluster_keys=suite.cluster_keys())
    outcome = compare_for_suite(stored, candidate, suite, policy, anchor=anchor,
                                plan=_plan(suite, stored, baseline_path, policy or suite.policy))
    kept = _append_history(baseline_path, outcome, suite, commit, None, inside=baseline is None) if history else []
    return GateResult(outcome.exit_code, outcome, None, run_dir, report.to_json(outcome), kept)


def check_baseline_path(baseline_path: Path, *, record_missing: bool = False, looks: int = 0) -> None:
    """The gate's baseline file exists (or may be recorded, ``record_missing``), else GateError:
    a typo in --baseline or a baseline missing in CI must not turn the candidate into the
    reference it is judged against."""
    check_not_deleted(baseline_path)
    if baseline_path.exists() and not baseline_path.is_file():
        raise GateError(f"{baseline_path}: baseline path is a directory, expected a .json.gz file")
    if baseline_path.exists():
        return
    if looks:
        raise GateError(f"{baseline_path}: no baseline file; a sequential gate compares with one (record it first: "
                        "gatekeeper baseline record RUN_DIR --suite ...)")
    if not record_missing:
        raise GateError(f"{baseline_path}: no baseline file; record one on purpose with "
                        "`gatekeeper gate --record-missing ...` (or `gatekeeper baseline record RUN_DIR --suite ...`)")


def dataset_lock(stored: RunResults | None) -> dict[str, str]:
    """The hub dataset commits ``stored`` (a baseline) was evaluated at: a gate evaluates there."""
    if stored is None:
        return {}
    return pins.check_lock((stored.provenance.manifest or {}).get("datasets"), stored.provenance.source)


def items_checker(stored: RunResults | None) -> runner.ItemsCheck | None:
    """The documents and targets the tasks build now, held against ``stored``'s items before any
    model loads (a moved or edited dataset would otherwise cost the whole run first)."""
    if stored is None:
        return None

    def check(built: dict[str, list[tuple[str, str]]]) -> None:
        check_items_before(stored, built)

    return check


def baseline_checks(path: Path | None, suite: Suite) -> tuple[dict[str, str], runner.ItemsCheck | None]:
    """What a run judged later against the baseline file at ``path`` (a shard, a wave, the
    action's ``run``) evaluates at, so it is comparable with that baseline, and is checked
    against before its model loads: the dataset lock, and the items check ({} and None when
    there is no baseline)."""
    if path is None or not Path(path).is_file():
        return {}, None
    with trusted_code(suite.include_path, tuple(suite.task_names)):
        stored = store.load_baseline(Path(path))
    return dataset_lock(stored), items_checker(stored)


def _reference(suite: Suite, baseline_path: Path, policy: Policy | None
               ) -> tuple[RunResults | None, RunResults | None, Callable[[RunPlan], None]]:
    """(stored baseline or None, its anchor or None, the pre-run check against both): a corrupt
    baseline fails before anything heavy loads, a foreign one before lm-eval runs."""
    with trusted_code(suite.include_path, tuple(suite.task_names)):  # the suite's task code may define !function aggregations
        stored = store.load_baseline(baseline_path) if baseline_path.is_file() else None
        anchor = load_anchor(baseline_path) if stored is not None else None

    def preflight(plan: RunPlan) -> None:
        if stored is not None:
            check_baseline_before(stored, suite, plan)
            if anchor is not None:
                check_baseline_before(anchor, suite, plan)
            # A margin no drop can exceed is refused before the GPU time is spent, not after.
            unreachable = margins.unreachable(stored, policy or suite.policy)[0]
            if unreachable:
                raise GateError(margins.refusal(unreachable))

    return stored, anchor, preflight


def dry_run_gate(suite_path: str | Path, model: str, *, baseline: str | Path | None = None,
                 policy: Policy | None = None, revision: str | None = None, device: str | None = None,
                 log: Callable[[str], Any] = print, examples: int = 3, record_missing: bool = False,
                 looks: int = 0, items: str = "uniform") -> str:
    """``gate --dry-run``: every check a gate makes before it pays for the model (suite, task
    names, datasets, the baseline and anchor against the suite and the built tasks, margins, the
    device), the items it would evaluate (``looks``: per look of a sequential gate), each group,
    an estimate of the time from the baseline's own run, and ``examples`` rendered prompts per
    task. It refuses what the gate would refuse (no baseline without ``record_missing``).
    Returns the text to print; raises GateError."""
    suite = load_suite(suite_path)
    baseline_path = Path(baseline) if baseline else suite.baseline_path
    check_baseline_path(baseline_path, record_missing=record_missing, looks=looks)
    stored, anchor, preflight = _reference(suite, baseline_path, policy)
    designs = _informative_designs(suite, stored, baseline_path, policy or suite.policy) if items == "informative" else None
    lock = dataset_lock(stored)
    checked = runner.dry_run(suite, model, revision=revision, device=device, log=log, preflight=preflight,
                             examples=examples, lock=lock)
    items_checked = check_items_before(stored, checked.hashes) if stored is not None else 0
    total = sum(checked.items.values())
    lines = [f"dry run of suite {suite.name} on {model}: every check passed, nothing evaluated",
             f"lm-eval {checked.lm_eval_version}, backend {checked.backend}, device {checked.device}",
             "baseline: " + (f"{baseline_path} matches the suite and the built tasks"
                             + (" (and its anchor)" if anchor is not None else "") if stored is not None
                             else f"none at {baseline_path}: the gate would record this run as the first baseline"),
             f"items: {total:,} in {len(checked.items)} tasks ("
             + ", ".join(f"{t} {n:,}" for t, n in checked.items.items()) + ")",
             "time: " + _time_estimate(stored, total)]
    if items_checked:
        lines.append(f"baseline items: all {items_checked:,} match the documents and targets built now (prompts are "
                     "compared after the evaluation)")
    if checked.datasets:
        lines.append("hub datasets: " + ", ".join(
            f"{name} at {sha[:7]}" + (" (the baseline's)" if lock.get(name) == sha else " (the hub's head: new to the baseline)")
            for name, sha in checked.datasets.items()))
    if looks:
        lines += _looks_preview(suite, checked.items, looks, policy or suite.policy)
    if designs is not None:
        lines += _informative_preview(*designs)
    lines += _groups_preview(suite, checked.groups, checked.items)
    if stored is not None:
        lines += _resolution_preview(_plan(suite, stored, baseline_path, policy or suite.policy))
    lines += _prompts_preview(checked.prompts, len(checked.items))
    return "\n".join(lines)


def _resolution_preview(p: plans.Plan) -> list[str]:
    """Each gated row's smallest drop caught 4 times in 5, from ``plans.plan``: the figure
    ``gatekeeper plan`` prints for the same row, and whether the suite's margin resolves."""
    lines = [f"resolution, as `gatekeeper plan` gives it ({plans.source(p)}):"]
    for r in p.rows:
        if r.resolves is None:
            said = r.note
        elif not math.isfinite(r.mde):  # no drop of any size reaches significance on these items
            said = f"cannot resolve ({r.n:,} items): no drop is caught; margin {r.margin:g} does not resolve"
        else:
            said = (f"a drop of {r.mde:.3g} is caught 4 times in 5; margin {r.margin:g} "
                    + ("resolves" if r.resolves else f"does not resolve (smallest margin about {r.smallest_margin:.3g})"))
        lines.append(f"  {r.key.task} {r.key.metric} ({r.key.filter}): {said}")
    return lines


def _prompts_preview(prompts: dict[str, list[tuple[str, str, str]]], n_tasks: int) -> list[str]:
    """Each previewed task's first requests: the end of the prompt (the item's own question, after
    the shared instructions and few-shot examples), what is scored, and the target."""
    lines = []
    if len(prompts) < n_tasks:
        lines.append(f"\nprompts of {len(prompts)} of {n_tasks} tasks, spread over their names")
    for task, shown in prompts.items():
        lines.append(f"\n{task}: the first {len(shown)} requests as lm-eval builds them")
        for context, rest, target in shown:
            same = " ".join(target.split()) == " ".join(context.split())  # a perplexity's target is its text
            lines.append(f"  > {_shown(context, tail=True)}" + (f"  ⟶ {_shown(rest)}" if rest else "")
                         + (f"  (target: {_shown(target, 80)})" if target and not same else ""))
    return lines


def _looks_preview(suite: Suite, items: dict[str, int], count: int, policy: Policy) -> list[str]:
    """What a sequential gate would evaluate at each look, and the level each look tests at."""
    seed = suite.random_seed
    per_look = [sum(len(chunk(task, n, Look(k, count, seed))) for task, n in items.items())
                for k in range(1, count + 1)]
    levels = sequential.look_levels(sequential.fractions(count), policy.alpha)
    total = sum(per_look)
    done = np.cumsum(per_look)
    return [f"sequential: {count} looks; a task stops at the first look that decides it, the rest are never "
            "evaluated"] + [
        f"  look {k}: {n:,} items (then {d:,} of {total:,}, {d / total:.0%}), one-sided level {lvl:.3g} before "
        "the correction" for k, (n, d, lvl) in enumerate(zip(per_look, done, levels, strict=True), start=1)]


def _groups_preview(suite: Suite, groups: dict[str, Any], items: dict[str, int]) -> list[str]:
    """Each group the tasks build: its members, how its score weighs them, what is gated."""
    lines = []
    specs = {t.name: t for t in suite.tasks}
    for name, info in groups.items():
        members = ", ".join(f"{t} {items.get(t, 0):,}" for t in info["leaves"])
        how: dict[str, list[str]] = {}
        for a in info["aggregate"]:
            kind = ("weighted by items" if a["weight_by_size"] else "each task equal") + (
                f" ({a['aggregation']})" if a["aggregation"] != "mean" else "")
            how.setdefault(kind, []).append(a["metric"])
        weights = "; ".join(f"{', '.join(m)} {kind}" for kind, m in how.items()) or \
            "no aggregate (lm-eval reports no group score)"
        spec = specs.get(name)
        if spec is None:
            gated = f"gated under {_owner(name, groups, specs)}"
        else:
            metrics = [m for m in spec.metrics or [] if m.get("gate", True)]
            gated = ("gated: " + ", ".join(m["metric"] + (f" (margin {m['margin']:g})" if m.get("margin") is not None
                                                           else "") for m in metrics)
                     if metrics else "gated: every metric at the policy's margin")
            gated += "; its tasks " + ("gated with it, one family" if spec.subtasks == "gate" else
                                       "shown, never failing (subtasks: info)")
        lines.append(f"group {name}: {len(info['leaves'])} tasks ({members}); {weights}; {gated}")
    return lines


def _owner(name: str, groups: dict[str, Any], specs: dict[str, Any]) -> str:
    """The suite entry a nested group belongs to."""
    leaves = set(groups[name]["leaves"])
    for other in specs:
        if other in groups and other != name and leaves <= set(groups[other]["leaves"]):
            return f"group {other}'s rules"
    return "the suite's rules"


def _time_estimate(stored: RunResults | None, items: int) -> str:
    """From the baseline's own run (same suite; another machine may differ): its evaluation time
    per item, model loading left out."""
    manifest = (stored.provenance.manifest if stored is not None else None) or {}
    try:
        wall = float(manifest.get("wall_seconds") or 0.0) - float(manifest.get("model_load_seconds") or 0.0)
    except (TypeError, ValueError):
        wall = 0.0
    done = sum(int((n or {}).get("effective") or 0) for n in (stored.provenance.n_samples if stored else {}).values())
    if wall <= 0 or done <= 0:
        return "unknown (the baseline records no run time)"
    where = (manifest.get("hardware") or {}).get("gpu") or (manifest.get("hardware") or {}).get("cpu") or "its machine"
    return f"about {wall / done * items:,.0f} s of evaluation, as the baseline's run took on {where}"


def _shown(text: str, limit: int = 240, *, tail: bool = False) -> str:
    one = " ".join(str(text).split())
    if len(one) <= limit:
        return one
    return "…" + one[-(limit - 1):] if tail else one[: limit - 1] + "…"


def gate_run(
    suite_path: str | Path,
    run: str | Path,
    *,
    baseline: str | Path | None = None,
    policy: Policy | None = None,
    history: bool = False,
    commit: str | None = None,
) -> GateResult:
    """``gatekeeper gate --run``: gate a run made elsewhere (another job, ``gatekeeper merge``)
    against the stored baseline, without evaluating. A missing baseline is an error here (no
    ``--record-missing``): record one on purpose with ``gatekeeper baseline record``."""
    suite = load_suite(suite_path)
    base_path = Path(baseline) if baseline else suite.baseline_path
    if base_path.exists() and not base_path.is_file():
        raise GateError(f"{base_path}: baseline path is a directory, expected a .json.gz file")
    check_not_deleted(base_path)
    if not base_path.exists():
        raise GateError(f"{base_path}: no baseline file; record one on purpose with "
                        f"`gatekeeper baseline record {run} --suite {suite.path}`")
    outcome = compare_paths(base_path, run, suite, policy)
    kept = _append_history(base_path, outcome, suite, commit, None, inside=baseline is None) if history else []
    return GateResult(outcome.exit_code, outcome, None, Path(run), report.to_json(outcome), kept)


def check_not_deleted(baseline: Path) -> None:
    """A baseline that git tracks but the working tree lacks (deleted by hand or by a merge) is
    an error, never "no baseline yet": recording over it would forget the reference."""
    if gitbase.deleted_in_worktree([baseline]):
        raise GateError(f"{baseline}: deleted from the working tree but tracked by git; restore it "
                        f"(`git checkout -- {baseline}`), or remove it on purpose with `git rm` before recording a new one")


def load_anchor(baseline: Path) -> RunResults | None:
    """The anchor of ``baseline`` (None: the baseline is its own). A missing anchor file that the
    history says the suite had, or that git tracks, is an error: deleting it would turn a drift
    into a pass."""
    anchor = anchors.load_anchor(baseline)
    if anchor is not None:
        return anchor
    path = anchors.anchor_path(baseline)
    expected, problem = trend.expected_anchor(baseline)
    fix = ("restore the file from git (`git checkout -- FILE`), or reset the anchor on purpose with "
           "`gatekeeper baseline pin --current --reason ...`")
    if expected:
        unread = f" (in its last readable entry; the file itself is unreadable: {problem})" if problem else ""
        raise GateError(f"{path}: missing, but the history {trend.trend_path(baseline)} records anchor {expected}"
                        f"{unread}, the reference a person approved; {fix.replace('FILE', str(path))}")
    deleted = gitbase.deleted_in_worktree([path, trend.trend_path(baseline)])
    if deleted:
        names = " and ".join(str(p) for p in deleted)
        raise GateError(f"{names}: deleted from the working tree but tracked by git, so the suite may have had an "
                        f"anchor; {fix.replace('FILE', ' '.join(str(p) for p in deleted))}, and commit the removal "
                        "(`git rm`) if it is meant")
    return None


def _append_history(baseline: Path, outcome: Outcome, suite: Suite, commit: str | None, model: str | None, *,
                    inside: bool) -> list[TrendEntry]:
    model = model or (outcome.candidate.provenance.manifest or {}).get("model") or outcome.candidate.provenance.model_name
    model = portable_path(model) if isinstance(model, str) else None  # no path of this machine in a committed file
    entry = trend.entry_from_outcome(outcome, baseline=baseline, commit=commit, model=model)
    try:
        return trend.append(baseline, entry, suite, inside=inside)
    except GateError as err:
        # A broken history (a merge conflict, a truncated line) must not cost the verdict: the
        # gate is reported as computed, and the history's problem is said with its repair.
        outcome.warnings.append(f"history not updated: {err}")
        return []


# ----------------------------------------------------------------------------- sequential


def run_sequential_gate(
    suite_path: str | Path,
    model: str,
    *,
    out_dir: str | Path,
    looks: int = sequential.DEFAULT_LOOKS,
    baseline: str | Path | None = None,
    policy: Policy | None = None,
    revision: str | None = None,
    device: str | None = None,
    log: Callable[[str], Any] = print,
    futility: float = sequential.FUTILITY_BETA,
    batch_size: int | str | None = None,
) -> GateResult:
    """``gate --sequential``: evaluate the items in ``looks`` chunks of a seeded random order
    (``run/looks.py``) and stop when the verdict is known (``compare/sequential.py``): a
    regression at a look's level fails at once; a task whose gated metrics cannot plausibly end
    regressed stops; the last look decides what is left. One run folder per look under
    ``out_dir``; never recorded or promoted (a sample of the items, not a whole run)."""
    if not 2 <= looks <= 10:
        raise GateError(f"--looks {looks}: between 2 and 10 looks")
    suite = load_suite(suite_path)
    baseline_path = Path(baseline) if baseline else suite.baseline_path
    check_not_deleted(baseline_path)
    if not baseline_path.is_file():
        raise GateError(f"{baseline_path}: no baseline file; a sequential gate compares with one (record it first: "
                        f"gatekeeper baseline record RUN_DIR --suite {suite.path})")
    with trusted_code(suite.include_path, tuple(suite.task_names)):
        stored = store.load_baseline(baseline_path)
        anchor = load_anchor(baseline_path)
    policy = policy or suite.policy
    seed = suite.random_seed

    def preflight(plan: RunPlan) -> None:
        check_baseline_before(stored, suite, plan)
        if anchor is not None:
            check_baseline_before(anchor, suite, plan)

    levels = sequential.look_levels(sequential.fractions(looks), policy.alpha)
    lock = dataset_lock(stored)  # every look at the baseline's dataset commits

    def evaluate(k: int, done: frozenset[str]) -> list[LookRun]:
        log(f"sequential: look {k} of {looks} (level {levels[k - 1]:.2g})")
        return _load_looks(suite, [runner.run_suite(
            suite, model, Path(out_dir) / f"look-{k}", revision=revision, device=device, log=log,
            preflight=preflight if k == 1 else None, look=Look(k, looks, seed, done), reuse_model=True,
            batch_size=batch_size, lock=lock, items_check=items_checker(stored) if k == 1 else None)])

    try:
        result = _sequential_looks(suite, looks, stored, baseline_path, anchor, policy, log, futility, evaluate)
    finally:
        runner.release_models()
    if result.report_json["sequential"]["partial"]:
        info = result.report_json["sequential"]
        info["complete_with"] = f"gatekeeper run --complete {out_dir} --suite {suite.path}"
        log(f"sequential: a sample of the items; to store this model as a baseline: {info['complete_with']}")
    return dataclasses.replace(result, run_dir=Path(out_dir))


def run_informative_gate(
    suite_path: str | Path,
    model: str,
    *,
    out_dir: str | Path,
    baseline: str | Path | None = None,
    policy: Policy | None = None,
    revision: str | None = None,
    device: str | None = None,
    log: Callable[[str], Any] = print,
    batch_size: int | str | None = None,
) -> GateResult:
    """``gate --items informative`` (issue #57): read the items the baseline says are likely to
    flip first, stage by stage, and test once.

    Each task's design comes from the baseline alone (``informative.designs_for``: its choice
    margins, else every item at one chance; a task that cannot be weighted exactly is read
    whole). Stage k reads the items the design draws at scale ``SCALES[k]`` (27%, 41%, 56%, 75%,
    every item) that earlier stages did not; a task stops at the first stage whose read flips hold
    most of the information of reading every item (``weighted.until_informed``: it looks only at
    which items flipped, never which way, so the test keeps its level), or earlier where its rows
    show no drop the gate is designed to catch (``_interim``: a pass, never a failure); a stage
    fails the gate on a drop already shown beyond its margin at its small share of alpha. Then one
    comparison of the items read, each standing for what the design says (``informative.weigh``), against the baseline cut to them: the whole
    suite's change, estimated and tested. One run folder per stage under ``out_dir``; never
    recorded or promoted (a sample of the items)."""
    suite = load_suite(suite_path)
    baseline_path = Path(baseline) if baseline else suite.baseline_path
    check_not_deleted(baseline_path)
    policy = policy or suite.policy
    stored, anchor, preflight = _reference(suite, baseline_path, policy)
    designs, whole = _informative_designs(suite, stored, baseline_path, policy)  # no baseline: an error there
    seed = suite.random_seed
    lock, check = dataset_lock(stored), items_checker(stored)

    def evaluate(k: int, new: dict[str, list[int]]) -> list[LookRun]:
        first = {"preflight": preflight, "items_check": check} if k == 1 else {}
        return _load_looks(suite, [runner.run_suite(
            suite, model, Path(out_dir) / f"stage-{k}", log=log, look=Look(k, len(informative.SCALES), seed, docs=new),
            reuse_model=True, revision=revision, device=device, batch_size=batch_size, lock=lock, **first)])

    try:
        result = _informative_stages(suite, stored, anchor, baseline_path, policy, designs, whole, evaluate, log)
    finally:
        runner.release_models()
    return dataclasses.replace(result, run_dir=Path(out_dir))


def _informative_designs(suite: Suite, stored: RunResults | None, baseline_path: Path, policy: Policy
                         ) -> tuple[dict[str, informative.Design], dict[str, str]]:
    """Each task's design from the baseline, and the tasks read whole (why); an error where the
    informative read cannot be made at all."""
    if policy.test != "superiority":
        raise GateError(f"gate --items informative: policy test {policy.test} reads every item; the informative read "
                        "is tested for a drop (test: superiority)")
    if stored is None:
        raise GateError(f"{baseline_path}: no baseline file; an informative gate reads its items from one (record it "
                        f"first: gatekeeper gate --suite {suite.path} --model MODEL --record-missing)")
    designs, whole = informative.designs_for(stored, suite.random_seed)
    if len(whole) == len(designs):
        task, why = sorted(whole.items())[0]
        raise GateError(f"{baseline_path}: no task can be read informatively (task {task}: {why}"
                        f"{f', and {len(whole) - 1} more' if len(whole) > 1 else ''}); only right/wrong items "
                        "without clusters can be read in part and weighted exactly: gate with --items uniform")
    return designs, whole


def _informative_preview(designs: dict[str, informative.Design], whole: dict[str, str]) -> list[str]:
    """The dry run's word on an informative gate: what each stage reads at most, what is read whole."""
    total = sum(d.pi.size for d in designs.values())
    shares = [sum(d.expected_share(scale) * d.pi.size for d in designs.values()) / total
              for scale in informative.SCALES]
    lines = ["informative: the stages read about " + ", ".join(f"{x:.0%}" for x in shares) + f" of the {total:,} "
             "items; each task stops at the first whose flips hold 95% of the information of reading every item, "
             "or earlier where they show no drop to find"]
    uniform = sorted(t for t, d in designs.items() if d.uniform)
    if uniform:
        lines.append("  read uniformly (the baseline kept no choice margins for them; a multiple-choice task's are "
                     "kept by a baseline recorded or promoted from this release on): " + ", ".join(uniform))
    if whole:
        lines.append("  read whole: " + ", ".join(f"{t} ({why})" for t, why in sorted(whole.items())))
    return lines


def _informative_stages(suite: Suite, stored: RunResults, anchor: RunResults | None, baseline_path: Path,
                        policy: Policy, designs: dict[str, informative.Design], whole: dict[str, str],
                        evaluate: Callable[[int, dict[str, list[int]]], list[LookRun]],
                        log: Callable[[str], Any]) -> GateResult:
    """The stages, one after another until every task is decided (``evaluate(k, new)``: stage k's
    parts, evaluated now or cut from a whole run), then the one comparison and the report."""
    scales = informative.SCALES
    read = {task: np.zeros(d.pi.size, dtype=bool) for task, d in designs.items()}
    decided: dict[str, float] = {}
    futile: set[str] = set()  # tasks whose stage passed them early: no drop the gate is designed to catch
    units = informative.stage_units(stored, designs, whole)
    runs: list[RunResults] = []
    news: list[dict[str, list[int]]] = []
    early: Outcome | None = None  # a stage's comparison that showed a drop beyond its margin
    for k, scale in enumerate(scales, 1):
        new = {}
        for task, d in sorted(designs.items()):
            now = d.read(scale) if task not in decided else read[task]
            new[task] = np.flatnonzero(now & ~read[task]).tolist()
            read[task] |= now
        log(f"informative: stage {k} of {len(scales)}: {sum(map(len, new.values())):,} items "
            f"({len(designs) - len(decided)} tasks still reading)")
        for run, got in evaluate(k, new):
            runs.append(run)
            news.append(got)
        candidate = subset.join(runs, news)
        decided.update({t: scale for t in whole if t not in decided})  # every item read at the first stage
        flips = {unit: _unit_flips(stored, candidate, designs, unit) for unit in units if unit[0] not in decided}
        for unit, flipped in flips.items():
            if k == len(scales) or all(read[t].all() for t in unit) \
                    or until_informed(flipped, informative.joined(designs, unit)) < k:
                decided.update(dict.fromkeys(unit, scale))
        if k < len(scales) and len(decided) < len(designs):
            early, passed = _interim(suite, stored, anchor, candidate, policy, designs, flips, decided, scale)
            if early is not None:
                decided.update({t: scale for t in designs if t not in decided})
                break
            for unit in passed:
                decided.update(dict.fromkeys(unit, scale))
                futile.update(unit)
        if len(decided) == len(designs):
            break
    stage_alpha, final_alpha = sequential.informative_alphas(policy.alpha, len(scales))
    outcome = early or _compare_read(suite, stored, anchor, candidate, designs, decided,
                                     dataclasses.replace(policy, alpha=final_alpha),
                                     plan=_plan(suite, stored, baseline_path, policy))
    info = _informative_report(designs, whole, decided, subset.docs_of(candidate), futile)
    info["failed_at_stage"] = k if early is not None else None
    info["summary"] += (f"; failed at stage {k} of {len(scales)}: a drop shown beyond its margin at the stage's "
                        f"alpha ({stage_alpha:.2g})" if early is not None else
                        f"; the one comparison at alpha {final_alpha:.4g} (the stages before it may fail early, "
                        f"at {stage_alpha:.2g} each)")
    log(info["summary"])
    outcome.notes.append(info["summary"])
    report_json = report.to_json(outcome)
    report_json["informative"] = info
    return GateResult(outcome.exit_code, outcome, None, None, report_json)


def _interim(suite: Suite, stored: RunResults, anchor: RunResults | None, candidate: RunResults, policy: Policy,
             designs: dict[str, informative.Design], flips: dict[tuple[str, ...], np.ndarray],
             decided: dict[str, float], scale: float) -> tuple[Outcome | None, list[tuple[str, ...]]]:
    """A stage before the last: the comparison of the items read so far (each at what it stands
    for) at the stage's share of alpha (``sequential.informative_alphas``). A drop shown beyond
    its margin there fails the gate now (that comparison); else the units still reading whose every
    gated row shows no drop the gate is designed to catch pass early (``sequential.futile_units``;
    each unit's information fraction estimated from its read flips as the stage rule does, from
    at least ``MIN_FLIPS`` of them, else it is not judged: too few say too little). ``flips``:
    each unit's flipped items this stage (``_unit_flips``)."""
    fractions = {}
    for unit, flipped in flips.items():
        if unit[0] in decided:
            continue
        d = informative.joined(designs, unit)
        read = np.flatnonzero(d.read(scale) & flipped)
        if read.size >= MIN_FLIPS:
            fractions[unit] = informed_share(d.weights(read, scale))
    stage_alpha, final_alpha = sequential.informative_alphas(policy.alpha, len(informative.SCALES))
    outcome = _compare_read(suite, stored, anchor, candidate, designs, {t: decided.get(t, scale) for t in designs},
                            dataclasses.replace(policy, alpha=stage_alpha))
    if sequential.shown_beyond(outcome):
        return outcome, []
    return None, sequential.futile_units(outcome, fractions, final_alpha, len(informative.SCALES))


def _compare_read(suite: Suite, stored: RunResults, anchor: RunResults | None, candidate: RunResults,
                  designs: dict[str, informative.Design], scales: dict[str, float], policy: Policy,
                  plan: plans.Plan | None = None) -> Outcome:
    """The items an informative gate read so far, each standing for what its task's design says
    at its scale (``informative.weigh``), against the baseline and the anchor cut to them."""
    docs = subset.docs_of(candidate)
    return compare_for_suite(subset.restrict(stored, docs), informative.weigh(candidate, designs, scales), suite,
                             policy, anchor=subset.restrict(anchor, docs) if anchor is not None else None, plan=plan)


def _replayed_informative_gate(suite: Suite, full: GateResult, reference: Path,
                               log: Callable[[str], Any]) -> GateResult:
    """What ``gate --items informative`` against ``reference`` decides, its stages cut from
    ``full``'s run of every item (``plan --mutants --items informative``)."""
    if full.run_dir is None:
        raise GateError("plan --mutants: the run of every item was not kept")
    with trusted_code(suite.include_path, tuple(suite.task_names)):
        stored = store.load_baseline(reference)
        run = load_run(full.run_dir, cluster_keys=suite.cluster_keys())
    designs, whole = _informative_designs(suite, stored, reference, suite.policy)

    def evaluate(_k: int, new: dict[str, list[int]]) -> list[LookRun]:
        return [(run, new)]  # subset.join keeps each stage's new documents of the whole run

    return _informative_stages(suite, stored, None, reference, suite.policy, designs, whole, evaluate, log)


def _unit_flips(stored: RunResults, candidate: RunResults, designs: dict[str, informative.Design],
                unit: tuple[str, ...]) -> np.ndarray:
    """``_flipped`` of each task of a stage unit, in the unit's order (``informative.joined``'s)."""
    return np.concatenate([_flipped(stored, candidate, t, designs[t].pi.size) for t in unit])


def _flipped(stored: RunResults, candidate: RunResults, task: str, n: int) -> np.ndarray:
    """Which of a task's documents the candidate read and changed in any of its right/wrong
    series (never which way: what the stage choice may look at)."""
    out = np.zeros(n, dtype=bool)
    for key, s in candidate.series.items():
        if key.task == task and key in stored.series:
            ids = np.asarray(s.doc_ids, dtype=np.int64)
            out[ids] |= np.asarray(stored.series[key].values)[ids] != np.asarray(s.values)
    return out


def _informative_report(designs: dict[str, informative.Design], whole: dict[str, str], decided: dict[str, float],
                        docs: dict[str, np.ndarray], futile: set[str]) -> dict[str, Any]:
    """What the report says of an informative gate: items read per task, where each stopped, and
    which tasks were read whole and why."""
    items = {task: {"read": int(np.asarray(docs.get(task, ())).size), "total": int(d.pi.size),
                    "stage": informative.SCALES.index(decided[task]) + 1, "whole": whole.get(task),
                    "uniform": d.uniform, "futile": task in futile}
             for task, d in sorted(designs.items())}
    read, total = sum(v["read"] for v in items.values()), sum(v["total"] for v in items.values())
    summary = (f"informative: read {read:,} of {total:,} items ({read / total:.0%}), chosen from the baseline: the "
               "items likely to flip first, every other item with a known chance, so a drop anywhere in the suite "
               "is still estimated and tested")
    if whole:
        summary += f"; read whole: {', '.join(f'{t} ({why})' for t, why in sorted(whole.items()))}"
    uniform = sorted(t for t, d in designs.items() if d.uniform)
    if uniform:  # no margins to read the likely flips first by
        summary += (f"; read uniformly (the baseline kept no choice margins for them): {', '.join(uniform)}")
    if futile:  # passed early: reading on could not show the drop the gate is designed to catch
        summary += f"; stopped early, no drop to find: {', '.join(sorted(futile))}"
    last = informative.SCALES[-1]
    read_on = sorted(t for t in designs if t not in whole and decided[t] == last)
    if read_on:  # the stage rule read on: the flips did not say enough at fewer items
        summary += (f"; every item of {', '.join(read_on)} (fewer than {MIN_FLIPS} flips read, or too many of "
                    "them among the items the baseline was sure of)")
    return {"read": read, "total": total, "items": items, "summary": summary, "partial": read < total}


def judge_looks(suite_path: str | Path, folder: str | Path, *, baseline: str | Path | None = None,
                policy: Policy | None = None, log: Callable[[str], Any] = print) -> GateResult:
    """``gate --sequential --run DIR``: judge the looks a sharded workflow evaluated (``run --look
    K/L [--shard k/N]``, one wave per look) as the in-process sequential gate would, look by look.
    When the looks in DIR do not decide yet, the report's ``sequential.next`` says which look to
    evaluate next and which tasks have stopped (exit 0: nothing is known to be worse yet)."""
    suite = load_suite(suite_path)
    baseline_path = Path(baseline) if baseline else suite.baseline_path
    check_not_deleted(baseline_path)
    if not baseline_path.is_file():
        raise GateError(f"{baseline_path}: no baseline file; a sequential gate compares with one")
    found = _looks_in(Path(folder))
    count = found[0].info["count"]
    seed = suite.random_seed
    if found[0].info["seed"] != seed:  # the suite's order, not one a run chose (which items a look sees)
        raise GateError(f"{found[0].folder}: the looks ordered the items with seed {found[0].info['seed']}, the suite's "
                        f"is {seed}; evaluate the looks with this suite (gatekeeper run --look K/L --suite {suite.path})")
    with trusted_code(suite.include_path, tuple(suite.task_names)):
        stored = store.load_baseline(baseline_path)
        anchor = load_anchor(baseline_path)
    _check_look_sizes(found[0], stored, baseline_path)

    def evaluate(k: int, done: frozenset[str]) -> list[LookRun]:
        parts = [p for p in found if p.info["index"] == k]
        for p in parts:
            if set(p.info.get("done") or ()) != set(done):
                raise GateError(f"{p.folder}: evaluated with --done {','.join(p.info.get('done') or []) or '(none)'}, "
                                f"but the looks before it stop {','.join(sorted(done)) or 'no task'}; re-run it")
        return _load_looks(suite, [p.folder for p in parts])

    return _sequential_looks(suite, count, stored, baseline_path, anchor, policy or suite.policy, log, sequential.FUTILITY_BETA,
                             evaluate)


def _check_look_sizes(look: Any, stored: RunResults, baseline_path: Path) -> None:
    """The looks cut each task's documents as the baseline counts them: the order and the chunks
    are recomputed from these sizes (``merge.load_look``), so they must be the trusted ones."""
    counts = {k.task: int(s.doc_ids.size) for k, s in stored.series.items()}
    for task, n in sorted(look.info["items"].items()):
        if task in counts and counts[task] != n:
            raise GateError(f"{look.folder}: the looks cut task {task} as {n} items, the baseline {baseline_path} "
                            f"has {counts[task]}; evaluate the looks with the suite the baseline was recorded with")


def _looks_in(folder: Path) -> list[Any]:
    """The looks under ``folder``, validated: one seed and look count, looks 1..K each with all
    its parts, no look twice."""
    found = [merge.load_look(p) for p in complete.look_folders(folder)]
    merge.check_same(found)  # one model, suite and settings: no wave of another checkpoint mixed in
    first = found[0]
    by_index: dict[int, list[Any]] = {}
    for p in found:
        for key in ("count", "seed"):
            if p.info[key] != first.info[key]:
                raise GateError(f"{p.folder}: look {key} differs from {first.folder}'s; one sequential gate per folder")
        by_index.setdefault(p.info["index"], []).append(p)
    for k in range(1, max(by_index) + 1):
        parts = by_index.get(k)
        if not parts:
            raise GateError(f"{folder}: look {k} is missing (looks {sorted(by_index)} found); evaluate it first")
        n = (parts[0].info.get("part") or [1, 1])[1]
        have = sorted((p.info.get("part") or [1, 1])[0] for p in parts)
        if have != list(range(1, n + 1)) or any((p.info.get("part") or [1, 1])[1] != n for p in parts):
            raise GateError(f"{folder}: look {k} has parts {have} of {n}; pass every shard of the wave once")
    return found


# One part of a look, loaded: its run, and the documents it added per task (its manifest's).
LookRun = tuple[RunResults, dict[str, list[int]]]


def _load_looks(suite: Suite, folders: list[Path]) -> list[LookRun]:
    parts = []
    with trusted_code(suite.include_path, tuple(suite.task_names)):
        for run_dir in folders:
            run = load_run(run_dir, cluster_keys=suite.cluster_keys())
            docs = ((run.provenance.manifest or {}).get("look") or {}).get("docs", {})
            parts.append((run, {t_: list(d) for t_, d in docs.items()}))
    return parts


def _replay_looks(suite: Suite, full: RunResults, looks: int) -> Callable[[int, frozenset[str]], list[LookRun]]:
    """The looks of a sequential gate cut from a run of every item instead of evaluated: look k
    is the documents ``run/looks.py`` gives it, taken from ``full`` (``subset.join`` keeps only
    those). ``plan --mutants`` grades the sequential gate this way on the run it labels each
    variant with: the same items and decisions, without evaluating them twice."""
    seed = suite.random_seed
    sizes = {t_: int(d.size) for t_, d in subset.docs_of(full).items()}

    def evaluate(k: int, done: frozenset[str]) -> list[LookRun]:
        new = samples(sizes, Look(k, looks, seed, done))[1]
        manifest = {**(full.provenance.manifest or {}), "look": {"index": k, "count": looks, "docs": new, "items": sizes},
                    "wall_seconds": 0.0, "model_load_seconds": 0.0}
        manifest.pop("request_seconds", None)  # nothing was evaluated for the look: no time to save
        return [(dataclasses.replace(full, provenance=dataclasses.replace(full.provenance, manifest=manifest)), new)]

    return evaluate


def _sequential_looks(suite: Suite, looks: int, stored: RunResults, baseline_path: Path, anchor: RunResults | None,
                      policy: Policy, log: Callable[[str], Any], futility: float,
                      evaluate: Callable[[int, frozenset[str]], list[LookRun]]) -> GateResult:
    """The looks, one after another: ``evaluate(k, done)`` gives look k's parts (evaluated now,
    found in folders, or cut from a whole run; [] when look k is not there yet), then the
    comparison decides."""
    t = sequential.fractions(looks)
    levels = sequential.look_levels(t, policy.alpha)
    resolution = _plan(suite, stored, baseline_path, policy)  # the whole suite's, at every look
    runs: list[RunResults] = []
    news: list[dict[str, list[int]]] = []
    done: frozenset[str] = frozenset()
    steps: list[dict[str, Any]] = []
    timing: list[dict[str, Any]] = []  # each look part's manifest: the model's own seconds per request
    whole = {key.task: int(s.doc_ids.size) for key, s in stored.series.items()}  # the suite's items per task
    waiting = None
    for k in range(1, looks + 1):
        parts = evaluate(k, done)
        if not parts:
            waiting = k
            break
        manifests = []
        for run, new in parts:
            runs.append(run)
            manifests.append(run.provenance.manifest or {})
            timing.append(manifests[-1])
            news.append(new)
        manifest = {"wall_seconds": sum(float(m.get("wall_seconds") or 0.0) for m in manifests),
                    "model_load_seconds": sum(float(m.get("model_load_seconds") or 0.0) for m in manifests)}
        candidate = subset.join(runs, news)
        docs = subset.docs_of(candidate)
        # Interim looks test at tiny levels, where mid-p runs above nominal: the exact test there.
        look_policy = dataclasses.replace(policy, alpha=float(levels[k - 1]), exact_mcnemar=k < looks,
                                          look=(k, tuple(float(x) for x in t), policy.alpha), look_sizes=whole)
        outcome = compare_for_suite(subset.restrict(stored, docs), candidate, suite, look_policy,
                                    anchor=subset.restrict(anchor, docs) if anchor is not None else None,
                                    plan=resolution)
        decision = sequential.decide(outcome, k, t, policy.alpha, futility)
        steps.append({"look": k, "level": decision.level, "decision": decision.decision,
                      "wall_seconds": float(manifest.get("wall_seconds") or 0.0),
                      "model_load_seconds": float(manifest.get("model_load_seconds") or 0.0),
                      "stopped_tasks": sorted(decision.done_tasks - done)})
        if decision.decision != "continue":
            break
        done = done | decision.done_tasks
    if not runs:
        raise GateError("sequential gate: no look to judge")
    sizes = (runs[0].provenance.manifest or {}).get("look", {}).get("items", {})
    info = _sequential_report(looks, steps, sizes, docs, policy.alpha, timing)
    if waiting is not None:  # the looks so far do not decide: say what to evaluate next
        info["decision"] = "continue"
        info["next"] = {"look": waiting, "of": looks, "done": sorted(done)}
        info["summary"] = (f"sequential: undecided after look {waiting - 1} of {looks}; evaluate look {waiting}: "
                           f"gatekeeper run --look {waiting}/{looks}" + (f" --done {','.join(sorted(done))}" if done else ""))
    log(info["summary"])
    report_json = report.to_json(outcome)
    report_json["sequential"] = info
    outcome.notes.append(info["summary"])
    if info["partial"]:  # the tables' baseline and candidate columns are the sample's, not the suite's
        outcome.notes.append(f"the baseline and candidate values above are over the {info['evaluated']:,} of "
                             f"{info['total']:,} items the looks evaluated (the same items on both sides), "
                             "not the whole suite's scores; the MDE column and the warnings are the whole suite's")
    code = 0 if waiting is not None else outcome.exit_code
    return GateResult(code, outcome, None, None, report_json)


def _sequential_report(looks: int, steps: list[dict[str, Any]], sizes: dict[str, int],
                       docs: dict[str, Any], alpha: float, manifests: list[dict[str, Any]]) -> dict[str, Any]:
    """What the report says of a sequential gate: where it stopped, items per task, time saved."""
    total = sum(int(n) for n in sizes.values())
    seen = {t_: int(len(d)) for t_, d in docs.items()}
    evaluated = sum(seen.values())
    saved = seconds_saved(manifests, {t_: int(n) - seen.get(t_, 0) for t_, n in sizes.items()})
    last = steps[-1]
    why = {"fail": "a regression shown beyond its margin at this look's level",
           "pass": "every gated drop shown smaller than the one the gate is designed to catch"}
    time_note = (f"about {saved:.1f} s of model time saved (the skipped items' requests at the looks' measured "
                 "seconds per request; process starts and model loading not counted)" if saved is not None
                 else "the time saved is not known (the looks' manifests record no request timing)")
    summary = (f"sequential: stopped at look {last['look']} of {looks} ({last['decision']}: "
               f"{why.get(last['decision'], 'the last look')}); {evaluated:,} of {total:,} items evaluated "
               f"({evaluated / total:.0%}), {time_note}")
    return {"looks": looks, "stopped_at": last["look"], "decision": last["decision"], "alpha": alpha,
            "steps": steps, "items": {t_: {"evaluated": seen.get(t_, 0), "total": int(n)} for t_, n in sizes.items()},
            "evaluated": evaluated, "total": total,
            "seconds_saved_estimate": round(saved, 1) if saved is not None else None, "summary": summary,
            "partial": evaluated < total}


def seconds_saved(manifests: list[dict[str, Any]], skipped: dict[str, int]) -> float | None:
    """The model time the skipped items would have taken: per task, its requests per item (as the
    looks sent them) times the looks' measured seconds per request of that type. Model loading,
    building tasks and writing files are paid once whatever the items, so they are not in it.
    None when a look recorded no timing (a run folder from before it was measured)."""
    phases: dict[str, list[float]] = {}
    tasks: dict[str, list[Any]] = {}
    for m in manifests:
        if "request_seconds" not in m or "task_requests" not in m:
            return None
        for phase, v in (m.get("request_seconds") or {}).items():
            acc = phases.setdefault(phase, [0.0, 0.0])
            acc[0] += float(v.get("requests") or 0)
            acc[1] += float(v.get("seconds") or 0.0)
        for task, v in (m.get("task_requests") or {}).items():
            acc = tasks.setdefault(task, [str(v.get("type")), 0.0, 0.0])
            acc[1] += float(v.get("items") or 0)
            acc[2] += float(v.get("requests") or 0)
    total = 0.0
    for task, n in skipped.items():
        kind, items, requests = tasks.get(task, ("", 0.0, 0.0))
        count, seconds = phases.get(kind, (0.0, 0.0))
        if n > 0 and items > 0 and count > 0:
            total += n * (requests / items) * (seconds / count)
    return total


# ----------------------------------------------------------------------------- plan


def plan_suite(suite_path: str | Path, *, baseline: str | Path | None = None, against: str | Path | None = None,
               flip_rate: float | None = None, looks: int | None = None) -> plans.Plan:
    """``gatekeeper plan``: the suite's resolution from its stored baseline (``compare/plan.py``).
    The harmless spread is measured on a second run of the same items: ``against`` (a run folder
    or baseline file), else the anchor, else the newest earlier baseline in history/."""
    suite = load_suite(suite_path)
    base_path = Path(baseline) if baseline else suite.baseline_path
    if not base_path.is_file():
        raise GateError(f"{base_path}: no baseline file; plan reads the baseline's items (record one first: "
                        f"gatekeeper baseline record RUN_DIR --suite {suite.path})")
    if flip_rate is not None and not 0 < flip_rate < 1:
        raise GateError(f"--flip-rate {flip_rate:g}: a share of the items, between 0 and 1 (0.05 = 5%)")
    looks = looks or suite.policy.sequential_looks or sequential.DEFAULT_LOOKS
    if not 2 <= looks <= 10:
        raise GateError(f"--looks {looks}: between 2 and 10 looks")
    with trusted_code(suite.include_path, tuple(suite.task_names)):
        stored = store.load_baseline(base_path)
        check_run_matches_suite(stored, suite, what="baseline",
                                fix=f"re-record the baseline: gatekeeper baseline promote RUN_DIR --suite {suite.path}")
    return _plan(suite, stored, base_path, suite.policy, against=against, flip_rate=flip_rate, looks=looks,
                 simulate=True)


def _plan(suite: Suite, stored: RunResults, base_path: Path, policy: Policy, *, against: str | Path | None = None,
          flip_rate: float | None = None, looks: int | None = None, simulate: bool = False) -> plans.Plan:
    """``plans.plan`` of a loaded baseline, the harmless spread measured on its second run
    (``_second_run``): what ``gatekeeper plan`` prints (``simulate``: its sequential figures too),
    and the resolution the dry run and every gate print."""
    with trusted_code(suite.include_path, tuple(suite.task_names)):
        other, name = _second_run(base_path, stored, suite, against)
    return plans.plan(stored, policy, suite=suite.name, against=other, against_name=name, flip_rate=flip_rate,
                      looks=looks or suite.policy.sequential_looks or sequential.DEFAULT_LOOKS, simulate=simulate,
                      design_seed=suite.random_seed)


def _second_run(base_path: Path, stored: RunResults, suite: Suite,
                against: str | Path | None) -> tuple[RunResults | None, str | None]:
    if against is not None:
        if not Path(against).exists():
            raise GateError(f"{against}: --against names no run folder or baseline file")
        other = store.load_any(against, cluster_keys=suite.cluster_keys())
        check_run_matches_suite(other, suite, what="--against run",
                                fix=f"pass a run of this suite (gatekeeper run --suite {suite.path} ...)")
        return other, portable_path(str(against))
    candidates = [anchors.anchor_path(base_path), *reversed(store.history(base_path))]
    for path in candidates:
        if path.is_file() and not path.is_symlink():
            other = store.load_baseline(path)
            if (not anchors.same_measurement(other, stored)
                    and other.provenance.suite_hash == stored.provenance.suite_hash
                    and not compatibility_errors(stored, other)):
                return other, portable_path(str(path))  # not one of other items (a baseline before a data edit)
    return None, None


def plan_mutants(suite_path: str | Path, model: str | Path, *, out_dir: str | Path, sequential_gate: bool = True,
                 looks: int | None = None, device: str | None = None, keep: bool = False,
                 log: Callable[[str], Any] = print, items: str = "uniform") -> plans.MutantsPlan:
    """``plan --mutants MODEL``: evaluate ``model`` as the reference (recorded as a baseline under
    ``out_dir``), then gate each of its standard defects and harmless variants (``run/mutants.py``)
    against it, one at a time (a variant's checkpoint is deleted once gated unless ``keep``).
    ``items="informative"`` grades ``gate --items informative`` instead of the sequential gate."""
    suite = load_suite(suite_path)
    model_dir = mutants.check_model(Path(model))
    looks = looks or suite.policy.sequential_looks or sequential.DEFAULT_LOOKS
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise GateError(f"{out}: not empty; plan --mutants writes its checkpoints and runs into a new folder")
    log(f"mutants: the reference run of {model}")
    reference = record_run(runner.run_suite(suite, str(model_dir), out / "reference", device=device, log=log,
                                            lock=baseline_checks(suite.baseline_path, suite)[0]),
                           suite, path=out / "reference.json.gz")
    rows = []
    variants: list[Any] = [*mutants.BUILDERS, mutants.other_batch_size(suite.model.get("batch_size"))]
    for variant in variants:
        if isinstance(variant, str):
            m = mutants.make(model_dir, variant, out / "mutants" / variant)
        else:
            m = variant
        log(f"mutants: {m.name} ({m.what})")
        rows.append(_gate_mutant(suite, m, str(m.path or model_dir), reference, out / "gates" / m.name,
                                 sequential_gate, looks, device, log, items))
        if m.path is not None and not keep:
            shutil.rmtree(m.path, ignore_errors=True)
    return plans.MutantsPlan(suite.name, portable_path(str(model)), sequential_gate, rows, items=items)


def _gate_mutant(suite: Suite, m: Any, model: str, reference: Path, out: Path, sequential_gate: bool, looks: int,
                 device: str | None, log: Callable[[str], Any], items_mode: str = "uniform") -> plans.MutantRow:
    def quiet(_line: str) -> None:  # the table says what each gate decided
        return None

    try:
        # The label comes from every item, evaluated once, whatever mode is graded: a sequential
        # gate's own items would let a gate that stops early call a real defect harmless. The
        # sequential gate's looks are cut from that run, not evaluated again (half the model time).
        sampled = sequential_gate or items_mode == "informative"
        full = run_gate(suite.path, model, out_dir=out / "every-item" if sampled else out, baseline=reference,
                        device=device, log=quiet, batch_size=m.batch_size)
        res = (_replayed_informative_gate(suite, full, reference, quiet) if items_mode == "informative" else
               _replayed_sequential_gate(suite, full, reference, looks, quiet) if sequential_gate else full)
    except GateError as exc:
        log(f"mutants: {m.name} could not be gated: {exc}")
        return plans.MutantRow(m.name, m.defect, m.what, "error", 2, None, None, "", str(exc))
    info = res.report_json.get("sequential") or {}
    if "informative" in res.report_json:
        info = {"evaluated": res.report_json["informative"]["read"], "total": res.report_json["informative"]["total"]}
    gated = [c for c in full.outcome.comparisons if c.gated] if full.outcome else []
    worst = max(gated, key=lambda c: c.drop / (abs(c.test.baseline) or 1.0), default=None)
    text = f"{worst.key.task} {worst.key.metric} {worst.test.delta:+.4f}" if worst is not None else ""
    items = info["evaluated"] / info["total"] if info.get("total") else (1.0 if not sampled else None)
    beyond, borderline = plans.mutant_label(gated)
    return plans.MutantRow(m.name, m.defect, m.what, res.report_json.get("verdict", ""), res.exit_code, items,
                           info.get("stopped_at"), text, beyond_margin=beyond, borderline=borderline,
                           items_needed=plans.items_to_catch(gated))


def _replayed_sequential_gate(suite: Suite, full: GateResult, reference: Path, looks: int,
                              log: Callable[[str], Any]) -> GateResult:
    """What ``gate --sequential`` against ``reference`` decides, its looks cut from ``full``'s run."""
    if full.run_dir is None:
        raise GateError("plan --mutants: the run of every item was not kept")
    with trusted_code(suite.include_path, tuple(suite.task_names)):
        stored = store.load_baseline(reference)
        run = load_run(full.run_dir, cluster_keys=suite.cluster_keys())
    return _sequential_looks(suite, looks, stored, reference, None, suite.policy, log, sequential.FUTILITY_BETA,
                             _replay_looks(suite, run, looks))


# ----------------------------------------------------------------------------- one path


def compare_paths(
    baseline: str | Path | None,
    candidate: str | Path,
    suite: Suite,
    policy: Policy | None = None,
    *,
    seed: int = 0,
    also_baseline: Sequence[str | Path] = (),
    also_candidate: Sequence[str | Path] = (),
) -> Outcome:
    """``compare --suite`` and the action's compare: load both sides (baseline: the suite's
    stored one when None), then ``compare_for_suite``."""
    base_path = Path(baseline) if baseline is not None else suite.baseline_path
    check_not_deleted(base_path)
    if not base_path.exists():
        raise GateError(f"{base_path}: baseline does not exist (record one with `gatekeeper baseline record`)")
    keys = suite.cluster_keys()
    with trusted_code(suite.include_path, tuple(suite.task_names)):  # the suite's task code may define !function aggregations
        base_runs = [store.load_any(p, cluster_keys=keys) for p in [base_path, *also_baseline]]
        cand_runs = [store.load_any(p, cluster_keys=keys) for p in [candidate, *also_candidate]]
        # The anchor of a stored baseline is compared too; repeats of the baseline have none.
        anchor = load_anchor(base_path) if not also_baseline and base_path.is_file() else None
    check_repeats(base_runs, "--also-baseline")  # repeats pass the baseline-vs-candidate checks too
    check_repeats(cand_runs, "--also-candidate")
    base, cand = merge_repeats(base_runs), merge_repeats(cand_runs)
    # plan's figures are the stored baseline's (repeats of it are not what `gatekeeper plan` reads)
    resolution = None if also_baseline or not base_path.is_file() else _plan(suite, base, base_path, policy or suite.policy)
    return compare_for_suite(base, cand, suite, policy, seed=seed, anchor=anchor, plan=resolution)


def compare_for_suite(
    baseline: RunResults, candidate: RunResults, suite: Suite, policy: Policy | None = None, *, seed: int = 0,
    anchor: RunResults | None = None, plan: plans.Plan | None = None,
) -> Outcome:
    """Both runs belong to ``suite``, its names match the candidate, compare (with the anchor
    too, unless it holds the baseline's own values), attach snippets. ``plan``: the stored
    baseline's plan, whose figures the gate's MDE and resolution warnings are (``plans.with_plan``)."""
    fix_base = f"re-record the baseline: gatekeeper baseline promote RUN_DIR --suite {suite.path}"
    check_run_matches_suite(baseline, suite, what="baseline", fix=fix_base)
    check_suite_hash(baseline, suite)  # the hash alone, for a baseline without other provenance
    if anchor is not None and anchors.same_measurement(anchor, baseline):
        anchor = None
    if anchor is not None:
        fix_anchor = f"pin an anchor of the current suite: gatekeeper baseline pin --current --suite {suite.path} --reason ..."
        check_run_matches_suite(anchor, suite, what="anchor", fix=fix_anchor)
        check_suite_hash(anchor, suite)
    check_run_matches_suite(candidate, suite, what="candidate",
                            fix=f"re-run the candidate with this suite: gatekeeper run --suite {suite.path} ...")
    names.check_suite(suite, names.from_run(candidate), what="the candidate",
                      policy=policy)
    outcome = compare_runs(baseline, candidate, policy or suite.policy, suite=suite.name, seed=seed, anchor=anchor)
    if plan is not None:
        outcome = plans.with_plan(outcome, plan)
    attach_snippets(outcome)
    return outcome


# ----------------------------------------------------------------------------- storing a run


def record_run(run_dir: Path, suite: Suite, *, force: bool = False, path: Path | None = None) -> Path:
    """Store ``run_dir`` as the suite's first baseline; refuses to overwrite one unless ``force``."""
    target = Path(path) if path is not None else suite.baseline_path
    store.refuse_existing(target, force)  # before reading the run: the cheap check first
    return store.record_results(_run_for(run_dir, suite), suite, force=force, path=target)


def promote_run(run_dir: Path, suite: Suite, *, path: Path | None = None, history: bool = True,
                commit: str | None = None, log: Callable[[str], Any] | None = None) -> Path:
    """Replace the suite's baseline with ``run_dir``; the previous one moves to ``history/`` (and
    becomes the anchor when there is none yet); ``history``: the promotion is recorded. A run that
    is worse than the baseline it replaces is promoted all the same (a person asked for it), but
    ``log`` says what got worse and the history records each row's verdict."""
    results = _run_for(run_dir, suite)
    current = Path(path) if path is not None else suite.baseline_path
    store.check_target(current, suite, inside=path is None)  # never read through a planted link either
    if history:  # check everything, write last: a history that cannot take the entry stops it here
        trend.check_readable(current, suite, "promote", inside=path is None)
    replaced = _current(suite, current)
    if log is not None and replaced is not None:  # new data on purpose: say which dataset moved, and where from
        for name, was, now in dataset_moves(replaced.provenance.manifest, results.provenance.manifest):
            log(f"promote: dataset {name}: revision {was[:7]} → {now[:7]}")
    before = _against_current(results, suite, replaced)
    worse = [c for c in (before.comparisons if before is not None else [])
             if c.gated and c.verdict in ("regressed", "worse_within_margin", "inconclusive")]
    if worse and log is not None:
        log("promote: this run is worse than the baseline it replaces: " + "; ".join(
            f"{c.key.task} {c.key.metric} {c.test.delta:+.4f} ({c.verdict.replace('_', ' ')})" for c in worse))
    def dropped(why: str) -> None:
        if log is not None:
            log(f"promote: the anchor {anchors.anchor_path(current).name} cannot be compared with this run ({why}): "
                "it is dropped, and this run is the anchor from now on; to keep another reference, pin it on "
                f"purpose (gatekeeper baseline pin RUN_DIR --suite {suite.path} --reason ...)")

    written = store.promote_results(results, suite, path=path, on_dropped=dropped)
    if history:
        model = (results.provenance.manifest or {}).get("model") or results.provenance.model_name
        model = portable_path(model) if isinstance(model, str) else None
        entry = trend.entry_from_run(results, suite.policy, event="promote", verdict="promoted",
                                     baseline=written, commit=commit, model=model)
        if before is not None:  # each row: the replaced baseline's value and how the run compared
            rows = {str(c.key): c for c in before.comparisons}
            entry.rows = [dataclasses.replace(r, baseline=rows[r.key].test.baseline, verdict=rows[r.key].verdict)
                          if r.key in rows else r for r in entry.rows]
        trend.append(written, entry, suite, inside=path is None)
    return written


def _current(suite: Suite, baseline: Path) -> RunResults | None:
    """The baseline a promotion is about to replace; None when there is none or it cannot be read
    (the promotion replaces it all the same)."""
    if not baseline.is_file():
        return None
    try:
        with trusted_code(suite.include_path, tuple(suite.task_names)):
            return store.load_baseline(baseline)
    except GateError:
        return None


def _against_current(results: RunResults, suite: Suite, stored: RunResults | None) -> Outcome | None:
    """``results`` compared with the baseline it is about to replace (``_current``); None when
    there is none or it measured something else (a new suite hash, new data: nothing to compare)."""
    if stored is None:
        return None
    try:
        with trusted_code(suite.include_path, tuple(suite.task_names)):
            return compare_for_suite(stored, results, suite)
    except GateError:
        return None


def _not_looks(run_dir: Path, suite: Suite) -> None:
    """A sequential gate's folder holds looks, each a sample of the items: said at once, with the
    run that can be stored instead (``run --complete``), not after refusing each look in turn."""
    if not run_dir.is_dir() or (run_dir / "results.json").exists():
        return
    try:
        found = complete.look_folders(run_dir)
    except GateError:
        return
    if len(found) < 2:  # one look's own folder: the run's own check names it (a look is a sample)
        return
    done = run_dir / complete.COMPLETE
    fix = (f"store its completed run: {done}" if done.is_dir() else
           f"complete it first (`gatekeeper run --complete {run_dir} --suite {suite.path}` evaluates the items the "
           f"looks skipped), then store {done}")
    raise GateError(f"{run_dir}: a sequential gate's folder ({len(found)} look(s), each a sample of the items) is "
                    f"never a baseline; {fix}")


def pin_anchor(suite: Suite, *, run_dir: Path | None, reason: str, who: str | None,
               path: Path | None = None, commit: str | None = None) -> Path:
    """``baseline pin``: make ``run_dir`` (None: the current baseline) the anchor, on purpose, and
    record who moved it and why in the history."""
    if not reason.strip():
        raise GateError("baseline pin: --reason is empty; say why the anchor moves (it is kept in the history)")
    base = Path(path) if path is not None else suite.baseline_path
    if run_dir is None:
        if not base.is_file():
            raise GateError(f"{base}: no baseline to pin as the anchor")
        with trusted_code(suite.include_path, tuple(suite.task_names)):
            results = store.load_baseline(base)
        check_run_matches_suite(results, suite, what="baseline",
                                fix=f"re-record the baseline: gatekeeper baseline promote RUN_DIR --suite {suite.path}")
    else:
        results = _run_for(run_dir, suite)
    trend.check_readable(base, suite, "pin", inside=path is None)  # check everything, write last
    written = store.pin_anchor(results, suite, baseline=path)
    model = (results.provenance.manifest or {}).get("model") or results.provenance.model_name
    model = portable_path(model) if isinstance(model, str) else None
    trend.append(base, trend.entry_from_run(results, suite.policy, event="pin", verdict="pinned", baseline=base,
                                            commit=commit, model=model, who=who, why=reason.strip()),
                 suite, inside=path is None)
    return written


def _run_for(run_dir: Path, suite: Suite) -> RunResults:
    """A run that belongs to ``suite``, read for storing (no snippets; each multiple-choice item's
    margin, which an informative design reads from the baseline)."""
    _not_looks(Path(run_dir), suite)
    with trusted_code(suite.include_path, tuple(suite.task_names)):
        res = load_run(Path(run_dir), cluster_keys=suite.cluster_keys(), snippets=False, choice_margins=True)
    # Suite hash, task set, lm-eval pin, n-shot, seeds, limit: refused before the file is touched.
    check_run_matches_suite(res, suite, what="run", fix="re-run it with the current suite before storing "
                            f"it as the baseline (gatekeeper run --suite {suite.path} ...)")
    return res
