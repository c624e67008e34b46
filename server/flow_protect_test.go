package server

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/flowcontrol"
	"github.com/kvgate/kvgate/kvkey"
)

// fakeRetention answers Retained from a table (the router's working sets in the real gate).
type fakeRetention struct {
	newer, capacity float64
	ok              bool
}

func (f fakeRetention) PromptMark(h []kvkey.BlockHash) (kvkey.BlockHash, bool) { return h[0], true }
func (f fakeRetention) Retained(kvkey.Target, kvkey.BlockHash) (float64, float64, bool) {
	return f.newer, f.capacity, f.ok
}

// A footprint is guarded while the router counts it cached: still in the target's working
// set, and the blocks routed there since, with its own, within the target's capacity.
func TestFlowGuards(t *testing.T) {
	tg := kvkey.Target{Worker: "http://w1"}
	cases := []struct {
		name string
		ret  fakeRetention
		want bool
	}{
		{"retained, capacity not scraped yet", fakeRetention{newer: 5000, ok: true}, true},
		{"retained within capacity", fakeRetention{newer: 900, capacity: 1000, ok: true}, true},
		{"evicted by the estimate: 901 newer blocks and its 100 pass 1000", fakeRetention{newer: 901, capacity: 1000, ok: true}, false},
		{"moved elsewhere or aged out of the working set", fakeRetention{capacity: 1000}, false},
	}
	for _, tc := range cases {
		g := &flowGate{fp: flowcontrol.NewFootprints[kvkey.Target, footMark](time.Minute), ret: tc.ret}
		g.fp.Record(tg, 1, "", "s", 100, footMark{key: 7, ok: true}, time.Now())
		got := g.guards(tg)
		if (len(got) == 1) != tc.want || len(got) == 1 && (got[0].Priority != 1 || got[0].Blocks != 100) {
			t.Errorf("%s: guards %+v, want one priority-1 guard of 100 blocks: %v", tc.name, got, tc.want)
		}
	}
	g := &flowGate{fp: flowcontrol.NewFootprints[kvkey.Target, footMark](time.Minute)} // no working sets
	g.fp.Record(tg, 1, "", "s", 100, footMark{}, time.Now())
	if got := g.guards(tg); len(got) != 1 {
		t.Errorf("without the working sets a footprint within the window is guarded; got %+v", got)
	}
}
