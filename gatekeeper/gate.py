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
    from gatekeeper import report, results, runner, store
    from gatekeeper.suite import load_suite

    suite = load_suite(suite_path)
    baseline_path = Path(baseline) if baseline else suite.baseline_path
    if baseline_path.exists() and not baseline_path.is_file():
        raise GateError(f"{baseline_path}: baseline path is a directory, expected a .json.gz file")
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
    outcome = compare_runs(stored, candidate, suite.policy, suite=suite.name)
    attach_snippets(outcome)
    return GateResult(outcome.exit_code, outcome, None, run_dir, report.to_json(outcome))
