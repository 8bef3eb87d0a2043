"""Shared fixtures, and the time budget every test keeps (issue #28)."""

from __future__ import annotations

import os

# One thread per test worker for torch and BLAS, in this process and every lm-eval subprocess, as
# scripts/test.sh sets it (a worker per core and one more; see there). Before numpy or torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
# What scripts/test.sh exports (a local model needs no hub), so pytest run alone sees the same.
for _name in ("TQDM_DISABLE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_name, "1")

import hashlib  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import sysconfig  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tests.demo_runs import DEMO_CHECKPOINTS, DemoGate, lm_eval_installed, make_demo_gate  # noqa: E402
from tests.github_server import FakeGitHub  # noqa: E402
from tests.warm_start import COLD_ENV, ENV_SERVER_PREFIX, HOOK_ENV, PTH_LINE, PTH_NAME, env_differs  # noqa: E402
from tests.warm_start import ENV as WARM_ENV  # noqa: E402

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

    # One evaluation per checkpoint for the whole session, all workers together: the first worker
    # to ask gates it under a file lock in the session's shared temp folder and pickles the result;
    # the others read that (runs are read, never changed, by the tests).
    shared = tmp_path_factory.getbasetemp().parent if os.environ.get("PYTEST_XDIST_WORKER") else None

    def get(name: str) -> DemoGate:
        if name not in DEMO_CHECKPOINTS:
            raise ValueError(f"not a demo checkpoint: {name!r}")
        if name not in _DEMO:
            _DEMO[name] = _shared_demo_gate(name, shared) if shared else \
                make_demo_gate(name, tmp_path_factory.mktemp(f"demo-{name}"))
        return _DEMO[name]

    return get


def _shared_demo_gate(name: str, shared: Path) -> DemoGate:
    import pickle

    from filelock import FileLock

    folder = shared / f"demo-{name}"
    done = folder / "gate.pickle"
    with FileLock(str(shared / f"demo-{name}.lock")):
        if not done.is_file():
            folder.mkdir(exist_ok=True)
            gate = make_demo_gate(name, folder)
            done.write_bytes(pickle.dumps(gate))
    return pickle.loads(done.read_bytes())


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
    "test_the_mmlu_group_gates_with_one_power_figure_and_a_short_log",
    # a hub dataset's head moves: record, gate online and offline, dry run, re-record on new data,
    # a rewritten history; six gatekeeper processes on one small suite
    "test_a_hub_dataset_that_moves_after_the_baseline_changes_nothing",
    # record, then the console script and the action's entry on a PR planting four vectors
    "test_a_prs_files_never_reach_the_evaluation_through_the_console_script_or_the_action",
})
# The files that start first, one on each worker, before xdist's own order (files with most tests
# first). Each is one long test that is mostly waiting or its own processes: the fresh clone
# (~3 min, pip installing into its own venv) and the container (a docker build). In xdist's order
# they came last, and the fresh clone ran alone for its last 2-3 minutes.
FIRST_FILES = ("tests/test_fresh_clone.py", "tests/test_container.py")
# Then the files that take longest (CPU seconds of a run on 2 cores, 2026-12-07), longest first:
# a long file started last ran alone for its last minutes (the mmlu group and the nightly
# workflow ended the run 2 minutes after the other worker had finished). The rest follow in
# xdist's order.
LONG_FILES = ("tests/test_small_levels.py", "tests/test_plan.py", "tests/test_mmlu_group.py", "tests/test_sealed.py",
              "tests/test_stats_simulation.py", "tests/test_alpha_design.py", "tests/test_sequential.py",
              "tests/test_stats_kinds_simulation.py", "tests/test_workflows.py", "tests/test_backends.py",
              "tests/test_sequential_gate.py", "tests/test_pr_trust.py", "tests/test_task_index.py",
              "tests/test_group_simulation.py", "tests/test_doc_blocks.py", "tests/test_task_data_files.py",
              "tests/test_drift.py", "tests/test_nightly_workflow.py")
