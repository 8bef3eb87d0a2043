"""A fresh clone of this repository in an empty folder, and the README's two commands.

Shared by tests/test_fresh_clone.py (the check CI runs) and benchmarks/first_run.py (the timings
README quotes). The clone is of HEAD plus the working tree's uncommitted changes, so a session's
work can be checked before it is committed; on a clean checkout (CI) that is exactly a clone.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def is_git_checkout() -> bool:
    return shutil.which("git") is not None and (ROOT / ".git").exists()


def fresh_clone(dest: Path) -> Path:
    """Clone ROOT into ``dest`` (which must not exist) and carry over uncommitted changes."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(dest)], check=True)
    changed = _git("ls-files", "-z", "-m", "-o", "--exclude-standard")
    deleted = set(_git("ls-files", "-z", "-d"))
    for name in changed:
        src = ROOT / name
        if name in deleted or not src.is_file():
            continue
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / name)
    for name in deleted:
        (dest / name).unlink(missing_ok=True)
    return dest


def _git(*args: str) -> list[str]:
    out = subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True).stdout
    return [p for p in out.decode().split("\0") if p]


def readme_commands() -> list[str]:
    """The commands of README's quick start (the first ```bash block), comments dropped."""
    block = re.search(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert block, "README.md has no ```bash block"
    return [line.strip() for line in block.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")]


def user_env() -> dict[str, str]:
    """The environment of a user's shell: nothing of this checkout's .venv or pytest run."""
    drop = {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHON", "PYTEST_CURRENT_TEST", "PYTEST_ADDOPTS"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("GATEKEEPER_")}
    venv_bin = str(ROOT / ".venv" / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    return env
