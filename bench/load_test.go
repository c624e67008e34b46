package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// embeddedTraces are the public trace samples under testdata/traces (sources and licences in
// its README).
var embeddedTraces = filepath.Join("..", "testdata", "traces")

// traceWant is what an independent reading of a trace file (jq/python over the JSON) gives.
type traceWant struct {
	format    Format
	blockSize int
	requests  int
	roots     int
	children  []childWant // weka subagents in file order
	lastStart time.Duration
	delays    []time.Duration // first end-to-start gaps of the first root (weka)
}

type childWant struct {
	id               string
	requests         int
	spawnAfter, join int
	spawnDelay       time.Duration
}

var traceWants = map[string]traceWant{
	// Synthetic fan-out (docs/benchmarks/2026-12-05-sibling-hold.md): subagents spawn 0.1 s after
	// the parent turn 0 ends (t 1.0 - 0.9 api_time) and join before its turn 1.
	"fanout-1500.json": {format: FormatWeka, blockSize: 64, requests: 10, roots: 1,
		children: []childWant{
			{"fanout-1500::sa:sub-0", 2, 0, 1, 100 * time.Millisecond},
			{"fanout-1500::sa:sub-1", 2, 0, 1, 100 * time.Millisecond},
			{"fanout-1500::sa:sub-2", 2, 0, 1, 100 * time.Millisecond},
			{"fanout-1500::sa:sub-3", 2, 0, 1, 100 * time.Millisecond},
		}},
	// Real fan-out cut from trace_0277 (testdata/traces/fanout-0277.jq): the three Explore subagents
	// spawn together 60.444 s after the parent turn 0 ends and join before its turns 1, 2 and 4.
	"fanout-0277.json": {format: FormatWeka, blockSize: 64, requests: 40, roots: 1,
		delays: []time.Duration{209220 * time.Millisecond, 7760 * time.Millisecond, 8350 * time.Millisecond},
		children: []childWant{
			{"fanout-0277::sa:agent_001", 4, 0, 1, 60444 * time.Millisecond},
			{"fanout-0277::sa:agent_002", 12, 0, 2, 60444 * time.Millisecond},
			{"fanout-0277::sa:agent_003", 17, 0, 4, 60444 * time.Millisecond},
		}},
	"mooncake_conversation.head200.jsonl": {format: FormatMooncake, blockSize: 512, requests: 200, roots: 200},
	"trace_0022.json": {format: FormatWeka, blockSize: 64, requests: 7, roots: 1,
		delays: []time.Duration{10350 * time.Millisecond, 9200 * time.Millisecond, 7550 * time.Millisecond}},
	"trace_0026.json": {format: FormatWeka, blockSize: 64, requests: 3, roots: 1,
		delays: []time.Duration{47750 * time.Millisecond, 3950 * time.Millisecond}},
	"trace_0277.json": {format: FormatWeka, blockSize: 64, requests: 53, roots: 1,
		delays: []time.Duration{209220 * time.Millisecond, 7760 * time.Millisecond, 8350 * time.Millisecond},
		children: []childWant{
			{"trace_0277::sa:agent_001", 4, 0, 1, 60444 * time.Millisecond},
			{"trace_0277::sa:agent_002", 12, 0, 7, 165126 * time.Millisecond},
			{"trace_0277::sa:agent_003", 17, 0, 7, 192567 * time.Millisecond},
			{"trace_0277::sa:agent_004", 11, 6, -1, 338903 * time.Millisecond},
		}},
	"trace_0291.json": {format: FormatWeka, blockSize: 64, requests: 32, roots: 1,
		delays: []time.Duration{8980 * time.Millisecond, 87690 * time.Millisecond, 4900 * time.Millisecond},
		children: []childWant{
			{"trace_0291::sa:agent_001", 5, 15, 16, 47373 * time.Millisecond},
			{"trace_0291::sa:agent_002", 7, 15, 17, 79913 * time.Millisecond},
		}},
}

func near(a, b time.Duration) bool { return (a - b).Abs() < time.Millisecond }

