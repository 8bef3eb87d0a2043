"""More hostile inputs (issue #10, items 7, 10, 12, 13) through the real CLI: exit 2 (or the
right verdict), one stderr line naming the file or flag, no traceback, bounded time and
memory, nothing written."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gatekeeper.errors import GateError
from gatekeeper.results.layout import find_results_file
from gatekeeper.suite.suite import load_policy, load_suite, load_suite_text

ROOT = Path(__file__).resolve().parent.parent
DEMO_SUITE = ROOT / "examples" / "gatekeeper.yaml"
DEMO_BASELINE = ROOT / "examples" / ".gatekeeper" / "baselines" / "demo.json.gz"
ENV = dict(os.environ, PYTHONPATH=str(ROOT), TQDM_DISABLE="1")


def _cli(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gatekeeper", *map(str, args)], capture_output=True,
                          text=True, env=ENV, timeout=timeout, cwd=ROOT)


def _refused(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:], proc.stdout[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# ------------------------------------------------------------------ 7: repeats are checked too


def _copy_run(run_dir: Path, dest: Path, edit: Callable[[dict], None]) -> Path:
    """A copy of a run's model folder with its results file edited."""
    results, _ = find_results_file(run_dir)
    shutil.copytree(results.parent, dest)
    target = dest / results.name
    data = json.loads(target.read_text(encoding="utf-8"))
    edit(data)
    target.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return dest


def _other_version(data: dict) -> None:
    data["lm_eval_version"] = "0.4.12"


def _five_shot(data: dict) -> None:
    data["n-shot"]["demo_arith_mc"] = 5


@pytest.mark.lmeval
@pytest.mark.parametrize("with_suite", [True, False], ids=["suite", "plain"])
@pytest.mark.parametrize("repeat", ["other_checkpoint", "other_lm_eval", "five_shot"])
def test_a_repeat_that_is_not_the_same_measurement_is_refused(
    repeat: str, with_suite: bool, demo_run: Callable[[str], Path], tmp_path: Path
) -> None:
    harmless = demo_run("harmless")
    other, needle = {
        "other_checkpoint": (lambda: demo_run("base"), "model examples/checkpoints/harmless in the first run, "
                                                       "examples/checkpoints/base in this one"),
        "other_lm_eval": (lambda: _copy_run(harmless, tmp_path / "v", _other_version),
                          "lm-eval version 0.4.13 in the first run, 0.4.12 in this one"),
        "five_shot": (lambda: _copy_run(harmless, tmp_path / "k", _five_shot), "num_fewshot"),
    }[repeat]
    repeat_dir = other()
    report = tmp_path / "report.json"
    policy = ("--suite", DEMO_SUITE) if with_suite else ()
    proc = _cli("compare", DEMO_BASELINE if with_suite else harmless, harmless, *policy,
                "--also-candidate", repeat_dir, "--json", report)
    line = _refused(proc, "not a repeat of", needle, "--also-candidate")
    assert str(repeat_dir) in line
    assert not report.exists()


@pytest.mark.lmeval
def test_a_repeat_of_the_baseline_side_is_checked_too(demo_run: Callable[[str], Path], tmp_path: Path) -> None:
    base, harmless = demo_run("base"), demo_run("harmless")
    proc = _cli("compare", base, harmless, "--also-baseline", harmless)
    _refused(proc, "not a repeat of", "--also-baseline", "model files differ (sha256): model.safetensors")


@pytest.mark.lmeval
def test_a_true_repeat_is_still_averaged(demo_run: Callable[[str], Path], tmp_path: Path) -> None:
    harmless = demo_run("harmless")
    again = _copy_run(harmless, tmp_path / "again", lambda data: None)
    report = tmp_path / "report.json"
    proc = _cli("compare", DEMO_BASELINE, harmless, "--suite", DEMO_SUITE, "--also-candidate", again,
                "--json", report)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "averaged 2 runs per item" in report.read_text()


# ------------------------------------------------------------------ 10: YAML alias bombs, nesting


