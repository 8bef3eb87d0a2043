"""Every command and YAML block in README.md and docs/*.md runs as written (issue #38).

The blocks are extracted from the files, never copied into this test: a block that changes is
checked as it now reads, and a new block of a kind this file does not check fails the first test.

- a suite (a YAML block with ``tasks:``; a fragment gets only a name and the lm-eval pin) and a
  group YAML (``# tasks/NAME.yaml``, named in a suite) run ``gate --dry-run --record-missing``
  with the demo's base checkpoint: lm-eval builds every task, the suite's names must match what
  the tasks produce. Bundled tasks read their datasets from a loopback hub (tests/hub_server.py)
  with small stand-ins in lm-eval's columns; ``include_path: tasks`` holds the demo's tasks and
  the task ``gatekeeper init --new-task my_qa`` writes, as the docs say.
- workflow YAML is linted by actionlint inside a workflow, and a step of this action may use
  only the inputs action.yml declares;
- every ``gatekeeper`` command line parses with gatekeeper's own parser, every script it names
  exists; docs/zero-to-green.md's init and first record run for real, in that order;
- JSON parses (``jsonc``: after its comments).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.demo_runs import ROOT, lm_eval_installed
from tests.hub_server import Hub, hub_env
from tests.test_bundled_tasks import _rows

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BASE = ROOT / "examples" / "checkpoints" / "base"
ACTION = "your-org/gatekeeper@"
# Programs a block may name that do not run here (a registry, a daemon, root, the network): their
# lines are shown to users as they are; gatekeeper's own commands and scripts are checked.
ELSEWHERE = {"git", "docker", "sudo", "echo", "pip"}


def _mmlu_subjects() -> list[str]:
    """The 57 subjects of lm-eval's bundled mmlu (its YAMLs name them)."""
    import importlib.util

    spec = importlib.util.find_spec("lm_eval")
    if spec is None or spec.origin is None:
        return []
    folder = Path(spec.origin).parent / "tasks" / "mmlu" / "default"
    return sorted(p.stem[len("mmlu_"):] for p in folder.glob("mmlu_*.yaml"))


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks() -> list[Block]:
    out = []
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            start = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
            if not start:
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            out.append(Block(path, i + 1, start.group(2), textwrap.dedent("\n".join(lines[i + 1:end])) + "\n"))
            i = end + 1
    return out


def kind(block: Block) -> str:
    if block.lang == "yaml":
        doc = yaml.safe_load(block.text)
        if doc is None:
            return "schema comment" if "$schema=" in block.text else "?"
        if isinstance(doc, dict) and "tasks" in doc:
            return "suite"
        if isinstance(doc, dict) and "group" in doc:
            return "group"
        if isinstance(doc, dict) and "jobs" in doc or isinstance(doc, list):
            return "workflow"
        return "?"
    if block.lang in ("sh", "bash"):
        return "commands"
    if block.lang in ("json", "jsonc"):
        return "json"
    if block.lang == "markdown":
        return "output"  # the demo's comment: tests/test_readme_demo.py holds it to the code's output
    if block.lang == "":
        if block.text.startswith("gatekeeper "):
            return "synopsis"
        return "text"  # a diagram, or terminal output that tests/test_readme_demo.py holds to the code's
    return "?"


BLOCKS = blocks()


def _of(*kinds: str) -> list[Block]:
    return [b for b in BLOCKS if kind(b) in kinds]


def test_every_block_is_of_a_kind_this_file_checks() -> None:
    unknown = [(b.id, b.lang) for b in BLOCKS if kind(b) == "?"]
    assert not unknown, f"blocks no test runs: {unknown}"
    assert len(_of("suite", "group")) >= 4 and len(_of("commands")) >= 6 and len(_of("workflow")) >= 2


def test_the_schema_comment_names_a_schema_of_this_repository() -> None:
    for block in _of("schema comment"):
        rel = re.search(r"\$schema=\S+?/main/(\S+)", block.text).group(1)
        assert (ROOT / rel).is_file(), f"{block.id}: {rel} is not in the repository"


# ----------------------------------------------------------------------------- suites and groups


