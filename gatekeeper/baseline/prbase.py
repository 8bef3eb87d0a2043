"""What a pull request is gated against: the baseline and policy of its **base** commit.

The checked-out merge ref holds the PR's own edits, so a PR that edits
``.gatekeeper/baselines/*.json.gz`` or loosens a margin in the suite must not be gated with
them. The PR's checkpoint is still evaluated with the PR's suite, which must measure the same
thing (same suite hash) as the base's. Every failure is a ``GateError`` (exit 2): fail closed.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gatekeeper.baseline import gitbase, store
from gatekeeper.compare.compat import check_suite_hash
from gatekeeper.errors import GateError
from gatekeeper.suite.policy import Policy
from gatekeeper.suite.policydiff import policy_changes
from gatekeeper.suite.suite import load_suite_text
from gatekeeper.text import escape_untrusted

ACCEPT_DOC = "docs/action.md#accepting-a-deliberate-change"


@dataclass
class PrBase:
    """The base commit's baseline (a temp copy outside the workspace) and policy, and the
    markdown blocks the reviewer must read (where they came from, what the PR changes)."""

    sha: str
    baseline: Path
    policy: Policy
    notes: list[str] = field(default_factory=list)


def base_sha(pull_request: dict[str, Any]) -> str:
    base = pull_request.get("base")
    sha = base.get("sha") if isinstance(base, dict) else None
    return gitbase.check_sha(str(sha or ""), "event pull_request.base.sha")


@contextmanager
def pr_base(pull_request: dict[str, Any], suite, *, baseline: Path | None = None,
            bootstrap: bool = False) -> Iterator[PrBase]:
    """Read the base commit's suite and baseline; the baseline copy is removed on exit.

    ``baseline``: an explicit baseline path (the action's input), also read at the base commit;
    ``bootstrap``: only to say, when the base has no baseline, that the input is ignored here.
    """
    sha = base_sha(pull_request)
    repo = gitbase.find_repo(suite.path.resolve().parent)
    base_suite = _base_suite(repo, sha, suite)
    rel = gitbase.repo_relative(repo, baseline or base_suite.baseline_path)
    data = gitbase.read_at(repo, sha, rel)
    if data is None:
        ignored = " (the bootstrap input is ignored on pull requests)" if bootstrap else ""
        raise GateError(
            f"{rel}: no baseline at the pull request's base commit {sha[:7]}; a pull request never records "
            f"its own baseline{ignored}: record it on the default branch (`bootstrap: true` on a push or "
            "workflow_dispatch run, or `gatekeeper baseline record`), then re-run"
        )
    with tempfile.TemporaryDirectory(prefix="gatekeeper-base-") as tmp:
        copy = Path(tmp) / Path(rel).name  # outside the workspace: the PR's files stay as they are
        copy.write_bytes(data)
        notes = _notes(repo, sha, rel, suite, base_suite, moved=baseline is None, copy=copy)
        yield PrBase(sha=sha, baseline=copy, policy=base_suite.policy, notes=notes)


def _base_suite(repo: gitbase.GitRepo, sha: str, suite):
    rel = gitbase.repo_relative(repo, suite.path)
    text = gitbase.read_at(repo, sha, rel)
    if text is None:
        raise GateError(
            f"{suite.path}: not in the pull request's base commit {sha[:7]}, so there is no baseline to gate "
            "it against; merge the suite deliberately, then record its baseline on the default branch "
            "(`bootstrap: true` on a push or workflow_dispatch run)"
        )
    try:
        base_suite = load_suite_text(text.decode("utf-8"), suite.path)
    except (GateError, UnicodeDecodeError) as err:
        raise GateError(f"{rel} at base commit {sha[:7]} does not load: {err}") from None
    if base_suite.hash != suite.hash:
        raise GateError(
            f"{suite.path}: this pull request changes what the suite measures (hash {base_suite.hash[:12]} at "
            f"base {sha[:7]}, {suite.hash[:12]} now), so the base commit's baseline cannot gate it; merge it "
            f"deliberately and re-record the baseline on the default branch ({ACCEPT_DOC})"
        )
    return base_suite


def _notes(repo: gitbase.GitRepo, sha: str, rel: str, suite, base_suite, *, moved: bool, copy: Path) -> list[str]:
    shown = escape_untrusted(rel, 300)
    notes = [f"Baseline {shown} and policy from the base commit {sha[:7]}: a pull request is gated against "
             "its base, never against its own baseline or policy."]
    if gitbase.changed_since(repo, sha, rel):
        notes.append(f"⚠️ This PR edits the baseline {shown}; it is still gated against the base commit's.")
    if moved and suite.baseline_path != base_suite.baseline_path:
        notes.append("⚠️ This PR moves the suite's baseline file; it is still gated against the base commit's.")
    stored = _load_checked(copy, base_suite, f"{rel} at base commit {sha[:7]}")
    return notes + _policy_notes(base_suite.policy, suite.policy, stored)


def _load_checked(copy: Path, base_suite, where: str):
    """The base's baseline, checked against the base's suite; errors name the committed file."""
    try:
        stored = store.load_baseline(copy)
        check_suite_hash(stored, base_suite)
    except GateError as err:  # name the committed file, not the temp copy
        raise GateError(f"{where}: {str(err).replace(str(copy), '').lstrip(': ')}") from None
    return stored


def _policy_notes(base_policy: Policy, head_policy: Policy, stored) -> list[str]:
    parents = {t: tuple(sorted(g for g, subs in stored.group_subtasks.items() if t in subs)) for t in stored.tasks}
    changes = policy_changes(base_policy, head_policy, stored.series, parents)
    if not changes:
        return []
    head = "**Policy changes in this PR** (it is gated with the base commit's policy; they apply once merged):"
    return ["\n".join([head, *(f"- {escape_untrusted(c.describe(), 300)}" for c in changes)])]
