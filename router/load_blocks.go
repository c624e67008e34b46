package router

// The load tracker holds a request's prompt blocks by their chained hashes. A chained hash
// names its whole prefix, so a block's position is the same in every prompt that holds it,
// and the blocks held on a target are prefix-closed. That lets the tracker key a long prompt
// by a sample of its blocks: the first heldExact one by one, then every heldStride-th and the
// last, each key standing for the blocks since the previous key. A 2,048-block prompt costs
// 189 map operations at Begin and at Done instead of 2,048. Shared prefixes are then seen to
// within heldStride−1 blocks beyond the first heldExact, and the distinct blocks held are
// overcounted by fewer than heldStride per prompt end that shares a stretch with another.
const (
	heldExact  = 64
	heldStride = 16
)

// heldKeys is how many keys an n-block prompt has.
func heldKeys(n int) int {
	if n <= heldExact {
		return n
	}
	return heldExact + (n-heldExact+heldStride-1)/heldStride
}

// heldPos is the block position of key k of an n-block prompt (k < heldKeys(n)).
func heldPos(k, n int) int {
	if k < heldExact {
		return k
	}
	return min(heldExact-1+(k-heldExact+1)*heldStride, n-1)
}

// heldWeight is how many blocks the key at position p stands for: those after the previous
// key position, which depends on p alone (so every prompt holding that hash agrees).
func heldWeight(p int) int64 {
	if p < heldExact {
		return 1
	}
	prev := heldExact - 1 + (p-heldExact)/heldStride*heldStride
	return int64(p - prev)
}
