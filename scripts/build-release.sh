#!/usr/bin/env bash
# build-release.sh — the release build of kvgate: the one build script the Dockerfile's build
# stage runs and `make test` runs too (make release-check), so the image's build step is tested
# without a container runtime.
#
# A stripped (-s -w), -trimpath, cgo binary (pebbe/zmq4 links libzmq) with its version stamped
# (kvgate version). Then scripts/check-ldd.sh on it: nothing beyond libzmq's own dependencies
# and libc.
#
# Usage: scripts/build-release.sh [OUT]   (default bin/release/kvgate)
#
# Env:
#   VERSION     [git describe --tags --always --dirty, else "dev"]
#   COMMIT      [git rev-parse HEAD, else "unknown"]
#   BUILD_DATE  [SOURCE_DATE_EPOCH as RFC 3339 if set, else now, UTC]
#   GO          [go]
# The Dockerfile passes VERSION and COMMIT as build arguments (.dockerignore leaves .git out).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${1:-bin/release/kvgate}"
GO="${GO:-go}"

git_ok() { command -v git >/dev/null && git rev-parse --git-dir >/dev/null 2>&1; }
if [ -z "${VERSION:-}" ]; then
  VERSION=dev
  git_ok && VERSION="$(git describe --tags --always --dirty 2>/dev/null || echo dev)"
fi
if [ -z "${COMMIT:-}" ]; then
  COMMIT=unknown
  git_ok && COMMIT="$(git rev-parse HEAD)"
fi
if [ -z "${BUILD_DATE:-}" ]; then
  if [ -n "${SOURCE_DATE_EPOCH:-}" ]; then
    BUILD_DATE="$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)"
  else
    BUILD_DATE="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  fi
fi
for v in "$VERSION" "$COMMIT" "$BUILD_DATE"; do
  [[ "$v" =~ ^[A-Za-z0-9._+:-]+$ ]] || { echo "build-release: refusing a stamp with spaces or quotes: $v" >&2; exit 1; }
done

pkg=github.com/kvgate/kvgate/internal/buildinfo
mkdir -p "$(dirname "$OUT")"
echo "build-release: kvgate $VERSION ($COMMIT, $BUILD_DATE) -> $OUT" >&2
# -buildvcs=false: the stamp above is the record (the image's build context has no .git).
CGO_ENABLED=1 "$GO" build -trimpath -buildvcs=false \
  -ldflags "-s -w -X $pkg.version=$VERSION -X $pkg.commit=$COMMIT -X $pkg.date=$BUILD_DATE" \
  -o "$OUT" ./cmd/kvgate

"$OUT" version >&2
scripts/check-ldd.sh "$OUT"
