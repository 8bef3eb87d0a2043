"""gatekeeper run on a real (throwaway, random) tiny GPT-2 through the real lm-eval 0.4.13.

One session-scoped run is shared by most tests; the failure tests never load the model, so
they cost about as much as a TaskManager scan.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lm_eval")
pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from gatekeeper.baseline import store  # noqa: E402
from gatekeeper.compare.compat import check_suite_hash
from gatekeeper.errors import GateError  # noqa: E402
from gatekeeper.gate import record_run
from gatekeeper.run import modelref, runner  # noqa: E402
from gatekeeper.suite.suite import load_suite  # noqa: E402

pytestmark = pytest.mark.lmeval

TASKS = Path(__file__).parent / "fixtures" / "runner_tasks"
SUITE = """\
name: rt
lm_eval_version: "{version}"
include_path: {tasks}
model: {{dtype: float32, batch_size: 8}}
seeds: {{random: 1234, numpy: 1234, torch: 1234, fewshot: 1234}}
tasks:
  - name: rt_mc
    num_fewshot: 2
    limit: 10
    cluster: topic
  - name: rt_gen
    gen_kwargs: {{max_gen_toks: 3}}
  - name: {third}
"""


def _make_model(out: Path) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [f"Q: {a}+{b}= A: {a + b}\n" for a in range(10) for b in range(10)]
    corpus.append("The word is red blue green cat dog sun moon tree sea sky")
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    eos = "<|endoftext|>"
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=eos, eos_token=eos, unk_token=eos, pad_token=eos)
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(fast), n_positions=128, n_embd=32, n_layer=1, n_head=2,
                     bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(cfg).save_pretrained(out)
    fast.save_pretrained(out)
    return out


def _suite(folder: Path, *, version: str | None = None, third: str = "rt_group"):
    import lm_eval

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "gatekeeper.yaml"
    path.write_text(SUITE.format(version=version or lm_eval.__version__, third=third, tasks=TASKS))
    return load_suite(path)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return _make_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def suite(tmp_path_factory):
    return _suite(tmp_path_factory.mktemp("suite"))


@pytest.fixture(scope="session")
def run(tmp_path_factory, tiny_model, suite):
    out = tmp_path_factory.mktemp("out")
    lines: list[str] = []
    t0 = time.perf_counter()
    run_dir = runner.run_suite(suite, str(tiny_model), out, log=lines.append)
    return run_dir, lines, time.perf_counter() - t0


def test_run_writes_results_samples_and_manifest(run, suite) -> None:
    run_dir, lines, _ = run
    assert run_dir.parent.name.startswith("out") and run_dir.name.endswith("tiny")
    names = sorted(p.name for p in run_dir.iterdir())
    assert [n for n in names if n.startswith("results_")] and "gatekeeper-manifest.json" in names
    assert {n.split("_")[1] for n in names if n.startswith("samples_")} == {"rt"}  # rt_mc, rt_gen, rt_words
    assert len([n for n in names if n.startswith("samples_")]) == 3
    # No temp dirs or probes left beside the run.
    assert [p.name for p in run_dir.parent.iterdir()] == [run_dir.name]
    results = json.loads(next(run_dir.glob("results_*.json")).read_text())
    # Per-task overrides reached lm-eval: shots, limit and gen_kwargs differ per task.
    assert results["n-shot"]["rt_mc"] == 2 and results["n-shot"]["rt_gen"] == 0
    assert results["n-samples"]["rt_mc"] == {"original": 16, "effective": 10}
    assert results["n-samples"]["rt_gen"] == {"original": 16, "effective": 16}
    assert results["configs"]["rt_gen"]["generation_kwargs"]["max_gen_toks"] == 3
    assert results["group_subtasks"] == {"rt_group": ["rt_words"]}
    # The fields the CLI adds when it writes files are there too.
    for key in ("task_hashes", "model_name", "model_name_sanitized", "chat_template", "total_evaluation_time_seconds"):
        assert key in results
    assert set(results["task_hashes"]) == {"rt_mc", "rt_gen", "rt_words"}
    assert results["config"]["device"] == "cpu" and results["config"]["random_seed"] == 1234
    # Progress: the device line first, then one line per task with items done.
    assert lines[0].startswith("device: cpu")
    assert any("rt_mc: 10/16 items done" in line for line in lines)
    assert any("rt_gen: 16/16 items done" in line for line in lines)


def test_manifest_fields(run, suite, tiny_model) -> None:
    run_dir, _, wall = run
    man = json.loads((run_dir / "gatekeeper-manifest.json").read_text())
    weights = tiny_model / "model.safetensors"
    assert man["model_files"]["model.safetensors"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= set(man["model_files"])
    assert man["model"] == str(tiny_model) and man["model_path"] == str(tiny_model.resolve())
    assert man["suite_name"] == "rt" and man["suite_hash"] == suite.hash
    assert man["lm_eval_version"] == "0.4.13" and man["torch_version"].startswith("2.13.0")
    assert man["transformers_version"] and man["gatekeeper_version"]
    assert (man["dtype"], man["batch_size"], man["device"]) == ("float32", 8, "cpu")
    assert man["seeds"] == {"random": 1234, "numpy": 1234, "torch": 1234, "fewshot": 1234}
    assert man["hardware"]["cpu"] and man["hardware"]["gpu"] is None
    assert 0 < man["wall_seconds"] <= wall + 1
    assert man["start"] < man["end"] and man["start"].endswith("Z")
    assert isinstance(man["command"], list)
    assert set(man["samples_files"]) == {"rt_mc", "rt_gen", "rt_words"}


def test_run_loads_and_round_trips_through_the_store(run, suite, tmp_path) -> None:
    results_mod = pytest.importorskip("gatekeeper.results.reader")
    run_dir, _, _ = run
    loaded = results_mod.load_run(run_dir, cluster_keys=suite.cluster_keys(), snippets=False)
    assert loaded.provenance.suite_hash == suite.hash
    path = record_run(run_dir, suite, path=tmp_path / "rt.json.gz")
    back = store.load_baseline(path)
    check_suite_hash(back, suite)
    assert set(back.series) == set(loaded.series)
    for key, s in loaded.series.items():
        b = back.series[key]
        assert np.array_equal(s.doc_ids, b.doc_ids) and np.array_equal(s.values, b.values)
        assert [[h[:16] for h in row] for row in s.hashes.tolist()] == b.hashes.tolist()
        assert s.reported == b.reported and s.kind == b.kind
    mc = next(s for k, s in back.series.items() if k.task == "rt_mc")
    assert mc.clusters is not None and set(mc.clusters.tolist()) <= {"small", "large"}
    assert back.groups == loaded.groups and back.group_subtasks == loaded.group_subtasks


def test_second_run_is_identical_item_by_item(run, suite, tiny_model, tmp_path) -> None:
    results_mod = pytest.importorskip("gatekeeper.results.reader")
    run_dir, _, _ = run
    again = runner.run_suite(suite, str(tiny_model), tmp_path, log=lambda _: None)
    a = results_mod.load_run(run_dir, snippets=False)
    b = results_mod.load_run(again, snippets=False)
    assert set(a.series) == set(b.series)
    for key in a.series:
        assert np.array_equal(a.series[key].values, b.series[key].values), key
        assert np.array_equal(a.series[key].hashes, b.series[key].hashes), key


# ----------------------------------------------------------------------------- failures


def _broken_copy(tiny_model: Path, tmp_path: Path) -> Path:
    """A checkpoint whose weights cannot load: a test failing on it proves the model was never loaded."""
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model, broken)
    (broken / "model.safetensors").write_bytes(b"not weights")
    return broken


def _assert_nothing_written(out: Path) -> None:
    assert not out.exists() or list(out.iterdir()) == []


def test_unknown_task_fails_before_model_load(tiny_model, tmp_path) -> None:
    suite = _suite(tmp_path / "s", third="nope")
    out = tmp_path / "out"
    with pytest.raises(GateError) as err:
        runner.run_suite(suite, str(_broken_copy(tiny_model, tmp_path)), out, log=lambda _: None)
    assert str(err.value).startswith(f"{suite.path}:13: tasks[2].name: task 'nope' is not in include_path {TASKS} "
                                     "nor among lm-eval's ")
    assert str(err.value).endswith(" bundled tasks")  # nothing close to suggest
    _assert_nothing_written(out)


def test_missing_model_path(tmp_path, suite) -> None:
    out = tmp_path / "out"
    for model, pattern in [
        (str(tmp_path / "no_such_model"), "model path not found"),
        ("./checkpoints/base", "model path not found"),
        ("a/b/c", "model path not found"),
        (str(tmp_path), "model directory has no config.json"),
    ]:
        with pytest.raises(GateError, match=pattern):
            runner.run_suite(suite, model, out, log=lambda _: None)
    _assert_nothing_written(out)
    assert modelref.check_model("EleutherAI/pythia-14m", hub=False) is None  # a plausible hub id passes


def test_a_relative_model_path_with_a_typo_is_not_taken_for_a_hub_id(tmp_path, monkeypatch) -> None:
    """Issue #27: ``checkpoints/regresed`` where ``checkpoints/`` exists is a path not found (now,
    naming the folder it was resolved against), never a hub lookup; an existing relative folder
    is a local model from any working directory."""
    (tmp_path / "checkpoints" / "next").mkdir(parents=True)
    (tmp_path / "checkpoints" / "next" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(GateError, match=f"checkpoints/nxet: model path not found under {tmp_path}"):
        modelref.check_model("checkpoints/nxet")
    assert modelref.check_model("checkpoints/next") == Path("checkpoints/next")
    assert modelref.check_model("org/model", hub=False) is None  # no folder org/ here: a hub id


def test_wrong_lm_eval_version(tiny_model, tmp_path) -> None:
    suite = _suite(tmp_path / "s", version="0.4.99")
    out = tmp_path / "out"
    with pytest.raises(GateError, match=r"pins lm_eval_version '0.4.99' but lm-eval 0.4.13 is installed"):
        runner.run_suite(suite, str(tiny_model), out, log=lambda _: None)
    _assert_nothing_written(out)


def test_unwritable_output(tiny_model, tmp_path, suite) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a file where the output dir should be: fails even as root
    with pytest.raises(GateError, match="cannot create output directory"):
        runner.run_suite(suite, str(_broken_copy(tiny_model, tmp_path)), blocker / "out", log=lambda _: None)
    if os.geteuid() != 0:  # root ignores permission bits
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        with pytest.raises(GateError, match="not writable"):
            runner.run_suite(suite, str(tiny_model), ro, log=lambda _: None)


def test_existing_run_is_not_merged(run, suite, tiny_model) -> None:
    run_dir, _, _ = run
    before = sorted(p.name for p in run_dir.iterdir())
    with pytest.raises(GateError, match="already holds a run"):
        runner.run_suite(suite, str(tiny_model), run_dir.parent, log=lambda _: None)
    assert sorted(p.name for p in run_dir.iterdir()) == before


def test_bad_cli_values(suite, tiny_model, tmp_path) -> None:
    with pytest.raises(GateError, match="--limit: must be > 0"):
        runner.run_suite(suite, str(tiny_model), tmp_path / "o", limit=0, log=lambda _: None)
    with pytest.raises(GateError, match="--batch-size"):
        runner.run_suite(suite, str(tiny_model), tmp_path / "o", batch_size="big", log=lambda _: None)
    with pytest.raises(GateError, match="CUDA is not available"):
        import torch

        if torch.cuda.is_available():
            pytest.skip("CUDA present")
        runner.run_suite(suite, str(tiny_model), tmp_path / "o", device="cuda", log=lambda _: None)
    _assert_nothing_written(tmp_path / "o")
