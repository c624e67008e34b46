#!/usr/bin/env bash
# replicas.sh — several kvgate replicas sharing NATS, behind HAProxy (or NGINX) in round robin,
# measured with kvbench on an agentic trace.
#
# A simulated fleet (WORKERS vllm-sim workers at real speed, KV events on) serves REPLICAS kvgate
# replicas that share one NATS system (the replicas' embedded servers joined by routes, or an
# external nats-server); HAProxy balances the clients' requests over the replicas in round robin;
# kvbench replays TRACE through HAProxy and the script prints the report: cached-token ratio,
# TTFT mean / p90, client errors, requests per replica, each replica's cluster link, and the
# TTFT the front adds (FRONT_PROBES streamed requests, direct to replica 1 and through the front,
# alternating: scripts/front-ttft.mjs), so a front that holds back SSE shows.
# Everything listens on 127.0.0.1; every process is stopped on exit (Ctrl-C included).
#
# Usage: scripts/replicas.sh [TRACE]      (default: testdata/traces/trace_0291.json, a Claude
#        Code session with two Explore subagents)
#
# Env (defaults in brackets):
#   REPLICAS      kvgate replicas behind HAProxy [3]
#   FRONT         haproxy, nginx (proxy_buffering off, HTTP/1.1 keep-alive upstreams) or none
#                 (kvbench straight to replica 1; for the direct baseline, with REPLICAS=1)
#                 [haproxy]
#   HAPROXY_NO_DELAY  0 leaves `option http-no-delay` out of the HAProxy config, to measure
#                 what it costs [1]
#   FRONT_PROBES  streamed requests each way for the front's added TTFT; 0 skips it [20]
#   NATS          embedded: each replica runs a NATS server, the servers form one cluster with
#                 routes; external: one nats-server process (built from the Go module cache into
#                 BIN, or Debian's nats-server), the replicas connect to it; none: no cluster
#                 section (independent replicas) [embedded]
#   STOP_NATS_AT  seconds into the replay at which the external nats-server is stopped
#                 (SIGTERM); needs NATS=external. The report then shows the replicas degraded and
#                 the client errors (the target is 0) [unset]
#   NATS_DOWN_FOR seconds after STOP_NATS_AT at which the nats-server starts again (same port
#                 and store): the replicas reconnect [unset: it stays down]
#   KILL_REPLICA_AT  seconds into the replay at which the last replica is killed (SIGKILL);
#                 HAProxy's health check takes it out, and only the streams in flight on it
#                 should fail (the report shows how many were) [unset]
#   COLD_REPLICA=1  after the replay, start one more replica (a plain NATS client of the seeds)
#                 and compare, on PROBES held-out prompts (prompts of the replay plus a new user
#                 turn), its per-worker G1/G2 overlap from POST /debug/route with replica 1's,
#                 which saw everything; prints how long until they agree (target: COLD_WITHIN s)
#   COLD_ROLE     client: the cold replica is a plain NATS client of the seeds; seed: it runs
#                 its own embedded server routed to the seeds' (NATS=embedded), so its warm
#                 start races its routes forming [client]
#   COMPARE=1     run REPLICAS=1, then REPLICAS=3 (or COMPARE_REPLICAS), on the same trace and a
#                 fresh fleet of the same shape each, and print the differences: cached-token
#                 ratio within 0.02, mean TTFT within 15%
#   BUFFER_STEPS  the workers' replay ring (vLLM buffer_steps) [200 with COLD_REPLICA=1, else
#                 10000]: 200 no longer reaches back to the start of the replay
#   TIME_SCALE    kvbench --time-scale [0.02]
#   KVBENCH_ARGS  extra kvbench run flags ["--max-output-tokens 64 --repeat 6 --repeat-stagger 100s"]
#   SESSION_HEADERS  kvbench --session-headers [both]
#   POLICY        kvgate --router-policy [kv]
#   GATEWAY_ARGS  extra `kvgate serve` flags for every replica (e.g. "--cluster-kv-replicas 3")
#   SIM_ARGS      extra vllm-sim flags (e.g. "--num-cpu-blocks 16384" for a host tier, G2)
#   WORKERS [4], SPEEDUP [1], NUM_GPU_BLOCKS [16384], MAX_MODEL_LEN [262144], BLOCK_SIZE [16],
#   MODEL_DIR [models/qwen3], MODEL_NAME [qwen3]
#   PROBES [16], COLD_WITHIN [5], COLD_TIMEOUT [30] (seconds the cold replica is watched)
#   OUT           output directory and logs [out/replicas]
#   BASE_PORT     [24000 + 200*(PID mod 40)]: HAProxy BASE_PORT (stats +9), workers +1.., replica
#                 r +10+r (admin +20+r, embedded NATS +30+r, its routes +40+r), external NATS
#                 +50 (monitor +51), KV events +100..
#   BIN           where the binaries are built [OUT/bin]; SKIP_BUILD=1 uses existing ones
#
# HAProxy or NGINX (Debian's haproxy, nginx) and jq are installed with apt-get when missing (as
# root, as scripts/setup.sh installs libzmq).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TRACE="${1:-${TRACE:-testdata/traces/trace_0291.json}}"
REPLICAS="${REPLICAS:-3}"
NATS="${NATS:-embedded}"
STOP_NATS_AT="${STOP_NATS_AT:-}"
NATS_DOWN_FOR="${NATS_DOWN_FOR:-}"
KILL_REPLICA_AT="${KILL_REPLICA_AT:-}"
COLD_REPLICA="${COLD_REPLICA:-0}"
COMPARE="${COMPARE:-0}"
COLD_ROLE="${COLD_ROLE:-client}"
OUT="${OUT:-out/replicas}"
WORKERS="${WORKERS:-4}"
SPEEDUP="${SPEEDUP:-1}"
if [ "$COLD_REPLICA" = 1 ]; then BUFFER_STEPS="${BUFFER_STEPS:-200}"; else BUFFER_STEPS="${BUFFER_STEPS:-10000}"; fi
TIME_SCALE="${TIME_SCALE:-0.02}"
KVBENCH_ARGS="${KVBENCH_ARGS:---max-output-tokens 64 --repeat 6 --repeat-stagger 100s}"
SESSION_HEADERS="${SESSION_HEADERS:-both}"
POLICY="${POLICY:-kv}"
GATEWAY_ARGS="${GATEWAY_ARGS:-}"
SIM_ARGS="${SIM_ARGS:-}"
NUM_GPU_BLOCKS="${NUM_GPU_BLOCKS:-16384}"
MAX_MODEL_LEN="${MAX_MODEL_LEN:-262144}"
BLOCK_SIZE="${BLOCK_SIZE:-16}"
MODEL_DIR="${MODEL_DIR:-models/qwen3}"
MODEL_NAME="${MODEL_NAME:-qwen3}"
PROBES="${PROBES:-16}"
COLD_WITHIN="${COLD_WITHIN:-5}"
COLD_TIMEOUT="${COLD_TIMEOUT:-30}"
BASE_PORT="${BASE_PORT:-$((24000 + 200 * ($$ % 40)))}"
FRONT="${FRONT:-haproxy}"
HAPROXY_NO_DELAY="${HAPROXY_NO_DELAY:-1}"
FRONT_PROBES="${FRONT_PROBES:-20}"
BIN="${BIN:-$OUT/bin}"

