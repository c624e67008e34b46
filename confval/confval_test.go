package confval

import (
	"errors"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

func TestPrefix(t *testing.T) {
	var two Problems
	two.Addf("a", "bad %d", 1)
	two.Addf("b.c", "bad %s", "x")
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"nil stays nil", nil, ""},
		{"single error", errors.New("ttl: must be positive"), "router.ttl: must be positive"},
		{"every joined problem", two.Err(), "router.a: bad 1\nrouter.b.c: bad x"},
		{"nested joins flatten", errors.Join(two.Err(), errors.New("d: bad")), "router.a: bad 1\nrouter.b.c: bad x\nrouter.d: bad"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Prefix("router.", tc.err)
			if (got == nil) != (tc.want == "") || (got != nil && got.Error() != tc.want) {
				t.Fatalf("Prefix = %v, want %q", got, tc.want)
			}
		})
	}
	if (&Problems{}).Err() != nil {
		t.Error("no problems must be a nil error")
	}
}

// YAML, flags and env read the same text: "0" is a valid duration (unlike time.Duration's own
// YAML decoding, which rejects a bare 0), a bare number of bytes is a valid size.
func TestValuesFromYAML(t *testing.T) {
	cases := []struct {
		doc     string
		wantD   time.Duration
		wantB   ByteSize
		wantErr bool
	}{
		{"d: 0\nb: 0", 0, 0, false},
		{"d: 90s\nb: 32MiB", 90 * time.Second, 32 << 20, false},
		{"d: 5\nb: 1", 0, 0, true},
		{"d: 1s\nb: -1", 0, 0, true},
		{"d: [1s]\nb: 1", 0, 0, true},
	}
	for _, tc := range cases {
		var v struct {
			D Duration `yaml:"d"`
			B ByteSize `yaml:"b"`
		}
		err := yaml.Unmarshal([]byte(tc.doc), &v)
		if (err != nil) != tc.wantErr {
			t.Errorf("%q: err %v, want error %v", tc.doc, err, tc.wantErr)
			continue
		}
		if err == nil && (v.D.D() != tc.wantD || v.B != tc.wantB) {
			t.Errorf("%q: got %v %v, want %v %v", tc.doc, v.D, v.B, tc.wantD, tc.wantB)
		}
	}
}
