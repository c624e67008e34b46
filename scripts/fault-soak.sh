#!/usr/bin/env bash
# fault-soak.sh — does the KV index stay exact while the event stream misbehaves?
#
# Two simulated vLLM workers at real speed (--speedup 1) lose 15% of their event messages (still
# replayable), skip a sequence number every 60 messages and restart their engine (seq back to 0,
# prefix cache lost) every 25 s; kvgate (policy kv) routes a multi-turn conversation trace over
# them. At the end it prints the gateway's predicted vs worker-reported cached prompt tokens
# (kvgate_router_cached_tokens_{predicted,reported}_total) and the client error rate.
#
# Usage: scripts/fault-soak.sh
# Env (defaults in brackets):
#   OUT          output directory [out/fault-soak]
#   TRACE        multi-turn agentic trace [testdata/traces/trace_0291.json]
#   TIME_SCALE   kvbench --time-scale [0.04] (the trace spans 1,363 s at 1.0)
#   FAULTS       vllm-sim fault flags
#                ["--fault-drop-events 0.15 --fault-skip-seq-every 60 --fault-restart-every 25s"]
#   SPEEDUP      vllm-sim --speedup [1]
#   GATEWAY_ARGS extra `kvgate serve` flags
#   KVBENCH_ARGS extra kvbench run flags ["--max-output-tokens 32 --repeat 4 --repeat-stagger 60s"]
#   BASE_PORT    gateway port; workers +1.., events +100.. [19000 + 40*(PID mod 50)]
#   BIN          binaries [OUT/bin]; SKIP_BUILD=1 uses existing ones
set -euo pipefail
# This script reads per-worker series from the gateway's client /metrics (loopback only).
export KVGATE_METRICS_DETAILED_PUBLIC=true

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-out/fault-soak}"
TRACE="${TRACE:-testdata/traces/trace_0291.json}"
TIME_SCALE="${TIME_SCALE:-0.04}"
FAULTS="${FAULTS:---fault-drop-events 0.15 --fault-skip-seq-every 60 --fault-restart-every 25s}"
SPEEDUP="${SPEEDUP:-1}"
KVBENCH_ARGS="${KVBENCH_ARGS:---max-output-tokens 32 --repeat 4 --repeat-stagger 60s}"
BASE_PORT="${BASE_PORT:-$((19000 + 40 * ($$ % 50)))}"
BIN="${BIN:-$OUT/bin}"
MODEL_DIR=models/qwen3
MODEL_NAME=qwen3

NAME=fault-soak
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

build_bins
warn_speedup "$SPEEDUP"

GW="127.0.0.1:$BASE_PORT"
# shellcheck disable=SC2086 # FAULTS is a list of flags
start_fleet "$GW" --speedup "$SPEEDUP" $FAULTS

# shellcheck disable=SC2086
"$BIN/kvgate" serve --config "$OUT/fleet.yaml" --router-policy kv --log-level warn ${GATEWAY_ARGS:-} \
  >"$OUT/kvgate.log" 2>&1 &
gw=$!
PIDS+=("$gw")
wait_http "http://$GW/health" "$gw" 60 || die "kvgate did not become healthy; see $OUT/kvgate.log"

log "replaying $TRACE at time scale $TIME_SCALE with faults: $FAULTS"
# shellcheck disable=SC2086
"$BIN/kvbench" run --url "http://$GW" --model "$MODEL_NAME" --tokenizer "$MODEL_DIR" --trace "$TRACE" \
  --time-scale "$TIME_SCALE" --session-headers plain --policy kv --label fault-soak --out "$OUT" --quiet \
  $KVBENCH_ARGS >"$OUT/kvbench.txt" 2>&1 &
kb=$!
PIDS+=("$kb")
wait "$kb" || log "kvbench exited non-zero; see $OUT/kvbench.txt"

curl -sf "http://$GW/metrics" >"$OUT/metrics.txt" || die "cannot read $GW/metrics"
metric() { awk -v m="$1" '$1 == m || index($1, m "{") == 1 { s += $2 } END { printf "%.0f", s }' "$OUT/metrics.txt"; }
pred=$(metric kvgate_router_cached_tokens_predicted_total)
rep=$(metric kvgate_router_cached_tokens_reported_total)
summary="$OUT/profile_export_kvbench.json"
total=$(grep -o '"request_count": *[0-9]*' "$summary" 2>/dev/null | head -1 | grep -o '[0-9]*$' || true)
failed=$(grep -o '"error_count": *[0-9]*' "$summary" 2>/dev/null | head -1 | grep -o '[0-9]*$' || true)
echo "predicted cached tokens: $pred"
echo "reported cached tokens:  $rep"
awk -v p="$pred" -v r="$rep" 'BEGIN { if (r > 0) printf "predicted / reported:    %.3f\n", p / r }'
echo "requests ok: ${total:-?}, failed: ${failed:-?} (kvbench summary: $OUT/kvbench.txt)"
grep -E '^kvgate_kv_events_(resets|gaps|replays)' "$OUT/metrics.txt" | sort >"$OUT/events-metrics.txt" || true
