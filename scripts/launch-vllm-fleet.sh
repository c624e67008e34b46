#!/usr/bin/env bash
# launch-vllm-fleet.sh — start one `vllm serve` per GPU with prefix caching and KV events, and
# write the matching kvgate config. It keeps running until Ctrl-C, then stops every server it
# started. (Needs GPUs and vLLM; it cannot run on the development machine.)
#
# Usage: scripts/launch-vllm-fleet.sh MODEL [extra `vllm serve` flags...]
#   e.g. scripts/launch-vllm-fleet.sh Qwen/Qwen3-8B --max-model-len 131072
#
# Env (defaults in brackets):
#   NUM_GPUS           servers to start, server i on GPU i [nvidia-smi -L | wc -l]
#   GPUS_PER_WORKER    GPUs per server (--tensor-parallel-size) [1]
#   HOST               address the gateway uses to reach the servers [127.0.0.1]
#   BASE_PORT          HTTP port of server 0, server i uses BASE_PORT+i [8101]
#   EVENTS_BASE_PORT   KV-event PUB port of server 0; server i uses EVENTS_BASE_PORT+10*i and
#                      replay +5 (room for data-parallel port offsets) [5557]
#   SERVED_MODEL_NAME  name clients send [MODEL]
#   BLOCK_SIZE         --block-size of vLLM and kvgate's block_size [16]
#   TOKENIZER_DIR      local folder with tokenizer.json for kvgate [MODEL if it is a folder, else
#                      downloaded with huggingface_hub (tokenizer files only)]
#   GATEWAY_LISTEN     kvgate listen address written into the config [0.0.0.0:8000]
#   GATEWAY_ADMIN_PORT port of kvgate's admin listener (/debug/*), bound to 127.0.0.1 [8001]
#   POLICY             kvgate router policy [kv]
#   CONFIG_OUT         kvgate config written here [kvgate-fleet.yaml]
#   LOG_DIR            vLLM logs [logs/vllm-fleet]
#   VLLM               vllm executable [vllm]
set -euo pipefail

[ $# -ge 1 ] || { sed -n '2,25p' "$0"; exit 2; }
MODEL="$1"
shift
VLLM="${VLLM:-vllm}"
command -v "$VLLM" >/dev/null || { echo "launch-vllm-fleet: $VLLM not found (pip install vllm)" >&2; exit 1; }
if [ -z "${NUM_GPUS:-}" ]; then
  NUM_GPUS="$(nvidia-smi -L 2>/dev/null | wc -l)"
fi
GPUS_PER_WORKER="${GPUS_PER_WORKER:-1}"
[ "$NUM_GPUS" -ge "$GPUS_PER_WORKER" ] || { echo "launch-vllm-fleet: no GPU found (set NUM_GPUS)" >&2; exit 1; }
WORKERS=$((NUM_GPUS / GPUS_PER_WORKER))
HOST="${HOST:-127.0.0.1}"
BASE_PORT="${BASE_PORT:-8101}"
EVENTS_BASE_PORT="${EVENTS_BASE_PORT:-5557}"
SERVED_MODEL_NAME="${SERVED_MODEL_NAME:-$MODEL}"
BLOCK_SIZE="${BLOCK_SIZE:-16}"
GATEWAY_LISTEN="${GATEWAY_LISTEN:-0.0.0.0:8000}"
POLICY="${POLICY:-kv}"
CONFIG_OUT="${CONFIG_OUT:-kvgate-fleet.yaml}"
LOG_DIR="${LOG_DIR:-logs/vllm-fleet}"
mkdir -p "$LOG_DIR"

if [ -z "${TOKENIZER_DIR:-}" ]; then
  if [ -d "$MODEL" ]; then
    TOKENIZER_DIR="$MODEL"
  else
    # kvgate tokenizes locally: fetch only the tokenizer and chat-template files of the model.
    TOKENIZER_DIR="$(python3 -c 'import sys
from huggingface_hub import snapshot_download
print(snapshot_download(sys.argv[1], allow_patterns=["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json", "special_tokens_map.json"]))' "$MODEL")"
  fi
fi

PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]:-}"; do [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]:-}"; do [ -n "$pid" ] && wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

{
  echo "# written by scripts/launch-vllm-fleet.sh for $MODEL on $WORKERS servers"
  echo "listen: $GATEWAY_LISTEN"
  echo "# /debug/* (routing and cache state) only on loopback; add admin_token to expose it further."
  echo "admin_listen: 127.0.0.1:${GATEWAY_ADMIN_PORT:-8001}"
  echo "model: \"$SERVED_MODEL_NAME\""
  echo "tokenizer: \"$TOKENIZER_DIR\""
  echo "block_size: $BLOCK_SIZE"
  echo "workers:"
} >"$CONFIG_OUT"

for i in $(seq 0 $((WORKERS - 1))); do
  port=$((BASE_PORT + i))
  pub=$((EVENTS_BASE_PORT + 10 * i))
  first=$((i * GPUS_PER_WORKER))
  gpus="$(seq -s, "$first" $((first + GPUS_PER_WORKER - 1)))"
  # Prefix caching must be on for KV events; --enable-prompt-tokens-details makes the usage
  # chunk carry prompt_tokens_details.cached_tokens (kvbench's and aiperf's cache metrics).
  events="{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:$pub\",\"replay_endpoint\":\"tcp://*:$((pub + 5))\",\"topic\":\"kv-events\"}"
  CUDA_VISIBLE_DEVICES="$gpus" "$VLLM" serve "$MODEL" \
    --host 0.0.0.0 --port "$port" \
    --served-model-name "$SERVED_MODEL_NAME" \
    --tensor-parallel-size "$GPUS_PER_WORKER" \
    --block-size "$BLOCK_SIZE" \
    --enable-prefix-caching \
    --enable-prompt-tokens-details \
    --kv-events-config "$events" \
    "$@" >"$LOG_DIR/worker-$i.log" 2>&1 &
  PIDS+=("$!")
  {
    echo "  - url: http://$HOST:$port"
    echo "    kv_events: tcp://$HOST:$pub"
    echo "    replay: tcp://$HOST:$((pub + 5))"
    echo "    dp_size: 1"
  } >>"$CONFIG_OUT"
  echo "launch-vllm-fleet: server $i on GPU $gpus: http://$HOST:$port, KV events tcp://$HOST:$pub (log $LOG_DIR/worker-$i.log)" >&2
done
{
  echo "router:"
  echo "  policy: $POLICY"
} >>"$CONFIG_OUT"

# Model loading takes minutes; wait for every /health, failing fast if a server exits.
for i in $(seq 0 $((WORKERS - 1))); do
  port=$((BASE_PORT + i))
  for _ in $(seq 1 1800); do
    curl -sf -o /dev/null "http://127.0.0.1:$port/health" && break
    kill -0 "${PIDS[$i]}" 2>/dev/null || { echo "launch-vllm-fleet: server $i exited; see $LOG_DIR/worker-$i.log" >&2; exit 1; }
    sleep 1
  done
done
echo "launch-vllm-fleet: $WORKERS servers ready. Start the gateway with:" >&2
echo "  kvgate serve --config $CONFIG_OUT" >&2
echo "launch-vllm-fleet: Ctrl-C stops the fleet." >&2
wait
