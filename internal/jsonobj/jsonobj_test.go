package jsonobj

import (
	"encoding/json"
	"testing"
)

func TestWriter(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fields [][2]string
		want   string
	}{
		{"empty", nil, `{}`},
		{"one", [][2]string{{"a", `1`}}, `{"a":1}`},
		{"order kept, raw values verbatim", [][2]string{{"z", `{"y": 2}`}, {"a", `[1, "<b>"]`}, {"m", `null`}},
			`{"z":{"y": 2},"a":[1, "<b>"],"m":null}`},
		{"keys escaped", [][2]string{{`q"uote`, `true`}, {"é\n", `"x"`}}, `{"q\"uote":true,"é\n":"x"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w Writer
			for _, f := range tc.fields {
				w.Raw(f[0], []byte(f[1]))
			}
			got := w.Bytes()
			if string(got) != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
			if !json.Valid(got) {
				t.Fatalf("%s is not valid JSON", got)
			}
		})
	}
}
