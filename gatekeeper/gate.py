"""``gatekeeper gate``: run the pinned suite, compare with the stored baseline, decide.

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

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gatekeeper import names
from gatekeeper.compare import Outcome, attach_snippets, compare_runs
from gatekeeper.model import GateError, RunResults
from gatekeeper.policy import Policy
from gatekeeper.trusted import trusted_code

if TYPE_CHECKING:
    from gatekeeper.names import RunPlan
    from gatekeeper.suite import Suite

_SEED_KEYS = {"random": "random_seed", "numpy": "numpy_seed", "torch": "torch_seed", "fewshot": "fewshot_seed"}


@dataclass
class GateResult:
    exit_code: int  # 0 pass / 1 regression
    outcome: Outcome | None  # None when this run became the first baseline
    notice: str | None
    run_dir: Path | None
    report_json: dict[str, Any] = field(default_factory=dict)


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
) -> GateResult:
    from gatekeeper import report, results, runner, store
    from gatekeeper.suite import load_suite

    suite = load_suite(suite_path)
    baseline_path = Path(baseline) if baseline else suite.baseline_path
    if baseline_path.exists() and not baseline_path.is_file():
        raise GateError(f"{baseline_path}: baseline path is a directory, expected a .json.gz file")
    if not baseline_path.exists() and not record_missing:
        # A typo in --baseline or a baseline missing in CI must not turn the candidate into the
        # reference it is judged against.
        raise GateError(
            f"{baseline_path}: no baseline file; record one on purpose with "
            "`gatekeeper gate --record-missing ...` (or `gatekeeper baseline record RUN_DIR --suite ...`)"
        )
    # Fail on a corrupt baseline before loading anything heavy, on a foreign one before lm-eval runs.
    with trusted_code(suite.include_path):  # the suite's task code may define !function aggregations
        stored = store.load_baseline(baseline_path) if baseline_path.is_file() else None

    def preflight(plan: RunPlan) -> None:
        if stored is not None:
            check_baseline_before(stored, suite, plan)

    run_dir = runner.run_suite(suite, model, Path(out_dir), revision=revision, device=device, log=log,
                               preflight=preflight)
    if stored is None:
        written = store.record(run_dir, suite, path=baseline_path)
        notice = (
            f"No baseline yet: recorded this run as the first baseline ({written}). "
            "Commit it so later runs are compared against it."
        )
        return GateResult(0, None, notice, run_dir, {"verdict": "pass", "notice": notice, "comparisons": []})
    with trusted_code(suite.include_path):
        candidate = results.load_run(run_dir, cluster_keys=suite.cluster_keys())
    outcome = compare_for_suite(stored, candidate, suite, policy)
    return GateResult(outcome.exit_code, outcome, None, run_dir, report.to_json(outcome))


def gate_run(
    suite_path: str | Path,
    run: str | Path,
    *,
    baseline: str | Path | None = None,
    policy: Policy | None = None,
) -> GateResult:
    """``gatekeeper gate --run``: gate a run made elsewhere (another job, ``gatekeeper merge``)
    against the stored baseline, without evaluating. A missing baseline is an error here (no
    ``--record-missing``): record one on purpose with ``gatekeeper baseline record``."""
    from gatekeeper import report
    from gatekeeper.suite import load_suite

    suite = load_suite(suite_path)
    base_path = Path(baseline) if baseline else suite.baseline_path
    if base_path.exists() and not base_path.is_file():
        raise GateError(f"{base_path}: baseline path is a directory, expected a .json.gz file")
    if not base_path.exists():
        raise GateError(f"{base_path}: no baseline file; record one on purpose with "
                        f"`gatekeeper baseline record {run} --suite {suite.path}`")
    outcome = compare_paths(base_path, run, suite, policy)
    return GateResult(outcome.exit_code, outcome, None, Path(run), report.to_json(outcome))


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
    from gatekeeper.compare import load_any, merge_repeats

    base_path = Path(baseline) if baseline is not None else suite.baseline_path
    if not base_path.exists():
        raise GateError(f"{base_path}: baseline does not exist (record one with `gatekeeper baseline record`)")
    from gatekeeper.compat import check_repeats

    keys = suite.cluster_keys()
    with trusted_code(suite.include_path):  # the suite's task code may define !function aggregations
        base_runs = [load_any(p, cluster_keys=keys) for p in [base_path, *also_baseline]]
        cand_runs = [load_any(p, cluster_keys=keys) for p in [candidate, *also_candidate]]
    check_repeats(base_runs, "--also-baseline")  # repeats pass the baseline-vs-candidate checks too
    check_repeats(cand_runs, "--also-candidate")
    base, cand = merge_repeats(base_runs), merge_repeats(cand_runs)
    return compare_for_suite(base, cand, suite, policy, seed=seed)


def compare_for_suite(
    baseline: RunResults, candidate: RunResults, suite: Suite, policy: Policy | None = None, *, seed: int = 0
) -> Outcome:
    """Both runs belong to ``suite``, its names match the candidate, compare, attach snippets."""
    from gatekeeper import store

    fix_base = f"re-record the baseline: gatekeeper baseline promote RUN_DIR --suite {suite.path}"
    check_run_matches_suite(baseline, suite, what="baseline", fix=fix_base)
    store.check_suite(baseline, suite)  # the hash alone, for a baseline without other provenance
    check_run_matches_suite(candidate, suite, what="candidate",
                            fix=f"re-run the candidate with this suite: gatekeeper run --suite {suite.path} ...")
    names.check_suite(suite, names.from_run(candidate), what="the candidate",
                      policy=policy)
    outcome = compare_runs(baseline, candidate, policy or suite.policy, suite=suite.name, seed=seed)
    attach_snippets(outcome)
    return outcome


# ----------------------------------------------------------------------------- belongs to the suite


def check_run_matches_suite(run: RunResults, suite: Suite, *, what: str = "run", fix: str | None = None) -> None:
    """Refuse a run (or stored baseline) measured under other conditions than ``suite``:
    suite hash, task set (the suite's tasks expanded through the run's groups), lm-eval version
    vs the pin, n-shot per task, seeds, limit, chat template. One line per difference."""
    fix = fix or f"re-run it with this suite (gatekeeper run --suite {suite.path} ...)"
    diffs = _run_differences(run, suite, f"the {what}")
    if diffs:
        src = run.provenance.source
        raise GateError("\n".join(f"{src}: {what} does not match suite {suite.path}: {d}; {fix}" for d in diffs))


def _run_differences(run: RunResults, suite: Suite, side: str) -> list[str]:
    prov = run.provenance
    man = prov.manifest or {}
    out: list[str] = []
    shard = man.get("shard")
    if isinstance(shard, dict):  # part of a run: gating it alone would judge 1/N of the items
        out.append(f"{side} is shard {shard.get('index')}/{shard.get('count')} of a run, not a whole run "
                   "(join the shards first: gatekeeper merge --out DIR SHARD_DIR...)")
        return out
    produced = names.from_run(run)
    leaves = set(prov.configs) | set(produced.leaves)
    covered: set[str] = set()
    for spec in suite.tasks:
        under = produced.leaves_under(spec.name)
        if not under:
            out.append(f"suite task {spec.name!r} is not in {side} (its tasks: {', '.join(sorted(leaves))})")
            continue
        covered.update(under)
        if spec.num_fewshot is not None:
            for leaf in under:
                if leaf in prov.n_shot and _shots(prov.n_shot[leaf]) != spec.num_fewshot:
                    out.append(f"task {leaf}: num_fewshot {_shots(prov.n_shot[leaf])} in {side}, "
                               f"{spec.num_fewshot} in the suite")
    extra = sorted(leaves - covered)
    if extra:
        out.append(f"{side} has task(s) the suite does not list: {', '.join(extra)}")
    if prov.lm_eval_version and prov.lm_eval_version != suite.lm_eval_version:
        out.append(f"lm-eval {prov.lm_eval_version} in {side}, suite pins {suite.lm_eval_version}")
    out += _seed_differences(prov.seeds, suite, side)
    if man.get("limit") is not None:
        out.append(f"{side} was made with --limit {man['limit']} (debugging only)")
    expected = _global_limit(suite)
    if not _same_number(prov.limit, expected):
        out.append(f"limit {prov.limit} in {side}, {expected} in the suite")
    out += _chat_template_difference(prov.chat_template_sha, suite, side)
    ran_with = man.get("suite_hash") or prov.suite_hash
    if ran_with and ran_with != suite.hash and not out:
        out.append(f"suite hash {ran_with[:12]} in {side}, {suite.hash[:12]} in the suite "
                   "(the suite changed what it measures)")
    return list(dict.fromkeys(out))


def check_baseline_before(stored: RunResults, suite: Suite, plan: RunPlan) -> None:
    """Before lm-eval evaluates: is the stored baseline comparable with this suite and these
    built tasks? lm-eval version, task set, task versions, n-shot, item counts (limit), seeds,
    chat template, the suite's gen_kwargs/repeats, suite hash. One line per difference."""
    diffs = baseline_differences(stored, suite, plan)
    if diffs:
        fix = f"re-record the baseline: gatekeeper baseline promote RUN_DIR --suite {suite.path}"
        src = stored.provenance.source
        raise GateError("\n".join(f"{src}: not comparable with suite {suite.path}: {d}; {fix}" for d in diffs))


