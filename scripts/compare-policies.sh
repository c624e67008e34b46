#!/usr/bin/env bash
# compare-policies.sh — replay one trace through kvgate once per routing policy, each time in
# front of a fresh simulated vLLM fleet (cold caches, same trace), and write the comparison.
#
# Usage: scripts/compare-policies.sh [TRACE]      (default: testdata/traces/trace_0291.json)
#
# Env (defaults in brackets):
#   POLICIES        variants to run, first = baseline of the ratios
#                   ["round_robin least_loaded kv kv+sessions"]; a variant is
#                   POLICY or LABEL=POLICY[:SESSION_HEADERS]; "kv+sessions" means policy kv with
#                   kvbench --session-headers both. Variants the gateway rejects are skipped.
#   GATEWAY_ARGS_<label>  extra `kvgate serve` flags for one variant, label with every character
#                   other than [A-Za-z0-9] as _ (e.g. GATEWAY_ARGS_kv_sessions="--flag v")
#   GATEWAY_ARGS    extra `kvgate serve` flags for every variant
#   KV_NO_SESSIONS_ARGS  default GATEWAY_ARGS_kv: kvgate flags that turn session affinity and
#                   parent-aware placement off, so "kv" measures KV-aware routing alone
#   OUT             output directory [out/compare-<UTC time>]
#   WORKERS         simulated workers [4]
#   MODEL_DIR       tokenizer folder of the served model [models/qwen3]
#   MODEL_NAME      served model name [qwen3]
#   BLOCK_SIZE      KV block size of workers and gateway [16]
#   SPEEDUP         vllm-sim --speedup (simulated time / wall time) [10]
#   NUM_GPU_BLOCKS  KV blocks per simulated worker [16384]
#   MAX_MODEL_LEN   [262144] (agentic traces reach 100k+ tokens)
#   TIME_SCALE      kvbench --time-scale [0.02]
#   KVBENCH_ARGS    extra kvbench run flags (e.g. "--max-requests 200 --repeat 4")
#   BASE_PORT       first port used; workers take BASE_PORT+1.., gateway BASE_PORT, KV events
#                   BASE_PORT+100.. [18000 + 40*(PID mod 50)]
#   BIN             where the binaries are built [OUT/bin]; SKIP_BUILD=1 uses existing ones
#   QUIET=1         no progress bars
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TRACE="${1:-testdata/traces/trace_0291.json}"
POLICIES="${POLICIES:-round_robin least_loaded kv kv+sessions}"
OUT="${OUT:-out/compare-$(date -u +%Y%m%dT%H%M%SZ)}"
WORKERS="${WORKERS:-4}"
MODEL_DIR="${MODEL_DIR:-models/qwen3}"
MODEL_NAME="${MODEL_NAME:-qwen3}"
BLOCK_SIZE="${BLOCK_SIZE:-16}"
SPEEDUP="${SPEEDUP:-10}"
NUM_GPU_BLOCKS="${NUM_GPU_BLOCKS:-16384}"
MAX_MODEL_LEN="${MAX_MODEL_LEN:-262144}"
TIME_SCALE="${TIME_SCALE:-0.02}"
KVBENCH_ARGS="${KVBENCH_ARGS:-}"
BASE_PORT="${BASE_PORT:-$((18000 + 40 * ($$ % 50)))}"
BIN="${BIN:-$OUT/bin}"
KV_NO_SESSIONS_ARGS="${KV_NO_SESSIONS_ARGS:---sessions-affinity-blocks 0 --sessions-parent-aware=false --sessions-parent-blocks 0 --sessions-sibling-prefix=false}"

die() { echo "compare-policies: $*" >&2; exit 1; }
log() { echo "compare-policies: $*" >&2; }

[ -e "$TRACE" ] || die "trace $TRACE not found"
[ -f "$MODEL_DIR/tokenizer.json" ] || die "$MODEL_DIR/tokenizer.json missing: run scripts/fetch-tokenizers.sh"
command -v curl >/dev/null || die "curl is required"
mkdir -p "$OUT" "$BIN"

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  log "building kvgate, vllm-sim, kvbench into $BIN"
  go build -o "$BIN/kvgate" ./cmd/kvgate
  go build -o "$BIN/vllm-sim" ./cmd/vllm-sim
  go build -o "$BIN/kvbench" ./cmd/kvbench
fi

# Every process this script starts is recorded here and ended by cleanup, whatever happens.
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]:-}"; do
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]:-}"; do
    [ -n "$pid" ] && wait "$pid" 2>/dev/null || true
  done
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
    sleep 0.1
    n=$((n - 1))
  done
  return 1
}

