#!/usr/bin/env bash
# compare-policies.sh — replay one trace through kvgate once per routing policy, each time in
# front of a fresh simulated vLLM fleet (cold caches, same trace), and write the comparison.
#
# Usage: scripts/compare-policies.sh [TRACE]      (default: testdata/traces/trace_0291.json)
#
# Env (defaults in brackets):
#   POLICIES        variants to run, first = baseline of the ratios
#                   ["round_robin least_loaded kv kv+sessions"]; a variant is
#                   POLICY or LABEL=POLICY[:SESSION_HEADERS]; "kv+sessions" means policy kv with
#                   kvbench --session-headers both. Variants the gateway rejects are skipped.
#   GATEWAY_ARGS_<label>  extra `kvgate serve` flags for one variant, label with every character
#                   other than [A-Za-z0-9] as _ (e.g. GATEWAY_ARGS_kv_sessions="--flag v")
#   GATEWAY_ARGS    extra `kvgate serve` flags for every variant
#   KV_NO_SESSIONS_ARGS  default GATEWAY_ARGS_kv: kvgate flags that turn session affinity and
#                   parent-aware placement off, so "kv" measures KV-aware routing alone
#   OUT             output directory [out/compare-<UTC time>]
#   WORKERS         simulated workers [4]
#   MODEL_DIR       tokenizer folder of the served model [models/qwen3]
#   MODEL_NAME      served model name [qwen3]
#   BLOCK_SIZE      KV block size of workers and gateway [16]
#   SPEEDUP         vllm-sim --speedup (simulated time / wall time) [1]; above 1 the simulated
#                   GPU time is compressed relative to the gateway's CPU time (a warning says so)
#   SIM_ARGS        extra vllm-sim flags (e.g. "--profile llama3.1-8b-bf16-h200")
#   NUM_GPU_BLOCKS  KV blocks per simulated worker [16384]
#   MAX_MODEL_LEN   [262144] (agentic traces reach 100k+ tokens)
#   TIME_SCALE      kvbench --time-scale [0.02]
#   API             kvbench --api: chat, messages (Anthropic /v1/messages) or responses
#                   (stateless /v1/responses) [chat]; when set, run labels are LABEL/API.
#                   Each run also saves kvgate's /metrics (OUT/<label>/kvgate-metrics.txt) and
#                   logs its usage reports and prompt-token mismatches (0: exact prompts)
#   KVBENCH_ARGS    extra kvbench run flags (e.g. "--max-requests 200 --repeat 4")
#   BASE_PORT       first port used; workers take BASE_PORT+1.., gateway BASE_PORT, KV events
#                   BASE_PORT+100.. [18000 + 40*(PID mod 50)]
#   BIN             where the binaries are built [OUT/bin]; SKIP_BUILD=1 uses existing ones
#   QUIET=1         no progress bars
#   PARALLEL=1      run every variant at the same time, each on its own fleet and ports
#                   (BASE_PORT + 200·i); the default runs them one after another
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TRACE="${1:-testdata/traces/trace_0291.json}"
POLICIES="${POLICIES:-round_robin least_loaded kv kv+sessions}"
OUT="${OUT:-out/compare-$(date -u +%Y%m%dT%H%M%SZ)}"
WORKERS="${WORKERS:-4}"
MODEL_DIR="${MODEL_DIR:-models/qwen3}"
MODEL_NAME="${MODEL_NAME:-qwen3}"
BLOCK_SIZE="${BLOCK_SIZE:-16}"
SPEEDUP="${SPEEDUP:-1}"
NUM_GPU_BLOCKS="${NUM_GPU_BLOCKS:-16384}"
MAX_MODEL_LEN="${MAX_MODEL_LEN:-262144}"
TIME_SCALE="${TIME_SCALE:-0.02}"
KVBENCH_ARGS="${KVBENCH_ARGS:-}"
BASE_PORT="${BASE_PORT:-$((18000 + 40 * ($$ % 50)))}"
BIN="${BIN:-$OUT/bin}"
KV_NO_SESSIONS_ARGS="${KV_NO_SESSIONS_ARGS:---sessions-affinity-blocks 0 --sessions-parent-aware=false --sessions-parent-blocks 0 --sessions-sibling-prefix=false}"

NAME=compare-policies
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

[ -e "$TRACE" ] || die "trace $TRACE not found"
command -v curl >/dev/null || die "curl is required"
log "building kvgate, vllm-sim, kvbench into $BIN"
build_bins
warn_speedup "$SPEEDUP"

# shellcheck disable=SC2086 # KVBENCH_ARGS is a list of flags
run_all "$OUT" "$TRACE" "$TIME_SCALE" $KVBENCH_ARGS

[ "${#RUNS[@]}" -gt 0 ] || die "no policy ran"
"$BIN/kvbench" compare --title "kvgate routing policies on $(basename "$TRACE")" \
  --html "$OUT/report.html" --png "$OUT/report.png" "${RUNS[@]}" | tee "$OUT/comparison.txt"
echo "comparison: $OUT/comparison.txt"
echo "HTML report: $OUT/report.html"
echo "headline chart: $OUT/report.png"
