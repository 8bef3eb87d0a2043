#!/usr/bin/env bash
# Create .venv (once) and install gatekeeper from this checkout into it (editable) with the given
# extras, e.g. `eval,dev`. gatekeeper is not on PyPI yet: the checkout is the package.
#
# Nothing is reinstalled when nothing changed: a hash of pyproject.toml, this script and the
# Python version, with the extras it installed, is kept in .venv/.gatekeeper-setup.
# Progress (pip's "Collecting ..." lines) goes to stdout; pip's whole output is appended to
# .venv/logs/pip.log. On failure: the end of that log, and exit 2.
#
# torch: the `eval` extra pins torch==2.13.0, and on Linux PyPI's wheel of it is the CUDA build
# (with ~17 nvidia-*/cuda-* packages, several GB). The demo and the tests run on the CPU, so the
# CPU build is installed first: from a local wheel where pip's configuration has one (no
# network), else from PyTorch's CPU index when it answers within 5 s, else PyPI's (said so).
# GATEKEEPER_TORCH=cuda takes PyPI's build on purpose (a GPU runner outside the container).
#
# The locked stack: every package requirements/runtime.txt pins (transformers, datasets, lm-eval,
# numpy, ...: what the action's image installs, and what the demo's baseline was recorded with)
# is installed at that version (pip's --constraint, from the file's name==version lines); the dev
# extras' own tools (pytest, ruff, ...) are resolved around them.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:?usage: scripts/setup.sh EXTRAS}
py=.venv/bin/python
log=.venv/logs/pip.log
stamp=.venv/.gatekeeper-setup
cpu_index=${GATEKEEPER_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}

[ -x "$py" ] || "${PYTHON:-python3}" -m venv .venv
mkdir -p .venv/logs
if [ -f "$log" ] && [ "$(wc -c <"$log")" -gt 5000000 ]; then mv -f "$log" "$log.1"; fi

state=$( { cat pyproject.toml scripts/setup.sh requirements/runtime.txt; "$py" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-16)

# Skip when a previous install with the same state covered these extras and still imports.
if [ -f "$stamp" ] && [ "$(head -n1 "$stamp")" = "$state" ]; then
  have=$(tail -n +2 "$stamp" | tr '\n' ',')
  missing=""
  for e in ${extras//,/ }; do case ",$have," in *",$e,"*) ;; *) missing="$missing $e" ;; esac; done
  if [ -z "$missing" ] && "$py" -c 'import gatekeeper' 2>/dev/null; then
    echo "== setup: .venv is up to date (gatekeeper[$extras]; delete .venv/.gatekeeper-setup to reinstall)"
    exit 0
  fi
fi

# pip, its output appended to the log, its progress lines shown; returns pip's exit status.
pip_step() {
  echo "=== $(date -u +%FT%TZ) pip $*" >>"$log"
  set +e
  "$py" -m pip "$1" --disable-pip-version-check --progress-bar off "${@:2}" 2>&1 | tee -a "$log" |
    awk '/^(Collecting|Installing collected|Successfully installed)/ { print "   " substr($0, 1, 110); fflush() }'
  local rc=${PIPESTATUS[0]}
  set -e
  return "$rc"
}

fail() {
  tail -n 40 "$log" >&2
  echo "setup failed: $1 (full log: $log)" >&2
  exit 2
}

torch_version() { "$py" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true; }

if [[ ",$extras," == *",eval,"* ]] && [[ "$(torch_version)" != 2.13.0* ]]; then
  if [ "${GATEKEEPER_TORCH:-cpu}" = cuda ]; then
    echo "== setup: torch 2.13.0 from PyPI (GATEKEEPER_TORCH=cuda: the CUDA build on Linux, several GB)"
  elif pip_step install --no-compile --no-index --no-deps torch==2.13.0 >/dev/null; then
    echo "== setup: torch $(torch_version) from a local wheel (pip's find-links)"
  elif [ "$(uname -s)" != Linux ]; then
    echo "== setup: torch 2.13.0 from PyPI (the CPU build on $(uname -s))"
  elif "$py" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/torch/", timeout=5)' "$cpu_index" 2>/dev/null; then
    echo "== setup: torch 2.13.0, CPU build, from $cpu_index (about 200 MB)"
    pip_step install --no-compile --no-deps --index-url "$cpu_index" "torch==2.13.0+cpu" || fail "torch==2.13.0+cpu from $cpu_index"
  else
    echo "== setup: warning: $cpu_index did not answer in 5 s; torch 2.13.0 will come from PyPI," \
      "which on Linux is the CUDA build (several GB). To avoid it, install the CPU wheel first" \
      "(pip install torch==2.13.0+cpu --index-url $cpu_index) and run this again."
  fi
fi

echo "== setup: .venv with gatekeeper[$extras] from this checkout, the locked versions of requirements/runtime.txt (pip's log: $log)"
constraints=.venv/constraints.txt
# pyarrow stays free: the dev extra's MLflow server (the test of --mlflow) needs pyarrow<26, and
# pyarrow holds the data, never a score.
grep -oE '^[A-Za-z0-9][A-Za-z0-9._-]*==[^ ;\\]+' requirements/runtime.txt | grep -v '^pyarrow==' >"$constraints"
pip_step install --no-compile --constraint "$constraints" -e ".[$extras]" || fail "pip install -e '.[$extras]' (constrained by requirements/runtime.txt)"
# No bytecode is compiled here (--no-compile): of the ~20,000 files pip installs, a gate run imports
# ~3,700, and Python writes their bytecode on first import (measured on 2 cores: compiling all of them
# took 47 s of an 88-s set-up; the first demo run's imports compile in ~15 s of CPU, once).
# scripts/demo.sh and scripts/test.sh write it even where PYTHONDONTWRITEBYTECODE is set.

if [ -f "$stamp" ] && [ "$(head -n1 "$stamp")" = "$state" ]; then
  { echo "$state"; { tail -n +2 "$stamp"; echo "${extras//,/$'\n'}"; } | sort -u; } >"$stamp.tmp"
else
  { echo "$state"; echo "${extras//,/$'\n'}" | sort -u; } >"$stamp.tmp"
fi
mv -f "$stamp.tmp" "$stamp"
echo "== setup: done"
