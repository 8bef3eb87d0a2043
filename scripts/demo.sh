#!/usr/bin/env bash
# Set up (idempotent) and gate the bundled `regressed` demo checkpoint against the stored baseline
# on CPU. Prints the verdict and the markdown PR comment; exits 1 (a regression), as it should.
# Usage: bash scripts/demo.sh [regressed|harmless|base]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[eval]" 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true
export TQDM_DISABLE=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/gatekeeper gate --suite examples/gatekeeper.yaml \
  --model "examples/checkpoints/${1:-regressed}" --print-markdown --json out/demo-report.json