func checkTrace(t *testing.T, path string, w traceWant) {
	t.Helper()
	tr, err := Load(path, LoadOptions{})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if tr.Format != w.format || tr.BlockSize != w.blockSize {
		t.Errorf("format %s block %d, want %s block %d", tr.Format, tr.BlockSize, w.format, w.blockSize)
	}
	if got := tr.RequestCount(); got != w.requests {
		t.Errorf("requests = %d, want %d", got, w.requests)
	}
	if len(tr.Sessions) != w.roots {
		t.Errorf("root sessions = %d, want %d", len(tr.Sessions), w.roots)
	}
	if w.lastStart > 0 && !near(tr.Sessions[len(tr.Sessions)-1].Start, w.lastStart) {
		t.Errorf("last start = %v, want %v", tr.Sessions[len(tr.Sessions)-1].Start, w.lastStart)
	}
	root := tr.Sessions[0]
	for i, d := range w.delays {
		if got := root.Turns[i+1].Delay; !near(got, d) {
			t.Errorf("turn %d delay = %v, want %v", i+1, got, d)
		}
	}
	if len(root.Children) != len(w.children) {
		t.Fatalf("children = %d, want %d", len(root.Children), len(w.children))
	}
	for i, cw := range w.children {
		c := root.Children[i]
		if c.ID != cw.id || c.ParentID != root.ID || len(c.Turns) != cw.requests ||
			c.SpawnAfter != cw.spawnAfter || c.JoinBefore != cw.join || !near(c.SpawnDelay, cw.spawnDelay) {
			t.Errorf("child %d = {%s parent %s turns %d spawn %d+%v join %d}, want %+v",
				i, c.ID, c.ParentID, len(c.Turns), c.SpawnAfter, c.SpawnDelay, c.JoinBefore, cw)
		}
		if c.Namespace != root.Namespace {
			t.Errorf("child namespace %q, want the parent's %q (hash_id_scope local)", c.Namespace, root.Namespace)
		}
	}
	if w.format == FormatMooncake {
		for _, s := range tr.Sessions {
			if s.Mode != ContextStandalone || len(s.Turns) != 1 || len(s.Turns[0].HashIDs) == 0 {
				t.Fatalf("session %s: raw mooncake rows must be standalone single requests with hash_ids", s.ID)
			}
		}
	}
}

