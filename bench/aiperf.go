package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

// singleTurnRow is aiperf's single_turn entry, also the element of a multi_turn row's turns.
type singleTurnRow struct {
	Text         *string           `json:"text"`
	Texts        []json.RawMessage `json:"texts"`
	Image        json.RawMessage   `json:"image"`
	Images       json.RawMessage   `json:"images"`
	Audio        json.RawMessage   `json:"audio"`
	Audios       json.RawMessage   `json:"audios"`
	Video        json.RawMessage   `json:"video"`
	Videos       json.RawMessage   `json:"videos"`
	Timestamp    *float64          `json:"timestamp"`
	Delay        *float64          `json:"delay"`
	Role         string            `json:"role"`
	SessionID    *string           `json:"session_id"`
	OutputLength *int              `json:"output_length"`
	MaxTokens    *int              `json:"max_tokens"`
	Extra        map[string]any    `json:"extra"`
}

// multiTurnRow is aiperf's multi_turn entry: one conversation whose history accumulates.
type multiTurnRow struct {
	SessionID *string         `json:"session_id"`
	Turns     []singleTurnRow `json:"turns"`
}

// textTurn validates one single_turn object; where names the row part for errors.
func textTurn(file string, line int, where string, row *singleTurnRow) (Turn, error) {
	t := Turn{Line: line, Role: row.Role, Extra: row.Extra}
	for name, v := range map[string]json.RawMessage{"image": row.Image, "images": row.Images,
		"audio": row.Audio, "audios": row.Audios, "video": row.Video, "videos": row.Videos} {
		if v != nil {
			return t, rowErr(file, line, "%s%s inputs are not supported by kvbench (text only)", where, name)
		}
	}
	switch {
	case row.Text != nil && row.Texts != nil:
		return t, rowErr(file, line, "%stext and texts are mutually exclusive", where)
	case row.Text != nil:
		t.Text = *row.Text
	case row.Texts != nil:
		parts := make([]string, 0, len(row.Texts))
		for i, raw := range row.Texts {
			s, err := textPart(raw)
			if err != nil {
				return t, rowErr(file, line, "%stexts[%d]: %v", where, i, err)
			}
			parts = append(parts, s)
		}
		t.Text = strings.Join(parts, "\n")
	default:
		return t, rowErr(file, line, "%sneeds text or texts", where)
	}
	if strings.TrimSpace(t.Text) == "" {
		return t, rowErr(file, line, "%stext is empty", where)
	}
	if row.Timestamp != nil && row.Delay != nil {
		return t, rowErr(file, line, "%stimestamp and delay are mutually exclusive", where)
	}
	if row.Timestamp != nil {
		if *row.Timestamp < 0 {
			return t, rowErr(file, line, "%stimestamp must be >= 0", where)
		}
		t.HasTimestamp, t.Timestamp = true, msDuration(*row.Timestamp)
	}
	if row.Delay != nil {
		if *row.Delay < 0 {
			return t, rowErr(file, line, "%sdelay must be >= 0", where)
		}
		t.Delay = msDuration(*row.Delay)
	}
	out := row.OutputLength
	if out == nil {
		out = row.MaxTokens
	}
	if out != nil {
		if *out <= 0 {
			return t, rowErr(file, line, "%soutput_length must be > 0, got %d", where, *out)
		}
		t.OutputTokens = *out
	}
	return t, nil
}

// textPart accepts a texts element as a string or aiperf's {"name", "contents": [...]} object.
func textPart(raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var obj struct {
		Contents []string `json:"contents"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Contents == nil {
		return "", fmt.Errorf("want a string or {\"contents\": [strings]}")
	}
	return strings.Join(obj.Contents, "\n"), nil
}

// loadSingleTurn parses aiperf single_turn JSONL: rows sharing a session_id are sent in order but
// carry no history; other rows are one-request sessions.
func loadSingleTurn(file string, r io.Reader) (*Trace, error) {
	tr := &Trace{Source: file, Format: FormatSingleTurn}
	bySession := map[string]*Session{}
	err := forEachLine(r, func(line int, raw []byte) error {
		var row singleTurnRow
		if err := strictUnmarshal(raw, &row); err != nil {
			return rowErr(file, line, "invalid JSON: %v", err)
		}
		t, err := textTurn(file, line, "", &row)
		if err != nil {
			return err
		}
		var s *Session
		if row.SessionID != nil && *row.SessionID != "" {
			s = bySession[*row.SessionID]
			if s == nil {
				s = &Session{ID: *row.SessionID, Mode: ContextStandalone, JoinBefore: -1}
				bySession[*row.SessionID] = s
				tr.Sessions = append(tr.Sessions, s)
			}
		} else {
			s = &Session{ID: fmt.Sprintf("row-%d", line), Mode: ContextStandalone, JoinBefore: -1}
			tr.Sessions = append(tr.Sessions, s)
		}
		s.Turns = append(s.Turns, t)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return finishTextTrace(file, tr)
}

// loadMultiTurn parses aiperf multi_turn JSONL: one conversation per row, live replies accumulate.
func loadMultiTurn(file string, r io.Reader) (*Trace, error) {
	tr := &Trace{Source: file, Format: FormatMultiTurn}
	err := forEachLine(r, func(line int, raw []byte) error {
		var row multiTurnRow
		if err := strictUnmarshal(raw, &row); err != nil {
			return rowErr(file, line, "invalid JSON: %v", err)
		}
		if len(row.Turns) == 0 {
			return rowErr(file, line, "turns is empty")
		}
		id := fmt.Sprintf("row-%d", line)
		if row.SessionID != nil && *row.SessionID != "" {
			id = *row.SessionID
		}
		s := &Session{ID: id, Mode: ContextDeltas, JoinBefore: -1}
		for i := range row.Turns {
			t, err := textTurn(file, line, fmt.Sprintf("turns[%d]: ", i), &row.Turns[i])
			if err != nil {
				return err
			}
			s.Turns = append(s.Turns, t)
		}
		tr.Sessions = append(tr.Sessions, s)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return finishTextTrace(file, tr)
}

// finishTextTrace applies the timestamp auto-offset to session starts.
func finishTextTrace(file string, tr *Trace) (*Trace, error) {
	if len(tr.Sessions) == 0 {
		return nil, fmt.Errorf("%s: no requests", file)
	}
	var minTS *time.Duration
	for _, s := range tr.Sessions {
		for _, t := range s.Turns {
			if t.HasTimestamp && (minTS == nil || t.Timestamp < *minTS) {
				v := t.Timestamp
				minTS = &v
			}
		}
	}
	for _, s := range tr.Sessions {
		for i := range s.Turns {
			if minTS != nil && s.Turns[i].HasTimestamp {
				s.Turns[i].Timestamp -= *minTS
			}
		}
		if s.Turns[0].HasTimestamp {
			s.Start = s.Turns[0].Timestamp
		} else {
			s.Start = s.Turns[0].Delay
		}
	}
	return tr, nil
}
