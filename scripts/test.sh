#!/usr/bin/env bash
# Set up (idempotent) and run gatekeeper's lints and tests. README's test command; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# torch is pinned: an unpinned torch pulls a multi-GB CUDA build.
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[eval,dev]" 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true
.venv/bin/python -m pip check >/dev/null 2>&1 || true
echo "== ruff"
.venv/bin/ruff check gatekeeper tests benchmarks scripts examples
echo "== pytest"
export TQDM_DISABLE=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
