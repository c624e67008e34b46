package keylimits

import (
	"fmt"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// flood sends n requests of cost tokens to l's key "k", one every gap from start, and counts
// the admitted ones (each released at once).
func flood(l *Limiter, n int, gap time.Duration, tokens int) int {
	ok := 0
	for i := range n {
		d := l.Admit("k", tokens, at(time.Duration(i)*gap))
		if d.Allowed {
			ok++
			l.Release(d.Ticket)
		}
	}
	return ok
}

func TestAdmitSingleReplica(t *testing.T) {
	cases := []struct {
		name   string
		limits Limits
		n      int
		gap    time.Duration
		tokens int
		want   int
	}{
		// 1,000 requests over 10 s at 300 rpm with the default burst (5): the burst, then one
		// per 200 ms; the 55th would need the supply of exactly 10 s, the last request is at 9.99.
		{"300rpm default burst", Limits{RequestsPerMinute: 300}, 1000, 10 * time.Millisecond, 0, 54},
		{"60rpm burst 10 at once", Limits{RequestsPerMinute: 60, Burst: 10}, 100, 0, 0, 10},
		{"60rpm default burst is 1", Limits{RequestsPerMinute: 60}, 100, 0, 0, 1},
		{"1rpm burst at least 1", Limits{RequestsPerMinute: 1}, 10, time.Second, 0, 1},
		// 6,000 tpm: 100 tokens/s, bucket 100; requests of 50 tokens every 100 ms for 2 s:
		// 100 + 2 s x 100 = 300 tokens = 6 requests.
		{"tokens", Limits{TokensPerMinute: 6000}, 20, 100 * time.Millisecond, 50, 5},
		// A request larger than the bucket is admitted from a full bucket and leaves a debt:
		// 250 tokens at 100/s, every second for 10 s: at t=0, then every 2.5 s (t=3,5.5→6,8.5→9).
		{"larger than the bucket", Limits{TokensPerMinute: 6000}, 10, time.Second, 250, 4},
		{"both limits, requests bind", Limits{RequestsPerMinute: 60, TokensPerMinute: 600000}, 10, 500 * time.Millisecond, 10, 5},
		{"unlimited key", Limits{}, 50, 0, 1000, 50},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := New(map[string]Limits{"k": c.limits}, 3*time.Second, t0)
			if got := flood(l, c.n, c.gap, c.tokens); got != c.want {
				t.Fatalf("admitted %d of %d, want %d", got, c.n, c.want)
			}
		})
	}
}

func TestRefusalReasonAndRetryAfter(t *testing.T) {
	cases := []struct {
		name      string
		limits    Limits
		tokens    []int // requests at t0, in order
		reason    Reason
		retry     time.Duration
		remaining int
	}{
		{"requests", Limits{RequestsPerMinute: 120, Burst: 2}, []int{0, 0, 0}, ReasonRequests, 500 * time.Millisecond, 0},
		// 100 tokens/s: 60 then 60 → the second needs 60 with 40 left: 0.2 s.
		{"tokens", Limits{TokensPerMinute: 6000}, []int{60, 60}, ReasonTokens, 200 * time.Millisecond, 40},
		{"concurrency", Limits{MaxConcurrent: 2}, []int{1, 1, 1}, ReasonConcurrency, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := New(map[string]Limits{"k": c.limits}, time.Second, t0)
			var d Decision
			for i, n := range c.tokens {
				d = l.Admit("k", n, t0)
				if last := i == len(c.tokens)-1; d.Allowed == last {
					t.Fatalf("request %d: allowed=%v", i, d.Allowed)
				}
			}
			if d.Reason != c.reason || d.RetryAfter != c.retry {
				t.Fatalf("refused for %q retry %v, want %q %v", d.Reason, d.RetryAfter, c.reason, c.retry)
			}
			if c.reason == ReasonTokens && d.Status.Tokens.Remaining != c.remaining {
				t.Fatalf("remaining tokens %d, want %d", d.Status.Tokens.Remaining, c.remaining)
			}
		})
	}
}

