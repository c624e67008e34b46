#!/usr/bin/env bash
# overload-scenarios.sh — issue 33's two-client measurements: a light client alone, then the
# same light client while a heavy one floods the fleet, each phase through one kvgate in front
# of a fresh simulated fleet at real speed; the light client's TTFT percentile in the flood
# against its own alone is the result.
#
# Usage: scripts/overload-scenarios.sh tenants|priority
#   tenants   two tenants of equal weight named by x-gateway-inference-fairness-id (light,
#             heavy); the light one's p99 TTFT with the flood against alone, and every request's
#             age (TTFT, or time to its 429/503) and its oldest served first token (200s only)
#             against flow_control.queue_timeout; the report
#             also counts the flood phase's requests the gateway answered itself, by reason
#   priority  the heavy client at priority 0, the light one asks x-kvgate-priority: 1; the light
#             one's p90 TTFT on the saturated fleet against on the idle one
#
# The clients replay the four Claude Code traces of testdata/traces together at TIME_SCALE, as
# LIGHT_USERS and HEAVY_USERS independent users (kvbench --repeat; the heavy client's users are
# numbered after the light one's, --repeat-first, so the two never share a prompt).
#
# Env (defaults in brackets):
#   LIGHT_USERS, HEAVY_USERS   [1, 5]
#   TIME_SCALE      kvbench --time-scale [0.05]
#   VARIANTS        gateway variants, each LABEL=FLAGS with FLAGS comma-separated kvgate serve
#                   flags ["kv+queue=--flow-control-enabled"]; e.g. add
#                   "kv=--flow-control-enabled=false" for kv without the queue (on by default), or
#                   "kv+queue-unprotected=--flow-control-protect-cache=false" for the queue without
#                   cache protection (on by default). A flag written sim:FLAG goes to that variant's vllm-sim fleet
#                   instead, e.g. vLLM's priority scheduling on the workers with the priority
#                   forwarded to them: "kv+queue+vllmprio=--flow-control-enabled,
#                   --proxy-forward-priority,sim:--scheduling-policy=priority" (no spaces)
#   REPEATS         runs of each phase [2]
#   TOGETHER=1      run every phase, variant and repeat at the same time (each on its own fleet
#                   and ports) instead of the alone phases first, then the flood phases [0]
#   QUEUE_TIMEOUT   flow_control.queue_timeout the report compares ages with [30s: the default]
#   KVBENCH_ARGS    extra kvbench run flags ["--max-output-tokens 64"]
#   OUT             [out/<scenario>-<UTC time>]: OUT/<variant>/run<N>/{alone,flood}/{light,heavy}/
#                   and OUT/report.md
#   plus WORKERS [4], SPEEDUP [1], SIM_ARGS, GATEWAY_ARGS (every variant), MODEL_DIR,
#   NUM_GPU_BLOCKS, MAX_MODEL_LEN, BASE_PORT, BIN, SKIP_BUILD=1
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SCENARIO="${1:-}"
LIGHT_USERS="${LIGHT_USERS:-1}"
HEAVY_USERS="${HEAVY_USERS:-5}"
TIME_SCALE="${TIME_SCALE:-0.05}"
VARIANTS="${VARIANTS:-kv+queue=--flow-control-enabled}"
REPEATS="${REPEATS:-2}"
TOGETHER="${TOGETHER:-0}"
QUEUE_TIMEOUT="${QUEUE_TIMEOUT:-30s}"
KVBENCH_ARGS="${KVBENCH_ARGS:---max-output-tokens 64}"
OUT="${OUT:-out/$SCENARIO-$(date -u +%Y%m%dT%H%M%SZ)}"
WORKERS="${WORKERS:-4}"
MODEL_DIR="${MODEL_DIR:-models/qwen3}"
MODEL_NAME="${MODEL_NAME:-qwen3}"
BLOCK_SIZE="${BLOCK_SIZE:-16}"
SPEEDUP="${SPEEDUP:-1}"
NUM_GPU_BLOCKS="${NUM_GPU_BLOCKS:-16384}"
MAX_MODEL_LEN="${MAX_MODEL_LEN:-262144}"
BASE_PORT="${BASE_PORT:-$((24000 + 40 * ($$ % 50)))}"
BIN="${BIN:-$OUT/bin}"

NAME=overload-scenarios
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

