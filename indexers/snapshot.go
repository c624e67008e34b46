package indexers

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"

	"github.com/zeebo/xxh3"

	"github.com/kvgate/kvgate/kvkey"
)

// A target snapshot is one target's exact index state at an event cursor, encoded so that a
// cold replica can install it and go on applying the worker's batches from the one after the
// cursor, reaching the same state as the replica that took it. It carries everything the apply
// path reads: the worker hash → node map with per-tier reference counts, every live node (our
// hash, parent link, per-tier references), the anchors chain recovery placed, the group_idx
// values whose stores were accepted, whether the worker showed a lower tier, and the recently
// removed hashes that token-less host/disk stores resolve through. The cursor is the last
// applied batch's seq and the xxh3 digest of its payload, which the installing replica checks
// against the worker's replay ring (the ring still holding batch seq with the same bytes is
// the same engine incarnation).
//
// The routed-prompt memory (chain recovery after a reset) is not part of it: it is request-side
// state of the replica that routed the prompts.
//
// Layout (version 1): "KVGS", version byte, the cursor (seq, digest: u64 little-endian), the
// target (worker as uvarint length + bytes, dp rank uvarint), block size, groups (u64), lower
// tiers (byte), then the nodes (count; per node our hash u64, parent uvarint index+1 with 0 for
// a root, three tier reference counts), the worker hashes (count; hash u64, node uvarint, three
// reference counts), the anchors (count; worker hash u64, tier byte, node count, nodes), the
// recently removed hashes oldest first (count; hash, our, parent's our u64, has-parent byte),
// and an xxh3 of everything before it (u64).

// SnapshotCursor is where a snapshot was taken in the worker's event stream.
type SnapshotCursor struct {
	// Seq is the last batch applied to the state.
	Seq uint64
	// Digest is the xxh3 of batch Seq's payload (the sequencer's incarnation check).
	Digest uint64
}

// Snapshot errors.
var (
	// ErrSnapshotCorrupt: the bytes are not a valid snapshot (truncated, bad checksum,
	// inconsistent reference counts, indexes out of range).
	ErrSnapshotCorrupt = errors.New("indexers: corrupt index snapshot")
	// ErrSnapshotMismatch: a valid snapshot that does not fit this index (another target or
	// block size, or more blocks than MaxBlocksPerTarget).
	ErrSnapshotMismatch = errors.New("indexers: index snapshot does not fit")
)

const (
	snapMagic   = "KVGS"
	snapVersion = 1
)

