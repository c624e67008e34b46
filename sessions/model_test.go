package sessions

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/kvkey"
)

// clearTarget empties a target in the fake index (AllBlocksCleared / reset).
func (x *fakeIndex) clearTarget(t kvkey.Target) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.res[t] = map[kvkey.BlockHash]bool{}
	x.ver[t]++
}

// TestModelRandomInterleavings drives the tracker with random routes, stored, removed and cleared
// events and session ends, applying each event to the fake physical index first (as the gateway
// wires it), and checks after every step that (1) reference counts, the reverse map and leaf
// reclamation are consistent, (2) every block on every frontier's known lineage is resident on
// that frontier's target — no frontier survives for removed blocks — and (3) nothing consistent
// was rejected.
func TestModelRandomInterleavings(t *testing.T) {
	for seed := uint64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			idx := newFakeIndex()
			m, clk := newTestManager(t, func(c *Config) {
				c.MaxSessions, c.MaxNodes, c.MaxFrontiersPerTarget, c.MaxFrontiersPerSession = 6, 300, 2, 4
				if seed%2 == 0 {
					c.MaxLineageBlocks = 5
				}
			}, idx)
			targets := []kvkey.Target{tA, tA1, tB, tC}
			// Prompts are paths in a small trie: prompt p shares a prefix with prompt p-1.
			var prompts [][]kvkey.BlockHash
			next := kvkey.BlockHash(1)
			for p := 0; p < 12; p++ {
				var pr []kvkey.BlockHash
				if p > 0 {
					pr = append(pr, prompts[p-1][:rng.IntN(len(prompts[p-1])+1)]...)
				}
				for len(pr) < 8+rng.IntN(20) {
					pr = append(pr, next)
					next++
				}
				prompts = append(prompts, pr)
			}
			sid := func() string { return fmt.Sprint("s", rng.IntN(9)) }
			for step := 0; step < 1500; step++ {
				tg := targets[rng.IntN(len(targets))]
				pr := prompts[rng.IntN(len(prompts))]
				switch op := rng.IntN(10); {
				case op < 3: // route
					id := sid()
					m.Observe(Identity{SessionID: id, ParentID: sid()})
					m.OnRouted(id, tg, pr)
				case op < 6: // the worker stores the next missing blocks of a prompt
					d := idx.DeepestG1(tg, pr)
					if d == len(pr) {
						continue
					}
					e := d + 1 + rng.IntN(len(pr)-d)
					idx.store(tg, pr[d:e]...)
					var parent kvkey.BlockHash
					if d > 0 {
						parent = pr[d-1]
					}
					owner := ""
					if rng.IntN(3) > 0 {
						owner = sid()
					}
					if err := m.ApplyStored(tg, pr[d:e], parent, owner); err != nil {
						t.Fatalf("step %d: consistent store rejected: %v", step, err)
					}
				case op < 8: // the worker evicts a resident block (any position)
					idx.mu.Lock()
					var hs []kvkey.BlockHash
					for h := range idx.res[tg] {
						hs = append(hs, h)
					}
					idx.mu.Unlock()
					slices.Sort(hs) // map order is random; keep the run reproducible
					if len(hs) == 0 {
						continue
					}
					// vLLM sends one block per GPU BlockRemoved; batches also occur (CPU tiers, merges).
					batch := []kvkey.BlockHash{hs[rng.IntN(len(hs))]}
					for rng.IntN(3) == 0 {
						batch = append(batch, hs[rng.IntN(len(hs))])
					}
					idx.remove(tg, batch...)
					m.ApplyRemoved(tg, batch)
				case op == 8:
					if rng.IntN(4) == 0 {
						idx.clearTarget(tg)
						m.ApplyCleared(tg)
					} else {
						m.End(sid())
					}
				default:
					clk.t = clk.t.Add(3e9)
					m.HintsWithPrefix(sid(), sid(), pr)
				}
				checkInvariants(t, m)
				checkFrontiersResident(t, m, idx, step)
			}
			st := m.Stats()
			t.Logf("%+v", st)
			if st.FrontiersReceded == 0 || st.FrontiersCleared == 0 || st.SessionsEvicted == 0 {
				t.Fatalf("the run did not exercise recede, clear and eviction: %+v", st)
			}
			if st.Rejected != 0 {
				t.Fatalf("rejected %d consistent updates: %+v", st.Rejected, st)
			}
		})
	}
}

func checkFrontiersResident(t *testing.T, m *Tracker, idx *fakeIndex, step int) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.sess {
		s := &m.sess[i]
		if !s.live {
			continue
		}
		for _, fr := range s.frontiers {
			slot, _ := m.f.resolve(fr.node)
			top, ok := m.f.resolve(fr.top)
			if !ok || !m.f.isAncestorOrSelf(top, slot) {
				t.Fatalf("step %d: session %s frontier top is not on its path", step, s.id)
			}
			hs, _ := m.f.lineage(slot, m.f.nodes[top].hash, true)
			for _, h := range hs {
				if !idx.res[fr.target][h] {
					t.Fatalf("step %d: session %s frontier on %s covers block %d, which is not resident; lineage %v",
						step, s.id, fr.target, h, hs)
				}
			}
		}
	}
}

// Routing and event application race (the gateway's request goroutines against the event
// goroutine). Events go to the index first, then to the tracker, as the gateway wires them; at
// the end no frontier may cover a block the index removed (docs/ARCHITECTURE.md, "Sessions and frontiers").
func TestConcurrentRoutesAndRemovals(t *testing.T) {
	idx := newFakeIndex()
	m, _ := newTestManager(t, func(c *Config) { c.MaxSessions = 32 }, idx)
	p := chain(1, 64)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				id := fmt.Sprint("g", g, "-", i%8)
				m.Observe(Identity{SessionID: id, ParentID: "root"})
				m.OnRouted(id, tA, p[:16+i%48])
				m.HintsWithPrefix(fmt.Sprint("x", i), "root", p)
			}
		}()
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for i := 0; i < 3000; i++ {
		if i%3 == 0 {
			idx.store(tA, p...)
			_ = m.ApplyStored(tA, p, 0, "")
			continue
		}
		h := p[rng.IntN(len(p))]
		idx.remove(tA, h)
		m.ApplyRemoved(tA, []kvkey.BlockHash{h})
	}
	close(done)
	wg.Wait()
	checkInvariants(t, m)
	checkFrontiersResident(t, m, idx, -1)
}
