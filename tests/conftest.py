"""Shared fixtures, and the time budget every test keeps (issue #28)."""

from __future__ import annotations

import json
import os
import resource
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.demo_runs import DEMO_CHECKPOINTS, DemoGate, lm_eval_installed, make_demo_gate
from tests.github_server import FakeGitHub

REPO = "octo/repo"
_DEMO: dict[str, DemoGate] = {}  # one evaluation per checkpoint per session, whichever test asks first


@pytest.fixture
def gh():
    """A strict loopback GitHub for one test; it must have seen no invalid request."""
    fake = FakeGitHub(REPO).start()
    yield fake
    fake.stop()
    assert fake.errors == [], fake.errors


@pytest.fixture(scope="session")
def demo_gate(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], DemoGate]:
    """``demo_gate("regressed") -> DemoGate``: the demo checkpoint gated once per session (see
    tests/demo_runs.py for how each one is gated). Skips when lm-eval is not installed."""
    if not lm_eval_installed():
        pytest.skip("lm-eval is not installed (pip install -e '.[eval]')")

    def get(name: str) -> DemoGate:
        if name not in DEMO_CHECKPOINTS:
            raise ValueError(f"not a demo checkpoint: {name!r}")
        if name not in _DEMO:
            _DEMO[name] = make_demo_gate(name, tmp_path_factory.mktemp(f"demo-{name}"))
        return _DEMO[name]

    return get


@pytest.fixture(scope="session")
def demo_run(demo_gate: Callable[[str], DemoGate]) -> Callable[[str], Path]:
    """``demo_run("regressed") -> Path``: the run directory (lm-eval output + manifest) of that
    demo checkpoint, evaluated at most once per session."""
    return lambda name: demo_gate(name).run_dir


# The time budget: a test's own call (fixtures shared with other tests not counted) may use at most
# this much CPU, its subprocesses included (lm-eval runs, servers, the CLI), so the suite stays
# fast on CI's 2 cores. Only the end-to-end tests named here may take longer: each runs a whole
# workflow, several real lm-eval gates in a row, a fresh clone, or a simulation of thousands of
# gates, and says so in its own docstring.
CPU_BUDGET_S = 60.0
END_TO_END = frozenset({
    "test_readme_commands_on_a_fresh_clone",
    "test_a_sharded_workflow_runs_each_look_as_a_wave_and_the_judge_agrees_with_one_process",
    "test_mutants_of_the_demo_base_run_end_to_end_and_agree_with_gating_by_hand",
    "test_a_harmless_sequence_never_drifts",
    "test_each_night_passes_the_anchor_catches_the_sum_and_pin_moves_it",
    "test_regressed_checkpoint_fails_the_pr_with_one_comment",
    "test_init_writes_a_suite_that_gates_for_real",
    "test_sharded_workflow_gates_the_merged_shards_of_the_base_suite",
    "test_sharded_sequential_workflow_judges_each_wave_and_fails_at_the_second",
    "test_nightly_promotes_two_green_nights_and_opens_the_tracking_issue_on_drift",
    "test_bundled_tasks_record_regate_unchanged_and_gate_the_regressed_model",
    "test_the_request_cache_never_unpickles_and_never_answers_for_another_model",
    "test_the_harmless_checkpoint_passes_early_and_its_items_are_the_whole_runs",
})
CPU_REPORT_ENV = "GATEKEEPER_TEST_CPU_REPORT"  # a file: each test's CPU seconds, one JSON line a test


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    before = _cpu_seconds()
    result = yield
    spent = _cpu_seconds() - before
    report = os.environ.get(CPU_REPORT_ENV)
    if report:
        with open(report, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"test": item.nodeid, "cpu_seconds": round(spent, 2)}) + "\n")
    name = getattr(item, "originalname", item.name)
    if spent > CPU_BUDGET_S and name not in END_TO_END:
        pytest.fail(f"{item.nodeid} used {spent:.0f} s of CPU, over the {CPU_BUDGET_S:.0f} s budget of a test "
                    "(tests/conftest.py): make it cheaper (a cached run, a smaller slice), or name it in END_TO_END "
                    "with the reason", pytrace=False)
    return result
