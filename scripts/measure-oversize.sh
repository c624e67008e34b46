#!/usr/bin/env bash
# Measure what an oversized prompt costs the gateway: start one simulated worker and kvgate
# (KV-aware policy, so every prompt is tokenized) on loopback, post 30 MiB chat bodies (one
# message; many messages; three at once) and report each answer's status and time plus the
# kvgate process's RSS growth (VmHWM peak minus VmRSS before, from /proc/PID/status).
#
#   scripts/measure-oversize.sh            # needs models/llama3_1 (scripts/fetch-tokenizers.sh)
#
# Environment: MODEL_DIR (./models/llama3_1), MB (30), SIM_PORT (18301), GW_PORT (18300).
# Reports figures only; it does not judge them.
set -euo pipefail
cd "$(dirname "$0")/.."
model_dir="${MODEL_DIR:-./models/llama3_1}"
mb="${MB:-30}"
sim_port="${SIM_PORT:-18301}"
gw_port="${GW_PORT:-18300}"
tmp="$(mktemp -d)"
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

go build -o "$tmp/kvgate" ./cmd/kvgate
go build -o "$tmp/vllm-sim" ./cmd/vllm-sim
"$tmp/vllm-sim" --host 127.0.0.1 --port "$sim_port" --model "$model_dir" --served-model-name m \
	--log-level warn >"$tmp/sim.log" 2>&1 &
pids+=($!)
gw=
start_gw() { # a fresh kvgate process, so each scenario's RSS growth is its own
	if [[ -n "$gw" ]]; then
		kill "$gw"
		wait "$gw" 2>/dev/null || true
	fi
	"$tmp/kvgate" serve --listen "127.0.0.1:$gw_port" --model m --tokenizer "$model_dir" \
		--router-policy kv_no_load --worker "http://127.0.0.1:$sim_port" --shutdown-drain-delay 0s \
		--log-level warn >>"$tmp/gw.log" 2>&1 &
	gw=$!
	pids+=("$gw")
	for _ in $(seq 100); do
		curl -fsS "http://127.0.0.1:$gw_port/health" >/dev/null 2>&1 && break
		sleep 0.1
	done
	# Warm up (tokenizer caches, first GC cycles) with a small request.
	curl -sS -o /dev/null -H 'Content-Type: application/json' \
		-d '{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}' \
		"http://127.0.0.1:$gw_port/v1/chat/completions"
}

python3 - "$tmp" "$mb" <<'PY'
import json, sys
tmp, mb = sys.argv[1], int(sys.argv[2])
text = ("hello world, this is a test of things. " * ((mb << 20) // 39 + 1))[: mb << 20]
one = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": text}]}
k = 1 << 10
parts = [text[i:i + k] for i in range(0, len(text), k)]
many = {"model": "m", "max_tokens": 1, "messages": [
    {"role": ("user", "assistant")[i % 2], "content": p} for i, p in enumerate(parts)]}
json.dump(one, open(f"{tmp}/one.json", "w"))
json.dump(many, open(f"{tmp}/many.json", "w"))
PY

rss() { awk -v k="$2" '$1 == k":" {print int($2 / 1024)}' "/proc/$1/status"; }
post() { # body-file label
	curl -sS -o "$tmp/$2.out" -w "$2: HTTP %{http_code} in %{time_total}s (body $(($(stat -c %s "$1") >> 20)) MiB)\n" \
		-H 'Content-Type: application/json' --data-binary "@$1" "http://127.0.0.1:$gw_port/v1/chat/completions"
}
for run in one many three; do
	start_gw
	before=$(rss "$gw" VmRSS)
	case $run in
	one) post "$tmp/one.json" one ;;
	many) post "$tmp/many.json" many ;;
	three)
		cpids=()
		for i in 1 2 3; do
			post "$tmp/one.json" "three-$i" &
			cpids+=($!)
		done
		wait "${cpids[@]}"
		;;
	esac
	echo "  kvgate RSS before ${before} MB, peak (VmHWM) $(rss "$gw" VmHWM) MB, after $(rss "$gw" VmRSS) MB"
done
echo "answer: $(head -c 300 "$tmp/one.out")"
