"""What an untrusted checkout is gated against: the measurement as it is at the base commit.

On any run whose checkout is not the trusted default branch (a pull request, a push to another
branch, a comment that checked out a PR's head), the checkout supplies the model and nothing
else. Everything that defines the measurement is read from the base commit's git objects and
written into a private temporary folder, with the repository's layout:

- the suite file, its ``include_path`` tree (task YAMLs, Python, data files), the baseline and
  its anchor (``anchor.py``);
- paths are built lexically (no ``resolve()`` of the working tree, whose links the PR controls)
  and a symlink (git mode 120000) or submodule on them, at the base or in the working tree, is
  refused: exit 2 naming the path;
- lm-eval then runs from that folder, so the PR's task code is never imported, and the PR's
  suite is never read for anything but the reviewer's list of what it would change.

Every failure is a ``GateError`` (exit 2): fail closed.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from gatekeeper.baseline import gitbase, store
from gatekeeper.baseline.anchor import anchor_path
from gatekeeper.baseline.trend import trend_path
from gatekeeper.compare.compat import check_suite_hash
from gatekeeper.errors import GateError
from gatekeeper.model import RunResults
from gatekeeper.suite.modelpaths import is_path, model_paths
from gatekeeper.suite.policy import Policy
from gatekeeper.suite.policydiff import policy_changes, suite_key_changes
from gatekeeper.suite.suite import Suite, load_suite, load_suite_text, local_data_files
from gatekeeper.text import escape_untrusted
from gatekeeper.yamlsafe import YAMLLimitError, load_yaml_bounded, read_bounded

ACCEPT_DOC = "docs/action.md#accepting-a-deliberate-change"
# What one base tree may hold: a suite's tasks are a few MB; a larger tree is refused.
MAX_TREE_FILES = 20_000
MAX_TREE_BYTES = 512 << 20
SHOWN_PATHS = 10


@dataclass
class BaseTree:
    """The base commit's measurement, materialised under ``root`` (removed on exit).

    ``suite`` is loaded from ``root`` (its include_path and baseline resolve there);
    ``baseline`` is the base's baseline file under ``root`` (None when the base has none);
    ``notes`` are the markdown blocks the reviewer must read under the headline."""

    sha: str
    root: Path
    suite: Suite
    baseline: Path | None
    notes: list[str] = field(default_factory=list)

    @property
    def policy(self) -> Policy:
        return self.suite.policy


def pr_base_sha(pull_request: dict[str, Any]) -> str:
    base = pull_request.get("base")
    sha = base.get("sha") if isinstance(base, dict) else None
    return gitbase.check_sha(str(sha or ""), "event pull_request.base.sha")


@contextmanager
def base_tree(workspace: Path, sha: str, suite_input: str, *, baseline_input: str | None = None,
              bootstrap: bool = False, why: str = "pull request", need_baseline: bool = True) -> Iterator[BaseTree]:
    """Materialise the base commit ``sha``'s suite (``suite_input``: the action's suite input,
    relative to ``workspace``), include_path tree and baseline; yield them; remove them.

    ``baseline_input``: an explicit baseline path (the action's input), also read at the base;
    ``bootstrap``: only to say, when the base has no baseline, that the input is ignored here;
    ``why``: how the run is named in messages ("pull request", "push to branch x");
    ``need_baseline``: False to evaluate only (``run``): a base without a baseline is then fine."""
    repo = gitbase.find_repo(Path(workspace))
    gitbase.ensure_commit(repo, sha)
    suite_rel = _workspace_relative(repo, workspace, suite_input, "suite")
    with tempfile.TemporaryDirectory(prefix="gatekeeper-base-") as tmp:
        root = Path(tmp)
        text = _read_file(repo, sha, suite_rel, "suite", why)
        data = _suite_data(text, suite_rel, sha)
        folder = str(PurePosixPath(suite_rel).parent) if "/" in suite_rel else ""
        include_rel = None
        if isinstance(data.get("include_path"), str) and data["include_path"]:
            include_rel = gitbase.join_relative(folder, data["include_path"], f"{suite_rel} at {sha[:7]}: include_path")
            _refuse_worktree_links(repo, include_rel, "include_path")
            _copy_tree(repo, sha, include_rel, root)
        _copy_dataset_files(repo, sha, folder, data, root, suite_rel)
        _copy_model_paths(repo, sha, folder, data, root, suite_rel)
        _write(root, suite_rel, text)
        base_suite = _load_base_suite(root / suite_rel, suite_rel, sha)
        default_baseline = gitbase.join_relative(folder, str(data.get("baseline") or
                                                             f".gatekeeper/baselines/{data.get('name')}.json.gz"),
                                                 f"{suite_rel} at {sha[:7]}: baseline")
        baseline_rel = (_workspace_relative(repo, workspace, baseline_input, "baseline")
                        if baseline_input else default_baseline)
        _refuse_worktree_links(repo, baseline_rel, "baseline")
        blob = _read_file(repo, sha, baseline_rel, "baseline", why, missing_ok=True)
        if blob is None and not need_baseline:
            yield BaseTree(sha=sha, root=root, suite=base_suite, baseline=None,
                           notes=[f"Suite and tasks from the base commit {sha[:7]}."])
            return
        if blob is None:
            where = "on pull requests" if why == "pull request" else "here"
            ignored = f" (the bootstrap input is ignored {where})" if bootstrap else ""
            raise GateError(
                f"{baseline_rel}: no baseline at the {why}'s base commit {sha[:7]}; a {why} never records "
                f"its own baseline{ignored}: record it on the default branch (`bootstrap: true` on a push or "
                "workflow_dispatch run, or `gatekeeper baseline record`), then re-run"
            )
        baseline = _write(root, baseline_rel, blob)
        stored = _load_checked(baseline, base_suite, f"{baseline_rel} at base commit {sha[:7]}")
        # The anchor too, from the base commit only: a PR that moves or deletes it changes nothing.
        anchor_rel = str(PurePosixPath(baseline_rel).with_name(anchor_path(Path(PurePosixPath(baseline_rel).name)).name))
        _refuse_worktree_links(repo, anchor_rel, "anchor")
        anchor_blob = _read_file(repo, sha, anchor_rel, "anchor", why, missing_ok=True)
        if anchor_blob is not None:
            _write(root, anchor_rel, anchor_blob)
        # And its history: the PR comment's trend, and which anchor the default branch had.
        trend_rel = str(PurePosixPath(baseline_rel).with_name(trend_path(Path(PurePosixPath(baseline_rel).name)).name))
        _refuse_worktree_links(repo, trend_rel, "history")
        trend_blob = _read_file(repo, sha, trend_rel, "history", why, missing_ok=True)
        if trend_blob is not None:
            _write(root, trend_rel, trend_blob)
        notes = _notes(repo, sha, _short(why), suite_rel, include_rel, baseline_rel,
                       default_baseline if baseline_input is None else None, base_suite, data, stored)
        yield BaseTree(sha=sha, root=root, suite=base_suite, baseline=baseline, notes=notes)


# ----------------------------------------------------------------------------- reading the base


def _workspace_relative(repo: gitbase.GitRepo, workspace: Path, value: str, what: str) -> str:
    """An input path as a repository path, lexically; a symlink on it in the working tree is refused."""
    path = Path(value) if Path(value).is_absolute() else Path(workspace) / value
    rel = gitbase.repo_relative(repo, path)
    _refuse_worktree_links(repo, rel, what)
    return rel


def _refuse_worktree_links(repo: gitbase.GitRepo, rel: str, what: str) -> None:
    """Refuse ``rel`` when it, or a folder on its way, is a symlink in the working tree."""
    parts = PurePosixPath(rel).parts
    for i in range(1, len(parts) + 1):
        step = Path(repo.root, *parts[:i])
        if step.is_symlink():
            raise GateError(f"{PurePosixPath(*parts[:i])}: the {what} path is a symlink in the checkout; "
                            "gatekeeper reads it from the base commit and refuses links (commit the file itself)")


def _read_file(repo: gitbase.GitRepo, sha: str, rel: str, what: str, why: str, *,
               missing_ok: bool = False) -> bytes | None:
    entry = gitbase.entry_at(repo, sha, rel)
    if entry is None:
        if missing_ok:
            return None
        raise GateError(
            f"{rel}: not in the {why}'s base commit {sha[:7]}, so there is nothing to gate it against; merge "
            "the suite deliberately, then record its baseline on the default branch (`bootstrap: true` on "
            "a push or workflow_dispatch run)"
        )
    _refuse_entry(entry, sha, what)
    return gitbase.read_blob(repo, entry.oid, rel)


def _refuse_entry(entry: gitbase.Entry, sha: str, what: str) -> None:
    if entry.is_link:
        raise GateError(f"{entry.path}: the {what} is a symlink at base commit {sha[:7]}; gatekeeper refuses "
                        "links on the paths that define the measurement (commit the file itself)")
    if entry.kind != "blob":
        raise GateError(f"{entry.path}: is a {entry.kind} at base commit {sha[:7]}, expected a file")


def _suite_data(text: bytes, rel: str, sha: str) -> dict[str, Any]:
    try:
        data, _ = load_yaml_bounded(text.decode("utf-8"))
    except (UnicodeDecodeError, YAMLLimitError, ValueError) as err:
        raise GateError(f"{rel} at base commit {sha[:7]} does not load: {err}") from None
    except Exception as err:  # noqa: BLE001 - any YAML error: the suite load below names it with its line
        raise GateError(f"{rel} at base commit {sha[:7]} is not valid YAML ({type(err).__name__})") from None
    if not isinstance(data, dict):
        raise GateError(f"{rel} at base commit {sha[:7]}: expected a mapping at the top level")
    return data


def _copy_tree(repo: gitbase.GitRepo, sha: str, include_rel: str, root: Path) -> None:
    entries = gitbase.tree_files(repo, sha, include_rel)
    if len(entries) > MAX_TREE_FILES:
        raise GateError(f"{include_rel}: {len(entries):,} files at base commit {sha[:7]}; include_path should "
                        f"hold the suite's tasks only (at most {MAX_TREE_FILES:,})")
    total = 0
    for entry in entries:
        _refuse_entry(entry, sha, "include_path tree")
        data = gitbase.read_blob(repo, entry.oid, entry.path)
        total += len(data)
        if total > MAX_TREE_BYTES:
            raise GateError(f"{include_rel}: more than {MAX_TREE_BYTES >> 20} MiB at base commit {sha[:7]}")
        _write(root, entry.path, data)


def _copy_dataset_files(repo: gitbase.GitRepo, sha: str, folder: str, data: dict[str, Any], root: Path,
                        suite_rel: str) -> None:
    """The local data files the suite's ``dataset:`` overrides name, from the base commit too."""
    tasks = data.get("tasks") if isinstance(data.get("tasks"), list) else []
    for task in tasks:
        dataset = task.get("dataset") if isinstance(task, dict) else None
        kwargs = dataset.get("kwargs") if isinstance(dataset, dict) else None
        files = kwargs.get("data_files") if isinstance(kwargs, dict) else None
        for rel in local_data_files(files):
            path = gitbase.join_relative(folder, rel, f"{suite_rel} at {sha[:7]}: dataset data_files")
            if not (root / path).exists():
                _refuse_worktree_links(repo, path, "dataset")
                _write(root, path, _read_file(repo, sha, path, "dataset file", "base"))


def _copy_model_paths(repo: gitbase.GitRepo, sha: str, folder: str, data: dict[str, Any], root: Path,
                      suite_rel: str) -> None:
    """The files the suite's model settings name as paths (``./tok``, an adapter), from the base
    commit too: the runner resolves them beside the suite file, which is the base's copy. An
    absolute path into the repository would read the PR's tree: refused."""
    model = data.get("model") if isinstance(data.get("model"), dict) else {}
    for key, value in model_paths(model):
        if not is_path(value):
            continue
        where = f"{suite_rel} at base commit {sha[:7]}: {key}"
        expanded = os.path.expanduser(value)
        if os.path.isabs(expanded):
            try:
                gitbase.repo_relative(repo, Path(expanded))
            except GateError:
                continue  # a folder on the runner, outside the repository: the runner's own
            raise GateError(f"{where}: {value} lies inside the repository, which the pull request writes; "
                            "write it relative to the suite file so it is read from the base commit")
        rel = gitbase.join_relative(folder, value, where)
        entry = gitbase.entry_at(repo, sha, rel)
        if entry is None:
            raise GateError(f"{where}: {value} is not in the base commit (paths in the suite are relative to its "
                            "folder; commit it, or merge it first)")
        if entry.kind != "tree":
            _refuse_entry(entry, sha, key)
        if entry.kind == "tree":
            _copy_tree(repo, sha, rel, root)
        else:
            _write(root, rel, gitbase.read_blob(repo, entry.oid, rel))


def _write(root: Path, rel: str, data: bytes) -> Path:
    target = root.joinpath(*PurePosixPath(rel).parts)
    if os.path.commonpath([root, target]) != str(root):  # join_relative keeps paths inside: belt and braces
        raise GateError(f"{rel}: leaves the repository")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return target


def _load_base_suite(path: Path, rel: str, sha: str) -> Suite:
    try:
        return load_suite(path)
    except GateError as err:
        raise GateError(f"{rel} at base commit {sha[:7]} does not load: "
                        f"{str(err).replace(str(path), rel)}") from None


def _load_checked(copy: Path, base_suite: Suite, where: str) -> RunResults:
    """The base's baseline, checked against the base's suite; errors name the committed file."""
    try:
        stored = store.load_baseline(copy)
        check_suite_hash(stored, base_suite)
    except GateError as err:  # name the committed file, not the temp copy
        raise GateError(f"{where}: {str(err).replace(str(copy), '').lstrip(': ')}") from None
    return stored


# ----------------------------------------------------------------------------- what the PR would change


def _short(why: str) -> str:
    return "PR" if why == "pull request" else why


def _notes(repo: gitbase.GitRepo, sha: str, why: str, suite_rel: str, include_rel: str | None,
           baseline_rel: str, suite_baseline: str | None, base_suite: Suite, base_data: dict,
           stored: RunResults) -> list[str]:
    """``suite_baseline``: the base suite's own baseline path when the baseline came from the suite
    (not an input), to say when the PR's suite moves it."""
    notes = [f"Suite, tasks, baseline {escape_untrusted(baseline_rel, 300)} and policy from the base commit "
             f"{sha[:7]}: a {why} changes the model and nothing else; its own suite and task changes take "
             "effect after merge, with a new baseline."]
    if gitbase.changed_since(repo, sha, baseline_rel):
        notes.append(f"⚠️ This {why} edits the baseline {escape_untrusted(baseline_rel, 300)}; it is still gated "
                     "against the base commit's.")
    head = _head_suite(repo, suite_rel)
    if isinstance(head, str):
        return notes + [f"⚠️ This {why}'s suite {escape_untrusted(suite_rel, 200)} does not load "
                        f"({escape_untrusted(head, 300)}); it is gated with the base commit's."]
    head_suite, head_data = head
    if suite_baseline is not None and suite_baseline != _rel_baseline(repo, head_suite):
        notes.append(f"⚠️ This {why} moves the suite's baseline file; it is still gated against the base commit's.")
    notes += _policy_notes(base_suite.policy, head_suite.policy, stored, why)
    changes = suite_key_changes(base_data, head_data)
    if changes:
        notes.append(_listed(f"**Suite changes in this {why}** (not applied: it is evaluated with the base "
                             "commit's suite; they take effect after merge, with a new baseline):", changes))
    files = _task_file_changes(repo, sha, include_rel, head_suite)
    if files:
        notes.append(_listed(f"**Task files this {why} changes** (not used: the tasks are the base commit's):", files))
    return notes


def _head_suite(repo: gitbase.GitRepo, suite_rel: str) -> tuple[Suite, dict] | str:
    """The working tree's suite (the PR's), for the list of changes only; a message when it does not load."""
    path = Path(repo.root, *PurePosixPath(suite_rel).parts)
    try:
        text = read_bounded(path)
        data, _ = load_yaml_bounded(text)
        return load_suite_text(text, path), data
    except GateError as err:
        return str(err).splitlines()[0]
    except Exception as err:  # noqa: BLE001 - the PR's file may be anything; it is never used
        return f"{type(err).__name__}: {err}"


def _rel_baseline(repo: gitbase.GitRepo, suite: Suite) -> str | None:
    try:
        return gitbase.repo_relative(repo, suite.baseline_path)
    except GateError:
        return None


def _task_file_changes(repo: gitbase.GitRepo, sha: str, include_rel: str | None, head_suite: Suite) -> list[str]:
    """Files under the base's include_path (and the PR's, when it moved it) that differ."""
    folders = {include_rel} if include_rel else set()
    if head_suite.include_path is not None:
        try:
            folders.add(gitbase.repo_relative(repo, head_suite.include_path))
        except GateError:
            pass
    out: list[str] = []
    for folder in sorted(folders):
        base = {e.path: e.oid for e in gitbase.tree_files(repo, sha, folder)}
        here = sorted(p.relative_to(repo.root).as_posix() for p in Path(repo.root, folder).rglob("*")
                      if p.is_file() and not p.is_symlink() and "__pycache__" not in p.parts)
        head = gitbase.hash_files(repo, here)
        links = sorted(p.relative_to(repo.root).as_posix() for p in Path(repo.root, folder).rglob("*")
                       if p.is_symlink())
        for path in sorted(set(base) | set(head) | set(links)):
            if path in links:
                out.append(f"{path} (a symlink)")
            elif path not in head:
                out.append(f"{path} (removed)")
            elif path not in base:
                out.append(f"{path} (added)")
            elif base[path] != head[path]:
                out.append(f"{path} (edited)")
    return out


def _policy_notes(base_policy: Policy, head_policy: Policy, stored: RunResults, why: str) -> list[str]:
    parents = {t: tuple(sorted(g for g, subs in stored.group_subtasks.items() if t in subs)) for t in stored.tasks}
    changes = policy_changes(base_policy, head_policy, stored.series, parents)
    if not changes:
        return []
    return [_listed(f"**Policy changes in this {why}** (it is gated with the base commit's policy; they apply "
                    "once merged):", [c.describe() for c in changes])]


def _listed(head: str, items: list[str]) -> str:
    shown = [f"- {escape_untrusted(i, 300)}" for i in items[:SHOWN_PATHS]]
    if len(items) > SHOWN_PATHS:
        shown.append(f"- … and {len(items) - SHOWN_PATHS} more")
    return "\n".join([head, *shown])