case "$SCENARIO" in
  tenants)
    LIGHT_HDR="x-gateway-inference-fairness-id: light"
    HEAVY_HDR="x-gateway-inference-fairness-id: heavy"
    PCT=p99
    ;;
  priority)
    LIGHT_HDR="x-kvgate-priority: 1"
    HEAVY_HDR="x-kvgate-priority: 0"
    PCT=p90
    ;;
  *) die "usage: scripts/overload-scenarios.sh tenants|priority" ;;
esac
command -v jq >/dev/null || die "jq is required"
mkdir -p "$OUT/traces"
for t in testdata/traces/trace_0*.json; do
  ln -sf "$ROOT/$t" "$OUT/traces/$(basename "$t")"
done
TRACE="$OUT/traces"
log "building kvgate, vllm-sim, kvbench into $BIN"
build_bins
warn_speedup "$SPEEDUP"

# client DIR USERS FIRST HEADER: one kvbench run of the traces into DIR against the gateway on
# BASE_PORT, in the background (its pid in CLIENT).
client() {
  local quiet=()
  mkdir -p "$1"
  [ "${QUIET:-1}" = 1 ] && quiet=(--quiet)
  # shellcheck disable=SC2086 # KVBENCH_ARGS is a list of flags
  "$BIN/kvbench" run --url "http://127.0.0.1:$BASE_PORT" --model "$MODEL_NAME" --tokenizer "$MODEL_DIR" \
    --trace "$TRACE" --time-scale "$TIME_SCALE" --session-headers both --policy kv --label "$(basename "$1")" \
    --out "$1" --repeat "$2" --repeat-first "$3" -H "$4" "${quiet[@]}" \
    --capacity-tokens "$((WORKERS * NUM_GPU_BLOCKS * BLOCK_SIZE))" $KVBENCH_ARGS >"$1/kvbench.txt" 2>&1 &
  CLIENT=$!
  PIDS+=("$CLIENT")
}

# phase DIR FLAGS WITH_HEAVY: a fresh fleet and gateway (policy kv, FLAGS comma-separated, the
# sim:-prefixed ones for the fleet), the light client and, when WITH_HEAVY is 1, the heavy one
# at the same time.
phase() {
  local dir="$1" flags="" simflags="" heavy="$3" fleet gw light hv="" f
  for f in ${2//,/ }; do
    case "$f" in
      sim:*) simflags+=" ${f#sim:}" ;;
      *) flags+=" $f" ;;
    esac
  done
  mkdir -p "$dir"
  # shellcheck disable=SC2086 # SIM_ARGS and simflags are lists
  "$BIN/vllm-sim" fleet --workers "$WORKERS" --host 127.0.0.1 --base-port $((BASE_PORT + 1)) \
    --events-base-port $((BASE_PORT + 100)) --model "$MODEL_DIR" --served-model-name "$MODEL_NAME" \
    --block-size "$BLOCK_SIZE" --num-gpu-blocks "$NUM_GPU_BLOCKS" --max-model-len "$MAX_MODEL_LEN" \
    --speedup "$SPEEDUP" --gateway-listen "127.0.0.1:$BASE_PORT" --router-policy kv \
    --config-out "$dir/fleet.yaml" --log-level warn ${SIM_ARGS:-} $simflags >"$dir/fleet.log" 2>&1 &
  fleet=$!
  PIDS+=("$fleet")
  for i in $(seq 1 "$WORKERS"); do
    wait_http "http://127.0.0.1:$((BASE_PORT + i))/health" "$fleet" 60 || die "worker $i did not start; see $dir/fleet.log"
  done
  wait_file "$dir/fleet.yaml"
  # shellcheck disable=SC2086 # flags are a list
  "$BIN/kvgate" serve --config "$dir/fleet.yaml" --router-policy kv --proxy-expose-routing-headers \
    --shutdown-drain-delay 0s --log-level warn ${GATEWAY_ARGS:-} $flags >"$dir/kvgate.log" 2>&1 &
  gw=$!
  PIDS+=("$gw")
  wait_http "http://127.0.0.1:$BASE_PORT/health" "$gw" 60 || die "kvgate did not become healthy; see $dir/kvgate.log"
  client "$dir/light" "$LIGHT_USERS" 0 "$LIGHT_HDR"
  light=$CLIENT
  if [ "$heavy" = 1 ]; then
    client "$dir/heavy" "$HEAVY_USERS" "$LIGHT_USERS" "$HEAVY_HDR"
    hv=$CLIENT
  fi
  wait "$light" || die "light client failed; see $dir/light/kvbench.txt"
  [ -z "$hv" ] || wait "$hv" || die "heavy client failed; see $dir/heavy/kvbench.txt"
  curl -sf "http://127.0.0.1:$BASE_PORT/metrics" >"$dir/kvgate-metrics.txt" || true
  stop_pid "$gw"
  stop_pid "$fleet"
}

