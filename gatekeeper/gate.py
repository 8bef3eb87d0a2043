"""``gatekeeper gate``: run the pinned suite, compare with the stored baseline, decide.

With no baseline yet, the run becomes the first baseline and the gate passes with a notice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gatekeeper.compare import Outcome, attach_snippets, compare_runs
from gatekeeper.model import GateError


@dataclass
class GateResult:
    exit_code: int  # 0 pass / 1 regression
    outcome: Outcome | None  # None when this run became the first baseline
    notice: str | None
    run_dir: Path | None
    report_json: dict[str, Any] = field(default_factory=dict)


def compare_with_suite(baseline_path: Path, run_dir: Path, suite, *, seed: int = 0) -> Outcome:
    """Compare a run directory with a baseline file, under the suite's policy and hash check."""
    from gatekeeper import results, store

    baseline = store.load_baseline(baseline_path)
    store.check_suite(baseline, suite)
    candidate = results.load_run(run_dir, cluster_keys=suite.cluster_keys())
    outcome = compare_runs(baseline, candidate, suite.policy, suite=suite.name, seed=seed)
    attach_snippets(outcome)
    return outcome


def run_gate(
    suite_path: str | Path,
    model: str,
    *,
    out_dir: str | Path,
    baseline: str | Path | None = None,
    revision: str | None = None,
    device: str | None = None,
    log: Callable[[str], Any] = print,
) -> GateResult:
    from gatekeeper import report, runner, store
    from gatekeeper.suite import load_suite

    suite = load_suite(suite_path)
    baseline_path = Path(baseline) if baseline else suite.baseline_path
    if baseline_path.exists() and not baseline_path.is_file():
        raise GateError(f"{baseline_path}: baseline path is a directory, expected a .json.gz file")
    if baseline_path.is_file():
        # Fail on a corrupt or foreign baseline before spending GPU time on the run.
        store.check_suite(store.load_baseline(baseline_path), suite)
    run_dir = runner.run_suite(suite, model, Path(out_dir), revision=revision, device=device, log=log)
    if not baseline_path.is_file():
        written = store.record(run_dir, suite, path=baseline_path)
        notice = (
            f"No baseline yet: recorded this run as the first baseline ({written}). "
            "Commit it so later runs are compared against it."
        )
        return GateResult(0, None, notice, run_dir, {"verdict": "pass", "notice": notice, "comparisons": []})
    outcome = compare_with_suite(baseline_path, run_dir, suite)
    return GateResult(outcome.exit_code, outcome, None, run_dir, report.to_json(outcome))
