#!/usr/bin/env bash
# Set up (idempotent) and run gatekeeper's lints and tests. README's test command; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."
# chromium + mermaid-cli for the chart test install beside pip (both mostly wait on downloads:
# ~30 s saved on a fresh clone); their lines are shown after pip's.
render_log=$(mktemp)
bash scripts/setup_render.sh >"$render_log" 2>&1 &
render=$!
# If pip fails, the render set-up still ends before this does (no half-done npm or apt install).
trap 'wait "$render" 2>/dev/null; rm -f "$render_log"' EXIT
bash scripts/setup.sh eval,dev
rc=0
wait "$render" || rc=$?
cat "$render_log"
rm -f "$render_log"
trap - EXIT
[ "$rc" = 0 ] || exit "$rc"
echo "== ruff"
.venv/bin/ruff check gatekeeper tests benchmarks scripts examples
echo "== pytest"
# Bytecode is written on first import, even where PYTHONDONTWRITEBYTECODE is set (as on the 2-core
# machine CI was measured on): the tests start hundreds of processes that import the same modules,
# and the set-up compiles none (scripts/setup.sh says why).
unset PYTHONDONTWRITEBYTECODE
export TQDM_DISABLE=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# One thread each for torch and BLAS in every worker: more oversubscribes the cores and OpenMP
# threads spin while they wait (measured: a demo run beside another used 14.8 s of CPU with 2
# threads, 11.5 s with 1, and was 10% slower). Set OMP_NUM_THREADS to override.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
# Each worker imports torch, transformers and lm-eval once, in a server whose forked children run
# the tests' `python -m gatekeeper ...` subprocesses (tests/warm_start.py; a line in
# .venv/.../zz_gatekeeper_test_warm.pth, inert outside a test run). GATEKEEPER_TEST_COLD=1 starts
# every subprocess cold instead.
# -rfEs: a failed or erroring test is named at the end, a skipped one says why (only the container
# test may skip: no Docker daemon to be had).
# -n (cores + 1) --dist loadfile: each test file on one worker (its module fixtures evaluate the
# demo once). One worker more than cores: a worker often waits (the container's build, pip in the
# fresh clone, loopback servers starting), and the third keeps both cores of a 2-core machine busy
# (measured on 2 cores: 110 s of idle core time with 2 workers, 5 s with 3; 601 s to 569 s).
# GATEKEEPER_TEST_WORKERS overrides; at most 8 (each worker holds a warm import of torch, ~1 GB).
# The fresh clone and the container start first, then xdist's order, files with most tests first
# (tests/conftest.py FIRST_FILES; in xdist's order the fresh clone ran last, alone);
# --durations 25: the slowest tests, every run (tests/conftest.py holds the CPU budget).
cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
workers=${GATEKEEPER_TEST_WORKERS:-$(( cores + 1 > 8 ? 8 : cores + 1 ))}
exec .venv/bin/python -m pytest -q -rfEs -p no:cacheprovider -n "$workers" --dist loadfile --durations=25 "$@"
