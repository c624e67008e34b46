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

# metric_sum FILE NAME: the sum of a Prometheus metric's series in a /metrics dump (0 when absent).
metric_sum() {
  awk -v n="$2" '$1 == n || index($1, n "{") == 1 { s += $2 } END { printf "%d\n", s }' "$1" 2>/dev/null || echo 0
}

# stop_pid PID: end one process we started and forget it.
stop_pid() {
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  local keep=() p
  for p in "${PIDS[@]:-}"; do [ "$p" != "$1" ] && keep+=("$p"); done
  PIDS=("${keep[@]:-}")
}

# warn_speedup X: a warning when vllm-sim runs with --speedup X > 1. Simulated GPU time then
# passes X times faster than wall time while the gateway's CPU time does not, so gateway
# overheads weigh X times more than in front of real workers.
warn_speedup() {
  if awk -v s="$1" 'BEGIN { exit !(s > 1) }'; then
    log "WARNING: --speedup $1 compresses simulated GPU time ${1}x relative to the gateway's CPU time;" \
      "gateway overheads weigh ${1}x more than against real workers (SPEEDUP=1 is real time)"
  fi
}

# parse_variant VARIANT: sets label, policy and headers from POLICY or LABEL=POLICY[:HEADERS]
# ("kv+sessions" = policy kv with kvbench --session-headers both), and gwargs from
# GATEWAY_ARGS, GATEWAY_ARGS_<label> (label with [^A-Za-z0-9] as _) and, for plain "kv",
# KV_NO_SESSIONS_ARGS.
parse_variant() {
  local variant="$1" spec var default_args=""
  label="${variant%%=*}"
  spec="${variant#*=}"
  [ "$variant" = "$label" ] && spec="$variant"
  policy="${spec%%:*}"
  headers="none"
  [ "$spec" != "$policy" ] && headers="${spec#*:}"
  if [ "$spec" = "kv+sessions" ]; then policy="kv"; headers="both"; fi
  var="GATEWAY_ARGS_$(printf '%s' "$label" | tr -c 'A-Za-z0-9' '_')"
  # Plain "kv" is KV-aware routing alone: session affinity and parent-aware placement off.
  # "kv+sessions" keeps kvgate's session defaults and sends the session and parent headers.
  [ "$label" = kv ] && default_args="${KV_NO_SESSIONS_ARGS:-}"
  gwargs="${GATEWAY_ARGS:-} ${!var-$default_args}"
}

