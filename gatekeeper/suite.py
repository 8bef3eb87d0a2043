"""The pinned suite file: validation with line numbers, defaults, canonical hash, policy.

A suite file (``gatekeeper.yaml``) says which lm-eval tasks to run and how, and how to gate the
result. It is validated against ``schemas/suite.schema.json`` (JSON Schema 2020-12); every
problem is reported at once, each with its line and path::

    gatekeeper.yaml:14: tasks[2].num_fewshot: expected integer, got 'five'

The suite hash identifies *what is measured*: it is the sha256 of the canonical JSON (sorted
keys, no whitespace) of the validated, defaults-filled document, minus the settings that only
decide how results are gated or where files go (``policy``, ``baseline``, each task's
``metrics`` and ``cluster``, ``model.device`` and ``model.batch_size``). Tuning a margin must not
invalidate a recorded baseline; changing ``num_fewshot`` must.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from gatekeeper.model import GateError
from gatekeeper.policy import DEFAULT_ROUNDING, Policy, Rule

SCHEMA_PATH = Path(__file__).parent / "schemas" / "suite.schema.json"

MODEL_DEFAULTS: dict[str, Any] = {
    "backend": "hf",
    "dtype": "auto",
    "batch_size": 1,
    "device": "auto",
    "chat_template": False,
    "max_length": None,
    "trust_remote_code": False,
    # Backend keys (see backends.py). None/False = not set: left out of the suite hash below,
    # so suites written before these keys existed keep their hash (and their baselines).
    "model_args": None,
    "tokenizer": None,
    "max_model_len": None,
    "tensor_parallel_size": None,
    "data_parallel_size": None,
    "gpu_memory_utilization": None,
    "parallelize": False,
    "base_url": None,
    "num_concurrent": None,
}
# lm-eval's own CLI defaults (``--seed 0,1234,1234,1234``), so a suite without seeds matches it.
SEED_DEFAULTS: dict[str, Any] = {"random": 0, "numpy": 1234, "torch": 1234, "fewshot": 1234}
POLICY_DEFAULTS: dict[str, Any] = {
    "alpha": 0.05,
    "correction": "holm",
    "margin": 0.0,
    "resamples": 10000,
    "rounding": DEFAULT_ROUNDING,
    "test": "superiority",
    "rules": [],
}
TASK_DEFAULTS: dict[str, Any] = {
    "num_fewshot": None,
    "limit": None,
    "gen_kwargs": None,
    "repeats": None,
    "cluster": None,
    "metrics": None,
}
METRIC_DEFAULTS: dict[str, Any] = {"filter": "*", "margin": None, "gate": True}
RULE_DEFAULTS: dict[str, Any] = {"task": "*", "filter": "*", "metric": "*", "margin": None, "gate": True}

# Settings that decide gating or file locations, not what lm-eval measures (see module doc).
_UNHASHED_TOP = ("policy", "baseline")
_UNHASHED_TASK = ("metrics", "cluster")
# Where and how fast the model runs, not what it computes: devices, parallelism, memory, the
# endpoint's address and concurrency. backend, tokenizer, max_model_len and model_args change
# the scores (another engine's kernels, another tokenizer, truncation): they are hashed.
_UNHASHED_MODEL = ("device", "batch_size", "tensor_parallel_size", "data_parallel_size",
                   "gpu_memory_utilization", "parallelize", "base_url", "num_concurrent")
# Hashed only when set (a suite that omits them hashes as before they existed).
_HASHED_WHEN_SET = ("model_args", "tokenizer", "max_model_len")
# model_args keys that only decide transport (timeouts, retries, TLS, credentials).
_UNHASHED_MODEL_ARGS = ("timeout", "max_retries", "num_concurrent", "base_url", "verify_certificate",
                        "ca_cert_path", "auth_token", "header", "parallelize", "gpu_memory_utilization",
                        "tensor_parallel_size", "data_parallel_size", "max_batch_size")


@dataclass
class TaskSpec:
    name: str
    num_fewshot: int | None = None
    limit: int | float | None = None
    gen_kwargs: dict | None = None
    repeats: int | None = None
    cluster: str | None = None
    metrics: list[dict] = field(default_factory=list)


@dataclass
class Suite:
    name: str
    path: Path
    lm_eval_version: str
    include_path: Path | None
    baseline_path: Path
    model: dict
    seeds: dict
    policy: Policy
    tasks: list[TaskSpec]
    hash: str

    def cluster_keys(self) -> dict[str, str]:
        """{task: doc field} for tasks whose items are grouped (shared passage, subject)."""
        return {t.name: t.cluster for t in self.tasks if t.cluster}

    @property
    def task_names(self) -> list[str]:
        return [t.name for t in self.tasks]


# ----------------------------------------------------------------------------- public API


def load_suite(path: str | Path) -> Suite:
    """Read, validate and default-fill a suite file; GateError lists every problem."""
    path = Path(path)
    return load_suite_text(_read(path), path)


def load_suite_text(text: str, path: str | Path) -> Suite:
    """A suite from its text, as if it were the file at ``path`` (relative paths resolve
    against ``path``'s folder): how the action reads the suite of a pull request's base commit."""
    path = Path(path)
    data, root = _parse(text, path)
    found = sorted(set(_schema_errors(data, root) + _semantic_errors(data, root, path)))
    if found:
        raise GateError("\n".join(_fmt(path, line, where, msg) for line, where, msg in found))
    doc = fill_defaults(data)
    return _build(doc, path)


def suite_hash(data: dict) -> str:
    """sha256 (hex) of the canonical JSON of the measurement-defining part of ``data``.

    ``data`` is a validated suite document; defaults are filled here too, so a file that spells
    out a default and one that omits it hash the same.
    """
    doc = fill_defaults(data)
    for key in _UNHASHED_TOP:
        doc.pop(key, None)
    _model_for_hash(doc["model"])
    for task in doc["tasks"]:
        for key in _UNHASHED_TASK:
            task.pop(key, None)
    return hashlib.sha256(canonical_json(doc).encode("utf-8")).hexdigest()


def _model_for_hash(m: dict) -> None:
    for key in _UNHASHED_MODEL:
        m.pop(key, None)
    if isinstance(m.get("model_args"), dict):
        m["model_args"] = {k: v for k, v in m["model_args"].items() if k not in _UNHASHED_MODEL_ARGS}
    for key in _HASHED_WHEN_SET:
        if m.get(key) in (None, {}):
            m.pop(key, None)


def canonical_json(obj: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 kept: equal documents give equal strings."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def fill_defaults(data: dict) -> dict:
    """A deep copy of a validated document with every optional key present."""
    doc = copy.deepcopy(data)
    doc.setdefault("include_path", None)
    if doc.get("baseline") is None:
        doc["baseline"] = f".gatekeeper/baselines/{doc['name']}.json.gz"
    doc["model"] = {**MODEL_DEFAULTS, **(doc.get("model") or {})}
    doc["seeds"] = {**SEED_DEFAULTS, **(doc.get("seeds") or {})}
    policy = {**POLICY_DEFAULTS, **(doc.get("policy") or {})}
    policy["rules"] = [{**RULE_DEFAULTS, **r} for r in policy.get("rules") or []]
    doc["policy"] = policy
    tasks = []
    for task in doc["tasks"]:
        t = {**TASK_DEFAULTS, **task}
        if t["metrics"] is not None:
            t["metrics"] = [{**METRIC_DEFAULTS, **m} for m in t["metrics"]]
        tasks.append(t)
    doc["tasks"] = tasks
    return doc


# ----------------------------------------------------------------------------- parsing


def read_bounded(path: Path) -> str:
    """The text of a suite or policy file, reading at most ``MAX_YAML_BYTES`` + 1 bytes (so a
    huge or endless file costs nothing); raises OSError, UnicodeDecodeError, YAMLLimitError."""
    with path.open("rb") as fh:
        raw = fh.read(MAX_YAML_BYTES + 1)
    if len(raw) > MAX_YAML_BYTES:
        raise YAMLLimitError(None, None, f"larger than {MAX_YAML_BYTES >> 10} KiB; a suite or policy file is "
                             "a few KB", None)
    return raw.decode("utf-8")


def _read(path: Path) -> str:
    try:
        return read_bounded(path)
    except FileNotFoundError:
        raise GateError(f"{path}: suite file not found") from None
    except YAMLLimitError as exc:
        raise GateError(f"{path}: {exc.problem}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise GateError(f"{path}: cannot read suite file ({exc})") from None


# A suite is a few dozen keys nested a few levels; these limits are 100x that and still refuse
# billion-laughs alias bombs and nesting that would exhaust the stack, while composing.
MAX_YAML_NODES = 100_000  # nodes after expanding every alias
MAX_YAML_DEPTH = 64  # nesting of mappings and lists
# The demo suite is 2 KB and a 500-task suite about 100 KB. PyYAML's pure-Python parser takes
# seconds per MB, so a larger file is refused before it is read whole or parsed.
MAX_YAML_BYTES = 256 << 10


class YAMLLimitError(yaml.composer.ComposerError):
    """A suite or policy file over ``MAX_YAML_BYTES``, ``MAX_YAML_NODES`` (aliases expanded)
    or ``MAX_YAML_DEPTH``; ``problem_mark`` is set except for the size."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts, while composing, each node's size with aliases expanded (sizes
    are memoized per node, so counting costs one pass over the text, not over the expansion)
    and the nesting depth, and stops at the first node over a limit: a 684-byte alias bomb or
    a 100k-deep list is refused in milliseconds, before any walk over the document."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._total = 0  # nodes composed so far, each alias counted as the size of its anchor
        self._sizes: dict[int, int] = {}  # id(node) -> its size with aliases expanded

    def compose_node(self, parent: Any, index: Any) -> Any:
        mark = self.peek_event().start_mark
        if self.check_event(yaml.AliasEvent):
            anchor = self.peek_event().anchor
            node = self.anchors.get(anchor)
            if node is not None and id(node) not in self._sizes:  # an alias inside its own anchor
                raise YAMLLimitError(None, None, f"alias *{anchor} refers to a node that contains it "
                                     "(a recursive structure); write the values out", mark)
            node = super().compose_node(parent, index)
            self._count(self._sizes[id(node)], mark)
            return node
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise YAMLLimitError(None, None, f"nested more than {MAX_YAML_DEPTH} levels deep", mark)
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        self._sizes[id(node)] = 1 + sum(self._sizes[id(n)] for n in _children(node))
        self._count(1, mark)
        return node

    def _count(self, nodes: int, mark: Any) -> None:
        self._total += nodes
        if self._total > MAX_YAML_NODES:
            raise YAMLLimitError(None, None, f"more than {MAX_YAML_NODES} values once its aliases (*name) "
                                 "are expanded (an alias bomb?); write the values out", mark)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


