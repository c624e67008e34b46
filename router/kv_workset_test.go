package router

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// TestWorkingSets: a conversation's next turn, which extends the last prompt, adds only its new
// blocks (to within the stride kept out at its end); an unrelated prompt adds its own; keys
// older than the window leave, and the count follows them.
func TestWorkingSets(t *testing.T) {
	now := time.Unix(1000, 0)
	ws := newWorkingSets(time.Minute)
	turn := chain(1, 64+16*40) // 704 blocks: every block a key or a stride's end
	for _, tc := range []struct {
		name   string
		hashes []kvkey.BlockHash
		at     time.Duration
		want   float64
	}{
		{"first turn", turn[:64+16*20], 0, 64 + 16*20},
		{"same turn again", turn[:64+16*20], time.Second, 64 + 16*20},
		{"next turn extends it", turn, 2 * time.Second, 64 + 16*40},
		{"tail short of a stride is left out", append(append([]kvkey.BlockHash{}, turn...), chain(2, 15)...), 3 * time.Second, 64 + 16*40},
		{"unrelated prompt", chain(3, 100), 4 * time.Second, 64 + 16*40 + 64 + 32},
	} {
		ws.record(tgt(0), tc.hashes, now.Add(tc.at))
		if got := ws.blocks(tgt(0)); got != tc.want {
			t.Fatalf("%s: %v blocks, want %v", tc.name, got, tc.want)
		}
	}
	ws.expire(now.Add(3*time.Second + 1)) // only the unrelated prompt was routed since
	if got := ws.blocks(tgt(0)); got != 64+32 {
		t.Fatalf("after expiry: %v blocks, want 96", got)
	}
	ws.forget(tgt(0))
	if got := ws.blocks(tgt(0)); got != 0 {
		t.Fatalf("after forget: %v", got)
	}
}

// TestWorkingSetsNewerThanPrefix: the blocks routed to a target after a cached prefix was last
// used there are those of later prompts only; using the prefix again makes it the newest;
// expiry takes the expired keys out of the count; a prefix the set does not hold is older
// than all of it; an old bucket reused after the window counts only its new keys.
func TestWorkingSetsNewerThanPrefix(t *testing.T) {
	now := time.Unix(1000, 0)
	ws := newWorkingSets(time.Minute)
	a, b, c := chain(1, 64+16*20), chain(2, 100), chain(3, 64+16*10) // 384, 96 and 224 blocks
	steps := []struct {
		name   string
		hashes []kvkey.BlockHash // routed at step i seconds (nil: none)
		expire time.Duration     // expire keys older than this (0: none)
		prefix []kvkey.BlockHash
		cached int
		want   float64
	}{
		{"a alone", a, 0, a, len(a), 0},
		{"b after a", b, 0, a, len(a), 96},
		{"c after both", c, 0, a, 100, 96 + 224},
		{"the newest has none newer", nil, 0, c, len(c), 0},
		{"a used again", a, 0, b, len(b), 224 + 384},
		{"a is the newest now", nil, 0, a, len(a), 0},
		{"b expired: c and a newer than the unknown b", nil, 2 * time.Second, b, len(b), 224 + 384},
		{"a prefix the set never held is older than it all", nil, 0, chain(9, 10), 10, 224 + 384},
		{"nothing cached", nil, 0, a, 0, 0},
	}
	for i, st := range steps {
		at := now.Add(time.Duration(i) * time.Second)
		if st.hashes != nil {
			ws.record(tgt(0), st.hashes, at)
		}
		if st.expire > 0 {
			ws.expire(now.Add(st.expire))
		}
		if got := ws.newerThanPrefix(tgt(0), st.prefix, st.cached); got != st.want {
			t.Fatalf("%s: %v blocks newer, want %v", st.name, got, st.want)
		}
	}
	// Long after the window, in slots the first keys used: only the new prompt counts.
	later := now.Add(ageSlots * time.Second)
	ws.expire(later.Add(-time.Minute))
	ws.record(tgt(0), b, later)
	ws.record(tgt(0), c, later.Add(time.Second))
	if got := ws.newerThanPrefix(tgt(0), b, len(b)); got != 224 {
		t.Fatalf("after the window: %v blocks newer than b, want 224", got)
	}
}

// TestWorkingSetsMove: a prompt routed to another target takes its deep keys along (its
// session will not ask the old worker for them again), leaving the shared first heldExact
// blocks on both; expiry and forget leave no owner behind.
func TestWorkingSetsMove(t *testing.T) {
	now := time.Unix(1000, 0)
	ws := newWorkingSets(time.Minute)
	turn := chain(1, 64+16*40)
	steps := []struct {
		name         string
		to           int
		want0, want1 float64
	}{
		{"first on 0", 0, 64 + 16*40, 0},
		{"moved to 1", 1, 64, 64 + 16*40},
		{"back on 0", 0, 64 + 16*40, 64},
	}
	for i, st := range steps {
		ws.record(tgt(st.to), turn, now.Add(time.Duration(i)*time.Second))
		if got0, got1 := ws.blocks(tgt(0)), ws.blocks(tgt(1)); got0 != st.want0 || got1 != st.want1 {
			t.Fatalf("%s: %v and %v blocks, want %v and %v", st.name, got0, got1, st.want0, st.want1)
		}
	}
	ws.forget(tgt(0))
	ws.record(tgt(1), turn, now.Add(10*time.Second)) // the forgotten set is no owner any more
	if got := ws.blocks(tgt(1)); got != 64+16*40 {
		t.Fatalf("after forget and a new route: %v blocks", got)
	}
	ws.expire(now.Add(time.Hour))
	if got, n := ws.blocks(tgt(1)), len(ws.owner); got != 0 || n != 0 {
		t.Fatalf("after expiry: %v blocks, %d owned keys", got, n)
	}
}
