#!/usr/bin/env bash
# restart-recovery.sh — how long does a gateway started under load take to hold a KV-exact index?
#
# Two simulated vLLM workers at real speed serve an agentic trace through gateway A (policy kv),
# which has seen every event since the workers started. After WARMUP seconds a second gateway B
# starts cold against the same fleet (as a restarted gateway would), with no traffic of its own.
# The script polls both gateways' /metrics and prints the time from B's start until, for every
# worker+rank, B's index is in exact mode and holds the same resident G1/G2 block counts as A's
# (kvgate_kv_index_resident_blocks), within TOLERANCE blocks.
#
# Usage: scripts/restart-recovery.sh
# Env (defaults in brackets):
#   OUT          output directory [out/restart-recovery]
#   TRACE        [testdata/traces/trace_0291.json]   TIME_SCALE [0.04]
#   KVBENCH_ARGS ["--max-output-tokens 32 --repeat 4 --repeat-stagger 60s"]
#   WARMUP       seconds of traffic before B starts [25]
#   BUFFER_STEPS the workers' replay ring (vLLM buffer_steps) [10000]
#   TOLERANCE    blocks of difference per target still counted as equal [0]
#   BASE_PORT    [21000 + 40*(PID mod 50)]; BIN [OUT/bin]; SKIP_BUILD=1 uses existing binaries
set -euo pipefail
# This script reads per-worker series from the gateway's client /metrics (loopback only).
export KVGATE_METRICS_DETAILED_PUBLIC=true

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-out/restart-recovery}"
TRACE="${TRACE:-testdata/traces/trace_0291.json}"
TIME_SCALE="${TIME_SCALE:-0.04}"
KVBENCH_ARGS="${KVBENCH_ARGS:---max-output-tokens 32 --repeat 4 --repeat-stagger 60s}"
WARMUP="${WARMUP:-25}"
BUFFER_STEPS="${BUFFER_STEPS:-10000}"
TOLERANCE="${TOLERANCE:-0}"
BASE_PORT="${BASE_PORT:-$((21000 + 40 * ($$ % 50)))}"
BIN="${BIN:-$OUT/bin}"
MODEL_DIR=models/qwen3
MODEL_NAME=qwen3

NAME=restart-recovery
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

build_bins

GW_A="127.0.0.1:$BASE_PORT"
GW_B="127.0.0.1:$((BASE_PORT + 3))"
start_fleet "$GW_A" --speedup 1 --kv-events-config "{\"buffer_steps\":$BUFFER_STEPS}"

"$BIN/kvgate" serve --config "$OUT/fleet.yaml" --router-policy kv --log-level warn >"$OUT/kvgate-a.log" 2>&1 &
gwa=$!
PIDS+=("$gwa")
wait_http "http://$GW_A/health" "$gwa" 60 || die "gateway A did not become healthy; see $OUT/kvgate-a.log"

# shellcheck disable=SC2086 # KVBENCH_ARGS is a list of flags
"$BIN/kvbench" run --url "http://$GW_A" --model "$MODEL_NAME" --tokenizer "$MODEL_DIR" --trace "$TRACE" \
  --time-scale "$TIME_SCALE" --session-headers plain --policy kv --label restart-recovery --out "$OUT" \
  --quiet $KVBENCH_ARGS >"$OUT/kvbench.txt" 2>&1 &
kb=$!
PIDS+=("$kb")
log "traffic through gateway A for ${WARMUP}s, then gateway B starts cold"
sleep "$WARMUP"

# resident G1/G2 blocks per worker+rank, plus the approximate flags, as sorted lines.
state() {
  curl -sf "http://$1/metrics" | awk '
    /^kvgate_kv_index_resident_blocks\{/ && /tier="G[12]"/ { print $1, $2 }
    /^kvgate_kv_index_approximate\{/ { if ($2 != 0) print "APPROXIMATE", $1 }' | sort
}
t0=$(date +%s.%N)
"$BIN/kvgate" serve --config "$OUT/fleet.yaml" --listen "$GW_B" --router-policy kv --log-level warn >"$OUT/kvgate-b.log" 2>&1 &
gwb=$!
PIDS+=("$gwb")
result=""
for _ in $(seq 1 1200); do
  a=$(state "$GW_A" || true)
  b=$(state "$GW_B" || true)
  if [ -n "$a" ] && [ -n "$b" ] && ! grep -q APPROXIMATE <<<"$b"; then
    if awk -v tol="$TOLERANCE" 'NR == FNR { a[$1] = $2; next } { if (!($1 in a) || (a[$1] - $2 > tol || $2 - a[$1] > tol)) bad = 1; seen[$1] = 1 }
        END { for (k in a) if (!(k in seen)) bad = 1; exit bad }' <(echo "$a") <(echo "$b"); then
      result=$(awk -v t0="$t0" -v t1="$(date +%s.%N)" 'BEGIN { printf "%.2f", t1 - t0 }')
      break
    fi
  fi
  sleep 0.1
done
echo "$a" >"$OUT/state-a.txt"
echo "$b" >"$OUT/state-b.txt"
if [ -z "$result" ]; then
  log "gateway B did not match gateway A within 120 s; see $OUT/state-a.txt and $OUT/state-b.txt"
  exit 1
fi
echo "gateway B held the same exact index as gateway A ${result} s after it started"
echo "(resident blocks per worker+rank and tier: $OUT/state-b.txt)"