_OPEN_EVENTS = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSE_EVENTS = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def _check_depth_fast(text: str) -> None:
    """Nesting depth from libyaml's event stream (C, no recursion), when PyYAML has it: the
    pure-Python scanner needs about 0.5 s to reach the first 64 levels of ``[[[[...``, because
    every ``[`` may start a key and is looked ahead for. Syntax errors are left to the
    pure-Python loader, whose messages the rest of gatekeeper formats."""
    if not getattr(yaml, "__with_libyaml__", False):
        return
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.CSafeLoader):
            if isinstance(event, _OPEN_EVENTS):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    raise YAMLLimitError(None, None, f"nested more than {MAX_YAML_DEPTH} levels deep",
                                         event.start_mark)
            elif isinstance(event, _CLOSE_EVENTS):
                depth -= 1
    except YAMLLimitError:
        raise
    except yaml.MarkedYAMLError as exc:
        if "nesting depth" in str(exc.problem):  # libyaml's own limit, met while scanning ahead
            raise YAMLLimitError(None, None, f"nested more than {MAX_YAML_DEPTH} levels deep",
                                 exc.problem_mark) from None
    except yaml.YAMLError:
        pass


def load_yaml_bounded(text: str) -> tuple[Any, yaml.Node | None]:
    """(data, node tree) of one YAML document with the safe loader, refusing documents over
    the size and depth limits (``YAMLLimitError``, a ``yaml.MarkedYAMLError`` with the line)."""
    if len(text) > MAX_YAML_BYTES:
        raise YAMLLimitError(None, None, f"larger than {MAX_YAML_BYTES >> 10} KiB; a suite or policy file is "
                             "a few KB", None)
    _check_depth_fast(text)
    loader = _BoundedLoader(text)
    try:
        root = loader.get_single_node()
        return (loader.construct_document(root) if root is not None else None), root
    finally:
        loader.dispose()


