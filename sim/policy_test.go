package sim

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// prioReq is a request with a priority and an arrival offset, for the pure queue tests.
func prioReq(id string, prio int64, arrivalMs int) *simRequest {
	r := newSimRequest(id)
	r.priority = prio
	r.arrival = time.Unix(0, 0).Add(time.Duration(arrivalMs) * time.Millisecond)
	return r
}

func ids(rs []*simRequest) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.id
	}
	return out
}

// TestEnqueueWaiting: fcfs keeps arrival order and puts a preempted request first; priority
// orders by (priority, arrival) whether the request is new or preempted.
func TestEnqueueWaiting(t *testing.T) {
	type op struct {
		id      string
		prio    int64
		arrival int
		front   bool // a preempted request going back
	}
	tests := []struct {
		name   string
		policy string
		ops    []op
		want   []string
	}{
		{"fcfs ignores priority", PolicyFCFS, []op{{"a", 0, 1, false}, {"b", 5, 2, false}, {"c", -5, 3, false}}, []string{"a", "b", "c"}},
		{"fcfs preempted first", PolicyFCFS, []op{{"a", 0, 1, false}, {"b", 0, 2, false}, {"p", 0, 9, true}}, []string{"p", "a", "b"}},
		{"priority smaller first", PolicyPriority, []op{{"a", 0, 1, false}, {"b", 1, 2, false}, {"c", -1, 3, false}, {"d", 0, 4, false}}, []string{"c", "a", "d", "b"}},
		{"priority ties by arrival", PolicyPriority, []op{{"late", 0, 5, false}, {"early", 0, 1, false}, {"mid", 0, 3, false}}, []string{"early", "mid", "late"}},
		{"priority preempted by key, not first", PolicyPriority, []op{{"a", 0, 1, false}, {"b", 0, 3, false}, {"p", 0, 2, true}, {"q", 7, 0, true}}, []string{"a", "p", "b", "q"}},
		{"priority equal keys keep insertion order", PolicyPriority, []op{{"x", 1, 1, false}, {"y", 1, 1, false}, {"z", 1, 1, false}}, []string{"x", "y", "z"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var q []*simRequest
			for _, o := range tc.ops {
				q = enqueueWaiting(tc.policy, q, prioReq(o.id, o.prio, o.arrival), o.front)
			}
			if got := ids(q); !slices.Equal(got, tc.want) {
				t.Errorf("queue %v, want %v", got, tc.want)
			}
		})
	}
}

// TestPreemptionVictim: fcfs preempts the newest running request; priority the one with the
// largest (priority, arrival), the first of equal ones.
func TestPreemptionVictim(t *testing.T) {
	running := []*simRequest{prioReq("a", 1, 1), prioReq("b", 0, 2), prioReq("c", 1, 0), prioReq("d", -3, 9)}
	tests := []struct {
		name    string
		policy  string
		running []*simRequest
		want    string
	}{
		{"fcfs newest", PolicyFCFS, running, "d"},
		{"priority largest priority, then latest arrival", PolicyPriority, running, "a"},
		{"priority one request", PolicyPriority, running[3:], "d"},
		{"priority equal keys: the first", PolicyPriority, []*simRequest{prioReq("x", 2, 1), prioReq("y", 2, 1)}, "x"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.running[preemptionVictim(tc.policy, tc.running)].id; got != tc.want {
				t.Errorf("victim %s, want %s", got, tc.want)
			}
		})
	}
}

// stepOrder admits reqs in order (arrivals 1 ms apart) and steps the engine until all finish;
// it returns the ids in the order they were first scheduled and the order they finished.
func stepOrder(t *testing.T, e *engineCore, reqs []*simRequest) (scheduled, finished []string) {
	t.Helper()
	base := time.Now()
	for i, r := range reqs {
		r.arrival = base.Add(time.Duration(i) * time.Millisecond)
		e.admit(r)
	}
	seen := map[string]bool{}
	for range 10000 {
		st := e.schedule()
		if len(st.reqs) == 0 {
			break
		}
		for _, r := range st.reqs {
			if !seen[r.id] {
				seen[r.id] = true
				scheduled = append(scheduled, r.id)
			}
		}
		e.update(st, stepDuration(e.o, st, e.kv.pool.usage()))
		e.kv.takeEvents()
		for _, r := range reqs {
			if _, done, _, _ := r.snapshot(); done && !slices.Contains(finished, r.id) {
				finished = append(finished, r.id)
			}
		}
	}
	if len(finished) != len(reqs) {
		t.Fatalf("finished %v of %d requests", finished, len(reqs))
	}
	return scheduled, finished
}

