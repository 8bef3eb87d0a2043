#!/usr/bin/env bash
# Create .venv (once) and install gatekeeper (the distribution is named gatekeeper-eval on PyPI)
# into it with the given extras, e.g. `eval,dev`.
# Quiet on success; on failure prints the end of pip's log and exits 2.
# torch is pinned by the `eval` extra: an unpinned torch pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:?usage: scripts/setup.sh EXTRAS}
[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
echo "== setup: .venv with gatekeeper-eval[$extras] (log in .venv/logs/pip.log)"
mkdir -p .venv/logs
if ! .venv/bin/python -m pip install --disable-pip-version-check -e ".[$extras]" >.venv/logs/pip.log 2>&1; then
  tail -n 40 .venv/logs/pip.log >&2
  echo "setup failed: pip install -e '.[$extras]' (full log: .venv/logs/pip.log)" >&2
  exit 2
fi
