package configref

import (
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/confval"
)

// Section is one table of the reference: the keys directly under one YAML path.
type Section struct {
	Path string // "" for the top level; "router.latency"; "workers[]" for a list's entries
	Doc  string // the doc comment of the section's Go type
	Type reflect.Type
	Keys []Key
}

// Key is one YAML key.
type Key struct {
	Path    string // full YAML path: "router.latency.step_ms", "workers[].url"
	Type    string // what it holds, in words: "duration", "list of strings", "section"
	Default string // its value in configs.Default(), formatted as YAML would take it; "" for a list entry's key
	Doc     string // the field's doc comment, its Go name replaced by the key
	Flag    string // "--router-seed", "" for file-only keys
	Env     string // "KVGATE_ROUTER_SEED", "" for file-only keys
	Section string // the path of the section documenting its keys (sections and lists of entries)
	Owner   string // the doc table's key of the field: "import/path.Type.Field"
}

var (
	durationType   = reflect.TypeOf(confval.Duration(0))
	goDurationType = reflect.TypeOf(time.Duration(0))
	byteSizeType   = reflect.TypeOf(confval.ByteSize(0))
)

// Types returns every struct type the configuration is made of (configs.Config, its sections,
// list entries and inline parts): the types whose doc comments fielddocs_gen.go must hold.
func Types() []reflect.Type {
	w := newWalker()
	def := configs.Default()
	w.section("", reflect.TypeOf(def), reflect.ValueOf(def))
	out := make([]reflect.Type, 0, len(w.types))
	for t := range w.types {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return typeKey(out[i]) < typeKey(out[j]) })
	return out
}

// Build walks configs.Config from configs.Default() and returns its sections, the top level
// first, each followed by the sections of its keys in order. A struct type met again (the
// router: of a models: entry) is not repeated: its key points at the first section.
func Build() []Section {
	w := newWalker()
	def := configs.Default()
	w.section("", reflect.TypeOf(def), reflect.ValueOf(def))
	return w.out
}

func newWalker() *walker {
	flags := map[string]configs.Field{}
	for _, f := range configs.Fields() {
		flags[f.Key] = f
	}
	return &walker{docs: fieldDocs(), flags: flags, seen: map[reflect.Type]string{}, types: map[reflect.Type]bool{}}
}

type walker struct {
	docs  map[string]string
	flags map[string]configs.Field
	seen  map[reflect.Type]string
	types map[reflect.Type]bool // every struct type met, inline ones included
	out   []Section
}

type pending struct {
	path string
	t    reflect.Type
	v    reflect.Value
}

func (w *walker) section(path string, t reflect.Type, v reflect.Value) {
	w.seen[t] = path
	i := len(w.out)
	w.out = append(w.out, Section{Path: path, Type: t, Doc: w.docs[typeKey(t)]})
	var children []pending
	w.fields(i, path, t, v, &children)
	for _, c := range children {
		w.section(c.path, c.t, c.v)
	}
}

// fields adds t's keys to section i; inline structs contribute their fields to the same section.
func (w *walker) fields(i int, path string, t reflect.Type, v reflect.Value, children *[]pending) {
	w.types[t] = true
	for n := 0; n < t.NumField(); n++ {
		f := t.Field(n)
		if !f.IsExported() {
			continue
		}
		name, inline := yamlName(f)
		if name == "-" {
			continue
		}
		var fv reflect.Value
		if v.IsValid() {
			fv = v.Field(n)
		}
		if inline {
			w.fields(i, path, f.Type, fv, children)
			continue
		}
		k := Key{Path: join(path, name), Owner: typeKey(t) + "." + f.Name}
		k.Doc = keyDoc(w.docs[k.Owner], f.Name, name)
		if fl, ok := w.flags[k.Path]; ok {
			k.Flag, k.Env = "--"+fl.Flag, fl.Env
		}
		ft := f.Type
		switch {
		case ft.Kind() == reflect.Struct:
			k.Type = "section"
			if p, ok := w.seen[ft]; ok {
				k.Section = p
			} else {
				k.Section = k.Path
				w.seen[ft] = k.Path
				*children = append(*children, pending{k.Path, ft, fv})
			}
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			k.Type = "list of entries"
			if fv.IsValid() {
				k.Default = formatValue(fv)
			}
			if p, ok := w.seen[ft.Elem()]; ok {
				k.Section = p
			} else {
				k.Section = k.Path + "[]"
				w.seen[ft.Elem()] = k.Section
				*children = append(*children, pending{k.Section, ft.Elem(), reflect.Value{}})
			}
		default:
			k.Type = typeName(ft)
			if fv.IsValid() {
				k.Default = formatValue(fv)
			}
		}
		w.out[i].Keys = append(w.out[i].Keys, k)
	}
}

