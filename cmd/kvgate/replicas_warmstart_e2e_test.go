package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testport"

	openai "github.com/sashabaranov/go-openai"

	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/sim"
)

// warmRing is the simulated workers' replay ring (vLLM's buffer_steps): short, so that the
// traffic before a replica starts no longer fits in it.
const warmRing = 50

// loopbackPort returns a loopback port nothing listens on.
func loopbackPort(t *testing.T) string {
	t.Helper()
	return testport.Addr(t)
}

// startWarmWorkers starts n simulated workers with KV events, a short replay ring, a small GPU
// pool and a host tier (so that blocks move to G2).
func startWarmWorkers(t *testing.T, n int) simWorkers {
	t.Helper()
	return startSimWorkers(t, needModel(t), fleetSpec{workers: n, events: true, simOpts: func(_ int, o *sim.Options) {
		o.TTFT, o.NumGPUBlocks, o.NumCPUBlocks = 2*time.Millisecond, 400, 8000
		o.KVEvents.BufferSteps = warmRing
	}})
}

// startReplica assembles one gateway replica in front of w (startGateway), with a cluster node
// when clusterArgs configure one.
func startReplica(t *testing.T, w simWorkers, clusterArgs ...string) *fleet {
	t.Helper()
	return startGateway(t, w, gatewayArgs(w, clusterArgs...))
}

// warmTarget is the part of a /debug/workers row the warm-start test reads.
type warmTarget struct {
	Worker       string `json:"worker"`
	Subscription *struct {
		LastSeq   uint64                   `json:"last_seq"`
		HaveSeq   bool                     `json:"have_seq"`
		IndexMode string                   `json:"index_mode"`
		WarmStart *indexers.WarmStartDebug `json:"warm_start"`
	} `json:"subscription"`
}

func warmTargets(f *fleet) []warmTarget {
	f.t.Helper()
	var out struct {
		Targets []warmTarget `json:"targets"`
	}
	if err := json.Unmarshal([]byte(f.get("/debug/workers")), &out); err != nil {
		f.t.Fatal(err)
	}
	return out.Targets
}

// overlaps is a dry run's G1 and G2 blocks per worker, for each prompt.
func overlaps(f *fleet, prompts []openai.ChatCompletionRequest) []map[string][2]int {
	out := make([]map[string][2]int, len(prompts))
	for i, p := range prompts {
		d := f.dryRun(p, nil)
		out[i] = map[string][2]int{}
		for _, c := range d.Candidates {
			out[i][c.Worker] = [2]int{c.G1Blocks, c.G2Blocks}
		}
	}
	return out
}

func totalOverlap(o []map[string][2]int) int {
	n := 0
	for _, m := range o {
		for _, v := range m {
			n += v[0] + v[1]
		}
	}
	return n
}

