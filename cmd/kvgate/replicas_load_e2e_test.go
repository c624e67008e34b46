package main

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/kvgate/kvgate/sim"
	"github.com/kvgate/kvgate/tokenize"
)

// startLoadReplicas starts simulated workers (no KV events: approximate mode) with a fixed
// prefill step of ttft, and one gateway per entry of clusterArgs (startGateway), sharing the
// workers.
func startLoadReplicas(t *testing.T, tok *tokenize.Tokenizer, nWorkers int, ttft time.Duration, clusterArgs ...[]string) []*fleet {
	t.Helper()
	w := startSimWorkers(t, tok, fleetSpec{workers: nWorkers, simOpts: func(_ int, o *sim.Options) { o.TTFT = ttft }})
	var out []*fleet
	for _, ca := range clusterArgs {
		args := gatewayArgs(w, append([]string{"--router-metrics-interval", "100ms", "--proxy-expose-routing-headers",
			"--cluster-load-interval", "100ms", "--cluster-peer-timeout", "500ms", "--router-policy", "kv"}, ca...)...)
		out = append(out, startGateway(t, w, args))
	}
	return out
}

// peersJSON is a target's peers object in GET /debug/workers (docs/replicas.md, "Shared in-flight load").
type peersJSON struct {
	Worker string `json:"worker"`
	Peers  *struct {
		Total struct {
			Requests    int `json:"requests"`
			AheadTokens int `json:"ahead_tokens"`
		} `json:"total"`
		ByPeer map[string]json.RawMessage `json:"by_peer"`
	} `json:"peers"`
}

// peerRequests is Σ over targets of the peers' requests in r's view, and the replicas seen.
func (r *fleet) peerRequests() (requests int, replicas []string) {
	r.t.Helper()
	var out struct {
		Targets []peersJSON `json:"targets"`
		Peers   []struct {
			Replica string `json:"replica"`
		} `json:"peers"`
	}
	if err := json.Unmarshal([]byte(r.get("/debug/workers")), &out); err != nil {
		r.t.Fatal(err)
	}
	for _, tg := range out.Targets {
		if tg.Peers != nil {
			requests += tg.Peers.Total.Requests
		}
	}
	for _, p := range out.Peers {
		replicas = append(replicas, p.Replica)
	}
	return requests, replicas
}

// awaitOnlyPeer waits (up to 5 s) until r's view of its peers is the one replica id.
func (r *fleet) awaitOnlyPeer(id string) {
	r.t.Helper()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, peers := r.peerRequests(); len(peers) == 1 && peers[0] == id {
			return
		}
		if time.Now().After(end) {
			r.t.Fatalf("never heard of replica %s", id)
		}
	}
}

// TestReplicasShareLoadE2E: two gateways on one NATS (A's embedded server). A request in
// flight through A shows in B's /debug/workers as the peers' share of its worker's load and
// leaves it when it ends; the prompt A routed (approximate mode) is predicted on the same
// worker by B's /debug/route; with A (and the NATS server in it) gone, B still answers every
// request, reports itself degraded, and A's load no longer counts.
func TestReplicasShareLoadE2E(t *testing.T) {
	tok := needModel(t)
	natsAddr := freeAddr(t)
	// The worker holds each request for a second: room for a's in-flight request to reach b's
	// view (tens of ms when idle) on a CI machine running every package's tests at once.
	rs := startLoadReplicas(t, tok, 2, time.Second,
		[]string{"--cluster-replica-id", "a", "--cluster-embedded-nats-listen", natsAddr, "--cluster-embedded-nats-store-dir", t.TempDir()},
		[]string{"--cluster-replica-id", "b", "--cluster-nats-url", "nats://" + natsAddr})
	a, b := rs[0], rs[1]
	b.awaitOnlyPeer("a")

	req := chatRequest("You are a replica test.", longText(3, 200))
	type result struct {
		code   int
		worker string
	}
	done := make(chan result, 1)
	go func() {
		code, h, _ := a.post("/v1/chat/completions", req, nil)
		done <- result{code, h.Get("X-Kvgate-Worker")}
	}()
	sent := time.Now()
	for {
		if n, _ := b.peerRequests(); n == 1 {
			break
		}
		if time.Since(sent) > 900*time.Millisecond {
			t.Fatal("a's request in flight never showed in b's view of its peers (the worker takes 1s)")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("a's request in b's /debug/workers after %s", time.Since(sent).Round(time.Millisecond))
	res := <-done
	if res.code != http.StatusOK || res.worker == "" {
		t.Fatalf("request through a: %d, worker %q", res.code, res.worker)
	}
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if n, _ := b.peerRequests(); n == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("a's finished request still counts in b's view")
		}
	}
	// Approximate mode: b predicts a's prompt on the worker a chose.
	d := b.awaitCached(req, res.worker, nil)
	if d.Chosen.Worker != res.worker {
		t.Errorf("b would route a's prompt to %s, a's worker is %s", d.Chosen.Worker, res.worker)
	}

	// A goes away with the NATS server it hosts: b keeps answering, degraded.
	a.gw.Close()
	a.node.Close()
	for range 2 {
		code, _, body := b.post("/v1/chat/completions", chatRequest("You are a replica test.", longText(9, 40)), nil)
		if code != http.StatusOK {
			t.Fatalf("b with NATS gone: %d %s", code, body)
		}
	}
	var health struct {
		Degraded []string `json:"degraded"`
	}
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_ = json.Unmarshal([]byte(b.get("/health")), &health)
		if _, peers := b.peerRequests(); len(health.Degraded) > 0 && len(peers) == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("b with NATS gone: degraded %v, peers still counted: %s", health.Degraded, b.get("/debug/workers"))
		}
	}
}
