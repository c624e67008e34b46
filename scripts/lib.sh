# lib.sh — shared helpers of the measurement scripts (source it after setting NAME).
# Every process a script starts is appended to PIDS and ended by cleanup, whatever happens.

die() { echo "$NAME: $*" >&2; exit 1; }
log() { echo "$NAME: $*" >&2; }

PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]:-}"; do [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]:-}"; do [ -n "$pid" ] && wait "$pid" 2>/dev/null || true; done
  PIDS=()
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM

# wait_http URL PID SECONDS: wait until URL answers 2xx; fail early if PID died.
wait_http() {
  local url="$1" pid="$2" n=$(( $3 * 10 ))
  while [ "$n" -gt 0 ]; do
    curl -sf -o /dev/null "$url" && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1; n=$((n - 1))
  done
  return 1
}

# wait_file FILE: wait up to 10 s for FILE to be non-empty.
wait_file() {
  local n=0
  while [ ! -s "$1" ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
}

# build_bins: the qwen3 tokenizer (MODEL_DIR) and, unless SKIP_BUILD=1, the three binaries in BIN.
build_bins() {
  [ -f "$MODEL_DIR/tokenizer.json" ] || scripts/fetch-tokenizers.sh qwen3
  mkdir -p "$OUT" "$BIN"
  if [ "${SKIP_BUILD:-0}" != 1 ]; then
    go build -o "$BIN/" ./cmd/kvgate ./cmd/vllm-sim ./cmd/kvbench
  fi
}

# start_fleet GATEWAY_ADDR [vllm-sim flags...]: two simulated workers on loopback (HTTP on
# BASE_PORT+1.., events on BASE_PORT+100..), 16,384 GPU blocks each, writing the kvgate config
# OUT/fleet.yaml (policy kv, gateway at GATEWAY_ADDR); returns once both answer /health.
start_fleet() {
  local gw="$1" fleet i
  shift
  rm -f "$OUT/fleet.yaml"
  "$BIN/vllm-sim" fleet --workers 2 --host 127.0.0.1 --base-port $((BASE_PORT + 1)) \
    --events-base-port $((BASE_PORT + 100)) --model "$MODEL_DIR" --served-model-name "$MODEL_NAME" \
    --num-gpu-blocks 16384 --max-model-len 262144 --gateway-listen "$gw" \
    --router-policy kv --config-out "$OUT/fleet.yaml" --log-level warn "$@" >"$OUT/fleet.log" 2>&1 &
  fleet=$!
  PIDS+=("$fleet")
  for i in 1 2; do
    wait_http "http://127.0.0.1:$((BASE_PORT + i))/health" "$fleet" 60 || die "worker $i did not start; see $OUT/fleet.log"
  done
  wait_file "$OUT/fleet.yaml"
}
