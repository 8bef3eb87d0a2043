"""Shared fixtures."""

from __future__ import annotations

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
