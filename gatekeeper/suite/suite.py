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
import os
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from gatekeeper.errors import GateError
from gatekeeper.suite.policy import DEFAULT_ROUNDING, Policy, Rule
from gatekeeper.yamlsafe import YAMLLimitError, line_of, load_yaml_bounded, node_at, path_str, read_bounded

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
    "group_share": 0.5,
    "margin": 0.0,
    "resamples": 10000,
    "rounding": DEFAULT_ROUNDING,
    "test": "superiority",
    "sequential": None,
    "items": "uniform",
    "rules": [],
}
TASK_DEFAULTS: dict[str, Any] = {
    "num_fewshot": None,
    "limit": None,
    "gen_kwargs": None,
    "repeats": None,
    "cluster": None,
    "subtasks": "gate",
    "dataset": None,
    "metrics": None,
}
METRIC_DEFAULTS: dict[str, Any] = {"filter": "*", "margin": None, "gate": True}
RULE_DEFAULTS: dict[str, Any] = {"task": "*", "filter": "*", "metric": "*", "margin": None, "gate": True}

# Settings that decide gating or file locations, not what lm-eval measures (see module doc).
_UNHASHED_TOP = ("policy", "baseline")
_UNHASHED_TASK = ("metrics", "cluster", "subtasks")
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
    # A group's subtasks: "gate" (with the group, one family) or "info" (the group alone decides).
    subtasks: str = "gate"
    metrics: list[dict] = field(default_factory=list)
    # Where the task's documents come from instead of its YAML's dataset (a local copy, a private
    # mirror): {"path": ..., "name": ..., "kwargs": {"data_files": ...}}, local data files
    # relative to the suite's folder. Part of what is measured (hashed).
    dataset: dict | None = None
    # "suite.yaml:24: tasks[0].name", for messages only.
    where: str = field(default="", compare=False)

    def portable(self) -> dict[str, Any]:
        """The spec as a run's manifest records it: no file locations of this checkout."""
        out = {k: v for k, v in asdict(self).items() if k != "where"}
        if out["dataset"] is None:  # recorded only when set, as the suite hash does
            out.pop("dataset")
        if out["subtasks"] == "gate":  # policy, not measurement: recorded only when not the default
            out.pop("subtasks")
        return out


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
    # What ``hash`` is the hash of (``hashed_document``); runs record it in their manifest.
    hashed: dict = field(default_factory=dict, compare=False, repr=False)

    def cluster_keys(self) -> dict[str, str]:
        """{task: doc field} for tasks whose items are grouped (shared passage, subject)."""
        return {t.name: t.cluster for t in self.tasks if t.cluster}

    @property
    def task_names(self) -> list[str]:
        return [t.name for t in self.tasks]

    @property
    def random_seed(self) -> int:
        """The suite's random seed (0 when unset): it orders a sequential gate's looks and draws an
        informative gate's items, so every process, a sharded gate's judge included, agrees."""
        return int(self.seeds.get("random", 0) or 0)


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
    return _build(doc, path, root)


def suite_hash(data: dict) -> str:
    """sha256 (hex) of the canonical JSON of the measurement-defining part of ``data``.

    ``data`` is a validated suite document; defaults are filled here too, so a file that spells
    out a default and one that omits it hash the same.
    """
    return hashlib.sha256(canonical_json(hashed_document(data)).encode("utf-8")).hexdigest()


def hashed_document(data: dict) -> dict:
    """The part of a suite document that ``suite_hash`` hashes (defaults filled): what a run
    records, so a changed hash can name the field that changed (``hash_changes``)."""
    doc = fill_defaults(data)
    for key in _UNHASHED_TOP:
        doc.pop(key, None)
    _model_for_hash(doc["model"])
    for task in doc["tasks"]:
        for key in _UNHASHED_TASK:
            task.pop(key, None)
        if task.get("dataset") is None:  # hashed only when set: older suites keep their hash
            task.pop("dataset", None)
    return doc


