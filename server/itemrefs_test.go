package server

import (
	"testing"
)

// TestItemIndexBounded: the item index keeps the most recently used items up to its bound,
// re-pointing an item seen again; a zero bound keeps nothing.
func TestItemIndexBounded(t *testing.T) {
	x := newItemIndex(3)
	x.put("resp_1", []string{"msg_a", "rs_a"})
	x.put("resp_2", []string{"msg_b"})
	if r, ok := x.get("msg_a"); !ok || r != "resp_1" {
		t.Fatalf("msg_a → %q %v", r, ok)
	}
	x.put("resp_3", []string{"msg_c"}) // evicts rs_a, the least recently used
	if _, ok := x.get("rs_a"); ok {
		t.Error("rs_a kept past the bound")
	}
	for item, want := range map[string]string{"msg_a": "resp_1", "msg_b": "resp_2", "msg_c": "resp_3"} {
		if r, ok := x.get(item); !ok || r != want {
			t.Errorf("%s → %q %v, want %s", item, r, ok, want)
		}
	}
	x.put("resp_4", []string{"msg_a"})
	if r, _ := x.get("msg_a"); r != "resp_4" {
		t.Errorf("msg_a → %q after it was seen in resp_4", r)
	}
	none := newItemIndex(0)
	none.put("resp_1", []string{"msg_a"})
	if _, ok := none.get("msg_a"); ok {
		t.Error("a zero-bound index kept an item")
	}
}

// TestFieldsRoundTrip: splitting a body into its top-level fields and joining them back keeps
// every field's bytes and order.
func TestFieldsRoundTrip(t *testing.T) {
	for _, body := range []string{
		`{"model":"m","input":[{"type":"item_reference","id":"x"}],"n":1.50,"s":"\u00e9"}`,
		`{}`,
		`{"z":{"a":[1,2,{"b":null}]},"a":true}`,
	} {
		f, err := topLevelFields([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if got := string(joinFields(f)); got != body {
			t.Errorf("round trip\n got %s\nwant %s", got, body)
		}
	}
	if _, err := topLevelFields([]byte(`[1]`)); err == nil {
		t.Error("an array was split as an object")
	}
}
