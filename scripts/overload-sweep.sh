#!/usr/bin/env bash
# overload-sweep.sh — issue 33's overload measurements: goodput (requests per second whose TTFT
# is under 2 s, kvbench --goodput-ttft) of each routing policy at multiples of the fleet's
# capacity, every (level, policy, run) through kvgate in front of a fresh simulated fleet at real
# speed. Two steps, each optional:
#
#   CAPACITY_USERS="1 2 3 4" scripts/overload-sweep.sh
#       round robin alone at these user counts (all at once, each on its own fleet), then
#       `kvbench capacity`: the offered rate where round robin's TTFT p90 passes 2 s (issue 33's
#       rule) and where its throughput stops rising (the saturation knee). Read them, then
#   LEVELS="1x=2 1.5x=3 2x=4" scripts/overload-sweep.sh
#       the sweep: every policy at each level NAME=USERS, REPEATS times, then `kvbench overload`
#       into OUT/overload.md (goodput, its ratio to round robin, TTFT mean/p90/p99, captured
#       fraction of the theoretical hit, failures by kind).
#
# Env (defaults in brackets):
#   WORKLOAD      weka: the four Claude Code traces of testdata/traces together; agentic:
#                 trace_0291 (a main agent and two Explore subagents), its users staggered
#                 [weka]
#   TIME_SCALE    kvbench --time-scale [0.05]
#   STAGGER       kvbench --repeat-stagger, trace time [weka 0s, agentic 100s]
#   POLICIES      variants as in compare-policies.sh ["round_robin=round_robin:both least_loaded=least_loaded:both
#                 kv=kv:both kv+queue=kv:both"]; kvgate's defaults (sessions on) and session headers
#                 for every policy, the gateway queue off (GATEWAY_ARGS [--flow-control-enabled=false],
#                 flow_control.enabled is on by default); kv+queue adds GATEWAY_ARGS_kv_queue
#                 [--flow-control-enabled]
#   REPEATS       runs of each level [2]
#   TOGETHER      how many runs of one level run at the same time, each on its own fleet and
#                 ports: policies (the policies of a run) or all (every run of the level) [all]
#   KVBENCH_ARGS  extra kvbench run flags ["--max-output-tokens 64"]
#   OUT           [out/overload-<workload>-<UTC time>]; runs in OUT/<level>/run<N>/<label>/
#   plus compare-policies.sh's WORKERS [4], SPEEDUP [1], SIM_ARGS, GATEWAY_ARGS, MODEL_DIR,
#   NUM_GPU_BLOCKS, MAX_MODEL_LEN, BASE_PORT, BIN, SKIP_BUILD=1, QUIET=1
#   (SIM_ARGS=--num-cpu-blocks=65536 gives every worker a host-memory tier: see
#   docs/benchmarks/2026-12-06-host-tier-overload.md)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WORKLOAD="${WORKLOAD:-weka}"
TIME_SCALE="${TIME_SCALE:-0.05}"
POLICIES="${POLICIES:-round_robin=round_robin:both least_loaded=least_loaded:both kv=kv:both kv+queue=kv:both}"
export GATEWAY_ARGS="${GATEWAY_ARGS---flow-control-enabled=false}"
export GATEWAY_ARGS_kv_queue="${GATEWAY_ARGS_kv_queue---flow-control-enabled}"
REPEATS="${REPEATS:-2}"
TOGETHER="${TOGETHER:-all}"
KVBENCH_ARGS="${KVBENCH_ARGS:---max-output-tokens 64}"
OUT="${OUT:-out/overload-$WORKLOAD-$(date -u +%Y%m%dT%H%M%SZ)}"
WORKERS="${WORKERS:-4}"
MODEL_DIR="${MODEL_DIR:-models/qwen3}"
MODEL_NAME="${MODEL_NAME:-qwen3}"
BLOCK_SIZE="${BLOCK_SIZE:-16}"
SPEEDUP="${SPEEDUP:-1}"
NUM_GPU_BLOCKS="${NUM_GPU_BLOCKS:-16384}"
MAX_MODEL_LEN="${MAX_MODEL_LEN:-262144}"
BASE_PORT="${BASE_PORT:-$((20000 + 40 * ($$ % 50)))}"
BIN="${BIN:-$OUT/bin}"
# kvgate's defaults for every kv variant: sessions on, as a deployment runs it.
KV_NO_SESSIONS_ARGS="${KV_NO_SESSIONS_ARGS:-}"