def field_hashing(section: str, key: str) -> str:
    """Whether a suite field is part of the suite hash: "hashed", "hashed when set" or "not
    hashed". ``section`` is "" (top level), "model", "seeds", "policy", "rule", "task" or
    "metric" (what docs/suite.md and the schema's descriptions say, checked by a test)."""
    if section == "":
        return "not hashed" if key in _UNHASHED_TOP else "hashed"
    if section == "model":
        if key in _UNHASHED_MODEL:
            return "not hashed"
        return "hashed when set" if key in _HASHED_WHEN_SET else "hashed"
    if section == "seeds":
        return "hashed"
    if section == "task":
        if key in _UNHASHED_TASK:
            return "not hashed"
        return "hashed when set" if key == "dataset" else "hashed"
    return "not hashed"  # policy, its rules and the tasks' metrics decide how results are judged


def hash_changes(old: dict, new: dict) -> list[str]:
    """What differs between two hashed documents, one "where: old -> new" per field; tasks are
    named (``tasks[demo_mc].num_fewshot``), and None reads as "unset"."""
    out: list[str] = []
    _diff(_by_name(old), _by_name(new), "", out)
    return out


def _by_name(doc: dict) -> dict:
    doc = dict(doc)
    if isinstance(doc.get("tasks"), list):
        doc["tasks"] = {str(t.get("name")) if isinstance(t, dict) else str(i): t
                        for i, t in enumerate(doc["tasks"])}
    return doc


def _diff(old: Any, new: Any, where: str, out: list[str], depth: int = 0) -> None:
    if isinstance(old, dict) and isinstance(new, dict) and depth < 12:  # a suite nests a few levels
        for key in sorted(set(old) | set(new), key=str):
            if key == "name" and where.startswith("tasks["):
                continue
            sub = f"tasks[{key}]" if where == "tasks" else (f"{where}.{key}" if where else str(key))
            if key not in old:
                out.append(f"{sub} added" + ("" if where == "tasks" else f" ({_shown(new[key])})"))
            elif key not in new:
                out.append(f"{sub} removed" + ("" if where == "tasks" else f" (was {_shown(old[key])})"))
            else:
                _diff(old[key], new[key], sub, out, depth + 1)
    elif old != new:
        out.append(f"{where}: {_shown(old)} -> {_shown(new)}")


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    text = canonical_json(value) if isinstance(value, (dict, list)) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


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


# ----------------------------------------------------------------------------- policy files


def load_policy(path: str | Path) -> Policy:
    """Read a policy file, or the policy of a suite file."""
    return read_policy_file(path)[0]


