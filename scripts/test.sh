#!/usr/bin/env bash
# Set up (idempotent) and run gatekeeper's lints and tests. README's test command; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# torch is pinned: an unpinned torch pulls a multi-GB CUDA build.
echo "== setup: .venv (pip install -e; log in .venv/logs/pip.log)"
mkdir -p .venv/logs
if ! .venv/bin/python -m pip install --disable-pip-version-check -e ".[eval,dev]" >.venv/logs/pip.log 2>&1; then
  tail -n 40 .venv/logs/pip.log >&2
  echo "setup failed: pip install -e '.[eval,dev]' (full log: .venv/logs/pip.log)" >&2
  exit 2
fi
echo "== ruff"
.venv/bin/ruff check gatekeeper tests benchmarks scripts examples
echo "== pytest"
export TQDM_DISABLE=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
