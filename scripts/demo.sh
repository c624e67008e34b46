#!/usr/bin/env bash
# demo.sh — `make demo`: a real Claude Code agentic session (Weka / cc-traces trace_0291: 20 main
# turns, 2 Explore subagents, prompts up to 100k tokens) replayed through kvgate in front of 4
# simulated vLLM workers, once per routing policy, each on a fresh fleet. Prints the comparison
# table against round robin and the HTML report path. Every process it starts is stopped on exit
# (scripts/compare-policies.sh traps EXIT, INT and TERM).
#
# Env: OUT [out/demo], POLICIES [round_robin least_loaded kv kv+sessions], TRACE
#      [testdata/traces/trace_0291.json], TIME_SCALE [0.01], SPEEDUP [1], PARALLEL [1], plus
#      compare-policies.sh's.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
start=$(date +%s)
TRACE="${TRACE:-testdata/traces/trace_0291.json}"
export OUT="${OUT:-out/demo}"
export POLICIES="${POLICIES:-round_robin least_loaded kv kv+sessions}"
export WORKERS=4
export TIME_SCALE="${TIME_SCALE:-0.01}"
# The demo is about prefill (TTFT) and cache reuse: outputs are capped so that a run of the
# whole session takes ~20 s; the pre-canned assistant turns keep the trace's real lengths.
export KVBENCH_ARGS="${KVBENCH_ARGS:---max-output-tokens 64}"
# Real time (SPEEDUP=1): simulated GPU time is not compressed against the gateway's CPU time.
# To stay well under 3 minutes the four policies run at the same time, each on its own fleet
# (PARALLEL=1): the workers mostly sleep, so they do not slow each other down.
export SPEEDUP="${SPEEDUP:-1}"
export PARALLEL="${PARALLEL:-1}"

if [ ! -f models/qwen3/tokenizer.json ]; then
  scripts/fetch-tokenizers.sh qwen3
fi
rm -rf "$OUT"
echo "demo: replaying $TRACE ($(basename "$TRACE")) through kvgate + 4 simulated workers with: $POLICIES" >&2
scripts/compare-policies.sh "$TRACE"
echo "demo: finished in $(( $(date +%s) - start )) s; open $OUT/report.html in a browser"