CPU_REPORT_ENV = "GATEKEEPER_TEST_CPU_REPORT"  # a file: each test's CPU seconds, end time and worker, a line a test


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    if config.getoption("dist") != "loadfile":
        return None  # another distribution asked for on the command line: xdist's own
    from xdist.scheduler import LoadFileScheduling

    class FirstFilesFirst(LoadFileScheduling):
        def _assign_work_unit(self, node: object) -> None:
            for scope in reversed(FIRST_FILES + LONG_FILES):
                if scope in self.workqueue:
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return FirstFilesFirst(config, log)


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + _warm_cpu_seconds()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    before = _cpu_seconds()
    result = yield
    spent = _cpu_seconds() - before
    report = os.environ.get(CPU_REPORT_ENV)
    if report:
        with open(report, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"test": item.nodeid, "cpu_seconds": round(spent, 2), "ended": round(time.time(), 1),
                                 "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}) + "\n")
    name = getattr(item, "originalname", item.name)
    if spent > CPU_BUDGET_S and name not in END_TO_END:
        pytest.fail(f"{item.nodeid} used {spent:.0f} s of CPU, over the {CPU_BUDGET_S:.0f} s budget of a test "
                    "(tests/conftest.py): make it cheaper (a cached run, a smaller slice), or name it in END_TO_END "
                    "with the reason", pytrace=False)
    return result


# No test may change the repository's example folder (issue #27: a gate without --no-history
# appended 10 gates to the committed demo history). Checked once per session, by the process that
# runs it (with xdist: the controller, after every worker has finished).
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
_EXAMPLES_BEFORE: dict[str, str] = {}


def _examples_files() -> dict[str, str]:
    return {str(p.relative_to(EXAMPLES)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(EXAMPLES.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def _controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    if _controller(session.config):
        _EXAMPLES_BEFORE.update(_examples_files())
    if not _controller(session.config) or not getattr(session.config.option, "numprocesses", None):
        _start_warm_server()


# The warm start (tests/warm_start.py): one server a process that runs tests, whose forked children
# run the tests' `python -m gatekeeper ...` subprocesses without importing torch and lm-eval again.
_WARM: dict[str, object] = {}


def _start_warm_server() -> None:
    if os.environ.get(COLD_ENV):
        return
    pth = Path(sysconfig.get_paths()["purelib"]) / PTH_NAME
    try:
        if not pth.is_file() or pth.read_text(encoding="utf-8") != PTH_LINE:
            pth.write_text(PTH_LINE, encoding="utf-8")
    except OSError:
        return  # a read-only environment: every subprocess starts cold
    folder = tempfile.mkdtemp(prefix="gkwarm-", dir="/tmp" if os.path.isdir("/tmp") else None)  # a short socket path
    os.environ[WARM_ENV] = os.path.join(folder, "info.json")
    os.environ[HOOK_ENV] = str(Path(__file__).with_name("warm_start.py"))
    log = open(os.path.join(folder, "log"), "wb")  # noqa: SIM115 - the server's, for as long as it runs
    server = subprocess.Popen([sys.executable, os.environ[HOOK_ENV], folder], stdin=subprocess.DEVNULL,
                              stdout=log, stderr=log, env=dict(os.environ))
    Path(folder, "pid").write_text(str(server.pid), encoding="utf-8")  # clients wait for it while it imports
    _WARM.update(folder=folder, server=server, log=log)


@dataclass
class _Ledger:
    """How far the warm children's CPU ledger has been read, and the seconds in it so far."""
    offset: int = 0
    seconds: float = 0.0


_LEDGER = _Ledger()


def _warm_cpu_seconds() -> float:
    """The CPU of the warm children this process's tests started (each adds a line when it ends),
    read on from where the last call stopped, whole lines only."""
    if not _WARM:
        return 0.0
    try:
        with open(os.path.join(str(_WARM["folder"]), "cpu"), "rb") as fh:
            fh.seek(_LEDGER.offset)
            new = fh.read()
    except OSError:
        return _LEDGER.seconds
    whole = new[:new.rfind(b"\n") + 1]
    _LEDGER.offset += len(whole)
    _LEDGER.seconds += sum(float(line.split()[0]) for line in whole.splitlines())  # "SECONDS[ import]"
    return _LEDGER.seconds


def _stop_env_servers() -> None:
    """End the servers of other environments the last test's processes started (each holds its
    own import of torch and lm-eval; the next test's environment is another: its own HF_HOME)."""
    for pid_file in Path(str(_WARM["folder"])).glob(f"{ENV_SERVER_PREFIX}*/pid"):
        try:
            os.kill(int(pid_file.read_text(encoding="utf-8")), signal.SIGKILL)
        except (OSError, ValueError):
            pass  # already gone
        shutil.rmtree(pid_file.parent, ignore_errors=True)
        Path(f"{pid_file.parent}.lock").unlink(missing_ok=True)


def _stop_warm_server() -> None:
    if not _WARM:
        return
    _stop_env_servers()
    server = _WARM["server"]
    server.kill()  # type: ignore[attr-defined]
    server.wait()  # type: ignore[attr-defined]
    _WARM["log"].close()  # type: ignore[attr-defined]
    shutil.rmtree(str(_WARM["folder"]), ignore_errors=True)
    for name in (WARM_ENV, HOOK_ENV):
        os.environ.pop(name, None)
    _WARM.clear()
    _LEDGER.offset, _LEDGER.seconds = 0, 0.0


# A variable a test file leaves set in the test process (os.environ, not monkeypatch or a
# subprocess's env=) makes every later subprocess of this worker differ from the warm server's
# imports, so they all start cold: measured, one such variable (mlflow's, set at its import) cost
# a third more CPU over the whole run, silently. Checked at the end of each file, fixtures gone.
_LEFT_SET: set[str] = set()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    result = yield
    if _WARM:
        _stop_env_servers()
    if not _WARM or (nextitem is not None and nextitem.path == item.path):
        return result
    try:
        info = json.loads(Path(os.environ[WARM_ENV]).read_text(encoding="utf-8"))
    except (KeyError, OSError, ValueError):
        return result  # the server is still importing, or refused to serve
    now = set(env_differs(dict(os.environ), info))
    new = sorted(now - _LEFT_SET)
    _LEFT_SET.clear()
    _LEFT_SET.update(now)
    if new:
        pytest.fail(f"{item.path.name} left {', '.join(new)} set in the test process: every later "
                    "`python -m gatekeeper` of this worker starts cold (tests/warm_start.py). Set it with "
                    "monkeypatch or the subprocess's env=; a variable a library sets at import, read only by "
                    "a library the warm server does not import, goes in warm_start.VOLATILE_PREFIXES",
                    pytrace=False)
    return result


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _stop_warm_server()
    if not _controller(session.config) or not _EXAMPLES_BEFORE:
        return
    after = _examples_files()
    changed = sorted(k for k in set(after) | set(_EXAMPLES_BEFORE) if after.get(k) != _EXAMPLES_BEFORE.get(k))
    if changed:
        session.config.get_terminal_writer().line()
        session.config.get_terminal_writer().line(
            f"tests changed the repository's examples/: {', '.join(changed)} (use tmp_path, or --no-history)", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
