"""Suite file: every error with line and path, defaults, canonical hash, policy rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from gatekeeper.errors import GateError
from gatekeeper.model import SeriesKey
from gatekeeper.suite.suite import load_policy, load_suite, suite_hash

GOOD = """\
name: demo
lm_eval_version: "0.4.13"
include_path: tasks
model:
  dtype: float32
  batch_size: 16
seeds: {random: 1234, numpy: 1234, torch: 1234, fewshot: 1234}
policy:
  alpha: 0.05
  correction: holm
  margin: 0.01
tasks:
  - name: arith_mc
    num_fewshot: 0
    cluster: topic
    metrics:
      - {metric: acc, filter: none, margin: 0.05}
      - {metric: acc_norm, gate: false}
  - name: arith_gen
    limit: 0.5
    gen_kwargs: {max_gen_toks: 8}
"""

# Same content: other key order, flow vs block style, comments, defaults spelled out.
REFORMATTED = """\
# the team's suite
tasks:
  - {name: arith_mc, num_fewshot: 0, limit: null, cluster: topic,
     metrics: [{metric: acc, filter: none, margin: 0.05}, {gate: false, metric: acc_norm}]}
  - name: arith_gen   # generation
    gen_kwargs:
      max_gen_toks: 8
    limit: 0.5
    repeats: null
seeds:
  fewshot: 1234
  torch: 1234
  numpy: 1234
  random: 1234
model: {batch_size: 16, dtype: float32, backend: hf}
lm_eval_version: '0.4.13'
policy: {margin: 0.01, correction: holm, alpha: 0.05}
name: demo
include_path: tasks
"""


def _write(tmp_path: Path, text: str, name: str = "gatekeeper.yaml") -> Path:
    (tmp_path / "tasks").mkdir(exist_ok=True)
    path = tmp_path / name
    path.write_text(text)
    return path


def test_good_suite_loads_with_defaults(tmp_path: Path) -> None:
    suite = load_suite(_write(tmp_path, GOOD))
    assert suite.name == "demo" and suite.lm_eval_version == "0.4.13"
    assert suite.include_path == (tmp_path / "tasks").resolve() and suite.include_path.is_absolute()
    assert suite.baseline_path == (tmp_path / ".gatekeeper/baselines/demo.json.gz").resolve()
    assert suite.model["dtype"] == "float32" and suite.model["device"] == "auto"
    assert suite.model["trust_remote_code"] is False
    assert [t.name for t in suite.tasks] == ["arith_mc", "arith_gen"]
    gen = suite.tasks[1]
    assert gen.limit == 0.5 and gen.gen_kwargs == {"max_gen_toks": 8} and gen.num_fewshot is None
    assert suite.cluster_keys() == {"arith_mc": "topic"}
    assert len(suite.hash) == 64


def test_policy_rules_from_task_metrics(tmp_path: Path) -> None:
    policy = load_suite(_write(tmp_path, GOOD)).policy
    assert (policy.alpha, policy.correction, policy.margin) == (0.05, "holm", 0.01)
    assert policy.lookup(SeriesKey("arith_mc", "none", "acc")) == (0.05, True)
    assert policy.lookup(SeriesKey("arith_mc", "none", "acc_norm")) == (0.01, False)
    # A task that lists metrics: the unlisted ones (and other filters) only inform.
    assert policy.lookup(SeriesKey("arith_mc", "none", "brier")) == (0.01, False)
    assert policy.lookup(SeriesKey("arith_mc", "other", "acc")) == (0.01, False)
    # A task without a metrics list gates everything at the default margin.
    assert policy.lookup(SeriesKey("arith_gen", "strict-match", "exact_match")) == (0.01, True)
    # policy.load_policy on a suite file gives the same policy.
    assert load_policy(tmp_path / "gatekeeper.yaml") == policy


def test_many_errors_reported_at_once_with_lines_and_paths(tmp_path: Path) -> None:
    text = """\
name: Demo Suite
lm_eval_version: 0.4
model:
  dtype: fp16
  batch_size: 0
