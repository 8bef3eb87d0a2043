"""Command-line front end. Exit codes: 0 no regression, 1 regression, 2 invalid input or usage."""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gatekeeper import __version__
from gatekeeper.errors import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, EXIT_INVALID, EXIT_OK, GateError
from gatekeeper.files import atomic_write_bytes
from gatekeeper.publish.ci import escape_controls, one_line, one_line_each
from gatekeeper.text import escape_untrusted

# The stages are imported inside the commands: `gatekeeper --help` and argument errors must not
# pay for numpy, scipy and jsonschema.


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # usage errors: exit 2 with one line, as argparse does
        self.exit(EXIT_INVALID, f"gatekeeper: error: {one_line(message)}\n")


# -- the printing edge: what gatekeeper writes to stdout/stderr can be read by a CI runner, which
# executes lines that start with "::" (or hold "##["). Untrusted values (task, metric and model
# names from results files) must stay on their line and never start one.


def _out(text: str) -> None:
    """Lines of ours on stdout, each made harmless (see ``publish.ci.one_line``)."""
    print(one_line_each(text))


def _err(text: str) -> None:
    """Progress lines on stderr, when stdout carries a machine-readable answer."""
    print(one_line_each(text), file=sys.stderr)


def _escaped(obj: Any, memo: dict[int, Any] | None = None) -> Any:
    """A copy of ``obj`` (dataclasses, lists, tuples, dicts) whose strings have their control
    characters escaped; unchanged parts are shared, not copied. For rendering only: the JSON
    report keeps the names as they are."""
    memo = {} if memo is None else memo
    if isinstance(obj, str):
        return escape_controls(obj)
    if id(obj) in memo:
        return memo[id(obj)]
    memo[id(obj)] = obj  # cycles end here
    new: Any = obj
    if isinstance(obj, (list, tuple)):
        items = [_escaped(x, memo) for x in obj]
        if any(a is not b for a, b in zip(items, obj, strict=True)):
            new = type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    elif isinstance(obj, dict):
        pairs = [(_escaped(k, memo), _escaped(v, memo)) for k, v in obj.items()]
        if any(k is not k0 or v is not v0 for (k, v), (k0, v0) in zip(pairs, obj.items(), strict=True)):
            new = dict(pairs)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changed = {f.name: v for f in dataclasses.fields(obj)
                   if (v := _escaped(getattr(obj, f.name), memo)) is not getattr(obj, f.name)}
        if changed:
            new = copy.copy(obj)
            for name, value in changed.items():
                object.__setattr__(new, name, value)  # frozen dataclasses too: this is our copy
    memo[id(obj)] = new
    return new


def _atomic_write(path: Path, text: str) -> None:
    """Write a report file whole or not at all."""
    atomic_write_bytes(Path(path), text.encode("utf-8"))


def _check_writable(*paths: str | None) -> None:
    """Fail before any work when a report cannot be written."""
    for p in paths:
        if p is None:
            continue
        parent = Path(p).resolve().parent
        probe = parent
        while not probe.exists():
            probe = probe.parent
        if not probe.is_dir() or not os.access(probe, os.W_OK):
            raise GateError(f"{p}: cannot write report (directory {probe} is not writable)")


def _emit(outcome, args: argparse.Namespace, extra: dict[str, Any] | None = None) -> int:
    from gatekeeper import report

    data = report.to_json(outcome)
    data.update(extra or {})
    if args.json:
        _atomic_write(Path(args.json), json.dumps(data, indent=2, allow_nan=False) + "\n")
    if args.markdown:
        _atomic_write(Path(args.markdown), report.render_markdown(outcome) + "\n")
    _out(report.render_terminal(_escaped(outcome)))
    if getattr(args, "mlflow", None) is not None:
        from gatekeeper.publish.tracking import log_gate

        logged = log_gate(args.mlflow or None, data, report.render_markdown(outcome), event="cli", commit=_commit())
        # A tracking problem is said, never the verdict: the exit code stays the gate's.
        print(("" if logged.ok else "warning: ") + logged.message, file=sys.stdout if logged.ok else sys.stderr)
    return outcome.exit_code


def _keeps_history(args: argparse.Namespace) -> bool:
    """gate appends to the suite's history, except with --no-history or --from-commit (whose
    baseline is a temporary copy of another commit's)."""
    return not args.no_history and not args.from_commit


def _commit() -> str | None:
    """The commit being gated, for the history: $GITHUB_SHA, else the working tree's HEAD."""
    sha = os.environ.get("GITHUB_SHA", "").strip()
    if re.fullmatch(r"[0-9a-f]{40}", sha):
        return sha
    try:
        from gatekeeper.baseline import gitbase

        return gitbase.head_commit(gitbase.find_repo(Path.cwd()))
    except (GateError, OSError):
        return None


