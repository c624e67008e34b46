package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router"
)

// TestLoadSyncHerding: three gateways route a burst of distinct, uncached prompts in turn
// (round robin, a few ms apart) over four workers, holding every request in flight. Each
// gateway alone balances only its own share, so their picks collide and pile up on some
// workers; with the load sync each sees the others' requests within the batch window and the
// fleet's in-flight count per worker never differs by more than one.
func TestLoadSyncHerding(t *testing.T) {
	const gateways, nWorkers, rounds, bursts = 3, 4, 4, 10
	workers := make([]kvkey.Target, nWorkers)
	cands := make([]router.Candidate, nWorkers)
	for i := range workers {
		workers[i] = kvkey.Target{Worker: fmt.Sprintf("http://127.0.0.1:%d", 9100+i)}
		cands[i] = router.Candidate{Target: workers[i]}
	}
	c := newLoadCluster(t)
	var syncs []*LoadSync
	for g := range gateways {
		_, ls := c.replicaEvery(fmt.Sprintf("gw%d", g), nil, nil, 100*time.Millisecond, 2*time.Second)
		syncs = append(syncs, ls)
	}
	eventually(t, 2*time.Second, "every gateway hears the others", func() bool {
		for _, ls := range syncs {
			if ls.Peers().Len() != gateways-1 {
				return false
			}
		}
		return true
	})
	for _, policy := range []string{router.PolicyKV, router.PolicyKVBlocks} {
		for _, shared := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/sync=%v", policy, shared), func(t *testing.T) {
				ds := make([]*router.Dispatcher, gateways)
				for g := range ds {
					d, err := router.Build(policy, router.Options{}, router.DispatcherOptions{})
					if err != nil {
						t.Fatal(err)
					}
					if shared {
						d.SetFleet(syncs[g].Fleet())
					}
					ds[g] = d
				}
				worst, lag := 0, time.Duration(0)
				for burst := range bursts {
					var open []router.Lifecycle
					for round := range rounds {
						for g, d := range ds {
							// 16k tokens, twice max_num_batched_tokens: under kv every prefill
							// queued ahead costs its own steps (smaller ones share a step and tie).
							req := &router.Request{Model: "m", PromptTokens: 16384, BlockSize: 16, Stream: true,
								BlockHashes: distinctChain(uint64(1+burst*1000+round*10+g), 1024)}
							_, lc, err := d.Route(context.Background(), req, cands)
							if err != nil {
								t.Fatal(err)
							}
							lc.Sent()
							open = append(open, lc)
							if shared {
								lag = max(lag, awaitViews(t, syncs, workers))
							} else {
								time.Sleep(3 * time.Millisecond)
							}
						}
						if spread := fleetSpread(ds, workers); spread > worst {
							worst = spread
						}
					}
					for _, lc := range open {
						lc.Done()
					}
					if shared {
						awaitViews(t, syncs, workers)
					}
				}
				t.Logf("worst max-min in-flight per worker after a round: %d; slowest propagation to every peer: %s", worst, lag)
				switch {
				case shared && worst > 1:
					t.Fatalf("with the load sync the fleet's in-flight per worker differed by %d (want ≤ 1)", worst)
				case !shared && worst < 2:
					t.Fatalf("control: without the sync the gateways never herded (the test would prove nothing)")
				}
			})
		}
	}
}

// awaitViews waits until every gateway's view of its peers equals, field by field, what the
// others have published, and returns how long that took. Whole vectors, not request counts: a
// route publishes its request count (load tracker) and its queued prefill (time model) as two
// increments, and a batch can close between them, so equal counts alone can precede the prefill
// that kv prices.
func awaitViews(t *testing.T, syncs []*LoadSync, workers []kvkey.Target) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ok := true
		for g := range syncs {
			for _, w := range workers {
				var others router.LoadVector
				for h, ls := range syncs {
					if h != g {
						ls.mu.Lock()
						others.Add(ls.totals[w])
						ls.mu.Unlock()
					}
				}
				if syncs[g].Peers().Sum(w) != others {
					ok = false
				}
			}
		}
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > 2*time.Second {
			t.Fatal("the gateways' views of each other did not converge within 2s")
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// fleetSpread is max − min over workers of the requests the gateways have in flight there.
func fleetSpread(ds []*router.Dispatcher, workers []kvkey.Target) int {
	lo, hi := 1<<30, 0
	for _, w := range workers {
		n := 0
		for _, d := range ds {
			n += d.Load().Load(w).Requests
		}
		lo, hi = min(lo, n), max(hi, n)
	}
	return hi - lo
}

// distinctChain is n block hashes no other prompt of the test shares.
func distinctChain(base uint64, n int) []kvkey.BlockHash {
	h := make([]kvkey.BlockHash, n)
	for i := range h {
		h[i] = kvkey.BlockHash(base<<20 | uint64(i+1))
	}
	return h
}