NAME=replicas
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

# need_pkg CMD PACKAGE: install the Debian package when the command is missing.
need_pkg() {
  command -v "$1" >/dev/null && return 0
  [ "$(id -u)" -eq 0 ] || die "$1 is missing and this is not root; install it: apt-get install -y $2"
  log "installing $2 (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq "$2" >/dev/null || die "apt-get install $2 failed"
}
case "$FRONT" in
  haproxy) need_pkg haproxy haproxy ;;
  nginx) need_pkg nginx nginx ;;
  none) ;;
  *) die "FRONT=$FRONT: want haproxy, nginx or none" ;;
esac
need_pkg jq jq
command -v curl >/dev/null || die "curl is required"
[ -e "$TRACE" ] || die "trace $TRACE not found"

# --- COMPARE=1: this script twice, one replica then several, and the differences. ---
if [ "$COMPARE" = 1 ]; then
  n3="${COMPARE_REPLICAS:-3}"
  mkdir -p "$OUT"
  build_bins
  for n in 1 "$n3"; do
    log "compare: REPLICAS=$n"
    COMPARE=0 COLD_REPLICA=0 STOP_NATS_AT="" NATS_DOWN_FOR="" KILL_REPLICA_AT="" REPLICAS="$n" OUT="$OUT/r$n" BIN="$BIN" SKIP_BUILD=1 \
      "$0" "$TRACE" >"$OUT/r$n.txt" 2>&1 || die "the REPLICAS=$n run failed; see $OUT/r$n.txt"
    cat "$OUT/r$n.txt"
  done
  "$BIN/kvbench" compare --title "1 vs $n3 kvgate replicas behind HAProxy on $(basename "$TRACE")" \
    --html "$OUT/report.html" "$OUT/r1/kvbench" "$OUT/r$n3/kvbench" | tee "$OUT/comparison.txt"
  jq -rn --slurpfile a "$OUT/r1/kvbench/$SUMMARY_FILE" --slurpfile b "$OUT/r$n3/kvbench/$SUMMARY_FILE" --arg n "$n3" '
    $a[0] as $a | $b[0] as $b |
    ($b.cached_token_ratio - $a.cached_token_ratio) as $dc |
    ($b.time_to_first_token.avg / $a.time_to_first_token.avg) as $rt |
    "cached-token ratio: 1 replica \($a.cached_token_ratio * 1000 | round / 1000), \($n) replicas \($b.cached_token_ratio * 1000 | round / 1000), difference \($dc * 1000 | round / 1000): " + (if ($dc | fabs) <= 0.02 then "within 0.02" else "NOT within 0.02" end),
    "mean TTFT: 1 replica \($a.time_to_first_token.avg | round) ms, \($n) replicas \($b.time_to_first_token.avg | round) ms, ratio \($rt * 100 | round / 100): " + (if $rt <= 1.15 then "within 15%" else "NOT within 15%" end),
    "p90 TTFT: 1 replica \($a.time_to_first_token.p90 | round) ms, \($n) replicas \($b.time_to_first_token.p90 | round) ms",
    "client errors: 1 replica \($a.error_count), \($n) replicas \($b.error_count)"' | tee -a "$OUT/comparison.txt"
  echo "comparison: $OUT/comparison.txt  HTML report: $OUT/report.html"
  exit 0
