#!/usr/bin/env bash
# key-limits.sh — a client key's requests_per_minute through one kvgate and through several
# replicas sharing NATS (issue 33's limits measurement).
#
# Two simulated workers serve kvgate configured with one limited key (auth.keys:
# requests_per_minute RPM, default burst); scripts/limitsload sends REQUESTS chat requests evenly
# over DURATION with that key, first to one gateway, then spread round robin over REPLICAS
# replicas whose embedded NATS servers form one cluster. For each run it prints the admitted
# (200) and limited (429) counts, per replica and in total, against the single bucket's
# expectation: RPM/60 per second for DURATION plus the burst (max(1, RPM/60)).
#
# Usage: scripts/key-limits.sh
# Env (defaults in brackets): RPM [300], REQUESTS [1000], DURATION [10s], REPLICAS [3],
#   OUT [out/key-limits], BASE_PORT [25000 + 200*(PID mod 40)], MODEL_DIR [models/qwen3],
#   MODEL_NAME [qwen3], BIN [OUT/bin] (SKIP_BUILD=1 uses existing binaries)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
RPM="${RPM:-300}"
REQUESTS="${REQUESTS:-1000}"
DURATION="${DURATION:-10s}"
REPLICAS="${REPLICAS:-3}"
OUT="${OUT:-out/key-limits}"
MODEL_DIR="${MODEL_DIR:-models/qwen3}"
MODEL_NAME="${MODEL_NAME:-qwen3}"
BASE_PORT="${BASE_PORT:-$((25000 + 200 * ($$ % 40)))}"
BIN="${BIN:-$OUT/bin}"
KEY="sk-limits-measure-0123456789"

NAME=key-limits
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
command -v jq >/dev/null || die "jq is required (apt-get install -y jq)"
[[ "$REPLICAS" =~ ^[1-9]$ ]] || die "REPLICAS=$REPLICAS: want 1..9"

mkdir -p "$OUT"
build_bins
[ "${SKIP_BUILD:-0}" = 1 ] || go build -o "$BIN/limitsload" ./scripts/limitsload

gw_port() { echo $((BASE_PORT + 10 + $1)); }
nats_port() { echo $((BASE_PORT + 30 + $1)); }
route_port() { echo $((BASE_PORT + 40 + $1)); }

start_fleet "127.0.0.1:$(gw_port 1)"
[ -s "$OUT/fleet.yaml" ] || die "the simulated fleet wrote no config; see $OUT/fleet.log"
# The fleet's config plus the limited key (the generated file has no auth section).
grep -q '^auth:' "$OUT/fleet.yaml" && die "$OUT/fleet.yaml already has an auth section"
{
  cat "$OUT/fleet.yaml"
  printf '\nauth:\n  keys:\n    - key: %s\n      name: measured\n      requests_per_minute: %d\n' "$KEY" "$RPM"
} >"$OUT/limits.yaml"

# run_replicas N: N replicas (embedded NATS joined by routes when N > 1), the load, the result
# in OUT/rN.json.
run_replicas() {
  local n="$1" r urls="" routes="" pids=()
  for r in $(seq 1 "$n"); do routes="$routes${routes:+,}127.0.0.1:$(route_port "$r")"; done
  rm -rf "$OUT/jetstream"
  for r in $(seq 1 "$n"); do
    local cluster=()
    if [ "$n" -gt 1 ]; then
      cluster=(--cluster-replica-id "gw$r" --cluster-embedded-nats-listen "127.0.0.1:$(nats_port "$r")"
        --cluster-embedded-nats-cluster-listen "127.0.0.1:$(route_port "$r")"
        --cluster-embedded-nats-routes "$routes" --cluster-embedded-nats-store-dir "$OUT/jetstream/gw$r")
    fi
    "$BIN/kvgate" serve --config "$OUT/limits.yaml" --listen "127.0.0.1:$(gw_port "$r")" \
      --log-level warn "${cluster[@]}" >"$OUT/kvgate-$n-$r.log" 2>&1 &
    pids+=("$!")
    PIDS+=("$!")
    urls="$urls${urls:+,}http://127.0.0.1:$(gw_port "$r")"
  done
  for r in $(seq 1 "$n"); do
    wait_http "http://127.0.0.1:$(gw_port "$r")/health" "${pids[$((r - 1))]}" 60 ||
      die "replica $r did not become healthy; see $OUT/kvgate-$n-$r.log"
  done
  if [ "$n" -gt 1 ]; then
    # Until every replica hears the others' limit reports (the heartbeats every 100 ms).
    local tries=100 ok
    while :; do
      ok=0
      for r in $(seq 1 "$n"); do
        got=$(curl -sf "http://127.0.0.1:$(gw_port "$r")/metrics" | awk '$1 == "kvgate_cluster_limits_messages_total{event=\"received\"}" { print int($2) }')
        [ "${got:-0}" -ge $((10 * (n - 1))) ] && ok=$((ok + 1))
      done
      [ "$ok" -eq "$n" ] && break
      tries=$((tries - 1))
      [ "$tries" -gt 0 ] || die "the replicas did not hear each other's limit reports; see $OUT/kvgate-$n-*.log"
      sleep 0.1
    done
  fi
  log "$REQUESTS requests over $DURATION against a $RPM rpm key through $n gateway(s)"
  "$BIN/limitsload" --urls "$urls" --key "$KEY" --model "$MODEL_NAME" --requests "$REQUESTS" \
    --duration "$DURATION" >"$OUT/r$n.json"
  # Each replica's metrics after the load (the limiter's refusals by reason, the queue's
  # outcomes): what a count off the expectation is first read against.
  for r in $(seq 1 "$n"); do
    curl -sf "http://127.0.0.1:$(gw_port "$r")/metrics" >"$OUT/metrics-$n-$r.txt" || true
  done
  for p in "${pids[@]}"; do stop_pid "$p"; done
}

run_replicas 1
[ "$REPLICAS" -gt 1 ] && run_replicas "$REPLICAS"

secs=$(awk -v d="$DURATION" 'BEGIN { sub("s$", "", d); print d }')
expect=$(awk -v r="$RPM" -v s="$secs" 'BEGIN { b = r / 60; if (b < 1) b = 1; printf "%g", r / 60 * s + b }')
echo "expected (one bucket): $RPM/60 per second for $secs s plus a burst of $(awk -v r="$RPM" 'BEGIN { b = r / 60; if (b < 1) b = 1; printf "%g", b }') = $expect"
printf '| gateways | admitted (200) | limited (429) | other | errors | per replica (200) | vs expected | within 5%% |\n|---|---|---|---|---|---|---|---|\n'
for n in 1 "$REPLICAS"; do
  [ -f "$OUT/r$n.json" ] || continue
  [ "$n" = 1 ] && [ "$REPLICAS" = 1 ] && [ -n "${done1:-}" ] && continue
  done1=1
  jq -r --arg n "$n" --argjson e "$expect" '
    .total as $t | ($t.ok / $e) as $q |
    "| \($n) | \($t.ok) | \($t.limited) | \($t.other) | \($t.errors) | \([.replicas[].ok] | map(tostring) | join(" / ")) | \($q * 1000 | round / 1000) | \(if ($q - 1 | fabs) <= 0.05 then "yes" else "NO" end) |"' "$OUT/r$n.json"
  jq -r '.total | select(.missing_ratelimit_headers > 0 or .missing_retry_after > 0) |
    "  WARNING: \(.missing_ratelimit_headers) responses without x-ratelimit headers, \(.missing_retry_after) 429s without Retry-After"' "$OUT/r$n.json"
done
