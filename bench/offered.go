package bench

import "time"

// Span is the time from the trace's start to its last request's send time if every answer
// were instant: turns follow their session's previous turn by their delay (or at their
// timestamp), subagents start their spawn delay after the parent turn that launches them, and
// a parent turn that joins a subagent waits for the subagent's last turn. Divided into the
// request count it is the request rate the trace offers at time scale 1; a closed-loop
// replay sends slower than that as soon as answers take time.
func (t *Trace) Span() time.Duration {
	var span time.Duration
	for _, s := range t.Sessions {
		span = max(span, s.zeroLatencyEnd(s.Start))
	}
	return span
}

// zeroLatencyEnd returns the send time of the session's last request (its descendants' too)
// when it starts at start and every answer is instant.
func (s *Session) zeroLatencyEnd(start time.Duration) time.Duration {
	joins := map[int]time.Duration{} // parent turn -> latest end of the children it joins
	last := start
	at := start
	for k := range s.Turns {
		t := &s.Turns[k]
		if k > 0 {
			at += t.Delay
			if t.HasTimestamp {
				at = max(at, t.Timestamp)
			}
		}
		if j, ok := joins[k]; ok {
			at = max(at, j)
		}
		last = max(last, at)
		for _, c := range s.Children {
			if c.SpawnAfter != k {
				continue
			}
			end := c.zeroLatencyEnd(at + c.SpawnDelay)
			last = max(last, end)
			if c.JoinBefore >= 0 {
				joins[c.JoinBefore] = max(joins[c.JoinBefore], end)
			}
		}
	}
	return last
}

// OfferedRate is the requests per second a fixed-schedule replay of n requests of the trace
// asks for at the time scale if every answer were instant: n over the scaled Span; 0 when the
// span is 0.
func (t *Trace) OfferedRate(n int, timeScale float64) float64 {
	if timeScale <= 0 {
		timeScale = 1
	}
	span := t.Span().Seconds() * timeScale
	if span <= 0 {
		return 0
	}
	return float64(n) / span
}