func yamlName(f reflect.StructField) (name string, inline bool) {
	tag := f.Tag.Get("yaml")
	name, opts, _ := strings.Cut(tag, ",")
	if strings.Contains(","+opts+",", ",inline,") {
		return "", true
	}
	if name == "" {
		name = strings.ToLower(f.Name)
	}
	return name, false
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func typeKey(t reflect.Type) string { return t.PkgPath() + "." + t.Name() }

// keyDoc is a field's comment with its leading Go name ("AdminListen is ...") replaced by
// the YAML key, as the reference names it.
func keyDoc(doc, goName, key string) string {
	rest, ok := strings.CutPrefix(doc, goName)
	if !ok || rest != "" && (unicode.IsLetter(rune(rest[0])) || unicode.IsDigit(rune(rest[0]))) {
		return doc
	}
	return "`" + key + "`" + rest
}

func typeName(t reflect.Type) string {
	switch t {
	case durationType, goDurationType:
		return "duration"
	case byteSizeType:
		return "byte size"
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Slice:
		return "list of " + typeName(t.Elem()) + "s"
	case reflect.Map:
		return "map of " + typeName(t.Key()) + " to " + typeName(t.Elem())
	case reflect.Pointer:
		return typeName(t.Elem()) + " (optional)"
	}
	return t.String()
}

// formatValue renders a default as one would write it in the YAML file.
func formatValue(v reflect.Value) string {
	switch v.Type() {
	case durationType, goDurationType:
		return formatDuration(time.Duration(v.Int()))
	case byteSizeType:
		return formatBytes(v.Int())
	}
	switch v.Kind() {
	case reflect.String:
		return strconv.Quote(v.String())
	case reflect.Bool:
		return strconv.FormatBool(v.Bool())
	case reflect.Int, reflect.Int32, reflect.Int64:
		return strconv.FormatInt(v.Int(), 10)
	case reflect.Uint, reflect.Uint32, reflect.Uint64:
		return strconv.FormatUint(v.Uint(), 10)
	case reflect.Float32, reflect.Float64:
		return strconv.FormatFloat(v.Float(), 'g', -1, 64)
	case reflect.Slice:
		parts := make([]string, v.Len())
		for i := range parts {
			parts[i] = formatValue(v.Index(i))
			if v.Index(i).Kind() == reflect.String {
				parts[i] = v.Index(i).String()
			}
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case reflect.Map:
		keys := v.MapKeys()
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = formatValue(k) + ": " + formatValue(v.MapIndex(k))
		}
		sort.Strings(parts)
		return "{" + strings.Join(parts, ", ") + "}"
	case reflect.Pointer:
		if v.IsNil() {
			return "unset"
		}
		return formatValue(v.Elem())
	}
	return fmt.Sprint(v.Interface())
}

// formatDuration drops the zero units time.Duration prints ("5m0s" is "5m", "24h0m0s" "24h").
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// formatBytes uses the largest binary unit that divides the size (confval.ByteSize reads it back).
func formatBytes(n int64) string {
	for _, u := range []struct {
		suffix string
		size   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

// Module is the Go module the config types live in (their folders are under its root).
const Module = "github.com/kvgate/kvgate"
