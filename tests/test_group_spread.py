"""A regression spread thinly over a group's subtasks, on real lm-eval runs (issue #24).

The demo's capitals task split by its ``region`` field into 10 subtasks of 20 items, joined in one
group (``acc`` weighted by size), as MMLU joins its subjects. The candidate is a real checkpoint:
the base demo checkpoint moved 30% of the way towards the regressed one, weight by weight, which
costs a few items in every region (at most 6 of 20 in one), the way quantization or a damaged
kernel costs a little everywhere. No region's drop is significant on its own after the correction
over the family; the group's pooled McNemar test over all 200 items is. The gate fails on the
group, and every subtask row stays inconclusive.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.demo_runs import OFFLINE_ENV, lm_eval_installed

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINTS = ROOT / "examples" / "checkpoints"
CAPITALS = ROOT / "examples" / "tasks" / "data" / "capitals.jsonl"
ENV = {**os.environ, **OFFLINE_ENV, "PYTHONPATH": str(ROOT)}
BLEND = 0.3  # how far towards the regressed checkpoint: measured, 27 items lost in 200, spread over all 10 regions

pytestmark = pytest.mark.skipif(not lm_eval_installed(), reason="lm-eval is not installed (pip install -e '.[eval]')")

SUBTASK = """\
task: capitals_{region}
custom_dataset: !function regions.load_{region}
test_split: test
output_type: multiple_choice
doc_to_text: "The capital of {{{{country}}}} is"
doc_to_choice: choices
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""

LOADER = """\
def load_{region}(**kwargs):
    return _load({region!r})

"""

SUITE = """\
name: regions
lm_eval_version: "0.4.13"
include_path: tasks
model: {backend: hf, dtype: float32, batch_size: 16, device: cpu}
seeds: {random: 1234, numpy: 1234, torch: 1234, fewshot: 1234}
policy: {alpha: 0.05, correction: holm, margin: 0.0}
tasks:
  - name: capitals_regions
    num_fewshot: 0
    metrics:
      - {metric: acc}
"""


def _regions() -> list[str]:
    rows = [json.loads(line) for line in CAPITALS.read_text().splitlines() if line.strip()]
    return sorted({row["region"] for row in rows})


def _write_tasks(tasks: Path) -> list[str]:
    regions = _regions()
    tasks.mkdir()
    loaders = ["import json\n", f"DATA = {str(CAPITALS)!r}\n\n",
               "def _load(region):\n    import datasets\n",
               "    rows = [json.loads(line) for line in open(DATA, encoding='utf-8') if line.strip()]\n",
               "    return {'test': datasets.Dataset.from_list([r for r in rows if r['region'] == region])}\n\n"]
    for region in regions:
        (tasks / f"capitals_{region}.yaml").write_text(SUBTASK.format(region=region))
        loaders.append(LOADER.format(region=region))
    (tasks / "regions.py").write_text("".join(loaders))
    group = ["group: capitals_regions", "task:", *(f"  - capitals_{r}" for r in regions),
             "aggregate_metric_list:", "  - metric: acc", "    aggregation: mean", "    weight_by_size: true",
             "metadata:", "  version: 1.0", ""]
    (tasks / "capitals_regions.yaml").write_text("\n".join(group))
    return regions


def _blend(target: Path, share: float) -> Path:
    """A checkpoint ``share`` of the way from base to regressed, every weight interpolated."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(CHECKPOINTS / "base", target)
    base = load_file(CHECKPOINTS / "base" / "model.safetensors")
    regressed = load_file(CHECKPOINTS / "regressed" / "model.safetensors")
    blended = {name: (w + share * (regressed[name] - w)).contiguous() for name, w in base.items()}
    save_file(blended, target / "model.safetensors", metadata={"format": "pt"})
    return target


def _gk(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gatekeeper", *args], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=900)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("spread")
    regions = _write_tasks(root / "tasks")
    (root / "gatekeeper.yaml").write_text(SUITE)
    blend = _blend(root / "blend", BLEND)
    for name, model in (("base", CHECKPOINTS / "base"), ("blend", blend)):
        proc = _gk("run", "--suite", "gatekeeper.yaml", "--model", str(model), "--out", f"runs/{name}", cwd=root)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return root, regions


def test_a_drop_spread_over_ten_subtasks_fails_the_group_and_no_subtask_alone(project) -> None:
    root, regions = project
    proc = _gk("compare", "runs/base", "runs/blend", "--suite", "gatekeeper.yaml", "--json", "r.json", cwd=root)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = json.loads((root / "r.json").read_text())
    rows = {c["task"]: c for c in report["comparisons"]}
    group = rows["capitals_regions"]
    assert group["kind"] == "group" and group["test"] == "mcnemar-midp" and group["verdict"] == "regressed"
    assert group["subtasks"] == [f"capitals_{r}" for r in regions]
    # lm-eval's own group score on both sides, and a drop no region shows significantly.
    for side in ("baseline", "candidate"):
        assert group[side] == pytest.approx(report["groups"]["capitals_regions"][side]["acc,none"], rel=1e-12)
    assert group["baseline"] - group["candidate"] > 0.05
    assert group["p_adjusted"] < 0.001
    subtasks = [rows[f"capitals_{r}"] for r in regions]
    assert all(s["gated"] for s in subtasks) and len(subtasks) == 10
    # The group row holds half of alpha; the regions share the other half among those whose few
    # flipped items can reach a share at all (Tarone, compare/family.py), and the group row's
    # share passes to them once it is rejected. Most regions could never fail alone.
    assert group["alpha_share"] == pytest.approx(0.5)
    assert sum(s["alpha_share"] for s in subtasks) == pytest.approx(0.5)
    assert sum(s["alpha_share"] == 0 for s in subtasks) >= 8
    assert all((s["verdict"] == "regressed") == (s["p_adjusted"] < 0.05) for s in subtasks)
    lost = [s["task"] for s in subtasks if s["candidate"] < s["baseline"]]
    assert len(lost) >= 8, lost  # spread: most regions lost something, none enough to fail alone
    assert all(s["p_adjusted"] >= group["p_adjusted"] for s in subtasks)
