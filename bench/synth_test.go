package bench

import (
	"path/filepath"
	"strings"
	"testing"
)

func words(s string) []string { return strings.Fields(s) }

func TestSynthBlocks(t *testing.T) {
	s, err := NewSynth(nil, 64)
	if err != nil {
		t.Fatal(err)
	}
	a, b := s.Block("t1", 7, 64), s.Block("t1", 7, 64)
	if a != b || len(words(a)) != 64 || !strings.HasPrefix(a, " ") {
		t.Fatalf("block not deterministic or wrong size: %d words", len(words(a)))
	}
	if s.Block("t2", 7, 64) == a || s.Block("t1", 8, 64) == a {
		t.Error("different namespace or hash_id must give different text")
	}
	if p := s.Block("t1", 7, 10); !strings.HasPrefix(a, p) || len(words(p)) != 10 {
		t.Errorf("a partial block must be a prefix of the full block")
	}
	if got := len(words(s.Prompt("", []int64{1, 2, 3}, 150, "k"))); got != 150 {
		t.Errorf("mooncake prompt with partial last block: %d tokens, want 150", got)
	}
	if got := len(words(s.Prompt("", nil, 33, "k"))); got != 33 {
		t.Errorf("prompt without hash_ids: %d tokens, want 33", got)
	}
	if _, err := NewSynth(nil, 0); err == nil {
		t.Error("block size 0 must fail")
	}
}

// TestWekaReconstruction replays the message arrays of a real agentic trace: every turn carries
// exactly `in` synthetic tokens, and the tokens of the longest common hash_id prefix with the
// previous turn are byte-identical (as aiperf rebuilds Weka traces).
func TestWekaReconstruction(t *testing.T) {
	tr, err := Load(filepath.Join(embeddedTraces, "trace_0291.json"), LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := NewSynth(nil, tr.BlockSize)
	var resets int
	tr.Walk(func(sess *Session) {
		c := newConversation(sess, s)
		prevText, prev := "", []int64(nil)
		for k, turn := range sess.Turns {
			msgs := c.messages(k)
			var all strings.Builder
			for _, m := range msgs {
				all.WriteString(m.Content)
			}
			text := all.String()
			if n := len(words(text)); n != turn.InputTokens {
				t.Fatalf("%s turn %d: %d tokens, want in=%d", sess.ID, k, n, turn.InputTokens)
			}
			if k == 0 && (msgs[0].Role != "system" || msgs[len(msgs)-1].Role != "user") {
				t.Errorf("%s turn 0 roles %v", sess.ID, roles(msgs))
			}
			if k > 0 {
				lcp := 0
				for lcp < len(prev) && lcp < len(turn.HashIDs) && prev[lcp] == turn.HashIDs[lcp] {
					lcp++
				}
				pw, cw := words(prevText), words(text)
				for i := 0; i < lcp*tr.BlockSize; i++ {
					if pw[i] != cw[i] {
						t.Fatalf("%s turn %d: token %d differs inside the shared prefix of %d blocks", sess.ID, k, i, lcp)
					}
				}
				if lcp == len(prev) && lcp < len(turn.HashIDs) && msgs[len(msgs)-2].Role != "assistant" {
					t.Errorf("%s turn %d: new blocks after a full prefix must start with the pre-canned assistant reply, roles %v", sess.ID, k, roles(msgs))
				}
			}
			prevText, prev = text, turn.HashIDs
		}
		resets += c.resets
	})
	t.Logf("context resets: %d", resets)
}

func roles(m []Message) []string {
	out := make([]string, len(m))
	for i := range m {
		out[i] = m[i].Role
	}
	return out
}

func TestDeltaHistory(t *testing.T) {
	s, _ := NewSynth(nil, 16)
	sess := &Session{ID: "a", Mode: ContextDeltas, Turns: []Turn{
		{InputTokens: 20, HashIDs: []int64{1, 2}}, {Text: "next question"}, {InputTokens: 5, HashIDs: []int64{3}},
	}}
	c := newConversation(sess, s)
	m0 := c.messages(0)
	c.record(0, m0, "live reply")
	m1 := c.messages(1)
	c.record(1, m1, "")
	m2 := c.messages(2)
	if len(m2) != 4 || m2[1].Content != "live reply" || m2[1].Role != "assistant" || m2[2].Content != "next question" ||
		len(words(m2[3].Content)) != 5 || m2[0].Content != m0[0].Content {
		t.Fatalf("history = %+v", m2)
	}
	alone := &Session{ID: "b", Mode: ContextStandalone, Turns: sess.Turns}
	c = newConversation(alone, s)
	c.record(0, c.messages(0), "reply")
	if got := c.messages(1); len(got) != 1 {
		t.Errorf("standalone turns carry no history, got %d messages", len(got))
	}
}
