package configref

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/kvgate/kvgate/configs"
)

// TestReferenceCurrent fails when docs/configuration.md is not what `kvgate config reference`
// prints for the code as it is.
func TestReferenceCurrent(t *testing.T) {
	got, err := os.ReadFile(filepath.Join("..", "..", "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != Markdown() {
		t.Errorf("docs/configuration.md differs from the config types: %s", regenerate)
	}
}

// exampleValues are the keys configs/kvgate.yaml sets to an example rather than the default
// (their defaults are empty: a gateway needs a model and workers).
var exampleValues = map[string]bool{"model": true, "tokenizer": true, "workers": true, "admin_listen": true}

// TestExampleFileComplete checks configs/kvgate.yaml the way docs/configuration.md is checked:
// every key of the reference appears in it, either set or in a commented-out example (a list
// of entries such as models:), and every key set outside a list holds its default, except
// the few example values above.
func TestExampleFileComplete(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "kvgate.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	present, err := examplePaths(string(data))
	if err != nil {
		t.Fatal(err)
	}
	var fromFile configs.Config
	if err := configs.ParseYAML(data, &fromFile); err != nil {
		t.Fatalf("configs/kvgate.yaml does not parse: %v", err)
	}
	def := configs.Default()
	for _, s := range Build() {
		for _, k := range s.Keys {
			if !present[k.Path] {
				t.Errorf("configs/kvgate.yaml lacks %s: add it with its default (%s) and a comment", k.Path, k.Default)
				continue
			}
			if k.Section != "" || strings.Contains(k.Path, "[]") || exampleValues[k.Path] {
				continue
			}
			got, want := valueAt(reflect.ValueOf(fromFile), k.Path), valueAt(reflect.ValueOf(def), k.Path)
			if got != want {
				t.Errorf("configs/kvgate.yaml sets %s to %s, the default is %s", k.Path, got, want)
			}
		}
	}
}

// valueAt formats the value at a YAML path of a config struct.
func valueAt(v reflect.Value, path string) string {
	for _, name := range strings.Split(path, ".") {
		v = fieldByYAML(v, name)
		if !v.IsValid() {
			return "<no such key>"
		}
	}
	return formatValue(v)
}

func fieldByYAML(v reflect.Value, name string) reflect.Value {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		n, inline := yamlName(f)
		if inline {
			if got := fieldByYAML(v.Field(i), name); got.IsValid() {
				return got
			}
			continue
		}
		if n == name {
			return v.Field(i)
		}
	}
	return reflect.Value{}
}

var commentedKey = regexp.MustCompile(`^\s*#( ?)(\s*)(- )?[a-z_]+:(\s|$)`)

// examplePaths returns the key paths a YAML file sets ("router.latency.step_ms", list entries'
// keys as "workers[].url") and those of its commented-out examples: a run of comment lines
// from one that starts with a key, which parses as YAML once the '#' is dropped, is read as
// if set under the key whose block the comment is in.
func examplePaths(text string) (map[string]bool, error) {
	out := map[string]bool{}
	var root yaml.Node
	if err := yaml.Unmarshal([]byte(text), &root); err != nil {
		return nil, err
	}
	collectPaths(&root, "", out)

	lines := strings.Split(text, "\n")
	type frame struct {
		indent int
		path   string
	}
	var stack []frame
	activeKey := regexp.MustCompile(`^(\s*)(- )?([a-z_]+):`)
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if m := activeKey.FindStringSubmatch(l); m != nil && !strings.HasPrefix(strings.TrimSpace(l), "#") {
			indent := len(m[1]) + len(m[2])
			for len(stack) > 0 && stack[len(stack)-1].indent >= indent {
				stack = stack[:len(stack)-1]
			}
			parent := ""
			if len(stack) > 0 {
				parent = stack[len(stack)-1].path
			}
			if m[2] != "" {
				parent += "[]"
			}
			stack = append(stack, frame{indent, join(parent, m[3])})
			continue
		}
		if !commentedKey.MatchString(l) {
			continue
		}
		col := strings.Index(l, "#")
		end := i
		for end < len(lines) && strings.HasPrefix(strings.TrimLeft(lines[end], " "), "#") && strings.Index(lines[end], "#") == col {
			end++
		}
		var block []string
		for _, c := range lines[i:end] {
			c = c[col+1:]
			c = strings.TrimPrefix(c, " ")
			block = append(block, c)
		}
		var n yaml.Node
		if yaml.Unmarshal([]byte(strings.Join(block, "\n")), &n) != nil {
			continue
		}
		for len(stack) > 0 && stack[len(stack)-1].indent >= col {
			stack = stack[:len(stack)-1]
		}
		parent := ""
		if len(stack) > 0 {
			parent = stack[len(stack)-1].path
		}
		collectPaths(&n, parent, out)
		i = end - 1
	}
	return out, nil
}