fi

# --- checks ---
case "$NATS" in embedded | external | none) ;; *) die "NATS=$NATS: want embedded, external or none" ;; esac
[[ "$REPLICAS" =~ ^[1-9]$ ]] || die "REPLICAS=$REPLICAS: want 1..9"
if [ -n "$STOP_NATS_AT" ]; then
  [ "$NATS" = external ] || die "STOP_NATS_AT needs NATS=external (an embedded server stops only with its replica)"
  [[ "$STOP_NATS_AT" =~ ^[0-9]+$ ]] || die "STOP_NATS_AT=$STOP_NATS_AT: want whole seconds"
fi
if [ -n "$NATS_DOWN_FOR" ]; then
  [ -n "$STOP_NATS_AT" ] || die "NATS_DOWN_FOR needs STOP_NATS_AT"
  [[ "$NATS_DOWN_FOR" =~ ^[0-9]+$ ]] || die "NATS_DOWN_FOR=$NATS_DOWN_FOR: want whole seconds"
fi
if [ -n "$KILL_REPLICA_AT" ]; then
  [[ "$KILL_REPLICA_AT" =~ ^[0-9]+$ ]] || die "KILL_REPLICA_AT=$KILL_REPLICA_AT: want whole seconds"
  [ "$REPLICAS" -ge 2 ] || die "KILL_REPLICA_AT needs REPLICAS >= 2 (HAProxy needs a replica left)"
  [ "$FRONT" = haproxy ] || die "KILL_REPLICA_AT needs FRONT=haproxy"
fi
[ "$COLD_REPLICA" = 1 ] && [ "$REPLICAS" -ge 9 ] && die "COLD_REPLICA=1 needs REPLICAS <= 8 (ports)"
case "$COLD_ROLE" in client) ;; seed) [ "$NATS" = embedded ] || die "COLD_ROLE=seed needs NATS=embedded" ;;
  *) die "COLD_ROLE=$COLD_ROLE: want client or seed" ;; esac
[ "$WORKERS" -le 8 ] || die "WORKERS=$WORKERS: at most 8 (ports)"


rm -rf "$OUT/kvbench" "$OUT/jetstream" "$OUT/nats-store" "$OUT/cold"
mkdir -p "$OUT"
log "building kvgate, vllm-sim, kvbench into $BIN"
build_bins
warn_speedup "$SPEEDUP"

NATS_SERVER=""
if [ "$NATS" = external ]; then
  # The server of the nats-server/v2 module kvgate embeds (go.mod), built from the module cache
  # (offline); Debian's nats-server package otherwise.
  if [ "${SKIP_BUILD:-0}" != 1 ] || [ ! -x "$BIN/nats-server" ]; then
    if go build -o "$BIN/nats-server" github.com/nats-io/nats-server/v2 2>"$OUT/nats-build.log"; then
      NATS_SERVER="$BIN/nats-server"
    else
      log "could not build nats-server from the module cache (see $OUT/nats-build.log); trying Debian's"
      need_pkg nats-server nats-server
      NATS_SERVER="$(command -v nats-server)"
    fi
  else
    NATS_SERVER="$BIN/nats-server"
  fi
fi

gw_port() { echo $((BASE_PORT + 10 + $1)); }
admin_port() { echo $((BASE_PORT + 20 + $1)); }
nats_port() { echo $((BASE_PORT + 30 + $1)); }
route_port() { echo $((BASE_PORT + 40 + $1)); }
EXT_NATS_PORT=$((BASE_PORT + 50))
EXT_NATS_MON=$((BASE_PORT + 51))
LB="127.0.0.1:$BASE_PORT"
[ "$FRONT" = none ] && LB="127.0.0.1:$(gw_port 1)"

