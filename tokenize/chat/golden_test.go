package chat

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// goldenHeader is the first line of testdata/chat/<model>.jsonl (scripts/goldens/gen-chat.py).
type goldenHeader struct {
	TemplateFile  string `json:"template_file"`
	ModelDir      string `json:"model_dir"`
	ContentFormat string `json:"content_format"`
	Now           string `json:"now"`
}

type goldenRecord struct {
	Request json.RawMessage `json:"request"`
	Prompt  *string         `json:"prompt"`
	Error   string          `json:"error"`
}

const repoRoot = "../.."

// jinjaTestdata is where templates the npm packages do not ship come from (see gen-chat.py).
func jinjaTestdata(t *testing.T) string {
	cache := os.Getenv("GOMODCACHE")
	if cache == "" {
		out, err := exec.Command("go", "env", "GOMODCACHE").Output()
		if err != nil {
			t.Skipf("go env GOMODCACHE: %v", err)
		}
		cache = strings.TrimSpace(string(out))
	}
	return filepath.Join(cache, "github.com/ardanlabs/jinja@v1.8.0/testdata/templates")
}

// loadGoldenTemplate compiles the template a golden file was generated with.
func loadGoldenTemplate(t *testing.T, h goldenHeader) *Template {
	t.Helper()
	dir := filepath.Join(repoRoot, "models", h.ModelDir)
	if _, err := os.Stat(filepath.Join(dir, "tokenizer_config.json")); err != nil {
		t.Skipf("model files missing (run scripts/fetch-tokenizers.sh): %v", err)
	}
	cfg, err := LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	src := cfg.Template
	if h.TemplateFile != "" {
		b, err := os.ReadFile(filepath.Join(jinjaTestdata(t), h.TemplateFile))
		if err != nil {
			t.Skipf("template %s not in the module cache: %v", h.TemplateFile, err)
		}
		src = string(b)
	}
	now, err := time.Parse("2006-01-02T15:04:05", h.Now)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := NewTemplate(src, TemplateOptions{Config: cfg, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(tmpl.ContentFormat()); got != h.ContentFormat {
		t.Errorf("content format %q, vLLM detection in the generator gave %q", got, h.ContentFormat)
	}
	return tmpl
}

func readGolden(t *testing.T, path string) (goldenHeader, []goldenRecord) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	var h goldenHeader
	var recs []goldenRecord
	for sc.Scan() {
		if h.ModelDir == "" {
			if err := json.Unmarshal(sc.Bytes(), &h); err != nil {
				t.Fatal(err)
			}
			continue
		}
		var r goldenRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return h, recs
}

// TestGoldenPrompts renders every golden request (>= 300 per template) and requires the prompt
// Python Jinja2 produced with HF's settings after vLLM's preprocessing, byte for byte; requests
// that failed in Python must fail here too.
func TestGoldenPrompts(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(repoRoot, "testdata/chat/*.jsonl"))
	if len(files) == 0 {
		t.Fatal("no golden files under testdata/chat (run scripts/goldens/gen-chat.py)")
	}
	for _, path := range files {
		if strings.HasSuffix(path, ".ids.jsonl") {
			continue // token-id goldens, checked in package tokenize
		}
		name := strings.TrimSuffix(filepath.Base(path), ".jsonl")
		t.Run(name, func(t *testing.T) {
			h, recs := readGolden(t, path)
			tmpl := loadGoldenTemplate(t, h)
			if len(recs) < 300 {
				t.Errorf("only %d golden requests, want >= 300", len(recs))
			}
			mismatches := 0
			for i, r := range recs {
				got, err := renderBody(tmpl, r.Request)
				// Rendering again is served from the message cache and must not change anything.
				if again, err2 := renderBody(tmpl, r.Request); again != got || (err == nil) != (err2 == nil) {
					t.Errorf("#%d: second render (message cache) differs", i)
				}
				switch {
				case r.Prompt == nil && err == nil:
					mismatches++
					t.Errorf("#%d: Python failed (%s), Go rendered without error", i, r.Error)
				case r.Prompt != nil && err != nil:
					mismatches++
					t.Errorf("#%d: Go failed: %v", i, err)
				case r.Prompt != nil && got != *r.Prompt:
					mismatches++
					t.Errorf("#%d: prompt differs at byte %d:\n got: %q\nwant: %q", i, diffAt(got, *r.Prompt), around(got, diffAt(got, *r.Prompt)), around(*r.Prompt, diffAt(got, *r.Prompt)))
				}
				if mismatches > 5 {
					t.Fatalf("stopping after %d mismatches", mismatches)
				}
			}
		})
	}
}

func renderBody(tmpl *Template, body json.RawMessage) (string, error) {
	cb, err := ParseChatBody(body)
	if err != nil {
		return "", err
	}
	out, err := tmpl.Render(&cb.Request)
	var te *TemplateError
	var re *RequestError
	if err != nil && !errors.As(err, &te) && !errors.As(err, &re) {
		return "", errors.New("untyped error: " + err.Error())
	}
	return out, err
}

func diffAt(a, b string) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

func around(s string, i int) string {
	lo, hi := max(0, i-60), min(len(s), i+60)
	return s[lo:hi]
}