// TestLoadEmbeddedTraces loads every trace file under testdata/traces and checks it against an
// independent reading of it (mooncake_trace and Weka / cc-traces formats, docs/benchmarking.md "Trace formats").
func TestLoadEmbeddedTraces(t *testing.T) {
	seen := 0
	err := filepath.WalkDir(embeddedTraces, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !(strings.HasSuffix(p, ".json") || strings.HasSuffix(p, ".jsonl")) {
			return err
		}
		rel, _ := filepath.Rel(embeddedTraces, p)
		w, ok := traceWants[filepath.ToSlash(rel)]
		if !ok {
			t.Errorf("%s has no expectations in traceWants: add them", rel)
			return nil
		}
		seen++
		t.Run(rel, func(t *testing.T) { checkTrace(t, p, w) })
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen != len(traceWants) {
		t.Errorf("checked %d files, traceWants lists %d", seen, len(traceWants))
	}
}

func TestLoadWekaDirectory(t *testing.T) {
	tr, err := Load(embeddedTraces+"/../traces", LoadOptions{Format: FormatWeka})
	if err == nil {
		t.Fatalf("a directory mixing mooncake and weka files must fail, got %d sessions", len(tr.Sessions))
	}
	dir := t.TempDir()
	for _, n := range []string{"trace_0291.json", "trace_0026.json"} {
		b, err := os.ReadFile(filepath.Join(embeddedTraces, n))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tr, err = Load(dir, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tr.RequestCount() != 35 || len(tr.Sessions) != 2 || tr.Sessions[0].ID != "trace_0026" {
		t.Errorf("dir: %d requests in %d sessions (first %s), want 35 in 2 (trace_0026 first)",
			tr.RequestCount(), len(tr.Sessions), tr.Sessions[0].ID)
	}
	if tr.Sessions[0].Namespace == tr.Sessions[1].Namespace {
		t.Error("different traces must not share a hash namespace (hash_id_scope local)")
	}
}

func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestMooncakeSessions(t *testing.T) {
	p := writeTemp(t, "s.jsonl", `{"session_id":"a","timestamp":1000,"input_length":600,"output_length":5,"hash_ids":[1,2]}
{"session_id":"b","timestamp":1500,"input_length":10,"output_length":5,"hash_ids":[9]}

{"session_id":"a","delay":250,"input_length":100,"output_length":5,"hash_ids":[3]}
{"timestamp":2000,"input_length":512,"hash_ids":[1]}
`)
	tr, err := Load(p, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Sessions) != 3 || tr.RequestCount() != 4 {
		t.Fatalf("%d sessions %d requests, want 3 and 4", len(tr.Sessions), tr.RequestCount())
	}
	a := tr.Sessions[0]
	if a.ID != "a" || a.Mode != ContextDeltas || len(a.Turns) != 2 || a.Turns[1].Delay != 250*time.Millisecond || a.Turns[1].Line != 4 {
		t.Errorf("session a = %+v", a)
	}
	// auto-offset: starts relative to the smallest timestamp
	if a.Start != 0 || tr.Sessions[1].Start != 500*time.Millisecond || tr.Sessions[2].Start != time.Second {
		t.Errorf("starts %v %v %v, want 0 500ms 1s", a.Start, tr.Sessions[1].Start, tr.Sessions[2].Start)
	}
	if tr.Sessions[2].Mode != ContextStandalone {
		t.Error("a row without session_id is a standalone session")
	}
}

func TestInvalidRows(t *testing.T) {
	cases := []struct {
		name, format, content, want string
	}{
		{"mooncake too long", "mooncake", `{"input_length":10,"hash_ids":[1]}` + "\n" + `{"input_length":1100,"hash_ids":[1,2]}`,
			"s.jsonl:2: input_length 1100 does not fit 2 hash_ids of 512 tokens"},
		{"mooncake two inputs", "mooncake", `{"input_length":10,"text_input":"hi"}`, "s.jsonl:1: input_length, text_input"},
		{"mooncake no input", "mooncake", `{"output_length":10}`, "s.jsonl:1: needs one of input_length"},
		{"mooncake hash without length", "mooncake", `{"text_input":"x","hash_ids":[1]}`, "s.jsonl:1: hash_ids are only allowed with input_length"},
		{"mooncake bad json", "mooncake", `{"input_length":10}` + "\n\n" + `{"input_length":`, "s.jsonl:3: invalid JSON"},
		{"mooncake negative", "mooncake", `{"input_length":10,"timestamp":-5}`, "s.jsonl:1: timestamp must be >= 0"},
		{"weka hash count", "weka", `{"id":"x","block_size":64,"requests":[{"t":0,"type":"n","in":200,"out":1,"hash_ids":[1,2]}]}`,
			"s.jsonl:1: requests[0]: 2 hash_ids for in=200, want in/64 = 3"},
		{"weka unknown type", "weka", "\n" + `{"id":"x","requests":[{"t":0,"type":"q"}]}`, "s.jsonl:2: requests[0]: unknown type \"q\""},
		{"weka subagent inner", "weka", `{"id":"x","requests":[{"t":0,"type":"n","in":64,"out":1,"hash_ids":[1]},{"t":1,"type":"subagent","agent_id":"a","requests":[{"t":0,"type":"n","in":1,"out":1,"hash_ids":[1]}]}]}`,
			"requests[1].requests[0]: 1 hash_ids for in=1"},
		{"multi_turn empty", "multi_turn", `{"session_id":"s","turns":[]}`, "s.jsonl:1: turns is empty"},
		{"multi_turn image", "multi_turn", `{"turns":[{"text":"a"},{"image":"x.png"}]}`, "s.jsonl:1: turns[1]: image inputs are not supported"},
		{"single_turn both timings", "single_turn", `{"text":"a","timestamp":1,"delay":2}`, "s.jsonl:1: timestamp and delay are mutually exclusive"},
		{"single_turn zero output", "single_turn", `{"text":"a","output_length":0}`, "s.jsonl:1: output_length must be > 0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := writeTemp(t, "s.jsonl", c.content)
			f, _ := ParseFormat(c.format)
			_, err := Load(p, LoadOptions{Format: f})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want it to contain %q", err, c.want)
			}
		})
	}
}

func TestDetectFormat(t *testing.T) {
	cases := []struct {
		content string
		want    Format
	}{
		{`{"timestamp":0,"input_length":5,"output_length":1,"hash_ids":[1]}`, FormatMooncake},
		{`{"text_input":"hi"}`, FormatMooncake},
		{`{"session_id":"a","turns":[{"text":"hi"}]}`, FormatMultiTurn},
		{`{"text":"hi","output_length":3}`, FormatSingleTurn},
		{`{"texts":["hi"]}`, FormatSingleTurn},
		{"{\n  \"id\": \"t\",\n  \"requests\": [{\"t\":0,\"type\":\"n\",\"in\":1,\"out\":1,\"hash_ids\":[]}]\n}", FormatWeka},
	}
	for _, c := range cases {
		tr, err := Load(writeTemp(t, "d.jsonl", c.content), LoadOptions{})
		if err != nil {
			t.Errorf("%s: %v", c.content, err)
			continue
		}
		if tr.Format != c.want {
			t.Errorf("%s: detected %s, want %s", c.content, tr.Format, c.want)
		}
	}
	if _, err := Load(writeTemp(t, "d.jsonl", `{"foo":1}`), LoadOptions{}); err == nil || !strings.Contains(err.Error(), "pass --format") {
		t.Errorf("unknown keys: %v", err)
	}
}

func TestAiperfTextFormats(t *testing.T) {
	mt := writeTemp(t, "m.jsonl", `{"session_id":"s1","turns":[{"text":"hello","timestamp":100},{"texts":["a",{"name":"q","contents":["b","c"]}],"delay":50,"output_length":7}]}
{"turns":[{"text":"x","timestamp":40,"extra":{"temperature":0}}]}`)
	tr, err := Load(mt, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := tr.Sessions[0]
	if s.Mode != ContextDeltas || len(s.Turns) != 2 || s.Turns[1].Text != "a\nb\nc" || s.Turns[1].OutputTokens != 7 ||
		s.Turns[1].Delay != 50*time.Millisecond || s.Start != 60*time.Millisecond || tr.Sessions[1].Start != 0 {
		t.Errorf("multi_turn session = %+v (second start %v)", s, tr.Sessions[1].Start)
	}
	if tr.Sessions[1].Turns[0].Extra["temperature"] != 0.0 {
		t.Errorf("extra not kept: %v", tr.Sessions[1].Turns[0].Extra)
	}
	st := writeTemp(t, "s.jsonl", `{"text":"a","session_id":"u"}
{"text":"b"}
{"text":"c","session_id":"u","role":"system"}`)
	tr, err = Load(st, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Sessions) != 2 || len(tr.Sessions[0].Turns) != 2 || tr.Sessions[0].Mode != ContextStandalone || tr.Sessions[0].Turns[1].Role != "system" {
		t.Errorf("single_turn grouping wrong: %d sessions", len(tr.Sessions))
	}
}

func TestRepeat(t *testing.T) {
	tr, err := Load(filepath.Join(embeddedTraces, "trace_0291.json"), LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := tr.Repeat(3, 2*time.Second)
	if r.RequestCount() != 3*tr.RequestCount() || len(r.Sessions) != 3 {
		t.Fatalf("%d requests in %d roots", r.RequestCount(), len(r.Sessions))
	}
	c := r.Sessions[2]
	if c.ID != "trace_0291#2" || c.Start != 4*time.Second || c.Namespace == tr.Sessions[0].Namespace ||
		c.Children[0].ParentID != c.ID || c.Children[0].Namespace != c.Namespace || tr.Sessions[0].Children[0].ParentID != "trace_0291" {
		t.Errorf("copy 2 = %s start %v ns %q child parent %s", c.ID, c.Start, c.Namespace, c.Children[0].ParentID)
	}
}

// TestRepeatFrom: copies numbered from first never share ids or namespaces with copies of
// another range, and the first of them starts on time.
func TestRepeatFrom(t *testing.T) {
	tr, err := Load(filepath.Join(embeddedTraces, "trace_0291.json"), LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	light, heavy := tr.RepeatFrom(0, 1, time.Second), tr.RepeatFrom(1, 3, time.Second)
	if light != tr {
		t.Error("copy 0 alone is the trace itself")
	}
	if len(heavy.Sessions) != 3 {
		t.Fatalf("%d roots, want 3", len(heavy.Sessions))
	}
	for k, s := range heavy.Sessions {
		wantID := fmt.Sprintf("trace_0291#%d", k+1)
		if s.ID != wantID || s.Start != time.Duration(k)*time.Second || s.Namespace == tr.Sessions[0].Namespace {
			t.Errorf("copy %d = %s start %v ns %q; want %s at %v in its own namespace", k, s.ID, s.Start, s.Namespace, wantID, time.Duration(k)*time.Second)
		}
	}
	if one := tr.RepeatFrom(4, 1, 0); len(one.Sessions) != 1 || one.Sessions[0].ID != "trace_0291#4" {
		t.Errorf("one copy from 4: %d roots, first %s", len(one.Sessions), one.Sessions[0].ID)
	}
}
