"""Bad lm-eval output → one-line GateError naming the file and the problem (never a traceback).

Each case copies a real dummy-model run and corrupts one thing."""

from __future__ import annotations

import json
import re

import pytest

from gatekeeper.errors import GateError
from gatekeeper.results.reader import load_run
from tests.lmeval_fixtures import *  # noqa: F403 - session fixtures
from tests.lmeval_fixtures import edit_results, edit_samples, results_path, samples_path

pytestmark = pytest.mark.lmeval


def _fails(path, pattern: str) -> str:
    with pytest.raises(GateError) as info:
        load_run(path)
    message = str(info.value)
    assert "\n" not in message
    assert re.search(pattern, message), message
    return message


def _set_line(lines: list[str], index: int, **changes) -> list[str]:
    obj = json.loads(lines[index])
    obj.update(changes)
    return lines[:index] + [json.dumps(obj)] + lines[index + 1 :]


def test_missing_directory(tmp_path):
    _fails(tmp_path / "nope", r"/nope: no such file or directory$")


def test_empty_directory(tmp_path):
    _fails(tmp_path, re.escape(str(tmp_path)) + r": directory is empty")


def test_no_results_file(good_copy):
    results_path(good_copy).unlink()
    _fails(good_copy, re.escape(str(good_copy)) + r": no results_\*\.json here, in a model subfolder \(<out>/<model>/\) or one level below that")


