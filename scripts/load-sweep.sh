#!/usr/bin/env bash
# load-sweep.sh — the same trace at several load levels for each routing policy: every
# (level, policy) is one kvbench run through kvgate in front of a fresh simulated fleet (cold
# caches), and the results are drawn as curves against load (mean and p90 TTFT, request and
# output throughput per policy) in one HTML report plus a markdown table.
#
# Usage: scripts/load-sweep.sh [TRACE...]   (default: testdata/traces/trace_0291.json)
#   One TRACE is a trace file or a directory of them (kvbench --trace); several are linked into
#   OUT/traces/ and replayed together, each as its own session(s) from time 0, e.g. the four
#   Claude Code traces: scripts/load-sweep.sh testdata/traces/trace_0*.json
#
# Env (defaults in brackets):
#   LEVELS        load levels USERS:TIME_SCALE ["2:0.05 4:0.02 8:0.01"]: USERS independent copies
#                 of the trace (kvbench --repeat) with arrivals scaled by TIME_SCALE; the offered
#                 load is USERS / TIME_SCALE times the trace's own rate
#   POLICIES      variants as in compare-policies.sh ["round_robin least_loaded kv_blocks kv"];
#                 variants `kvgate serve --router-policy` rejects are skipped (once, for every level)
#   SMOKE=1       a quick check: LEVELS "1:0.05 2:0.02 3:0.01", POLICIES "round_robin kv",
#                 KVBENCH_ARGS "--max-requests 4 --max-output-tokens 8", PARALLEL=1
#   KVBENCH_ARGS  extra kvbench run flags ["--max-output-tokens 64"]
#   PARALLEL=1    run the policies of one level at the same time, each on its own fleet and ports
#   REPEATS       run the whole sweep this many times [1]; the table and curves show the median of
#                 each number over the runs and the range of the mean TTFT (a single run above
#                 the cache's capacity can move a policy's mean TTFT by a third), and the ratio
#                 to the first policy of the mean TTFT averaged over the runs
#   OUT           output directory [out/sweep-<UTC time>]: OUT/<users>_<scale>/<label>/… (with
#                 REPEATS > 1, OUT/<users>_<scale>/run<N>/<label>/…), OUT/sweep.html, OUT/sweep.md
#   plus compare-policies.sh's WORKERS, SPEEDUP [1], SIM_ARGS, GATEWAY_ARGS, GATEWAY_ARGS_<label>,
#   KV_NO_SESSIONS_ARGS, MODEL_DIR, MODEL_NAME, BLOCK_SIZE, NUM_GPU_BLOCKS, MAX_MODEL_LEN,
#   BASE_PORT, BIN, SKIP_BUILD=1, QUIET=1
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TRACES=("$@")
[ "${#TRACES[@]}" -gt 0 ] || TRACES=(testdata/traces/trace_0291.json)
TRACE="${TRACES[0]}"
if [ "${SMOKE:-0}" = 1 ]; then
  LEVELS="${LEVELS:-1:0.05 2:0.02 3:0.01}"
  POLICIES="${POLICIES:-round_robin kv}"
  KVBENCH_ARGS="${KVBENCH_ARGS:---max-requests 4 --max-output-tokens 8}"
  PARALLEL="${PARALLEL:-1}"
fi
LEVELS="${LEVELS:-2:0.05 4:0.02 8:0.01}"
POLICIES="${POLICIES:-round_robin least_loaded kv_blocks kv}"
KVBENCH_ARGS="${KVBENCH_ARGS:---max-output-tokens 64}"
export PARALLEL="${PARALLEL:-0}"
REPEATS="${REPEATS:-1}"
OUT="${OUT:-out/sweep-$(date -u +%Y%m%dT%H%M%SZ)}"
WORKERS="${WORKERS:-4}"
MODEL_DIR="${MODEL_DIR:-models/qwen3}"
MODEL_NAME="${MODEL_NAME:-qwen3}"
BLOCK_SIZE="${BLOCK_SIZE:-16}"
SPEEDUP="${SPEEDUP:-1}"
NUM_GPU_BLOCKS="${NUM_GPU_BLOCKS:-16384}"
MAX_MODEL_LEN="${MAX_MODEL_LEN:-262144}"
BASE_PORT="${BASE_PORT:-$((18000 + 40 * ($$ % 50)))}"
BIN="${BIN:-$OUT/bin}"
KV_NO_SESSIONS_ARGS="${KV_NO_SESSIONS_ARGS:---sessions-affinity-blocks 0 --sessions-parent-aware=false --sessions-parent-blocks 0 --sessions-sibling-prefix=false}"

NAME=load-sweep
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

for t in "${TRACES[@]}"; do
  [ -e "$t" ] || die "trace $t not found"
done
TITLE="$(basename "$TRACE")"
if [ "${#TRACES[@]}" -gt 1 ]; then
  # kvbench replays a directory's .json/.jsonl files together: link the chosen ones into one.
  mkdir -p "$OUT/traces"
  TITLE=""
  for t in "${TRACES[@]}"; do
    [ -f "$t" ] || die "trace $t: with several traces each must be a file"
    ln -sf "$(cd "$(dirname "$t")" && pwd)/$(basename "$t")" "$OUT/traces/$(basename "$t")"
    TITLE="$TITLE${TITLE:+, }$(basename "$t")"
  done
  TRACE="$OUT/traces"
fi
command -v curl >/dev/null || die "curl is required"
[[ "$REPEATS" =~ ^[1-9][0-9]*$ ]] || die "REPEATS '$REPEATS': want an integer >= 1"
for level in $LEVELS; do
  [[ "$level" =~ ^[1-9][0-9]*:[0-9]*\.?[0-9]+$ ]] || die "load level '$level': want USERS:TIME_SCALE, e.g. 4:0.02"
done
log "building kvgate, vllm-sim, kvbench into $BIN"
build_bins
warn_speedup "$SPEEDUP"

POINTS=()
SKIPPED=""
# The whole sweep once per repeat (not each level N times in a row), so that what drifts on the
# machine over time spreads over every level alike.
for rep in $(seq 1 "$REPEATS"); do
  for level in $LEVELS; do
    users="${level%%:*}"
    scale="${level#*:}"
    dir="$OUT/${users}_$scale"
    [ "$REPEATS" -gt 1 ] && dir="$dir/run$rep"
    log "level $level: $users users, time scale $scale (run $rep of $REPEATS)"
    # shellcheck disable=SC2086 # KVBENCH_ARGS is a list of flags
    run_all "$dir" "$TRACE" "$scale" --repeat "$users" $KVBENCH_ARGS
    for r in "${RUNS[@]:-}"; do
      [ -n "$r" ] && POINTS+=("$level=$r")
    done
  done
done

[ "${#POINTS[@]}" -gt 0 ] || die "no policy ran"
[ -n "$SKIPPED" ] && log "skipped (rejected by kvgate):$SKIPPED"
"$BIN/kvbench" sweep --title "kvgate routing policies against load on $TITLE" \
  --html "$OUT/sweep.html" --md "$OUT/sweep.md" "${POINTS[@]}"
echo "markdown table: $OUT/sweep.md"
echo "HTML report: $OUT/sweep.html"
