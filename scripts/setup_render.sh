#!/usr/bin/env bash
# The real Mermaid renderer that tests/test_chart_render.py draws the history charts with:
# Debian's chromium (apt) driven by @mermaid-js/mermaid-cli (npm, into .venv/mermaid). Puppeteer's
# own Chrome download is skipped (PUPPETEER_SKIP_DOWNLOAD=1): only registries are reachable.
# Idempotent: nothing is installed when both are there. Where it cannot install (not root, no
# apt-get or npm) it says so and the test skips with that reason; under CI=true that is an error.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.venv/mermaid
mmdc_version=11.17.0
mmdc="$dest/node_modules/.bin/mmdc"
have_chromium() { command -v chromium >/dev/null 2>&1; }
if [ -x "$mmdc" ] && have_chromium; then
  echo "== render: chromium and mermaid-cli $mmdc_version ready"
  exit 0
fi
fail() {
  echo "== render: $1" >&2
  if [ "${CI:-}" = true ]; then exit 2; fi
  echo "== render: tests/test_chart_render.py will skip" >&2
  exit 0
}
if ! have_chromium; then
  { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; } || fail "chromium is missing (apt-get install chromium, as root)"
  echo "== render: apt-get install chromium (log: .venv/logs/apt.log)"
  mkdir -p .venv/logs
  # A timed-out earlier install can leave dpkg half-configured: finish it before adding more.
  { DEBIAN_FRONTEND=noninteractive dpkg --configure -a && apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >.venv/logs/apt.log 2>&1 \
    || fail "apt-get install chromium failed (see .venv/logs/apt.log)"
fi
if [ ! -x "$mmdc" ]; then
  command -v npm >/dev/null 2>&1 || fail "npm is missing (needed for @mermaid-js/mermaid-cli)"
  echo "== render: npm install @mermaid-js/mermaid-cli@$mmdc_version into $dest"
  mkdir -p "$dest" .venv/logs
  (cd "$dest" && PUPPETEER_SKIP_DOWNLOAD=1 npm install --no-audit --no-fund --silent \
    "@mermaid-js/mermaid-cli@$mmdc_version") >.venv/logs/npm.log 2>&1 || fail "npm install failed (see .venv/logs/npm.log)"
fi
echo "== render: ready"
