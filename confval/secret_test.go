package confval

import (
	"reflect"
	"slices"
	"testing"
)

type maskInner struct {
	Name     string `yaml:"name"`
	Password string `yaml:"password" secret:"true"`
}

type maskOuter struct {
	Key      string               `yaml:"key" secret:"true"`
	Empty    string               `yaml:"empty_key" secret:"true"`
	Keys     []string             `yaml:"keys" secret:"true"`
	Users    []maskInner          `yaml:"users"`
	ByName   map[string]maskInner `yaml:"by_name"`
	Ptr      *maskInner           `yaml:"ptr"`
	Any      any                  `yaml:"any"`
	URL      string               `yaml:"url"`
	KeyFile  string               `yaml:"key_file"`
	APIToken string               `yaml:"api_token"` // untagged on purpose
	Inline   struct {
		Secret string `yaml:"secret"` // untagged on purpose
	} `yaml:",inline"`
}

// Masked masks tagged values wherever they sit (slices, maps, pointers, interfaces), leaves
// empty ones empty, strips URL credentials, and never writes through to the original.
func TestMasked(t *testing.T) {
	in := maskOuter{Key: "k1", Keys: []string{"a", "b"}, Users: []maskInner{{"u", "p"}},
		ByName: map[string]maskInner{"x": {"u", "p"}}, Ptr: &maskInner{"u", "p"}, Any: maskInner{"u", "p"},
		URL: "nats://user:pw@h:4222, nats://h2:4222", KeyFile: "/etc/k", APIToken: "t"}
	out := Masked(in)
	cases := []struct {
		name      string
		got, want any
	}{
		{"tagged string", out.Key, Mask},
		{"empty stays empty", out.Empty, ""},
		{"tagged list", out.Keys, []string{Mask, Mask}},
		{"slice of structs", out.Users, []maskInner{{"u", Mask}}},
		{"map of structs", out.ByName, map[string]maskInner{"x": {"u", Mask}}},
		{"pointer", *out.Ptr, maskInner{"u", Mask}},
		{"interface", out.Any, maskInner{"u", Mask}},
		{"URLs lose their credentials", out.URL, "nats://" + Mask + "@h:4222, nats://h2:4222"},
		{"a path is no secret", out.KeyFile, "/etc/k"},
		{"original list", in.Keys, []string{"a", "b"}},
		{"original slice", in.Users, []maskInner{{"u", "p"}}},
		{"original map", in.ByName, map[string]maskInner{"x": {"u", "p"}}},
		{"original pointer", *in.Ptr, maskInner{"u", "p"}},
	}
	for _, tc := range cases {
		if !reflect.DeepEqual(tc.got, tc.want) {
			t.Errorf("%s: %#v, want %#v", tc.name, tc.got, tc.want)
		}
	}
	untagged := SecretLikeUntagged(reflect.TypeFor[maskOuter](), nil)
	if want := []string{"api_token", "secret"}; !slices.Equal(untagged, want) {
		t.Errorf("untagged secret-like keys %v, want %v", untagged, want)
	}
	tagged := SecretPaths(reflect.TypeFor[maskOuter]())
	want := []string{"key", "empty_key", "keys", "users[].password", "by_name[].password", "ptr.password"}
	if !slices.Equal(tagged, want) {
		t.Errorf("tagged %v, want %v", tagged, want)
	}
}