def _parse(text: str, path: Path) -> tuple[Any, yaml.Node | None]:
    try:
        data, root = load_yaml_bounded(text)
    except YAMLLimitError as exc:
        line = f":{exc.problem_mark.line + 1}" if exc.problem_mark else ""
        raise GateError(f"{path}{line}: {exc.problem}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise GateError(f"{path}{line}: not valid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise GateError(f"{path}: not valid YAML: {exc}") from None
    except RecursionError:  # the limits above stop this first; kept so no input can traceback
        raise GateError(f"{path}: nested too deeply to read; a suite needs only a few levels") from None
    if data is None:
        raise GateError(f"{path}: empty suite file; expected a mapping with name, lm_eval_version, tasks")
    if not isinstance(data, dict):
        raise GateError(f"{path}:1: expected a mapping at the top level, got {_type_name(data)}")
    return data, root


@lru_cache(maxsize=1)
def _schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def _schema_errors(data: Any, root: yaml.Node | None) -> list[tuple[int, str, str]]:
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(_schema())
    found: list[tuple[int, str, str]] = []
    for err in validator.iter_errors(data):
        found.extend(_describe(err, root))
    found.extend(_duplicate_keys(root))
    return found


def _semantic_errors(data: dict, root: yaml.Node | None, path: Path) -> list[tuple[int, str, str]]:
    errors: list[tuple[int, str, str]] = []
    seen: dict[str, int] = {}
    tasks = data.get("tasks") if isinstance(data.get("tasks"), list) else []
    for i, task in enumerate(tasks):
        if not isinstance(task, dict) or not isinstance(task.get("name"), str):
            continue  # the schema reports it
        where = ("tasks", i, "name")
        if task["name"] in seen:
            errors.append((_line(root, where), _path_str(where),
                           f"task {task['name']!r} is listed twice (first as tasks[{seen[task['name']]}])"))
        seen.setdefault(task["name"], i)
    include = data.get("include_path")
    if isinstance(include, str) and include and not (path.parent / include).is_dir():
        errors.append((_line(root, ("include_path",)), "include_path",
                       f"directory {include!r} not found (relative to {path.parent})"))
    return errors


def _build(doc: dict, path: Path) -> Suite:
    base = path.parent.resolve()
    tasks = [
        TaskSpec(
            name=t["name"],
            num_fewshot=None if t["num_fewshot"] is None else int(t["num_fewshot"]),
            limit=_limit(t["limit"]),
            gen_kwargs=t["gen_kwargs"],
            repeats=None if t["repeats"] is None else int(t["repeats"]),
            cluster=t["cluster"],
            metrics=list(t["metrics"] or []),
        )
        for t in doc["tasks"]
    ]
    return Suite(
        name=doc["name"],
        path=path,
        lm_eval_version=doc["lm_eval_version"],
        include_path=None if doc["include_path"] is None else (base / doc["include_path"]).resolve(),
        baseline_path=(base / doc["baseline"]).resolve(),
        model=doc["model"],
        seeds=doc["seeds"],
        policy=_policy(doc, path),
        tasks=tasks,
        hash=suite_hash(doc),
    )


def _limit(value: Any) -> int | float | None:
    if value is None:
        return None
    # 5.0 is an integer to JSON Schema; keep lm-eval's meaning (>= 1 is a count).
    return int(value) if float(value) >= 1 else float(value)


def _policy(doc: dict, path: Path) -> Policy:
    """Task metric rules first (first match wins), each listing task closed by an inform rule."""
    rules: list[Rule] = []
    for t in doc["tasks"]:
        if not t["metrics"]:
            continue
        for m in t["metrics"]:
            rules.append(Rule(task=t["name"], filter=m["filter"], metric=m["metric"],
                              margin=None if m["margin"] is None else float(m["margin"]),
                              gate=bool(m["gate"])))
        rules.append(Rule(task=t["name"], gate=False))
    p = doc["policy"]
    for r in p["rules"]:
        rules.append(Rule(task=r["task"], filter=r["filter"], metric=r["metric"],
                          margin=None if r["margin"] is None else float(r["margin"]),
                          gate=bool(r["gate"])))
    policy = Policy(alpha=float(p["alpha"]), correction=p["correction"], margin=float(p["margin"]),
                    resamples=int(p["resamples"]), rules=rules, rounding=float(p["rounding"]),
                    test=p["test"])
    policy.validate(f"{path}: policy")
    return policy


# ----------------------------------------------------------------------------- error text

_JSON_TYPES = {
    "object": "a mapping",
    "array": "a list",
    "string": "string",
    "integer": "integer",
    "number": "number",
    "boolean": "true or false",
    "null": "null",
}


def _describe(err: Any, root: yaml.Node | None) -> list[tuple[int, str, str]]:
    """One jsonschema error → [(line, path, message)]; unknown keys give one entry each."""
    where = tuple(err.absolute_path)
    schema = err.schema if isinstance(err.schema, dict) else {}
    v, inst = err.validator, err.instance
    if v == "additionalProperties" and isinstance(inst, dict):
        known = sorted(schema.get("properties", {}))
        out = []
        for key in sorted(set(inst) - set(known), key=str):
            hint = difflib.get_close_matches(str(key), known, n=1)
            tip = f"; did you mean {hint[0]!r}?" if hint else f" (known: {', '.join(known)})"
            out.append((_line(root, (*where, key), key_line=True), _path_str((*where, key)),
                        f"unknown key{tip}"))
        return out
    if v == "required":
        missing = [k for k in err.validator_value if k not in inst]
        return [(_line(root, where), _path_str(where), f"missing required key {k!r}") for k in missing]
    if "x-expected" in schema and v in ("anyOf", "oneOf", "pattern", "type", "minLength"):
        msg = f"expected {schema['x-expected']}, got {_show(inst)}"
    elif v == "type":
        types = err.validator_value if isinstance(err.validator_value, list) else [err.validator_value]
        msg = f"expected {' or '.join(_JSON_TYPES.get(t, t) for t in types)}, got {_show(inst)}"
    elif v == "enum":
        msg = f"expected one of {', '.join(map(repr, err.validator_value))}, got {_show(inst)}"
    elif v == "const":
        msg = f"expected {err.validator_value!r}, got {_show(inst)}"
    elif v in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        op = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}[v]
        msg = f"must be {op} {err.validator_value}, got {_show(inst)}"
    elif v == "minItems":
        msg = f"must list at least {err.validator_value} item(s)"
    elif v == "minLength":
        msg = "must not be empty"
    elif v == "pattern":
        msg = f"{_show(inst)} does not match {err.validator_value}"
    else:
        msg = err.message
    return [(_line(root, where), _path_str(where), msg)]


