"""README's two commands work on a fresh clone in any folder (issue #17, the fresh-clone check).

The quick-start block of README.md is read, not copied: the first command runs verbatim in a clone
under a folder whose name has a space, and the demo's set-up, called again, shows it skipping an
unchanged .venv. The second (the test command) is checked on a fresh clone by .ci/run itself, which
runs it in a clone under a folder whose name has a space, with a fresh .venv; benchmarks/first_run.py
--tests times it there. Running it here too (a selection of tests, ~50 s of set-up) repeated that.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.fresh_clone import fresh_clone, is_git_checkout, readme_commands, user_env

pytestmark = pytest.mark.skipif(not is_git_checkout(), reason="the fresh-clone check needs a git checkout")


def _sh(command: str, cwd: Path, timeout: int = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=user_env(), capture_output=True, text=True,
                          timeout=timeout)


def test_readme_commands_on_a_fresh_clone(tmp_path: Path) -> None:
    demo, tests = readme_commands()
    assert demo == "bash scripts/demo.sh regressed" and tests == "bash scripts/test.sh"
    clone = fresh_clone(tmp_path / "a folder" / "gatekeeper")

    first = _sh(demo, clone)
    assert first.returncode == 1, first.stdout[-3000:] + first.stderr[-3000:]
    assert "FAIL: gatekeeper demo: 2 regressions: demo_mc acc" in first.stdout
    assert "== setup: torch" in first.stdout and "Collecting" in first.stdout  # it says what it does
    assert (clone / ".venv" / "logs" / "pip.log").stat().st_size > 0
    torch = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-c",
                            "import importlib.metadata as m; print(m.requires('torch') or [])"],
                           capture_output=True, text=True, check=True).stdout
    assert "nvidia" not in torch, f"the CUDA build of torch was installed: {torch[:300]}"

    # The demo's set-up again (what a second demo call runs first; its gate is the first's): it
    # installs nothing.
    again = _sh("bash scripts/setup.sh eval", clone)
    assert again.returncode == 0 and "== setup: .venv is up to date" in again.stdout, again.stdout + again.stderr
    assert "Collecting" not in again.stdout
