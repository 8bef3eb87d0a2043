#!/usr/bin/env bash
# Set up (idempotent) and gate a bundled demo checkpoint against the stored baseline on CPU.
# Prints the verdict and the markdown PR comment. `regressed` (the default) exits 1, as it
# should; `harmless` and `base` exit 0.
# Usage: bash scripts/demo.sh [regressed|harmless|base]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh eval
# The set-up compiles no bytecode: the first run writes it for what it imports (~15 s, once), even
# where PYTHONDONTWRITEBYTECODE is set (.venv and the checkout's __pycache__ folders are git-ignored).
unset PYTHONDONTWRITEBYTECODE
export TQDM_DISABLE=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# --no-history: the demo leaves the example's baseline folder as it is (a real gate appends to it).
exec .venv/bin/gatekeeper gate --suite examples/gatekeeper.yaml \
  --model "examples/checkpoints/${1:-regressed}" --print-markdown --json out/demo-report.json --no-history