// A replica that starts after the workers' replay rings stopped reaching back to their first
// batches gets the same per-worker G1/G2 overlap as the replica that saw all the traffic,
// within 5 s, from that replica's snapshots over NATS. A replica with no peer comes up cold,
// serving, and sees less.
func TestReplicaWarmStartFromPeer(t *testing.T) {
	specs := startWarmWorkers(t, 2)
	natsA := loopbackPort(t)
	a := startReplica(t, specs, "--cluster-embedded-nats-listen", natsA, "--cluster-replica-id", "a",
		"--cluster-embedded-nats-store-dir", t.TempDir())

	// Traffic through A until every worker's ring has rolled well past its first batches.
	var prompts []openai.ChatCompletionRequest
	ctx := context.Background()
	rolled := func() bool {
		ts := warmTargets(a)
		for _, v := range ts {
			if v.Subscription == nil || !v.Subscription.HaveSeq || v.Subscription.LastSeq < 2*warmRing {
				return false
			}
		}
		return len(ts) == len(specs.urls)
	}
	for i := 0; !rolled(); i++ {
		if i >= 600 {
			t.Fatalf("the workers' rings did not roll over: %s", a.get("/debug/workers"))
		}
		req := chatRequest(fmt.Sprintf("ledger clerk %d", i), longText(i, 20))
		prompts = append(prompts, req)
		if _, err := a.client.CreateChatCompletion(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range warmTargets(a) {
		if v.Subscription.IndexMode != indexers.ModeExact {
			t.Fatalf("replica a is not exact on %s: %+v", v.Worker, v.Subscription)
		}
	}
	// Held-out probes: the earliest prompts (their stores are long out of the rings) and a few
	// late ones.
	probes := append(append([]openai.ChatCompletionRequest{}, prompts[:8]...), prompts[len(prompts)-3:]...)
	var want []map[string][2]int
	// A's view settles once the last batches are applied.
	time.Sleep(200 * time.Millisecond)
	want = overlaps(a, probes)
	if totalOverlap(want[:8]) == 0 {
		t.Fatalf("the early prompts left nothing cached on replica a: %v\n%s", want, a.get("/debug/workers"))
	}

	t.Run("warm from a peer", func(t *testing.T) {
		start := time.Now()
		b := startReplica(t, specs, "--cluster-nats-url", "nats://"+natsA, "--cluster-replica-id", "b")
		// The 5 s count from when the replica can answer: loading the tokenizer comes first (about
		// 1 s, far more under -race) and has nothing to do with the warm start.
		assembled := time.Now()
		t.Logf("replica b assembled in %s (tokenizer, routing)", assembled.Sub(start).Round(time.Millisecond))
		var got []map[string][2]int
		for {
			got = overlaps(b, probes)
			if fmt.Sprint(got) == fmt.Sprint(want) {
				break
			}
			if time.Since(assembled) > 5*time.Second {
				t.Fatalf("replica b's overlap after %s:\n  %v\nreplica a's:\n  %v\nb: %s", time.Since(start), got, want, b.get("/debug/workers"))
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("replica b matched replica a's overlap %s after it started", time.Since(start).Round(time.Millisecond))
		for _, v := range warmTargets(b) {
			w := v.Subscription.WarmStart
			if w == nil || w.State != "warm" || w.Peer != "a" || !w.Verified || v.Subscription.IndexMode != indexers.ModeExact {
				t.Fatalf("%s: warm start %+v, mode %s", v.Worker, w, v.Subscription.IndexMode)
			}
			t.Logf("%s: %d snapshot bytes from %s at seq %d in %.1f ms", v.Worker, w.Bytes, w.Peer, w.Seq, w.TookMS)
		}
	})

	t.Run("no peer: cold", func(t *testing.T) {
		c := startReplica(t, specs, "--cluster-embedded-nats-listen", loopbackPort(t), "--cluster-replica-id", "c",
			"--cluster-embedded-nats-store-dir", t.TempDir())
		deadline := time.Now().Add(5 * time.Second)
		for {
			done := 0
			ts := warmTargets(c)
			for _, v := range ts {
				if s := v.Subscription; s != nil && s.WarmStart != nil && s.WarmStart.State == "cold" && s.HaveSeq {
					if s.WarmStart.Result != indexers.WarmNoPeer {
						t.Fatalf("%s: warm start %+v, want no_peer", v.Worker, s.WarmStart)
					}
					done++
				}
			}
			if done == len(specs.urls) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica c did not come up cold: %s", c.get("/debug/workers"))
			}
			time.Sleep(20 * time.Millisecond)
		}
		if _, err := c.client.CreateChatCompletion(ctx, chatRequest("a cold replica", "still serves")); err != nil {
			t.Fatalf("the cold replica failed a request: %v", err)
		}
		got := overlaps(c, probes)
		if totalOverlap(got[:8]) >= totalOverlap(want[:8]) {
			t.Fatalf("the cold replica sees as much of the early prompts (%d blocks) as the warm one (%d): the test cannot tell a snapshot from the ring",
				totalOverlap(got[:8]), totalOverlap(want[:8]))
		}
	})
}
