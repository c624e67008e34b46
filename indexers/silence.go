package indexers

import (
	"fmt"
	"time"
)

// SilenceAfter is how long a subscription may hear nothing while its worker serves prompts
// before it is reported silent: a warning, kvgate_kv_events_silent and a readiness reason
// (the default of SubscriberConfig.SilenceAfter).
const SilenceAfter = 30 * time.Second

// silentSince decides whether a subscription is silent at now: no event batch has arrived
// since it started, and a prompt with a full block was routed to its worker at least after
// ago, not before the subscription started (an idle worker publishes nothing and is not
// silent). The times are unix nanos; 0 means never.
func silentSince(started, firstRouted, lastEvent, now int64, after time.Duration) bool {
	if lastEvent != 0 || firstRouted == 0 || started == 0 {
		return false
	}
	from := max(started, firstRouted)
	return now-from >= after.Nanoseconds()
}

// silenceHint names the likely cause of a silent subscription and its fix.
func (s *Subscriber) silenceHint() string {
	if s.cfg.Bind {
		return fmt.Sprintf("no worker published to the collector at %s: each worker's --kv-events-config endpoint must be tcp://THIS_GATEWAY:PORT of kv_events.listen (it connects out)", s.cfg.Endpoint)
	}
	if s.join.connected {
		return fmt.Sprintf("connected to %s but no event arrived although requests were routed there: the worker may publish elsewhere (a --kv-events-config endpoint tcp://HOST:PORT connects out instead of binding; it must be tcp://*:PORT), use another topic, or run without prefix caching", s.cfg.Endpoint)
	}
	return fmt.Sprintf("no publisher ever accepted the connection to %s: a worker whose --kv-events-config endpoint is tcp://HOST:PORT connects out instead of binding; make it tcp://*:PORT, or set kv_events.listen so workers connect to the gateway", s.cfg.Endpoint)
}

// checkSilence runs on the socket goroutine each loop turn: it marks the subscription silent
// (once, with a warning naming the likely cause) and clears the mark when events flow.
func (s *Subscriber) checkSilence(now time.Time) {
	var routed int64
	if ts := s.ix.reg.Load().byTarget[s.cfg.Target]; ts != nil {
		routed = ts.firstRouted.Load()
	}
	silent := silentSince(s.stats.started.Load(), routed, s.stats.lastEvent.Load(), now.UnixNano(), s.cfg.SilenceAfter)
	if silent == s.stats.silent.Load() {
		return
	}
	if silent {
		s.log.Warn("kv-events: subscription silent", "silent_for", s.cfg.SilenceAfter, "likely_cause", s.silenceHint())
	}
	s.stats.silent.Store(silent) // after the warning: whoever sees the mark finds it logged
}

// Advisory marks the subscriptions' check as a warning (server.AdvisoryCheck): a silent
// subscription degrades routing on its worker, it does not take the gateway out of service.
func (m *Subscribers) Advisory() {}

// Readiness reports the KV-event subscriptions as a readiness check (server.ReadinessCheck):
// not ready while any is silent (silentSince); GET /ready lists it as a warning (Advisory). The reason counts them and names the usual
// cause; it names no worker (GET /ready is open), the log and /debug/workers do.
func (m *Subscribers) Readiness() (name string, ready bool, reason string) {
	subs := m.bySub.Load()
	if subs == nil {
		return "kv_events", true, ""
	}
	n := 0
	for _, s := range *subs {
		if s.stats.silent.Load() {
			n++
		}
	}
	if n == 0 {
		return "kv_events", true, ""
	}
	return "kv_events", false, fmt.Sprintf("%d KV-event subscription(s) heard nothing although prompts were routed to their workers: "+
		"a worker whose --kv-events-config endpoint is tcp://HOST:PORT connects out instead of binding (use tcp://*:PORT, or kv_events.listen); see the log", n)
}