# phases PHASE...: every variant and repeat of the given phases (alone, flood) at once, each on
# its own ports.
phases() {
  local jobs=() k=0 v label flags rep p
  for p in "$@"; do
    for v in $VARIANTS; do
      label="${v%%=*}" flags="${v#*=}"
      for rep in $(seq 1 "$REPEATS"); do
        (
          PIDS=()
          trap cleanup EXIT
          trap 'cleanup; exit 130' INT TERM
          BASE_PORT=$((BASE_PORT + 200 * k))
          log "[$label run $rep] $p: light $LIGHT_USERS users${LIGHT_HDR:+ ($LIGHT_HDR)}$([ "$p" = flood ] && echo ", heavy $HEAVY_USERS users ($HEAVY_HDR)")"
          phase "$OUT/$label/run$rep/$p" "$flags" "$([ "$p" = flood ] && echo 1 || echo 0)"
        ) &
        jobs+=($!)
        PIDS+=($!)
        k=$((k + 1))
      done
    done
  done
  for j in "${jobs[@]}"; do wait "$j" || die "a phase failed"; done
  log "phases $* done; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
}

if [ "$TOGETHER" = 1 ]; then
  phases alone flood
else
  phases alone
  phases flood
fi

# The report: per variant and run, the light client's percentile alone and in the flood, their
# ratio, goodput, and the oldest request of each client against the queue timeout.
sum() { jq -r "$2" "$1/$SUMMARY_FILE"; }
# shed DIR: the flood phase's requests the gateway's queue answered itself, by reason
# (kvgate_flow_shed_total).
shed() {
  awk '/^kvgate_flow_shed_total\{/ { match($0, /reason="[^"]*"/); r = substr($0, RSTART + 8, RLENGTH - 9); out = out sep r " " $2; sep = ", " }
       END { printf "%s", (out == "" ? "none" : out) }' "$1/kvgate-metrics.txt" 2>/dev/null || printf -- "-"
}
# served DIR: the largest TTFT at the client of the client's 200 responses (its oldest served
# request's first token, against the queue timeout; the oldest request counts the 503s too).
served() {
  jq -s '[.[] | select(.metadata.http_status == 200) | .metrics.time_to_first_token.value] | max // 0 | round' \
    "$1/profile_export.jsonl" 2>/dev/null || printf -- "-"
}
{
  echo "| variant | run | light $PCT TTFT alone (ms) | light $PCT TTFT in the flood (ms) | ratio | light ok / failed (flood) | heavy ok / failed | heavy goodput (req/s) | oldest request, light / heavy (ms) | oldest served first token, light / heavy (ms) | queue timeout | shed at the gateway (flood) |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
  for v in $VARIANTS; do
    label="${v%%=*}"
    for rep in $(seq 1 "$REPEATS"); do
      d="$OUT/$label/run$rep"
      a=$(sum "$d/alone/light" ".time_to_first_token.$PCT")
      f=$(sum "$d/flood/light" ".time_to_first_token.$PCT")
      echo "| $label | $rep | $(printf %.0f "$a") | $(printf %.0f "$f") | $(awk -v a="$a" -v f="$f" 'BEGIN { printf "%.2f", (a > 0 ? f / a : 0) }') |" \
        "$(sum "$d/flood/light" '"\(.request_count) / \(.error_count)"') | $(sum "$d/flood/heavy" '"\(.request_count) / \(.error_count) \(.error_summary)"') |" \
        "$(sum "$d/flood/heavy" '.goodput * 1000 | round / 1000') |" \
        "$(sum "$d/flood/light" '.oldest_request_age_ms | round') / $(sum "$d/flood/heavy" '.oldest_request_age_ms | round') |" \
        "$(served "$d/flood/light") / $(served "$d/flood/heavy") | $QUEUE_TIMEOUT |" \
        "$(shed "$d/flood") |"
    done
  done
} | tee "$OUT/report.md"
echo "report: $OUT/report.md"
