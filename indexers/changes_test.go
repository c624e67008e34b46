package indexers

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// reentrantConsumer reads and writes the index it hears from, from inside IndexChanged: that
// deadlocks if the index still holds the target's lock while the consumer runs.
type reentrantConsumer struct {
	ix    *Index
	q     []kvkey.BlockHash
	calls int
	kinds []ChangeKind
}

func (c *reentrantConsumer) IndexChanged(cs *ChangeSet) {
	c.calls++
	for _, ch := range cs.Changes {
		c.kinds = append(c.kinds, ch.Kind)
	}
	_ = c.ix.Match(c.q)
	_ = c.ix.DeepestG1(cs.Target, c.q)
	// A write on the same target takes its lock; an empty batch changes nothing.
	_ = c.ix.Apply(cs.Target, &EventBatch{})
}

// The subscriber hands change sets over after the index released its lock: a consumer that
// calls back into the same index (the sessions layer reads it) must not deadlock, for applied
// batches and resets alike.
func TestConsumerCalledOutsideIndexLock(t *testing.T) {
	ix := NewIndex(Options{BlockSize: 4})
	tg := kvkey.Target{Worker: "http://w1"}
	toks := seqTokens(8, 1)
	c := &reentrantConsumer{ix: ix, q: kvkey.BlockHashes(toks, 4, kvkey.HashOptions{})}
	s := NewSubscriber(nil, ix, SubscriberConfig{Target: tg, Consumer: c}, quietLog())
	payload := func(evs ...Event) []byte {
		p, err := EncodeBatch(&EventBatch{TS: 1, Events: evs}, EncodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	steps := []struct {
		name string
		do   func()
		want []ChangeKind
	}{
		{"store", func() {
			s.apply(1, 0, payload(&BlockStored{BlockHashes: exts(1, 2), TokenIDs: toks, BlockSize: 4, Medium: Some(MediumGPU)}))
		}, []ChangeKind{ChangeStored, ChangeStoredRun}},
		{"remove", func() { s.apply(2, 0, payload(&BlockRemoved{BlockHashes: exts(2), Medium: Some(MediumGPU)})) },
			[]ChangeKind{ChangeRemoved}},
		{"clear", func() { s.apply(3, 0, payload(&AllBlocksCleared{})) }, []ChangeKind{ChangeCleared}},
		{"reset", func() { s.resetTarget(ResetGap) }, []ChangeKind{ChangeCleared}},
	}
	for _, st := range steps {
		c.kinds = c.kinds[:0]
		done := make(chan struct{})
		go func() { defer close(done); st.do() }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the consumer deadlocked on the index: it was called under the index's lock", st.name)
		}
		if len(c.kinds) != len(st.want) {
			t.Fatalf("%s: consumer heard %v, want %v", st.name, c.kinds, st.want)
		}
		for i := range st.want {
			if c.kinds[i] != st.want[i] {
				t.Fatalf("%s: consumer heard %v, want %v", st.name, c.kinds, st.want)
			}
		}
	}
}

// A ChangeSet reused for many batches keeps each batch's hashes apart, and an unrecorded apply
// (nil set) changes the index exactly like a recorded one.
func TestChangeSetReuse(t *testing.T) {
	tg := kvkey.Target{Worker: "a"}
	toks := seqTokens(16, 3)
	q := kvkey.BlockHashes(toks, 4, kvkey.HashOptions{})
	batches := []*EventBatch{
		{Events: []Event{&BlockStored{BlockHashes: exts(1, 2), TokenIDs: toks[:8], BlockSize: 4, SessionID: Some("s")}}},
		{Events: []Event{&BlockStored{BlockHashes: exts(3, 4), ParentBlockHash: Some(IntHash(2)), TokenIDs: toks[8:], BlockSize: 4},
			&BlockRemoved{BlockHashes: exts(4, 3)}}},
	}
	want := [][]Change{
		{{Kind: ChangeStored, Hashes: q[:2]}, {Kind: ChangeStoredRun, Hashes: q[:2], SessionID: "s"}},
		{{Kind: ChangeStored, Hashes: q[2:]}, {Kind: ChangeStoredRun, Hashes: q[2:], Parent: q[1], HasParent: true},
			{Kind: ChangeRemoved, Hashes: []kvkey.BlockHash{q[3], q[2]}}},
	}
	recorded, plain := NewIndex(Options{BlockSize: 4}), NewIndex(Options{BlockSize: 4})
	var cs ChangeSet
	for i, b := range batches {
		if err := recorded.ApplyTo(tg, b, &cs); err != nil {
			t.Fatal(err)
		}
		if err := plain.Apply(tg, b); err != nil {
			t.Fatal(err)
		}
		if cs.Target != tg || len(cs.Changes) != len(want[i]) {
			t.Fatalf("batch %d: %d changes for %v, want %d", i, len(cs.Changes), cs.Target, len(want[i]))
		}
		for j, w := range want[i] {
			g := cs.Changes[j]
			if g.Kind != w.Kind || g.Parent != w.Parent || g.HasParent != w.HasParent || g.SessionID != w.SessionID ||
				!slices.Equal(g.Hashes, w.Hashes) {
				t.Errorf("batch %d change %d = %+v, want %+v", i, j, g, w)
			}
		}
	}
	if a, b := dumpTarget(recorded, tg), dumpTarget(plain, tg); len(a) != len(b) {
		t.Fatalf("recorded index holds %d blocks, plain %d", len(a), len(b))
	}
}

// Recording change sets while routers match concurrently is race-free.
func TestApplyToConcurrentMatch(t *testing.T) {
	ix := NewIndex(Options{BlockSize: 4})
	tg := kvkey.Target{Worker: "a"}
	toks := seqTokens(16, 5)
	q := kvkey.BlockHashes(toks, 4, kvkey.HashOptions{})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
					_ = ix.Match(q)
					_ = ix.DeepestG1(tg, q)
				}
			}
		}()
	}
	var cs ChangeSet
	for range 300 {
		_ = ix.ApplyTo(tg, &EventBatch{Events: []Event{&BlockStored{BlockHashes: exts(1, 2, 3, 4), TokenIDs: toks, BlockSize: 4}}}, &cs)
		_ = ix.ApplyTo(tg, &EventBatch{Events: []Event{&BlockRemoved{BlockHashes: exts(4, 3, 2, 1)}}}, &cs)
	}
	close(stop)
	wg.Wait()
	if len(cs.Changes) != 1 || cs.Changes[0].Kind != ChangeRemoved || len(cs.Changes[0].Hashes) != 4 {
		t.Fatalf("last change set %+v", cs.Changes)
	}
}