policy:
  alpha: 1.5
  corection: bh
tasks:
  - name: arith_mc
    num_fewshot: 0
  - name: arith_gen
  - name: capitals_mc
    num_fewshot: five
    limit: -3
    metrics:
      - {filter: none}
  - nmae: synth_ppl
"""
    with pytest.raises(GateError) as err:
        load_suite(_write(tmp_path, text, "suite.yaml"))
    lines = str(err.value).splitlines()
    path = str(tmp_path / "suite.yaml")
    assert all(line.startswith(f"{path}:") for line in lines)
    expected = [
        ":1: name: expected a name of lowercase letters",
        ":2: lm_eval_version: expected a quoted version string",
        ":4: model.dtype: expected one of 'auto', 'float32', 'float16', 'bfloat16', got 'fp16'",
        ":5: model.batch_size: expected an integer >= 1 or \"auto\", got 0",
        ":7: policy.alpha: must be <= 0.5, got 1.5",
        ":8: policy.corection: unknown key; did you mean 'correction'?",
        ":14: tasks[2].num_fewshot: expected an integer >= 0 or null, got 'five'",
        ":15: tasks[2].limit: expected an integer >= 1, a fraction between 0 and 1, or null, got -3",
        ":17: tasks[2].metrics[0]: missing required key 'metric'",
        ":18: tasks[3]: missing required key 'name'",
        ":18: tasks[3].nmae: unknown key; did you mean 'name'?",
    ]
    assert len(lines) == len(expected), lines
    for line, want in zip(lines, expected, strict=True):
        assert line[len(path):].startswith(want), (line, want)


def test_semantic_errors(tmp_path: Path) -> None:
    text = """\
name: demo
lm_eval_version: "0.4.13"
include_path: no_such_dir
tasks:
  - name: arith_mc
  - name: arith_mc
    limit: 5
    limit: 6