// TestPriorityEngine: with one seat, requests queued together are scheduled by arrival under fcfs
// and by (priority, arrival) under priority; and when decode runs out of KV blocks, fcfs
// preempts the newest request while priority preempts the least urgent one, so under priority
// the urgent late request finishes first. Every block comes back either way.
func TestPriorityEngine(t *testing.T) {
	seats := []struct {
		policy string
		want   []string
	}{
		{PolicyFCFS, []string{"run", "b", "c", "urgent"}},
		{PolicyPriority, []string{"urgent", "run", "b", "c"}},
	}
	for _, tc := range seats {
		t.Run("seats/"+tc.policy, func(t *testing.T) {
			e := syncEngine(t, Options{BlockSize: 4, NumGPUBlocks: 64, MaxNumSeqs: 1, SchedulingPolicy: tc.policy})
			reqs := []*simRequest{mkReq("run", seqTokens(1, 5), 3), mkReq("b", seqTokens(10, 5), 3), mkReq("c", seqTokens(20, 5), 3), mkReq("urgent", seqTokens(30, 5), 3)}
			reqs[3].priority = -1
			if got, _ := stepOrder(t, e, reqs); !slices.Equal(got, tc.want) {
				t.Errorf("scheduled %v, want %v", got, tc.want)
			}
		})
	}
	preempt := []struct {
		policy    string
		wantFirst string
	}{
		{PolicyFCFS, "lazy"},       // the newest (urgent) is preempted
		{PolicyPriority, "urgent"}, // the least urgent (lazy, though older) is preempted
	}
	for _, tc := range preempt {
		t.Run("preemption/"+tc.policy, func(t *testing.T) {
			e := syncEngine(t, Options{BlockSize: 4, NumGPUBlocks: 5, SchedulingPolicy: tc.policy})
			lazy, urgent := mkReq("lazy", seqTokens(1, 7), 6), mkReq("urgent", seqTokens(50, 7), 6)
			lazy.priority, urgent.priority = 1, 0
			_, finished := stepOrder(t, e, []*simRequest{lazy, urgent})
			if finished[0] != tc.wantFirst {
				t.Errorf("finish order %v, want %s first", finished, tc.wantFirst)
			}
			checkPreemptedAndFinished(t, e, 6, 4, lazy, urgent)
		})
	}
}

// TestPriorityPreemptsScheduled: under priority the victim may be a request already placed
// in the step (lazy runs first, urgent then needs a block): it leaves the step, its tokens and
// blocks come back, and both requests still finish with all their tokens.
func TestPriorityPreemptsScheduled(t *testing.T) {
	e := syncEngine(t, Options{BlockSize: 4, NumGPUBlocks: 5, SchedulingPolicy: PolicyPriority})
	lazy, urgent := mkReq("lazy", seqTokens(1, 5), 6), mkReq("urgent", seqTokens(50, 7), 6)
	lazy.priority = 1
	e.admit(lazy)
	st := e.schedule() // lazy alone: it runs ahead of urgent in the running list
	e.update(st, stepDuration(e.o, st, e.kv.pool.usage()))
	stepOrder(t, e, []*simRequest{urgent})
	if _, done, _, _ := lazy.snapshot(); !done {
		t.Fatal("lazy did not finish")
	}
	checkPreemptedAndFinished(t, e, 6, 4, lazy, urgent)
}

// TestPriorityHTTP: on a worker whose one seat is taken, a request sent last with a smaller
// priority overtakes the queued ones under --scheduling-policy priority (on chat, completions
// and Responses), and not under fcfs, which accepts the field and ignores it as vLLM v1 does.
// A priority that is not an integer is a 400.
func TestPriorityHTTP(t *testing.T) {
	bodies := map[string]string{
		"/v1/chat/completions": `{"model":"m","messages":[{"role":"user","content":"%s"}],"max_tokens":%d%s}`,
		"/v1/completions":      `{"model":"m","prompt":"%s","max_tokens":%d%s}`,
		"/v1/responses":        `{"model":"m","input":"%s","max_output_tokens":%d,"store":false%s}`,
	}
	tests := []struct {
		policy   string
		endpoint string
		wantLast string // which request finishes last
	}{
		{PolicyPriority, "/v1/chat/completions", "q2"},
		{PolicyPriority, "/v1/completions", "q2"},
		{PolicyPriority, "/v1/responses", "q2"},
		{PolicyFCFS, "/v1/chat/completions", "urgent"},
	}
	for _, tc := range tests {
		t.Run(tc.policy+tc.endpoint, func(t *testing.T) {
			w, base := startWorker(t, Options{ServedModelName: "m", MaxNumSeqs: 1, OutputLen: -1, SchedulingPolicy: tc.policy,
				TTFT: 10 * time.Millisecond, ITL: 5 * time.Millisecond, Speedup: 1})
			send := func(id string, maxTok int, extra string) (int, error) {
				body := fmt.Sprintf(bodies[tc.endpoint], "request "+id, maxTok, extra)
				resp, err := http.Post(base+tc.endpoint, "application/json", strings.NewReader(body))
				if err != nil {
					return 0, err
				}
				defer resp.Body.Close()
				_, err = io.Copy(io.Discard, resp.Body)
				return resp.StatusCode, err
			}
			if code, err := send("bad", 2, `,"priority":1.5`); err != nil || code != http.StatusBadRequest {
				t.Fatalf("priority 1.5: status %d err %v, want 400", code, err)
			}
			var mu sync.Mutex
			var order []string
			var wg sync.WaitGroup
			start := func(id string, maxTok int, extra string) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					code, err := send(id, maxTok, extra)
					if err != nil || code != http.StatusOK {
						t.Errorf("%s: status %d err %v", id, code, err)
					}
					mu.Lock()
					order = append(order, id)
					mu.Unlock()
				}()
			}
			waitWaiting := func(n int64) {
				deadline := time.Now().Add(5 * time.Second)
				for w.engines[0].numWaiting.Load() != n || w.engines[0].numRunning.Load() != 1 {
					if time.Now().After(deadline) {
						t.Fatalf("engine never had 1 running and %d waiting", n)
					}
					time.Sleep(time.Millisecond)
				}
			}
			start("busy", 100, "") // holds the seat for ~0.5 s
			waitWaiting(0)
			start("q1", 2, `,"priority":0`)
			waitWaiting(1)
			start("q2", 2, "")
			waitWaiting(2)
			start("urgent", 2, `,"priority":-10`)
			waitWaiting(3)
			wg.Wait()
			if len(order) != 4 || order[len(order)-1] != tc.wantLast {
				t.Errorf("finish order %v, want %s last", order, tc.wantLast)
			}
		})
	}
}
