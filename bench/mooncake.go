package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// MooncakeBlockSize is aiperf's default block size for mooncake_trace hash_ids.
const MooncakeBlockSize = 512

// mooncakeRow is one JSONL row of aiperf's mooncake_trace format (aiperf
// src/aiperf/dataset/loader/mooncake_trace.py, class MooncakeTrace in
// src/aiperf/dataset/loader/models.py).
type mooncakeRow struct {
	Timestamp    *float64        `json:"timestamp"`
	InputLength  *int            `json:"input_length"`
	OutputLength *int            `json:"output_length"`
	HashIDs      []int64         `json:"hash_ids"`
	TextInput    *string         `json:"text_input"`
	Messages     []Message       `json:"messages"`
	Payload      json.RawMessage `json:"payload"`
	Delay        *float64        `json:"delay"`
	SessionID    *string         `json:"session_id"`
	Extra        map[string]any  `json:"extra"`
}

// loadMooncake parses mooncake_trace JSONL. Rows sharing a session_id form one multi-turn session
// whose rows are incremental (new tokens only, live replies accumulate); other rows are standalone
// sessions carrying their whole prefix in hash_ids.
func loadMooncake(file string, r io.Reader, blockSize int) (*Trace, error) {
	if blockSize <= 0 {
		blockSize = MooncakeBlockSize
	}
	tr := &Trace{Source: file, Format: FormatMooncake, BlockSize: blockSize}
	bySession := map[string]*Session{}
	minTS, haveTS := 0.0, false
	firstTS := map[*Session]*float64{}
	err := forEachLine(r, func(line int, raw []byte) error {
		var row mooncakeRow
		if err := strictUnmarshal(raw, &row); err != nil {
			return rowErr(file, line, "invalid JSON: %v", err)
		}
		turn, err := mooncakeTurn(file, line, &row, blockSize)
		if err != nil {
			return err
		}
		if row.Timestamp != nil && (!haveTS || *row.Timestamp < minTS) {
			minTS, haveTS = *row.Timestamp, true
		}
		var s *Session
		if row.SessionID != nil && *row.SessionID != "" {
			s = bySession[*row.SessionID]
			if s == nil {
				s = &Session{ID: *row.SessionID, Mode: ContextDeltas, JoinBefore: -1}
				bySession[*row.SessionID] = s
				tr.Sessions = append(tr.Sessions, s)
				firstTS[s] = row.Timestamp
			}
		} else {
			s = &Session{ID: fmt.Sprintf("row-%d", line), Mode: ContextStandalone, JoinBefore: -1}
			tr.Sessions = append(tr.Sessions, s)
			firstTS[s] = row.Timestamp
		}
		s.Turns = append(s.Turns, turn)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(tr.Sessions) == 0 {
		return nil, fmt.Errorf("%s: no requests", file)
	}
	// aiperf's auto-offset: first turns fire at timestamp - min(timestamp).
	for _, s := range tr.Sessions {
		if ts := firstTS[s]; ts != nil {
			s.Start = msDuration(*ts - minTS)
		} else {
			s.Start = s.Turns[0].Delay
		}
		for i := range s.Turns {
			if s.Turns[i].HasTimestamp {
				s.Turns[i].Timestamp -= msDuration(minTS)
			}
		}
	}
	return tr, nil
}

func mooncakeTurn(file string, line int, row *mooncakeRow, bs int) (Turn, error) {
	t := Turn{Line: line, Extra: row.Extra}
	modes := 0
	if row.InputLength != nil {
		modes++
	}
	if row.TextInput != nil {
		modes++
	}
	if row.Messages != nil {
		modes++
	}
	if row.Payload != nil {
		modes++
	}
	switch {
	case modes == 0:
		return t, rowErr(file, line, "needs one of input_length, text_input, messages, payload")
	case modes > 1:
		return t, rowErr(file, line, "input_length, text_input, messages and payload are mutually exclusive")
	case row.Payload != nil:
		return t, rowErr(file, line, "payload rows are not supported by kvbench")
	case row.HashIDs != nil && row.InputLength == nil:
		return t, rowErr(file, line, "hash_ids are only allowed with input_length")
	}
	if row.InputLength != nil {
		n := *row.InputLength
		if n <= 0 {
			return t, rowErr(file, line, "input_length must be > 0, got %d", n)
		}
		if len(row.HashIDs) > 0 {
			// aiperf: input_length = (len(hash_ids)-1)*bs + last with 0 < last <= bs.
			k := len(row.HashIDs)
			if n <= (k-1)*bs || n > k*bs {
				return t, rowErr(file, line, "input_length %d does not fit %d hash_ids of %d tokens (want %d..%d)",
					n, k, bs, (k-1)*bs+1, k*bs)
			}
		}
		t.InputTokens, t.HashIDs = n, row.HashIDs
	}
	if row.TextInput != nil {
		t.Text = *row.TextInput
	}
	if row.Messages != nil {
		for i, m := range row.Messages {
			if m.Role == "" {
				return t, rowErr(file, line, "messages[%d] has no role", i)
			}
		}
		t.Messages = row.Messages
	}
	if row.OutputLength != nil {
		if *row.OutputLength < 0 {
			return t, rowErr(file, line, "output_length must be >= 0, got %d", *row.OutputLength)
		}
		t.OutputTokens = *row.OutputLength
	}
	if row.Timestamp != nil {
		if *row.Timestamp < 0 {
			return t, rowErr(file, line, "timestamp must be >= 0, got %v", *row.Timestamp)
		}
		t.HasTimestamp, t.Timestamp = true, msDuration(*row.Timestamp)
	}
	if row.Delay != nil {
		if *row.Delay < 0 {
			return t, rowErr(file, line, "delay must be >= 0, got %v", *row.Delay)
		}
		t.Delay = msDuration(*row.Delay)
	}
	return t, nil
}

// strictUnmarshal decodes one JSON value and rejects trailing data on the line.
func strictUnmarshal(raw []byte, v any) error {
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("trailing data after the JSON object")
	}
	return nil
}