def _who() -> str | None:
    """Who pins an anchor: $GITHUB_ACTOR, else git's user.name, else $USER."""
    if os.environ.get("GITHUB_ACTOR"):
        return os.environ["GITHUB_ACTOR"]
    try:
        name = subprocess.run(["git", "config", "user.name"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        name = ""
    return name or os.environ.get("USER") or None


def _policy_from_args(args: argparse.Namespace):
    """The policy (file values, then command-line overrides) and the suite when --policy names one."""
    from gatekeeper.suite.policy import Policy
    from gatekeeper.suite.suite import read_policy_file

    policy, suite = read_policy_file(args.policy) if args.policy else (Policy(), None)
    # Command-line values override the file; None means "not given".
    if args.alpha is not None:
        policy.alpha = args.alpha
    if args.margin is not None:
        policy.margin = args.margin
        policy.margin_where = "--margin"
    if args.correction is not None:
        policy.correction = args.correction
    if args.resamples is not None:
        policy.resamples = args.resamples
    policy.validate("command line")
    return policy, suite


def _compare_parser(sub: Any) -> None:
    p = sub.add_parser("compare", help="compare two lm-eval runs (or a baseline file and a run)")
    p.add_argument("baseline", help="lm-eval output dir, model subfolder, results_*.json, or baseline .json.gz")
    p.add_argument("candidate", help="same forms as BASELINE")
    _add_policy_flags(p)
    _add_report_flags(p)
    p.add_argument("--seed", type=_seed_flag, default=0, help="seed for resampling, >= 0 (default 0)")
    p.add_argument("--also-baseline", action="append", default=[], metavar="PATH",
                   help="another run of the baseline model (other seed); values are averaged per item")
    p.add_argument("--also-candidate", action="append", default=[], metavar="PATH",
                   help="another run of the candidate model (other seed); values are averaged per item")
    _add_mlflow(p)
    p.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    from gatekeeper.baseline.store import load_any
    from gatekeeper.compare.compare import attach_snippets, compare_runs, merge_repeats
    from gatekeeper.compare.compat import check_repeats
    from gatekeeper.gate import compare_paths
    from gatekeeper.suite import names

    _check_writable(args.json, args.markdown)
    policy, suite = _policy_from_args(args)
    if suite is not None:  # the one path gate and the action take
        outcome = compare_paths(args.baseline, args.candidate, suite, policy, seed=args.seed,
                                also_baseline=args.also_baseline, also_candidate=args.also_candidate)
        return _emit(outcome, args)
    base_runs = [load_any(p) for p in [args.baseline, *args.also_baseline]]
    cand_runs = [load_any(p) for p in [args.candidate, *args.also_candidate]]
    check_repeats(base_runs, "--also-baseline")
    check_repeats(cand_runs, "--also-candidate")
    baseline, candidate = merge_repeats(base_runs), merge_repeats(cand_runs)
    if args.policy:  # a plain policy file: each rule must match something in the runs
        names.check_policy(policy, args.policy, names.union(names.from_run(baseline), names.from_run(candidate)))
    outcome = compare_runs(baseline, candidate, policy, seed=args.seed)
    attach_snippets(outcome)
    return _emit(outcome, args)


@contextlib.contextmanager
def _measurement(args: argparse.Namespace, *, need_baseline: bool) -> Iterator[tuple[Any, Path | None]]:
    """(suite, baseline or None) from the working tree, or with ``--from-commit SHA`` from that
    commit's git objects (suite, include_path tree, baseline; baseline/prbase.py): how a shard job
    of a pull request evaluates the PR's checkpoint with its base commit's tasks."""
    from gatekeeper.suite.suite import load_suite

    if not args.from_commit:
        yield load_suite(args.suite), None
        return
    from gatekeeper.baseline import gitbase
    from gatekeeper.baseline.prbase import base_tree

    sha = gitbase.check_sha(args.from_commit, "--from-commit")
    with base_tree(Path.cwd(), sha, args.suite, why=f"run from commit {sha[:7]}", need_baseline=need_baseline) as tree:
        _out(f"note: suite, tasks and baseline from commit {sha[:7]} (the working tree supplies the model only)")
        yield tree.suite, tree.baseline


def _run_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="run the pinned suite with lm-eval and record provenance")
    p.add_argument("--suite", required=True)
    p.add_argument("--model", help="local checkpoint dir or hub id (required unless --complete)")
    p.add_argument("--revision")
    p.add_argument("--out", help="output directory (required unless --complete)")
    p.add_argument("--device", help="auto | cpu | cuda | cuda:N (default: the suite's, else auto)")
    p.add_argument("--batch-size", help="override the suite's batch size (int or auto)")
    p.add_argument("--dtype", help="override the suite's dtype")
    p.add_argument("--limit", type=float, help="override every task's limit (debugging only)")
    p.add_argument("--shard", metavar="K/N",
                   help="evaluate only shard K of N (K from 1): 1/N of every task's items; "
                        "join the N shard folders with `gatekeeper merge`")
    p.add_argument("--cache", metavar="DIR", help="keep lm-eval's request cache here: a killed run "
                   "resumes, an unchanged model re-runs free (default: $GATEKEEPER_CACHE, else off)")
    p.add_argument("--look", metavar="K/L", help="evaluate only look K of a sequential gate of L looks (one wave of a "
                   "sharded workflow; with --shard k/N the k-th slice of it); judge with `gate --sequential --run DIR`")
    p.add_argument("--done", metavar="TASKS", help="with --look: tasks earlier looks stopped (comma-separated; the "
                   "judge's report names them in sequential.next.done)")
    p.add_argument("--complete", metavar="DIR", help="finish a stopped `gate --sequential --out DIR`: evaluate the "
                   "items it skipped and write the whole run to DIR/complete (for baseline record|promote)")
    p.add_argument("--new-data", action="store_true",
                   help="evaluate every hub dataset at its current head, not at the commit the baseline recorded "
                        "(to re-record the baseline on new data on purpose; promote then names each move)")
    _add_from_commit(p)
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from gatekeeper.run import runner
    from gatekeeper.run.shard import parse_shard

    if args.complete:
        return _complete(args)
    missing = [flag for flag, value in (("--model", args.model), ("--out", args.out)) if not value]
    if missing:
        raise GateError(f"run: {' and '.join(missing)} required (or --complete DIR to finish a sequential gate)")
    if args.done and not args.look:
        raise GateError("run: --done goes with --look K/L (the tasks earlier looks stopped)")
    shard = parse_shard(args.shard) if args.shard else None
    with _measurement(args, need_baseline=False) as (suite, baseline):
        # The look's item order comes from the measured suite (with --from-commit the base
        # commit's): a pull request cannot choose which items a look evaluates.
        look = _look_flag(args, shard, suite) if args.look else None
        return _run(args, runner, suite, None if look else shard, look, baseline)


def _look_flag(args: argparse.Namespace, shard: Any, suite: Any) -> Any:
    """``run --look K/L [--done T,...] [--shard k/N]``: one look of a sequential gate (a wave of a
    sharded workflow; with --shard, the k-th of N slices of the look's documents)."""
    from gatekeeper.run.looks import Look

    m = re.fullmatch(r"([0-9]{1,2})/([0-9]{1,2})", args.look.strip())
    if not m or not (2 <= int(m.group(2)) <= 10 and 1 <= int(m.group(1)) <= int(m.group(2))):
        raise GateError(f"--look {args.look}: expected K/L with 1 <= K <= L and 2 <= L <= 10 (e.g. 2/4)")
    done = frozenset(t.strip() for t in (args.done or "").split(",") if t.strip())
    part = (shard.index, shard.count) if shard is not None else None
    return Look(int(m.group(1)), int(m.group(2)), suite.random_seed, done, part=part)  # as gate --sequential orders


def _complete(args: argparse.Namespace) -> int:
    """``run --complete DIR``: evaluate what a sequential gate skipped; the whole run for
    ``baseline record|promote`` (``run/complete.py``)."""
    from gatekeeper.run import complete
    from gatekeeper.suite.suite import load_suite

    clash = [flag for flag, value in (("--model", args.model), ("--out", args.out), ("--shard", args.shard),
                                      ("--limit", args.limit), ("--dtype", args.dtype), ("--look", args.look),
                                      ("--batch-size", args.batch_size), ("--revision", args.revision),
                                      ("--from-commit", args.from_commit)) if value]
    if clash:
        raise GateError(f"run --complete: {', '.join(clash)} does not apply (the looks' model and settings are used, "
                        "the whole run is written to DIR/complete)")
    run_dir = complete.complete(Path(args.complete), load_suite(args.suite), device=args.device, log=_out)
    _out(f"completed run written to {run_dir}; store it with: gatekeeper baseline promote {run_dir} "
         f"--suite {args.suite}")
    return EXIT_OK


def _run(args: argparse.Namespace, runner: Any, suite: Any, shard: Any, look: Any = None,
         baseline: Path | None = None) -> int:
    from gatekeeper.gate import baseline_checks

    # A shard or wave is judged against the baseline: its hub datasets at the baseline's commits,
    # and its items checked against the baseline's before the model loads.
    lock, items_check = ({}, None) if args.new_data else baseline_checks(baseline or suite.baseline_path, suite)
    run_dir = runner.run_suite(
        suite,
        args.model,
        Path(args.out),
        revision=args.revision,
        device=args.device,
        batch_size=args.batch_size,
        dtype=args.dtype,
        limit=args.limit,
        log=_out,  # progress lines quote task names and lm-eval's messages
        shard=shard,
        cache_dir=args.cache,
        look=look,
        lock=lock,
        new_data=args.new_data,
        items_check=items_check,
    )
    if look is not None:
        what = f"look {look.index}/{look.count}" + (f" part {look.part[0]}/{look.part[1]}" if look.part else "")
    else:
        what = f"shard {shard}" if shard else "run"
    _out(f"{what} written to {run_dir}")
    return EXIT_OK


def _merge_parser(sub: Any) -> None:
    p = sub.add_parser("merge", help="join the N folders of `run --shard K/N` into one run")
    p.add_argument("--out", required=True, help="output directory for the merged run")
    p.add_argument("shards", nargs="+", metavar="SHARD_DIR", help="the shard folders, all N of them")
    p.set_defaults(func=cmd_merge)


def cmd_merge(args: argparse.Namespace) -> int:
    from gatekeeper.run.merge import merge_shards

    run_dir = merge_shards([Path(d) for d in args.shards], Path(args.out))
    _out(f"merged {len(args.shards)} shards into {run_dir}")
    return EXIT_OK


def _gate_parser(sub: Any) -> None:
    p = sub.add_parser("gate", help="run the suite (or take --run), compare with the stored baseline, decide")
    p.add_argument("--suite", required=True)
    p.add_argument("--model", help="checkpoint to evaluate now (local dir or hub id)")
    p.add_argument("--run", metavar="RUN_DIR",
                   help="gate an existing run (`gatekeeper run` or `merge` output) without evaluating")
    p.add_argument("--revision")
    p.add_argument("--baseline", help="baseline file (default: the suite's)")
    p.add_argument("--out", help="run output directory (default: a temporary directory)")
    p.add_argument("--record-missing", action="store_true",
                   help="when the baseline file does not exist, record this run as the first baseline "
                        "(without it, a missing baseline is an error)")
    p.add_argument("--device")
    _add_report_flags(p)
    p.add_argument("--print-markdown", action="store_true", help="also print the markdown report")
    p.add_argument("--sequential", action="store_true",
                   help="evaluate the items in looks of a seeded random order and stop as soon as the verdict is "
                        "known (O'Brien-Fleming alpha spending, beta-spending futility); a sample, never a baseline")
    p.add_argument("--looks", type=int, help="with --sequential: how many looks, 2 to 10 (default: the suite's "
                   "policy.sequential.looks, else 4)")
    p.add_argument("--items", choices=("uniform", "informative"),
                   help="informative: read the items the baseline says are likely to flip first (its multiple-choice "
                        "margins), stage by stage, until the flips read hold most of the information, and test the "
                        "whole suite's change once from them; uniform: every item (default: the suite's "
                        "policy.items, else uniform); a sample, never a baseline")
    p.add_argument("--no-history", action="store_true",
                   help="do not append this gate to the suite's history (<baseline>.trend.jsonl)")
    p.add_argument("--dry-run", action="store_true",
                   help="check everything a gate checks before it pays for the model (suite, task names, datasets, "
                        "baseline, margins, device), print the items, a time estimate and 3 rendered prompts per "
                        "task; evaluate nothing")
    _add_mlflow(p)
    _add_from_commit(p)
    p.set_defaults(func=cmd_gate)


def cmd_gate(args: argparse.Namespace) -> int:
    from gatekeeper import report
    from gatekeeper.gate import gate_run

    _check_writable(args.json, args.markdown)
    if (args.model is None) == (args.run is None):
        raise GateError("gate: give --model (evaluate now) or --run RUN_DIR (gate an existing run)"
                        + (", not both" if args.model is not None else ""))
    if args.items == "informative" and (args.run is not None or args.record_missing):
        raise GateError("gate --items informative: " + ("--run gates a run that read every item; the informative read "
                        "evaluates as it goes (--model)" if args.run is not None else "--record-missing does not apply "
                        "(it reads a sample of the items; record the baseline from a whole run)"))
    if args.dry_run:
        return _dry_run(args)
    if args.sequential and args.run is not None:
        return _judge_looks(args)
    if args.run is not None:
        if args.record_missing or args.out or args.revision or args.device:
            raise GateError("gate --run: --record-missing, --out, --revision and --device apply only to "
                            "--model; record a baseline with `gatekeeper baseline record RUN_DIR --suite ...`")
        if args.looks:
            raise GateError("gate --run: --looks goes with --sequential (judging a folder of looks); a whole run "
                            "has no looks")
        with _measurement(args, need_baseline=True) as (suite, base_baseline):
            result = gate_run(suite.path, args.run, baseline=base_baseline or args.baseline,
                              history=_keeps_history(args), commit=_commit())
        code = _emit(result.outcome, args, {"run_dir": str(result.run_dir)})
        if args.print_markdown:
            print()
            _out(report.render_markdown(result.outcome))
        return code
    try:
        return _gate_model(args)
    except GateError as exc:  # exit 2: the report still says why, for the artifact and the summary
        if args.json:
            _atomic_write(Path(args.json), json.dumps(report.error_json(
                str(exc), suite=_suite_name(args.suite), model=args.model, suite_file=args.suite,
                baseline=args.baseline, commit=_commit()), indent=2, allow_nan=False) + "\n")
        raise


def _suite_name(path: str) -> str | None:
    from gatekeeper.suite.suite import load_suite

    try:
        return load_suite(path).name
    except GateError:
        return None


def _gate_model(args: argparse.Namespace) -> int:
    from gatekeeper import report
    from gatekeeper.gate import run_gate

    # Without --out the run is a temp folder, removed when the gate is done (kept with --out).
    out = args.out or tempfile.mkdtemp(prefix="gatekeeper-run-")
    try:
        if args.from_commit and (args.record_missing or args.baseline):
            raise GateError("gate --from-commit: the commit's own baseline is used; --baseline and "
                            "--record-missing do not apply")
        with _measurement(args, need_baseline=True) as (suite, base_baseline):
            looks = _informative_looks(args, suite)
            if _items(args, suite) == "informative":
                from gatekeeper.gate import run_informative_gate

                result = run_informative_gate(suite.path, args.model, out_dir=out, baseline=base_baseline or args.baseline,
                                              revision=args.revision, device=args.device, log=_out)
            elif looks:
                from gatekeeper.gate import run_sequential_gate

                result = run_sequential_gate(suite.path, args.model, out_dir=out, looks=looks,
                                             baseline=base_baseline or args.baseline, revision=args.revision,
                                             device=args.device, log=_out)
            else:
                result = run_gate(suite.path, args.model, out_dir=out, baseline=base_baseline or args.baseline,
                                  record_missing=args.record_missing, revision=args.revision, device=args.device,
                                  log=_out, history=_keeps_history(args), commit=_commit())
        if result.outcome is None:
            _out(result.notice)
            if args.json:
                _atomic_write(Path(args.json), json.dumps(result.report_json, indent=2, allow_nan=False) + "\n")
            if args.markdown:
                _atomic_write(Path(args.markdown), f"### ✅ {escape_untrusted(result.notice, 1000)}\n")
            return EXIT_OK
        extra = {"run_dir": str(result.run_dir)} if args.out else {}
        for key in ("sequential", "informative"):
            if key in result.report_json:
                extra[key] = result.report_json[key]
        code = _emit(result.outcome, args, extra or None)
        if args.print_markdown:
            print()
            _out(report.render_markdown(result.outcome))
        return code
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)