def _billion_laughs(levels: int = 9) -> str:
    """The classic alias bomb: 9 levels of 9 aliases each, 9^9 (387 million) strings."""
    lines = ['name: demo', 'lm_eval_version: "0.4.13"', 'tasks: [{name: demo_mc}]',
             'a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    lines.append(f"policy: {{rules: *a{levels - 1}}}")
    return "\n".join(lines) + "\n"


def _deep(depth: int = 100_000) -> str:
    return 'name: demo\nlm_eval_version: "0.4.13"\ntasks: [{name: demo_mc}]\nx: ' + "[" * depth + "]" * depth + "\n"


@pytest.mark.parametrize("text, needle, line", [
    (_billion_laughs(), "more than 100000 values once its aliases", 9),  # 9^6 at a5
    (_deep(), "nested more than 64 levels deep", 4),
    ("name: &n [*n]\n", "refers to a node that contains it", 1),
], ids=["billion_laughs", "nested_100k", "recursive"])
def test_yaml_bombs_are_refused_in_milliseconds(text: str, needle: str, line: int, tmp_path: Path) -> None:
    if "lol" in text:
        assert len(text.encode()) < 700  # the 684-byte bomb of the issue, give or take
    path = tmp_path / "gatekeeper.yaml"
    path.write_text(text)
    for load in (load_suite, load_policy):
        start = time.perf_counter()
        with pytest.raises(GateError) as err:
            load(path)
        assert time.perf_counter() - start < 1.0  # was over 180 s for the bomb
        assert str(err.value) == str(err.value).splitlines()[0]
        assert str(err.value).startswith(f"{path}:{line}: ") and needle in str(err.value), str(err.value)


@pytest.mark.parametrize("form", ["flow_list", "flow_map", "block_list"])
def test_deep_nesting_in_any_form_is_refused_in_milliseconds(form: str, tmp_path: Path) -> None:
    text = {"flow_list": "x: " + "[" * 100_000,  # unclosed: refused before the end is read
            "flow_map": "x: " + "{a: " * 40_000 + "}" * 40_000,
            "block_list": "x:\n" + "- " * 100_000 + "1\n"}[form]
    path = tmp_path / "gatekeeper.yaml"
    path.write_text(text)
    start = time.perf_counter()
    with pytest.raises(GateError, match=r"^" + re.escape(str(path)) + r":\d+: nested more than 64 levels deep$"):
        load_suite(path)
    assert time.perf_counter() - start < 0.2


def test_an_oversized_suite_or_policy_file_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "gatekeeper.yaml"
    path.write_text(DEMO_SUITE.read_text() + "# " + "x" * (300 << 10) + "\n")
    for load in (load_suite, load_policy):
        with pytest.raises(GateError, match=r"^" + re.escape(str(path)) + r": larger than 256 KiB"):
            load(path)


def test_a_policy_file_bomb_is_one_line_from_the_cli(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(_billion_laughs().replace("tasks: [{name: demo_mc}]\n", ""))
    report = tmp_path / "r.json"
    start = time.monotonic()
    proc = _cli("compare", DEMO_BASELINE, DEMO_BASELINE, "--policy", policy, "--json", report, timeout=30)
    assert time.monotonic() - start < 20  # the interpreter start dominates
    _refused(proc, f"{policy}:", "aliases")
    assert not report.exists()


def test_ordinary_anchors_still_work() -> None:
    text = DEMO_SUITE.read_text().replace("policy:\n", "x-margin: &m 0.05\npolicy:\n", 1)
    assert "x-margin" in text  # refused as an unknown key, not as a bomb
    with pytest.raises(GateError, match=r"x-margin: unknown key"):
        load_suite_text(text, DEMO_SUITE)
    small = DEMO_SUITE.read_text().replace("margin: 0.02}     #", "margin: &m 0.02}     #", 1)
    small = small.replace("{metric: exact_match, filter: strict-match, margin: 0.02}",
                          "{metric: exact_match, filter: strict-match, margin: *m}")
    assert "*m" in small
    assert load_suite_text(small, DEMO_SUITE).hash == load_suite(DEMO_SUITE).hash


# ------------------------------------------------------------------ 13: policy bounds


@pytest.mark.parametrize("flags, needle", [
    (["--seed", "-1"], "argument --seed: must be an integer >= 0, got -1"),
    (["--alpha", "1e-300"], "argument --alpha: must be between 1e-06 and 0.5"),
    (["--alpha", "0.9"], "argument --alpha: must be between 1e-06 and 0.5"),
    (["--alpha", "nan"], "argument --alpha: must be between 1e-06 and 0.5"),
    (["--resamples", "2e8"], "argument --resamples: expected an integer, got '2e8'"),
    (["--resamples", "200000000"], "argument --resamples: must be between 100 and 1,000,000"),
])
def test_policy_flags_out_of_range_name_the_flag(flags: list[str], needle: str, tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    _refused(_cli("compare", DEMO_BASELINE, DEMO_BASELINE, *flags, "--json", report), needle)
    assert not report.exists()


@pytest.mark.parametrize("setting, needle", [
    # The suite schema's checks and messages, with the file and line (issue #58).
    ("resamples: 200000000", "policy.yaml:1: resamples: must be <= 1000000, got 200000000"),
    ("resamples: .inf", "policy.yaml:1: resamples: expected integer, got inf"),
    ("alpha: 1.0e-300", "policy.yaml:1: alpha: must be >= 1e-06, got 1e-300"),
    ("alpha: 0.7", "policy.yaml:1: alpha: must be <= 0.5, got 0.7"),
    ("rules:\n  - {metric: acc, gate: \"false\"}", "policy.yaml:2: rules[0].gate: expected true or false, got 'false'"),
    ("group_share: half", "policy.yaml:1: group_share: expected number, got 'half'"),
])
def test_policy_file_values_out_of_range_name_the_file(setting: str, needle: str, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(setting + "\n")
    _refused(_cli("compare", DEMO_BASELINE, DEMO_BASELINE, "--policy", policy), str(policy), needle)


@pytest.mark.parametrize("setting, needle", [
    ("resamples: 10000", ":20: policy.resamples: must be <= 1000000, got 20000000"),
    ("alpha: 0.05", ":17: policy.alpha: must be >= 1e-06, got 1e-300"),
])
def test_suite_policy_out_of_range_has_a_line(setting: str, needle: str, tmp_path: Path) -> None:
    text = DEMO_SUITE.read_text()
    assert setting in text
    bad = setting.replace("10000", "20000000").replace("0.05", "1.0e-300")
    path = tmp_path / "gatekeeper.yaml"
    shutil.copytree(DEMO_SUITE.parent / "tasks", tmp_path / "tasks")
    path.write_text(text.replace(setting, bad, 1))
    _refused(_cli("compare", DEMO_BASELINE, DEMO_BASELINE, "--suite", path), f"{path}{needle}")


# ------------------------------------------------------------------ 12: bounded memory

_MEASURE = (
    "import resource, subprocess, sys, time\n"
    "t = time.monotonic()\n"
    "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "wall = time.monotonic() - t\n"
    "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "sys.stdout.write(f'{p.returncode} {wall} {rss}\\n' + p.stdout + '\\0' + p.stderr)\n"
)

# The reader keeps where each line starts (run.sample_lines); the test passes the offsets of the
# lines it wrote, doc_id i at offsets[i].
_SNIPPETS = (
    "import sys\n"
    "import numpy as np\n"
    "from gatekeeper.model import Provenance, RunResults\n"
    "from gatekeeper.results.snippets import attach_snippets\n"
    "offsets = np.array([int(x) for x in sys.argv[3].split(',')])\n"
    "lines = {('big', 'none'): (np.arange(offsets.size), offsets)}\n"
    "run = RunResults(Provenance(source=sys.argv[1], configs={'big': {'output_type': 'generate_until'}}), {},\n"
    "                 sample_lines=lines)\n"
    "attach_snippets(run, {('big', 'none'): {int(x) for x in sys.argv[2].split(',')}})\n"
    "got = run.snippets.get(('big', 'none'), {})\n"
    "print(' '.join(f'{k}:{got[k].output}' for k in sorted(got)))\n"
)


def _measured(*cmd: str | Path) -> tuple[int, float, int, str, str]:
    """Exit code, wall seconds, peak RSS (MiB), stdout and stderr of ``cmd`` run in a wrapper
    process, so that the peak belongs to this one command."""
    proc = subprocess.run([sys.executable, "-c", _MEASURE, *map(str, cmd)], capture_output=True, text=True,
                          env=ENV, cwd=ROOT, timeout=300)
    first, _, rest = proc.stdout.partition("\n")
    code, wall, rss = first.split()
    out, _, err = rest.partition("\0")
    return int(code), float(wall), int(rss) // 1024, out, err


def _sample_line(doc_id: int, pad: int, *, canonical: bool = True) -> bytes:
    doc = {"text": "x" * pad}
    rest = {"doc": doc, "target": "t", "arguments": {"gen_args_0": {"arg_0": f"prompt {doc_id}", "arg_1": {}}},
            "resps": [["r"]], "filtered_resps": [f"out{doc_id}"], "filter": "none", "metrics": ["exact_match"]}
    obj = {"doc_id": doc_id, **rest} if canonical else {**rest, "doc_id": doc_id}
    return json.dumps(obj).encode() + b"\n"


@pytest.fixture
def big_run(tmp_path: Path) -> tuple[Path, Path]:
    results = tmp_path / "results_2026-12-01T00-00-00.000001.json"
    results.write_text("{}")
    return results, tmp_path / "samples_big_2026-12-01T00-00-00.000001.jsonl"


def _write_lines(path: Path, lines: list[bytes]) -> str:
    """Write the lines; their start offsets, comma-separated."""
    starts = np.cumsum([0] + [len(x) for x in lines[:-1]])
    path.write_bytes(b"".join(lines))
    return ",".join(map(str, starts.tolist()))


def test_snippets_seek_to_their_lines_of_a_large_samples_file(big_run: tuple[Path, Path]) -> None:
    results, samples = big_run
    # 3000 lines of 40 KB (120 MB), one more in another key order, and doc 3001 whose recorded
    # offset now holds another item (the file changed since it was read): left out.
    lines = [_sample_line(i, 40_000) for i in range(3000)] + [_sample_line(3000, 10, canonical=False)]
    offsets = _write_lines(samples, lines) + "," + offsets_of(lines, 5)
    assert samples.stat().st_size > 120e6
    code, wall, rss_mib, out, err = _measured(sys.executable, "-c", _SNIPPETS, results, "0,1500,2999,3000,3001,9999",
                                              offsets)
    assert code == 0, err
    assert out.split() == ["0:out0", "1500:out1500", "2999:out2999", "3000:out3000"]
    assert rss_mib < 90, rss_mib  # the interpreter is ~35 MiB; the whole file read would be >155
    assert wall < 20, wall


def offsets_of(lines: list[bytes], i: int) -> str:
    return str(sum(len(x) for x in lines[:i]))


def test_a_huge_samples_line_is_skipped_with_bounded_memory(big_run: tuple[Path, Path]) -> None:
    results, samples = big_run
    offsets = _write_lines(samples, [_sample_line(0, 100_000_000), _sample_line(1, 10)])  # 100 MB, then small
    code, wall, rss_mib, out, err = _measured(sys.executable, "-c", _SNIPPETS, results, "0,1", offsets)
    assert code == 0, err
    assert out.split() == ["1:out1"]  # the snippet of the 100 MB line is left out, never read whole
    assert rss_mib < 110, rss_mib  # at most one 16 MiB line held (was the 100 MB line, parsed: >300)


def test_an_oversized_results_json_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    big = tmp_path / "results_2026-12-01T00-00-00.000001.json"
    blob = "a" * (40 << 20)
    big.write_text('{"results": {}, "configs": {"x": {"description": "' + blob + '"}}, "versions": {}, '
                   '"n-samples": {}}')
    report = tmp_path / "r.json"
    code, wall, rss_mib, out, err = _measured(sys.executable, "-m", "gatekeeper", "compare", big, big,
                                              "--json", report)
    assert "Traceback" not in err and code == 2, err
    assert err.strip().count("\n") == 0 and f"{big}: larger than 32 MiB" in err, err
    assert rss_mib < 150, rss_mib  # 32 MiB read at most, never parsed
    assert not report.exists()
