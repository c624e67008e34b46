package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
)

// WekaBlockSize is the block size of the Weka / cc-traces agentic format.
const WekaBlockSize = 64

// wekaTrace is one Weka / cc-traces agentic trace (schema: aiperf
// src/aiperf/dataset/loader/weka_trace_models.py, from callanjfox/kv-cache-tester
// docs/trace_replay_tester.md).
type wekaTrace struct {
	ID           string        `json:"id"`
	Models       []string      `json:"models"`
	BlockSize    *int          `json:"block_size"`
	HashIDScope  string        `json:"hash_id_scope"`
	ToolTokens   int           `json:"tool_tokens"`
	SystemTokens int           `json:"system_tokens"`
	Requests     []wekaRequest `json:"requests"`
}

// wekaRequest is a normal ("n"), streaming ("s") or subagent request of a Weka trace.
type wekaRequest struct {
	T       *float64 `json:"t"`
	Type    string   `json:"type"`
	Model   string   `json:"model"`
	In      *int     `json:"in"`
	Out     *int     `json:"out"`
	HashIDs []int64  `json:"hash_ids"`
	APITime *float64 `json:"api_time"`

	// subagent fields
	AgentID      string        `json:"agent_id"`
	SubagentType string        `json:"subagent_type"`
	DurationMS   *float64      `json:"duration_ms"`
	ToolTokens   int           `json:"tool_tokens"`
	SystemTokens int           `json:"system_tokens"`
	Requests     []wekaRequest `json:"requests"`
}

// loadWeka parses one file holding a Weka trace object, or JSONL with one trace per line.
// Every trace becomes a root session named by the trace id; subagents become child sessions.
func loadWeka(file string, r io.Reader) (*Trace, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	tr := &Trace{Source: file, Format: FormatWeka}
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		off := dec.InputOffset()
		var wt wekaTrace
		if err := dec.Decode(&wt); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, rowErr(file, lineAt(data, off), "invalid JSON: %v", err)
		}
		line := lineAt(data, off)
		s, bs, err := buildWeka(file, line, &wt)
		if err != nil {
			return nil, err
		}
		if tr.BlockSize != 0 && tr.BlockSize != bs {
			return nil, rowErr(file, line, "block_size %d differs from an earlier trace's %d", bs, tr.BlockSize)
		}
		tr.BlockSize = bs
		tr.Sessions = append(tr.Sessions, s)
	}
	if len(tr.Sessions) == 0 {
		return nil, fmt.Errorf("%s: no traces", file)
	}
	return tr, nil
}

// lineAt is the 1-based line of the first non-space byte at or after off.
func lineAt(data []byte, off int64) int {
	i := int(off)
	for i < len(data) && (data[i] == ' ' || data[i] == '\n' || data[i] == '\r' || data[i] == '\t') {
		i++
	}
	return bytes.Count(data[:min(i, len(data))], []byte{'\n'}) + 1
}

func buildWeka(file string, line int, wt *wekaTrace) (*Session, int, error) {
	if wt.ID == "" {
		return nil, 0, rowErr(file, line, "trace has no id")
	}
	bs := WekaBlockSize
	if wt.BlockSize != nil {
		bs = *wt.BlockSize
	}
	if bs <= 0 {
		return nil, 0, rowErr(file, line, "block_size must be > 0")
	}
	ns := wt.ID // hash_id_scope "local": ids are per trace (parent and subagents share it)
	switch wt.HashIDScope {
	case "", "local":
	case "global":
		ns = ""
	default:
		return nil, 0, rowErr(file, line, "unknown hash_id_scope %q", wt.HashIDScope)
	}
	b := wekaBuilder{file: file, line: line, bs: bs, ns: ns}
	s, err := b.session(wt.ID, "", wt.ToolTokens+wt.SystemTokens, wt.Requests, 0, "requests")
	if err != nil {
		return nil, 0, err
	}
	s.Start = 0
	return s, bs, nil
}

type wekaBuilder struct {
	file string
	line int
	bs   int
	ns   string
}

// recorded keeps a turn's absolute recorded time for spawn/join placement.
type recorded struct{ t, end float64 }