// Precheck refuses what Admit would refuse whatever the token count (concurrency, requests),
// leaves the token bucket to Admit, takes nothing when it allows, and counts a refusal as
// demand.
func TestPrecheck(t *testing.T) {
	cases := []struct {
		name    string
		limits  Limits
		admit   []int // requests admitted (and kept in flight) at t0 first, by token count
		allowed bool
		reason  Reason
		retry   time.Duration
	}{
		{"fresh key", Limits{RequestsPerMinute: 60, TokensPerMinute: 6000, MaxConcurrent: 1}, nil, true, "", 0},
		{"request bucket empty", Limits{RequestsPerMinute: 120, Burst: 2}, []int{0, 0}, false, ReasonRequests, 500 * time.Millisecond},
		{"concurrency full", Limits{MaxConcurrent: 1}, []int{0}, false, ReasonConcurrency, 0},
		// The token bucket is short of a 60-token request, but only Admit knows the count.
		{"token bucket is Admit's", Limits{TokensPerMinute: 6000}, []int{60}, true, "", 0},
		{"unlimited key", Limits{}, []int{0, 0, 0}, true, "", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := New(map[string]Limits{"k": c.limits}, time.Second, t0)
			for _, n := range c.admit {
				if !l.Admit("k", n, t0).Allowed {
					t.Fatal("setup admission refused")
				}
			}
			before := l.Report(t0)
			d := l.Precheck("k", 100, t0)
			if d.Allowed != c.allowed || d.Reason != c.reason || d.RetryAfter != c.retry {
				t.Fatalf("precheck %+v, want allowed=%v reason %q retry %v", d, c.allowed, c.reason, c.retry)
			}
			after := l.Report(t0)
			if d.Allowed {
				if fmt.Sprint(after) != fmt.Sprint(before) {
					t.Fatalf("an allowed precheck changed the state: %+v -> %+v", before, after)
				}
				return
			}
			if d.Status.Requests == nil && d.Status.Tokens == nil && c.limits.RequestsPerMinute > 0 {
				t.Fatal("a refusal carries no status for the headers")
			}
			if c.limits.RequestsPerMinute > 0 && after[0].Requests <= before[0].Requests {
				t.Fatalf("a refusal was not counted as demand: %+v -> %+v", before, after)
			}
		})
	}
	// An allowed precheck takes nothing: the whole burst is still admitted after it.
	l := New(map[string]Limits{"k": {RequestsPerMinute: 120, Burst: 2}}, time.Second, t0)
	for i := range 2 {
		if !l.Precheck("k", 0, t0).Allowed || !l.Admit("k", 0, t0).Allowed {
			t.Fatalf("request %d of the burst refused", i)
		}
	}
}

func TestReleaseFreesConcurrency(t *testing.T) {
	l := New(map[string]Limits{"k": {MaxConcurrent: 1}}, time.Second, t0)
	a := l.Admit("k", 0, t0)
	if !a.Allowed || l.Admit("k", 0, t0).Allowed {
		t.Fatal("max_concurrent 1: the first must pass and the second wait")
	}
	l.Release(a.Ticket)
	if !l.Admit("k", 0, t0).Allowed {
		t.Fatal("released slot not reusable")
	}
}

func TestCorrectRefundsAndCharges(t *testing.T) {
	cases := []struct {
		name     string
		estimate int
		used     int
		want     int // remaining tokens after the correction (bucket 1,000)
	}{
		{"used less: refund", 600, 100, 900},
		{"used more: charge", 100, 300, 700},
		{"exact", 250, 250, 750},
		{"refund never above full", 10, 0, 1000},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := New(map[string]Limits{"k": {TokensPerMinute: 60000}}, time.Second, t0)
			d := l.Admit("k", c.estimate, t0)
			if !d.Allowed {
				t.Fatal("refused")
			}
			l.Correct(d.Ticket, c.used, t0)
			st, _ := l.Status("k", t0)
			if st.Tokens.Remaining != c.want {
				t.Fatalf("remaining %d, want %d", st.Tokens.Remaining, c.want)
			}
		})
	}
}

