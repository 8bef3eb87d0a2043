"""One suite over N runners, one verdict: ``run --shard K/N``, ``merge``, ``gate --run``.

The proof: the demo suite evaluated as three real shards and merged is item for item the
unsharded run (the session's ``demo_run("base")``), its results.json is the same file apart
from dates, and ``gate --run`` gives the same verdict against the stored baseline.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gatekeeper.errors import GateError
from gatekeeper.run.shard import Shard, parse_shard, split
from tests.demo_runs import (
    DEMO_SUITE,
    OFFLINE_ENV,
    ROOT,
    assert_same_items,
    checkpoint_arg,
    lm_eval_installed,
)

needs_lm_eval = pytest.mark.skipif(not lm_eval_installed(), reason="lm-eval is not installed")
# Fields of results.json that say when, not what.
_WHEN = ("date", "total_evaluation_time_seconds")


def _cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gatekeeper", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=dict(os.environ, **OFFLINE_ENV))


def _results(run: Path) -> dict[str, Any]:
    (path,) = Path(run).rglob("results_*.json")
    return json.loads(path.read_text(encoding="utf-8"))


def _samples(run: Path) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for path in Path(run).rglob("samples_*.jsonl"):
        task = path.name[len("samples_"):].rsplit("_", 1)[0]
        out[task] = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return out


def _run_shard(suite: Path | str, model: str, out: Path, shard: str) -> Path:
    proc = _cli("run", "--suite", str(suite), "--model", model, "--out", str(out), "--shard", shard)
    assert proc.returncode == 0, proc.stderr
    return out


# ----------------------------------------------------------------------------- the split (pure)


def test_parse_shard_accepts_k_of_n_and_refuses_the_rest() -> None:
    assert parse_shard("2/3") == Shard(2, 3) and str(parse_shard(" 1 / 1 ")) == "1/1"
    for bad in ("0/3", "4/3", "3", "a/b", "1/0", "-1/2", ""):
        with pytest.raises(GateError, match=r"^--shard .*K"):
            parse_shard(bad)


def test_split_is_disjoint_complete_balanced_and_deterministic() -> None:
    sizes = {"mmlu_pro": 12032, "small": 17, "mid": 225, "other": 101}
    for n in (1, 2, 3, 7, 17):
        shards = split(sizes, n)
        assert shards == split(dict(reversed(list(sizes.items()))), n)  # not the load order
        for task, size in sizes.items():
            docs = [d for s in shards for d in range(*s[task])]
            assert docs == list(range(size)), (task, n)  # contiguous, disjoint, complete, in order
            assert all(s[task][1] > s[task][0] for s in shards)  # lm-eval: empty = whole task
        totals = [sum(e - b for b, e in s.values()) for s in shards]
        assert max(totals) - min(totals) <= 1, (n, totals)


def test_split_spreads_a_large_task_over_every_shard() -> None:
    shards = split({"mmlu_pro": 12032, "tiny": 8}, 8)
    assert [s["mmlu_pro"][1] - s["mmlu_pro"][0] for s in shards] == [1504] * 8


def test_split_refuses_more_shards_than_a_task_has_items() -> None:
    with pytest.raises(GateError, match=r"^--shard: task tiny has 3 item\(s\), fewer than the 4 shards"):
        split({"big": 1000, "tiny": 3}, 4)


# ----------------------------------------------------------------------------- real shards of the demo


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    if not lm_eval_installed():
        pytest.skip("lm-eval is not installed")
    root = tmp_path_factory.mktemp("shards")
    return [_run_shard(DEMO_SUITE, checkpoint_arg("base"), root / f"s{k}", f"{k}/3") for k in (1, 2, 3)]


@pytest.fixture(scope="module")
def merged(shards: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("merged")
    proc = _cli("merge", "--out", str(out), *(str(s) for s in reversed(shards)))  # any order
    assert proc.returncode == 0, proc.stderr
    return out


@needs_lm_eval
def test_each_shard_evaluates_a_third_of_every_task(shards: list[Path]) -> None:
    seen: dict[str, set[int]] = {}
    for k, shard in enumerate(shards, 1):
        (manifest,) = shard.rglob("gatekeeper-manifest.json")
        info = json.loads(manifest.read_text())["shard"]
        assert (info["index"], info["count"]) == (k, 3)
        for task, lines in _samples(shard).items():
            docs = {line["doc_id"] for line in lines}
            assert docs == set(range(*info["docs"][task]))  # lm-eval labelled them with the real ids
            assert len(docs) in (info["items"][task] // 3, info["items"][task] // 3 + 1)
            assert not docs & seen.get(task, set())
            seen.setdefault(task, set()).update(docs)


@needs_lm_eval
def test_sharded_and_merged_equals_unsharded(merged: Path, demo_run) -> None:
    from gatekeeper.results.reader import load_run

    whole = demo_run("base")
    want, got = _results(whole), _results(merged)
    assert {k: v for k, v in got.items() if k not in _WHEN} == {k: v for k, v in want.items() if k not in _WHEN}
    assert_same_items(load_run(whole), load_run(merged))
    want_s, got_s = _samples(whole), _samples(merged)
    assert set(got_s) == set(want_s)
    for task, lines in want_s.items():  # same lines in the same order (task_hashes depend on it)
        keys = ("doc_id", "filter", "doc_hash", "prompt_hash", "target_hash", "arguments", "target", "metrics")
        assert [[g[k] for k in keys] for g in got_s[task]] == [[w[k] for k in keys] for w in lines], task


@needs_lm_eval
def test_merged_gives_the_same_verdict_as_unsharded(merged: Path, demo_run, tmp_path: Path) -> None:
    reports = {}
    for name, run in (("whole", demo_run("base")), ("merged", merged)):
        proc = _cli("gate", "--suite", str(DEMO_SUITE), "--run", str(run), "--json", str(tmp_path / f"{name}.json"),
                    "--no-history")  # the repository's example history stays as it is
        assert proc.returncode == 0, proc.stderr
        reports[name] = json.loads((tmp_path / f"{name}.json").read_text())
    def verdicts(r: dict) -> list:
        return [(c["task"], c["metric"], c["filter"], c["verdict"], c["n"]) for c in r["comparisons"]]
    assert reports["merged"]["verdict"] == reports["whole"]["verdict"] == "pass"
    assert verdicts(reports["merged"]) == verdicts(reports["whole"])


@needs_lm_eval
def test_merged_run_can_become_the_baseline(merged: Path, tmp_path: Path) -> None:
    # The demo suite, unchanged (same hash), beside a copy of its tasks and without a baseline.
    shutil.copytree(DEMO_SUITE.parent / "tasks", tmp_path / "tasks")
    suite = tmp_path / DEMO_SUITE.name
    shutil.copy(DEMO_SUITE, suite)
    proc = _cli("baseline", "record", str(merged), "--suite", str(suite))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / ".gatekeeper" / "baselines" / "demo.json.gz").is_file()


def _one_line_error(proc: subprocess.CompletedProcess, pattern: str) -> None:
    import re

    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert re.search(pattern, proc.stderr), proc.stderr


@needs_lm_eval
def test_merge_refuses_a_missing_shard(shards: list[Path], tmp_path: Path) -> None:
    _one_line_error(_cli("merge", "--out", str(tmp_path / "m"), str(shards[0]), str(shards[2])),
                    r"shard\(s\) 2/3 missing; pass all 3 shard folders")
    assert not (tmp_path / "m").exists() or not any((tmp_path / "m").iterdir())


@needs_lm_eval
def test_merge_refuses_overlapping_shards(shards: list[Path], tmp_path: Path) -> None:
    copy = tmp_path / "again"
    shutil.copytree(shards[1], copy)
    _one_line_error(_cli("merge", "--out", str(tmp_path / "m"), *(str(s) for s in shards), str(copy)),
                    r"shard 2/3 given twice")


@needs_lm_eval
def test_merge_refuses_a_shard_of_another_model(shards: list[Path], tmp_path: Path) -> None:
    other = _run_shard(DEMO_SUITE, checkpoint_arg("harmless"), tmp_path / "h1", "1/3")
    _one_line_error(_cli("merge", "--out", str(tmp_path / "m"), str(other), str(shards[1]), str(shards[2])),
                    r"model_files differs from shard 1's")


@needs_lm_eval
def test_merge_refuses_a_shard_of_another_suite(shards: list[Path], tmp_path: Path) -> None:
    copy = tmp_path / "s3"
    shutil.copytree(shards[2], copy)
    (manifest,) = copy.rglob("gatekeeper-manifest.json")
    data = json.loads(manifest.read_text())
    data["suite_hash"] = "0" * 64  # what a shard made with an edited suite file records
    manifest.write_text(json.dumps(data))
    _one_line_error(_cli("merge", "--out", str(tmp_path / "m"), str(shards[0]), str(shards[1]), str(copy)),
                    r"suite_hash differs from shard 1's")


@needs_lm_eval
def test_merge_reads_only_the_files_each_shard_evaluated(shards: list[Path], tmp_path: Path) -> None:
    """Issue #25: a results file planted beside a shard (the base checkpoint's, renamed to look
    newer) is refused, never merged; so is a shard file changed after the run."""
    copies = [tmp_path / f"s{k}" for k in (1, 2, 3)]
    for shard, copy in zip(shards, copies, strict=True):
        shutil.copytree(shard, copy)
    (results,) = copies[0].glob("*/results_*.json")
    planted = results.parent / "results_2099-01-01T00-00-00.000000.json"
    shutil.copy(results, planted)
    _one_line_error(_cli("merge", "--out", str(tmp_path / "m"), *(str(c) for c in copies)),
                    r"results_2099-01-01T00-00-00.000000.json: not a file of this run")
    planted.unlink()
    (samples,) = [p for p in copies[1].glob("*/samples_demo_capitals_mc_*.jsonl")]
    samples.write_text(samples.read_text() + "\n")  # any change at all
    _one_line_error(_cli("merge", "--out", str(tmp_path / "m"), *(str(c) for c in copies)),
                    r"samples_demo_capitals_mc_.*: its sha256 is not the one gatekeeper-manifest.json records")
    assert not (tmp_path / "m").exists() or not any((tmp_path / "m").iterdir())


@needs_lm_eval
def test_merge_refuses_a_whole_run(shards: list[Path], demo_run, tmp_path: Path) -> None:
    _one_line_error(_cli("merge", "--out", str(tmp_path / "m"), str(shards[0]), str(demo_run("base"))),
                    r"not a shard")


@needs_lm_eval
def test_a_shard_alone_cannot_be_gated_or_stored(shards: list[Path], tmp_path: Path) -> None:
    _one_line_error(_cli("gate", "--suite", str(DEMO_SUITE), "--run", str(shards[0])),
                    r"is shard 1/3 of a run, not a whole run .*gatekeeper merge")
    _one_line_error(_cli("baseline", "record", str(shards[0]), "--suite", str(DEMO_SUITE), "--force"),
                    r"is shard 1/3 of a run")


def test_gate_needs_model_or_run_not_both() -> None:
    _one_line_error(_cli("gate", "--suite", str(DEMO_SUITE)), r"give --model .* or --run")
    _one_line_error(_cli("gate", "--suite", str(DEMO_SUITE), "--model", "x", "--run", "y"), r"not both")


def test_gate_run_without_a_baseline_is_an_error(tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    data = yaml.safe_load(DEMO_SUITE.read_text())
    data["include_path"] = str(DEMO_SUITE.parent / "tasks")
    data["baseline"] = str(tmp_path / "none.json.gz")
    suite.write_text(yaml.safe_dump(data))
    _one_line_error(_cli("gate", "--suite", str(suite), "--run", str(tmp_path)), r"no baseline file; record one")


def _fewshot_whole_run(tmp_path: Path) -> tuple[Path, str]:
    """A 3-shot suite of demo_arith_mc (40 items) and its whole run in tmp_path/whole."""
    data = yaml.safe_load(DEMO_SUITE.read_text())
    data["include_path"] = str(DEMO_SUITE.parent / "tasks")
    data["tasks"] = [{"name": "demo_arith_mc", "num_fewshot": 3, "limit": 40,
                      "metrics": [{"metric": "acc", "filter": "none", "margin": 0.05}]}]
    suite = tmp_path / "fewshot.yaml"
    suite.write_text(yaml.safe_dump(data))
    model = checkpoint_arg("base")
    whole = _cli("run", "--suite", str(suite), "--model", model, "--out", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr
    return suite, model


@needs_lm_eval
def test_few_shot_prompts_of_a_shard_equal_the_unsharded_ones(tmp_path: Path) -> None:
    """lm-eval draws few-shot examples from one RNG, document after document: shard 2 replays
    the draws of shard 1's documents, so its prompts (and prompt hashes) are the unsharded ones."""
    suite, model = _fewshot_whole_run(tmp_path)
    parts = [_run_shard(suite, model, tmp_path / f"p{k}", f"{k}/2") for k in (1, 2)]
    proc = _cli("merge", "--out", str(tmp_path / "merged"), *(str(p) for p in parts))
    assert proc.returncode == 0, proc.stderr
    want, got = _samples(tmp_path / "whole")["demo_arith_mc"], _samples(tmp_path / "merged")["demo_arith_mc"]
    assert len(want) == 40 and [w["arguments"] for w in want] == [g["arguments"] for g in got]
    assert [w["prompt_hash"] for w in want] == [g["prompt_hash"] for g in got]
    assert "\n\n" in want[39]["arguments"]["gen_args_0"]["arg_0"]  # the prompts really have shots
    strip = ("date", "total_evaluation_time_seconds")
    w, g = _results(tmp_path / "whole"), _results(tmp_path / "merged")
    assert {k: v for k, v in g.items() if k not in strip} == {k: v for k, v in w.items() if k not in strip}