def read_policy_file(path: str | Path) -> tuple[Policy, Suite | None]:
    """The policy in a policy file or a suite file, and the ``Suite`` when it is one (else None)."""
    path = Path(path)
    try:
        text = read_bounded(path)
        data, _ = load_yaml_bounded(text)
    except OSError as exc:
        raise GateError(f"{path}: cannot read policy file ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise GateError(f"{path}: not valid UTF-8 text") from None
    except YAMLLimitError as exc:  # too large, an alias bomb or deep nesting: refused before any walk
        line = f":{exc.problem_mark.line + 1}" if exc.problem_mark else ""
        raise GateError(f"{path}{line}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark else ""
        raise GateError(f"{path}: not valid YAML{at}") from None
    if isinstance(data, dict) and "tasks" in data:
        suite = load_suite(path)
        return suite.policy, suite
    _, root = load_yaml_bounded(text)
    nested = isinstance(data, dict) and "policy" in data
    found = sorted(set(_policy_errors(data, root, nested)))
    if found:
        raise GateError("\n".join(_fmt(path, line, where, msg) for line, where, msg in found))
    if nested:
        data = data["policy"]
    return Policy.from_dict(data or {}, where=str(path)), None


def _policy_errors(data: Any, root: yaml.Node | None, nested: bool) -> list[tuple[int, str, str]]:
    """A policy file checked against the suite schema's ``policy`` (the same types and messages
    as in a suite: ``gate: "false"`` is an error, never a gated metric); ``nested``: the file
    holds ``policy:`` at its top, else it is the policy mapping itself."""
    from jsonschema import Draft202012Validator

    schema = _schema()
    if nested:
        if set(data) != {"policy"}:
            extra = sorted(str(k) for k in set(data) - {"policy"})
            return [(line_of(root, (extra[0],), key_line=True), extra[0],
                     "unknown key in a policy file (it holds policy: only, or the policy's own keys)")]
        doc, to_root = data, root
    else:  # the file is the policy: seen as if under policy:, its keys named as written
        doc = {"policy": data if data is not None else {}}
        to_root = yaml.MappingNode("tag:yaml.org,2002:map", [(yaml.ScalarNode("tag:yaml.org,2002:str", "policy"),
                                                              root)]) if root is not None else None
    policy_only = {"$defs": schema.get("$defs", {}), "type": "object",
                   "properties": {"policy": schema["properties"]["policy"]}}
    found: list[tuple[int, str, str]] = []
    for err in Draft202012Validator(policy_only).iter_errors(doc):
        for line, where, msg in _describe(err, to_root):
            found.append((line, where if nested else where.removeprefix("policy").lstrip("."), msg))
    found.extend(_duplicate_keys(root))
    first: dict[tuple[int, str], str] = {}  # one message per key: `.inf` is not an integer, nor <= 1e6
    for line, where, msg in sorted(found):
        first.setdefault((line, where), msg)
    return [(line, where, msg) for (line, where), msg in first.items()]


# ----------------------------------------------------------------------------- parsing


def _read(path: Path) -> str:
    try:
        return read_bounded(path)
    except FileNotFoundError:
        raise GateError(f"{path}: suite file not found") from None
    except YAMLLimitError as exc:
        raise GateError(f"{path}: {exc.problem}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise GateError(f"{path}: cannot read suite file ({exc})") from None


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
            errors.append((line_of(root, where), path_str(where),
                           f"task {task['name']!r} is listed twice (first as tasks[{seen[task['name']]}])"))
        seen.setdefault(task["name"], i)
        kwargs = (task.get("dataset") or {}).get("kwargs") if isinstance(task.get("dataset"), dict) else None
        revision = kwargs.get("revision") if isinstance(kwargs, dict) else None
        if revision is not None and (not isinstance(revision, str) or not revision.strip()):
            where = ("tasks", i, "dataset", "kwargs", "revision")
            errors.append((line_of(root, where), path_str(where),
                           f"expected a string (a commit sha, tag or branch), got {revision!r}; quote it: "
                           f"revision: \"{revision}\""))
    include = data.get("include_path")
    if isinstance(include, str) and include and not (path.parent / include).is_dir():
        errors.append((line_of(root, ("include_path",)), "include_path",
                       f"directory {include!r} not found (relative to the suite file's folder {Path(os.path.abspath(path.parent))})"))
    return errors


def _build(doc: dict, path: Path, root: yaml.Node | None = None) -> Suite:
    # Lexical paths: a symlink in the checkout must not choose which file is the baseline or the
    # task folder (a pull request controls the checkout's links).
    base = Path(os.path.abspath(path.parent))
    tasks = [
        TaskSpec(
            name=t["name"],
            num_fewshot=None if t["num_fewshot"] is None else int(t["num_fewshot"]),
            limit=_limit(t["limit"]),
            gen_kwargs=t["gen_kwargs"],
            repeats=None if t["repeats"] is None else int(t["repeats"]),
            cluster=t["cluster"],
            subtasks=t["subtasks"],
            metrics=list(t["metrics"] or []),
            dataset=_dataset(t["dataset"]),
            where=f"{path}:{line_of(root, ('tasks', i, 'name'))}: tasks[{i}].name",
        )
        for i, t in enumerate(doc["tasks"])
    ]
    return Suite(
        name=doc["name"],
        path=path,
        lm_eval_version=doc["lm_eval_version"],
        include_path=None if doc["include_path"] is None else Path(os.path.normpath(base / doc["include_path"])),
        baseline_path=Path(os.path.normpath(base / doc["baseline"])),
        model=doc["model"],
        seeds=doc["seeds"],
        policy=_policy(doc, path, root),
        tasks=tasks,
        hash=suite_hash(doc),
        hashed=hashed_document(doc),
    )


def _dataset(value: dict | None) -> dict | None:
    """The task's dataset override as written: local data files stay relative to the suite's
    folder (resolved when the documents are read, ``run/taskdata.py``), so what a run records
    in results.json and its manifest is the same in every checkout and temporary folder."""
    if value is None:
        return None
    return {"path": value["path"], "name": value.get("name"), "kwargs": dict(value.get("kwargs") or {})}


def local_data_files(data_files: Any) -> list[str]:
    """The local paths in a ``data_files`` value (a string, a list, or a split -> either mapping)."""
    found: list[str] = []
    map_data_files(data_files, lambda p: found.append(p) or p)
    return found


def map_data_files(value: Any, fn: Any) -> Any:
    if isinstance(value, str):
        return value if "://" in value else fn(value)
    if isinstance(value, list):
        return [map_data_files(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: map_data_files(v, fn) for k, v in value.items()}
    return value


def _limit(value: Any) -> int | float | None:
    if value is None:
        return None
    # 5.0 is an integer to JSON Schema; keep lm-eval's meaning (>= 1 is a count).
    return int(value) if float(value) >= 1 else float(value)


def _policy(doc: dict, path: Path, root: yaml.Node | None = None) -> Policy:
    """Task metric rules first (first match wins), each listing task closed by an inform rule."""

    def where(*at: Any) -> str:  # "suite.yaml:14: tasks[0].metrics[0].margin", for messages
        return f"{path}:{line_of(root, at)}: {path_str(at)}"

    rules: list[Rule] = []
    for i, t in enumerate(doc["tasks"]):
        if not t["metrics"]:
            continue
        for j, m in enumerate(t["metrics"]):
            rules.append(Rule(task=t["name"], filter=m["filter"], metric=m["metric"],
                              margin=None if m["margin"] is None else float(m["margin"]),
                              gate=bool(m["gate"]), where=where("tasks", i, "metrics", j, "margin")))
        rules.append(Rule(task=t["name"], gate=False))
    p = doc["policy"]
    for i, r in enumerate(p["rules"]):
        rules.append(Rule(task=r["task"], filter=r["filter"], metric=r["metric"],
                          margin=None if r["margin"] is None else float(r["margin"]),
                          gate=bool(r["gate"]), where=where("policy", "rules", i, "margin")))
    policy = Policy(alpha=float(p["alpha"]), correction=p["correction"], group_share=float(p["group_share"]),
                    margin=float(p["margin"]),
                    resamples=int(p["resamples"]), rules=rules, rounding=float(p["rounding"]),
                    test=p["test"], margin_where=where("policy", "margin"),
                    sequential_looks=(p["sequential"] or {}).get("looks"), items=p["items"],
                    info_subtasks=frozenset(t["name"] for t in doc["tasks"] if t.get("subtasks") == "info"))
    policy.validate(f"{path}: policy")
    key = node_at(root, ("policy", "group_share"))[0]
    policy.note_ignored_share(getattr(key, "value", None) == "group_share", f"{path}: policy")
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
            out.append((line_of(root, (*where, key), key_line=True), path_str((*where, key)),
                        f"unknown key{tip}"))
        return out
    if v == "required":
        missing = [k for k in err.validator_value if k not in inst]
        return [(line_of(root, where), path_str(where), f"missing required key {k!r}") for k in missing]
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
    return [(line_of(root, where), path_str(where), msg)]


def _duplicate_keys(root: yaml.Node | None, where: tuple = ()) -> list[tuple[int, str, str]]:
    """YAML silently keeps the last of two equal keys; a suite is too important for that."""
    out: list[tuple[int, str, str]] = []
    if isinstance(root, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in root.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else str(key)
            if name in seen:
                out.append((key.start_mark.line + 1, path_str((*where, name)), "duplicate key"))
            seen.add(name)
            out.extend(_duplicate_keys(value, (*where, name)))
    elif isinstance(root, yaml.SequenceNode):
        for i, item in enumerate(root.value):
            out.extend(_duplicate_keys(item, (*where, i)))
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
