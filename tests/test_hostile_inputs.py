"""Hostile but well-formed inputs through the real CLI: exit 2, one stderr line naming the file,
no traceback, bounded time and memory, nothing written.

Each case builds its input programmatically from a real lm-eval dummy run (results.json,
samples) or from the committed demo baseline (checksum recomputed, so only the new checks
stand between the edit and the verdict)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gatekeeper.baseline import format as baseline_format
from tests.lmeval_fixtures import *  # noqa: F403 - session fixtures
from tests.lmeval_fixtures import results_path, samples_path

ROOT = Path(__file__).resolve().parent.parent
DEMO_BASELINE = ROOT / "examples" / ".gatekeeper" / "baselines" / "demo.json.gz"
ENV = dict(os.environ, PYTHONPATH=str(ROOT), TQDM_DISABLE="1")


def _cli(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gatekeeper", *map(str, args)], capture_output=True,
                          text=True, env=ENV, timeout=timeout, cwd=ROOT)


def _assert_refused(proc: subprocess.CompletedProcess, path: Path | str, needle: str = "") -> str:
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:], proc.stdout[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert str(path) in lines[0], lines[0]
    assert needle in lines[0], lines[0]
    return lines[0]


# ------------------------------------------------------------------ results.json (candidate)

PLACEHOLDER = "__HOSTILE__"


def _set(path: list[Any], value: Any) -> Callable[[dict], None]:
    def edit(data: dict) -> None:
        node = data
        for key in path[:-1]:
            node = node[key]
        if value is _DELETE:
            del node[path[-1]]
        else:
            node[path[-1]] = value
    return edit


_DELETE = object()
_BIG = "1" + "0" * 400  # 10^400: valid JSON, beyond float range
_HUGE = "1" + "0" * 5000  # a 5001-digit integer: Python's json refuses to convert it

RESULTS_CASES: dict[str, tuple[list[Any], Any, str]] = {
    # name: (path into results.json, value (PLACEHOLDER=raw JSON below), text in the message)
    "date_1e20": (["date"], 1e20, "'date'"),
    "date_inf": (["date"], float("inf"), "'date'"),
    "date_nan": (["date"], float("nan"), "'date'"),
    "date_5001_digits": (["date"], PLACEHOLDER + _HUGE, "too many digits"),
    "n_shot_list": (["n-shot"], [0, 1], "'n-shot'"),
    "n_shot_value_string": (["n-shot", "arith_mc"], "0", "n-shot[arith_mc]"),
    "task_hashes_string": (["task_hashes"], "abc", "'task_hashes'"),
    "task_hash_one_char": (["task_hashes", "arith_mc"], "a", "task_hashes[arith_mc]"),
    "task_hash_empty": (["task_hashes", "arith_mc"], "", "task_hashes[arith_mc]"),
    "higher_is_better_string": (["higher_is_better"], "true", "'higher_is_better'"),
    "higher_is_better_false_string": (["higher_is_better", "arith_mc", "acc"], "false", "higher_is_better[arith_mc]"),
    "n_samples_string": (["n-samples"], "225", "'n-samples'"),
    "n_samples_effective_float": (["n-samples", "arith_mc", "effective"], 3.5, "n-samples[arith_mc]"),
    "groups_list": (["groups"], ["synth_mc"], "'groups'"),
    "group_subtasks_string": (["group_subtasks", "synth_mc"], "arith_mc", "group_subtasks[synth_mc]"),
    "configs_entry_list": (["configs", "arith_mc"], [], "configs[arith_mc]"),
    "metric_10e400_int": (["results", "arith_mc", "acc,none"], PLACEHOLDER + _BIG, "acc,none"),
    "metric_1e400_float": (["results", "arith_mc", "acc,none"], PLACEHOLDER + "1e400", "acc,none"),
    "metric_inf": (["results", "arith_mc", "acc,none"], float("inf"), "acc,none"),
    "group_metric_10e400": (["groups", "synth_mc", "acc,none"], PLACEHOLDER + _BIG, "acc,none"),
    "lm_eval_version_number": (["lm_eval_version"], 0.4, "'lm_eval_version'"),
    "batch_size_list": (["config", "batch_size"], [16], "config.batch_size"),
    "model_args_number": (["config", "model_args"], 5, "config.model_args"),
    "limit_string": (["config", "limit"], "all", "config.limit"),
    "seed_float": (["config", "random_seed"], 1.5, "config.random_seed"),
    "config_list": (["config"], [], "'config'"),
}


def _write_hostile_results(out: Path, path: list[Any], value: Any) -> Path:
    target = results_path(out)
    data = json.loads(target.read_text(encoding="utf-8"))
    raw = value[len(PLACEHOLDER):] if isinstance(value, str) and value.startswith(PLACEHOLDER) else None
    _set(path, PLACEHOLDER if raw is not None else value)(data)
    text = json.dumps(data, indent=2)
    if raw is not None:
        text = text.replace(json.dumps(PLACEHOLDER), raw)
    target.write_text(text, encoding="utf-8")
    return target


@pytest.mark.parametrize("name", sorted(RESULTS_CASES))
def test_hostile_results_json(name: str, lmeval_runs: dict[str, Path], good_copy: Path, tmp_path: Path) -> None:
    path, value, needle = RESULTS_CASES[name]
    target = _write_hostile_results(good_copy, path, value)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    proc = _cli("compare", lmeval_runs["good"], good_copy, "--json", tmp_path / "report.json")
    _assert_refused(proc, target, needle)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no report written


def test_candidate_without_lm_eval_version_is_refused(lmeval_runs: dict[str, Path], good_copy: Path) -> None:
    _write_hostile_results(good_copy, ["lm_eval_version"], _DELETE)
    proc = _cli("compare", lmeval_runs["good"], good_copy)
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 2, proc.stderr
    assert "lm-eval version 0.4.13 in baseline, unset in candidate" in proc.stderr


# ------------------------------------------------------------------ samples (candidate)


def _edit_line(out: Path, task: str, index: int, fn: Callable[[str], str]) -> Path:
    path = samples_path(out, task)
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[index] = fn(lines[index])
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _with(**changes: Any) -> Callable[[str], str]:
    def fn(line: str) -> str:
        obj = json.loads(line)
        obj.update(changes)
        return json.dumps(obj)
    return fn


def _deep(line: str) -> str:
    obj = json.loads(line)
    obj["acc"] = PLACEHOLDER
    return json.dumps(obj).replace(json.dumps(PLACEHOLDER), "[" * 200_000 + "]" * 200_000)


SAMPLES_CASES: dict[str, tuple[Callable[[str], str], str]] = {
    "doc_id_10e30": (_with(doc_id=10**30), "doc_id"),
    "doc_id_3_5": (_with(doc_id=3.5), "doc_id"),
    "doc_id_negative": (_with(doc_id=-1), "doc_id"),
    "array_200k_deep": (_deep, "nested too deeply"),
    "doc_hash_one_char": (_with(doc_hash="a"), "doc_hash"),
    "prompt_hash_not_hex": (_with(prompt_hash="z" * 64), "prompt_hash"),
}


@pytest.mark.parametrize("name", sorted(SAMPLES_CASES))
def test_hostile_samples(name: str, lmeval_runs: dict[str, Path], good_copy: Path) -> None:
    fn, needle = SAMPLES_CASES[name]
    path = _edit_line(good_copy, "arith_mc", 5, fn)
    _assert_refused(_cli("compare", lmeval_runs["good"], good_copy), path, needle)


def test_items_outside_the_metric_range_cannot_cancel_out(lmeval_runs: dict[str, Path], good_copy: Path) -> None:
    """+1e6 on one item and -1e6 on another keep the mean (and results.json) exact."""
    path = samples_path(good_copy, "arith_mc")
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    lines[3]["acc"] += 1e6
    lines[4]["acc"] -= 1e6
    path.write_text("".join(json.dumps(obj) + "\n" for obj in lines), encoding="utf-8")
    _assert_refused(_cli("compare", lmeval_runs["good"], good_copy), path, "outside [0, 1]")


def test_reported_inf_never_matches() -> None:
    """The tolerance check itself: inf was within a relative tolerance of every value."""
    from gatekeeper.results.reader import close_enough as _close

    assert not _close(0.5, float("inf")) and not _close(float("inf"), 0.5)
    assert _close(float("inf"), float("inf"))


def test_samples_file_given_as_a_run_is_named(lmeval_runs: dict[str, Path]) -> None:
    path = samples_path(lmeval_runs["good"], "arith_mc")
    _assert_refused(_cli("compare", lmeval_runs["good"], path), path, "samples file")


def test_samples_file_under_another_name_is_named(lmeval_runs: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "results_2026-01-01T00-00-00.json"
    shutil.copy(samples_path(lmeval_runs["good"], "arith_mc"), path)
    _assert_refused(_cli("compare", lmeval_runs["good"], path), path, "samples file")


# ------------------------------------------------------------------ baselines (checksum recomputed)


def _demo_doc() -> dict:
    return json.loads(gzip.decompress(DEMO_BASELINE.read_bytes()))


def _write_baseline(path: Path, doc: dict, raw: str | None = None) -> Path:
    """A baseline whose checksum matches its (edited) content; ``raw`` replaces PLACEHOLDER."""
    body = {k: v for k, v in doc.items() if k != "checksum"}
    doc = dict(body, checksum=baseline_format._checksum(body))
    text = baseline_format._dump(doc)
    if raw is not None:
        text = text.replace(json.dumps(PLACEHOLDER), raw)
    path.write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))
    return path


def _acc_series(doc: dict) -> dict:
    return next(s for s in doc["series"] if s["metric"] == "acc")


def _edit_acc(**changes: Any) -> Callable[[dict], None]:
    return lambda doc: _acc_series(doc).update(changes)


def _values_zero(doc: dict) -> None:
    s = _acc_series(doc)
    s["values"] = [0.0] * len(s["values"])  # reported left as is: acc 0 would make any candidate "improved"


def _cancel(doc: dict) -> None:
    s = _acc_series(doc)
    s["values"][0] += 1e6
    s["values"][1] -= 1e6


def _hash(value: str) -> Callable[[dict], None]:
    def edit(doc: dict) -> None:
        _acc_series(doc)["hashes"][0][1] = value
    return edit


BASELINE_CASES: dict[str, tuple[Callable[[dict], None], str]] = {
    "provenance_null": (lambda d: d.update(provenance=None), "provenance"),
    "provenance_list": (lambda d: d.update(provenance=[]), "provenance"),
    "doc_id_3_5": (lambda d: _acc_series(d)["doc_ids"].__setitem__(0, 3.5), "doc_ids"),
    "doc_id_10e30": (lambda d: _acc_series(d)["doc_ids"].__setitem__(0, 10**30), "doc_ids"),
    "doc_id_duplicate": (lambda d: _acc_series(d)["doc_ids"].__setitem__(1, _acc_series(d)["doc_ids"][0]),
                         "doc_ids"),
    "higher_is_better_false_string": (_edit_acc(higher_is_better="false"), "higher_is_better"),
    "hash_one_char": (_hash("a"), "hashes"),
    "hash_empty": (_hash(""), "hashes"),
    "values_zeroed_reported_kept": (_values_zero, "per-item values give 0.0"),
    "values_cancel_out": (_cancel, "outside [0, 1]"),
    "reported_inf": (_edit_acc(reported=float("inf")), "reported"),
    "values_short": (lambda d: _acc_series(d)["values"].pop(), "values"),
    "kind_unknown": (_edit_acc(kind="median"), "kind"),
    "series_not_list": (lambda d: d.update(series={}), "series"),
    "series_item_null": (lambda d: d["series"].__setitem__(0, None), "series[0]"),
    "groups_list": (lambda d: d.update(groups=[]), "groups"),
    "task_hash_empty": (lambda d: d["provenance"]["task_hashes"].update(demo_arith_mc=""), "task_hashes"),
    "date_1e20": (lambda d: d["provenance"].update(date=1e20), "provenance.date"),
    "n_shot_list": (lambda d: d["provenance"].update(n_shot=[0]), "provenance.n_shot"),
    "seed_string": (lambda d: d["provenance"]["seeds"].update(random_seed="1234"), "seeds"),
    "margins_list": (lambda d: d.update(multiple_choice_margins=[]), "multiple_choice_margins"),
    "margins_other_task": (lambda d: d.update(multiple_choice_margins={"nope": {"doc_ids": [0], "margins": [1.0]}}),
                           "multiple_choice_margins[nope]"),
    "margins_text": (lambda d: d.update(multiple_choice_margins={"demo_capitals_mc": {"doc_ids": [0, 1], "margins": [1.0, "x"]}}),
                     "multiple_choice_margins[demo_capitals_mc].margins"),
    "margins_short": (lambda d: d.update(multiple_choice_margins={"demo_capitals_mc": {"doc_ids": [0, 1], "margins": [1.0]}}),
                      "multiple_choice_margins[demo_capitals_mc].margins"),
}


@pytest.mark.parametrize("name", sorted(BASELINE_CASES))
def test_hostile_baseline(name: str, lmeval_runs: dict[str, Path], tmp_path: Path) -> None:
    edit, needle = BASELINE_CASES[name]
    doc = _demo_doc()
    edit(doc)
    path = _write_baseline(tmp_path / "demo.json.gz", doc)
    _assert_refused(_cli("compare", path, lmeval_runs["good"]), path, needle)


@pytest.mark.parametrize("raw,needle", [(_HUGE, "too many digits"), ("[" * 200_000 + "]" * 200_000, "nested")])
def test_hostile_baseline_json(raw: str, needle: str, lmeval_runs: dict[str, Path], tmp_path: Path) -> None:
    doc = _demo_doc()
    doc["provenance"]["date"] = PLACEHOLDER
    path = _write_baseline(tmp_path / "demo.json.gz", doc, raw=raw)
    _assert_refused(_cli("compare", path, lmeval_runs["good"]), path, needle)


def test_baseline_show_refuses_hostile_baseline(tmp_path: Path) -> None:
    doc = _demo_doc()
    doc["provenance"] = None
    path = _write_baseline(tmp_path / "demo.json.gz", doc)
    _assert_refused(_cli("baseline", "show", path), path, "provenance")


# ------------------------------------------------------------------ gzip bomb


def _bomb(path: Path, inflated_mib: int) -> Path:
    """A gzip file that starts like a baseline and inflates to ``inflated_mib`` MiB: one member
    of 64 MiB of spaces (~64 KiB compressed), repeated (gzip readers join members)."""
    head = gzip.compress(b'{"checksum":"sha256:0","created":"x","format":"gatekeeper-baseline","pad":"', mtime=0)
    co = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b" " * (1 << 20)
    member = b"".join(co.compress(chunk) for _ in range(64)) + co.flush()
    with path.open("wb") as fh:
        fh.write(head)
        for _ in range(inflated_mib // 64):
            fh.write(member)
    return path


_MEASURE = (
    "import resource, subprocess, sys, time\n"
    "t = time.monotonic()\n"
    "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "wall = time.monotonic() - t\n"
    "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "sys.stdout.write(f'{p.returncode} {wall} {rss}\\n' + p.stderr)\n"
)


def _measured(*args: str | Path) -> tuple[int, float, int, str]:
    """Exit code, wall seconds, peak RSS (KiB) and stderr of the CLI, in a wrapper process so
    that the peak belongs to this one command (not to lm-eval runs made earlier)."""
    cmd = [sys.executable, "-c", _MEASURE, sys.executable, "-m", "gatekeeper", *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=300)
    first, _, stderr = proc.stdout.partition("\n")
    code, wall, rss = first.split()
    return int(code), float(wall), int(rss), stderr


@pytest.mark.parametrize("command", ["compare", "show"])
@pytest.mark.parametrize("inflated_mib", [1024, 4096])
def test_gzip_bomb_is_refused_fast_with_bounded_memory(
    command: str, inflated_mib: int, lmeval_runs: dict[str, Path], tmp_path: Path
) -> None:
    path = _bomb(tmp_path / "demo.json.gz", inflated_mib)
    assert path.stat().st_size < inflated_mib * 1100  # about 1000:1
    args = ("compare", path, lmeval_runs["good"]) if command == "compare" else ("baseline", "show", path)
    code, wall, rss_kib, stderr = _measured(*args)
    assert "Traceback" not in stderr and code == 2, stderr
    assert stderr.strip().count("\n") == 0 and str(path) in stderr and "gzip bomb" in stderr, stderr
    assert wall < 15, wall  # seconds, on a busy 2-core machine (was 31 s and 3.2 GB)
    assert rss_kib < 600 * 1024, rss_kib  # the cap is 256 MiB inflated at most


def test_hostile_manifest_beside_the_run(lmeval_runs: dict[str, Path], good_copy: Path) -> None:
    manifest = results_path(good_copy).parent / "gatekeeper-manifest.json"
    manifest.write_text(json.dumps({"suite_hash": 5, "model_files": []}), encoding="utf-8")
    _assert_refused(_cli("compare", lmeval_runs["good"], good_copy), manifest, "suite_hash")


def test_hostile_manifest_in_a_baseline(lmeval_runs: dict[str, Path], tmp_path: Path) -> None:
    doc = _demo_doc()
    doc["provenance"]["manifest"]["model_files"] = ["model.safetensors"]
    path = _write_baseline(tmp_path / "demo.json.gz", doc)
    _assert_refused(_cli("compare", path, lmeval_runs["good"]), path, "model_files")


def test_markdown_to_stdout_is_written_through(lmeval_runs: dict[str, Path], tmp_path: Path) -> None:
    """`--markdown /dev/stdout` (here a link to /proc/self/fd/1 in tmp_path, so that a broken
    build cannot replace this machine's /dev/stdout): the report appears on stdout, the link stays."""
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    proc = _cli("compare", lmeval_runs["good"], lmeval_runs["good"], "--markdown", link)
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and "gatekeeper" in proc.stdout.lower() and "|" in proc.stdout


def test_deep_array_in_a_field_the_gate_does_not_read_is_named(lmeval_runs: dict[str, Path], tmp_path: Path) -> None:
    """Every line is validated in full, the prompts and outputs too: JSON nested 200,000 deep
    in `resps` (no lm-eval writes that) is refused naming its line, not half-read."""
    cand = tmp_path / "bad"
    shutil.copytree(lmeval_runs["bad"], cand)
    path = samples_path(cand, "arith_mc")
    lines = path.read_text(encoding="utf-8").splitlines()
    obj = json.loads(lines[3])
    obj["resps"] = PLACEHOLDER
    lines[3] = json.dumps(obj).replace(json.dumps(PLACEHOLDER), "[" * 200_000 + "]" * 200_000)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    proc = _cli("compare", lmeval_runs["good"], cand, "--markdown", tmp_path / "report.md")
    _assert_refused(proc, f"{path} line 4", "not usable JSON (nested too deeply)")