@needs_lm_eval
def test_few_shot_prompts_of_a_sequential_look_equal_the_whole_runs(tmp_path: Path) -> None:
    """A look of ``gate --sequential`` evaluates a random sample of each task: before each
    selected document the unselected ones before it are replayed, so the look's prompts (and
    prompt hashes) are the whole run's, document for document."""
    from gatekeeper.run.looks import Look
    from gatekeeper.run.runner import run_suite
    from gatekeeper.suite.suite import load_suite

    suite_path, model = _fewshot_whole_run(tmp_path)
    want = {w["doc_id"]: w for w in _samples(tmp_path / "whole")["demo_arith_mc"]}
    suite = load_suite(suite_path)
    got = {}
    for k in (2, 3):  # the later looks: their documents are scattered, with gaps to replay
        run_suite(suite, model, tmp_path / f"look{k}", look=Look(k, 3, 1234), log=lambda _: None)
        got.update({g["doc_id"]: g for g in _samples(tmp_path / f"look{k}")["demo_arith_mc"]})
    assert len(got) > 20 and sorted(got) != list(range(len(got)))  # a sample, not the first documents
    for doc_id, g in got.items():
        assert g["arguments"] == want[doc_id]["arguments"] and g["prompt_hash"] == want[doc_id]["prompt_hash"], doc_id


