#!/usr/bin/env bash
# compare-throughput.sh — encode throughput of the pure-Go engine versus HF tokenizers (Rust, via
# the npm binding) on the golden corpus, both pinned to the same single core, side by side.
#
# Usage: scripts/goldens/compare-throughput.sh [core] [passes]
# Prints tokens/s for both and the ratio go/hf per model (HF figure: the better of its per-text
# `encode` and its `encodeBatch` loop on one rayon thread).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CORE="${1:-1}"
PASSES="${2:-2}"
cd "$ROOT"
[ -d scripts/goldens/node_modules/@anush008/tokenizers ] || (cd scripts/goldens && npm ci --no-audit --no-fund >/dev/null)
scripts/fetch-tokenizers.sh >/dev/null

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
taskset -c "$CORE" env GOMAXPROCS=1 go test -run '^$' -bench 'BenchmarkEncodeCorpus(NoCache)?$' -benchtime "${PASSES}x" -count=1 \
  ./tokenize/engine/ | tee "$tmp/go.txt"
taskset -c "$CORE" env RAYON_NUM_THREADS=1 UV_THREADPOOL_SIZE=1 TOKENIZERS_PARALLELISM=false \
  node scripts/goldens/bench-tokens.mjs "$PASSES" | tee "$tmp/hf.txt"

echo
printf '%-12s %14s %14s %14s %8s %8s\n' model go_tok/s go_nocache hf_tok/s ratio nocache
for m in qwen3 llama3_1 deepseek_v3 gptoss gemma3; do
  tps() { awk -v b="$1" -v m="$m" '$1 ~ "^"b"/"m"(-[0-9]+)?$" { for (i = 1; i < NF; i++) if ($(i+1) == "tokens/s") print $i }' "$tmp/go.txt"; }
  go_tps="$(tps BenchmarkEncodeCorpus)"
  go_nc="$(tps BenchmarkEncodeCorpusNoCache)"
  hf_tps="$(awk -v m="$m" '$1 == m {
      for (i = 1; i <= NF; i++) if ($i == "Mtok/s") v[++n] = $(i-1)
      print (v[1] > v[2] ? v[1] : v[2]) * 1e6 }' "$tmp/hf.txt")"
  awk -v m="$m" -v g="$go_tps" -v c="$go_nc" -v h="$hf_tps" \
    'BEGIN { printf "%-12s %14.0f %14.0f %14.0f %7.1fx %7.1fx\n", m, g, c, h, g / h, c / h }'
done
