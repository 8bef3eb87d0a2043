"""results.load_run on real lm-eval 0.4.13 output (dummy model): every aggregate reproduced from
the samples, the three value kinds, hashes, groups, provenance, snippets, clusters, path forms."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from gatekeeper.compare.stats import aggregate
from gatekeeper.errors import GateError
from gatekeeper.model import SeriesKey
from gatekeeper.results import layout, samples, snippets
from gatekeeper.results import reader as results
from tests.lmeval_fixtures import *  # noqa: F403 - session fixtures
from tests.lmeval_fixtures import TASKS_DIR, results_path, samples_path

pytestmark = pytest.mark.lmeval
SHARED_EXAMPLES = Path(__file__).resolve().parent / "fixtures" / "lmeval-0.4.13-examples"  # vendored


def _raw(out: Path) -> dict:
    return json.loads(results_path(out).read_text(encoding="utf-8"))


def _data(name: str) -> list[dict]:
    return [json.loads(line) for line in (TASKS_DIR / "data" / name).read_text(encoding="utf-8").splitlines()]


def test_every_reported_metric_is_read_and_its_aggregate_reproduced(lmeval_runs):
    for which in ("good", "bad"):
        out = lmeval_runs[which]
        run = results.load_run(out)
        raw = _raw(out)
        expected = set()
        for task in raw["configs"]:
            for key, value in raw["results"][task].items():
                if "," in key and "_stderr" not in key:
                    metric, filt = key.split(",")
                    expected.add(SeriesKey(task, filt, metric))
                    assert run.series[SeriesKey(task, filt, metric)].reported == value
        assert set(run.series) == expected
        assert len(expected) == 16  # 7 leaf tasks; arith_gen has two filters
        for key, s in run.series.items():
            assert s.n == raw["n-samples"][key.task]["effective"]
            assert list(s.doc_ids) == sorted(s.doc_ids)
            # the shared implementation reproduces lm-eval's own aggregate
            assert aggregate(s.kind, s.aggregation, s.values) == pytest.approx(s.reported, rel=1e-9)
            assert s.higher_is_better == raw["higher_is_better"][key.task][key.metric]


def test_value_kinds_and_shapes(lmeval_runs):
    run = results.load_run(lmeval_runs["good"])
    kinds = {str(k): (s.kind, s.aggregation) for k, s in run.series.items()}
    assert kinds["arith_mc/acc,none"] == ("mean", "mean")
    assert kinds["arith_gen/exact_match,strict-match"] == ("mean", "mean")
    assert kinds["synth_ppl/word_perplexity,none"] == ("ratio", "weighted_perplexity")
    assert kinds["synth_ppl/byte_perplexity,none"] == ("ratio", "weighted_perplexity")
    assert kinds["synth_ppl/bits_per_byte,none"] == ("ratio", "bits_per_byte")
    assert kinds["arith_ll/perplexity,none"] == ("ratio", "perplexity")
    assert kinds["trans_bleu/bleu,none"] == ("corpus", "bleu")
    assert kinds["trans_bleu/chrf,none"] == ("corpus", "chrf")
    assert kinds["trans_bleu/ter,none"] == ("corpus", "ter")

    mc = run.series[SeriesKey("arith_mc", "none", "acc")]
    assert mc.values.dtype == np.float64 and mc.values.shape == (30,)
    assert set(np.unique(mc.values)) <= {0.0, 1.0}

    texts = [r["text"] for r in _data("synth_ppl.jsonl")]
    words = run.series[SeriesKey("synth_ppl", "none", "word_perplexity")].values
    nbytes = run.series[SeriesKey("synth_ppl", "none", "byte_perplexity")].values
    assert words.shape == (10, 2) and words.dtype == np.float64
    assert words[:, 1].tolist() == [len(re.split(r"\s+", t)) for t in texts]
    assert nbytes[:, 1].tolist() == [len(t.encode("utf-8")) for t in texts]
    assert nbytes[3, 1] > len(texts[3])  # the non-ASCII doc: bytes, not characters
    assert np.array_equal(words[:, 0], nbytes[:, 0])

    ppl = run.series[SeriesKey("arith_ll", "none", "perplexity")].values
    assert ppl.shape == (30, 2) and (ppl[:, 1] == 1.0).all() and (ppl[:, 0] < 0).all()

    bleu = run.series[SeriesKey("trans_bleu", "none", "bleu")].values
    assert bleu.dtype == object and bleu.shape == (12, 2)
    assert bleu[:, 0].tolist() == [r["target"] for r in _data("trans.jsonl")]
    assert set(bleu[:, 1]) == {"lol"}  # the dummy model's generation


def test_two_filters_and_repeats(lmeval_runs):
    run = results.load_run(lmeval_runs["good"])
    strict = run.series[SeriesKey("arith_gen", "strict-match", "exact_match")]
    raw = run.series[SeriesKey("arith_gen", "raw", "exact_match")]
    assert np.array_equal(strict.doc_ids, raw.doc_ids)
    # "lol" never matches the number regex; unfiltered it equals the target on every 5th doc
    assert strict.values.sum() == 0
    assert raw.values.tolist() == [1.0 if i % 5 == 0 else 0.0 for i in range(30)]
    rep = run.series[SeriesKey("arith_rep", "none", "exact_match")]  # repeats: 3, one value per doc
    assert rep.values.tolist() == raw.values.tolist()


def test_hashes_parse_and_rebuild_lm_evals_task_hash(lmeval_runs):
    run = results.load_run(lmeval_runs["good"])
    for key, s in run.series.items():
        assert s.hashes.shape == (s.n, 3)
        assert s.hashes.dtype == np.dtype("S16")  # HASH_CHARS kept, as ASCII bytes
        assert all(re.fullmatch(r"[0-9a-f]{16}", h) for h in s.hashes.astype(str).ravel())
        if key.task != "arith_gen":  # one filter: file order is doc_id order
            lines = [json.loads(x) for x in samples_path(lmeval_runs["good"], key.task).read_text().splitlines()]
            joined = "".join(x["doc_hash"] + x["prompt_hash"] + x["target_hash"] for x in lines)
            assert hashlib.sha256(joined.encode()).hexdigest() == run.provenance.task_hashes[key.task]
            assert s.hashes.astype(str).tolist() == [[x[k][:16] for k in ("doc_hash", "prompt_hash", "target_hash")] for x in lines]
    docs = _data("arith.jsonl")
    mc = run.series[SeriesKey("arith_mc", "none", "acc")]
    doc_hash = hashlib.sha256(json.dumps(docs[7], indent=2, ensure_ascii=False).encode()).hexdigest()
    assert mc.hashes[7, 0] == doc_hash[:16].encode()
    assert mc.hashes[7, 1].decode() == hashlib.sha256(docs[7]["question"].encode()).hexdigest()[:16]


def test_groups_and_subtasks(lmeval_runs):
    run = results.load_run(lmeval_runs["good"])
    assert run.group_subtasks == {"synth_mc": ["arith_mc", "capitals_mc"]}
    assert set(run.groups) == {"synth_mc"}
    assert set(run.groups["synth_mc"]) == {"acc,none", "acc_norm,none"}
    a = run.series[SeriesKey("arith_mc", "none", "acc")].values
    c = run.series[SeriesKey("capitals_mc", "none", "acc")].values
    # weight_by_size: true for acc → the pooled mean over the leaf items
    assert run.groups["synth_mc"]["acc,none"] == pytest.approx(np.concatenate([a, c]).mean(), rel=1e-12)
    assert not any(k.task == "synth_mc" for k in run.series)  # groups have no series


def test_group_without_aggregate_metric_list_is_kept_empty(tmp_path):
    src = SHARED_EXAMPLES / "results_bleu_and_group_without_agg.json"
    if not src.is_file():
        pytest.skip("shared lm-eval examples not present")
    data = json.loads(src.read_text(encoding="utf-8"))
    groups, subtasks = results._groups(data)
    assert groups == {"synth_noagg": {}}
    assert subtasks == {"synth_noagg": ["arith_mc", "capitals_mc"]}


def test_provenance_from_string_and_dict_model_args(lmeval_runs):
    good = results.load_run(lmeval_runs["good"]).provenance
    bad = results.load_run(lmeval_runs["bad"]).provenance
    assert (good.model_name, bad.model_name) == ("dummy-good", "dummy-bad")
    assert good.lm_eval_version == "0.4.13"
    assert good.seeds == {"random_seed": 1234, "numpy_seed": 1234, "torch_seed": 1234, "fewshot_seed": 1234}
    assert bad.seeds["fewshot_seed"] == 99
    assert good.task_versions["capitals_mc"] == 2.0 and good.task_versions["synth_mc"] == "1.0"
    assert good.n_shot["arith_mc"] == 0
    assert good.limit is None
    assert good.n_samples["capitals_mc"] == {"original": 12, "effective": 12}
    assert good.task_hashes == bad.task_hashes and len(good.task_hashes) == 7  # model-independent
    assert good.source == str(results_path(lmeval_runs["good"]))
    assert good.date is not None and good.transformers_version
    for task, cfg in good.configs.items():
        assert cfg["metadata"] == {"version": good.task_versions[task]}, task
    assert good.configs == bad.configs  # model args and config_source stripped from both
    assert good.manifest == {} and good.suite_hash is None


def test_snippets_are_raw_and_mc_shows_the_chosen_choice(lmeval_runs):
    run = results.load_run(lmeval_runs["good"], snippets=True)
    lines = [json.loads(x) for x in samples_path(lmeval_runs["good"], "arith_mc").read_text().splitlines()]
    line = lines[4]
    snip = run.snippets[("arith_mc", "none")][4]
    lls = [float(r[0]) for r in line["filtered_resps"]]
    assert snip.prompt == line["doc"]["question"]
    assert snip.output == line["doc"]["choices"][int(np.argmax(lls))]
    assert snip.target == line["doc"]["choices"][line["doc"]["label"]]
    gen = run.snippets[("arith_gen", "strict-match")][0]
    assert (gen.output, gen.target) == ("[invalid]", "lol")
    trans = run.snippets[("trans_bleu", "none")][0]
    assert trans.prompt == "Translate: le chat dort\nEnglish:"  # raw: newline kept, nothing escaped
    assert set(run.snippets) == {(k.task, k.filter) for k in run.series}
    for key, s in run.series.items():
        assert set(run.snippets[(key.task, key.filter)]) == set(s.doc_ids.tolist())
    assert results.load_run(lmeval_runs["good"]).snippets == {}  # lazily, by default


def test_snippets_are_truncated(good_copy):
    from tests.lmeval_fixtures import edit_samples

    def long_prompt(lines):
        obj = json.loads(lines[0])
        obj["arguments"]["gen_args_0"]["arg_0"] = "<b>" + "x" * 1000
        return [json.dumps(obj)] + lines[1:]

    edit_samples(good_copy, "arith_gen", long_prompt)
    snip = results.load_run(good_copy, snippets=True).snippets[("arith_gen", "strict-match")][0]
    assert len(snip.prompt) == snippets.SNIPPET_CHARS and snip.prompt.startswith("<b>xxx")


def test_cluster_keys_label_items_from_the_doc(lmeval_runs):
    run = results.load_run(lmeval_runs["good"], cluster_keys={"arith_mc": "topic", "capitals_mc": "region"})
    topics = [r["topic"] for r in _data("arith.jsonl")]
    for metric in ("acc", "acc_norm"):
        assert run.series[SeriesKey("arith_mc", "none", metric)].clusters.tolist() == topics
    assert run.series[SeriesKey("capitals_mc", "none", "acc")].clusters.tolist()[:2] == ["south", "north"]
    assert run.series[SeriesKey("arith_gen", "raw", "exact_match")].clusters is None
    with pytest.raises(GateError, match=r"samples_arith_mc_.*\.jsonl line 1: doc has no field 'subject'"):
        results.load_run(lmeval_runs["good"], cluster_keys={"arith_mc": "subject"})


def test_output_dir_model_folder_and_file_read_the_same(lmeval_runs):
    out = lmeval_runs["good"]
    runs = [results.load_run(p) for p in (out, out / "dummy-good", results_path(out))]
    for other in runs[1:]:
        assert other.series.keys() == runs[0].series.keys()
        for key in runs[0].series:
            assert np.array_equal(other.series[key].values, runs[0].series[key].values)
        assert other.notes == []


def test_several_runs_take_the_newest_with_a_note(good_copy):
    folder = good_copy / "dummy-good"
    old = results_path(good_copy)
    ts = old.name[len("results_") : -len(".json")]
    # Two older copies; a later-sorting timestamp must win regardless of directory order.
    for older in ("2001-01-01T00-00-00.000001", "2001-01-02T00-00-00"):
        shutil.copy(old, folder / f"results_{older}.json")
    chosen, notes = layout.find_results_file(good_copy)
    assert chosen == old
    assert notes == [f"3 runs in {folder}; using the newest, {old.name}"]
    assert results.load_run(good_copy).notes == notes
    assert ts > "2001"


def test_several_model_folders_ask_to_pick_one(good_copy, lmeval_runs):
    shutil.copytree(lmeval_runs["bad"] / "dummy-bad", good_copy / "dummy-bad")
    with pytest.raises(GateError, match=r"good: 2 model folders \(dummy-bad, dummy-good\); pass one of them"):
        results.load_run(good_copy)


def test_manifest_beside_the_run_is_loaded(good_copy):
    manifest = {"suite_hash": "sha256:abc", "hardware": {"gpu": "none", "cpus": 2}}
    (good_copy / layout.MANIFEST_NAME).write_text(json.dumps(manifest))
    prov = results.load_run(good_copy).provenance
    assert prov.manifest == manifest and prov.suite_hash == "sha256:abc"


def test_shared_cli_example_without_samples_names_the_missing_file(tmp_path):
    src = SHARED_EXAMPLES / "results_tiny-good.json"
    if not src.is_file():
        pytest.skip("shared lm-eval examples not present")
    dst = tmp_path / "results_2026-11-30T01-57-33.954527.json"
    shutil.copy(src, dst)
    with pytest.raises(
        GateError, match=r"samples_arith_gen_2026-11-30T01-57-33\.954527\.jsonl: samples file missing"
    ):
        results.load_run(tmp_path)
    data = json.loads(src.read_text())
    prov = results._provenance(dst, data, {})  # the CLI writes model_args as a dict
    assert prov.model_name == "./tiny-good" and prov.model_dtype == "torch.float32"
    assert prov.configs["arith_mc"]["metadata"] == {"version": 1.0}


def test_list_values_of_a_mean_metric_are_averaged(good_copy):
    from tests.lmeval_fixtures import edit_results, edit_samples

    def as_lists(lines):
        out = []
        for line in lines:
            obj = json.loads(line)
            obj["acc"] = [obj["acc"], 1.0]  # e.g. several scored repeats logged for one doc
            out.append(json.dumps(obj))
        return out

    edit_samples(good_copy, "arith_mc", as_lists)
    raw = json.loads(results_path(good_copy).read_text())
    mean = (raw["results"]["arith_mc"]["acc,none"] + 1.0) / 2
    edit_results(good_copy, lambda d: d["results"]["arith_mc"].update({"acc,none": mean}))
    s = results.load_run(good_copy).series[SeriesKey("arith_mc", "none", "acc")]
    assert set(np.unique(s.values)) <= {0.5, 1.0} and s.values.mean() == pytest.approx(mean)


def test_an_aggregation_gatekeeper_cannot_test_is_recorded_as_untestable(good_copy):
    from tests.lmeval_fixtures import edit_results

    edit_results(good_copy, lambda d: d["configs"]["arith_mc"]["metric_list"][1].update(aggregation="bypass"))
    run = results.load_run(good_copy)
    assert SeriesKey("arith_mc", "none", "acc_norm") not in run.series
    assert SeriesKey("arith_mc", "none", "acc") in run.series
    assert run.untestable == {SeriesKey("arith_mc", "none", "acc_norm"): "bypass"}


def test_a_function_aggregation_is_named_not_printed(good_copy):
    from tests.lmeval_fixtures import edit_results

    source = "def my_f1(items):\n    import sklearn\n    return 0.5\n"
    edit_results(good_copy, lambda d: d["configs"]["arith_mc"]["metric_list"][1].update(aggregation=source))
    run = results.load_run(good_copy)
    assert run.untestable == {SeriesKey("arith_mc", "none", "acc_norm"): "!function my_f1"}


def test_attach_snippets_reads_only_the_wanted_items(lmeval_runs):
    full = results.load_run(lmeval_runs["good"], snippets=True).snippets
    run = results.load_run(lmeval_runs["good"])
    wanted = {("arith_mc", "none"): {4, 7}, ("arith_gen", "strict-match"): {0}, ("trans_bleu", "none"): set()}
    snippets.attach_snippets(run, wanted)
    assert run.snippets == {
        ("arith_mc", "none"): {4: full[("arith_mc", "none")][4], 7: full[("arith_mc", "none")][7]},
        ("arith_gen", "strict-match"): {0: full[("arith_gen", "strict-match")][0]},
    }
    snippets.attach_snippets(run, {("arith_gen", "raw"): {0}, ("arith_gen", "strict-match"): {1}})
    assert set(run.snippets[("arith_gen", "strict-match")]) == {0, 1}  # added to, not replaced
    assert run.snippets[("arith_gen", "raw")][0] == full[("arith_gen", "raw")][0]


def test_attach_snippets_is_a_no_op_for_a_baseline_or_a_vanished_samples_file(good_copy, tmp_path):
    from gatekeeper.baseline import store

    run = results.load_run(good_copy)
    path = tmp_path / "base.json.gz"
    store.save_baseline(run, path, suite_name="t", suite_hash=None)
    baseline = store.load_baseline(path)
    snippets.attach_snippets(baseline, {("arith_mc", "none"): {4}})
    assert baseline.snippets == {}
    samples_path(good_copy, "arith_mc").unlink()
    snippets.attach_snippets(run, {("arith_mc", "none"): {4}, ("arith_gen", "raw"): {0}})
    assert set(run.snippets) == {("arith_gen", "raw")}


def test_attach_snippets_finds_lines_of_another_shape(good_copy):
    from tests.lmeval_fixtures import edit_samples

    want = results.load_run(good_copy, snippets=True).snippets[("arith_mc", "none")][5]

    def doc_id_last(lines):
        obj = json.loads(lines[5])
        doc_id = obj.pop("doc_id")
        return lines[:5] + [json.dumps({**obj, "doc_id": doc_id})] + lines[6:]

    edit_samples(good_copy, "arith_mc", doc_id_last)
    run = results.load_run(good_copy)
    snippets.attach_snippets(run, {("arith_mc", "none"): {5, 6}})
    assert run.snippets[("arith_mc", "none")][5] == want and set(run.snippets[("arith_mc", "none")]) == {5, 6}


def _series_equal(a, b) -> None:
    assert a.series.keys() == b.series.keys()
    for key, s in a.series.items():
        t = b.series[key]
        assert (s.kind, s.aggregation, s.higher_is_better, s.reported) == (t.kind, t.aggregation, t.higher_is_better, t.reported)
        for field in ("doc_ids", "values", "hashes", "clusters"):
            x, y = getattr(s, field), getattr(t, field)
            assert (x is None) == (y is None), (key, field)
            if x is not None:
                assert x.dtype == y.dtype and np.array_equal(x, y), (key, field)


def test_bulk_and_line_by_line_reading_give_the_same_series(lmeval_runs, monkeypatch):
    clusters = {"arith_mc": "topic", "capitals_mc": "region"}
    bulk = {(w, c): results.load_run(lmeval_runs[w], cluster_keys=clusters if c else None)
            for w in ("good", "bad") for c in (False, True)}

    # Line by line: every block decoded one line at a time, every value taken item by item,
    # in blocks of a few lines.
    def one_by_one(self, path, raw, first):
        pairs = [(self.one(path, n, line), n) for n, line in samples._numbered(raw, first)]
        return [obj for obj, _ in pairs], [n for _, n in pairs]

    def unusual(*_args):
        raise samples.Unusual

    monkeypatch.setattr(samples._Shape, "decode", one_by_one)
    monkeypatch.setattr(samples, "_BLOCK_BYTES", 3000)
    for kind in metrics_kinds():
        monkeypatch.setattr(kind, "fast_values", unusual)
    for (which, c), run in bulk.items():
        again = results.load_run(lmeval_runs[which], cluster_keys=clusters if c else None)
        _series_equal(run, again)
        assert run.sample_lines.keys() == again.sample_lines.keys()
        for key, (ids, offsets) in run.sample_lines.items():
            assert np.array_equal(ids, again.sample_lines[key][0]) and np.array_equal(offsets, again.sample_lines[key][1])

    # and real lm-eval files are read in bulk (no line is decoded on its own)
    monkeypatch.undo()

    def no_line_by_line(self, path, *_args):
        raise AssertionError(f"{path} decoded line by line")

    monkeypatch.setattr(samples._Shape, "one", no_line_by_line)
    results.load_run(lmeval_runs["good"], cluster_keys=clusters)
    results.load_run(lmeval_runs["bad"])


def metrics_kinds() -> list[type]:
    from gatekeeper.results.metrics import KINDS

    return sorted({type(k) for k in KINDS.values()}, key=lambda t: t.__name__)


def test_line_offsets_point_at_each_items_line(lmeval_runs):
    run = results.load_run(lmeval_runs["good"])
    for (task, filt), (ids, offsets) in run.sample_lines.items():
        data = samples_path(lmeval_runs["good"], task).read_bytes()
        for doc_id, at in zip(ids.tolist(), offsets.tolist(), strict=True):
            line = json.loads(data[at:data.index(b"\n", at)])
            assert (line["doc_id"], line.get("filter", "none")) == (doc_id, filt)


def test_unusual_but_valid_lines_give_the_same_series(good_copy, lmeval_runs):
    from tests.lmeval_fixtures import edit_samples

    def odd(lines):
        first = json.loads(lines[0])
        first["doc"]["filter"] = "decoy"  # a nested "filter" key before the real one
        reordered = json.loads(lines[1])
        reordered = {"filter": reordered.pop("filter"), **reordered}  # keys in another order
        return [json.dumps(first), json.dumps(reordered), "", "  "] + lines[2:]  # and blank lines

    for task in ("arith_gen", "synth_ppl", "trans_bleu", "arith_mc"):
        edit_samples(good_copy, task, odd)
    _series_equal(results.load_run(lmeval_runs["good"]), results.load_run(good_copy))


def test_two_values_on_one_line_are_rejected(good_copy):
    from tests.lmeval_fixtures import edit_samples

    # each line alone is invalid JSON; joined into one array by a naive fast path they would parse
    edit_samples(good_copy, "arith_mc", lambda lines: [lines[0] + ", " + lines[1]] + lines[2:])
    with pytest.raises(GateError, match=r"samples_arith_mc_.*\.jsonl line 1: truncated or invalid JSON"):
        results.load_run(good_copy)
