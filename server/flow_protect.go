package server

import (
	"time"

	"github.com/kvgate/kvgate/flowcontrol"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router"
)

// Cache protection (flow_control.protect_cache): the gate remembers, per target, each
// session's last prompt routed there with its class (flowcontrol.Footprints) and tells the
// queue, with every target's state, the footprints the router's working sets still count as
// cached there (flowcontrol.Guard; router.Retention). The queue keeps the requests such a
// class outranks off those targets (flowcontrol/protect.go).

// footMark is a footprint's key in the router's working set (ok false: none known).
type footMark struct {
	key kvkey.BlockHash
	ok  bool
}

// placed records the request's prompt as its session's footprint on target, the one its
// route chose. Safe on a nil ticket; nothing without cache protection.
func (t *flowTicket) placed(target kvkey.Target, rreq *router.Request) {
	if t == nil || t.g.fp == nil || len(rreq.BlockHashes) == 0 {
		return
	}
	var m footMark
	if t.g.ret != nil {
		m.key, m.ok = t.g.ret.PromptMark(rreq.BlockHashes)
	}
	tenant := ""
	if t.class.named {
		tenant = t.class.tenant
	}
	t.g.fp.Record(target, t.class.priority, tenant, rreq.SessionID, float64(len(rreq.BlockHashes)), m, time.Now())
}

// guards are target's footprints within protect_window that LRU has not evicted by the
// router's estimate: still in target's working set (not routed elsewhere since, nor older
// than router.approximate.ttl), and the distinct blocks routed there since, with the
// footprint itself, within the target's num_gpu_blocks (once scraped). Without the working
// sets every footprint within the window counts.
func (g *flowGate) guards(target kvkey.Target) []flowcontrol.Guard {
	if g.fp == nil {
		return nil
	}
	var out []flowcontrol.Guard
	for _, f := range g.fp.Live(target, time.Now()) {
		if g.ret != nil && f.Mark.ok {
			newer, capacity, ok := g.ret.Retained(target, f.Mark.key)
			if !ok || capacity > 0 && newer+f.Blocks > capacity {
				continue
			}
		}
		out = append(out, flowcontrol.Guard{Priority: f.Priority, Tenant: f.Tenant, Blocks: f.Blocks})
	}
	return out
}