def baseline_differences(stored: RunResults, suite: Suite, plan: RunPlan) -> list[str]:
    prov = stored.provenance
    out: list[str] = []
    if prov.lm_eval_version and prov.lm_eval_version != suite.lm_eval_version:
        out.append(f"lm-eval {prov.lm_eval_version} in the baseline, suite pins {suite.lm_eval_version}")
    base_tasks = set(prov.configs) | set(names.from_run(stored).leaves)
    run_tasks = set(plan.produced.leaves)
    if base_tasks - run_tasks:
        out.append(f"task(s) in the baseline, not in the suite: {', '.join(sorted(base_tasks - run_tasks))}")
    if run_tasks - base_tasks:
        out.append(f"task(s) in the suite, not in the baseline: {', '.join(sorted(run_tasks - base_tasks))}")
    for task in sorted(base_tasks & run_tasks):
        out += _task_differences(task, prov, plan)
    out += _seed_differences(prov.seeds, suite, "the baseline")
    out += _chat_template_difference(prov.chat_template_sha, suite, "the baseline")
    out += _spec_differences((prov.manifest or {}), suite)
    if prov.suite_hash and prov.suite_hash != suite.hash and not out:
        out.append(f"suite hash {prov.suite_hash[:12]} in the baseline, {suite.hash[:12]} in the suite "
                   "(the suite changed what it measures)")
    return list(dict.fromkeys(out))


