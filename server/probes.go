package server

import (
	"fmt"
	"net/http"

	"github.com/gin-gonic/gin"
)

// The probe paths. Both are open on the client listener whatever auth.api_keys says (the
// kubelet sends no credentials) and neither names a worker.
const (
	pathLive  = "/live"
	pathReady = "/ready"
)

// Component names the gateway's own readiness reasons carry.
const (
	componentServer  = "server"
	componentWorkers = "workers"
)

// readyBody is GET /ready's answer: {"ready": true} with 200, or {"ready": false, "reasons":
// [{"component", "reason"}, ...]} with 503, one reason per component not ready. Warnings (an
// AdvisoryCheck not ready) are listed either way and never make it 503.
type readyBody struct {
	Ready    bool          `json:"ready"`
	Reasons  []readyReason `json:"reasons,omitempty"`
	Warnings []readyReason `json:"warnings,omitempty"`
}

// readyReason is why one component holds the gateway out of service.
type readyReason struct {
	Component string `json:"component"`
	Reason    string `json:"reason"`
}

// registerProbes adds GET/HEAD /live and /ready to e. Called before any auth middleware is
// installed, so the probes never need a key.
func (s *Server) registerProbes(e *gin.Engine) {
	e.GET(pathLive, s.handleLive)
	e.HEAD(pathLive, s.handleLive)
	e.GET(pathReady, s.handleReady)
	e.HEAD(pathReady, s.handleReady)
}

// handleLive is 200 while the process serves: the workers' state never fails it (a liveness
// probe that failed when the fleet dips would restart a healthy gateway). It turns 503 only
// once draining has ended and the listener is closing.
func (s *Server) handleLive(c *gin.Context) {
	if s.phase() == phaseStopping {
		c.JSON(http.StatusServiceUnavailable, gin.H{"status": "shutting_down"})
		return
	}
	c.JSON(http.StatusOK, gin.H{"status": "live"})
}

// handleReady is 200 when nothing holds the gateway out of service, else 503 with every
// reason (see readiness).
func (s *Server) handleReady(c *gin.Context) {
	reasons, warnings := s.readiness()
	if len(reasons) > 0 {
		c.JSON(http.StatusServiceUnavailable, readyBody{Reasons: reasons, Warnings: warnings})
		return
	}
	c.JSON(http.StatusOK, readyBody{Ready: true, Warnings: warnings})
}

// readiness lists why the gateway should not get traffic: it is draining, the model has no
// routable worker, or a ReadinessCheck (discovery, model pools, KV subscriptions) is not ready.
// No reasons means ready; warnings are the AdvisoryChecks not ready, listed but never holding
// the gateway out.
func (s *Server) readiness() (reasons, warnings []readyReason) {
	var out []readyReason
	if s.phase() != phaseServing {
		out = append(out, readyReason{componentServer, "draining: shutting down on a signal"})
	}
	for _, rc := range s.checks {
		if name, ready, reason := rc.Readiness(); !ready {
			if reason == "" {
				reason = "not ready"
			}
			if _, advisory := rc.(AdvisoryCheck); advisory {
				warnings = append(warnings, readyReason{name, reason})
				continue
			}
			out = append(out, readyReason{name, reason})
		}
	}
	return out, warnings
}

// registryReadiness is one model pool's check: every configured model needs at least one
// routable worker. It counts workers and never names them (the probe is unauthenticated).
type registryReadiness struct{ p *pool }

// Readiness implements ReadinessCheck.
func (r registryReadiness) Readiness() (string, bool, string) {
	total := len(r.p.Registry.Workers())
	if n := r.p.Registry.RoutableCount(); n > 0 {
		return componentWorkers, true, ""
	}
	return componentWorkers, false, fmt.Sprintf("model %q has no routable worker (0 of %d)", r.p.Model, total)
}
