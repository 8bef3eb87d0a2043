"""The shipped demo: checkpoints, tokenizer, task YAMLs, data and suite file are consistent.

Fast checks only; rebuilding the checkpoints (~2 min) runs only with GATEKEEPER_SLOW=1.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TASKS = EXAMPLES / "tasks"
CKPT = EXAMPLES / "checkpoints"
MODELS = ("base", "harmless", "regressed")
COUNTS = {"arith": 225, "capitals": 200, "synth_ppl": 100}
CKPT_FILES = ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
              "tokenizer_config.json")


class _TaskLoader(yaml.SafeLoader):
    """lm-eval's YAMLs use `!function module.fn`; keep the reference as a string."""


_TaskLoader.add_constructor("!function", lambda loader, node: f"!function {loader.construct_scalar(node)}")


def _task_yamls() -> dict[str, dict]:
    docs = {}
    for path in sorted(TASKS.glob("*.yaml")):
        doc = yaml.load(path.read_text(encoding="utf-8"), Loader=_TaskLoader)
        docs[doc.get("group") or doc["task"]] = doc
    return docs


def _rows(name: str) -> list[dict]:
    with open(TASKS / "data" / f"{name}.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def models() -> dict:
    transformers = pytest.importorskip("transformers")
    return {m: transformers.AutoModelForCausalLM.from_pretrained(CKPT / m).eval() for m in MODELS}


@pytest.fixture(scope="module")
def tokenizer():
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(CKPT / "base")


def test_checkpoint_files_exist_and_are_small() -> None:
    for m in MODELS:
        for f in CKPT_FILES:
            assert (CKPT / m / f).is_file(), f"{m}/{f} missing"
        assert 1_500_000 < (CKPT / m / "model.safetensors").stat().st_size < 3_000_000


def test_checkpoints_load_as_tiny_float32_gpt2(models: dict) -> None:
    import torch

    for m, model in models.items():
        n = sum(p.numel() for p in model.parameters())
        assert 400_000 < n < 600_000, (m, n)
        assert model.config.model_type == "gpt2" and model.config.n_layer == 2
        assert model.lm_head.weight is model.transformer.wte.weight  # tied embeddings
        assert all(p.dtype == torch.float32 for p in model.parameters())


def test_tokenizer_round_trips_task_text(tokenizer) -> None:
    assert tokenizer.eos_token == tokenizer.bos_token == tokenizer.pad_token == "<|endoftext|>"
    assert len(tokenizer) == 512
    texts = [_rows("arith")[17]["question"], "The capital of " + _rows("capitals")[3]["country"] + " is",
             _rows("synth_ppl")[0]["text"], "unseen Ünïcödé text 42"]
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
    # lm-eval encodes contexts without special tokens; the tokenizer must not add any either
    assert tokenizer.encode("Q: 1+1= A:") == tokenizer.encode("Q: 1+1= A:", add_special_tokens=False)


def test_three_checkpoints_differ_as_described(models: dict) -> None:
    import torch

    shas = {m: _sha(CKPT / m / "model.safetensors") for m in MODELS}
    assert len(set(shas.values())) == 3
    assert len({_sha(CKPT / m / "tokenizer.json") for m in MODELS}) == 1
    base = models["base"].state_dict()
    harmless, regressed = models["harmless"].state_dict(), models["regressed"].state_dict()
    for k, w in base.items():
        # harmless: a float16 round trip, so every weight moves by at most ~2^-11 relative
        assert torch.allclose(harmless[k], w, rtol=1e-3, atol=1e-6), k
    changed = [k for k, w in base.items() if not torch.equal(regressed[k], w)]
    assert set(changed) <= {"transformer.wte.weight", "lm_head.weight"} and changed
    rows = (regressed["transformer.wte.weight"] != base["transformer.wte.weight"]).any(dim=1)
    assert 0 < int(rows.sum()) < 50  # only some capital-name tokens were shuffled


def test_task_yamls_parse_and_name_the_demo_tasks() -> None:
    docs = _task_yamls()
    assert set(docs) == {"demo_arith_mc", "demo_capitals_mc", "demo_mc", "demo_arith_gen", "demo_synth_ppl"}
    assert docs["demo_mc"]["task"] == ["demo_arith_mc", "demo_capitals_mc"]
    assert docs["demo_arith_gen"]["output_type"] == "generate_until"
    assert [f["name"] for f in docs["demo_arith_gen"]["filter_list"]] == ["strict-match", "flexible-extract"]
    assert docs["demo_synth_ppl"]["output_type"] == "loglikelihood_rolling"
    for name, doc in docs.items():
        if "custom_dataset" in doc:
            fn = doc["custom_dataset"].removeprefix("!function loaders.")
            assert "dataset_path" not in doc, name  # relative data_files would depend on the CWD
            assert hasattr(_loaders(), fn), (name, fn)


def _loaders():
    spec = importlib.util.spec_from_file_location("demo_loaders", TASKS / "loaders.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_data_files_have_expected_counts_and_fields() -> None:
    for name, n in COUNTS.items():
        rows = _rows(name)
        assert len(rows) == n and [r["id"] for r in rows] == list(range(n))
    for r in _rows("arith") + _rows("capitals"):
        assert len(r["choices"]) == 4 and len(set(r["choices"])) == 4
        assert 0 <= r["label"] < 4
    assert all(r["choices"][r["label"]] == r["answer"] for r in _rows("arith"))
    caps = _rows("capitals")
    assert all(r["choices"][r["label"]] == r["capital"] for r in caps)
    assert len({r["region"] for r in caps}) == 10 and len({r["country"] for r in caps}) == 200


def test_loaders_work_from_another_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("datasets")
    monkeypatch.chdir(tmp_path)
    mod = _loaders()
    assert len(mod.load_arith()["test"]) == 225
    assert mod.load_capitals(pretrained="x")["test"][0]["region"]
    assert len(mod.load_synth_ppl()["test"]) == 100


def test_suite_file_loads_and_names_existing_tasks() -> None:
    from gatekeeper.suite.suite import load_suite

    suite = load_suite(EXAMPLES / "gatekeeper.yaml")
    assert suite.name == "demo" and suite.include_path == TASKS
    assert {t.name for t in suite.tasks} <= set(_task_yamls())
    gated = {(r.task, r.filter, r.metric) for r in suite.policy.rules if r.gate}
    assert gated == {("demo_mc", "none", "acc"), ("demo_arith_gen", "strict-match", "exact_match"),
                     ("demo_synth_ppl", "none", "word_perplexity")}


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("GATEKEEPER_SLOW") != "1", reason="rebuilds the demo (~2 min); GATEKEEPER_SLOW=1")
def test_script_rebuilds_byte_identical_output(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_demo_checkpoints.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for m in MODELS:
        for f in CKPT_FILES:
            assert _sha(tmp_path / "checkpoints" / m / f) == _sha(CKPT / m / f), f"{m}/{f}"
    for name in COUNTS:
        assert _sha(tmp_path / "tasks" / "data" / f"{name}.jsonl") == _sha(TASKS / "data" / f"{name}.jsonl")