def _task_differences(task: str, prov: Any, plan: RunPlan) -> list[str]:
    out = []
    if task in prov.task_versions and not _same_version(prov.task_versions[task], plan.versions.get(task)):
        out.append(f"task {task}: version {prov.task_versions[task]} in the baseline, "
                   f"{plan.versions.get(task)} in the suite's tasks")
    if task in prov.n_shot and _shots(prov.n_shot[task]) != _shots(plan.n_shot.get(task)):
        out.append(f"task {task}: num_fewshot {_shots(prov.n_shot[task])} in the baseline, "
                   f"{_shots(plan.n_shot.get(task))} in the suite")
    b, p = prov.n_samples.get(task) or {}, plan.n_samples.get(task) or {}
    if b and p and (b.get("original"), b.get("effective")) != (p["original"], p["effective"]):
        out.append(f"task {task}: {b.get('effective')} of {b.get('original')} items in the baseline, "
                   f"{p['effective']} of {p['original']} in this run (the limit or the data changed)")
    return out


def _spec_differences(manifest: dict[str, Any], suite: Suite) -> list[str]:
    """gen_kwargs / repeats per suite task, from the baseline run's manifest, and a --limit run."""
    out = []
    if manifest.get("limit") is not None:
        out.append(f"the baseline run was made with --limit {manifest['limit']} (debugging only)")
    recorded = {t.get("name"): t for t in manifest.get("tasks") or [] if isinstance(t, dict)}
    for spec in suite.tasks:
        old = recorded.get(spec.name)
        if old is None:
            continue
        for key in ("gen_kwargs", "repeats"):
            if old.get(key) != getattr(spec, key):
                out.append(f"tasks {spec.name}: {key} {old.get(key)} in the baseline, {getattr(spec, key)} in the suite")
    return out


def _seed_differences(seeds: dict[str, Any], suite: Suite, side: str) -> list[str]:
    out = []
    for short, long in _SEED_KEYS.items():
        if long in seeds and seeds[long] != suite.seeds.get(short):
            out.append(f"seed {short} {seeds[long]} in {side}, {suite.seeds.get(short)} in the suite")
    return out


def _chat_template_difference(sha: str | None, suite: Suite, side: str) -> list[str]:
    used, wanted = bool(sha), bool(suite.model.get("chat_template"))
    if used == wanted:
        return []
    return [f"chat template {'applied' if used else 'not applied'} in {side}, "
            f"chat_template: {str(wanted).lower()} in the suite"]


def _global_limit(suite: Suite) -> Any:
    # runner._limits: one limit for every task goes to lm-eval as `limit`, else per-task samples.
    distinct = {t.limit for t in suite.tasks}
    return distinct.pop() if len(distinct) == 1 else None


def _shots(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return -1


def _same_number(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    try:
        return math.isclose(float(a), float(b))
    except (TypeError, ValueError):
        return str(a) == str(b)


def _same_version(a: Any, b: Any) -> bool:
    # lm-eval writes a version as 1.0 for a task and "1.0" for a group.
    return _same_number(a, b) if a is not None and b is not None else a == b

