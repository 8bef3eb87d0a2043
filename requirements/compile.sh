#!/usr/bin/env bash
# Recompile requirements/runtime.txt, the hash-locked runtime of the Docker image, from the
# dependencies pyproject.toml declares (the base list plus the `eval` and `mlflow` extras).
#
#   bash requirements/compile.sh            re-resolve, keeping the pins that still fit
#   bash requirements/compile.sh --upgrade  take the newest versions pyproject allows
#
# The target is the image's platform (CPython 3.11, Linux x86_64), whatever machine runs this.
# torch and the CUDA libraries it pins exactly (nvidia-*, cuda-*, triton) are resolved with the
# rest, so every locked version fits them, but left out of the file: the Dockerfile installs
# torch==2.13.0 in its own layer (PyPI's Linux wheel is the CUDA build, several GB; a test build
# may preinstall a CPU wheel instead). Needs network access to PyPI; installs uv into a scratch
# venv if it is not on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=0.13.9
uv=$(command -v uv || true)
if [ -z "$uv" ]; then
  venv=${TMPDIR:-/tmp}/gatekeeper-uv-$UV_VERSION
  [ -x "$venv/bin/uv" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q "uv==$UV_VERSION"; }
  uv=$venv/bin/uv
fi
excluded=(torch triton cuda-bindings cuda-pathfinder cuda-toolkit)
resolved=$(mktemp)
trap 'rm -f "$resolved"' EXIT
# First pass: which nvidia-* packages does this torch pull in? (They change with torch's version.)
"$uv" pip compile pyproject.toml --extra eval --extra mlflow --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
  --no-header --no-annotate -q -o "$resolved" "$@"
while read -r name; do excluded+=("$name"); done < <(grep -oE '^nvidia-[a-z0-9-]+' "$resolved")
args=()
for name in "${excluded[@]}"; do args+=(--no-emit-package "$name"); done
"$uv" pip compile pyproject.toml --extra eval --extra mlflow --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
  --generate-hashes "${args[@]}" --custom-compile-command "bash requirements/compile.sh" \
  -q -o requirements/runtime.txt "$@"
echo "requirements/runtime.txt: $(grep -cE '^[a-z0-9]' requirements/runtime.txt) packages locked"