# --- the fleet ---
log "$WORKERS simulated workers (speedup $SPEEDUP, buffer_steps $BUFFER_STEPS), $REPLICAS replicas (NATS $NATS), front $FRONT on $LB"
rm -f "$OUT/fleet.yaml"
# shellcheck disable=SC2086 # SIM_ARGS is a list of flags
"$BIN/vllm-sim" fleet --workers "$WORKERS" --host 127.0.0.1 --base-port $((BASE_PORT + 1)) \
  --events-base-port $((BASE_PORT + 100)) --model "$MODEL_DIR" --served-model-name "$MODEL_NAME" \
  --block-size "$BLOCK_SIZE" --num-gpu-blocks "$NUM_GPU_BLOCKS" --max-model-len "$MAX_MODEL_LEN" \
  --speedup "$SPEEDUP" --kv-events-config "{\"buffer_steps\":$BUFFER_STEPS}" \
  --gateway-listen "127.0.0.1:$(gw_port 1)" --router-policy "$POLICY" \
  --config-out "$OUT/fleet.yaml" --log-level warn $SIM_ARGS >"$OUT/fleet.log" 2>&1 &
fleet=$!
PIDS+=("$fleet")
for i in $(seq 1 "$WORKERS"); do
  wait_http "http://127.0.0.1:$((BASE_PORT + i))/health" "$fleet" 60 || die "worker $i did not start; see $OUT/fleet.log"
done
wait_file "$OUT/fleet.yaml"

# --- NATS ---
nats_pid=""
# start_nats: the external nats-server (JetStream on, its store in OUT, so a restart keeps it).
start_nats() {
  "$NATS_SERVER" -a 127.0.0.1 -p "$EXT_NATS_PORT" -m "$EXT_NATS_MON" -js -sd "$OUT/nats-store" \
    -n kvgate-nats >>"$OUT/nats.log" 2>&1 </dev/null &
  nats_pid=$!
  PIDS+=("$nats_pid")
  wait_http "http://127.0.0.1:$EXT_NATS_MON/healthz" "$nats_pid" 30 || die "nats-server did not start; see $OUT/nats.log"
}
if [ "$NATS" = external ]; then
  start_nats
fi
SEED_URLS=""
SEED_ROUTES=""
for r in $(seq 1 "$REPLICAS"); do
  SEED_URLS="$SEED_URLS${SEED_URLS:+,}nats://127.0.0.1:$(nats_port "$r")"
  SEED_ROUTES="$SEED_ROUTES${SEED_ROUTES:+,}127.0.0.1:$(route_port "$r")"
done

# cluster_flags R ROLE: the cluster flags of replica R; ROLE seed (runs an embedded server when
# NATS=embedded) or client (connects to the seeds).
cluster_flags() {
  local r="$1" role="$2"
  case "$NATS" in
    none) ;;
    external) echo "--cluster-replica-id gw$r --cluster-nats-url nats://127.0.0.1:$EXT_NATS_PORT" ;;
    embedded)
      if [ "$role" = seed ]; then
        echo "--cluster-replica-id gw$r --cluster-embedded-nats-listen 127.0.0.1:$(nats_port "$r")" \
          "--cluster-embedded-nats-cluster-listen 127.0.0.1:$(route_port "$r")" \
          "--cluster-embedded-nats-routes $SEED_ROUTES --cluster-embedded-nats-store-dir $OUT/jetstream/gw$r"
      else
        echo "--cluster-replica-id gw$r --cluster-nats-url $SEED_URLS"
      fi
      ;;
  esac
}

# start_replica R ROLE LOG: one kvgate replica in the background; sets REPLICA_PID.
start_replica() {
  local r="$1" role="$2" logf="$3"
  # shellcheck disable=SC2046,SC2086 # flag lists
  "$BIN/kvgate" serve --config "$OUT/fleet.yaml" --listen "127.0.0.1:$(gw_port "$r")" \
    --admin-listen "127.0.0.1:$(admin_port "$r")" --router-policy "$POLICY" \
    --proxy-expose-routing-headers --log-level warn $(cluster_flags "$r" "$role") $GATEWAY_ARGS \
    >"$logf" 2>&1 &
  REPLICA_PID=$!
  PIDS+=("$REPLICA_PID")
}

REPLICA_PIDS=()
for r in $(seq 1 "$REPLICAS"); do
  start_replica "$r" seed "$OUT/kvgate-$r.log"
  REPLICA_PIDS+=("$REPLICA_PID")
done
for r in $(seq 1 "$REPLICAS"); do
  wait_http "http://127.0.0.1:$(gw_port "$r")/health" "${REPLICA_PIDS[$((r - 1))]}" 60 ||
    die "replica $r did not become healthy; see $OUT/kvgate-$r.log"
done