func collectPaths(n *yaml.Node, path string, out map[string]bool) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			collectPaths(c, path, out)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			p := join(path, n.Content[i].Value)
			out[p] = true
			collectPaths(n.Content[i+1], p, out)
		}
	case yaml.SequenceNode:
		for _, c := range n.Content {
			collectPaths(c, path+"[]", out)
		}
	}
}

func TestExamplePaths(t *testing.T) {
	text := `listen: x
router:
  policy: auto
  # A comment: with a colon, not an example.
  # hold:
  #   enabled: true
  latency:
    step_ms: 1
workers:
  - url: u
    topic: ""
# Several models: prose first.
# models:
#   - name: m
#     router:
#       policy: kv
keys: []
`
	got, err := examplePaths(text)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"listen", "router.policy", "router.hold", "router.hold.enabled", "router.latency.step_ms",
		"workers[].url", "workers[].topic", "models", "models[].name", "models[].router.policy", "keys"} {
		if !got[p] {
			t.Errorf("%s not found in %v", p, got)
		}
	}
	for _, p := range []string{"router.a comment", "hold", "policy", "models[].policy"} {
		if got[p] {
			t.Errorf("%s found, but the file has no such key", p)
		}
	}
}

// TestHandTablesAgree: the explanatory key tables in docs/routing.md and docs/sessions.md
// (which say what each knob trades) must show the defaults the code has.
func TestHandTablesAgree(t *testing.T) {
	defaults := map[string]string{}
	for _, s := range Build() {
		for _, k := range s.Keys {
			defaults[k.Path] = normalizeDefault(k.Default)
		}
	}
	for file, prefix := range map[string]string{"routing.md": "router.", "sessions.md": "sessions."} {
		data, err := os.ReadFile(filepath.Join("..", "..", "docs", file))
		if err != nil {
			t.Fatal(err)
		}
		col := -1
		checked := 0
		for _, line := range strings.Split(string(data), "\n") {
			if !strings.HasPrefix(line, "|") {
				col = -1
				continue
			}
			cells := strings.Split(strings.Trim(line, "|"), "|")
			if col < 0 {
				for i, c := range cells {
					if strings.TrimSpace(c) == "default" {
						col = i
					}
				}
				continue
			}
			key := strings.Trim(strings.TrimSpace(cells[0]), "`")
			want, ok := defaults[prefix+key]
			if !ok || col >= len(cells) {
				continue
			}
			checked++
			if got := normalizeDefault(cells[col]); got != want {
				t.Errorf("docs/%s: %s%s shows default %q, the code has %q", file, prefix, key, got, want)
			}
		}
		if checked < 5 {
			t.Errorf("docs/%s: only %d keys with a default column found; has the table moved?", file, checked)
		}
	}
}

func normalizeDefault(s string) string {
	s = strings.TrimSpace(s)
	s = strings.Trim(s, "`")
	s = strings.Trim(s, `"`)
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	return s
}