def _looks(args: argparse.Namespace, suite: Any) -> int:
    """How many looks a gate with ``--model`` takes (0: one whole run): ``--sequential`` or the
    suite's policy.sequential; recording a first baseline needs a whole run."""
    sequential = args.sequential or (suite.policy.sequential_looks and not args.record_missing)
    if args.looks and not sequential:
        raise GateError("gate: --looks goes with --sequential (or a suite with policy.sequential); "
                        + ("--record-missing evaluates every item" if args.record_missing
                           else "without it every item is evaluated at once"))
    if sequential and args.record_missing:
        raise GateError("gate --sequential: --record-missing does not apply (a sequential gate "
                        "evaluates a sample of the items; record the baseline from a whole run)")
    return (args.looks or suite.policy.sequential_looks or 4) if sequential else 0


def _items(args: argparse.Namespace, suite: Any) -> str:
    """``--items``, else the suite's policy.items; recording a first baseline, or an explicit
    ``--sequential``, reads uniformly."""
    if args.items:
        return args.items
    return "uniform" if args.record_missing or args.sequential else suite.policy.items


def _informative_looks(args: argparse.Namespace, suite: Any) -> int:
    """``_looks``, refusing looks with ``--items informative`` (its own stages, one test)."""
    looks = _looks(args, suite)
    if looks and _items(args, suite) == "informative":
        raise GateError("gate --items informative: not with a sequential gate's looks (--sequential or the "
                        "suite's policy.sequential); it reads its own stages and tests once")
    return looks


