"""Reading the workflow event: which PR, which commit, which checkpoint, is it a fork.

Payload shapes follow GitHub's webhook events (pull_request, push, schedule, workflow_dispatch,
workflow_run). Everything here is pure apart from reading the event file and looking at the
checked-out workspace to tell checkpoint directories from other files.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from gatekeeper.errors import GateError
from gatekeeper.files import link_leaving, resolves_within

PR_EVENTS = ("pull_request", "pull_request_target")
# Events that can run a pull request's code (the workflow may check out its head): on a
# self-hosted runner each must prove the head is this repository (docs/action.md#fork-pull-requests).
FORK_CHECKED_EVENTS = (
    "pull_request", "pull_request_target", "pull_request_review", "pull_request_review_comment",
    "issue_comment", "workflow_run", "check_run", "check_suite",
)
POINTER_SUFFIX = ".ckpt-path"
POINTER_MAX_BYTES = 4096
# Files whose presence marks a directory as a Hugging Face checkpoint.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


@dataclass
class Event:
    name: str
    payload: dict[str, Any] = field(default_factory=dict)
    sha: str = ""
    repository: str = ""

    @property
    def pull_request(self) -> dict[str, Any] | None:
        pr = self.payload.get("pull_request")
        return pr if isinstance(pr, dict) else None

    @property
    def pr_number(self) -> int | None:
        if self.name in PR_EVENTS and self.pull_request:
            return int(self.pull_request["number"])
        if self.name == "workflow_run":
            prs = (self.payload.get("workflow_run") or {}).get("pull_requests") or []
            if prs:
                return int(prs[0]["number"])
        if self.name == "issue_comment":  # ChatOps: a comment on a pull request
            issue = self.payload.get("issue")
            if isinstance(issue, dict) and issue.get("pull_request") and issue.get("number") is not None:
                return int(issue["number"])
        return None

    @property
    def default_branch(self) -> str | None:
        """The repository's default branch as the payload names it (every webhook payload with a
        ``repository`` object does); None when it does not."""
        repo = self.payload.get("repository")
        name = repo.get("default_branch") if isinstance(repo, dict) else None
        return name if isinstance(name, str) and name else None

    @property
    def head_sha(self) -> str:
        """The commit under test: PR head for PR events, the triggering run's head for
        workflow_run, else GITHUB_SHA (for pull_request GITHUB_SHA is a merge commit)."""
        if self.pull_request:
            return str((self.pull_request.get("head") or {}).get("sha") or self.sha)
        if self.name == "workflow_run":
            return str((self.payload.get("workflow_run") or {}).get("head_sha") or self.sha)
        return self.payload.get("after") or self.sha

    @property
    def base_sha(self) -> str | None:
        if self.pull_request:
            return (self.pull_request.get("base") or {}).get("sha")
        before = self.payload.get("before")
        return before if before and set(before) != {"0"} else None

    def pr_heads(self) -> list[PrHead]:
        """The pull-request heads whose code this event may run, as far as the payload tells.

        Empty when the event carries no pull request (push, schedule, an issue comment on an
        issue). ``PrHead.known`` is False where the payload does not name the head repository
        (issue_comment, check_run, check_suite; a malformed pull_request): it must be looked up
        by number, and with no number it cannot be verified at all."""
        if "pull_request" in self.payload:  # pull_request*, pull_request_review*
            return [head_of(self.payload.get("pull_request"))]
        if self.name == "issue_comment":
            number = self.pr_number
            return [PrHead(number, None, known=False)] if number is not None else []
        if self.name == "workflow_run":
            return _workflow_run_heads(self.payload.get("workflow_run"))
        if self.name in ("check_run", "check_suite"):
            obj = self.payload.get(self.name)
            prs = obj.get("pull_requests") if isinstance(obj, dict) else None
            # GitHub leaves pull_requests empty for forks: no number means unverifiable.
            return [PrHead(_number(pr), None, known=False) for pr in prs or [None]]
        return []

    def dispatch_inputs(self) -> dict[str, str]:
        """workflow_dispatch inputs with kebab-case keys; empty values dropped (they do not override)."""
        if self.name != "workflow_dispatch":
            return {}
        raw = self.payload.get("inputs") or {}
        out: dict[str, str] = {}
        for key, value in raw.items():
            if value is None or value == "":
                continue
            if isinstance(value, bool):
                value = "true" if value else "false"
            out[str(key).strip().lower().replace("_", "-")] = str(value)
        return out


@dataclass(frozen=True)
class PrHead:
    """A pull request head named by an event. ``known``: the payload states the head
    repository; then ``repo`` is its full name, or None for a deleted fork."""

    number: int | None
    repo: str | None
    known: bool


def _number(obj: Any) -> int | None:
    value = obj.get("number") if isinstance(obj, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def head_of(pr: Any) -> PrHead:
    """The head of a pull request object (webhook payload or ``GET /pulls/{n}``)."""
    head = pr.get("head") if isinstance(pr, dict) else None
    if not isinstance(head, dict) or "repo" not in head:
        return PrHead(_number(pr), None, known=False)
    repo = head.get("repo")
    if repo is None:  # the fork was deleted: certainly not ours
        return PrHead(_number(pr), None, known=True)
    name = repo.get("full_name") if isinstance(repo, dict) else None
    return PrHead(_number(pr), name, known=True) if isinstance(name, str) else PrHead(_number(pr), None, False)


def _workflow_run_heads(run: Any) -> list[PrHead]:
    if not isinstance(run, dict):
        return [PrHead(None, None, known=False)]
    prs = run.get("pull_requests") or []
    number = _number(prs[0]) if prs else None
    head_repo = run.get("head_repository")
    if isinstance(head_repo, dict) and isinstance(head_repo.get("full_name"), str):
        return [PrHead(number, head_repo["full_name"], known=True)]
    return [PrHead(_number(pr), None, known=False) for pr in prs or [None]]


def load_event(env: dict[str, str] | None = None) -> Event:
    env = os.environ if env is None else env
    name = env.get("GITHUB_EVENT_NAME", "").strip()
    path = env.get("GITHUB_EVENT_PATH", "").strip()
    payload: dict[str, Any] = {}
    if path:
        try:
            payload = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise GateError(f"{path}: GITHUB_EVENT_PATH does not exist") from None
        except (OSError, ValueError) as exc:
            raise GateError(f"{path}: cannot read the event payload ({exc})") from None
        if not isinstance(payload, dict):
            raise GateError(f"{path}: the event payload is not a JSON object")
    return Event(name=name, payload=payload, sha=env.get("GITHUB_SHA", ""), repository=env.get("GITHUB_REPOSITORY", ""))


# -- which checkpoint did a push change --------------------------------------------------------


def changed_paths(payload: dict[str, Any]) -> list[str]:
    """Files a push added or modified, in order, without duplicates (removed files skipped)."""
    commits = list(payload.get("commits") or [])
    if not commits and payload.get("head_commit"):
        commits = [payload["head_commit"]]
    seen: dict[str, None] = {}
    for c in commits:
        for key in ("added", "modified"):
            for p in c.get(key) or []:
                seen.setdefault(str(p), None)
    return list(seen)


def is_checkpoint_dir(path: Path) -> bool:
    if not path.is_dir():
        return False
    if (path / "config.json").is_file():
        return True
    return any(p.suffix in WEIGHT_SUFFIXES for p in path.iterdir() if p.is_file())


def checkpoints_in_push(payload: dict[str, Any], workspace: Path) -> list[str]:
    """Repository-relative checkpoint dirs / pointer files that the push added or changed."""
    found: dict[str, None] = {}
    for rel in changed_paths(payload):
        pure = PurePosixPath(rel)
        if pure.is_absolute() or ".." in pure.parts:
            continue  # event data is untrusted; stay inside the workspace
        if pure.name.endswith(POINTER_SUFFIX) and (workspace / rel).is_file():
            found.setdefault(rel, None)
            continue
        for parent in pure.parents:
            if str(parent) == ".":
                break
            if is_checkpoint_dir(workspace / parent):
                found.setdefault(str(parent), None)
                break
    return list(found)


def resolve_model(value: str, event: Event, workspace: Path, *, untrusted: bool = False,
                  roots: tuple[Path, ...] = ()) -> str:
    """The model to evaluate: ``auto`` picks the checkpoint a push changed; a pointer file is
    replaced by the path it contains; anything else (dir, hub id) is returned as given.

    ``untrusted``: the checkout is a pull request's (or another untrusted tree): a model that is,
    passes through or holds a symlink leaving the workspace is refused. ``roots``: folders outside
    the workspace where a pointer file may send the evaluation (the ``model-roots`` input)."""
    value = value.strip()
    if value == "auto":
        if event.name != "push":
            raise GateError(f"model: 'auto' only works for push events, this is {event.name or 'unknown'}")
        ckpts = checkpoints_in_push(event.payload, workspace)
        if not ckpts:
            raise GateError(
                "model: auto: the push changed no checkpoint (a directory with config.json or "
                f"*.safetensors, or a *{POINTER_SUFFIX} file); set the model input"
            )
        if len(ckpts) > 1:
            raise GateError(
                f"model: auto: the push changed {len(ckpts)} checkpoints ({', '.join(ckpts)}); "
                "set the model input to the one to gate"
            )
        value = ckpts[0]
    return read_pointer(value, workspace, untrusted=untrusted, roots=roots)


def read_pointer(value: str, workspace: Path, *, untrusted: bool = False, roots: tuple[Path, ...] = ()) -> str:
    """If ``value`` names a small text file that is not a model, return the checkpoint folder it
    names. A pointer's text is never shown (a link to a runner file would print that file): its
    target must be a checkpoint folder (``config.json``) inside the workspace or under ``roots``."""
    path = Path(value) if Path(value).is_absolute() else workspace / value
    if untrusted:
        link = link_leaving(path, workspace)
        if link is not None:
            raise GateError(f"{value}: {link} is a symlink that leaves the workspace; a pull request's checkpoint "
                            "must be files in its checkout (a pointer file may name a folder under model-roots)")
    if not path.is_file():
        return str(path) if path.is_dir() else value
    if path.stat().st_size > POINTER_MAX_BYTES:
        raise GateError(f"{value}: not a checkpoint directory, and too big to be a pointer file")
    try:
        lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError):
        raise GateError(f"{value}: not a checkpoint directory, and not a text pointer file") from None
    target = next((ln for ln in lines if ln and not ln.startswith("#")), "")
    if not target:
        raise GateError(f"{value}: pointer file is empty (expected the checkpoint's path on the runner)")
    target_path = Path(target)
    if not target_path.is_absolute():  # relative: next to the pointer, else from the workspace
        near = path.parent / target
        target_path = near if near.exists() else workspace / target
    # From here on the pointer's text is the runner's business: name the pointer, never its text.
    if not (target_path / "config.json").is_file():
        raise GateError(f"{value}: the pointer file does not name a checkpoint folder on this runner (a folder "
                        "with config.json; its text is not shown)")
    allowed = [Path(workspace), *roots]
    if not any(resolves_within(target_path, r) for r in allowed):
        raise GateError(f"{value}: the pointer file names a checkpoint outside the workspace and outside every "
                        "model-roots folder (its text is not shown); add the checkpoints' root to the action's "
                        "model-roots input")
    return str(target_path)
