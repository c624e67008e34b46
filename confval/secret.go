package confval

import (
	"net/url"
	"reflect"
	"regexp"
	"strings"
)

// SecretTag is the struct tag that marks a config field holding a secret: `secret:"true"` on
// a string or []string field (an API key, a token, a password). Masked hides those values;
// SecretLikeUntagged finds fields whose YAML name sounds secret but carry no tag, so a new
// secret field cannot go unmasked silently (configs' tests run it over the whole Config).
const SecretTag = "secret"

// Mask is what a secret value is printed as.
const Mask = "********"

// Masked returns a copy of v (a config struct) whose secret-tagged fields are Mask (empty ones
// stay empty, so "not set" still shows) and whose string values that are URLs carrying
// credentials (nats://user:pass@host, several comma-separated included) have their user
// information masked. v itself is not changed: slices, maps and pointers on the way are
// copied before anything in them is masked.
func Masked[T any](v T) T {
	rv := reflect.ValueOf(&v).Elem()
	maskValue(rv, false)
	return v
}

// maskValue masks rv in place; rv is settable and owned by the copy (shared backing arrays,
// maps and pointees are replaced by copies first).
func maskValue(rv reflect.Value, secret bool) {
	switch rv.Kind() {
	case reflect.String:
		switch s := rv.String(); {
		case secret && s != "":
			rv.SetString(Mask)
		case strings.Contains(s, "://"):
			rv.SetString(maskURLs(s))
		}
	case reflect.Struct:
		t := rv.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			maskValue(rv.Field(i), secret || f.Tag.Get(SecretTag) == "true")
		}
	case reflect.Slice:
		if rv.IsNil() {
			return
		}
		cp := reflect.MakeSlice(rv.Type(), rv.Len(), rv.Len())
		reflect.Copy(cp, rv)
		for i := range cp.Len() {
			maskValue(cp.Index(i), secret)
		}
		rv.Set(cp)
	case reflect.Array:
		for i := range rv.Len() {
			maskValue(rv.Index(i), secret)
		}
	case reflect.Pointer:
		if rv.IsNil() {
			return
		}
		cp := reflect.New(rv.Type().Elem())
		cp.Elem().Set(rv.Elem())
		maskValue(cp.Elem(), secret)
		rv.Set(cp)
	case reflect.Map:
		if rv.IsNil() {
			return
		}
		cp := reflect.MakeMapWithSize(rv.Type(), rv.Len())
		iter := rv.MapRange()
		for iter.Next() {
			val := reflect.New(rv.Type().Elem()).Elem()
			val.Set(iter.Value())
			maskValue(val, secret)
			cp.SetMapIndex(iter.Key(), val)
		}
		rv.Set(cp)
	case reflect.Interface:
		if rv.IsNil() {
			return
		}
		val := reflect.New(rv.Elem().Type()).Elem()
		val.Set(rv.Elem())
		maskValue(val, secret)
		rv.Set(val)
	}
}

// maskURLs masks the user information of every comma-separated URL in s that has any.
func maskURLs(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil || u.User == nil {
			continue
		}
		u.User = nil
		str := u.String()
		if scheme, rest, ok := strings.Cut(str, "://"); ok {
			parts[i] = scheme + "://" + Mask + "@" + rest
		}
	}
	return strings.Join(parts, ",")
}

// secretLike matches YAML names that sound like they hold a secret.
var secretLike = regexp.MustCompile(`(^|_)(key|keys|token|password|passwords|passwd|secret|secrets|credential|credentials|creds)($|_)`)

// pathLike matches YAML names of a file or folder: the path is not the secret (the file's
// content is, and is never printed).
var pathLike = regexp.MustCompile(`_(file|dir|path)$`)

// SecretLikeUntagged walks the struct type t and returns the YAML key paths ("auth.api_keys",
// "workers[].api_key") of fields whose name sounds secret, are not a file path, and carry no
// `secret:"true"` tag. allow lists paths known not to be secrets.
func SecretLikeUntagged(t reflect.Type, allow map[string]bool) []string {
	var out []string
	walkFields(t, "", func(path, name string, f reflect.StructField) {
		if f.Tag.Get(SecretTag) == "true" || allow[path] || pathLike.MatchString(name) {
			return
		}
		if secretLike.MatchString(name) {
			out = append(out, path)
		}
	}, map[reflect.Type]bool{})
	return out
}

// SecretPaths returns the YAML key paths of every secret-tagged field under t.
func SecretPaths(t reflect.Type) []string {
	var out []string
	walkFields(t, "", func(path, _ string, f reflect.StructField) {
		if f.Tag.Get(SecretTag) == "true" {
			out = append(out, path)
		}
	}, map[reflect.Type]bool{})
	return out
}

// walkFields calls fn for every exported field under t with its YAML key path; inline
// structs add no path element, slice and map elements add "[]".
func walkFields(t reflect.Type, prefix string, fn func(path, name string, f reflect.StructField), seen map[reflect.Type]bool) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map {
		if t.Kind() != reflect.Pointer {
			prefix += "[]"
		}
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || seen[t] {
		return
	}
	seen[t] = true
	defer delete(seen, t)
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if strings.Contains(opts, "inline") {
			walkFields(f.Type, prefix, fn, seen)
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		fn(path, name, f)
		walkFields(f.Type, path, fn, seen)
	}
}