def _dry_run(args: argparse.Namespace) -> int:
    """``gate --dry-run``: the checks and a few rendered prompts, no evaluation; with the flags of
    the gate it rehearses (--record-missing, --sequential, --looks) and its refusals."""
    from gatekeeper.gate import dry_run_gate

    clash = [flag for flag, on in (("--run", args.run), ("--out", args.out),
                                   ("--json", args.json), ("--markdown", args.markdown)) if on]
    if clash:
        raise GateError(f"gate --dry-run: {', '.join(clash)} does not apply (a dry run evaluates nothing and "
                        "writes nothing)")
    if args.model is None:
        raise GateError("gate --dry-run: give --model (the checkpoint the gate would evaluate)")
    if args.from_commit and (args.record_missing or args.baseline):
        raise GateError("gate --from-commit: the commit's own baseline is used; --baseline and "
                        "--record-missing do not apply")
    with _measurement(args, need_baseline=True) as (suite, base_baseline):
        _out(dry_run_gate(suite.path, args.model, baseline=base_baseline or args.baseline, revision=args.revision,
                          device=args.device, log=_out, record_missing=args.record_missing,
                          looks=_informative_looks(args, suite), items=_items(args, suite)))
    return EXIT_OK


def _judge_looks(args: argparse.Namespace) -> int:
    """``gate --sequential --run DIR``: the looks a sharded workflow evaluated, judged; when they
    do not decide yet, which look comes next (exit 0, verdict "continue")."""
    from gatekeeper.gate import judge_looks

    if args.record_missing or args.out or args.revision or args.device or args.looks:
        raise GateError("gate --sequential --run: --record-missing, --out, --revision, --device and --looks do not "
                        "apply (the looks in the folder were evaluated with their own)")
    with _measurement(args, need_baseline=True) as (suite, base_baseline):
        result = judge_looks(suite.path, args.run, baseline=base_baseline or args.baseline, log=_out)
    info = result.report_json["sequential"]
    if info.get("next") is None:
        return _emit(result.outcome, args, {"sequential": info})
    data = {**result.report_json, "verdict": "continue"}
    if args.json:
        _atomic_write(Path(args.json), json.dumps(data, indent=2, allow_nan=False) + "\n")
    if args.markdown:
        _atomic_write(Path(args.markdown), f"### ⏳ {escape_untrusted(info['summary'], 1000)}\n")
    return EXIT_OK  # the summary (logged above) says which look comes next


