"""Command-line front end. Exit codes: 0 no regression, 1 regression, 2 invalid input or usage."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from gatekeeper import __version__
from gatekeeper.model import GateError

EXIT_OK, EXIT_REGRESSION, EXIT_INVALID = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # usage errors: exit 2 with one line, as argparse does
        self.exit(EXIT_INVALID, f"gatekeeper: error: {message}\n")


def _atomic_write(path: Path, text: str) -> None:
    """Write a report file whole or not at all."""
    from gatekeeper.store import atomic_write_bytes

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

    if args.json:
        data = report.to_json(outcome)
        data.update(extra or {})
        _atomic_write(Path(args.json), json.dumps(data, indent=2, allow_nan=False) + "\n")
    if args.markdown:
        _atomic_write(Path(args.markdown), report.render_markdown(outcome) + "\n")
    print(report.render_terminal(outcome))
    return outcome.exit_code


def _policy_from_args(args: argparse.Namespace):
    """The policy (file values, then command-line overrides) and the suite when --policy names one."""
    from gatekeeper.policy import Policy, read_policy_file

    policy, suite = read_policy_file(args.policy) if args.policy else (Policy(), None)
    # Command-line values override the file; None means "not given".
    if args.alpha is not None:
        policy.alpha = args.alpha
    if args.margin is not None:
        policy.margin = args.margin
    if args.correction is not None:
        policy.correction = args.correction
    if args.resamples is not None:
        policy.resamples = args.resamples
    policy.validate("command line")
    return policy, suite


def cmd_compare(args: argparse.Namespace) -> int:
    from gatekeeper import names
    from gatekeeper.compare import attach_snippets, compare_runs, load_any, merge_repeats
    from gatekeeper.gate import compare_paths

    _check_writable(args.json, args.markdown)
    policy, suite = _policy_from_args(args)
    if suite is not None:  # the one path gate and the action take
        outcome = compare_paths(args.baseline, args.candidate, suite, policy, seed=args.seed,
                                also_baseline=args.also_baseline, also_candidate=args.also_candidate)
        return _emit(outcome, args)
    baseline = merge_repeats([load_any(p) for p in [args.baseline, *args.also_baseline]])
    candidate = merge_repeats([load_any(p) for p in [args.candidate, *args.also_candidate]])
    if args.policy:  # a plain policy file: each rule must match something in the runs
        names.check_policy(policy, args.policy, names.union(names.from_run(baseline), names.from_run(candidate)))
    outcome = compare_runs(baseline, candidate, policy, seed=args.seed)
    attach_snippets(outcome)
    return _emit(outcome, args)


def cmd_run(args: argparse.Namespace) -> int:
    from gatekeeper import runner
    from gatekeeper.suite import load_suite

    suite = load_suite(args.suite)
    run_dir = runner.run_suite(
        suite,
        args.model,
        Path(args.out),
        revision=args.revision,
        device=args.device,
        batch_size=args.batch_size,
        dtype=args.dtype,
        limit=args.limit,
        cache_dir=args.cache,
    )
    print(f"run written to {run_dir}")
    return EXIT_OK


def cmd_gate(args: argparse.Namespace) -> int:
    from gatekeeper import report
    from gatekeeper.gate import run_gate

    _check_writable(args.json, args.markdown)
    # Without --out the run is a temp folder, removed when the gate is done (kept with --out).
    out = args.out or tempfile.mkdtemp(prefix="gatekeeper-run-")
    try:
        result = run_gate(args.suite, args.model, out_dir=out, baseline=args.baseline,
                          record_missing=args.record_missing, revision=args.revision, device=args.device)
        if result.outcome is None:
            print(result.notice)
            if args.json:
                _atomic_write(Path(args.json), json.dumps(result.report_json, indent=2, allow_nan=False) + "\n")
            if args.markdown:
                _atomic_write(Path(args.markdown), f"### ✅ {report.escape_untrusted(result.notice, 1000)}\n")
            return EXIT_OK
        code = _emit(result.outcome, args, {"run_dir": str(result.run_dir)} if args.out else None)
        if args.print_markdown:
            print()
            print(report.render_markdown(result.outcome))
        return code
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)


def cmd_baseline(args: argparse.Namespace) -> int:
    from gatekeeper import store
    from gatekeeper.suite import load_suite

    if args.action == "show":
        if args.file:
            path = Path(args.file)
        elif args.suite:
            path = load_suite(args.suite).baseline_path
        else:
            raise GateError("baseline show: give a baseline FILE or --suite")
        print(store.show(path))
        return EXIT_OK
    suite = load_suite(args.suite)
    if args.action == "record":
        path = store.record(Path(args.run_dir), suite, force=args.force)
    else:
        path = store.promote(Path(args.run_dir), suite)
    print(f"baseline written to {path}")
    return EXIT_OK


def _add_policy_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", "--suite", dest="policy", metavar="FILE",
                   help="YAML policy file, or a suite file (its policy, cluster keys and name)")
    p.add_argument("--alpha", type=float, help="significance level (default 0.05)")
    p.add_argument("--margin", type=float, help="default margin in each metric's units (default 0)")
    p.add_argument("--correction", choices=["holm", "bonferroni", "bh", "none"],
                   help="multiplicity correction over gated metrics (default holm)")
    p.add_argument("--resamples", type=int, help="bootstrap/permutation resamples (default 10000)")


def _add_report_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", help="write the JSON report here")
    p.add_argument("--markdown", help="write the markdown report (PR comment body) here")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gatekeeper", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gatekeeper {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("compare", help="compare two lm-eval runs (or a baseline file and a run)")
    p.add_argument("baseline", help="lm-eval output dir, model subfolder, results_*.json, or baseline .json.gz")
    p.add_argument("candidate", help="same forms as BASELINE")
    _add_policy_flags(p)
    _add_report_flags(p)
    p.add_argument("--seed", type=int, default=0, help="seed for resampling (default 0)")
    p.add_argument("--also-baseline", action="append", default=[], metavar="PATH",
                   help="another run of the baseline model (other seed); values are averaged per item")
    p.add_argument("--also-candidate", action="append", default=[], metavar="PATH",
                   help="another run of the candidate model (other seed); values are averaged per item")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("run", help="run the pinned suite with lm-eval and record provenance")
    p.add_argument("--suite", required=True)
    p.add_argument("--model", required=True, help="local checkpoint dir or hub id")
    p.add_argument("--revision")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--device", help="auto | cpu | cuda | cuda:N (default: the suite's, else auto)")
    p.add_argument("--batch-size", help="override the suite's batch size (int or auto)")
    p.add_argument("--dtype", help="override the suite's dtype")
    p.add_argument("--limit", type=float, help="override every task's limit (debugging only)")
    p.add_argument("--cache", metavar="DIR", help="keep lm-eval's request cache here: a killed run "
                   "resumes, an unchanged model re-runs free (default: $GATEKEEPER_CACHE, else off)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("gate", help="run the suite, compare with the stored baseline, decide")
    p.add_argument("--suite", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--revision")
    p.add_argument("--baseline", help="baseline file (default: the suite's)")
    p.add_argument("--out", help="run output directory (default: a temporary directory)")
    p.add_argument("--record-missing", action="store_true",
                   help="when the baseline file does not exist, record this run as the first baseline "
                        "(without it, a missing baseline is an error)")
    p.add_argument("--device")
    _add_report_flags(p)
    p.add_argument("--print-markdown", action="store_true", help="also print the markdown report")
    p.set_defaults(func=cmd_gate)

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
        print(f"gatekeeper: error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        print("gatekeeper: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _broken_pipe()
    except Exception as exc:  # noqa: BLE001 - the one place an unexpected exception becomes exit 2
        text = str(exc).strip().splitlines()
        print(f"gatekeeper: internal error: {type(exc).__name__}: {text[0] if text else ''} "
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
    return 141