# run_variant DIR TRACE TIME_SCALE [kvbench flags...]: one kvbench run of TRACE into DIR through
# kvgate (policy $policy, flags $gwargs, session headers $headers, label $label: see
# parse_variant) in front of a fresh fleet of WORKERS simulated workers (BLOCK_SIZE,
# NUM_GPU_BLOCKS, MAX_MODEL_LEN, SPEEDUP, extra vllm-sim flags SIM_ARGS), gateway on BASE_PORT,
# requests in kvbench's API ($API: chat, messages or responses; when set, the run's label is
# LABEL/API). Saves kvgate's /metrics in
# DIR/kvgate-metrics.txt and logs its usage reports and prompt-token mismatches.
# Returns 3 when kvgate rejects the policy or its flags (the variant is skipped).
run_variant() {
  local dir="$1" trace="$2" scale="$3" fleet gw kb i quiet=()
  shift 3
  mkdir -p "$dir"
  rm -f "$dir/fleet.yaml"
  # shellcheck disable=SC2086 # SIM_ARGS is a list of flags
  "$BIN/vllm-sim" fleet --workers "$WORKERS" --host 127.0.0.1 --base-port $((BASE_PORT + 1)) \
    --events-base-port $((BASE_PORT + 100)) --model "$MODEL_DIR" --served-model-name "$MODEL_NAME" \
    --block-size "$BLOCK_SIZE" --num-gpu-blocks "$NUM_GPU_BLOCKS" --max-model-len "$MAX_MODEL_LEN" \
    --speedup "$SPEEDUP" --gateway-listen "127.0.0.1:$BASE_PORT" --router-policy "$policy" \
    --config-out "$dir/fleet.yaml" --log-level warn ${SIM_ARGS:-} >"$dir/fleet.log" 2>&1 &
  fleet=$!
  PIDS+=("$fleet")
  for i in $(seq 1 "$WORKERS"); do
    wait_http "http://127.0.0.1:$((BASE_PORT + i))/health" "$fleet" 60 || die "[$label] worker $i did not start; see $dir/fleet.log"
  done
  wait_file "$dir/fleet.yaml"

  # No load balancer in front: the gateway stops at once when the variant ends.
  # shellcheck disable=SC2086 # gwargs is a list of flags
  "$BIN/kvgate" serve --config "$dir/fleet.yaml" --router-policy "$policy" --proxy-expose-routing-headers \
    --shutdown-drain-delay 0s --log-level warn $gwargs >"$dir/kvgate.log" 2>&1 &
  gw=$!
  PIDS+=("$gw")
  if ! wait_http "http://127.0.0.1:$BASE_PORT/health" "$gw" 60; then
    if ! kill -0 "$gw" 2>/dev/null; then
      log "[$label] kvgate rejects policy '$policy' $gwargs, skipped: $(tail -n 2 "$dir/kvgate.log" | tr '\n' ' ')"
      stop_pid "$fleet"
      rm -rf "$dir"
      return 3
    fi
    die "[$label] kvgate did not become healthy; see $dir/kvgate.log"
  fi

  [ "${QUIET:-0}" = 1 ] && quiet=(--quiet)
  # kvbench runs in the background and the script waits for it: bash runs a trap only between
  # commands, and `wait` is interruptible where a foreground command is not.
  "$BIN/kvbench" run --url "http://127.0.0.1:$BASE_PORT" --model "$MODEL_NAME" --tokenizer "$MODEL_DIR" \
    --trace "$trace" --time-scale "$scale" --session-headers "$headers" --policy "$policy" \
    --api "${API:-chat}" --label "$label${API:+/$API}" --out "$dir" "${quiet[@]}" \
    --capacity-tokens "$((WORKERS * NUM_GPU_BLOCKS * BLOCK_SIZE))" "$@" >"$dir/kvbench.txt" &
  kb=$!
  PIDS+=("$kb")
  wait "$kb" || die "[$label] kvbench failed; see $dir/kvbench.txt"
  # The gateway's view of the run: its metrics, and the prompt-token mismatches between its
  # own count and the workers' usage (0 when it renders and tokenizes exactly as they do).
  curl -sf "http://127.0.0.1:$BASE_PORT/metrics" >"$dir/kvgate-metrics.txt" || true
  log "[$label] api ${API:-chat}: usage reports" \
    "$(( $(metric_sum "$dir/kvgate-metrics.txt" kvgate_router_usage_reports_total) + $(metric_sum "$dir/kvgate-metrics.txt" kvgate_router_usage_without_cached_tokens_total) ))," \
    "prompt-token mismatches $(metric_sum "$dir/kvgate-metrics.txt" kvgate_router_prompt_token_mismatches_total)"
  stop_pid "$gw"
  stop_pid "$fleet"
}

# run_all OUTDIR TRACE TIME_SCALE [kvbench flags...]: every variant of POLICIES not listed in
# SKIPPED, each into OUTDIR/<label> on its own fresh fleet (run_variant): one after another, or
# with PARALLEL=1 all at once, variant i on ports BASE_PORT + 200·i (the simulated workers mostly
# sleep, so this shortens wall time without compressing GPU time). Sets RUNS to the summaries of
# the runs made, in POLICIES order, and appends the variants kvgate rejects to SKIPPED.
run_all() {
  local outdir="$1" trace="$2" scale="$3" variant i=0 k rc jobs=() dirs=() names=()
  shift 3
  RUNS=()
  for variant in $POLICIES; do
    case " ${SKIPPED:-} " in *" $variant "*) continue ;; esac
    parse_variant "$variant"
    names+=("$variant")
    dirs+=("$outdir/$label")
    if [ "${PARALLEL:-0}" = 1 ]; then
      (
        PIDS=()
        trap cleanup EXIT
        trap 'cleanup; exit 130' INT TERM
        BASE_PORT=$((BASE_PORT + 200 * i))
        log "[$label] $WORKERS simulated workers, policy $policy, session headers $headers, gateway port $BASE_PORT"
        run_variant "$outdir/$label" "$trace" "$scale" "$@"
      ) &
      jobs+=($!)
      PIDS+=($!)
    else
      log "[$label] $WORKERS simulated workers, policy $policy, session headers $headers"
      rc=0
      run_variant "$outdir/$label" "$trace" "$scale" "$@" || rc=$?
      jobs+=("rc:$rc")
    fi
    i=$((i + 1))
  done
  for k in "${!jobs[@]}"; do
    rc=0
    case "${jobs[$k]}" in
      rc:*) rc="${jobs[$k]#rc:}" ;;
      *) wait "${jobs[$k]}" || rc=$? ;;
    esac
    case "$rc" in
      0) RUNS+=("${dirs[$k]}/$SUMMARY_FILE") ;;
      3) SKIPPED="${SKIPPED:-} ${names[$k]}" ;;
      *) die "variant ${names[$k]} failed (exit $rc)" ;;
    esac
  done
}
SUMMARY_FILE=profile_export_kvbench.json
