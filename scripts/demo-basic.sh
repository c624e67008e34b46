#!/usr/bin/env bash
# The basic demo: two simulated vLLM workers, kvgate (round robin) in front, a few chat
# requests with the go-openai client, then everything is stopped. Needs `make build`.
#
# Env: PORT_BASE (18100: workers on +1, +2, gateway on +0), POLICY (round_robin).
set -euo pipefail
# This script reads per-worker series from the gateway's client /metrics (loopback only).
export KVGATE_METRICS_DETAILED_PUBLIC=true
cd "$(dirname "$0")/.."
base="${PORT_BASE:-18100}"
model=demo-model
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

wait_healthy() {
	for _ in $(seq 1 200); do
		curl -fsS -o /dev/null "$1/health" 2>/dev/null && return 0
		sleep 0.05
	done
	echo "demo: $1 did not become healthy" >&2
	return 1
}

workers=()
for i in 1 2; do
	port=$((base + i))
	bin/vllm-sim --host 127.0.0.1 --port "$port" --served-model-name "$model" \
		--ttft 30ms --itl 5ms --log-level warn &
	pids+=($!)
	workers+=(--worker "http://127.0.0.1:$port")
	wait_healthy "http://127.0.0.1:$port"
done
echo "demo: 2 simulated workers up on ports $((base + 1)) and $((base + 2))"

# The demo prints which worker served each request: turn the routing headers on (they are off by
# default because X-Kvgate-Cached-Blocks reveals cache state to clients).
bin/kvgate serve --model "$model" --listen "127.0.0.1:$base" --router-policy "${POLICY:-round_robin}" \
	--proxy-expose-routing-headers --log-level warn "${workers[@]}" &
pids+=($!)
wait_healthy "http://127.0.0.1:$base"
echo "demo: kvgate up on 127.0.0.1:$base: $(curl -fsS "http://127.0.0.1:$base/health")"
echo

go run ./scripts/democlient --base "http://127.0.0.1:$base/v1" --model "$model" --n 4

echo
echo "demo: gateway metrics (excerpt):"
curl -fsS "http://127.0.0.1:$base/metrics" | grep -E '^kvgate_(requests_total|worker_requests_total|worker_healthy)' || true
