package apireq

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// SetCacheSalt makes salt the request's cache_salt: CacheSalt (what the enricher hashes block 0
// with) and the body forwarded to the worker, whose top-level "cache_salt" value is replaced
// (every occurrence, so no duplicate key can win over it) or, absent, added first. The rest of
// the body is forwarded byte for byte.
func (r *Request) SetCacheSalt(salt string) error {
	quoted, err := json.Marshal(salt)
	if err != nil {
		return fmt.Errorf("cache_salt: %w", err)
	}
	out, err := setTopLevel(r.Body, "cache_salt", quoted)
	if err != nil {
		return err
	}
	r.Body, r.CacheSalt = out, salt
	return nil
}

// setTopLevel returns body with the value of every top-level key name replaced by value, or,
// when the key is absent, with "name":value added first. The rest is kept byte for byte.
func setTopLevel(body []byte, name string, value []byte) ([]byte, error) {
	spans, err := topLevelValues(body, name)
	if err != nil {
		return nil, err
	}
	var out []byte
	if len(spans) == 0 {
		open := bytes.IndexByte(body, '{')
		if open < 0 {
			return nil, fmt.Errorf("%s: body is not a JSON object", name)
		}
		sep := []byte(",")
		if bytes.TrimSpace(body[open+1:])[0] == '}' {
			sep = nil
		}
		out = make([]byte, 0, len(body)+len(name)+len(value)+4)
		out = append(out, body[:open+1]...)
		out = append(out, '"')
		out = append(out, name...)
		out = append(out, '"', ':')
		out = append(out, value...)
		out = append(out, sep...)
		out = append(out, body[open+1:]...)
		return out, nil
	}
	out = make([]byte, 0, len(body)+len(value))
	last := 0
	for _, s := range spans {
		out = append(out, body[last:s[0]]...)
		out = append(out, value...)
		last = s[1]
	}
	return append(out, body[last:]...), nil
}

// topLevelValues returns the byte spans [start, end) of the values of every top-level key name
// of the JSON object body.
func topLevelValues(body []byte, name string) ([][2]int, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("%s: body is not a JSON object", name)
	}
	var spans [][2]int
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if k, _ := tok.(string); k == name {
			end := int(dec.InputOffset())
			spans = append(spans, [2]int{end - len(v), end})
		}
	}
	if _, err := dec.Token(); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return spans, nil
}
