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
import posixpath
import re
import shutil
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


# Every git call: prompts off (a fetch that needs credentials fails instead of waiting), any owner.
_GIT = ("git", "-c", "safe.directory=*", "-c", "core.quotePath=false")


def _git_env() -> dict[str, str]:
    return dict(os.environ, GIT_TERMINAL_PROMPT="0", GIT_ASKPASS="", SSH_ASKPASS="", LC_ALL="C")


def _git(cwd: Path, *args: str, timeout: float, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([*_GIT, *args], cwd=cwd, input=stdin, capture_output=True, timeout=timeout,
                              env=_git_env(), check=False)
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
    """``path`` as a repository path (posix), built lexically: no symlink of the working tree is
    followed (a pull request controls the working tree, and a link there must not choose which
    committed file is read). GateError when it lies outside the repository."""
    full = Path(os.path.normpath(os.path.abspath(path)))
    for root in dict.fromkeys((Path(os.path.abspath(repo.root)), Path(os.path.realpath(repo.root)))):
        try:
            rel = full.relative_to(root)  # git names the root with its links resolved: try both spellings
            break
        except ValueError:
            continue
    else:
        raise GateError(
            f"{path}: outside the git repository {repo.root}; on pull requests the baseline and suite are "
            "read from the base commit, so they must be files committed in the repository"
        ) from None
    return PurePosixPath(*rel.parts).as_posix()


def join_relative(folder: str, rel: str, where: str) -> str:
    """``folder``/``rel`` as a repository path (posix, normalised); GateError when it leaves
    the repository (``..`` past the root) or is absolute."""
    if PurePosixPath(rel).is_absolute():
        raise GateError(f"{where}: {rel!r} is an absolute path; it must be relative to the suite file")
    joined = posixpath.normpath(posixpath.join(folder, rel)) if folder else posixpath.normpath(rel)
    if joined == ".." or joined.startswith("../"):
        raise GateError(f"{where}: {rel!r} leaves the repository")
    return "" if joined == "." else joined


def head_commit(repo: GitRepo) -> str:
    """The commit the working tree is checked out at (``git rev-parse HEAD``)."""
    proc = repo.run("rev-parse", "--verify", "HEAD^{commit}")
    if proc.returncode != 0:
        raise GateError(f"{repo.root}: cannot tell the checked-out commit ({_stderr(proc)})")
    return proc.stdout.decode("ascii").strip()


def merge_base(repo: GitRepo, a: str, b: str) -> str:
    """The best common ancestor of two commits; GateError when the history does not hold one
    (a shallow checkout: fetch-depth 0 fixes it)."""
    proc = repo.run("merge-base", a, b)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise GateError(
            f"{repo.root}: no common ancestor of {a[:12]} and {b[:12]} in the checkout ({_stderr(proc)}); "
            f"{CHECKOUT_ADVICE}"
        )
    return check_sha(proc.stdout.decode("ascii"), "git merge-base")


def branch_commit(repo: GitRepo, branch: str) -> str:
    """The commit of ``origin/<branch>`` (fetched when the checkout lacks it)."""
    if not re.fullmatch(r"[A-Za-z0-9._/-]+", branch) or branch.startswith("-") or ".." in branch:
        raise GateError(f"event: default branch name {branch!r} is not a branch name")
    ref = f"refs/remotes/origin/{branch}"
    proc = repo.run("rev-parse", "--verify", f"{ref}^{{commit}}")
    if proc.returncode != 0:
        fetch = repo.run("fetch", "--no-tags", "--no-recurse-submodules", "origin", f"+refs/heads/{branch}:{ref}",
                         timeout=FETCH_TIMEOUT_S)
        proc = repo.run("rev-parse", "--verify", f"{ref}^{{commit}}")
        if fetch.returncode != 0 or proc.returncode != 0:
            raise GateError(f"{repo.root}: the default branch {branch} is not in the checkout and cannot be "
                            f"fetched ({_stderr(fetch)}); {CHECKOUT_ADVICE}")
    return check_sha(proc.stdout.decode("ascii"), f"origin/{branch}")


@dataclass(frozen=True)
class Entry:
    """One path of a commit's tree: git's mode (100644, 100755, 120000 = symlink, 160000 =
    submodule), its object id and type."""

    path: str
    mode: str
    kind: str
    oid: str

    @property
    def is_link(self) -> bool:
        return self.mode == "120000"


def entry_at(repo: GitRepo, sha: str, rel: str) -> Entry | None:
    """The tree entry of ``rel`` at commit ``sha`` (None when absent). git never follows a
    symlink inside the tree, so a path under a linked folder is absent."""
    proc = repo.run("ls-tree", "-z", "--full-tree", sha, "--", rel)
    if proc.returncode != 0:
        raise GateError(f"{repo.root}: cannot list {rel} at {sha[:12]} ({_stderr(proc)})")
    for line in proc.stdout.split(b"\0"):
        meta, _, name = line.partition(b"\t")
        if name.decode("utf-8", "replace") == rel:
            mode, kind, oid = meta.decode("ascii").split()
            return Entry(rel, mode, kind, oid)
    return None


def tree_files(repo: GitRepo, sha: str, rel: str) -> list[Entry]:
    """Every entry under folder ``rel`` at commit ``sha``, recursively (blobs, links, submodules)."""
    proc = repo.run("ls-tree", "-r", "-z", "--full-tree", sha, "--", rel.rstrip("/") + "/")
    if proc.returncode != 0:
        raise GateError(f"{repo.root}: cannot list {rel}/ at {sha[:12]} ({_stderr(proc)})")
    out = []
    for line in proc.stdout.split(b"\0"):
        if not line:
            continue
        meta, _, name = line.partition(b"\t")
        mode, kind, oid = meta.decode("ascii").split()
        out.append(Entry(name.decode("utf-8", "surrogateescape"), mode, kind, oid))
    return out


def hash_files(repo: GitRepo, rels: list[str]) -> dict[str, str]:
    """The blob ids the working-tree files ``rels`` would have (no filters), in one git call."""
    if not rels:
        return {}
    proc = repo.run("hash-object", "--no-filters", "--stdin-paths", stdin="\n".join(rels).encode("utf-8") + b"\n")
    if proc.returncode != 0:
        raise GateError(f"{repo.root}: cannot hash the working tree's files ({_stderr(proc)})")
    return dict(zip(rels, proc.stdout.decode("ascii").split(), strict=True))


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


def deleted_in_worktree(paths: list[Path]) -> list[Path]:
    """Those of ``paths`` that git tracks but that are missing from the working tree (deleted
    without ``git rm``); [] outside a git checkout or without git: this is a guard, not a need."""
    missing = [Path(p) for p in paths if not os.path.lexists(p)]
    if not missing or shutil.which("git") is None:
        return []
    folder = missing[0].parent
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    try:
        proc = _git(folder, "ls-files", "-z", "--deleted", "--full-name", "--",
                    *(os.path.abspath(p) for p in missing), timeout=GIT_TIMEOUT_S)
    except GateError:
        return []
    if proc.returncode != 0:
        return []
    listed = {PurePosixPath(n).name for n in proc.stdout.decode("utf-8", "replace").split("\0") if n}
    return [p for p in missing if p.name in listed]


# A pull request's checkpoint read as data: the files its head commit holds under one folder,
# written outside any checkout. Nothing of the working tree is read (a forged or linked file
# there changes nothing), links and submodules are refused, and git LFS pointers are replaced by
# their objects (``git lfs smudge``; the workflow fetches them first).


def export_folder(repo: GitRepo, sha: str, rel: str, dest: Path) -> Path:
    """Write the files under ``rel`` at commit ``sha`` into the new folder ``dest``; return it.
    GateError (exit 2) when the commit has no such folder, or it holds a symlink or submodule."""
    ensure_commit(repo, sha)
    rel = rel.strip("/")
    entries = tree_files(repo, sha, rel)
    if not entries:
        raise GateError(f"{rel}: no such folder at commit {sha[:12]} (the model input names a checkpoint "
                        "folder of the pull request's head)")
    for entry in entries:
        if entry.is_link or entry.kind != "blob":
            what = "a symlink" if entry.is_link else f"a {entry.kind}"
            raise GateError(f"{entry.path}: is {what} at commit {sha[:12]}; a checkpoint read from git must be "
                            "plain files")
    dest.mkdir(parents=True)
    for entry in entries:
        target = dest.joinpath(*PurePosixPath(entry.path).relative_to(rel).parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        _blob_to_file(repo, entry, target)
    return dest


def _blob_to_file(repo: GitRepo, entry: Entry, target: Path) -> None:
    """The blob, streamed to ``target`` (weights are large); an LFS pointer smudged to its object."""
    env = _git_env()
    with target.open("wb") as out:
        proc = subprocess.run([*_GIT, "cat-file", "blob", entry.oid], cwd=repo.root, stdout=out,
                              stderr=subprocess.PIPE, timeout=FETCH_TIMEOUT_S, env=env, check=False)
    if proc.returncode != 0:
        raise GateError(f"{entry.path}: cannot read blob {entry.oid[:12]} ({_stderr(proc)})")
    with target.open("rb") as fh:
        head = fh.read(len(LFS_POINTER))
    if head != LFS_POINTER or target.stat().st_size > 1024:
        return
    pointer = target.read_bytes()
    with target.open("wb") as out:
        try:
            proc = subprocess.run([*_GIT, "lfs", "smudge", "--", entry.path], cwd=repo.root, input=pointer,
                                  stdout=out, stderr=subprocess.PIPE, timeout=FETCH_TIMEOUT_S, env=env, check=False)
        except FileNotFoundError:
            proc = None
    if proc is None or proc.returncode != 0:
        why = "git is missing" if proc is None else _stderr(proc)
        raise GateError(f"{entry.path}: a git LFS pointer whose object could not be read ({why}); fetch the "
                        "pull request's LFS objects first (`git lfs fetch origin <head sha>`)")