def _init_parser(sub: Any) -> None:
    p = sub.add_parser("init", help="write a suite, task templates and a pull-request workflow")
    p.add_argument("--tasks", metavar="T1,T2", help="lm-eval tasks, groups or tags to gate (bundled, or in "
                   "--include-path); each must exist")
    p.add_argument("--new-task", action="append", default=[], metavar="NAME",
                   help="write a multiple-choice task template NAME (and a data file) to fill in; repeatable")
    p.add_argument("--include-path", help="folder of your task YAMLs, relative to --out (default: tasks, "
                   "when --new-task writes one)")
    p.add_argument("--name", help="suite name (default: the --out folder's name)")
    p.add_argument("--model", default="checkpoints/candidate",
                   help="where pull requests put the checkpoint, relative to the repository (for the workflow)")
    p.add_argument("--out", default=".", help="folder to write into, the repository root (default: .)")
    p.add_argument("--no-workflow", action="store_true", help="do not write .github/workflows/gatekeeper.yml")
    p.set_defaults(func=cmd_init)


def cmd_init(args: argparse.Namespace) -> int:
    from gatekeeper.suite.scaffold import plan

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise GateError(f"{out}: --out is a file, expected a folder")
    tasks = [t.strip() for t in (args.tasks or "").split(",") if t.strip()]
    written = plan(tasks, args.new_task, name=args.name or _default_name(out), include_path=args.include_path,
                   model=args.model, out=out, workflow=not args.no_workflow).files
    # Nothing is written over: a file that exists stops everything before the first write.
    existing = [p for p in written if (out / p).exists()]
    if existing:
        raise GateError(f"{out / existing[0]}: already exists; gatekeeper init never writes over a file "
                        f"(move it away, or pass --out to write elsewhere)")
    for rel, text in written.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(out / rel, text.encode("utf-8"), exclusive=True)
        _out(f"wrote {out / rel}")
    _out(f"next: record the first baseline on the runner that will gate, then commit it:\n"
         f"  gatekeeper gate --suite {out / 'gatekeeper.yaml'} --model BASE_CHECKPOINT --record-missing\n"
         "then docs/zero-to-green.md from step 5")
    return EXIT_OK