# --- the front: HAProxy or NGINX, round robin over the replicas ---
# http-no-delay: HAProxy otherwise holds a small write back (MSG_MORE) waiting for more of the
# message, which delays every SSE event, the first token included (docs/operations.md).
nodelay="  option http-no-delay"
[ "$HAPROXY_NO_DELAY" = 1 ] || nodelay="  # option http-no-delay left out (HAPROXY_NO_DELAY=0)"
write_haproxy() {
  cat <<EOF
# Written by scripts/replicas.sh: round robin over $REPLICAS kvgate replicas.
global
  maxconn 4096

defaults
  mode http
$nodelay
  timeout connect 2s
  retries 2
  option redispatch
  timeout client 10m
  timeout server 10m
  timeout http-keep-alive 30s

frontend kvgate
  bind $LB
  default_backend replicas

backend replicas
  balance roundrobin
  option httpchk GET /health
  http-check expect status 200
  http-response set-header X-Kvgate-Replica %s
EOF
  for r in $(seq 1 "$REPLICAS"); do
    echo "  server gw$r 127.0.0.1:$(gw_port "$r") check inter 1s fall 2 rise 1"
  done
  cat <<EOF

frontend stats
  bind 127.0.0.1:$((BASE_PORT + 9))
  stats enable
  stats uri /stats
EOF
}
# write_nginx: the same front in NGINX: HTTP/1.1 to the replicas with idle connections kept
# (keepalive, Connection ""), nothing buffered either way (proxy_buffering off: each SSE event
# is passed on as it arrives; proxy_request_buffering off), timeouts long enough for streams, a
# failed connection retried on the next replica (a POST is never resent once sent).
write_nginx() {
  cat <<EOF
# Written by scripts/replicas.sh: round robin over $REPLICAS kvgate replicas.
worker_processes 1;
daemon off;
pid $ROOT/$OUT/nginx.pid;
error_log $ROOT/$OUT/nginx.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $ROOT/$OUT/nginx-tmp/body;
  proxy_temp_path $ROOT/$OUT/nginx-tmp/proxy;
  fastcgi_temp_path $ROOT/$OUT/nginx-tmp/fastcgi;
  uwsgi_temp_path $ROOT/$OUT/nginx-tmp/uwsgi;
  scgi_temp_path $ROOT/$OUT/nginx-tmp/scgi;
  upstream replicas {
EOF
  for r in $(seq 1 "$REPLICAS"); do
    echo "    server 127.0.0.1:$(gw_port "$r") max_fails=2 fail_timeout=2s;"
  done
  cat <<EOF
    keepalive 64;
  }
  server {
    listen $LB;
    client_max_body_size 64m;
    location / {
      proxy_pass http://replicas;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host \$host;
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_connect_timeout 2s;
      proxy_read_timeout 10m;
      proxy_send_timeout 10m;
      proxy_next_upstream error timeout;
      add_header X-Kvgate-Replica \$upstream_addr always;
    }
  }
}
EOF
}
case "$FRONT" in
  haproxy)
    write_haproxy >"$OUT/haproxy.cfg"
    haproxy -c -q -f "$OUT/haproxy.cfg" >"$OUT/haproxy.log" 2>&1 || die "haproxy rejects $OUT/haproxy.cfg; see $OUT/haproxy.log"
    haproxy -db -f "$OUT/haproxy.cfg" >>"$OUT/haproxy.log" 2>&1 &
    ;;
  nginx)
    mkdir -p "$OUT/nginx-tmp"
    write_nginx >"$OUT/nginx.conf"
    nginx -t -q -c "$ROOT/$OUT/nginx.conf" >"$OUT/nginx.log" 2>&1 || die "nginx rejects $OUT/nginx.conf; see $OUT/nginx.log"
    nginx -c "$ROOT/$OUT/nginx.conf" >>"$OUT/nginx.log" 2>&1 &
    ;;
esac
if [ "$FRONT" != none ]; then
  front_pid=$!
  PIDS+=("$front_pid")
  wait_http "http://$LB/health" "$front_pid" 30 || die "$FRONT did not answer; see $OUT/$FRONT.log"
fi

