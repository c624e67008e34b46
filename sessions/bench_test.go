package sessions

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/kvgate/kvgate/kvkey"
)

// allResident is an index stub whose match costs nothing, so benchmarks measure the session
// index alone: every prefix is resident and the residency version never moves.
type allResident struct{}

func (allResident) ResidencyVersion(kvkey.Target) uint64               { return 0 }
func (allResident) IsResidentG1(kvkey.Target, kvkey.BlockHash) bool    { return true }
func (allResident) DeepestG1(_ kvkey.Target, hs []kvkey.BlockHash) int { return len(hs) }

const (
	benchChain     = 256 // blocks per session chain
	benchShared    = 128 // leading blocks every session shares (a long system prompt)
	benchFrontiers = 64  // sessions, one frontier each
	benchTargets   = 8
)

// benchChains returns per session a 256-block chain: 128 shared blocks, then 128 of its own.
func benchChains() [][]kvkey.BlockHash {
	out := make([][]kvkey.BlockHash, benchFrontiers)
	for s := range out {
		c := make([]kvkey.BlockHash, benchChain)
		for i := range c {
			if i < benchShared {
				c[i] = kvkey.BlockHash(1 + i)
			} else {
				c[i] = kvkey.BlockHash(1_000_000*(s+1) + i)
			}
		}
		out[s] = c
	}
	return out
}

func benchTarget(s int) kvkey.Target {
	return kvkey.Target{Worker: fmt.Sprintf("http://w%d", s%benchTargets)}
}

// prefixResident is an index stub that reports the first n blocks of any prompt resident.
type prefixResident struct{ n int }

func (*prefixResident) ResidencyVersion(kvkey.Target) uint64            { return 0 }
func (*prefixResident) IsResidentG1(kvkey.Target, kvkey.BlockHash) bool { return true }
func (p *prefixResident) DeepestG1(_ kvkey.Target, hs []kvkey.BlockHash) int {
	return min(p.n, len(hs))
}

// BenchmarkOnRouted measures the post-selection update over 64 sessions with 256-block chains
// (128 shared blocks, 128 of their own), index cost excluded.
// "advance": each turn's G1 match reaches 16 blocks deeper than the last (a growing
// conversation); after 256 blocks the session ends and a new one starts at the shared prefix.
// "repeat": the match ends at the block the frontier is already at.
// "advance+inflight": as advance, with the prompt 16 blocks longer than the match, recorded as
// in flight for sibling credit.
// "cold": every update is a new session's first, linking 256 blocks of which 128 are new.
func BenchmarkOnRouted(b *testing.B) {
	for _, mode := range []string{"advance", "repeat", "advance+inflight", "cold"} {
		b.Run(mode, func(b *testing.B) {
			inflight := mode == "advance+inflight"
			idx := &prefixResident{}
			m, err := New(withSiblingPrefix(inflight), idx, nil)
			if err != nil {
				b.Fatal(err)
			}
			chains := benchChains()
			targets := make([]kvkey.Target, benchFrontiers)
			ids := make([]string, benchFrontiers)
			gen := make([]int, benchFrontiers)
			turn := make([]int, benchFrontiers)
			// Session ids for restarts are made up front so the loop measures the tracker only.
			names := make([][]string, benchFrontiers)
			for s := range ids {
				targets[s] = benchTarget(s)
				for g := range 1 + b.N/(8*benchFrontiers) + 1 {
					names[s] = append(names[s], fmt.Sprint("session-", s, "-", g))
				}
				ids[s] = names[s][0]
				idx.n = benchShared
				m.OnRouted(ids[s], targets[s], chains[s][:benchShared])
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				s := i % benchFrontiers
				switch mode {
				case "repeat":
					idx.n = benchChain
				case "cold":
					m.End(ids[s])
					idx.n = benchChain
				default:
					turn[s]++
					if turn[s] > 8 {
						m.End(ids[s])
						gen[s]++
						ids[s] = names[s][gen[s]%len(names[s])]
						turn[s] = 0
					}
					idx.n = benchShared + 16*turn[s]
				}
				m.OnRouted(ids[s], targets[s], chains[s][:min(benchChain, idx.n+16)])
			}
		})
	}
}