def _default_name(out: Path) -> str:
    """The folder's name as a suite name (lowercase; other characters become '-')."""
    name = re.sub(r"[^a-z0-9._-]+", "-", Path(os.path.abspath(out)).name.lower()).strip("-.")
    return name or "suite"


def _baseline_parser(sub: Any) -> None:
    p = sub.add_parser("baseline", help="record, promote or show the stored baseline")
    bsub = p.add_subparsers(dest="action", required=True, parser_class=_Parser)
    for action, text in (("record", "record RUN_DIR as the suite's first baseline"),
                         ("promote", "make RUN_DIR the new baseline, keeping the old one in history/")):
        q = bsub.add_parser(action, help=text)
        q.add_argument("run_dir", help="a `gatekeeper run` output directory")
        q.add_argument("--suite", required=True, help="suite file")
        if action == "record":
            q.add_argument("--force", action="store_true", help="overwrite an existing baseline")
        q.set_defaults(func=cmd_baseline)
    q = bsub.add_parser("show", help="summarise a baseline file")
    q.add_argument("file", nargs="?", help="baseline file (default: the suite's)")
    q.add_argument("--suite", help="suite file whose baseline to show")
    q.set_defaults(func=cmd_baseline)
    q = bsub.add_parser("pin", help="make RUN_DIR (or --current, the baseline) the anchor: the reference that "
                        "promotions never move")
    q.add_argument("run_dir", nargs="?", help="a `gatekeeper run` output directory")
    q.add_argument("--current", action="store_true", help="pin the current baseline as the anchor")
    q.add_argument("--suite", required=True, help="suite file")
    q.add_argument("--reason", required=True, help="why the anchor moves (kept in the history)")
    q.add_argument("--who", help="who approved it (default: $GITHUB_ACTOR, else git's user.name)")
    q.set_defaults(func=cmd_baseline)


def cmd_baseline(args: argparse.Namespace) -> int:
    from gatekeeper.baseline import store
    from gatekeeper.gate import promote_run, record_run
    from gatekeeper.suite.suite import load_suite

    if args.action == "show":
        if args.file:
            path = Path(args.file)
        elif args.suite:
            path = load_suite(args.suite).baseline_path
        else:
            raise GateError("baseline show: give a baseline FILE or --suite")
        _out(store.show(path))
        return EXIT_OK
    suite = load_suite(args.suite)
    if args.action == "pin":
        from gatekeeper.gate import pin_anchor

        if (args.run_dir is None) == (not args.current):
            raise GateError("baseline pin: give RUN_DIR (that run becomes the anchor) or --current (the current "
                            "baseline does), not both")
        path = pin_anchor(suite, run_dir=None if args.current else Path(args.run_dir), reason=args.reason,
                          who=args.who or _who(), commit=_commit())
        _out(f"anchor written to {path} (recorded in the history: {args.reason.strip()})")
        return EXIT_OK
    if args.action == "record":
        path = record_run(Path(args.run_dir), suite, force=args.force)
    else:
        path = promote_run(Path(args.run_dir), suite, commit=_commit(), log=_out)
    _out(f"baseline written to {path}")
    return EXIT_OK


