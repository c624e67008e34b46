package bench

import (
	"fmt"
	"strings"
)

// conversation builds the message arrays of one session replay, turn by turn.
type conversation struct {
	s     *Session
	synth *Synth

	history []Message // ContextDeltas: sent turns plus live replies

	// ContextWeka reconstruction state (aiperf src/aiperf/dataset/loader/weka_trace_models.py;
	// docs/benchmarking.md "Trace formats").
	segs    []wekaMsg
	prevIDs []int64
	prevOut int
	resets  int // turns whose prefix cut into already sent segments (context edits, compaction)
}

// wekaMsg is a reconstructed message: hash blocks followed by an optional unhashed tail.
type wekaMsg struct {
	role    string
	blocks  []int64
	tail    int
	tailKey string
}

func newConversation(s *Session, synth *Synth) *conversation {
	return &conversation{s: s, synth: synth}
}

// messages returns the chat messages for turn k.
func (c *conversation) messages(k int) []Message {
	t := &c.s.Turns[k]
	if t.Messages != nil {
		return t.Messages // literal full history, sent verbatim
	}
	switch c.s.Mode {
	case ContextWeka:
		return c.weka(k)
	case ContextDeltas:
		msgs := make([]Message, 0, len(c.history)+1)
		msgs = append(msgs, c.history...)
		return append(msgs, c.userTurn(k))
	default:
		return []Message{c.userTurn(k)}
	}
}

// userTurn is the new message of turn k: literal text or synthetic tokens.
func (c *conversation) userTurn(k int) Message {
	t := &c.s.Turns[k]
	role := t.Role
	if role == "" {
		role = "user"
	}
	if t.Text != "" {
		return Message{Role: role, Content: t.Text}
	}
	key := fmt.Sprintf("%s:%s:turn_%d", c.s.Namespace, c.s.ID, k)
	return Message{Role: role, Content: c.synth.Prompt(c.s.Namespace, t.HashIDs, t.InputTokens, key)}
}

// record appends turn k and the live reply to the history (ContextDeltas only).
func (c *conversation) record(k int, sent []Message, reply string) {
	if c.s.Mode != ContextDeltas || c.s.Turns[k].Messages != nil {
		return
	}
	c.history = append(c.history, sent[len(sent)-1])
	if reply != "" {
		c.history = append(c.history, Message{Role: "assistant", Content: reply})
	}
}

// weka rebuilds the full message array for turn k from hash_id prefixes: the longest common
// prefix with the previous turn is kept, the new blocks become a pre-canned assistant message
// (ceil(prev.out/bs) blocks) followed by a user message carrying the rest and the unhashed tail.
func (c *conversation) weka(k int) []Message {
	t := &c.s.Turns[k]
	bs := c.synth.BlockSize()
	tail := t.InputTokens - len(t.HashIDs)*bs
	tailKey := fmt.Sprintf("%s:%s:turn_%d:partial_tail", c.s.Namespace, c.s.ID, k)
	if k == 0 || c.segs == nil {
		sys := min((c.s.SystemTokens+bs-1)/bs, len(t.HashIDs))
		user := wekaMsg{role: "user", blocks: t.HashIDs[sys:], tail: tail, tailKey: tailKey}
		if len(user.blocks) == 0 && user.tail == 0 && sys > 0 {
			sys--
			user.blocks = t.HashIDs[sys:]
		}
		c.segs = nil
		if sys > 0 {
			c.segs = append(c.segs, wekaMsg{role: "system", blocks: t.HashIDs[:sys]})
		}
		c.segs = append(c.segs, user)
	} else {
		lcp := 0
		for lcp < len(c.prevIDs) && lcp < len(t.HashIDs) && c.prevIDs[lcp] == t.HashIDs[lcp] {
			lcp++
		}
		if lcp < len(c.prevIDs) {
			c.resets++
		}
		c.segs = truncateSegs(c.segs, lcp)
		fresh := t.HashIDs[lcp:]
		nA := min((c.prevOut+bs-1)/bs, len(fresh))
		user := wekaMsg{role: "user", blocks: fresh[nA:], tail: tail, tailKey: tailKey}
		if len(user.blocks) == 0 && user.tail == 0 {
			if nA > 0 {
				nA--
				user.blocks = fresh[nA:]
			} else {
				user.tail, user.tailKey = 1, tailKey // nothing new: a one-token user turn
			}
		}
		if nA > 0 {
			c.segs = append(c.segs, wekaMsg{role: "assistant", blocks: fresh[:nA]})
		}
		c.segs = append(c.segs, user)
	}
	c.prevIDs, c.prevOut = t.HashIDs, t.OutputTokens
	out := make([]Message, 0, len(c.segs))
	for _, m := range c.segs {
		var b strings.Builder
		for _, id := range m.blocks {
			b.WriteString(c.synth.Block(c.s.Namespace, id, bs))
		}
		b.WriteString(c.synth.Filler(m.tailKey, m.tail))
		out = append(out, Message{Role: m.role, Content: b.String()})
	}
	return out
}

// truncateSegs keeps the first lcp blocks of the message list; tails before the cut survive, a
// tail right after the last kept block is dropped (the next turn's block covers it).
func truncateSegs(segs []wekaMsg, lcp int) []wekaMsg {
	var out []wekaMsg
	seen := 0
	for _, m := range segs {
		if seen >= lcp {
			break
		}
		if seen+len(m.blocks) < lcp {
			out = append(out, m) // whole message, tail included: more blocks follow it
			seen += len(m.blocks)
			continue
		}
		keep := lcp - seen
		out = append(out, wekaMsg{role: m.role, blocks: m.blocks[:keep]})
		seen = lcp
	}
	return out
}