// EncodeSnapshot encodes target t's state as it is now, with cur as its cursor. The caller
// makes sure no batch is applied to t between the cursor and this call (the subscriber holds
// its apply lock).
func (ix *Index) EncodeSnapshot(t kvkey.Target, cur SnapshotCursor) ([]byte, error) {
	ts := ix.reg.Load().byTarget[t]
	if ts == nil {
		return nil, fmt.Errorf("indexers: snapshot of unknown target %s", t)
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.encodeLocked(cur), nil
}

func (ts *targetState) encodeLocked(cur SnapshotCursor) []byte {
	// Live nodes (the slab's slots not on the free list) in slab order, renumbered densely.
	const freed = -1
	renum := make([]int32, len(ts.slab))
	for _, i := range ts.free {
		renum[i] = freed
	}
	order := make([]int32, 0, len(ts.byOur))
	for i := range ts.slab {
		if renum[i] != freed {
			renum[i] = int32(len(order))
			order = append(order, int32(i))
		}
	}
	b := make([]byte, 0, 64+len(order)*12+len(ts.ext)*12)
	b = append(b, snapMagic...)
	b = append(b, snapVersion)
	b = binary.LittleEndian.AppendUint64(b, cur.Seq)
	b = binary.LittleEndian.AppendUint64(b, cur.Digest)
	b = binary.AppendUvarint(b, uint64(len(ts.target.Worker)))
	b = append(b, ts.target.Worker...)
	b = binary.AppendUvarint(b, uint64(ts.target.DPRank))
	b = binary.AppendUvarint(b, uint64(ts.ix.opt.BlockSize))
	b = binary.LittleEndian.AppendUint64(b, ts.groups)
	if ts.lowerTiers {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(order)))
	for _, i := range order {
		n := &ts.slab[i]
		b = binary.LittleEndian.AppendUint64(b, uint64(n.our))
		// A node in no set may keep the index of a parent that was freed since (nodeFor sets
		// it again before the node joins a set): such a link is written as a root.
		p := uint64(0)
		if n.parent >= 0 && renum[n.parent] != freed {
			p = uint64(renum[n.parent]) + 1
		}
		b = binary.AppendUvarint(b, p)
		for k := range numTiers {
			b = binary.AppendUvarint(b, uint64(n.res[k]))
		}
	}
	exts := slices.Sorted(maps.Keys(ts.ext))
	b = binary.AppendUvarint(b, uint64(len(exts)))
	for _, h := range exts {
		x := ts.ext[h]
		b = binary.LittleEndian.AppendUint64(b, uint64(h))
		b = binary.AppendUvarint(b, uint64(renum[x.node]))
		for k := range numTiers {
			b = binary.AppendUvarint(b, uint64(x.refs[k]))
		}
	}
	anchors := slices.Sorted(maps.Keys(ts.anchors))
	b = binary.AppendUvarint(b, uint64(len(anchors)))
	for _, h := range anchors {
		a := ts.anchors[h]
		b = binary.LittleEndian.AppendUint64(b, uint64(h))
		b = append(b, byte(a.tier))
		b = binary.AppendUvarint(b, uint64(len(a.nodes)))
		for _, i := range a.nodes {
			b = binary.AppendUvarint(b, uint64(renum[i]))
		}
	}
	recent := ts.recent.entries()
	b = binary.AppendUvarint(b, uint64(len(recent)))
	for _, r := range recent {
		b = binary.LittleEndian.AppendUint64(b, uint64(r.ext))
		b = binary.LittleEndian.AppendUint64(b, uint64(r.our))
		b = binary.LittleEndian.AppendUint64(b, uint64(r.parentOur))
		b = append(b, byte(r.tag&1))
	}
	return binary.LittleEndian.AppendUint64(b, xxh3.Hash(b))
}

// entries returns the remembered hashes oldest first.
func (r *recentRemoved) entries() []removedSlot {
	var out []removedSlot
	for _, s := range r.slots {
		if s.tag != 0 {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].tag>>1 < out[j].tag>>1 })
	return out
}

// decodedSnapshot is a snapshot parsed and checked, ready to install.
type decodedSnapshot struct {
	cur        SnapshotCursor
	target     kvkey.Target
	blockSize  int
	groups     uint64
	lowerTiers bool
	nodes      []node
	ext        map[kvkey.EngineHash]extEntry
	anchors    map[kvkey.EngineHash]anchor
	recent     []removedSlot
}

// snapReader reads a snapshot's fields, remembering the first error.
type snapReader struct {
	b   []byte
	err error
}

func (r *snapReader) fail() {
	if r.err == nil {
		r.err = fmt.Errorf("%w: truncated", ErrSnapshotCorrupt)
	}
	r.b = nil
}

