# fanout-0277.jq: cuts testdata/traces/fanout-0277.json out of testdata/traces/trace_0277.json
# (a real Claude Code session; provenance in README.md). Run from the repository root:
#   jq -c -f testdata/traces/fanout-0277.jq testdata/traces/trace_0277.json > testdata/traces/fanout-0277.json
# The cut: the session up to its Plan subagent (spawned alone, 723.5 s in, from a later parent
# turn) — the first parent turn, the three Explore subagents that turn launched (every turn of
# each, verbatim) and the parent's turns recorded before the Plan subagent. One edit: the three
# Explore subagents spawn together at the first one's recorded spawn time (the recording has
# them 79.2, 183.9 and 211.3 s in), as parallel Task calls from one assistant message do.
(.requests | map(select(.type == "subagent" and .subagent_type == "Plan")) | first | .t) as $plan
| (.requests | map(select(.type == "subagent" and .subagent_type == "Explore")) | first | .t) as $spawn
| .id = "fanout-0277"
| .requests |= map(select(.t < $plan) | if .type == "subagent" then .t = $spawn else . end)
| ([.requests[] | select(.type != "subagent")]) as $parent
| ([.requests[] | select(.type == "subagent") | .requests[]]) as $subs
| .totals = {
    parent_tokens: {input: ($parent | map(.in) | add), output: ($parent | map(.out) | add)},
    subagent_tokens: {input: ($subs | map(.in) | add), output: ($subs | map(.out) | add)},
    combined_tokens: {input: ([$parent[], $subs[]] | map(.in) | add), output: ([$parent[], $subs[]] | map(.out) | add)},
    subagent_count: ([.requests[] | select(.type == "subagent")] | length)
  }
