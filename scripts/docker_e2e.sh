#!/usr/bin/env bash
# Build the action's image and run it end to end (tests/test_container.py), the way CI can.
# Needs root where no Docker daemon runs: shared/tools/offline-docker.sh starts one and builds a
# local python:3.11-slim stand-in (no container registry needed). Measured on 2 cores: dockerd
# ~1 min, stand-in base ~3.5 min, first image build 6-8 min (cached afterwards: ~25 s), the
# three action runs ~2 min.
set -euo pipefail
cd "$(dirname "$0")/.."
export TQDM_DISABLE=1
exec .venv/bin/python -m pytest -q -p no:cacheprovider -m docker -s tests/test_container.py "$@"