// session builds one conversation from its request list. base is added to the request times when
// they are relative (old files record subagent requests relative to the spawn).
func (b *wekaBuilder) session(id, parent string, sysTokens int, reqs []wekaRequest, base float64, path string) (*Session, error) {
	s := &Session{ID: id, ParentID: parent, Namespace: b.ns, Mode: ContextWeka, SystemTokens: sysTokens, JoinBefore: -1}
	var times []recorded
	type marker struct {
		idx int
		req *wekaRequest
	}
	var markers []marker
	prevEnd := math.NaN()
	for i := range reqs {
		r := &reqs[i]
		where := fmt.Sprintf("%s[%d]", path, i)
		if r.T == nil || *r.T < 0 || math.IsNaN(*r.T) {
			return nil, rowErr(b.file, b.line, "%s: t must be a number >= 0", where)
		}
		switch r.Type {
		case "subagent":
			markers = append(markers, marker{i, r})
			continue
		case "n", "s":
		default:
			return nil, rowErr(b.file, b.line, "%s: unknown type %q", where, r.Type)
		}
		if r.In == nil || *r.In <= 0 {
			return nil, rowErr(b.file, b.line, "%s: in must be > 0", where)
		}
		if r.Out == nil || *r.Out < 0 {
			return nil, rowErr(b.file, b.line, "%s: out must be >= 0", where)
		}
		// hash_ids cover full blocks only; the partial tail has no id.
		if want := *r.In / b.bs; len(r.HashIDs) != want {
			return nil, rowErr(b.file, b.line, "%s: %d hash_ids for in=%d, want in/%d = %d",
				where, len(r.HashIDs), *r.In, b.bs, want)
		}
		t := base + *r.T
		api := 0.0
		if r.APITime != nil && *r.APITime > 0 {
			api = *r.APITime
		}
		// max_tokens = out, with 0 sent as 1 (aiperf).
		turn := Turn{Line: b.line, InputTokens: *r.In, HashIDs: r.HashIDs, OutputTokens: max(*r.Out, 1),
			Model: r.Model, APITime: secDuration(api)}
		if !math.IsNaN(prevEnd) {
			// end-to-start idle gap, floored at 0 (aiperf's default weka timing).
			turn.Delay = secDuration(max(0, t-prevEnd))
		}
		prevEnd = t + api
		s.Turns = append(s.Turns, turn)
		times = append(times, recorded{t: t, end: t + api})
	}
	if len(s.Turns) == 0 {
		return nil, rowErr(b.file, b.line, "%s: session %s has no requests", path, id)
	}
	for _, m := range markers {
		r := m.req
		where := fmt.Sprintf("%s[%d]", path, m.idx)
		if r.AgentID == "" {
			return nil, rowErr(b.file, b.line, "%s: subagent has no agent_id", where)
		}
		spawn := base + *r.T
		// SPAWN on the last parent turn that started at or before the marker; none => dropped.
		anchor := -1
		for i, tm := range times {
			if tm.t <= spawn {
				anchor = i
			}
		}
		if anchor < 0 || len(r.Requests) == 0 {
			continue
		}
		childBase := 0.0
		if r.Requests[0].T != nil && *r.Requests[0].T < spawn {
			childBase = spawn // relative inner times
		}
		child, err := b.session(id+"::sa:"+r.AgentID, id, r.ToolTokens+r.SystemTokens, r.Requests, childBase, where+".requests")
		if err != nil {
			return nil, err
		}
		child.SpawnAfter = anchor
		child.SpawnDelay = secDuration(max(0, spawn-times[anchor].end))
		end := spawn
		if r.DurationMS != nil && *r.DurationMS > 0 {
			end = spawn + *r.DurationMS/1000
		} else {
			for _, ct := range recordedEnds(childBase, r.Requests) {
				end = max(end, ct)
			}
		}
		// JOIN on the first later parent turn starting after the subagent ended; else background.
		child.JoinBefore = -1
		for i := anchor + 1; i < len(times); i++ {
			if times[i].t >= end {
				child.JoinBefore = i
				break
			}
		}
		s.Children = append(s.Children, child)
	}
	return s, nil
}

// recordedEnds lists t+api_time of a child's requests in absolute recorded seconds.
func recordedEnds(base float64, reqs []wekaRequest) []float64 {
	var out []float64
	for _, r := range reqs {
		if r.Type == "subagent" || r.T == nil {
			continue
		}
		e := base + *r.T
		if r.APITime != nil {
			e += *r.APITime
		}
		out = append(out, e)
	}
	return out
}