def _history_parser(sub: Any) -> None:
    p = sub.add_parser("history", help="the suite's gates over time: values, anchor, verdicts, a sparkline")
    p.add_argument("--suite", required=True)
    p.add_argument("--baseline", help="baseline file whose history to show (default: the suite's)")
    p.add_argument("--metric", action="append", metavar="KEY",
                   help="task/metric,filter, task/metric or a metric name; repeatable (default: every gated one)")
    p.add_argument("--format", choices=["terminal", "markdown", "json"], default="terminal")
    p.set_defaults(func=cmd_history)


def cmd_history(args: argparse.Namespace) -> int:
    from gatekeeper.baseline import trend
    from gatekeeper.report import trend as draw
    from gatekeeper.suite.suite import load_suite

    suite = load_suite(args.suite)
    path = Path(args.baseline) if args.baseline else suite.baseline_path
    entries, summary = trend.read_trend(path)
    metrics = _metric_keys(args.metric, entries, trend.trend_path(path)) if args.metric else None
    if args.format == "json":
        print(json.dumps(draw.to_json(entries, summary, metrics), indent=2, allow_nan=False))
    elif args.format == "markdown":
        _out(draw.markdown(entries, metrics) or "_No history yet._")
    else:
        _out(draw.terminal(entries, metrics))
    return EXIT_OK


def _plan_parser(sub: Any) -> None:
    p = sub.add_parser("plan", help="what the suite can resolve, from the baseline's items: MDE, items needed, "
                       "the sequential saving; before the first GPU hour")
    p.add_argument("--suite", required=True)
    p.add_argument("--baseline", help="baseline file to plan from (default: the suite's)")
    p.add_argument("--against", metavar="RUN", help="a second run of the same items (run folder or baseline file) to "
                   "measure how much a harmless change moves them (default: the anchor, else the newest history/ entry)")
    p.add_argument("--flip-rate", type=lambda t: _number_flag(t, float), metavar="SHARE",
                   help="right/wrong items: the share that flips between two harmless checkpoints "
                        "(default: measured on the second run, else 0.05 assumed)")
    p.add_argument("--looks", type=lambda t: _number_flag(t, int), help="looks of the sequential gate to plan for "
                   "(default: the suite's policy.sequential, else 4)")
    p.add_argument("--mutants", metavar="MODEL", help="build standard defects (weight noise, a dropped layer, a reset "
                   "norm, swapped embeddings, int4) and harmless variants (float16 round trip, another batch size) of "
                   "this local checkpoint, gate each against a run of MODEL, print what the suite catches")
    p.add_argument("--out", help="with --mutants: keep the reference run, gates (and with --keep the variants) here")
    p.add_argument("--fixed", action="store_true", help="with --mutants: evaluate every item (default: sequential)")
    p.add_argument("--items", choices=("informative",), help="with --mutants: grade gate --items informative (its "
                   "stages cut from each variant's run of every item) instead of the sequential gate")
    p.add_argument("--keep", action="store_true", help="with --mutants: keep each variant's checkpoint")
    p.add_argument("--device", help="with --mutants: auto | cpu | cuda | cuda:N")
    p.add_argument("--format", choices=["terminal", "markdown", "json"], default="terminal")
    p.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    from gatekeeper import gate
    from gatekeeper.report import plan as show

    if args.mutants:
        return _plan_mutants(args)
    if args.out or args.fixed or args.keep or args.items:
        raise GateError("plan: --out, --fixed, --items and --keep go with --mutants MODEL (the plan of a baseline "
                        "prints the informative gate's expected share already)")
    result = gate.plan_suite(args.suite, baseline=args.baseline, against=args.against, flip_rate=args.flip_rate,
                             looks=args.looks)
    return _show(args.format, result, show.to_json, show.to_markdown, show.to_terminal)


def _show(fmt: str, result: Any, as_json: Any, as_markdown: Any, as_terminal: Any) -> int:
    """Print ``result`` as ``--format`` asks (JSON unescaped, it is data; the others line-safe)."""
    if fmt == "json":
        print(json.dumps(as_json(result), indent=2, allow_nan=False))
    elif fmt == "markdown":
        _out(as_markdown(result))
    else:
        _out(as_terminal(result))
    return EXIT_OK


