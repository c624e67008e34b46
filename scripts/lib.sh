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