// BenchmarkStoredChainReplay replays attributed BlockStored events (16 blocks each) building 64
// sessions' 256-block chains from scratch, then the BlockRemoved events tearing them down tail
// first, one block per event as vLLM sends them. Reports blocks/s.
func BenchmarkStoredChainReplay(b *testing.B) {
	chains := benchChains()
	m, err := New(Defaults(), allResident{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]string, benchFrontiers)
	for s := range ids {
		ids[s] = fmt.Sprint("session-", s)
		m.Observe(Identity{SessionID: ids[s]})
	}
	targets := make([]kvkey.Target, benchFrontiers)
	for s := range targets {
		targets[s] = benchTarget(s)
	}
	blocks := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for s, c := range chains {
			t := targets[s]
			for lo := 0; lo < len(c); lo += 16 {
				var parent kvkey.BlockHash
				if lo > 0 {
					parent = c[lo-1]
				}
				if err := m.ApplyStored(t, c[lo:lo+16], parent, ids[s]); err != nil {
					b.Fatal(err)
				}
			}
			blocks += len(c)
		}
		for s, c := range chains {
			t := targets[s]
			for k := len(c) - 1; k >= benchShared; k-- {
				m.ApplyRemoved(t, c[k:k+1])
			}
			blocks += len(c) - benchShared
		}
	}
	b.StopTimer()
	if st := m.Stats(); st.Rejected != 0 {
		b.Fatalf("rejected: %+v", st)
	}
	b.ReportMetric(float64(blocks)/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkMemoryPerSession reports retained heap per tracked session: "shared" sessions all sit
// on one 256-block chain (only the session record, frontier and reverse-map entry are theirs);
// "own128" sessions each add 128 blocks of their own below a shared 128-block prefix.
func BenchmarkMemoryPerSession(b *testing.B) {
	const n = 4096
	for _, mode := range []string{"shared", "own128"} {
		b.Run(mode, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				off := false
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				m, err := New(withSiblingPrefix(off), allResident{}, nil)
				if err != nil {
					b.Fatal(err)
				}
				c := make([]kvkey.BlockHash, benchChain)
				for s := 0; s < n; s++ {
					for k := range c {
						c[k] = kvkey.BlockHash(1 + k)
						if mode == "own128" && k >= benchShared {
							c[k] = kvkey.BlockHash(1_000_000*(s+1) + k)
						}
					}
					m.OnRouted(fmt.Sprint("session-", s), benchTarget(s), c)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/session")
				b.ReportMetric(float64(m.Stats().Nodes)/n, "nodes/session")
				runtime.KeepAlive(m)
			}
		})
	}
}

// BenchmarkHints measures the pre-decision hint lookup the router makes per request: a later
// turn (affinity), and a new subagent whose parent and 7 siblings have 256-block prompts in flight
// (HintsWithPrefix walks their union once per target and binary-searches the new prompt).
func BenchmarkHints(b *testing.B) {
	on := true
	m, err := New(withSiblingPrefix(on), &prefixResident{n: benchShared}, nil)
	if err != nil {
		b.Fatal(err)
	}
	chains := benchChains()
	m.Observe(Identity{SessionID: "root"})
	m.OnRouted("root", benchTarget(0), chains[0])
	for s := 1; s < 8; s++ {
		id := fmt.Sprint("kid-", s)
		m.Observe(Identity{SessionID: id, ParentID: "root"})
		m.OnRouted(id, benchTarget(s), chains[s])
	}
	newKid := chains[9]
	b.Run("affinity", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			m.Hints("kid-3", "root")
		}
	})
	b.Run("subagent+inflight", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if len(m.HintsWithPrefix("kid-new", "root", newKid)) == 0 {
				b.Fatal("no hints")
			}
		}
	})
}
