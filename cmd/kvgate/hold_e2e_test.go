package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/kvgate/kvgate/sim"
)

// TestSiblingHoldPrefillsOnce is the four-subagent case end to end. A root agent's streamed
// request is decoding on its worker W; then four subagent sessions (parent = root) are sent
// together, sharing a ≈1,500-token prompt with each other but not with the root. Under the
// default weights the first subagent's prefill queued on W pushes the later ones to idle
// workers, where they prefill the shared prompt again (router.hold.enabled=false: two of the
// four compute it, and the duplicate-prefill counter shows it); with the hold, the first is
// prefilled alone and the other three wait at the gateway until its prefix is computed on W,
// then hit the cache there.
func TestSiblingHoldPrefillsOnce(t *testing.T) {
	tok := needModel(t)
	f := startFleet(t, tok, fleetSpec{workers: 4, events: true,
		simOpts: func(_ int, o *sim.Options) { o.TTFT, o.ITL = 50*time.Millisecond, 20*time.Millisecond }})

	// The root's request runs (streamed, decoding) while its subagents are spawned.
	rootReq := chatRequest("You are the lead agent. "+longText(77, 20), "Plan the review.")
	rootReq.Stream, rootReq.MaxCompletionTokens = true, 60
	body, err := json.Marshal(rootReq)
	if err != nil {
		t.Fatal(err)
	}
	hreq, _ := http.NewRequest(http.MethodPost, f.gw.URL+"/v1/chat/completions", bytes.NewReader(body))
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("X-Session-ID", "root")
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	if line, err := rd.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data:") {
		t.Fatalf("root's first chunk: %q %v", line, err)
	}
	rootW := resp.Header.Get("X-Kvgate-Worker")
	if rootW == "" {
		t.Fatal("no X-Kvgate-Worker on the root's stream")
	}

	shared := "You are a subagent of the review crew. " + longText(5151, 85) // ≈1,500 tokens
	kidReq := func(i int) openai.ChatCompletionRequest {
		return chatRequest(shared, fmt.Sprintf("Task %d: %s", i, longText(9000+i, 3)))
	}
	kidH := func(i int) map[string]string {
		return map[string]string{"X-Session-ID": fmt.Sprintf("root/sub-%d", i), "X-Parent-Session-ID": "root"}
	}
	kids := make([]kidResult, 4)
	var wg sync.WaitGroup
	for i := range kids {
		wg.Go(func() {
			k := &kids[i]
			k.id = kidH(i)["X-Session-ID"]
			k.worker, k.prompt, k.cached, k.err = postKid(f.gw.URL, kidReq(i), kidH(i))
		})
	}
	wg.Wait()
	if _, err := io.Copy(io.Discard, rd); err != nil {
		t.Fatalf("root stream: %v", err)
	}
	// The shared prompt's full blocks: what a fifth subagent would find cached on W.
	f.awaitIdle()
	sharedBlocks := 0
	deadline := time.Now().Add(5 * time.Second)
	for sharedBlocks == 0 || time.Now().Before(deadline) {
		d := f.dryRun(kidReq(99), kidH(99))
		if g := d.g1Of(rootW); g > sharedBlocks {
			sharedBlocks = g
		} else if sharedBlocks > 0 {
			break
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if sharedBlocks < 80 {
		t.Fatalf("the subagents' shared prompt covers %d blocks on %s, want ≈93 (1,500 tokens)", sharedBlocks, rootW)
	}
	full := 0
	for _, k := range kids {
		if k.err != nil {
			t.Fatalf("%s: %v", k.id, k.err)
		}
		t.Logf("%s → %s (cached %d of %d)", k.id, k.worker, k.cached, k.prompt)
		if k.worker != rootW {
			t.Errorf("%s landed on %s, want the parent's worker %s", k.id, k.worker, rootW)
		}
		if k.cached >= sharedBlocks*f.cfg.BlockSize {
			full++
		}
	}
	// Prefilled once: every subagent but the first found the shared prompt's full blocks cached.
	if full < len(kids)-1 {
		t.Errorf("%d of %d subagents found the shared prompt (%d tokens) cached; want %d: it was prefilled side by side",
			full, len(kids), sharedBlocks*f.cfg.BlockSize, len(kids)-1)
	}
	if dup := f.metric("kvgate_router_duplicate_prefill_tokens_total", nil); dup != 0 {
		t.Errorf("kvgate_router_duplicate_prefill_tokens_total = %v, want 0", dup)
	}
	if rel := f.metric("kvgate_router_holds_total", map[string]string{"outcome": "released"}); rel != float64(len(kids)-1) {
		t.Errorf("kvgate_router_holds_total{outcome=released} = %v, want %d", rel, len(kids)-1)
	}
	if code, _, _ := f.post("/v1/chat/completions", kidReq(5), kidH(5)); code != http.StatusOK {
		t.Errorf("a later subagent: %d", code)
	}
}
