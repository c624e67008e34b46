#!/usr/bin/env bash
# Start N simulated vLLM workers (one vllm-sim process) on consecutive ports with KV events,
# and write the matching kvgate config.
#
#   scripts/sim-fleet.sh N [extra vllm-sim flags...]
#
# Environment: BASE_PORT (8101), EVENTS_BASE_PORT (5557; worker i publishes on +10*i, replay
# on +10*i+5), CONFIG_OUT (configs/sim-fleet.yaml), MODEL_DIR (./models/qwen3 if present),
# SERVED_MODEL_NAME (Qwen/Qwen3-0.6B), VLLM_SIM (binary; default: go run ./cmd/vllm-sim).
# Runs in the foreground; Ctrl-C stops the fleet.
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-2}"
shift || true
model_dir="${MODEL_DIR:-}"
if [[ -z "$model_dir" && -f models/qwen3/tokenizer.json ]]; then
	model_dir=./models/qwen3
fi
args=(fleet --workers "$n"
	--base-port "${BASE_PORT:-8101}"
	--events-base-port "${EVENTS_BASE_PORT:-5557}"
	--config-out "${CONFIG_OUT:-configs/sim-fleet.yaml}"
	--served-model-name "${SERVED_MODEL_NAME:-Qwen/Qwen3-0.6B}")
if [[ -n "$model_dir" ]]; then
	args+=(--model "$model_dir")
fi
if [[ -n "${VLLM_SIM:-}" ]]; then
	exec "$VLLM_SIM" "${args[@]}" "$@"
fi
exec go run ./cmd/vllm-sim "${args[@]}" "$@"
