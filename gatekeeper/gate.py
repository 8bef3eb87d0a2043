"""``gatekeeper gate``: run the pinned suite, compare with the stored baseline, decide.

No baseline is never a pass: without one the gate stops with exit 2 before evaluating, unless
the caller explicitly asks to record the first baseline (``record_missing``, the CLI's
``--record-missing``, the action's ``bootstrap`` input, never on a pull request).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gatekeeper.compare import Outcome, attach_snippets, compare_runs
from gatekeeper.model import GateError
from gatekeeper.policy import Policy


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
    stored = None
    if baseline_path.is_file():
        # Fail on a corrupt or foreign baseline before spending GPU time on the run.
        stored = store.load_baseline(baseline_path)
        store.check_suite(stored, suite)
    run_dir = runner.run_suite(suite, model, Path(out_dir), revision=revision, device=device, log=log)
    if stored is None:
        written = store.record(run_dir, suite, path=baseline_path)
        notice = (
            f"No baseline yet: recorded this run as the first baseline ({written}). "
            "Commit it so later runs are compared against it."
        )
        return GateResult(0, None, notice, run_dir, {"verdict": "pass", "notice": notice, "comparisons": []})
    candidate = results.load_run(run_dir, cluster_keys=suite.cluster_keys())
    outcome = compare_runs(stored, candidate, policy or suite.policy, suite=suite.name)
    attach_snippets(outcome)
    return GateResult(outcome.exit_code, outcome, None, run_dir, report.to_json(outcome))
