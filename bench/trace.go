package bench

import (
	"fmt"
	"time"
)

// Format names a trace file format kvbench understands (aiperf's custom dataset types).
type Format string

// Supported trace formats.
const (
	FormatMooncake   Format = "mooncake"
	FormatWeka       Format = "weka"
	FormatMultiTurn  Format = "multi_turn"
	FormatSingleTurn Format = "single_turn"
)

// ParseFormat maps a --format value (aiperf spellings accepted) to a Format; "" means auto-detect.
func ParseFormat(s string) (Format, error) {
	switch s {
	case "":
		return "", nil
	case "mooncake", "mooncake_trace":
		return FormatMooncake, nil
	case "weka", "weka_trace", "cc-traces":
		return FormatWeka, nil
	case "multi_turn":
		return FormatMultiTurn, nil
	case "single_turn":
		return FormatSingleTurn, nil
	}
	return "", fmt.Errorf("unknown trace format %q (want mooncake, weka, multi_turn or single_turn)", s)
}

// ContextMode says how a session's turns build the messages sent on the wire.
type ContextMode int

const (
	// ContextStandalone sends each turn on its own: no history (mooncake rows without session_id,
	// single_turn rows).
	ContextStandalone ContextMode = iota
	// ContextDeltas appends each turn as a new user message to the accumulated history, including
	// the server's live assistant replies (mooncake sessions, multi_turn).
	ContextDeltas
	// ContextWeka rebuilds the full message array from hash_id prefixes with pre-canned assistant
	// blocks (the Weka / cc-traces reconstruction of aiperf's weka_trace loader).
	ContextWeka
)

// Message is a literal chat message taken from a trace.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Turn is one request of a session as recorded in the trace.
type Turn struct {
	Line int // 1-based line (JSONL) or request ordinal (JSON) in the source file, for errors

	// Timing. Timestamp is absolute from the trace start when HasTimestamp; otherwise the turn is
	// sent Delay after the previous turn of its session completes.
	HasTimestamp bool
	Timestamp    time.Duration
	Delay        time.Duration

	// Synthetic input: InputTokens tokens whose leading blocks are HashIDs (mooncake: last block
	// may be partial; weka: hash_ids cover full blocks only and the tail has no id).
	InputTokens int
	HashIDs     []int64
	// Literal input (single_turn / multi_turn text, mooncake text_input or messages).
	Text     string
	Role     string // role of Text (single_turn/multi_turn `role`; default user)
	Messages []Message

	OutputTokens int    // max_completion_tokens (0 = leave to the server)
	Model        string // recorded model, informative only
	// Extra is shallow-merged into the request body (aiperf's per-row `extra`; it wins).
	Extra map[string]any

	// Weka only: the recorded generation time, used to derive end-to-start gaps.
	APITime time.Duration
}

// Session is one conversation replayed turn by turn. Child sessions (Weka subagents) hang off
// their parent with spawn and join points expressed in the parent's turn indices.
type Session struct {
	ID        string // the trace's id (not the wire correlation id, which is fresh per replay)
	ParentID  string // the parent session's trace id, for subagents
	Namespace string // hash_id namespace: "" = global (mooncake), trace id for weka local scope
	Mode      ContextMode
	Turns     []Turn

	// Start is the offset of the first turn from the start of the run (fixed schedule).
	Start time.Duration

	// Weka system prompt size in tokens (tool_tokens + system_tokens).
	SystemTokens int

	// Children are subagent sessions. SpawnAfter is the index of the parent turn whose completion
	// launches the child (after SpawnDelay); JoinBefore is the index of the parent turn that waits
	// for the child to finish, or -1 when nobody waits (background).
	Children   []*Session
	SpawnAfter int
	SpawnDelay time.Duration
	JoinBefore int
}

// RequestCount is the number of requests in the session and all its descendants.
func (s *Session) RequestCount() int {
	n := len(s.Turns)
	for _, c := range s.Children {
		n += c.RequestCount()
	}
	return n
}

// Trace is a loaded trace: root sessions in schedule order.
type Trace struct {
	Source    string
	Format    Format
	BlockSize int // tokens per hash_id block
	Sessions  []*Session
}

// RequestCount is the number of requests the trace holds, subagents included.
func (t *Trace) RequestCount() int {
	n := 0
	for _, s := range t.Sessions {
		n += s.RequestCount()
	}
	return n
}

// Walk calls fn for every session, parents before children.
func (t *Trace) Walk(fn func(s *Session)) {
	var walk func(s *Session)
	walk = func(s *Session) {
		fn(s)
		for _, c := range s.Children {
			walk(c)
		}
	}
	for _, s := range t.Sessions {
		walk(s)
	}
}

// lineError is an invalid row: file, line and reason, as the issue asks.
type lineError struct {
	File   string
	Line   int
	Reason string
}

func (e *lineError) Error() string {
	return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Reason)
}

func rowErr(file string, line int, format string, args ...any) error {
	return &lineError{File: file, Line: line, Reason: fmt.Sprintf(format, args...)}
}

// msDuration converts trace milliseconds (int or float) to a Duration.
func msDuration(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

// secDuration converts trace seconds to a Duration.
func secDuration(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// Repeat returns a trace in which every root session tree appears n times as independent copies,
// like n users running the same agent: copy i (i >= 1) has ids suffixed "#i", its own hash_id
// namespace (copies never share blocks) and its start shifted by i*stagger. Turns are shared
// read-only with the original.
func (t *Trace) Repeat(n int, stagger time.Duration) *Trace {
	return t.RepeatFrom(0, n, stagger)
}

// RepeatFrom is Repeat with the copies numbered from first: copies first..first+n-1, the k-th
// of them started k*stagger late. Two kvbench processes given disjoint ranges replay users
// that never share prompts (two tenants of one trace, for example).
func (t *Trace) RepeatFrom(first, n int, stagger time.Duration) *Trace {
	if n <= 1 && first == 0 {
		return t
	}
	out := &Trace{Source: t.Source, Format: t.Format, BlockSize: t.BlockSize}
	for k := range max(n, 1) {
		for _, s := range t.Sessions {
			out.Sessions = append(out.Sessions, s.copyAs(first+k, time.Duration(k)*stagger))
		}
	}
	return out
}

func (s *Session) copyAs(i int, shift time.Duration) *Session {
	if i == 0 {
		return s
	}
	suffix := fmt.Sprintf("#%d", i)
	c := *s
	c.ID += suffix
	if c.ParentID != "" {
		c.ParentID += suffix
	}
	c.Namespace += suffix
	c.Start += shift
	c.Children = make([]*Session, len(s.Children))
	for k, ch := range s.Children {
		c.Children[k] = ch.copyAs(i, 0)
	}
	return &c
}