def test_sharded_workflow_merges_every_shard_before_gating() -> None:
    doc = yaml.safe_load((ROOT / "docs" / "workflows" / "sharded.yml").read_text())
    jobs = doc["jobs"]
    shard_run = " ".join(str(s.get("run", "")) for s in jobs["shard"]["steps"])
    env = next(s["env"] for s in jobs["shard"]["steps"] if "env" in s)
    assert "gatekeeper run" in shard_run and '--shard "$SHARD"' in shard_run
    assert env["SHARD"] == "${{ matrix.shard }}/${{ strategy.job-total }}"  # N is the matrix size
    assert jobs["shard"]["runs-on"][:2] == ["self-hosted", "gpu"]
    assert jobs["gate"]["needs"] == "shard"  # never gates part of the suite
    steps = jobs["gate"]["steps"]
    merge = next(i for i, s in enumerate(steps) if "gatekeeper merge" in str(s.get("run", "")))
    gate = next(i for i, s in enumerate(steps) if s.get("with", {}).get("command") == "compare")
    assert merge < gate and steps[gate]["with"]["candidate"] in steps[merge]["run"]


@needs_lm_eval
def test_merged_group_scores_equal_lm_evals_weighted_and_unweighted(tmp_path: Path) -> None:
    """A group with a plain (unweighted) mean and an explicit filter list, subtasks of different
    sizes (a fractional limit): the merged group entry is the one lm-eval computes unsharded."""
    shutil.copytree(DEMO_SUITE.parent / "tasks", tmp_path / "tasks")
    group = yaml.safe_load((tmp_path / "tasks" / "demo_mc.yaml").read_text())
    group["aggregate_metric_list"] = [
        {"metric": "acc", "aggregation": "mean", "weight_by_size": True, "filter_list": ["none"]},
        {"metric": "acc_norm", "aggregation": "mean", "weight_by_size": False},
    ]
    (tmp_path / "tasks" / "demo_mc.yaml").write_text(yaml.safe_dump(group))
    data = yaml.safe_load(DEMO_SUITE.read_text())
    data["tasks"] = [{"name": "demo_mc", "limit": 0.1, "metrics": [{"metric": "acc", "filter": "none"}]}]
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump(data))
    model = checkpoint_arg("base")
    whole = _cli("run", "--suite", str(suite), "--model", model, "--out", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr
    parts = [_run_shard(suite, model, tmp_path / f"p{k}", f"{k}/2") for k in (1, 2)]
    proc = _cli("merge", "--out", str(tmp_path / "merged"), *(str(p) for p in parts))
    assert proc.returncode == 0, proc.stderr
    w, g = _results(tmp_path / "whole"), _results(tmp_path / "merged")
    assert w["n-samples"]["demo_arith_mc"]["effective"] != w["n-samples"]["demo_capitals_mc"]["effective"]
    leaves = [w["results"][t]["acc_norm,none"] for t in ("demo_arith_mc", "demo_capitals_mc")]
    assert w["groups"]["demo_mc"]["acc_norm,none"] == sum(leaves) / 2  # really the unweighted mean
    assert {k: v for k, v in g.items() if k not in _WHEN} == {k: v for k, v in w.items() if k not in _WHEN}


@needs_lm_eval
@pytest.mark.parametrize("edit, says", [
    (lambda s: s.update(count=10**9), r"shard\.count is 1000000000, expected 1 to 1024"),
    (lambda s: s["items"].update({k: 10**9 for k in s["items"]}), r"shard\.items\[\w+\] is 1000000000, expected at most"),
    (lambda s: s["docs"].update({next(iter(s["docs"])): "ab"}), r"shard\.docs\[\w+\] is 'ab', expected \[first, end\]"),
    (lambda s: s["docs"].update({next(iter(s["docs"])): [0]}), r"shard\.docs\[\w+\] is \[0\], expected \[first, end\]"),
    (lambda s: s.update(docs=[]), r"shard\.docs is \[\], expected the document range"),
    (lambda s: s.update(index=[2]), r"shard\.index is \[2\], expected 1 to 3"),
    (lambda s: s.update(index=True), r"shard\.index is True, expected 1 to 3"),
])
def test_merge_names_a_wrong_shard_manifest_in_one_line(shards: list[Path], tmp_path: Path, edit, says) -> None:
    """Hostile or hand-edited shard manifests: bounded by the run's own results.json, each one
    clear line, no internal error, quickly (a count of 1e9 ran past 60 s, items of 1e9 ran out
    of memory)."""
    copy = tmp_path / "s1"
    shutil.copytree(shards[0], copy)
    (manifest,) = copy.rglob("gatekeeper-manifest.json")
    data = json.loads(manifest.read_text())
    edit(data["shard"])
    manifest.write_text(json.dumps(data))
    proc = _cli("merge", "--out", str(tmp_path / "m"), str(copy), str(shards[1]), str(shards[2]))
    _one_line_error(proc, says)
    assert "internal error" not in proc.stderr


def test_a_shard_count_beyond_one_per_runner_is_refused() -> None:
    with pytest.raises(GateError, match=r"--shard 1/5000: at most 1024 shards"):
        parse_shard("1/5000")
