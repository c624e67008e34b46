package server

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/flowcontrol"
)

// The headers that ask for a flow-control priority: kvgate's own (an integer) and GIE's
// inference objective (a name, mapped through flow_control.objectives).
const (
	headerPriority  = "X-Kvgate-Priority"
	headerObjective = "X-Gateway-Inference-Objective"
)

// maxFairnessID is the longest fairness header value kept (longer ones are cut): a tenant's
// name is held while its attained service decays.
const maxFairnessID = 128

// flowClass is where a request stands in the gateway's queue: its priority and its
// fair-share tenant.
type flowClass struct {
	priority int
	tenant   string
	// named: the tenant is a client key's or the fairness header's (not an agent program's
	// nor the shared anonymous one); only named tenants' caches are protected from each
	// other (flow_control.protect_cache).
	named bool
}

// classify gives a request its priority and tenant.
//
// Priority: the client key's auth.keys[].priority (0 without one); x-kvgate-priority, or else
// a mapped x-gateway-inference-objective, may ask for a lower one, never a higher one. Without
// client keys any priority in [flowcontrol.MinPriority, MaxPriority] may be asked. A malformed
// or out-of-range x-kvgate-priority is a 400: a client that asks for a priority must learn it
// was not understood. An objective not in the map leaves the priority as it is.
//
// Tenant: under a client key, the key's name, subdivided by the fairness header's value when
// one is sent ("key/value": a key can split its own share among its users but never reach
// another key's tenant, whose name it cannot put before the slash); without client keys the
// fairness header's value, else the agent program (the root session of the request's session
// lineage, so a subagent fan-out shares one tenant with its parent), else one shared
// anonymous tenant.
func (s *Server) classify(h http.Header, tn *tenant, program string) (flowClass, *apiError) {
	fc := s.cfg.FlowControl
	ceiling, keyed := flowcontrol.MaxPriority, tn != nil
	cls := flowClass{}
	if keyed {
		ceiling, cls.priority = tn.priority, tn.priority
	}
	asked, ok := 0, false
	if v := h.Get(headerPriority); v != "" {
		p, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || p < flowcontrol.MinPriority || p > flowcontrol.MaxPriority {
			return flowClass{}, badRequest("", fmt.Sprintf("%s: %q is not an integer from %d to %d",
				strings.ToLower(headerPriority), v, flowcontrol.MinPriority, flowcontrol.MaxPriority))
		}
		asked, ok = p, true
	} else if v := h.Get(headerObjective); v != "" {
		asked, ok = fc.Objectives[v]
	}
	if ok {
		cls.priority = min(asked, ceiling)
	}
	fair := ""
	if fc.FairnessHeader != "" {
		fair = h.Get(fc.FairnessHeader)
		fair = fair[:min(len(fair), maxFairnessID)]
	}
	cls.named = keyed || fair != ""
	switch {
	case keyed && fair != "":
		cls.tenant = "key:" + tn.name + "/" + fair
	case keyed:
		cls.tenant = "key:" + tn.name
	case fair != "":
		cls.tenant = "fair:" + fair
	case program != "":
		cls.tenant = "program:" + program
	}
	return cls, nil
}