# stop_pid PID: end one process we started and forget it.
stop_pid() {
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  local keep=() p
  for p in "${PIDS[@]:-}"; do [ "$p" != "$1" ] && keep+=("$p"); done
  PIDS=("${keep[@]:-}")
}

GW_PORT="$BASE_PORT"
RUNS=()
for variant in $POLICIES; do
  label="${variant%%=*}"
  spec="${variant#*=}"
  [ "$variant" = "$label" ] && spec="$variant"
  policy="${spec%%:*}"
  headers="none"
  [ "$spec" != "$policy" ] && headers="${spec#*:}"
  if [ "$spec" = "kv+sessions" ]; then policy="kv"; headers="both"; fi
  dir="$OUT/$label"
  var="GATEWAY_ARGS_$(printf '%s' "$label" | tr -c 'A-Za-z0-9' '_')"
  # Plain "kv" is KV-aware routing alone: session affinity and parent-aware placement off.
  # "kv+sessions" keeps kvgate's session defaults and sends the session and parent headers.
  default_args=""
  [ "$label" = kv ] && default_args="$KV_NO_SESSIONS_ARGS"
  gwargs="${GATEWAY_ARGS:-} ${!var-$default_args}"
  mkdir -p "$dir"

  log "[$label] starting $WORKERS simulated workers (policy $policy, session headers $headers)"
  rm -f "$dir/fleet.yaml"
  "$BIN/vllm-sim" fleet --workers "$WORKERS" --base-port $((BASE_PORT + 1)) \
    --events-base-port $((BASE_PORT + 100)) --model "$MODEL_DIR" --served-model-name "$MODEL_NAME" \
    --block-size "$BLOCK_SIZE" --num-gpu-blocks "$NUM_GPU_BLOCKS" --max-model-len "$MAX_MODEL_LEN" \
    --speedup "$SPEEDUP" --gateway-listen "127.0.0.1:$GW_PORT" --router-policy "$policy" \
    --config-out "$dir/fleet.yaml" --log-level warn >"$dir/fleet.log" 2>&1 &
  fleet=$!
  PIDS+=("$fleet")
  for i in $(seq 1 "$WORKERS"); do
    wait_http "http://127.0.0.1:$((BASE_PORT + i))/health" "$fleet" 60 || die "[$label] worker $i did not start; see $dir/fleet.log"
  done
  n=0
  while [ ! -s "$dir/fleet.yaml" ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done

  # shellcheck disable=SC2086 # gwargs is a list of flags
  "$BIN/kvgate" serve --config "$dir/fleet.yaml" --router-policy "$policy" --proxy-expose-routing-headers --log-level warn $gwargs >"$dir/kvgate.log" 2>&1 &
  gw=$!
  PIDS+=("$gw")
  if ! wait_http "http://127.0.0.1:$GW_PORT/health" "$gw" 60; then
    if ! kill -0 "$gw" 2>/dev/null; then
      log "[$label] kvgate rejects policy '$policy' $gwargs, skipped: $(tail -n 2 "$dir/kvgate.log" | tr '\n' ' ')"
      stop_pid "$fleet"
      rm -rf "$dir"
      continue
    fi
    die "[$label] kvgate did not become healthy; see $dir/kvgate.log"
  fi

  quiet=()
  [ "${QUIET:-0}" = 1 ] && quiet=(--quiet)
  # kvbench runs in the background and the script waits for it: bash runs a trap only between
  # commands, and `wait` is interruptible where a foreground command is not.
  # shellcheck disable=SC2086 # KVBENCH_ARGS is a list of flags
  "$BIN/kvbench" run --url "http://127.0.0.1:$GW_PORT" --model "$MODEL_NAME" --tokenizer "$MODEL_DIR" \
    --trace "$TRACE" --time-scale "$TIME_SCALE" --session-headers "$headers" --policy "$policy" \
    --label "$label" --out "$dir" "${quiet[@]}" $KVBENCH_ARGS >"$dir/kvbench.txt" &
  kb=$!
  PIDS+=("$kb")
  wait "$kb" || die "[$label] kvbench failed; see $dir/kvbench.txt"
  RUNS+=("$dir/profile_export_kvbench.json")
  stop_pid "$gw"
  stop_pid "$fleet"
done

[ "${#RUNS[@]}" -gt 0 ] || die "no policy ran"
"$BIN/kvbench" compare --title "kvgate routing policies on $(basename "$TRACE")" \
  --html "$OUT/report.html" --png "$OUT/report.png" "${RUNS[@]}" | tee "$OUT/comparison.txt"
echo "comparison: $OUT/comparison.txt"
echo "HTML report: $OUT/report.html"
echo "headline chart: $OUT/report.png"
