"""The image's hash-locked runtime (requirements/runtime.txt) and the versions a run records.

The lock is compiled from pyproject.toml by requirements/compile.sh (network, so not re-run
here); these tests check that it still agrees with pyproject, that the Dockerfile installs from
it, and that a run's manifest records the locked versions which `compare` then names.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from gatekeeper.compare.compat import _manifest
from gatekeeper.run import packages
from tests.demo_runs import DEMO_SUITE, OFFLINE_ENV
from tests.test_packaging import dockerfile_instructions

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements" / "runtime.txt"
# Installed by the Dockerfile's own torch layer, never from the lock (see requirements/compile.sh).
TORCH_STACK = re.compile(r"^(torch|triton|cuda-.+|nvidia-.+)$")


def parse_lock(text: str) -> dict[str, tuple[str, list[str]]]:
    """{canonical name: (version, [sha256 hashes])}; fails on anything but `name==version` lines."""
    entries: dict[str, tuple[str, list[str]]] = {}
    current: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not line.startswith(" "):
            match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*\\?", stripped)
            assert match, f"{LOCK}: not an exact pin: {stripped!r}"
            current = canonicalize_name(match.group(1))
            assert current not in entries, f"{LOCK}: {current} locked twice"
            entries[current] = (match.group(2), [])
        else:
            match = re.fullmatch(r"--hash=sha256:([0-9a-f]{64})\s*\\?", stripped)
            assert match and current, f"{LOCK}: unexpected line {stripped!r}"
            entries[current][1].append(match.group(1))
    return entries


def declared() -> list[Requirement]:
    import tomllib  # Python 3.11+, like the image; imported here as in test_packaging

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    # The image runs evaluations (eval) and logs to MLflow when the action is asked to (mlflow).
    return [Requirement(r) for r in project["dependencies"] + extras["eval"] + extras["mlflow"]]


@pytest.fixture(scope="module")
def lock() -> dict[str, tuple[str, list[str]]]:
    return parse_lock(LOCK.read_text(encoding="utf-8"))


def test_every_locked_package_is_pinned_with_hashes(lock):
    assert len(lock) > 50  # lm-eval[hf]'s whole closure, not a handful of top-level names
    for name, (version, hashes) in lock.items():
        assert hashes, f"{name}=={version} has no --hash"
    assert not [n for n in lock if TORCH_STACK.match(n)], "torch's CUDA stack belongs to the torch layer"


def test_lock_agrees_with_pyproject(lock):
    """Every declared runtime dependency is locked at a version its specifier allows; exact pins
    (lm-eval) are locked at exactly that version. torch is the Dockerfile's, at pyproject's pin."""
    runs = " ".join(args for w, args in dockerfile_instructions() if w == "RUN")
    for req in declared():
        name = canonicalize_name(req.name)
        if name == "torch":
            assert f'"torch{req.specifier}"' in runs, f"Dockerfile must install {req} (pyproject's pin)"
            continue
        assert name in lock, f"{LOCK}: {req} is declared in pyproject.toml but not locked; run requirements/compile.sh"
        version = lock[name][0]
        assert req.specifier.contains(version, prereleases=True), f"{LOCK}: {name}=={version} violates {req}"
    # lm-eval's `hf` extra is what the suite runs on: its packages must be locked too.
    for needed in ("transformers", "tokenizers", "datasets", "accelerate", "peft", "numpy", "scipy"):
        assert needed in lock, needed


def test_lock_catches_a_drifted_pin(tmp_path):
    """Negative control for the check above: a lock whose lm-eval differs from pyproject's pin."""
    drifted = re.sub(r"^lm-eval==\S+", "lm-eval==0.4.12", LOCK.read_text(), flags=re.M)
    entries = parse_lock(drifted)
    lm_eval = next(r for r in declared() if canonicalize_name(r.name) == "lm-eval")
    assert not lm_eval.specifier.contains(entries["lm-eval"][0])
    with pytest.raises(AssertionError, match="not an exact pin"):
        parse_lock("numpy>=1.24\n")


def test_dockerfile_installs_the_lock_hash_checked_before_the_source():
    instructions = dockerfile_instructions()
    copy_lock = next(i for i, (w, a) in enumerate(instructions)
                     if w == "COPY" and a.split()[0] == "requirements/runtime.txt")
    install = next(i for i, (w, a) in enumerate(instructions) if w == "RUN" and "--require-hashes" in a)
    torch_layer = next(i for i, (w, a) in enumerate(instructions) if w == "RUN" and '"torch==' in a)
    source = next(i for i, (w, a) in enumerate(instructions) if w == "COPY" and a.startswith("gatekeeper "))
    assert torch_layer < copy_lock < install < source
    args = instructions[install][1]
    assert "--no-deps" in args and "-r /tmp/requirements-runtime.txt" in args, args
    # The package itself must not pull anything past the lock either, and `pip check` proves the
    # lock plus torch is complete.
    final = next(a for w, a in instructions if w == "RUN" and "/tmp/gatekeeper-src" in a and "pip install" in a)
    assert "--no-deps" in final and "pip check" in final
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    assert "!requirements/runtime.txt" in ignore


def test_recorded_packages_are_the_locked_ones(lock):
    for name in packages.RESULT_PACKAGES:
        assert name == "torch" or canonicalize_name(name) in lock, f"{name} is recorded but not locked"
    versions = packages.installed_versions(("numpy", "surely-not-installed-xyz"))
    assert versions["numpy"] == __import__("numpy").__version__
    assert versions["surely-not-installed-xyz"] is None


def test_compare_names_a_package_difference_only_when_both_runs_recorded_them():
    base = {"package_versions": {"tokenizers": "0.22.1", "numpy": "2.4.6", "transformers": "5.24.0"}}
    cand = {"package_versions": {"tokenizers": "0.23.3", "numpy": "2.4.6", "transformers": "5.25.0"}}
    # transformers has its own line (from the results file), so it is not repeated here.
    assert _manifest(base, cand) == ["tokenizers version: 0.22.1 in baseline, 0.23.3 in candidate"]
    old = {"torch_version": "2.13.0"}  # a baseline recorded before the field existed
    assert _manifest(old, dict(cand, torch_version="2.13.0")) == []


@pytest.mark.lmeval
def test_a_real_run_records_the_versions_and_compare_names_a_change(demo_run, tmp_path):
    """End to end: the harmless demo run's manifest records the installed versions; a copy of that
    run whose manifest says tokenizers was older gates as a pass with the difference as context."""
    run = demo_run("harmless")
    manifest = json.loads((run / "gatekeeper-manifest.json").read_text())
    recorded = manifest["package_versions"]
    assert set(recorded) == set(packages.RESULT_PACKAGES)
    assert recorded == packages.installed_versions()
    assert recorded["transformers"] and recorded["tokenizers"] and recorded["torch"].startswith("2.13.0")

    older = tmp_path / "older-run"
    shutil.copytree(run, older)
    manifest["package_versions"]["tokenizers"] = "0.0.1"
    (older / "gatekeeper-manifest.json").write_text(json.dumps(manifest))
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "gatekeeper", "compare", str(older), str(run), "--suite", str(DEMO_SUITE),
         "--json", str(report)],
        capture_output=True, text=True, cwd=REPO, env=dict(os.environ, **OFFLINE_ENV), timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    line = f"tokenizers version: 0.0.1 in baseline, {packages.installed_versions()['tokenizers']} in candidate"
    assert line in report.read_text(), "the JSON report does not name the tokenizers change"
