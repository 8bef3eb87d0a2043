#!/usr/bin/env bash
# Set up (idempotent) and gate the bundled `regressed` demo checkpoint against the stored baseline
# on CPU. Prints the verdict and the markdown PR comment; exits 1 (a regression), as it should.
# Usage: bash scripts/demo.sh [regressed|harmless|base]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
echo "== setup: .venv (pip install -e; log in .venv/logs/pip.log)"
mkdir -p .venv/logs
if ! .venv/bin/python -m pip install --disable-pip-version-check -e ".[eval]" >.venv/logs/pip.log 2>&1; then
  tail -n 40 .venv/logs/pip.log >&2
  echo "setup failed: pip install -e '.[eval]' (full log: .venv/logs/pip.log)" >&2
  exit 2
fi
export TQDM_DISABLE=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/gatekeeper gate --suite examples/gatekeeper.yaml \
  --model "examples/checkpoints/${1:-regressed}" --print-markdown --json out/demo-report.json