# --- the replay ---
# metric_sum PORT NAME: the sum of a metric's series on a replica's /metrics (0 when absent).
metric_sum() {
  curl -sf "http://127.0.0.1:$1/metrics" 2>/dev/null | awk -v m="$2" '
    $1 == m || index($1, m "{") == 1 { s += $2; f = 1 } END { printf "%s", f ? s : 0 }' || printf "?"
}
# metric_by PORT NAME LABEL: a metric's non-zero series on a replica's /metrics as
# "value=n value=n" by LABEL ("-" when none).
metric_by() {
  curl -sf "http://127.0.0.1:$1/metrics" 2>/dev/null | awk -v m="$2" -v l="$3" '
    index($1, m "{") == 1 && $2 > 0 { v = $1; sub(".*" l "=\"", "", v); sub("\".*", "", v); printf "%s%s=%s", sep, v, $2; sep = " "; f = 1 }
    END { if (!f) printf "-" }' || printf "?"
}
bodies=()
[ "$COLD_REPLICA" = 1 ] && bodies=(--bodies-out "$OUT/bodies.jsonl")
log "replaying $TRACE through $FRONT (time scale $TIME_SCALE, $KVBENCH_ARGS)"
t_start=$(date +%s)
# kvbench runs in the background and the script waits for it: bash runs a trap only between
# commands, and `wait` is interruptible where a foreground command is not.
# shellcheck disable=SC2086 # KVBENCH_ARGS is a list of flags
"$BIN/kvbench" run --url "http://$LB" --model "$MODEL_NAME" --tokenizer "$MODEL_DIR" --trace "$TRACE" \
  --time-scale "$TIME_SCALE" --session-headers "$SESSION_HEADERS" --policy "$POLICY" \
  --label "${REPLICAS}x-$NATS" --out "$OUT/kvbench" --quiet "${bodies[@]}" $KVBENCH_ARGS \
  >"$OUT/kvbench.txt" 2>"$OUT/kvbench.log" &
kb=$!
PIDS+=("$kb")
# Faults during the replay, at seconds since it started: the external nats-server stopped at
# STOP_NATS_AT and started again (same port and store) NATS_DOWN_FOR later; the last replica
# killed (SIGKILL) at KILL_REPLICA_AT. FAULTS records what happened, for the report.
FAULTS=()
KILLED=""
plan=()
[ -n "$STOP_NATS_AT" ] && plan+=("$STOP_NATS_AT stop_nats")
[ -n "$STOP_NATS_AT" ] && [ -n "$NATS_DOWN_FOR" ] && plan+=("$((STOP_NATS_AT + NATS_DOWN_FOR)) start_nats")
[ -n "$KILL_REPLICA_AT" ] && plan+=("$KILL_REPLICA_AT kill_replica")
if [ "${#plan[@]}" -gt 0 ]; then
  while read -r at what; do
    while kill -0 "$kb" 2>/dev/null && [ "$(date +%s)" -lt $((t_start + at)) ]; do sleep 0.1; done
    if ! kill -0 "$kb" 2>/dev/null; then
      log "the replay ended before ${at}s: $what not done"
      FAULTS+=("$what planned at ${at}s: not done (the replay had ended)")
      continue
    fi
    el=$(($(date +%s) - t_start))
    case "$what" in
      stop_nats)
        log "stopping nats-server ${el}s into the replay"
        stop_pid "$nats_pid"
        FAULTS+=("nats-server stopped ${el}s into the replay")
        ;;
      start_nats)
        log "starting nats-server again ${el}s into the replay"
        start_nats
        FAULTS+=("nats-server started again ${el}s into the replay")
        ;;
      kill_replica)
        KILLED="$REPLICAS"
        pid="${REPLICA_PIDS[$((KILLED - 1))]}"
        inflight=$(metric_sum "$(gw_port "$KILLED")" kvgate_requests_in_flight)
        log "killing replica gw$KILLED (SIGKILL, $inflight client requests in flight) ${el}s into the replay"
        kill -KILL "$pid" 2>/dev/null || true
        stop_pid "$pid"
        FAULTS+=("replica gw$KILLED killed (SIGKILL) ${el}s into the replay with $inflight client requests in flight on it")
        ;;
    esac
  done < <(printf '%s\n' "${plan[@]}" | sort -n)
fi
wait "$kb" || die "kvbench failed; see $OUT/kvbench.log"
t_replay=$(($(date +%s) - t_start))

