package apireq

import (
	"encoding/json"
	"testing"
)

// SetCacheSalt replaces every top-level cache_salt (a duplicate key must not win over the
// gateway's salt: Python's json keeps the last), adds one when absent, leaves nested keys and
// the rest of the body alone, and the result is what the enricher hashes.
func TestSetCacheSalt(t *testing.T) {
	tests := []struct {
		name, body, want string
	}{
		{"absent", `{"model":"m","prompt":"hi"}`, `{"cache_salt":"S","model":"m","prompt":"hi"}`},
		{"empty object", ` { } `, ` {"cache_salt":"S" } `},
		{"replaced", `{"model":"m", "cache_salt" : "mine", "prompt":"hi"}`, `{"model":"m", "cache_salt" : "S", "prompt":"hi"}`},
		{"null", `{"cache_salt":null,"prompt":"hi"}`, `{"cache_salt":"S","prompt":"hi"}`},
		{"duplicates", `{"cache_salt":"a","prompt":"x","cache_salt":"b"}`, `{"cache_salt":"S","prompt":"x","cache_salt":"S"}`},
		{"escaped key", `{"cache\u005fsalt":"a","prompt":"x"}`, `{"cache\u005fsalt":"S","prompt":"x"}`},
		{"nested untouched", `{"metadata":{"cache_salt":"n"},"prompt":"x"}`, `{"cache_salt":"S","metadata":{"cache_salt":"n"},"prompt":"x"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := &Request{Body: []byte(tc.body)}
			if err := r.SetCacheSalt("S"); err != nil {
				t.Fatal(err)
			}
			if string(r.Body) != tc.want {
				t.Errorf("body %s, want %s", r.Body, tc.want)
			}
			if !json.Valid(r.Body) || r.CacheSalt != "S" {
				t.Errorf("valid %v, CacheSalt %q", json.Valid(r.Body), r.CacheSalt)
			}
		})
	}
	if err := (&Request{Body: []byte(`[1]`)}).SetCacheSalt("S"); err == nil {
		t.Error("an array body took a salt")
	}
}