NAME=overload-sweep
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

case "$WORKLOAD" in
  weka)
    STAGGER="${STAGGER:-0s}"
    mkdir -p "$OUT/traces"
    for t in testdata/traces/trace_0*.json; do
      ln -sf "$ROOT/$t" "$OUT/traces/$(basename "$t")"
    done
    TRACE="$OUT/traces"
    ;;
  agentic)
    STAGGER="${STAGGER:-100s}"
    TRACE=testdata/traces/trace_0291.json
    ;;
  *) die "WORKLOAD '$WORKLOAD': want weka or agentic" ;;
esac
[ -n "${CAPACITY_USERS:-}${LEVELS:-}" ] || die "set CAPACITY_USERS (find capacity) or LEVELS (the sweep); see the header"
[[ "$REPEATS" =~ ^[1-9][0-9]*$ ]] || die "REPEATS '$REPEATS': want an integer >= 1"
log "building kvgate, vllm-sim, kvbench into $BIN"
build_bins
warn_speedup "$SPEEDUP"

# run_set DIR USERS PORT_OFFSET: one run of every variant of POLICIES at USERS users, into
# DIR/<label>, all at the same time (run_all with PARALLEL=1) from BASE_PORT + PORT_OFFSET.
run_set() {
  local dir="$1" users="$2"
  # shellcheck disable=SC2086 # KVBENCH_ARGS is a list of flags
  BASE_PORT=$((BASE_PORT + $3)) PARALLEL=1 run_all "$dir" "$TRACE" "$TIME_SCALE" \
    --repeat "$users" --repeat-stagger "$STAGGER" $KVBENCH_ARGS
}

if [ -n "${CAPACITY_USERS:-}" ]; then
  jobs=()
  k=0
  for u in $CAPACITY_USERS; do
    [[ "$u" =~ ^[1-9][0-9]*$ ]] || die "CAPACITY_USERS: '$u' is not a user count"
    log "capacity: round robin at $u users, time scale $TIME_SCALE"
    ( POLICIES="round_robin=round_robin:both" run_set "$OUT/capacity/$u" "$u" $((k * 200)) ) &
    jobs+=($!)
    PIDS+=($!)
    k=$((k + 1))
  done
  for j in "${jobs[@]}"; do wait "$j" || die "a capacity run failed"; done
  runs=()
  for u in $CAPACITY_USERS; do runs+=("$OUT/capacity/$u/round_robin"); done
  "$BIN/kvbench" capacity "${runs[@]}" | tee "$OUT/capacity.txt" || true
fi

[ -n "${LEVELS:-}" ] || exit 0
points=()
for rep in $(seq 1 "$REPEATS"); do
  for lv in $LEVELS; do
    name="${lv%%=*}" users="${lv#*=}"
    [[ "$users" =~ ^[1-9][0-9]*$ ]] || die "LEVELS: '$lv' is not NAME=USERS"
    for r in "$OUT/$name/run$rep"/*/; do
      [ -f "$r$SUMMARY_FILE" ] && points+=("$name=$r")
    done
  done
done
[ "${#points[@]}" -eq 0 ] || die "$OUT already holds runs; give a new OUT"
for lv in $LEVELS; do
  name="${lv%%=*}" users="${lv#*=}"
  if [ "$TOGETHER" = all ]; then
    jobs=()
    for rep in $(seq 1 "$REPEATS"); do
      log "level $name: $users users, run $rep of $REPEATS (all runs of the level at once)"
      ( run_set "$OUT/$name/run$rep" "$users" $(((rep - 1) * 1000)) ) &
      jobs+=($!)
      PIDS+=($!)
    done
    for j in "${jobs[@]}"; do wait "$j" || die "level $name: a run failed"; done
  else
    for rep in $(seq 1 "$REPEATS"); do
      log "level $name: $users users, run $rep of $REPEATS"
      run_set "$OUT/$name/run$rep" "$users" 0
    done
  fi
  log "level $name done; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
done
for lv in $LEVELS; do
  name="${lv%%=*}"
  for rep in $(seq 1 "$REPEATS"); do
    for variant in $POLICIES; do
      parse_variant "$variant"
      r="$OUT/$name/run$rep/$label"
      [ -f "$r/$SUMMARY_FILE" ] && points+=("$name=$r")
    done
  done
done
"$BIN/kvbench" overload --md "$OUT/overload.md" "${points[@]}"
echo "table: $OUT/overload.md"