def _duplicate_keys(root: yaml.Node | None, where: tuple = ()) -> list[tuple[int, str, str]]:
    """YAML silently keeps the last of two equal keys; a suite is too important for that."""
    out: list[tuple[int, str, str]] = []
    if isinstance(root, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in root.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else str(key)
            if name in seen:
                out.append((key.start_mark.line + 1, _path_str((*where, name)), "duplicate key"))
            seen.add(name)
            out.extend(_duplicate_keys(value, (*where, name)))
    elif isinstance(root, yaml.SequenceNode):
        for i, item in enumerate(root.value):
            out.extend(_duplicate_keys(item, (*where, i)))
    return out


def _node_at(root: yaml.Node | None, where: tuple) -> tuple[yaml.Node | None, yaml.Node | None]:
    """(key node, value node) for a path; the deepest existing node when the path runs out."""
    key_node, node = None, root
    for part in where:
        if isinstance(node, yaml.MappingNode):
            match = [(k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and _key_eq(k, part)]
            if not match:
                break
            key_node, node = match[-1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            key_node, node = None, node.value[part]
        else:
            break
    return key_node, node


def _key_eq(node: yaml.ScalarNode, part: Any) -> bool:
    if node.value == str(part):
        return True
    try:  # a non-string key (1, true) as YAML resolved it
        return yaml.safe_load(node.value) == part
    except yaml.YAMLError:
        return False


def _line(root: yaml.Node | None, where: tuple, key_line: bool = False) -> int:
    key_node, node = _node_at(root, where)
    target = key_node if (key_line and key_node is not None) else node
    return target.start_mark.line + 1 if target is not None else 1


def _path_str(where: tuple) -> str:
    out = ""
    for part in where:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _fmt(path: Path, line: int, where: str, msg: str) -> str:
    return f"{path}:{line}: {where}: {msg}" if where else f"{path}:{line}: {msg}"


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(value: Any) -> str:
    return _show(value) if isinstance(value, (dict, list)) else type(value).__name__
