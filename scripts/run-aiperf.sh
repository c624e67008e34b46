#!/usr/bin/env bash
# run-aiperf.sh — benchmark a kvgate deployment with NVIDIA aiperf on a trace, streaming, with
# session headers on (X-Session-ID and Dynamo-style ids, parent ids on subagent requests).
# (Needs `pip install aiperf`; it cannot run on the development machine — kvbench is the
# self-contained equivalent.)
#
# Usage: scripts/run-aiperf.sh TRACE [extra aiperf profile flags...]
#   TRACE: a mooncake_trace / multi_turn / single_turn JSONL file, or a Weka trace file or folder.
#
# Env (defaults in brackets):
#   URL             gateway URL [http://127.0.0.1:8000]
#   MODEL           served model name (required)
#   TOKENIZER       HF tokenizer id or folder for aiperf's prompt synthesis [MODEL]
#   FORMAT          mooncake_trace | weka_trace | multi_turn | single_turn [detected]
#   CONCURRENCY     replay under closed-loop load with N sessions instead of the trace's
#                   timestamps (--no-fixed-schedule --concurrency N) [unset: fixed schedule]
#   REQUEST_COUNT   with CONCURRENCY: stop after N requests [unset]
#   SESSION_ROUTING aiperf --session-routing mode for builds that have it, e.g. dynamo_headers
#                   [unset: the environment switches below are used]
#   OUT_DIR         aiperf --output-artifact-dir [artifacts/aiperf-<trace>-<UTC time>]
#   AIPERF          aiperf executable [aiperf]
set -euo pipefail

[ $# -ge 1 ] || { sed -n '2,22p' "$0"; exit 2; }
TRACE="$1"
shift
AIPERF="${AIPERF:-aiperf}"
command -v "$AIPERF" >/dev/null || { echo "run-aiperf: $AIPERF not found (pip install aiperf)" >&2; exit 1; }
[ -e "$TRACE" ] || { echo "run-aiperf: $TRACE not found" >&2; exit 1; }
: "${MODEL:?set MODEL to the served model name}"
URL="${URL:-http://127.0.0.1:8000}"
TOKENIZER="${TOKENIZER:-$MODEL}"
OUT_DIR="${OUT_DIR:-artifacts/aiperf-$(basename "${TRACE%.*}")-$(date -u +%Y%m%dT%H%M%SZ)}"

if [ -z "${FORMAT:-}" ]; then
  if [ -d "$TRACE" ] || [[ "$TRACE" == *.json ]]; then
    FORMAT=weka_trace
  else
    first="$(head -c 65536 "$TRACE" | head -n 1)"
    case "$first" in
      *'"requests"'*) FORMAT=weka_trace ;;
      *'"turns"'*) FORMAT=multi_turn ;;
      *'"input_length"'* | *'"hash_ids"'* | *'"text_input"'* | *'"messages"'*) FORMAT=mooncake_trace ;;
      *'"text"'* | *'"texts"'*) FORMAT=single_turn ;;
      *) echo "run-aiperf: cannot detect the format of $TRACE; set FORMAT" >&2; exit 1 ;;
    esac
  fi
fi

args=(profile
  --model "$MODEL" --url "$URL"
  --endpoint-type chat --streaming
  --tokenizer "$TOKENIZER"
  --input-file "$TRACE" --custom-dataset-type "$FORMAT"
  # every request generates exactly its recorded output length
  --extra-inputs ignore_eos:true
  # TTFT/ITL/OSL from the server's usage chunk (stream_options.include_usage), which also
  # carries prompt_tokens_details.cached_tokens ("Usage Prompt Cache Read")
  --use-server-token-count
  --output-artifact-dir "$OUT_DIR")
if [ "$FORMAT" = mooncake_trace ]; then
  args+=(--isl-block-size 512)
fi
if [ -n "${CONCURRENCY:-}" ]; then
  args+=(--no-fixed-schedule --concurrency "$CONCURRENCY")
  [ -n "${REQUEST_COUNT:-}" ] && args+=(--request-count "$REQUEST_COUNT")
elif [ "$FORMAT" = mooncake_trace ] || [ "$FORMAT" = single_turn ] || [ "$FORMAT" = multi_turn ]; then
  args+=(--fixed-schedule)
fi
[ -n "${SESSION_ROUTING:-}" ] && args+=(--session-routing "$SESSION_ROUTING")

# Session headers: X-Correlation-ID is always sent (one id per conversation replay); these
# switches add X-Session-ID, and X-Dynamo-Session-ID / X-Dynamo-Parent-Session-ID on subagent
# conversations, all of which kvgate reads (see docs/ARCHITECTURE.md, "Session identity").
export AIPERF_HTTP_X_SESSION_ID_FROM_CORRELATION_ID=1
export AIPERF_HTTP_X_DYNAMO_SESSION_ID_FROM_CORRELATION_ID=1

echo "run-aiperf: $AIPERF ${args[*]} $*" >&2
"$AIPERF" "${args[@]}" "$@"
echo "run-aiperf: results in $OUT_DIR (profile_export_aiperf.json / .csv)" >&2