def _plan_mutants(args: argparse.Namespace) -> int:
    """``plan --mutants MODEL``: the suite's catch rate and false-alarm rate on standard variants."""
    from gatekeeper import gate
    from gatekeeper.report import plan as show

    clash = [flag for flag, value in (("--baseline", args.baseline), ("--against", args.against),
                                      ("--flip-rate", args.flip_rate)) if value is not None]
    if clash:
        raise GateError(f"plan --mutants: {', '.join(clash)} does not apply (the variants are gated against a fresh "
                        "run of MODEL)")
    if args.fixed and args.looks:
        raise GateError("plan --mutants --fixed: --looks does not apply (the fixed gate evaluates every item at once)")
    if args.items and (args.fixed or args.looks):
        raise GateError("plan --mutants --items informative: --fixed and --looks do not apply (it grades the "
                        "informative gate's own stages)")
    with contextlib.ExitStack() as stack:
        out = args.out or stack.enter_context(tempfile.TemporaryDirectory(prefix="gatekeeper-mutants-"))
        result = gate.plan_mutants(args.suite, args.mutants, out_dir=out, sequential_gate=not args.fixed and not args.items,
                                   looks=args.looks, device=args.device, keep=args.keep, items=args.items or "uniform",
                                   log=_err if args.format == "json" else _out)  # JSON alone on stdout
    return _show(args.format, result, show.mutants_json, show.mutants_markdown, show.mutants_terminal)


def _metric_keys(wanted: list[str], entries: list, where: Path) -> list[str]:
    """The history keys each ``--metric`` names: a key (task/metric,filter), task/metric (any
    filter) or a metric name (every task). One that names nothing is an error."""
    keys = sorted({r.key for e in entries for r in e.rows})
    out: list[str] = []
    for w in wanted:
        hits = [k for k in keys if w in (k, k.split(",", 1)[0], k.split("/", 1)[-1].split(",", 1)[0])]
        if not hits:
            close = difflib.get_close_matches(w, keys, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else (f"; it has: {', '.join(keys[:6])}" if keys else
                                                                   "; it has no entries yet")
            raise GateError(f"{where}: --metric {w!r} matches no metric in the history{hint}")
        out += hits
    return list(dict.fromkeys(out))


def _alpha_flag(text: str) -> float:
    from gatekeeper.suite.policy import alpha_problem

    value = _number_flag(text, float)
    if alpha_problem(value):
        raise argparse.ArgumentTypeError(alpha_problem(value))
    return value


def _resamples_flag(text: str) -> int:
    from gatekeeper.suite.policy import resamples_problem

    value = _number_flag(text, int)
    if resamples_problem(value):
        raise argparse.ArgumentTypeError(resamples_problem(value))
    return value


def _seed_flag(text: str) -> int:
    value = _number_flag(text, int)
    if value < 0:  # numpy refuses negative seeds deep inside the statistics, blaming a metric
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {value}")
    return value


def _number_flag(text: str, kind: type) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                         f"got {text!r}") from None


def _add_policy_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", "--suite", dest="policy", metavar="FILE",
                   help="YAML policy file, or a suite file (its policy, cluster keys and name)")
    p.add_argument("--alpha", type=_alpha_flag, help="significance level, 1e-6 to 0.5 (default 0.05)")
    p.add_argument("--margin", type=float, help="default margin in each metric's units (default 0)")
    p.add_argument("--correction", choices=["holm", "bonferroni", "bh", "none"],
                   help="multiplicity correction over gated metrics (default holm)")
    p.add_argument("--resamples", type=_resamples_flag,
                   help="bootstrap/permutation resamples, 100 to 1,000,000 (default 10000)")


def _add_report_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", help="write the JSON report here")
    p.add_argument("--markdown", help="write the markdown report (PR comment body) here")


def _add_mlflow(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mlflow", nargs="?", const="", metavar="URI",
                   help="log this gate as an MLflow run (default URI: a local mlruns/ file store; needs the "
                        "mlflow extra); a logging failure is a warning, never the verdict")


def _add_from_commit(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from-commit", metavar="SHA",
                   help="read the suite, its tasks and the baseline from this commit of the git repository, not "
                        "the working tree (a pull request's base: the checkout then supplies only the model)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gatekeeper", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gatekeeper {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in (_compare_parser, _run_parser, _gate_parser, _init_parser, _merge_parser, _baseline_parser,
                _history_parser, _plan_parser):
        add(sub)  # each builder sits beside its handler
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        parser.print_help(sys.stderr)
        return EXIT_INVALID
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except GateError as exc:
        # One line per problem, as the message has them; each harmless to a CI runner.
        print(f"gatekeeper: error: {one_line_each(str(exc))}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        print("gatekeeper: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _broken_pipe()
    except Exception as exc:  # noqa: BLE001 - the one place an unexpected exception becomes exit 2
        text = str(exc).strip().splitlines()
        print(f"gatekeeper: internal error: {type(exc).__name__}: {one_line(text[0]) if text else ''} "
              "(a bug in gatekeeper or its dependencies; please report it with the command line)",
              file=sys.stderr)
        return EXIT_INVALID


def _broken_pipe() -> int:
    """The reader of stdout went away (``gatekeeper baseline show | head``): stop quietly.

    stdout is pointed at /dev/null so the interpreter's final flush cannot raise again, and
    the exit status is 141 (128 + SIGPIPE) as for any tool killed by a closed pipe: never 0,
    because the output that was asked for was not all delivered.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return EXIT_BROKEN_PIPE
