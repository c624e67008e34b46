package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/cluster"
	"github.com/kvgate/kvgate/cluster/clusterconfig"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/tokenize"
)

// replicaFleet is simulated workers (no KV events: every replica knows only what it routed
// itself) behind n gateways (startGateway), sharing state through one NATS server (a standalone
// embedded server, so that tests can stop and restart it).
type replicaFleet struct {
	t        *testing.T
	replicas []*fleet
	natsCfg  clusterconfig.Config
	nats     *cluster.Node // the NATS server the replicas share (stopped and restarted by tests)
}

// startNATS (re)starts the fleet's NATS server on its fixed port, with a fresh memory store.
func (f *replicaFleet) startNATS() {
	n, err := cluster.Start(context.Background(), f.natsCfg, cluster.Options{})
	if err != nil {
		f.t.Fatal(err)
	}
	f.nats = n
	f.t.Cleanup(n.Close)
}

func startReplicaFleet(t *testing.T, tok *tokenize.Tokenizer, nWorkers, nReplicas int, extra ...string) *replicaFleet {
	t.Helper()
	f := &replicaFleet{t: t}
	w := startSimWorkers(t, tok, fleetSpec{workers: nWorkers})
	args := gatewayArgs(w, append([]string{"--proxy-expose-routing-headers"}, extra...)...)
	f.natsCfg = clusterconfig.Default()
	f.natsCfg.ReplicaID = "nats"
	f.natsCfg.EmbeddedNATS.Listen = freeAddr(t)
	f.natsCfg.EmbeddedNATS.StoreDir = t.TempDir()
	f.startNATS()
	for i := range nReplicas {
		a := append(append([]string{}, args...), "--cluster-replica-id", fmt.Sprintf("gw%d", i),
			"--cluster-nats-url", "nats://"+f.natsCfg.EmbeddedNATS.Listen,
			"--cluster-kv-deadline", "500ms") // generous: 2 shared cores under -race
		f.replicas = append(f.replicas, startGateway(t, w, a))
	}
	for i, r := range f.replicas {
		deadline := time.Now().Add(10 * time.Second)
		for !r.rt.bindings.Ready() {
			if time.Now().After(deadline) {
				t.Fatalf("replica %d: shared bindings not ready", i)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return f
}

// post sends a JSON body to replica i and returns status, serving worker and body.
func (f *replicaFleet) post(t *testing.T, i int, path string, body any, h map[string]string) (int, string, []byte) {
	t.Helper()
	data, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, f.replicas[i].gw.URL+path, strings.NewReader(string(data)))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Kvgate-Worker"), b
}

// awaitShared waits until every replica's cache holds session id's binding (the turns of an
// agent are seconds apart; the write-behind and the watch take milliseconds).
func (f *replicaFleet) awaitShared(t *testing.T, id string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for i, r := range f.replicas {
		for {
			if _, ok := r.rt.bindings.Lookup(kvkey.HashSessionID(id)); ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d never saw the binding of %s", i, id)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// TestReplicasSessionBindings: three gateways (kv policy, no KV events: no replica sees what
// the others routed) share one set of workers.
//   - Each session's turns are sent round robin across the gateways (as a round-robin load
//     balancer does): every turn lands on the worker its first turn chose.
//   - A subagent's first request, on a gateway that never saw its parent, lands on the
//     parent's worker (parent-aware placement from the parent's shared binding).
//
// One fleet serves both (each replica loads the tokenizer, the slow part of the setup).
func TestReplicasSessionBindings(t *testing.T) {
	tok := needModel(t)
	// A strong affinity: in approximate mode a replica that lost a concurrent first turn
	// credits the worker it sent that turn to with the whole prompt (its own approximate
	// index), which the default affinity credit does not outweigh; with KV events every
	// replica sees that all those workers hold the prompt, and affinity decides.
	f := startReplicaFleet(t, tok, 3, 3, "--router-policy", "kv", "--sessions-affinity-blocks", "500")
	t.Run("turns round robin", f.sessionTurnsStayOnOneWorker)
	t.Run("subagent on another gateway", f.subagentFollowsParent)
	t.Run("concurrent first turns", f.concurrentFirstTurns)
	t.Run("NATS down and back", f.natsDownAndBack)
}

// bindingOps sums kvgate_cluster_binding_ops_total{op, result} over the replicas.
func (f *replicaFleet) bindingOps(t *testing.T, op, result string) float64 {
	t.Helper()
	return f.counterSum(t, "kvgate_cluster_binding_ops_total", map[string]string{"op": op, "result": result})
}

// counterSum sums the series of name whose labels include want, over the replicas.
func (f *replicaFleet) counterSum(t *testing.T, name string, want map[string]string) float64 {
	t.Helper()
	sum := 0.0
	for _, r := range f.replicas {
		sum += metricSum(t, r.prom, name, want)
	}
	return sum
}

// chat sends one turn of session id (history + a new user message) to gateway gw and returns
// the serving worker; any non-200 fails the test.
func (f *replicaFleet) chat(t *testing.T, gw int, id string, history []map[string]string) string {
	t.Helper()
	code, w, body := f.post(t, gw, "/v1/chat/completions", map[string]any{"model": servedModel,
		"messages": history, "max_tokens": 4}, map[string]string{"X-Session-ID": id})
	if code != http.StatusOK {
		t.Fatalf("%s via gateway %d: %d %s", id, gw, code, body)
	}
	return w
}

// concurrentFirstTurns: a session's first turn reaches all three gateways at once (a client
// retrying, or a split); exactly one binding wins and every later turn, on any gateway,
// follows it.
func (f *replicaFleet) concurrentFirstTurns(t *testing.T) {
	const nSessions = 4
	created, moved := f.bindingOps(t, "create", "ok"), f.bindingOps(t, "rebind", "ok")
	defer func() {
		if t.Failed() {
			return
		}
		if got := f.bindingOps(t, "create", "ok") - created; got != nSessions {
			t.Errorf("%v creates won for %d sessions, want exactly one each", got, nSessions)
		}
		if got := f.bindingOps(t, "rebind", "ok") - moved; got != 0 {
			t.Errorf("%v rebinds: the losers must follow the winner, not move the binding", got)
		}
	}()
	for s := range nSessions {
		id := fmt.Sprintf("split-%d", s)
		history := []map[string]string{{"role": "system", "content": fmt.Sprintf("Split agent %d. %s", s, longText(500+s, 40))},
			{"role": "user", "content": "go"}}
		var wg sync.WaitGroup
		errs := make([]error, len(f.replicas))
		for gw := range f.replicas {
			wg.Go(func() {
				data, _ := json.Marshal(map[string]any{"model": servedModel, "messages": history, "max_tokens": 4})
				req, _ := http.NewRequest(http.MethodPost, f.replicas[gw].gw.URL+"/v1/chat/completions", strings.NewReader(string(data)))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Session-ID", id)
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				errs[gw] = err
			})
		}
		wg.Wait()
		for gw, err := range errs {
			if err != nil {
				t.Fatalf("%s first turn via gateway %d: %v", id, gw, err)
			}
		}
		f.awaitShared(t, id)
		// Every replica converges on one binding (the losers adopt the winner's).
		var win string
		deadline := time.Now().Add(5 * time.Second)
		for {
			seen := map[string]bool{}
			for _, r := range f.replicas {
				b, _ := r.rt.bindings.Lookup(kvkey.HashSessionID(id))
				seen[b.Target.Worker] = true
				win = b.Target.Worker
			}
			if len(seen) == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: replicas disagree on the binding: %v", id, seen)
			}
			time.Sleep(5 * time.Millisecond)
		}
		for turn := 1; turn <= 4; turn++ {
			history = append(history, map[string]string{"role": "assistant", "content": "ok"},
				map[string]string{"role": "user", "content": fmt.Sprintf("next %d", turn)})
			if w := f.chat(t, turn%len(f.replicas), id, history); w != win {
				t.Fatalf("%s turn %d went to %s, the fleet's binding is %s", id, turn, w, win)
			}
		}
	}
}

// natsDownAndBack: with the NATS server stopped every request still succeeds (each replica
// routes on its own state, degraded); once it is back (an empty memory store) the buckets
// are recreated and a new session's turns stay together across the gateways again.
func (f *replicaFleet) natsDownAndBack(t *testing.T) {
	f.nats.Close()
	for i, r := range f.replicas {
		deadline := time.Now().Add(5 * time.Second)
		for r.node.Connected() {
			if time.Now().After(deadline) {
				t.Fatalf("replica %d still connected after the server stopped", i)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for s := range 3 {
		id := fmt.Sprintf("outage-%d", s)
		history := []map[string]string{{"role": "system", "content": fmt.Sprintf("Outage agent %d. %s", s, longText(700+s, 40))}}
		for turn := range 4 {
			history = append(history, map[string]string{"role": "user", "content": fmt.Sprintf("turn %d", turn)})
			start := time.Now()
			f.chat(t, (s+turn)%len(f.replicas), id, history) // fails the test on any error
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("%s turn %d took %s with NATS down", id, turn, d)
			}
			history = append(history, map[string]string{"role": "assistant", "content": "ok"})
		}
	}
	if n := f.counterSum(t, "kvgate_cluster_errors_total", map[string]string{"component": "bindings"}); n == 0 {
		t.Error("no binding write was counted as fallen back while NATS was down")
	}
	resp, err := http.Get(f.replicas[1].gw.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	health, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(health), `"degraded"`) || !strings.Contains(string(health), `"cluster"`) ||
		!strings.Contains(string(health), `"cluster_bindings"`) {
		t.Errorf("/health with NATS down: %d %s, want 200 listing the cluster as degraded", resp.StatusCode, health)
	}
	f.startNATS()
	for i, r := range f.replicas {
		deadline := time.Now().Add(15 * time.Second)
		for !r.node.Connected() || !r.rt.bindings.Ready() {
			if time.Now().After(deadline) {
				t.Fatalf("replica %d did not reconnect and recreate the buckets", i)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	id := "after-outage"
	history := []map[string]string{{"role": "system", "content": "After the outage. " + longText(900, 40)},
		{"role": "user", "content": "go"}}
	first := f.chat(t, 0, id, history)
	f.awaitShared(t, id)
	for turn := 1; turn <= 3; turn++ {
		history = append(history, map[string]string{"role": "assistant", "content": "ok"},
			map[string]string{"role": "user", "content": fmt.Sprintf("next %d", turn)})
		if w := f.chat(t, turn%len(f.replicas), id, history); w != first {
			t.Fatalf("%s turn %d went to %s, its first turn to %s", id, turn, w, first)
		}
	}
}

func (f *replicaFleet) sessionTurnsStayOnOneWorker(t *testing.T) {
	const sessions, turns = 6, 5
	used := map[string]bool{}
	for s := range sessions {
		id := fmt.Sprintf("agent-%d", s)
		system := fmt.Sprintf("You are agent %d. %s", s, longText(s, 60))
		history := []map[string]string{{"role": "system", "content": system}}
		first := ""
		for turn := range turns {
			history = append(history, map[string]string{"role": "user", "content": fmt.Sprintf("step %d: %s", turn, longText(100*s+turn, 15))})
			gw := (s + turn) % len(f.replicas)
			code, w, body := f.post(t, gw, "/v1/chat/completions", map[string]any{"model": servedModel,
				"messages": history, "max_tokens": 4}, map[string]string{"X-Session-ID": id})
			if code != http.StatusOK {
				t.Fatalf("%s turn %d via gateway %d: %d %s", id, turn, gw, code, body)
			}
			if turn == 0 {
				first = w
				used[w] = true
				f.awaitShared(t, id)
			} else if w != first {
				t.Fatalf("%s turn %d via gateway %d went to %s, its first turn to %s", id, turn, gw, w, first)
			}
			history = append(history, map[string]string{"role": "assistant", "content": "ok"})
		}
	}
	t.Logf("sessions placed on %d workers", len(used))
}

func (f *replicaFleet) subagentFollowsParent(t *testing.T) {
	for p := range 4 {
		parent := fmt.Sprintf("root-%d", p)
		system := fmt.Sprintf("You are root agent %d. %s", p, longText(p, 60))
		code, pw, body := f.post(t, p%3, "/v1/chat/completions", map[string]any{"model": servedModel, "max_tokens": 4,
			"messages": []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": "plan"}}},
			map[string]string{"X-Session-ID": parent})
		if code != http.StatusOK {
			t.Fatalf("%s: %d %s", parent, code, body)
		}
		f.awaitShared(t, parent)
		for k := 1; k <= 2; k++ {
			gw := (p + k) % 3 // the other gateways
			kid := fmt.Sprintf("%s-kid-%d", parent, k)
			code, w, body := f.post(t, gw, "/v1/chat/completions", map[string]any{"model": servedModel, "max_tokens": 4,
				"messages": []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": "subtask " + kid}}},
				map[string]string{"X-Session-ID": kid, "X-Parent-Session-ID": parent})
			if code != http.StatusOK {
				t.Fatalf("%s: %d %s", kid, code, body)
			}
			if w != pw {
				t.Fatalf("%s via gateway %d went to %s, its parent (via gateway %d) to %s", kid, gw, w, p%3, pw)
			}
		}
	}
}

// TestReplicasResponsesFollowUpOnAnotherGateway: a Responses follow-up (previous_response_id)
// arriving at a gateway that did not route the stored response reaches the worker storing it,
// under round robin (which would otherwise spread it); /debug/sessions/ there shows the pin
// as read from the fleet.
func TestReplicasResponsesFollowUpOnAnotherGateway(t *testing.T) {
	tok := needModel(t)
	f := startReplicaFleet(t, tok, 3, 3, "--router-policy", "round_robin")
	code, w1, body := f.post(t, 0, "/v1/responses", map[string]any{"model": servedModel, "instructions": "Be brief.",
		"input": "hello there", "max_output_tokens": 4}, nil)
	if code != http.StatusOK || w1 == "" {
		t.Fatalf("turn 1: %d %s", code, body)
	}
	var r struct{ ID string }
	if err := json.Unmarshal(body, &r); err != nil || r.ID == "" {
		t.Fatalf("turn 1 body %s", body)
	}
	prev := r.ID
	for turn := 2; turn <= 6; turn++ {
		gw := (turn - 1) % 3
		// Sent at once: the pin was shared before the previous response reached the client.
		code, w, body := f.post(t, gw, "/v1/responses", map[string]any{"model": servedModel, "input": "and more",
			"previous_response_id": prev, "max_output_tokens": 4}, nil)
		if code != http.StatusOK {
			t.Fatalf("turn %d via gateway %d: %d %s", turn, gw, code, body)
		}
		if w != w1 {
			t.Fatalf("turn %d via gateway %d went to %s, the stored responses are on %s", turn, gw, w, w1)
		}
		var r struct{ ID string }
		_ = json.Unmarshal(body, &r)
		prev = r.ID
	}
	resp, err := http.Get(f.replicas[1].admin.URL + "/debug/sessions/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var pins struct {
		ResponsePins []struct {
			ResponseID string `json:"response_id"`
			Source     string `json:"source"`
		} `json:"response_pins"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&pins); err != nil {
		t.Fatal(err)
	}
	sources := map[string]int{}
	for _, p := range pins.ResponsePins {
		sources[p.Source]++
	}
	if sources["shared"] == 0 || sources["local"] == 0 {
		t.Fatalf("gateway 1's pins by source %v: want both pins read from the fleet and its own", sources)
	}
}
