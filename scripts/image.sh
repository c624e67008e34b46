#!/usr/bin/env bash
# image.sh — build kvgate's container image from the Dockerfile with docker or podman
# (`make image`). The version and commit come from git and are passed as build arguments (the
# build context leaves .git out).
#
# Env: IMAGE [kvgate:VERSION], CONTAINER_RUNTIME [docker, else podman], VERSION, COMMIT,
#      BUILD_DATE (as scripts/build-release.sh), IMAGE_ARGS (extra build flags, e.g. --platform)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

rt="${CONTAINER_RUNTIME:-}"
if [ -z "$rt" ]; then
  for c in docker podman; do command -v "$c" >/dev/null && { rt="$c"; break; }; done
fi
if [ -z "$rt" ]; then
  echo "make image: no container runtime (docker or podman) on this machine; install one, or" \
    "build the binary alone with scripts/build-release.sh" >&2
  exit 1
fi
if ! "$rt" info >/dev/null 2>&1; then
  echo "make image: $rt is installed but cannot reach its engine ($rt info fails: is the daemon" \
    "running and this user allowed to use it?); the binary alone: scripts/build-release.sh" >&2
  exit 1
fi

git_ok() { command -v git >/dev/null && git rev-parse --git-dir >/dev/null 2>&1; }
VERSION="${VERSION:-$(git_ok && git describe --tags --always --dirty 2>/dev/null || echo dev)}"
COMMIT="${COMMIT:-$(git_ok && git rev-parse HEAD || echo unknown)}"
BUILD_DATE="${BUILD_DATE:-$(date -u +%Y-%m-%dT%H:%M:%SZ)}"
IMAGE="${IMAGE:-kvgate:$VERSION}"
echo "make image: $rt build -t $IMAGE (kvgate $VERSION, $COMMIT)" >&2
# shellcheck disable=SC2086 # IMAGE_ARGS is a list of flags
"$rt" build -t "$IMAGE" --build-arg VERSION="$VERSION" --build-arg COMMIT="$COMMIT" \
  --build-arg BUILD_DATE="$BUILD_DATE" ${IMAGE_ARGS:-} -f Dockerfile .
"$rt" run --rm "$IMAGE" version
"$rt" image ls "$IMAGE"