def _hub_repos(root: Path) -> dict[str, Path]:
    """Stand-ins of the hub datasets the docs' bundled tasks read, in lm-eval's columns."""
    repos = {}

    def repo(name: str, configs: dict[str, dict[str, list[dict]]]) -> None:
        folder = root / name.replace("/", "__")
        card = ["---", "configs:"]
        for config, splits in configs.items():
            card += [f"- config_name: {config}", "  data_files:"]
            for split, rows in splits.items():
                (folder / config).mkdir(parents=True, exist_ok=True)
                (folder / config / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
                card.append(f"  - {{split: {split}, path: {config}/{split}.jsonl}}")
        (folder / "README.md").write_text("\n".join([*card, "---", ""]))
        repos[name] = folder

    repo("Rowan/hellaswag", {"default": {s: _rows("hellaswag", 6) for s in ("train", "validation")}})
    repo("allenai/ai2_arc", {"ARC-Easy": {s: _rows("arc_easy", 6) for s in ("train", "validation", "test")}})
    repo("cais/mmlu", {s: {"test": _rows(f"mmlu_{s}", 3), "dev": _rows(f"mmlu_{s}", 5)} for s in _mmlu_subjects()})
    return repos


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    hub = Hub(_hub_repos(tmp_path_factory.mktemp("hub"))).start()
    yield hub
    hub.stop()


@pytest.fixture(scope="module")
def my_qa(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tasks folder ``gatekeeper init --new-task my_qa`` writes."""
    folder = tmp_path_factory.mktemp("init")
    proc = _gatekeeper(["init", "--new-task", "my_qa"], folder, env=None)
    assert proc.returncode == 0, proc.stderr
    return folder / "tasks"


def _gatekeeper(args: list[str], cwd: Path, env: dict[str, str] | None) -> subprocess.CompletedProcess:
    env = dict(env or os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "gatekeeper", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def _project(tmp_path: Path, my_qa: Path) -> Path:
    project = tmp_path / "project"
    shutil.copytree(ROOT / "examples" / "tasks", project / "tasks", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(my_qa, project / "tasks", dirs_exist_ok=True)
    return project


def _suite_text(block: Block, project: Path) -> str:
    if kind(block) == "group":
        path = re.match(r"#\s*(\S+\.yaml)", block.text).group(1)
        (project / path).write_text(block.text)
        name = yaml.safe_load(block.text)["group"]
        return f'name: doc\nlm_eval_version: "0.4.13"\ninclude_path: tasks\ntasks:\n  - name: {name}\n'
    doc = yaml.safe_load(block.text)
    head = "" if "name" in doc else 'name: doc\nlm_eval_version: "0.4.13"\n'
    return head + block.text


@pytest.mark.lmeval
@pytest.mark.skipif(not lm_eval_installed(), reason="lm-eval is not installed")
@pytest.mark.parametrize("block", _of("suite", "group"), ids=lambda b: b.id)
def test_a_suite_or_group_block_passes_a_dry_run_as_written(block: Block, tmp_path: Path, hub: Hub,
                                                            my_qa: Path) -> None:
    project = _project(tmp_path, my_qa)
    (project / "gatekeeper.yaml").write_text(_suite_text(block, project))
    proc = _gatekeeper(["gate", "--suite", "gatekeeper.yaml", "--model", str(BASE), "--dry-run", "--record-missing"],
                       project, hub_env(hub, tmp_path / "hf-home"))
    assert proc.returncode == 0, f"{block.id}:\n{proc.stderr[-3000:]}"
    assert "every check passed, nothing evaluated" in proc.stdout


# ----------------------------------------------------------------------------- workflows


def _workflow(block: Block) -> dict:
    doc = yaml.safe_load(block.text)
    if isinstance(doc, list):  # steps
        doc = {"jobs": {"gate": {"runs-on": "ubuntu-latest", "steps": doc}}}
    return {"name": "doc", "on": {"push": None}, "permissions": {"contents": "read"}, **doc}


@pytest.mark.parametrize("block", _of("workflow"), ids=lambda b: b.id)
def test_a_workflow_block_lints_and_uses_only_the_actions_inputs(block: Block, tmp_path: Path) -> None:
    doc = _workflow(block)
    inputs = set(yaml.safe_load((ROOT / "action.yml").read_text())["inputs"])
    for job in doc["jobs"].values():
        for step in job.get("steps", []):
            if str(step.get("uses", "")).startswith(ACTION):
                unknown = set(step.get("with") or {}) - inputs
                assert not unknown, f"{block.id}: action.yml has no input {sorted(unknown)}"
    actionlint = shutil.which("actionlint") or str(Path(sys.executable).with_name("actionlint"))
    if not Path(actionlint).is_file():
        pytest.skip("actionlint is not installed (the dev extra)")
    folder = tmp_path / ".github" / "workflows"
    folder.mkdir(parents=True)
    (folder / "doc.yml").write_text(yaml.safe_dump(doc, sort_keys=False).replace("'on':", "on:"))
    shutil.copy(ROOT / ".github" / "actionlint.yaml", tmp_path / ".github" / "actionlint.yaml")  # runner labels
    lint = subprocess.run([actionlint, "-shellcheck=", "-pyflakes=", "-config-file", ".github/actionlint.yaml",
                           str(folder / "doc.yml")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert lint.returncode == 0, f"{block.id}:\n{lint.stdout}{lint.stderr}"


# ----------------------------------------------------------------------------- commands


def _commands(block: Block) -> list[list[str]]:
    """Each command line of a shell block, continuations joined, comments and placeholders
    (``<owner>``) taken as words; several commands on one line (``&&``) are split."""
    joined = block.text.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        while words:
            cut = next((i for i, w in enumerate(words) if w in ("&&", "||", ";", "|")), len(words))
            out.append(words[:cut])
            words = words[cut + 1:]
    return [c for c in out if c]


def test_every_command_line_parses_and_names_files_that_exist() -> None:
    from gatekeeper.cli import build_parser

    pyproject = (ROOT / "pyproject.toml").read_text()
    for block in _of("commands"):
        for words in _commands(block):
            program = words[0]
            where = f"{block.id}: {' '.join(words)}"
            if program == "gatekeeper":
                try:
                    build_parser().parse_args(words[1:])
                except SystemExit as exc:  # --version and --help exit 0
                    assert exc.code == 0, f"{where}: gatekeeper does not take these arguments"
            elif program == "bash" or program.startswith("scripts/"):
                script = words[1] if program == "bash" else program
                assert (ROOT / script).is_file(), f"{where}: no {script}"
            elif program == "pip" and "-e" in words:
                extra = re.search(r"\[(\w+)\]", words[-1]).group(1)
                assert re.search(rf"^{extra}\s*=", pyproject, re.M), f"{where}: pyproject has no extra {extra!r}"
            else:
                assert program in ELSEWHERE, f"{where}: {program!r} is neither checked here nor listed as not run here"


def test_the_synopsis_names_only_options_its_subcommand_takes() -> None:
    from gatekeeper.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for block in _of("synopsis"):
        known: list[set[str]] = []
        for line in block.text.splitlines():
            if line.startswith("gatekeeper "):
                words = line.split()
                sub = words[1]
                assert sub in commands, f"{block.id}: no subcommand {sub!r}"
                parsers = [commands[sub]]
                nested = [a for a in commands[sub]._actions if isinstance(a, argparse._SubParsersAction)]
                if nested:  # baseline record|promote|show
                    names = words[2].split("|")
                    assert set(names) <= set(nested[0].choices), f"{block.id}: gatekeeper {sub} has no {words[2]}"
                    parsers = [nested[0].choices[n] for n in names]
                known = [set(p._option_string_actions) for p in parsers]
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", line):
                assert all(flag in k for k in known), f"{block.id}: {line.strip()}: {flag} is not an option there"


@pytest.mark.lmeval
@pytest.mark.skipif(not lm_eval_installed(), reason="lm-eval is not installed")
def test_zero_to_green_init_and_first_record_run_as_written(tmp_path: Path, hub: Hub) -> None:
    """The guide's `gatekeeper init ...` then `gatekeeper gate ... --record-missing`, in a fresh
    folder holding the checkpoint they name (the demo's base model)."""
    guide = [b for b in _of("commands") if b.path.name == "zero-to-green.md"]
    lines = [w for b in guide for w in _commands(b) if w[0] == "gatekeeper"]
    init = next(w for w in lines if w[1] == "init")
    record = next(w for w in lines if w[1] == "gate" and "--record-missing" in w)
    project = tmp_path / "my project"
    project.mkdir()
    env = hub_env(hub, tmp_path / "hf-home", own_server=True)
    made = _gatekeeper(init[1:], project, env)
    assert made.returncode == 0, made.stderr
    checkpoint = record[record.index("--model") + 1]
    shutil.copytree(BASE, project / checkpoint)
    first = _gatekeeper(record[1:], project, env)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    assert "No baseline yet: recorded this run as the first baseline" in first.stdout
    assert list((project / ".gatekeeper" / "baselines").glob("*.json.gz"))


# ----------------------------------------------------------------------------- JSON


def test_json_blocks_parse() -> None:
    for block in _of("json"):
        text = re.sub(r"\s//[^\n]*", "", block.text) if block.lang == "jsonc" else block.text
        if not text.lstrip().startswith(("{", "[")):  # one key of the report, as the schema shows it
            text = "{" + text + "}"
        try:
            json.loads(text)
        except ValueError as exc:
            pytest.fail(f"{block.id}: {exc}")