func TestStatusHeaders(t *testing.T) {
	l := New(map[string]Limits{"k": {RequestsPerMinute: 300, TokensPerMinute: 6000}}, time.Second, t0)
	d := l.Admit("k", 30, t0)
	r, tk := d.Status.Requests, d.Status.Tokens
	if r == nil || tk == nil {
		t.Fatal("both buckets must show")
	}
	// Requests: 5 - 1 = 4 left, full again in 1/5 s. Tokens: 100 - 30 = 70, full in 0.3 s.
	if r.Limit != 300 || r.Remaining != 4 || r.Reset != 200*time.Millisecond {
		t.Fatalf("requests %+v", *r)
	}
	if tk.Limit != 6000 || tk.Remaining != 70 || tk.Reset != 300*time.Millisecond {
		t.Fatalf("tokens %+v", *tk)
	}
	if _, ok := l.Status("other", t0); ok {
		t.Fatal("an unknown key has no status")
	}
	only := New(map[string]Limits{"k": {RequestsPerMinute: 60}}, time.Second, t0)
	if st := only.Admit("k", 5, t0).Status; st.Tokens != nil || st.Requests == nil {
		t.Fatalf("a requests-only key shows only the requests bucket: %+v", st)
	}
}

func TestBurstSizesTokenBucketBySpan(t *testing.T) {
	cases := []struct {
		limits   Limits
		req, tok float64
	}{
		{Limits{RequestsPerMinute: 300, TokensPerMinute: 6000}, 5, 100},
		{Limits{RequestsPerMinute: 300, TokensPerMinute: 6000, Burst: 10}, 10, 200},
		{Limits{TokensPerMinute: 6000, Burst: 500}, 0, 500},
		{Limits{RequestsPerMinute: 30, TokensPerMinute: 30}, 1, 1},
	}
	for _, c := range cases {
		r, tk := c.limits.capacities()
		if r != c.req || tk != c.tok {
			t.Errorf("%+v: capacities %v/%v, want %v/%v", c.limits, r, tk, c.req, c.tok)
		}
	}
}

// fleet runs replicas of one 300 rpm key that exchange reports every period, sends n requests
// one every gap, request i to replica pick(i), and returns how many were admitted in total.
func fleet(t *testing.T, replicas, n int, gap, period time.Duration, pick func(i int) int) int {
	t.Helper()
	ls := make([]*Limiter, replicas)
	for i := range ls {
		ls[i] = New(map[string]Limits{"k": {RequestsPerMinute: 300}}, 3*time.Second, t0.Add(-time.Second))
	}
	exchange := func(now time.Time) {
		reports := make([][]PeerKey, replicas)
		for i, l := range ls {
			reports[i] = l.Report(now)
		}
		for i, l := range ls {
			for j := range ls {
				if i != j {
					l.ApplyPeer(fmt.Sprint("r", j), reports[j], now)
				}
			}
		}
	}
	exchange(t0.Add(-time.Second)) // the replicas have heard each other's heartbeats
	ok := 0
	next := t0
	for i := range n {
		now := at(time.Duration(i) * gap)
		for !next.After(now) {
			exchange(next)
			next = next.Add(period)
		}
		d := ls[pick(i)].Admit("k", 0, now)
		if d.Allowed {
			ok++
			ls[pick(i)].Release(d.Ticket)
		}
	}
	return ok
}

func TestFleetStaysWithinTheLimit(t *testing.T) {
	const want = 55 // 5/s for 10 s plus a burst of 5
	cases := []struct {
		name     string
		replicas int
		pick     func(i int) int
		lo, hi   int
	}{
		{"one replica", 1, func(int) int { return 0 }, want * 95 / 100, want * 105 / 100},
		{"three, round robin", 3, func(i int) int { return i % 3 }, want * 95 / 100, want * 105 / 100},
		// All to one: the two idle replicas' parts of the burst (a third each while the key was
		// idle) are not moved to the busy one, which gets its third (5/3) and 99% of the rate
		// (the idle replicas' floors): 5/3 + 10 s x 4.95/s, about 51. (Pricing at cost/share
		// reached 52 here by rescaling every replica's level with its share; the same
		// rescaling under-admitted round robin when reports are staggered,
		// TestFleetStaggeredReports.)
		{"three, all to one", 3, func(int) int { return 1 }, 51, want * 105 / 100},
		// Uneven: two thirds to one replica.
		{"three, uneven", 3, func(i int) int { return min(i%3, 1) }, want * 95 / 100, want * 105 / 100},
		// The traffic moves to another replica halfway: under-admitted for a moment, never over.
		{"three, traffic moves", 3, func(i int) int { return i / 500 }, want * 85 / 100, want * 105 / 100},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := fleet(t, c.replicas, 1000, 10*time.Millisecond, 100*time.Millisecond, c.pick)
			if got < c.lo || got > c.hi {
				t.Fatalf("admitted %d, want %d..%d", got, c.lo, c.hi)
			}
			t.Logf("admitted %d", got)
		})
	}
}

