"""compat: which differences between two real lm-eval runs make a comparison invalid (error) and
which are only context; pair_series alignment and per-item hash checks."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from gatekeeper.compare.compare import compare_runs
from gatekeeper.compare.compat import Difference, check_compatible, pair_series
from gatekeeper.errors import GateError
from gatekeeper.model import MetricSeries, SeriesKey
from gatekeeper.results.reader import load_run
from gatekeeper.suite.policy import Policy
from tests.lmeval_fixtures import *  # noqa: F403 - session fixtures
from tests.lmeval_fixtures import edit_results, edit_samples

pytestmark = pytest.mark.lmeval
MC = SeriesKey("arith_mc", "none", "acc")


@pytest.fixture(scope="module")
def good(lmeval_runs):
    return load_run(lmeval_runs["good"], cluster_keys={"arith_mc": "topic"})


@pytest.fixture(scope="module")
def bad(lmeval_runs):
    return load_run(lmeval_runs["bad"])


CHANGED_FIX = ("fix: evaluate the baseline's data and tasks (a pull request's run uses the base commit's), or "
               "record a new baseline on purpose (gatekeeper run --new-data ..., then gatekeeper baseline promote RUN_DIR)")


def _errors(diffs: list[Difference]) -> list[str]:
    return [d.message for d in diffs if d.severity == "error"]


def _context(diffs: list[Difference]) -> list[str]:
    return [d.message for d in diffs if d.severity == "context"]


def _subset(s: MetricSeries, keep: np.ndarray) -> MetricSeries:
    out = copy.copy(s)
    out.doc_ids, out.values, out.hashes = s.doc_ids[keep], s.values[keep], s.hashes[keep]
    out.clusters = None if s.clusters is None else s.clusters[keep]
    return out


# ---------------------------------------------------------------- two real runs


def test_two_models_on_the_same_suite_are_comparable(good, bad):
    diffs = check_compatible(good, bad)
    assert _errors(diffs) == []
    context = _context(diffs)
    assert "model: dummy-good in baseline, dummy-bad in candidate" in context
    assert "random_seed 1234 in baseline, 99 in candidate" in context
    # 0-shot everywhere: the fewshot seed changes nothing, so it is context too
    assert "fewshot_seed 1234 in baseline, 99 in candidate" in context
    assert any(m.startswith("date: ") for m in context)
    assert check_compatible(good, bad) == diffs  # deterministic


def test_pair_series_aligns_every_series_of_two_runs(good, bad):
    for key in good.series:
        base, cand, clusters = pair_series(good.series[key], bad.series[key], where=str(key))
        assert base.shape == cand.shape == good.series[key].values.shape
        if key.task == "arith_mc":
            assert clusters.tolist() == good.series[key].clusters.tolist()
        else:
            assert clusters is None
    base, cand, _ = pair_series(good.series[MC], bad.series[MC], where="x")
    assert not np.array_equal(base, cand)  # different seeds → different random logliks


def test_pair_series_reorders_a_shuffled_candidate(good, bad):
    perm = np.random.default_rng(0).permutation(good.series[MC].n)
    shuffled = _subset(bad.series[MC], perm)
    base, cand, clusters = pair_series(good.series[MC], shuffled, where="x")
    assert np.array_equal(cand, bad.series[MC].values)
    assert clusters.tolist() == good.series[MC].clusters.tolist()


def test_doc_ids_differ(good, bad):
    keep = ~np.isin(bad.series[MC].doc_ids, [17, 18, 20])
    with pytest.raises(GateError) as info:
        pair_series(good.series[MC], _subset(bad.series[MC], keep), where="task arith_mc")
    assert str(info.value) == (
        "task arith_mc: doc_ids differ: 3 only in baseline (e.g. 17, 18, 20), 0 only in candidate"
    )


def test_item_hash_mismatch_from_an_edited_prompt(good_copy, good):
    # A prompt that really changed: new prompt_hash in the samples and a new task hash.
    def change(lines):
        obj = json.loads(lines[17])
        obj["arguments"]["gen_args_0"]["arg_0"] = "Q: changed= A:"
        obj["prompt_hash"] = "f" * 64
        return lines[:17] + [json.dumps(obj)] + lines[18:]

    path = edit_samples(good_copy, "arith_mc", change)
    hashes = [json.loads(line) for line in path.read_text().splitlines()]
    joined = "".join(h["doc_hash"] + h["prompt_hash"] + h["target_hash"] for h in hashes)
    import hashlib

    edit_results(
        good_copy, lambda d: d["task_hashes"].update(arith_mc=hashlib.sha256(joined.encode()).hexdigest())
    )
    cand = load_run(good_copy)
    (message,) = _errors(check_compatible(good, cand))
    assert message.startswith("task arith_mc: its items changed since the baseline (1 of ")
    assert "items differ in their prompt hash, the first doc_id 17); likely cause: the prompts or targets arith_mc " \
        "builds from the same documents" in message and message.endswith(CHANGED_FIX)
    with pytest.raises(GateError, match=r"^task arith_mc doc_id 17: prompt hash differs$"):
        pair_series(good.series[MC], cand.series[MC], where="task arith_mc")


def test_truncated_baseline_hashes_compare_on_the_prefix(good, bad):
    short = copy.copy(good.series[MC])
    short.hashes = good.series[MC].hashes.astype("<U16")  # what a baseline store may keep
    pair_series(short, bad.series[MC], where="x")  # no error: prefixes agree
    tampered = bad.series[MC].hashes.copy()
    tampered[5, 2] = tampered[5, 2][:10] + b"zzzzzz"  # bytes (as read) beside the str prefixes
    cand = copy.copy(bad.series[MC])
    cand.hashes = tampered
    with pytest.raises(GateError, match=r"^x doc_id 5: target hash differs$"):
        pair_series(short, cand, where="x")
    # the run-level task hash comparison works on prefixes too
    base = copy.deepcopy(good)
    base.provenance.task_hashes = {t: h[:16] for t, h in good.provenance.task_hashes.items()}
    assert _errors(check_compatible(base, bad)) == []


def test_pair_series_refuses_different_aggregations(good, bad):
    other = copy.copy(bad.series[SeriesKey("synth_ppl", "none", "word_perplexity")])
    other.aggregation = "bits_per_byte"
    with pytest.raises(
        GateError, match="aggregated as ratio/weighted_perplexity in baseline, ratio/bits_per_byte"
    ):
        pair_series(good.series[SeriesKey("synth_ppl", "none", "word_perplexity")], other, where="synth_ppl")


# ---------------------------------------------------------------- corrupted copies of the real run


def test_metric_in_one_run_only(good_copy, good):
    def drop(d):
        for key in ("chrf,none", "chrf_stderr,none"):
            d["results"]["trans_bleu"].pop(key)

    edit_results(good_copy, drop)
    assert _errors(check_compatible(good, load_run(good_copy))) == ["trans_bleu/chrf,none: only in baseline"]
    assert _errors(check_compatible(load_run(good_copy), good)) == ["trans_bleu/chrf,none: only in candidate"]


def test_task_versions_differ(good_copy, good):
    def bump(d):
        d["versions"]["capitals_mc"] = 3.0
        d["configs"]["capitals_mc"]["metadata"]["version"] = 3.0

    edit_results(good_copy, bump)
    assert _errors(check_compatible(good, load_run(good_copy))) == [
        "task capitals_mc: version 2.0 in baseline, 3.0 in candidate"
    ]


def test_n_shot_differs_and_makes_the_fewshot_seed_matter(good_copy, good, bad):
    def five_shot(d):
        d["n-shot"]["arith_mc"] = 5
        d["configs"]["arith_mc"]["num_fewshot"] = 5
        d["config"]["fewshot_seed"] = 99

    edit_results(good_copy, five_shot)
    assert _errors(check_compatible(good, load_run(good_copy))) == [
        "task arith_mc: num_fewshot 0 in baseline, 5 in candidate",
        "fewshot_seed 1234 in baseline, 99 in candidate",
    ]


def test_task_set_differs(good, bad):
    cand = copy.deepcopy(bad)
    cand.series = {k: v for k, v in cand.series.items() if k.task != "synth_ppl"}
    del cand.provenance.configs["synth_ppl"]
    assert _errors(check_compatible(good, cand)) == [
        "tasks differ: only in baseline: synth_ppl; only in candidate: none"
    ]


def test_filters_and_other_config_keys(good_copy, good):
    def edit(d):
        d["configs"]["arith_gen"]["filter_list"][1]["name"] = "raw2"
        d["configs"]["arith_mc"]["doc_to_text"] = "Question: {{question}}"
        d["configs"]["arith_mc"]["metadata"]["note"] = "x"

    edit_results(good_copy, edit)
    cand = copy.deepcopy(good)
    cand.provenance.configs = load_run(good_copy).provenance.configs
    assert _errors(check_compatible(good, cand)) == [
        "task arith_gen: filters (filter_list) differ: [strict-match, raw] in baseline, [strict-match, raw2] in candidate",
        "task arith_mc: config doc_to_text differs: {{question}} in baseline, Question: {{question}} in candidate",
        "task arith_mc: config metadata.note differs: absent in baseline, x in candidate",
    ]


def test_run_level_errors(good, bad):
    cand = copy.deepcopy(bad)
    p = cand.provenance
    p.lm_eval_version = "0.4.14"
    p.chat_template_sha = "ab" * 32
    p.limit = 10
    p.n_samples["capitals_mc"] = {"original": 12, "effective": 10}
    p.task_hashes["synth_ppl"] = "0" * 64
    assert _errors(check_compatible(good, cand)) == [
        "task synth_ppl: its items changed since the baseline (every item's hashes agree; lm-eval's task hash "
        "differs); likely cause: lm-eval 0.4.13 in the baseline, 0.4.14 in the candidate; " + CHANGED_FIX,
        "limit unset in baseline, 10 in candidate",
        "task capitals_mc: 12 items (n-samples effective) in baseline, 10 in candidate",
        "lm-eval version 0.4.13 in baseline, 0.4.14 in candidate",
        "chat template differs (sha unset in baseline, abababababa… in candidate)",
    ]


def test_harmless_differences_are_context(good):
    cand = copy.deepcopy(good)
    p = cand.provenance
    # A transformers version the baseline cannot have (the installed one is whatever PyPI serves).
    p.batch_size, p.model_dtype, p.device, p.transformers_version = 16, "torch.bfloat16", "cuda:0", "0.0.1-other"
    p.date = (good.provenance.date or 0) + 86400
    base = copy.deepcopy(good)
    base.provenance.manifest = {"hardware": {"gpu": "A10G"}, "torch_version": "2.13.0"}
    base.provenance.manifest["model_files"] = {"model.safetensors": "aa", "config.json": "cc"}
    p.manifest = {"hardware": {"gpu": "H200"}, "torch_version": "2.13.0", "wall_seconds": 12,
                  "model_files": {"model.safetensors": "bb", "config.json": "cc"}}
    diffs = check_compatible(base, cand)
    assert _errors(diffs) == []
    context = _context(diffs)
    assert context[:4] == [
        "dtype: unset in baseline, torch.bfloat16 in candidate",
        "batch size: unset in baseline, 16 in candidate",
        "device: unset in baseline, cuda:0 in candidate",
        f"transformers version: {good.provenance.transformers_version} in baseline, 0.0.1-other in candidate",
    ]
    assert context[4].startswith("date: ")
    assert context[5:] == [  # wall time and other per-run noise is left out
        "model files differ (sha256): model.safetensors",
        "hardware.gpu: A10G in baseline, H200 in candidate",
    ]


def test_a_json_round_trip_changes_nothing(good):
    # A baseline store writes provenance as JSON: tuples become lists, ints may become floats.
    cand = copy.deepcopy(good)
    p = cand.provenance
    p.configs = json.loads(json.dumps(p.configs))
    p.n_shot = {t: float(v) for t, v in p.n_shot.items()}
    p.task_versions = {t: str(v) for t, v in p.task_versions.items()}
    assert check_compatible(good, cand) == []


def test_same_model_by_absolute_and_relative_path_is_no_difference(good, tmp_path):
    """The action passes /github/workspace/ckpt, a baseline recorded locally says ckpt."""
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent  # a git checkout
    base, cand = copy.deepcopy(good), copy.deepcopy(good)
    base.provenance.model_name = "examples/checkpoints/base"
    cand.provenance.model_name = str(repo / "examples" / "checkpoints" / "base")
    assert check_compatible(base, cand) == []
    cand.provenance.model_name = "./examples/checkpoints/base/"
    assert check_compatible(base, cand) == []
    cand.provenance.model_name = str(repo / "examples" / "checkpoints" / "harmless")
    assert _context(check_compatible(base, cand)) == [
        "model: examples/checkpoints/base in baseline, examples/checkpoints/harmless in candidate"
    ]


def test_batch_size_string_and_int_are_the_same(good):
    """lm-eval's CLI writes batch_size "16", its Python API 16."""
    base, cand = copy.deepcopy(good), copy.deepcopy(good)
    base.provenance.batch_size, cand.provenance.batch_size = "16", 16
    assert check_compatible(base, cand) == []
    cand.provenance.batch_size = "auto"
    assert _context(check_compatible(base, cand)) == ["batch size: 16 in baseline, auto in candidate"]


