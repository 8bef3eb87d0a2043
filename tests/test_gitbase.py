"""gitbase on real git repositories: read a file at a commit, fetch a missing base, fail closed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gatekeeper.baseline import gitbase
from gatekeeper.errors import GateError


def git(cwd: Path, *args: str) -> str:
    env = dict(os.environ, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    proc = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.fixture
def origin(tmp_path: Path) -> tuple[Path, str, str]:
    """A repository with a base commit and a head commit that edits, adds and removes files."""
    repo = tmp_path / "origin"
    (repo / "b").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "b" / "baseline.bin").write_bytes(b"\x1f\x8bbase\x00bytes")
    (repo / "suite.yaml").write_text("name: demo\n")
    (repo / "gone.txt").write_text("removed by the PR\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD")
    (repo / "b" / "baseline.bin").write_bytes(b"the PR's own baseline")
    (repo / "new.txt").write_text("added\n")
    git(repo, "rm", "-q", "gone.txt")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "head")
    return repo, base, git(repo, "rev-parse", "HEAD")


def test_reads_bytes_at_the_base_commit_and_tells_what_changed(origin):
    path, base, _ = origin
    repo = gitbase.find_repo(path / "b")
    assert repo.root.resolve() == path.resolve()
    assert gitbase.read_at(repo, base, "b/baseline.bin") == b"\x1f\x8bbase\x00bytes"
    assert gitbase.read_at(repo, base, "new.txt") is None
    assert gitbase.changed_since(repo, base, "b/baseline.bin")
    assert not gitbase.changed_since(repo, base, "suite.yaml")
    assert gitbase.changed_since(repo, base, "new.txt") and gitbase.changed_since(repo, base, "gone.txt")
    (path / "suite.yaml").write_text("name: edited in the working tree\n")  # not committed: still a change
    assert gitbase.changed_since(repo, base, "suite.yaml")


def test_a_shallow_clone_fetches_the_base_commit(origin, tmp_path):
    path, base, head = origin
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{path}", str(clone))
    repo = gitbase.find_repo(clone)
    assert not gitbase.has_commit(repo, base) and gitbase.has_commit(repo, head)
    assert gitbase.read_at(repo, base, "b/baseline.bin") == b"\x1f\x8bbase\x00bytes"
    assert gitbase.has_commit(repo, base)


def test_a_base_commit_that_cannot_be_fetched_is_a_gate_error(origin, tmp_path):
    path, _, _ = origin
    repo = gitbase.find_repo(path)  # no `origin` remote at all
    with pytest.raises(GateError, match=r"base commit 0123456789ab is not in the checkout .*fetch-depth"):
        gitbase.read_at(repo, "0123456789abcdef0123456789abcdef01234567", "suite.yaml")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{path}", str(clone))
    with pytest.raises(GateError, match="not in the checkout and `git fetch origin"):
        gitbase.read_at(gitbase.find_repo(clone), "f" * 40, "suite.yaml")


def test_not_a_repository(tmp_path):
    with pytest.raises(GateError, match="not a git repository"):
        gitbase.find_repo(tmp_path)


@pytest.mark.parametrize("sha", ["", "HEAD", "abc123", "--upload-pack=touch /tmp/x", "A" * 39])
def test_only_full_commit_ids_are_accepted(sha):
    with pytest.raises(GateError, match="not a full commit id"):
        gitbase.check_sha(sha)


def test_full_ids_are_normalised():
    assert gitbase.check_sha(" " + "AB" * 20 + "\n") == "ab" * 20


def test_paths_outside_the_repository_are_refused(origin, tmp_path):
    path, _, _ = origin
    repo = gitbase.find_repo(path)
    assert gitbase.repo_relative(repo, path / "b" / "baseline.bin") == "b/baseline.bin"
    with pytest.raises(GateError, match="outside the git repository"):
        gitbase.repo_relative(repo, tmp_path / "elsewhere.json.gz")


def test_a_directory_or_an_lfs_pointer_is_not_read_as_a_file(origin):
    path, base, _ = origin
    repo = gitbase.find_repo(path)
    with pytest.raises(GateError, match="is a tree at commit"):
        gitbase.read_at(repo, base, "b")
    (path / "lfs.json.gz").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 3\n")
    git(path, "add", "lfs.json.gz")
    git(path, "commit", "-q", "-m", "lfs")
    with pytest.raises(GateError, match="stored with git LFS"):
        gitbase.read_at(repo, git(path, "rev-parse", "HEAD"), "lfs.json.gz")


def test_a_workspace_owned_by_another_user_is_still_read(origin):
    # The action's container runs as root over a workspace another uid owns; git refuses such a
    # repository ("dubious ownership") unless safe.directory allows it.
    path, base, _ = origin
    if os.geteuid() != 0:
        pytest.skip("changing the owner needs root")
    for p in [path, *path.rglob("*")]:
        os.lchown(p, 4321, 4321)
    assert gitbase.read_at(gitbase.find_repo(path), base, "suite.yaml") == b"name: demo\n"