func (r *snapReader) u64() uint64 {
	if len(r.b) < 8 {
		r.fail()
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

func (r *snapReader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail()
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *snapReader) byte1() byte {
	if len(r.b) < 1 {
		r.fail()
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

// count reads a length that each item of needs at least min bytes for (so a corrupt count
// cannot make the decoder allocate more than the input justifies).
func (r *snapReader) count(min int) int {
	v := r.uvarint()
	if r.err == nil && v > uint64(len(r.b)/min) {
		r.err = fmt.Errorf("%w: count %d exceeds the data", ErrSnapshotCorrupt, v)
		r.b = nil
		return 0
	}
	return int(v)
}

func (r *snapReader) refs() (out [numTiers]int32) {
	for k := range numTiers {
		v := r.uvarint()
		if v > 1<<30 {
			r.err = fmt.Errorf("%w: reference count %d", ErrSnapshotCorrupt, v)
		}
		out[k] = int32(v)
	}
	return out
}

// SnapshotInfo returns a snapshot's cursor and target without installing it.
func SnapshotInfo(data []byte) (SnapshotCursor, kvkey.Target, error) {
	d, err := decodeSnapshot(data, 0)
	if err != nil {
		return SnapshotCursor{}, kvkey.Target{}, err
	}
	return d.cur, d.target, nil
}

// decodeSnapshot parses and checks data; maxNodes > 0 bounds the node count.
func decodeSnapshot(data []byte, maxNodes int) (*decodedSnapshot, error) {
	if len(data) < len(snapMagic)+1+8 || string(data[:len(snapMagic)]) != snapMagic {
		return nil, fmt.Errorf("%w: not a snapshot", ErrSnapshotCorrupt)
	}
	body := data[:len(data)-8]
	if xxh3.Hash(body) != binary.LittleEndian.Uint64(data[len(data)-8:]) {
		return nil, fmt.Errorf("%w: checksum", ErrSnapshotCorrupt)
	}
	if v := data[len(snapMagic)]; v != snapVersion {
		return nil, fmt.Errorf("%w: version %d, want %d", ErrSnapshotMismatch, v, snapVersion)
	}
	r := &snapReader{b: body[len(snapMagic)+1:]}
	d := &decodedSnapshot{}
	d.cur.Seq, d.cur.Digest = r.u64(), r.u64()
	if n := r.count(1); r.err == nil {
		d.target.Worker = string(r.b[:n])
		r.b = r.b[n:]
	}
	d.target.DPRank = int(r.uvarint())
	d.blockSize = int(r.uvarint())
	d.groups = r.u64()
	d.lowerTiers = r.byte1() != 0
	nn := r.count(8 + 4)
	if maxNodes > 0 && nn > maxNodes {
		return nil, fmt.Errorf("%w: %d blocks, the index holds at most %d per target", ErrSnapshotMismatch, nn, maxNodes)
	}
	d.nodes = make([]node, nn)
	for i := range d.nodes {
		n := &d.nodes[i]
		n.our = kvkey.BlockHash(r.u64())
		p := r.uvarint()
		if p > uint64(nn) || p == uint64(i)+1 {
			r.err = fmt.Errorf("%w: node %d's parent %d", ErrSnapshotCorrupt, i, p)
		}
		n.parent = int32(p) - 1
		n.res = r.refs()
		if r.err != nil {
			return nil, r.err
		}
	}
	// Every reference of a node is one of a worker hash's or one of an anchor's.
	var refs [][numTiers]int32
	if nn > 0 {
		refs = make([][numTiers]int32, nn)
	}
	ne := r.count(8 + 4)
	d.ext = make(map[kvkey.EngineHash]extEntry, ne)
	for range ne {
		h := kvkey.EngineHash(r.u64())
		i := r.uvarint()
		x := extEntry{refs: r.refs()}
		if r.err != nil {
			return nil, r.err
		}
		if _, dup := d.ext[h]; dup || i >= uint64(nn) || x.refs == [numTiers]int32{} {
			return nil, fmt.Errorf("%w: worker hash %d", ErrSnapshotCorrupt, h)
		}
		x.node = int32(i)
		d.ext[h] = x
		for k := range numTiers {
			refs[i][k] += x.refs[k]
		}
	}
	na := r.count(8 + 2)
	d.anchors = make(map[kvkey.EngineHash]anchor, na)
	for range na {
		h := kvkey.EngineHash(r.u64())
		tier := Tier(r.byte1())
		m := r.count(1)
		if r.err != nil {
			return nil, r.err
		}
		if _, ok := d.ext[h]; !ok || tier >= numTiers || m == 0 {
			return nil, fmt.Errorf("%w: anchor %d", ErrSnapshotCorrupt, h)
		}
		a := anchor{tier: tier, nodes: make([]int32, m)}
		for j := range a.nodes {
			i := r.uvarint()
			if i >= uint64(nn) {
				return nil, fmt.Errorf("%w: anchor %d's node %d", ErrSnapshotCorrupt, h, i)
			}
			a.nodes[j] = int32(i)
			refs[i][tier]++
		}
		d.anchors[h] = a
	}
	nr := r.count(8*3 + 1)
	d.recent = make([]removedSlot, 0, nr)
	for range nr {
		s := removedSlot{ext: kvkey.EngineHash(r.u64()), our: kvkey.BlockHash(r.u64()), parentOur: kvkey.BlockHash(r.u64())}
		s.tag = uint64(r.byte1() & 1)
		d.recent = append(d.recent, s)
	}
	if r.err != nil {
		return nil, r.err
	}
	if len(r.b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrSnapshotCorrupt, len(r.b))
	}
	seen := make(map[kvkey.BlockHash]struct{}, nn)
	for i := range d.nodes {
		n := &d.nodes[i]
		if refs[i] != n.res {
			return nil, fmt.Errorf("%w: node %d's references %v, its worker hashes and anchors give %v", ErrSnapshotCorrupt, i, n.res, refs[i])
		}
		if _, dup := seen[n.our]; dup {
			return nil, fmt.Errorf("%w: block %d twice", ErrSnapshotCorrupt, n.our)
		}
		seen[n.our] = struct{}{}
	}
	return d, nil
}

// InstallSnapshot replaces target t's state with the snapshot in data and returns its cursor.
// The snapshot is checked whole before anything changes: a corrupt one, or one for another
// target or block size, leaves the state as it was. The change is recorded in cs (nil: not
// recorded) as a reset followed by a store of every resident block per tier.
func (ix *Index) InstallSnapshot(t kvkey.Target, data []byte, cs *ChangeSet) (SnapshotCursor, error) {
	d, err := decodeSnapshot(data, ix.opt.MaxBlocksPerTarget)
	if err != nil {
		return SnapshotCursor{}, err
	}
	if d.target != t {
		return SnapshotCursor{}, fmt.Errorf("%w: taken of %s, not %s", ErrSnapshotMismatch, d.target, t)
	}
	if d.blockSize != ix.opt.BlockSize {
		return SnapshotCursor{}, fmt.Errorf("%w: block size %d, the index uses %d", ErrSnapshotMismatch, d.blockSize, ix.opt.BlockSize)
	}
	if cs != nil {
		cs.reset(t)
	}
	ts, err := ix.target(t)
	if err != nil {
		return SnapshotCursor{}, err
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.cs = cs
	defer func() { ts.cs = nil }()
	ts.resetLocked()
	ts.stats.resets.Add(-1) // an install is not a reset of the stream
	ts.installLocked(d)
	if cs != nil {
		cs.seal()
	}
	return d.cur, nil
}

// installLocked builds the state of a just-reset target from d (checked by decodeSnapshot).
func (ts *targetState) installLocked(d *decodedSnapshot) {
	ts.groups, ts.lowerTiers = d.groups, d.lowerTiers
	ts.slab = append(ts.slab[:0], d.nodes...)
	for i := range ts.slab {
		ts.byOur[ts.slab[i].our] = int32(i)
	}
	ts.ext = d.ext
	ts.anchors = d.anchors
	for _, s := range d.recent {
		ts.recent.record(ts.ix.opt.RecentlyRemoved, s.ext,
			removedBlock{our: s.our, parentOur: s.parentOur, hasParent: s.tag&1 != 0})
	}
	// Membership, child counts, orphans and residency follow from the references.
	var stored [numTiers][]kvkey.BlockHash
	for i := range ts.slab {
		n := &ts.slab[i]
		m := n.memberMask()
		if m == 0 {
			continue
		}
		ts.ix.setBits(n.our, ts.slot, m, true)
		if n.parent >= 0 {
			p := &ts.slab[n.parent]
			for k := range numTiers {
				if m&(1<<k) != 0 {
					p.kids[k]++
				}
			}
		}
		for k := range Tier(numTiers) {
			if n.res[k] > 0 {
				ts.resident[k].Add(1)
				stored[k] = append(stored[k], n.our)
			}
		}
	}
	for i := range ts.slab {
		n := &ts.slab[i]
		m := n.memberMask()
		for k := range numTiers {
			if m&(1<<k) != 0 && n.parent >= 0 && !ts.slab[n.parent].member(k) {
				ts.orphans[k].Add(1)
			}
		}
	}
	// A node in no set with no resident children is dead: free it as the apply path would.
	for i := range ts.slab {
		ts.maybeFree(int32(i))
	}
	if cs := ts.cs; cs != nil {
		for k := range Tier(numTiers) {
			if len(stored[k]) > 0 {
				cs.add(Change{Kind: ChangeStored, Tier: k}, stored[k])
			}
		}
	}
}
