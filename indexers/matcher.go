package indexers

import "github.com/kvgate/kvgate/kvkey"

// TierMatch is how far a prompt's leading blocks are resident on one target: G1 counts the
// leading blocks on GPU; G2 the blocks in host memory that extend the prefix beyond G1; G3 the
// blocks on disk that extend it beyond G1+G2 (docs/ARCHITECTURE.md, "The tiered index").
type TierMatch struct {
	G1, G2, G3 int
}

// Matcher answers tiered prefix matches for a set of targets. MatchTiers writes into out[i]
// the match of hashes on targets[i] (zero for a target it does not know); len(out) ==
// len(targets). Both kinds of index implement it: the exact one fed by KV events (*Index) and
// the approximate one fed by the gateway's own routing (*ApproxIndex), so that the router
// reads either the same way. Implementations are safe for concurrent use.
type Matcher interface {
	MatchTiers(hashes []kvkey.BlockHash, targets []kvkey.Target, out []TierMatch)
}

var (
	_ Matcher = (*Index)(nil)
	_ Matcher = (*ApproxIndex)(nil)
)

// MatchTiers implements Matcher from Match: an Overlap's G1/G2/G3 are exactly TierMatch's.
// Its buffers are pooled, so a query allocates nothing once the pools are warm.
func (ix *Index) MatchTiers(hashes []kvkey.BlockHash, targets []kvkey.Target, out []TierMatch) {
	clear(out)
	buf := ix.ovPool.Get().(*[]Overlap)
	defer ix.ovPool.Put(buf)
	*buf = ix.MatchInto(hashes, *buf)
	ov := *buf
	if len(ov) == 0 {
		return
	}
	if len(ov)*len(targets) <= 256 {
		for _, o := range ov {
			for i, t := range targets {
				if t == o.Target {
					out[i] = TierMatch{G1: o.G1, G2: o.G2, G3: o.G3}
					break
				}
			}
		}
		return
	}
	pos := ix.posPool.Get().(map[kvkey.Target]int)
	defer ix.posPool.Put(pos)
	clear(pos)
	for i, t := range targets {
		pos[t] = i
	}
	for _, o := range ov {
		if i, ok := pos[o.Target]; ok {
			out[i] = TierMatch{G1: o.G1, G2: o.G2, G3: o.G3}
		}
	}
}