def test_truncated_results_json(good_copy):
    path = results_path(good_copy)
    text = path.read_text(encoding="utf-8")
    path.write_text(text[: len(text) // 2], encoding="utf-8")
    _fails(good_copy, re.escape(str(path)) + r": not valid JSON \(line \d+, column \d+\)$")


def test_non_json_results(good_copy):
    path = results_path(good_copy)
    path.write_text("results:\n  arith_mc: 0.5\n", encoding="utf-8")
    _fails(good_copy, re.escape(str(path)) + r": not valid JSON \(line 1, column 1\)$")


def test_empty_results_file(good_copy):
    path = results_path(good_copy)
    path.write_text("", encoding="utf-8")
    _fails(path, re.escape(str(path)) + r": empty file$")


def test_results_missing_required_keys(good_copy):
    path = edit_results(good_copy, lambda d: d.pop("configs"))
    _fails(good_copy, re.escape(str(path)) + r": missing required key\(s\) configs")


def test_samples_file_missing_for_a_task(good_copy):
    missing = samples_path(good_copy, "synth_ppl")
    missing.unlink()
    _fails(good_copy, re.escape(str(missing)) + r": samples file missing for task synth_ppl")


def test_truncated_samples_line(good_copy):
    path = samples_path(good_copy, "arith_gen")
    lines = path.read_text(encoding="utf-8").splitlines()
    path.write_text("\n".join(lines[:26]) + "\n" + lines[26][:80], encoding="utf-8")  # cut mid-line
    _fails(good_copy, re.escape(str(path)) + r" line 27: truncated or invalid JSON$")


def test_invalid_utf8_inside_a_prompt_names_its_line(good_copy):
    # msgspec skips a prompt without checking its bytes: the block's UTF-8 is checked on its own
    path = samples_path(good_copy, "arith_mc")
    data = path.read_bytes().split(b"\n")
    data[8] = data[8].replace(b'"arguments"', b'"arguments\xff"', 1)
    path.write_bytes(b"\n".join(data))
    _fails(good_copy, re.escape(str(path)) + r" line 9: not valid UTF-8$")


def test_empty_samples_file(good_copy):
    path = samples_path(good_copy, "arith_mc")
    path.write_bytes(b"")
    _fails(good_copy, re.escape(str(path)) + r": results.json reports acc,none but no sample line has filter none$")


def test_last_line_without_a_newline_is_read(good_copy, lmeval_runs):
    path = samples_path(good_copy, "arith_mc")
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    run, again = load_run(lmeval_runs["good"]), load_run(good_copy)
    key = next(k for k in run.series if k.task == "arith_mc")
    assert list(again.series[key].values) == list(run.series[key].values)


def test_duplicate_doc_id(good_copy):
    path = edit_samples(good_copy, "arith_mc", lambda lines: _set_line(lines, 5, doc_id=4))
    _fails(good_copy, re.escape(str(path)) + r" line 6: duplicate doc_id 4 \(filter none\)$")


def test_nan_metric_value(good_copy):
    # lm-eval's json.dumps writes float('nan') as the bare token NaN
    path = edit_samples(good_copy, "arith_mc", lambda lines: _set_line(lines, 11, acc=float("nan")))
    _fails(good_copy, re.escape(str(path)) + r" line 12: acc is nan, not a number$")


def test_non_numeric_metric_value(good_copy):
    path = edit_samples(good_copy, "arith_mc", lambda lines: _set_line(lines, 11, acc="abc"))
    _fails(good_copy, re.escape(str(path)) + r" line 12: acc is 'abc', not a number$")


def test_bad_ratio_and_corpus_values(good_copy):
    path = edit_samples(good_copy, "synth_ppl", lambda lines: _set_line(lines, 2, word_perplexity=[-1.5]))
    _fails(
        good_copy,
        re.escape(str(path)) + r" line 3: word_perplexity is \[-1\.5\], expected \[loglikelihood, count\]",
    )
    edit_samples(good_copy, "synth_ppl", lambda lines: _set_line(lines, 2, word_perplexity=[-1.5, 0]))
    _fails(good_copy, r"line 3: word_perplexity count is 0\.0, must be > 0")


def test_metric_in_results_with_no_per_item_values(good_copy):
    def drop_chrf(lines):
        out = []
        for line in lines:
            obj = json.loads(line)
            obj.pop("chrf")
            out.append(json.dumps(obj))
        return out

    path = edit_samples(good_copy, "trans_bleu", drop_chrf)
    _fails(
        good_copy, re.escape(str(path)) + r" line 1: no value for chrf \(results\.json reports chrf,none\)"
    )


def test_filter_in_results_with_no_sample_lines(good_copy):
    path = edit_samples(good_copy, "arith_gen", lambda lines: lines[:30])  # keep only strict-match
    _fails(
        good_copy,
        re.escape(str(path)) + r": results\.json reports exact_match,raw but no sample line has filter raw",
    )


def test_doc_count_differs_from_n_samples(good_copy):
    edit_results(good_copy, lambda d: d["n-samples"]["capitals_mc"].update(effective=13))
    path = samples_path(good_copy, "capitals_mc")
    _fails(
        good_copy, re.escape(str(path)) + r": 12 docs for filter none, but results\.json n-samples says 13"
    )


def test_aggregate_that_does_not_match_the_samples(good_copy):
    edit_results(good_copy, lambda d: d["results"]["synth_ppl"].update({"bits_per_byte,none": 0.5}))
    path = samples_path(good_copy, "synth_ppl")
    _fails(
        good_copy,
        re.escape(str(path))
        + r": bits_per_byte,none recomputed from the samples is .* but results\.json says 0\.5",
    )


def test_samples_from_another_run_do_not_match(good_copy, lmeval_runs):
    # Same items, other model: every hash agrees, so only the recomputed aggregates can tell.
    (good_copy / "dummy-good" / samples_path(good_copy, "arith_mc").name).write_bytes(
        samples_path(lmeval_runs["bad"], "arith_mc").read_bytes()
    )
    _fails(good_copy, r"samples_arith_mc_.*\.jsonl: acc,none recomputed from the samples is")


def test_non_numeric_aggregate_in_results(good_copy):
    path = edit_results(good_copy, lambda d: d["results"]["arith_mc"].update({"acc,none": "high"}))
    _fails(good_copy, re.escape(str(path)) + r": arith_mc acc,none is 'high', not a number$")


def test_item_hash_edited_in_the_samples_file(good_copy):
    path = edit_samples(good_copy, "arith_mc", lambda lines: _set_line(lines, 17, prompt_hash="0" * 64))
    _fails(
        good_copy,
        re.escape(str(path)) + r": item hashes do not match task_hashes\[arith_mc\] in results\.json",
    )


def test_several_model_folders(good_copy, lmeval_runs):
    import shutil

    shutil.copytree(lmeval_runs["bad"] / "dummy-bad", good_copy / "dummy-bad")
    _fails(
        good_copy,
        re.escape(str(good_copy)) + r": 2 model folders \(dummy-bad, dummy-good\); pass one of them$",
    )
