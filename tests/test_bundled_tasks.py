"""lm-eval's own bundled task definitions, the ones most suites use, through the whole gate.

Their YAMLs and ``utils.py`` are used unchanged (``!function`` doc_to_choice, process_docs,
process_results, includes, filters); only each task's dataset is pointed, with the suite's
``dataset:`` key, at a tiny local JSON-lines file with the same columns (the hub is unreachable
here). The demo's base checkpoint records a baseline, re-gates identical (every row
``unchanged``, exit 0: the ``<function … at 0x…>`` addresses lm-eval writes into the configs
change every run), and the regressed checkpoint gets the verdict its items give.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.demo_runs import OFFLINE_ENV, ROOT, lm_eval_installed

pytestmark = [pytest.mark.lmeval,
              pytest.mark.skipif(not lm_eval_installed(), reason="lm-eval is not installed")]

WORDS = ["red", "blue", "stone", "river", "cloud", "seven", "apple", "glass", "north", "quiet"]


def _w(i: int, k: int = 0) -> str:
    return WORDS[(i * 3 + k) % len(WORDS)]


def _rows(task: str, n: int = 8) -> list[dict]:
    out = []
    for i in range(n):
        a, b, c, d = (_w(i, k) for k in range(4))
        if task == "arc_easy":
            out.append({"id": f"q{i}", "question": f"Which is {a}?", "answerKey": "ABCD"[i % 4],
                        "choices": {"text": [a, b, c, d], "label": ["A", "B", "C", "D"]}})
        elif task == "hellaswag":
            out.append({"ind": i, "activity_label": f"Doing {a}", "ctx_a": f"A person holds the {b}.",
                        "ctx_b": f"then they {c}", "ctx": "", "endings": [a, b, c, d], "source_id": "s",
                        "split": "val", "split_type": "indomain", "label": str(i % 4)})
        elif task == "piqa":
            out.append({"goal": f"To make {a}", "sol1": f"use {b}", "sol2": f"use {c}", "label": i % 2})
        elif task == "winogrande":
            out.append({"sentence": f"The {a} was bigger than the {b} because _ was {c}.", "option1": a,
                        "option2": b, "answer": "12"[i % 2]})
        elif task == "boolq":
            out.append({"question": f"is the {a} {b}", "passage": f"The {a} is {b} and {c}.", "idx": i,
                        "label": i % 2})
        elif task.startswith("mmlu_"):
            out.append({"question": f"What is {a} of {b}?", "subject": task[5:], "choices": [a, b, c, d],
                        "answer": i % 4})
        elif task == "gsm8k":
            out.append({"question": f"Tom has {i} {a} and gets {i + 2} more. How many?",
                        "answer": f"{i} + {i + 2} = {2 * i + 2}\n#### {2 * i + 2}"})
        elif task == "lambada_openai":
            out.append({"text": f"the {a} walked to the {b} and saw a {c}"})
        elif task == "truthfulqa_mc2":
            targets = {"choices": [f"It is {a}.", f"It is {b}.", f"It is {c}."], "labels": [1, 1, 0]}
            out.append({"question": f"What is the {d}?", "mc1_targets": {"choices": targets["choices"],
                                                                         "labels": [1, 0, 0]},
                        "mc2_targets": targets})
    return out


# task -> the splits its YAML names (all given, so no split lm-eval asks for is missing)
SPLITS = {
    "arc_easy": ("train", "validation", "test"), "hellaswag": ("train", "validation"),
    "piqa": ("train", "validation"), "winogrande": ("train", "validation"), "boolq": ("train", "validation"),
    "mmlu_abstract_algebra": ("test", "dev"), "mmlu_anatomy": ("test", "dev"), "gsm8k": ("train", "test"),
    "lambada_openai": ("test",), "truthfulqa_mc2": ("validation",),
}


def _suite(folder: Path) -> Path:
    data = folder / "data"
    data.mkdir(parents=True)
    lines = ["name: bundled", 'lm_eval_version: "0.4.13"',
             "model: {backend: hf, dtype: float32, batch_size: 8, device: cpu}",
             "seeds: {random: 1234, numpy: 1234, torch: 1234, fewshot: 1234}",
             "policy: {alpha: 0.05, margin: 0.05}", "tasks:"]
    for task, splits in SPLITS.items():
        path = data / f"{task}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in _rows(task)))
        files = ", ".join(f"{s}: data/{task}.jsonl" for s in splits)
        lines += [f"  - name: {task}", "    num_fewshot: 0",
                  f"    dataset: {{path: json, name: null, kwargs: {{data_files: {{{files}}}}}}}"]
        if task == "gsm8k":  # the demo model holds 256 tokens; gsm8k's default is to generate 256
            lines.append("    gen_kwargs: {max_gen_toks: 16}")
    (folder / "gatekeeper.yaml").write_text("\n".join(lines) + "\n")
    return folder / "gatekeeper.yaml"


def _gate(suite: Path, model: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gatekeeper", "gate", "--suite", str(suite), "--model", model,
                           *extra], cwd=suite.parent, capture_output=True, text=True, timeout=900,
                          env={**os.environ, **OFFLINE_ENV, "PYTHONPATH": str(ROOT)})


def test_bundled_tasks_record_regate_unchanged_and_gate_the_regressed_model(tmp_path):
    suite = _suite(tmp_path)
    base, regressed = str(ROOT / "examples/checkpoints/base"), str(ROOT / "examples/checkpoints/regressed")
    first = _gate(suite, base, "--record-missing")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    again = _gate(suite, base, "--json", str(tmp_path / "again.json"))
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    report = json.loads((tmp_path / "again.json").read_text())
    assert {c["task"] for c in report["comparisons"]} == set(SPLITS)
    assert {c["verdict"] for c in report["comparisons"]} == {"unchanged"}, [
        (c["task"], c["metric"], c["verdict"]) for c in report["comparisons"] if c["verdict"] != "unchanged"]
    other = _gate(suite, regressed, "--json", str(tmp_path / "regressed.json"))
    assert other.returncode in (0, 1), other.stdout[-3000:] + other.stderr[-3000:]
    verdicts = json.loads((tmp_path / "regressed.json").read_text())
    assert other.returncode == (1 if verdicts["regressions"] else 0)  # as the items say
