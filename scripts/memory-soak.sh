#!/usr/bin/env bash
# memory-soak.sh — does kvgate's memory level off under its cache budgets?
#
# Simulated vLLM workers (KV events on, policy kv) behind kvgate; kvbench replays the weka
# agentic traces in testdata/traces with STREAMS session trees in flight, each copy its own
# users (--repeat: own hash namespaces, so the caches keep seeing new prompts), until DURATION
# has passed. Every SAMPLE seconds it records kvgate's RSS (VmRSS of its /proc status) and the
# sums of kvgate_memory_used_bytes and kvgate_memory_budget_bytes from /metrics into
# OUT/samples.csv, and prints the RSS at each fifth of the run at the end.
#
# Usage: scripts/memory-soak.sh
# Env (defaults in brackets):
#   OUT          output directory [out/memory-soak]
#   DURATION     seconds of load [1800]
#   STREAMS      kvbench --concurrency (session trees in flight) [64]
#   SAMPLE       seconds between samples [15]
#   WORKERS      simulated workers [2]
#   SPEEDUP      vllm-sim --speedup [1]
#   TRACE        trace directory or file [the weka traces testdata/traces/trace_*.json]
#   GATEWAY_ARGS extra `kvgate serve` flags
#   BASE_PORT    gateway port; workers +1.., events +100.. [19000 + 40*(PID mod 50)]
#   BIN          binaries [OUT/bin]; SKIP_BUILD=1 uses existing ones
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-out/memory-soak}"
DURATION="${DURATION:-1800}"
STREAMS="${STREAMS:-64}"
SAMPLE="${SAMPLE:-15}"
WORKERS="${WORKERS:-2}"
SPEEDUP="${SPEEDUP:-1}"
TRACE="${TRACE:-}"
BASE_PORT="${BASE_PORT:-$((19000 + 40 * ($$ % 50)))}"
BIN="${BIN:-$OUT/bin}"
MODEL_DIR=models/qwen3
MODEL_NAME=qwen3

NAME=memory-soak
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

build_bins
if [ -z "$TRACE" ]; then
  TRACE="$OUT/traces"
  mkdir -p "$TRACE"
  cp testdata/traces/trace_*.json "$TRACE/"
fi
warn_speedup "$SPEEDUP"

GW="127.0.0.1:$BASE_PORT"
rm -f "$OUT/fleet.yaml"
"$BIN/vllm-sim" fleet --workers "$WORKERS" --host 127.0.0.1 --base-port $((BASE_PORT + 1)) \
  --events-base-port $((BASE_PORT + 100)) --model "$MODEL_DIR" --served-model-name "$MODEL_NAME" \
  --num-gpu-blocks 16384 --max-model-len 262144 --speedup "$SPEEDUP" --gateway-listen "$GW" \
  --router-policy kv --config-out "$OUT/fleet.yaml" --log-level warn >"$OUT/fleet.log" 2>&1 &
PIDS+=("$!")
for i in $(seq 1 "$WORKERS"); do
  wait_http "http://127.0.0.1:$((BASE_PORT + i))/health" "${PIDS[0]}" 60 || die "worker $i did not start; see $OUT/fleet.log"
done
wait_file "$OUT/fleet.yaml"

# shellcheck disable=SC2086 # GATEWAY_ARGS is a list of flags
"$BIN/kvgate" serve --config "$OUT/fleet.yaml" --router-policy kv --log-level warn ${GATEWAY_ARGS:-} \
  >"$OUT/kvgate.log" 2>&1 &
gw=$!
PIDS+=("$gw")
wait_http "http://$GW/health" "$gw" 60 || die "kvgate did not become healthy; see $OUT/kvgate.log"

log "kvgate pid $gw; $STREAMS streams for ${DURATION}s over $WORKERS workers (speedup $SPEEDUP), trace $TRACE"
"$BIN/kvbench" run --url "http://$GW" --model "$MODEL_NAME" --tokenizer "$MODEL_DIR" --trace "$TRACE" \
  --concurrency "$STREAMS" --repeat 1000 --max-output-tokens 16 --session-headers plain --policy kv \
  --label memory-soak --out "$OUT" --quiet --timeout 5m >"$OUT/kvbench.txt" 2>&1 &
kb=$!
PIDS+=("$kb")

echo "seconds,rss_bytes,used_bytes,budget_bytes,requests" >"$OUT/samples.csv"
start=$(date +%s)
while :; do
  now=$(date +%s)
  el=$((now - start))
  rss=$(awk '/^VmRSS:/ { print $2 * 1024 }' "/proc/$gw/status" 2>/dev/null || echo 0)
  curl -sf "http://$GW/metrics" >"$OUT/metrics.txt" || die "cannot read kvgate's /metrics (did it exit? see $OUT/kvgate.log)"
  used=$(metric_sum "$OUT/metrics.txt" kvgate_memory_used_bytes)
  budget=$(metric_sum "$OUT/metrics.txt" kvgate_memory_budget_bytes)
  reqs=$(metric_sum "$OUT/metrics.txt" kvgate_requests_total)
  echo "$el,$rss,$used,$budget,$reqs" >>"$OUT/samples.csv"
  [ "$el" -ge "$DURATION" ] && break
  kill -0 "$kb" 2>/dev/null || { log "kvbench ended early; see $OUT/kvbench.txt"; break; }
  sleep "$SAMPLE"
done
grep '^kvgate_memory_' "$OUT/metrics.txt" >"$OUT/memory-metrics.txt" || true
stop_pid "$kb"

# RSS (MiB) at each fifth of the run, the caches' estimated use and their budget sum.
awk -F, -v d="$DURATION" 'NR > 1 { t[NR] = $1; r[NR] = $2; u[NR] = $3; b[NR] = $4; q[NR] = $5; n = NR }
  END {
    printf "%8s %10s %14s %14s %10s\n", "seconds", "rss_MiB", "caches_MiB", "budgets_MiB", "requests"
    k = 1
    for (i = 2; i <= n; i++) if (i == n || t[i] >= k * d / 5) {
      printf "%8d %10.1f %14.1f %14.1f %10d\n", t[i], r[i] / 1048576, u[i] / 1048576, b[i] / 1048576, q[i]
      while (k * d / 5 <= t[i]) k++
    }
  }' "$OUT/samples.csv" | tee "$OUT/summary.txt"