def test_missing_lm_eval_version_is_an_error(good):
    cand = copy.deepcopy(good)
    cand.provenance.lm_eval_version = None
    assert _errors(check_compatible(good, cand)) == ["lm-eval version 0.4.13 in baseline, unset in candidate"]
    assert _errors(check_compatible(cand, good)) == ["lm-eval version unset in baseline, 0.4.13 in candidate"]


def test_short_task_hashes_are_an_error(good):
    base, cand = copy.deepcopy(good), copy.deepcopy(good)
    base.provenance.task_hashes = {t: h[:1] for t, h in base.provenance.task_hashes.items()}
    assert any("task_hashes too short" in m for m in _errors(check_compatible(base, cand)))


def test_changed_items_are_one_message_naming_the_task_the_items_the_cause_and_the_fix() -> None:
    """Issue #36: a hub dataset edited since the baseline; said once, with what changed and why."""
    from tests.synthetic import run, series

    base = run(series("qa", "acc", np.ones(50)))
    cand = copy.deepcopy(base)
    for doc in (7, 9):
        cand.series[next(iter(cand.series))].hashes[doc][0] = "f" * 16
    base.provenance.task_hashes, cand.provenance.task_hashes = {"qa": "a" * 64}, {"qa": "b" * 64}
    base.provenance.manifest = {"datasets": {"org/qa": "1" * 40}}
    cand.provenance.manifest = {"datasets": {"org/qa": "2" * 40}}
    diffs = check_compatible(base, cand)
    assert _errors(diffs) == [
        "task qa: its items changed since the baseline (2 of 50 items differ in their doc hash, the first doc_id 7); "
        "likely cause: dataset org/qa at revision 1111111 in the baseline, 2222222 in the candidate; " + CHANGED_FIX]
    assert "dataset org/qa: revision 1111111 in baseline, 2222222 in candidate" in [d.message for d in diffs]
    with pytest.raises(GateError) as err:
        compare_runs(base, cand, Policy())
    assert str(err.value).count("its items changed") == 1 and "; all:" not in str(err.value)
