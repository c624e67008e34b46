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
	spans, err := topLevelValues(r.Body, "cache_salt")
	if err != nil {
		return err
	}
	var out []byte
	if len(spans) == 0 {
		open := bytes.IndexByte(r.Body, '{')
		if open < 0 {
			return errors.New("cache_salt: body is not a JSON object")
		}
		sep := []byte(",")
		if bytes.TrimSpace(r.Body[open+1:])[0] == '}' {
			sep = nil
		}
		out = make([]byte, 0, len(r.Body)+len(quoted)+16)
		out = append(out, r.Body[:open+1]...)
		out = append(out, `"cache_salt":`...)
		out = append(out, quoted...)
		out = append(out, sep...)
		out = append(out, r.Body[open+1:]...)
	} else {
		out = make([]byte, 0, len(r.Body)+len(quoted))
		last := 0
		for _, s := range spans {
			out = append(out, r.Body[last:s[0]]...)
			out = append(out, quoted...)
			last = s[1]
		}
		out = append(out, r.Body[last:]...)
	}
	r.Body, r.CacheSalt = out, salt
	return nil
}

// topLevelValues returns the byte spans [start, end) of the values of every top-level key name
// of the JSON object body.
func topLevelValues(body []byte, name string) ([][2]int, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("cache_salt: body is not a JSON object")
	}
	var spans [][2]int
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("cache_salt: %w", err)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("cache_salt: %w", err)
		}
		if k, _ := tok.(string); k == name {
			end := int(dec.InputOffset())
			spans = append(spans, [2]int{end - len(v), end})
		}
	}
	if _, err := dec.Token(); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("cache_salt: %w", err)
	}
	return spans, nil
}