# --- the report ---
report() {
  local r s
  echo "== $REPLICAS replica(s), NATS $NATS, $WORKERS workers, trace $(basename "$TRACE"), replay ${t_replay}s =="
  jq -r '"requests ok \(.request_count), client errors \(.error_count)" +
      (if (.error_summary // {}) == {} then "" else " \(.error_summary | tostring)" end),
    "cached-token ratio \(.cached_token_ratio * 1000 | round / 1000), captured of theoretical \(.captured_cache_fraction * 1000 | round / 1000)",
    "TTFT mean \(.time_to_first_token.avg | round) ms, p90 \(.time_to_first_token.p90 | round) ms",
    "requests per worker \(.worker_distribution // {} | tostring)"' "$OUT/kvbench/$SUMMARY_FILE"
  # HAProxy's per-server request totals (stats CSV: pxname, svname, ..., stot is field 8).
  if [ "$FRONT" = haproxy ]; then
    s=$(curl -sf "http://127.0.0.1:$((BASE_PORT + 9))/stats;csv" | awk -F, '$1 == "replicas" && $2 ~ /^gw/ { printf "%s%s=%s", sep, $2, $8; sep = " " }') || s="?"
    echo "requests per replica (HAProxy) $s"
  else
    s=""
    for r in $(seq 1 "$REPLICAS"); do s="$s${s:+ }gw$r=$(metric_sum "$(gw_port "$r")" kvgate_requests_total)"; done
    echo "requests per replica (kvgate_requests_total) $s"
  fi
  for s in "${FAULTS[@]:-}"; do [ -n "$s" ] && echo "$s"; done
  # The last event sequence number of each worker (batches published since it started), as
  # replica 1 saw it: a ring of BUFFER_STEPS batches reaches back to the start when it is larger.
  s=$(curl -sf "http://127.0.0.1:$(admin_port 1)/debug/workers" |
    jq -r '[.targets[] | "\(.worker | sub("^http://"; ""))#\(.dp_rank)=\(.subscription.last_seq // "-")"] | join(" ")') || s="?"
  echo "event batches per worker (last_seq on gw1) $s; replay ring buffer_steps $BUFFER_STEPS"
  for r in $(seq 1 "$REPLICAS"); do
    [ "$r" = "$KILLED" ] && { echo "replica gw$r: killed"; continue; }
    [ "$NATS" = none ] && { echo "replica gw$r: no cluster section (NATS=none)"; continue; }
    printf 'replica gw%s: kvgate_cluster_connected %s, kvgate_cluster_errors_total %s (%s), /health %s\n' "$r" \
      "$(metric_sum "$(gw_port "$r")" kvgate_cluster_connected)" \
      "$(metric_sum "$(gw_port "$r")" kvgate_cluster_errors_total)" \
      "$(metric_by "$(gw_port "$r")" kvgate_cluster_errors_total component)" \
      "$(curl -s "http://127.0.0.1:$(gw_port "$r")/health" | jq -r '"degraded \(.degraded // [] | tostring)" +
        (if .cluster then ", disconnects \(.cluster.disconnects), reconnects \(.cluster.reconnects)" else "" end)' 2>/dev/null || echo '?')"
  done
}
report | tee "$OUT/report.txt"

# --- the front's added TTFT: the same short streamed request, direct and through the front ---
if [ "$FRONT" != none ] && [ "$FRONT_PROBES" -gt 0 ]; then
  nd="with option http-no-delay"
  [ "$HAPROXY_NO_DELAY" = 1 ] || nd="WITHOUT option http-no-delay"
  [ "$FRONT" = haproxy ] || nd="proxy_buffering off"
  if node scripts/front-ttft.mjs "http://127.0.0.1:$(gw_port 1)" "http://$LB" "$MODEL_NAME" "$FRONT_PROBES" >"$OUT/front-ttft.json" 2>"$OUT/front-ttft.log"; then
    jq -r --arg f "$FRONT" --arg nd "$nd" '"front \($f) (\($nd)): TTFT direct to gw1 mean \(.direct_ms.mean) ms (p50 \(.direct_ms.p50)), through the front mean \(.front_ms.mean) ms (p50 \(.front_ms.p50)): added \(.added_ms.mean) ms mean, \(.added_ms.p50) ms p50 over \(.probes) probes each"' \
      "$OUT/front-ttft.json" | tee -a "$OUT/report.txt"
  else
    echo "front $FRONT: the added-TTFT probe failed; see $OUT/front-ttft.log" | tee -a "$OUT/report.txt"
  fi
fi

# --- COLD_REPLICA=1: one more replica, started cold, against replica 1 ---
if [ "$COLD_REPLICA" = 1 ]; then
  mkdir -p "$OUT/cold"
  short=$(curl -sf "http://127.0.0.1:$(admin_port 1)/debug/workers" |
    jq -r --argjson b "$BUFFER_STEPS" '[.targets[] | select((.subscription.last_seq // 0) < $b) | .worker] | join(" ")') || short=""
  [ -n "$short" ] && log "WARNING: the replay ring (buffer_steps $BUFFER_STEPS) still reaches back to seq 0 on $short:" \
    "a cold replica can rebuild those from the ring alone (more traffic: KVBENCH_ARGS with a larger --repeat)"
  total=$(wc -l <"$OUT/bodies.jsonl")
  [ "$total" -gt 0 ] || die "kvbench logged no request bodies"
  # PROBES prompts spread over the replay (the later ones are the longest contexts), each with
  # a new user turn, so that no replica has routed exactly this prompt.
  i=0
  for line in $(awk -v n="$PROBES" -v t="$total" 'BEGIN { step = t / n; if (step < 1) step = 1
      for (k = 0; k < n && k < t; k++) print t - int(k * step) }' | sort -n | uniq); do
    i=$((i + 1))
    sed -n "${line}p" "$OUT/bodies.jsonl" | jq -c --arg q "held-out probe $i: summarise the change above in one line." \
      '.messages += [{"role": "user", "content": $q}] | .stream = false | del(.stream_options)' >"$OUT/cold/probe-$i.json"
  done
  nprobes=$i
  # overlap ADMIN_PORT: per probe and target, "probe worker#rank mode g1 g2", sorted.
  overlap() {
    local k
    for k in $(seq 1 "$nprobes"); do
      curl -sf -m 10 -X POST -H 'Content-Type: application/json' --data-binary "@$OUT/cold/probe-$k.json" \
        "http://127.0.0.1:$1/debug/route?endpoint=chat" |
        jq -r --arg k "$k" '.candidates[] | "\($k) \(.worker)#\(.dp_rank) \(.mode // "-") \(.g1_blocks) \(.g2_blocks)"' || return 1
    done | sort
  }
  # per_worker FILE: G1 and G2 summed over the probes, per worker#rank.
  per_worker() { awk '{ g1[$2] += $4; g2[$2] += $5; m[$2] = $3 } END { for (w in g1) print w, g1[w], g2[w], m[w] }' "$1" | sort; }
  overlap "$(admin_port 1)" >"$OUT/cold/warm.txt" || die "POST /debug/route failed on replica 1"
  cold=$((REPLICAS + 1))
  log "starting replica gw$cold cold ($COLD_ROLE, buffer_steps $BUFFER_STEPS), watching it for ${COLD_TIMEOUT}s"
  t0=$(date +%s.%N)
  start_replica "$cold" "$COLD_ROLE" "$OUT/kvgate-$cold.log"
  cold_pid=$REPLICA_PID
  matched=""
  at_within=""
  while :; do
    el=$(awk -v t0="$t0" -v t1="$(date +%s.%N)" 'BEGIN { printf "%.2f", t1 - t0 }')
    awk -v e="$el" -v m="$COLD_TIMEOUT" 'BEGIN { exit !(e > m) }' && break
    kill -0 "$cold_pid" 2>/dev/null || die "the cold replica exited; see $OUT/kvgate-$cold.log"
    if overlap "$(admin_port "$cold")" >"$OUT/cold/cold.txt" 2>/dev/null && [ -s "$OUT/cold/cold.txt" ]; then
      # The warm replica's view is read again each time: the workers may still evict or offload.
      overlap "$(admin_port 1)" >"$OUT/cold/warm.txt" || true
      if [ -z "$at_within" ] && awk -v e="$el" -v w="$COLD_WITHIN" 'BEGIN { exit !(e >= w) }'; then
        at_within="$el"
        cp "$OUT/cold/cold.txt" "$OUT/cold/cold-at-${COLD_WITHIN}s.txt"
        cp "$OUT/cold/warm.txt" "$OUT/cold/warm-at-${COLD_WITHIN}s.txt"
      fi
      if cut -d' ' -f1,2,4,5 "$OUT/cold/warm.txt" | cmp -s - <(cut -d' ' -f1,2,4,5 "$OUT/cold/cold.txt"); then
        matched="$el"
        break
      fi
    fi
    sleep 0.25
  done
  {
    echo "== cold replica gw$cold ($COLD_ROLE) against gw1 (saw everything), $nprobes held-out prompts, buffer_steps $BUFFER_STEPS =="
    # Each target's warm start on the cold replica (GET /debug/workers subscription.warm_start).
    curl -sf "http://127.0.0.1:$(admin_port "$cold")/debug/workers" | jq -r '.targets[] | "  warm start \(.worker)#\(.dp_rank): " +
      (.subscription.warm_start // {} | "\(.state // "-") \(.result // "-")" + (if .peer then " from \(.peer) at seq \(.seq), \(.bytes) bytes in \(.took_ms) ms" else "" end) +
      (if .error then " (\(.error))" else "" end))' || echo "  warm start: ? (GET /debug/workers failed)"
    echo "worker#rank: G1 warm / cold, G2 warm / cold (blocks summed over the probes), cold replica's scoring mode"
    join <(per_worker "$OUT/cold/warm.txt") <(per_worker "$OUT/cold/cold.txt") |
      awk '{ printf "  %s: G1 %d / %d, G2 %d / %d, %s\n", $1, $2, $5, $3, $6, $7 }'
    if [ -n "$matched" ]; then
      verdict="within ${COLD_WITHIN}s: no"
      awk -v e="$matched" -v w="$COLD_WITHIN" 'BEGIN { exit !(e <= w) }' && verdict="within ${COLD_WITHIN}s: yes"
      echo "the cold replica's per-worker G1/G2 overlap equalled the warm replica's on every probe ${matched}s after it started ($verdict)"
    else
      echo "the cold replica's overlap did NOT equal the warm replica's within ${COLD_TIMEOUT}s (per probe: $OUT/cold/warm.txt, $OUT/cold/cold.txt)"
    fi
  } | tee -a "$OUT/report.txt"
fi
echo "report: $OUT/report.txt  kvbench: $OUT/kvbench/  logs: $OUT/*.log"
