package main

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/sim"
)

// Cache protection (flow_control.protect_cache), end to end on two workers of 130 KV blocks
// with KV events: a priority-1 request's ~100-block prompt is cached on one worker; a
// priority-0 request sharing its first ~40 blocks, which kv sends to that worker for the
// cache, would add ~60 blocks there and make LRU evict part of the priority-1 prompt. With
// protection it goes to the other worker (kvgate_flow_protected_total{by="priority"}), and
// the priority-1 class still goes to its own worker. Without protection the same request goes
// to the cached worker (the premise: the rule, not the router, moved it).
func TestFlowControlProtectsCacheE2E(t *testing.T) {
	shared := longText(1, 45) // ~640 tokens: ~40 blocks
	vip := map[string]string{"X-Kvgate-Priority": "1"}
	low := map[string]string{"X-Kvgate-Priority": "0"}
	for _, tc := range []struct {
		name    string
		args    []string
		toOther bool // the priority-0 request goes to the worker without the priority-1 prompt
	}{
		{"protected", []string{"--flow-control-protect-cache"}, true},
		{"unprotected", []string{"--flow-control-protect-cache=false"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := needModel(t)
			f := startFleet(t, tok, fleetSpec{workers: 2, events: true,
				simOpts: func(_ int, o *sim.Options) { o.NumGPUBlocks, o.TTFT = 130, 20*time.Millisecond },
				args:    append([]string{"--router-policy", "kv", "--flow-control-enabled"}, tc.args...)})
			first := chatRequest(shared, longText(2, 68))
			v := f.flowSend(context.Background(), "vip-1", "/v1/chat/completions", first, vip)
			v.ok(t)
			wv := v.header.Get("X-Kvgate-Worker")
			f.awaitCached(first, wv, vip)
			l := f.flowSend(context.Background(), "low", "/v1/chat/completions", chatRequest(shared, longText(3, 68)), low)
			l.ok(t)
			if got := l.header.Get("X-Kvgate-Worker"); (got != wv) != tc.toOther {
				t.Errorf("the priority-0 request went to %s; the priority-1 prompt is on %s (want it elsewhere: %v)", got, wv, tc.toOther)
			}
			want := 0.0
			if tc.toOther {
				want = 1
			}
			if got := f.metric("kvgate_flow_protected_total", map[string]string{"by": "priority"}); got != want {
				t.Errorf("kvgate_flow_protected_total{by=priority} = %v, want %v", got, want)
			}
			again := f.flowSend(context.Background(), "vip-2", "/v1/chat/completions", chatRequest(shared, longText(2, 68)+" and one more question"), vip)
			again.ok(t)
			if got := again.header.Get("X-Kvgate-Worker"); tc.toOther && got != wv {
				t.Errorf("the priority-1 class's next request went to %s, not to its own worker %s", got, wv)
			}
		})
	}
}
