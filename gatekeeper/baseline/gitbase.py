"""Read files as they are at a given commit of the workspace's git repository.

On a pull request the baseline and the policy must come from the PR's **base** commit: the
checked-out merge ref holds the PR's own edits, so reading the working tree would let a PR
choose the baseline it is gated against. Every failure here is a ``GateError`` (exit 2): a PR
is never gated against its own files because git failed.

git runs as a subprocess with a timeout, never through a shell, with ``safe.directory=*``
(the action's container runs as root over a workspace another uid owns) and with prompts off
(a fetch that needs credentials fails instead of waiting forever).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from gatekeeper.errors import GateError

GIT_TIMEOUT_S = 60
FETCH_TIMEOUT_S = 300
_SHA = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")  # sha1 or sha256 object names
LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"
CHECKOUT_ADVICE = "check out with actions/checkout `fetch-depth: 0` (see docs/action.md#baseline-and-policy-on-pull-requests)"


@dataclass(frozen=True)
class GitRepo:
    """The repository whose working tree holds ``root``."""

    root: Path

    def run(self, *args: str, timeout: float = GIT_TIMEOUT_S, stdin: bytes | None = None) -> subprocess.CompletedProcess:
        return _git(self.root, *args, timeout=timeout, stdin=stdin)


def _git(cwd: Path, *args: str, timeout: float, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", GIT_ASKPASS="", SSH_ASKPASS="", LC_ALL="C")
    cmd = ["git", "-c", "safe.directory=*", "-c", "core.quotePath=false", *args]
    try:
        return subprocess.run(cmd, cwd=cwd, input=stdin, capture_output=True, timeout=timeout, env=env, check=False)
    except FileNotFoundError:
        raise GateError(
            f"{cwd}: git is not installed, so the pull request's base commit cannot be read; install git "
            "on the runner (the action's image has it)"
        ) from None
    except subprocess.TimeoutExpired:
        raise GateError(f"{cwd}: `git {args[0]}` did not finish in {timeout:.0f} s; re-run the job") from None


def _stderr(proc: subprocess.CompletedProcess) -> str:
    text = (proc.stderr or b"").decode("utf-8", "replace").strip().splitlines()
    return text[-1] if text else f"exit {proc.returncode}"


def find_repo(path: Path) -> GitRepo:
    """The git repository containing ``path`` (a directory); GateError when there is none."""
    proc = _git(path, "rev-parse", "--show-toplevel", timeout=GIT_TIMEOUT_S)
    if proc.returncode != 0:
        raise GateError(
            f"{path}: not a git repository ({_stderr(proc)}); on pull requests the baseline is read from "
            f"the base commit, so {CHECKOUT_ADVICE}"
        )
    return GitRepo(Path(proc.stdout.decode("utf-8").strip()))


def check_sha(sha: str, where: str = "event") -> str:
    """A full lower-case commit id; anything else (empty, short, an option) is refused."""
    sha = (sha or "").strip().lower()
    if not _SHA.match(sha):
        raise GateError(f"{where}: pull request base sha {sha!r} is not a full commit id; cannot tell which baseline to gate against")
    return sha


def repo_relative(repo: GitRepo, path: Path) -> str:
    """``path`` as a repository path (posix); GateError when it lies outside the repository."""
    try:
        rel = Path(os.path.realpath(path)).relative_to(os.path.realpath(repo.root))
    except ValueError:
        raise GateError(
            f"{path}: outside the git repository {repo.root}; on pull requests the baseline and suite are "
            "read from the base commit, so they must be files committed in the repository"
        ) from None
    return PurePosixPath(*rel.parts).as_posix()


def has_commit(repo: GitRepo, sha: str) -> bool:
    return repo.run("cat-file", "-e", f"{sha}^{{commit}}").returncode == 0


def ensure_commit(repo: GitRepo, sha: str) -> None:
    """Make sure ``sha`` is present, fetching it from ``origin`` (one commit deep) if not:
    actions/checkout makes shallow clones by default, which lack the base commit."""
    if has_commit(repo, sha):
        return
    proc = repo.run("fetch", "--no-tags", "--no-recurse-submodules", "--depth=1", "origin", sha,
                    timeout=FETCH_TIMEOUT_S)
    if proc.returncode != 0 or not has_commit(repo, sha):
        raise GateError(
            f"{repo.root}: the pull request's base commit {sha[:12]} is not in the checkout and "
            f"`git fetch origin {sha[:12]}` failed ({_stderr(proc)}); {CHECKOUT_ADVICE}"
        )


def blob_at(repo: GitRepo, sha: str, rel: str) -> str | None:
    """The blob id of ``rel`` at commit ``sha``, or None when the commit has no such file."""
    proc = repo.run("ls-tree", "-z", "--full-tree", sha, "--", rel)
    if proc.returncode != 0:
        raise GateError(f"{repo.root}: cannot list {rel} at {sha[:12]} ({_stderr(proc)})")
    for entry in proc.stdout.split(b"\0"):
        meta, _, name = entry.partition(b"\t")
        if name.decode("utf-8", "replace") != rel:
            continue
        _mode, kind, blob = meta.decode("ascii").split()
        if kind != "blob":
            raise GateError(f"{rel}: is a {kind} at commit {sha[:12]}, expected a file")
        return blob
    return None


def read_blob(repo: GitRepo, blob: str, rel: str) -> bytes:
    proc = repo.run("cat-file", "blob", blob)
    if proc.returncode != 0:
        raise GateError(f"{rel}: cannot read blob {blob[:12]} ({_stderr(proc)})")
    if proc.stdout.startswith(LFS_POINTER):
        raise GateError(
            f"{rel}: stored with git LFS, so the base commit holds only a pointer; keep baselines and "
            "suites out of LFS (they are small)"
        )
    return proc.stdout


def read_at(repo: GitRepo, sha: str, rel: str) -> bytes | None:
    """The bytes of ``rel`` at commit ``sha`` (fetched if missing), or None when it has no such file."""
    ensure_commit(repo, sha)
    blob = blob_at(repo, sha, rel)
    return None if blob is None else read_blob(repo, blob, rel)


def worktree_blob(repo: GitRepo, rel: str) -> str | None:
    """The blob id the working-tree file would have (no filters), or None when it is absent."""
    path = repo.root / rel
    if not path.is_file():
        return None
    proc = repo.run("hash-object", "--no-filters", "--", rel)
    if proc.returncode != 0:
        raise GateError(f"{path}: cannot hash the file ({_stderr(proc)})")
    return proc.stdout.decode("ascii").strip()


def changed_since(repo: GitRepo, sha: str, rel: str) -> bool:
    """Whether the working tree's ``rel`` differs from the one at ``sha`` (added, edited, removed)."""
    ensure_commit(repo, sha)
    return blob_at(repo, sha, rel) != worktree_blob(repo, rel)
