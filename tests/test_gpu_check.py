"""scripts/gpu_check.sh: argument handling, the commands it would run, and (slow) a real CPU run.

The CUDA path itself needs a GPU machine; here the script is proven with --dry-run, --device cpu
and the refusal when CUDA is missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gatekeeper.suite.suite import load_suite

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
SUITE = REPO / "examples" / "gatekeeper.yaml"


def gpu_check(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable)
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.mark.parametrize("args, message", [
    (["--device", "tpu"], "--device 'tpu': use cuda or cpu"),
    (["--reps", "0"], "--reps '0': a whole number"),
    (["--dtypes", "int8"], "'int8' is not bfloat16, float16 or float32"),
    (["--max-overhead", "two"], "--max-overhead 'two': a percentage"),
    (["--frobnicate"], "unknown argument '--frobnicate'"),
])
def test_bad_arguments_exit_2_with_one_line(args, message):
    result = gpu_check(*args)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


def test_help_prints_the_usage():
    result = gpu_check("--help")
    assert result.returncode == 2 and "--max-overhead PCT" in result.stderr and "#" not in result.stderr


def test_dry_run_times_the_same_suite_with_both_tools(tmp_path):
    result = gpu_check("--dry-run", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    runs = [ln for ln in lines if ln.startswith("would run: ") and " gatekeeper run " in ln]
    # Three checkpoints per dtype, on `auto` (the suite's device, which resolves to CUDA there).
    assert len(runs) == 6 and all("--device auto" in ln for ln in runs)
    assert sum("--dtype bfloat16" in ln for ln in runs) == 3 and sum("--dtype float32" in ln for ln in runs) == 3
    compares = [ln for ln in lines if " gatekeeper compare " in ln]
    assert len(compares) == 6 and sum("demo.json.gz" in ln for ln in compares) == 2  # float32 vs stored too
    (cli,) = [ln for ln in lines if ln.startswith("would time: ") and " lm_eval run " in ln]
    suite = load_suite(SUITE)
    seeds = ",".join(str(suite.seeds[k]) for k in ("random", "numpy", "torch", "fewshot"))
    for expected in (f"--tasks {','.join(suite.task_names)}", f"--batch_size {suite.model['batch_size']}",
                     f"dtype={suite.model['dtype']}", f"--include_path {suite.include_path}",
                     f"--seed {seeds}", "--device cuda", "--log_samples", "pretrained=examples/checkpoints/base"):
        assert expected in cli, (expected, cli)
    (gk,) = [ln for ln in lines if ln.startswith("would time: ") and " gatekeeper run " in ln]
    assert "--model examples/checkpoints/base" in gk and "--dtype" not in gk  # both at the suite's dtype


def test_refuses_cuda_where_there_is_none():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = gpu_check("--device", "cuda")
    assert result.returncode == 2
    assert "CUDA is not available" in result.stderr and result.stderr.count("\n") == 1


@pytest.mark.slow
@pytest.mark.lmeval
@pytest.mark.skipif(os.environ.get("GATEKEEPER_SLOW") != "1", reason="5 demo runs (~3 min on 2 CPUs); GATEKEEPER_SLOW=1")
def test_a_cpu_run_checks_the_verdicts_and_times_both_tools(tmp_path):
    result = gpu_check("--device", "cpu", "--dtypes", "float32", "--reps", "1", "--max-overhead", "100",
                       "--out", str(tmp_path), timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "ok    regressed vs base, float32: regression (exit 1)" in out
    assert "ok    harmless vs stored CPU baseline: pass (exit 0)" in out
    assert "overhead" in out and "gpu_check: all checks passed on cpu" in out
