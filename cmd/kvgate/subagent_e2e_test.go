package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/sim"
)

// kidResult is what one subagent's first request reported.
type kidResult struct {
	id     string
	worker string
	cached int
	prompt int
	err    error
}

// postKid sends one request with headers from its own goroutine (no t.Fatal off the test goroutine).
func postKid(url string, body any, h map[string]string) (worker string, prompt, cached int, err error) {
	data, err := json.Marshal(body)
	if err != nil {
		return "", 0, 0, err
	}
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", 0, 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", 0, 0, fmt.Errorf("%d %s", resp.StatusCode, b)
	}
	var out struct {
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			PromptTokensDetails *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return "", 0, 0, err
	}
	if out.Usage.PromptTokensDetails != nil {
		cached = out.Usage.PromptTokensDetails.CachedTokens
	}
	return resp.Header.Get("X-Kvgate-Worker"), out.Usage.PromptTokens, cached, nil
}

// TestSubagentPlacement is the end-to-end test of subagent placement. A root agent session with a
// long system prompt runs a turn; then it spawns four subagents at once, each its own session
// carrying the root as X-Parent-Session-ID, each prompt = the root's system prompt + a long task of
// its own. The subagents are in flight together (slow prefill), so the kv policy's load term pushes
// later ones away from the root's worker unless something holds them there.
//   - parent-aware placement on: all four land on the root's worker and report the system prompt
//     as cached tokens;
//   - off, under the block cost (kv_blocks) with the sibling hold off: they scatter over the
//     fleet, and those elsewhere re-prefill everything (0 cached). Under kv's predicted-time cost
//     the cached system prompt alone may keep them together when the root's worker is not
//     loaded, which is the point of that cost, so kv cannot show what the hint adds;
//   - on, with the root's worker saturated (busy threshold): they spread, the hint being soft
//     (with the gateway queue off: with it on the queue binds them, see the last case).
func TestSubagentPlacement(t *testing.T) {
	tok := needModel(t)
	system := "You are the lead agent of a code-review crew. " + longText(4242, 150) // ≈2,600 tokens
	cases := []struct {
		name  string
		args  []string
		check func(t *testing.T, rootW string, kids []kidResult, sysTokens int)
	}{
		{"parent-aware", []string{"--sessions-parent-blocks", "1024"},
			func(t *testing.T, rootW string, kids []kidResult, sysTokens int) {
				for _, k := range kids {
					if k.worker != rootW {
						t.Errorf("%s landed on %s, want the root's worker %s", k.id, k.worker, rootW)
					}
					if k.cached < sysTokens-16 {
						t.Errorf("%s reported %d cached tokens, want the system prompt's ≈%d", k.id, k.cached, sysTokens)
					}
				}
			}},
		{"off", []string{"--sessions-parent-aware=false", "--router-policy", "kv_blocks", "--router-hold-enabled=false"},
			func(t *testing.T, rootW string, kids []kidResult, sysTokens int) {
				where := map[string]bool{}
				for _, k := range kids {
					where[k.worker] = true
					if k.worker != rootW && k.cached != 0 {
						t.Errorf("%s on %s reported %d cached tokens: that worker never saw the prefix", k.id, k.worker, k.cached)
					}
				}
				if len(where) < 2 {
					t.Errorf("without parent-aware placement the subagents stayed together on %v; want them scattered by load", where)
				}
			}},
		{"parent saturated", []string{"--sessions-parent-blocks", "1024", "--router-busy-prefill-tokens", "1", "--flow-control-enabled=false"},
			func(t *testing.T, rootW string, kids []kidResult, sysTokens int) {
				where := map[string]int{}
				for _, k := range kids {
					where[k.worker]++
				}
				if where[rootW] == len(kids) || len(where) < 3 {
					t.Errorf("with the root's worker busy the subagents should spread; got %v (root on %s)", where, rootW)
				}
			}},
		// With the gateway queue on (the default) a subagent that finds every holder of the
		// system prompt busy waits at the gateway, and the queue binds it late. Beside as many
		// idle workers as requests waiting, the recompute on an idle one delays nobody, so the
		// fleet's recompute weight is not paid (flowcontrol backlogShare): each leaves for an
		// idle worker once waiting for the holder is not predicted sooner for itself. Paying
		// the whole weight there serialized three of the four on the root's worker.
		{"parent saturated, queue on", []string{"--sessions-parent-blocks", "1024", "--router-busy-prefill-tokens", "1"},
			func(t *testing.T, rootW string, kids []kidResult, sysTokens int) {
				where := map[string]int{}
				for _, k := range kids {
					where[k.worker]++
				}
				if where[rootW] > 2 || len(where) < 3 {
					t.Errorf("with the root's worker busy and three idle, the subagents should spread (at most 2 on the root's worker, 3 workers or more); got %v (root on %s)", where, rootW)
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := startFleet(t, tok, fleetSpec{workers: 4, events: true, args: tc.args,
				simOpts: func(_ int, o *sim.Options) { o.TTFT = 400 * time.Millisecond }})
			rootH := map[string]string{"X-Session-ID": "root"}
			rootReq := chatRequest(system, "Plan the review of the payment service.")
			code, hdr, body := f.post("/v1/chat/completions", rootReq, rootH)
			if code != http.StatusOK {
				t.Fatalf("root: %d %s", code, body)
			}
			rootW := hdr.Get("X-Kvgate-Worker")
			d := f.awaitCached(rootReq, rootW, rootH) // the root's blocks reached the index
			f.awaitIdle()

			kidReq := func(i int) any {
				return chatRequest(system, fmt.Sprintf("Subagent %d: review this diff.\n%s", i, longText(9000+i, 60)))
			}
			kidH := func(i int) map[string]string {
				return map[string]string{"X-Session-ID": fmt.Sprintf("root/sub-%d", i), "X-Parent-Session-ID": "root"}
			}
			if tc.name == "parent-aware" {
				dr := f.dryRun(kidReq(0), kidH(0))
				if dr.Chosen.Worker != rootW || !strings.Contains(dr.Chosen.Reason, "session rule parent") {
					t.Errorf("dry run of a subagent: %s (%s), want %s by the parent rule", dr.Chosen.Worker, dr.Chosen.Reason, rootW)
				}
			}
			kids := make([]kidResult, 4)
			var wg sync.WaitGroup
			for i := range kids {
				wg.Go(func() {
					k := &kids[i]
					k.id = kidH(i)["X-Session-ID"]
					k.worker, k.prompt, k.cached, k.err = postKid(f.gw.URL, kidReq(i), kidH(i))
				})
				time.Sleep(20 * time.Millisecond) // spawned in order, while the earlier ones prefill
			}
			wg.Wait()
			for _, k := range kids {
				if k.err != nil {
					t.Fatalf("%s: %v", k.id, k.err)
				}
				t.Logf("%s → %s (cached %d of %d)", k.id, k.worker, k.cached, k.prompt)
			}
			// The system prompt's full blocks as the root request counted them (its user part is short).
			sysTokens := (d.PromptBlocks - 1) * f.cfg.BlockSize
			tc.check(t, rootW, kids, sysTokens)
			// The sessions layer saw the lineage: the root lists its children and the group.
			if got := f.get("/debug/sessions/root"); !strings.Contains(got, kvkey.HashSessionID("root/sub-0")) {
				t.Errorf("root session view lacks its children: %s", got)
			}
		})
	}
}
