package server

import "github.com/prometheus/client_golang/prometheus"

// ForgetWorker deletes every series the server keeps labelled with worker (its base URL),
// once discovery removed it from the fleet: a fleet that churns must not grow /metrics.
func (s *Server) ForgetWorker(worker string) {
	l := prometheus.Labels{"worker": worker}
	s.m.upstreamErrors.DeletePartialMatch(l)
	s.m.workerRequests.DeletePartialMatch(l)
}