"""
    with pytest.raises(GateError) as err:
        load_suite(_write(tmp_path, text))
    msg = str(err.value)
    assert ":3: include_path: directory 'no_such_dir' not found" in msg
    assert ":6: tasks[1].name: task 'arith_mc' is listed twice (first as tasks[0])" in msg
    assert ":8: tasks[1].limit: duplicate key" in msg


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("name: demo\ntasks: [a\n", r"gatekeeper\.yaml:3: not valid YAML"),
        ("", r"gatekeeper\.yaml: empty suite file"),
        ("- a\n- b\n", r"gatekeeper\.yaml:1: expected a mapping at the top level"),
        ("name: demo\nlm_eval_version: '0.4.13'\ntasks: []\n", r":3: tasks: must list at least 1 item"),
    ],
)
def test_bad_files(tmp_path: Path, text: str, pattern: str) -> None:
    with pytest.raises(GateError, match=pattern):
        load_suite(_write(tmp_path, text))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(GateError, match="nope.yaml: suite file not found"):
        load_suite(tmp_path / "nope.yaml")


def test_hash_is_stable_across_formatting(tmp_path: Path) -> None:
    a = load_suite(_write(tmp_path, GOOD, "a.yaml"))
    b = load_suite(_write(tmp_path, REFORMATTED, "b.yaml"))
    assert a.hash == b.hash
    assert a.policy == b.policy


def test_hash_changes_with_what_is_measured(tmp_path: Path) -> None:
    base = load_suite(_write(tmp_path, GOOD, "a.yaml")).hash
    for old, new in [
        ("num_fewshot: 0", "num_fewshot: 5"),
        ("limit: 0.5", "limit: 0.25"),
        ("max_gen_toks: 8", "max_gen_toks: 16"),
        ("dtype: float32", "dtype: bfloat16"),
        ("random: 1234", "random: 1"),
        ('"0.4.13"', '"0.4.14"'),
    ]:
        assert old in GOOD
        changed = load_suite(_write(tmp_path, GOOD.replace(old, new, 1), "c.yaml")).hash
        assert changed != base, (old, new)


def test_hash_ignores_gating_settings(tmp_path: Path) -> None:
    """Tuning margins or where the baseline lives must not invalidate a recorded baseline."""
    base = load_suite(_write(tmp_path, GOOD, "a.yaml")).hash
    for old, new in [
        ("margin: 0.01", "margin: 0.02"),
        ("alpha: 0.05", "alpha: 0.01"),
        ("margin: 0.05}", "margin: 0.1}"),
        ("cluster: topic", "cluster: other"),
        ("batch_size: 16", "batch_size: 4"),
        ("include_path: tasks", "include_path: tasks\nbaseline: b/demo.json.gz"),
    ]:
        assert old in GOOD
        assert load_suite(_write(tmp_path, GOOD.replace(old, new, 1), "c.yaml")).hash == base, (old, new)


def test_suite_hash_function_fills_defaults() -> None:
    minimal = {"name": "x", "lm_eval_version": "0.4.13", "tasks": [{"name": "t"}]}
    spelled = {**minimal, "seeds": {"random": 0}, "tasks": [{"name": "t", "num_fewshot": None}]}
    assert suite_hash(minimal) == suite_hash(spelled)


def test_policy_rounding_and_test_mode_defaults_and_values(tmp_path: Path) -> None:
    policy = load_suite(_write(tmp_path, GOOD)).policy
    assert (policy.rounding, policy.test) == (1e-5, "superiority")
    text = GOOD.replace("  margin: 0.01\n", "  margin: 0.01\n  rounding: 0.0\n  test: noninferiority\n")
    policy = load_suite(_write(tmp_path, text)).policy
    assert (policy.rounding, policy.test) == (0.0, "inferiority")  # the old spelling, renamed
    assert "deprecated" in policy.warnings[0] and "non-inferiority" in policy.warnings[0]
    # a plain policy file takes the same keys
    pol = tmp_path / "policy.yaml"
    pol.write_text("rounding: 2.0e-6\ntest: noninferiority\n")
    assert (load_policy(pol).rounding, load_policy(pol).test) == (2e-6, "inferiority")


@pytest.mark.parametrize(
    ("line", "pattern"),
    [
        ("  rounding: 0.05\n", r"gatekeeper\.yaml:\d+: policy\.rounding: .*0\.001"),
        ("  rounding: -1e-6\n", r"gatekeeper\.yaml:\d+: policy\.rounding: "),
        ("  test: equivalence\n", r"gatekeeper\.yaml:\d+: policy\.test: "),
        ("  rounding: 1e-5\n", r"policy\.rounding: expected a number .*\(1\.0e-5, not 1e-5"),
    ],
)
def test_policy_rounding_and_test_are_validated_with_lines(tmp_path: Path, line: str, pattern: str) -> None:
    """A rounding floor of 5% would snap real changes to "unchanged" (the gate opens on a typo):
    refused, with the line, like every suite error."""
    with pytest.raises(GateError, match=pattern) as err:
        load_suite(_write(tmp_path, GOOD.replace("  margin: 0.01\n", "  margin: 0.01\n" + line)))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("rounding: 0.01\n", r"policy\.yaml:1: rounding: must be <= 0\.001, got 0\.01"),
        ("rounding: .nan\n", r"policy\.yaml: rounding must be between 0 and 0\.001"),
        ("test: superior\n", r"policy\.yaml:1: test: expected one of 'superiority', .*got 'superior'"),
        ("rounding: 2e-6\n", r"policy\.yaml:1: rounding: expected a number .*written with a dot .*got .2e-6."),
        ("policy:\n  alpha: 0.05\nextra: 1\n", r"policy\.yaml:3: extra: unknown key in a policy file"),
    ],
)
def test_policy_file_rounding_and_test_errors_name_the_file(tmp_path: Path, text: str, pattern: str) -> None:
    pol = tmp_path / "policy.yaml"
    pol.write_text(text)
    with pytest.raises(GateError, match=pattern):
        load_policy(pol)
