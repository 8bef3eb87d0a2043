#!/usr/bin/env bash
# Point action.yml at a prebuilt image instead of the Dockerfile:
#
#   bash docker/pin-action-image.sh ghcr.io/OWNER/gatekeeper@sha256:DIGEST [action.yml]
#
# rewrites `image: Dockerfile` to `image: docker://ghcr.io/OWNER/gatekeeper@sha256:DIGEST`. The
# release workflow (.github/workflows/release.yml) runs it on the commit it tags as the published
# release, so jobs that use the action pull the image instead of building it. The repository's own
# action.yml keeps building the Dockerfile. Fails (exit 2) unless exactly that one line changed.
set -euo pipefail
ref=${1:?usage: docker/pin-action-image.sh IMAGE@sha256:DIGEST [action.yml]}
file=${2:-action.yml}
# A digest, not a tag: a tag can be pushed again, and the action must run what was released.
if ! [[ $ref =~ ^[a-z0-9.-]+(:[0-9]+)?/[a-z0-9._/-]+@sha256:[0-9a-f]{64}$ ]]; then
  echo "$ref: not an image reference pinned by digest (registry/owner/name@sha256:<64 hex>); pass the digest build-push-action printed" >&2
  exit 2
fi
if [ "$(grep -cx '  image: Dockerfile' "$file")" != 1 ]; then
  echo "$file: no single line '  image: Dockerfile' under runs:; is it already pinned?" >&2
  exit 2
fi
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
sed "s|^  image: Dockerfile\$|  image: docker://$ref|" "$file" >"$tmp"
if [ "$(diff "$file" "$tmp" | grep -c '^[<>]')" != 2 ]; then
  echo "$file: rewriting the image line changed more than that line; fix the file by hand" >&2
  exit 2
fi
cat "$tmp" >"$file"
echo "$file: runs.image is docker://$ref"
