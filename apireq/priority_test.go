package apireq

import (
	"encoding/json"
	"errors"
	"net/http"
	"testing"
)

// TestSetVLLMPriority: the gateway's value is written (replacing every occurrence, or added
// first); a client's own priority survives only when it is larger (later); a client priority
// that is not an integer is a 400 and leaves the body alone.
func TestSetVLLMPriority(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		floor    int64
		want     int64
		wantBody string
		wantErr  bool
	}{
		{"added", `{"model":"m"}`, -3, -3, `{"priority":-3,"model":"m"}`, false},
		{"added to empty object", `{ }`, 0, 0, `{"priority":0 }`, false},
		{"client earlier is capped", `{"priority":-50,"model":"m"}`, -2, -2, `{"priority":-2,"model":"m"}`, false},
		{"client later is kept", `{"model":"m","priority": 7}`, -2, 7, `{"model":"m","priority": 7}`, false},
		{"client integral float", `{"priority":4.0}`, 0, 4, `{"priority":4}`, false},
		{"duplicate keys all replaced", `{"priority":9,"x":{"priority":-9},"priority":-99}`, 1, 9, `{"priority":9,"x":{"priority":-9},"priority":9}`, false},
		{"null is absent", `{"priority":null}`, 5, 5, `{"priority":5}`, false},
		{"fraction refused", `{"priority":1.5}`, 0, 0, `{"priority":1.5}`, true},
		{"string word refused", `{"priority":"high"}`, 0, 0, `{"priority":"high"}`, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := &Request{Body: []byte(tc.body)}
			got, err := r.SetVLLMPriority(tc.floor)
			if tc.wantErr {
				var e *Error
				if !errors.As(err, &e) || e.Status != http.StatusBadRequest || e.Param != "priority" {
					t.Fatalf("err %v, want a 400 on priority", err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if got != tc.want || string(r.Body) != tc.wantBody {
				t.Errorf("got %d %s, want %d %s", got, r.Body, tc.want, tc.wantBody)
			}
			if !json.Valid(r.Body) {
				t.Errorf("body %s is not JSON", r.Body)
			}
		})
	}
}
