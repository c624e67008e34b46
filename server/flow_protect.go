package server

import (
	"time"

	"github.com/kvgate/kvgate/flowcontrol"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router"
)

// Cache protection (flow_control.protect_cache): the gate remembers, per target, each
// class's last prompt routed there (flowcontrol.Footprints) and tells the queue, with every
// target's state, how many more blocks that target's KV cache takes before LRU evicts each
// of those prompts (flowcontrol.Guard, from the router's working sets: router.Retention).
// The queue then keeps the requests such a class outranks off the targets where their
// prefill would pass that slack (flowcontrol/protect.go).

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

// guards are target's live footprints as the queue reads them: each with its slack (the
// target's capacity less the footprint and the blocks routed there since it was) when the
// router knows it. A footprint the router no longer sees there (routed elsewhere since, or
// aged out of the working set) or whose slack is already spent (LRU has evicted it, by that
// estimate) is no longer guarded.
func (g *flowGate) guards(target kvkey.Target) []flowcontrol.Guard {
	if g.fp == nil {
		return nil
	}
	var out []flowcontrol.Guard
	for _, f := range g.fp.Live(target, time.Now()) {
		gd := flowcontrol.Guard{Priority: f.Priority, Tenant: f.Tenant, Blocks: f.Blocks}
		if g.ret != nil && f.Mark.ok {
			newer, capacity, ok := g.ret.Retained(target, f.Mark.key)
			if !ok {
				continue
			}
			if capacity > 0 {
				gd.Slack, gd.HasSlack = capacity-f.Blocks-newer, true
				if gd.Slack < 0 {
					continue
				}
			}
		}
		out = append(out, gd)
	}
	return out
}