// Simultaneous requests at every replica (no report in between) still share one burst.
func TestFleetSimultaneousBurst(t *testing.T) {
	ls := make([]*Limiter, 3)
	for i := range ls {
		ls[i] = New(map[string]Limits{"k": {RequestsPerMinute: 300}}, 3*time.Second, t0)
	}
	for i, l := range ls {
		for j := range ls {
			if i != j {
				l.ApplyPeer(fmt.Sprint("r", j), ls[j].Report(t0), t0)
			}
		}
	}
	ok := 0
	for _, l := range ls {
		for range 10 {
			if l.Admit("k", 0, t0).Allowed {
				ok++
			}
		}
	}
	if ok > 5 {
		t.Fatalf("admitted %d at once across three replicas, the burst is 5", ok)
	}
}

func TestFleetConcurrencyCountsPeers(t *testing.T) {
	a := New(map[string]Limits{"k": {MaxConcurrent: 3}}, time.Second, t0)
	b := New(map[string]Limits{"k": {MaxConcurrent: 3}}, time.Second, t0)
	for range 2 {
		if !a.Admit("k", 0, t0).Allowed {
			t.Fatal("a refused")
		}
	}
	b.ApplyPeer("a", a.Report(t0), t0)
	if !b.Admit("k", 0, t0).Allowed {
		t.Fatal("b: 2 in flight at a, the third must pass")
	}
	if b.Admit("k", 0, t0).Allowed {
		t.Fatal("b: 3 in flight across the fleet, the fourth must wait")
	}
	// a goes silent: after the peer timeout its in-flight count no longer counts.
	later := t0.Add(2 * time.Second)
	if !b.Admit("k", 0, later).Allowed {
		t.Fatal("b: a's report expired, its slots no longer count")
	}
}

func TestReportAndPeerLifecycle(t *testing.T) {
	l := New(map[string]Limits{"k": {RequestsPerMinute: 60}, "free": {}}, time.Second, t0)
	if got := l.Report(t0); len(got) != 0 {
		t.Fatalf("idle key reported: %+v", got)
	}
	d := l.Admit("k", 0, t0)
	if got := l.Report(t0); len(got) != 1 || got[0].Name != "k" || got[0].InFlight != 1 || got[0].Requests <= 0 {
		t.Fatalf("active key report %+v", got)
	}
	l.Release(d.Ticket)
	idle := t0.Add(time.Minute)
	if got := l.Report(idle); len(got) != 1 || got[0] != (PeerKey{Name: "k"}) {
		t.Fatalf("a key going idle is reported once as zero: %+v", got)
	}
	if got := l.Report(idle); len(got) != 0 {
		t.Fatalf("then no more: %+v", got)
	}
	l.ApplyPeer("p", []PeerKey{{Name: "unknown", Requests: 5}, {Name: "k", Requests: 1}}, t0)
	if l.Peers() != 1 || len(l.peers["p"].keys) != 1 {
		t.Fatal("a peer's unknown key must be dropped")
	}
	if n := l.ExpirePeers(t0.Add(500 * time.Millisecond)); n != 0 {
		t.Fatal("expired early")
	}
	if n := l.ExpirePeers(t0.Add(2 * time.Second)); n != 1 || l.Peers() != 0 {
		t.Fatal("silent peer kept")
	}
	l.ApplyPeer("p", nil, t0)
	l.ForgetPeer("p", t0)
	if l.Peers() != 0 {
		t.Fatal("forgotten peer kept")
	}
	for i := range maxPeers + 10 {
		l.ApplyPeer(fmt.Sprint("p", i), nil, t0)
	}
	if l.Peers() != maxPeers {
		t.Fatalf("peers %d, bounded at %d", l.Peers(), maxPeers)
	}
}
