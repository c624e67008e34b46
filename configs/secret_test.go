package configs

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/kvgate/kvgate/confval"
)

// notSecret are keys whose names sound secret but hold none (each with why).
var notSecret = map[string]bool{
	"auth.keys":                           true, // the list of entries; each entry's key is tagged
	"cluster.nats_creds":                  true, // the path of a NATS credentials file, not its content
	"kv_events.curve_client_keys":         true, // the publishers' CURVE public keys
	"router.latency.prefill_ms_per_token": true, // a per-token time
	"router.latency.step_ms_per_kv_token": true, // a per-token time
	// The same keys in a models: entry's router overrides.
	"models[].router.latency.prefill_ms_per_token": true,
	"models[].router.latency.step_ms_per_kv_token": true,
}

// Every key whose name sounds like a secret (key, token, password, secret, credentials, seed;
// not a *_file path) carries `secret:"true"`, so `kvgate serve --check-config` masks it: a
// new secret key fails here until it is tagged (or listed in notSecret with the reason).
func TestSecretKeysTagged(t *testing.T) {
	if untagged := confval.SecretLikeUntagged(reflect.TypeFor[Config](), notSecret); len(untagged) > 0 {
		t.Errorf("keys that sound secret without secret:\"true\" (tag them, or list them in notSecret): %v", untagged)
	}
	tagged := confval.SecretPaths(reflect.TypeFor[Config]())
	for _, want := range []string{"admin_token", "workers[].api_key", "auth.api_keys", "auth.worker_api_key", "auth.keys[].key",
		"cluster.nats_password", "cluster.nats_token", "cluster.embedded_nats.token", "cluster.embedded_nats.users[].password"} {
		if !slices.Contains(tagged, want) {
			t.Errorf("%s is not tagged secret (tagged: %v)", want, tagged)
		}
	}
}

// fillStrings sets every string under v to "val-<key path>" (one element in every slice and
// map), so a test can see which values survive masking.
func fillStrings(v reflect.Value, path string) {
	switch v.Kind() {
	case reflect.String:
		v.SetString("val-" + path)
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if !f.IsExported() {
				continue
			}
			name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			p := path
			if !strings.Contains(opts, "inline") {
				p = strings.TrimPrefix(path+"."+name, ".")
			}
			fillStrings(v.Field(i), p)
		}
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fillStrings(s.Index(0), path+"[]")
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fillStrings(k, path+"{key}")
		fillStrings(e, path+"[]")
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fillStrings(p.Elem(), path)
		v.Set(p)
	}
}

// Masked hides every tagged value and only those, in the YAML --check-config prints, without
// touching the config it was given; URLs lose their credentials.
func TestMaskedConfig(t *testing.T) {
	c := Default()
	fillStrings(reflect.ValueOf(&c).Elem(), "")
	c.Cluster.NATSURL = "nats://kv:hunter2@nats-0:4222,nats://s3cr3t-token@nats-1:4222,nats://nats-2:4222"
	orig := yaml2(t, c)

	masked := Masked(c)
	out := yaml2(t, masked)
	if got := yaml2(t, c); got != orig {
		t.Fatal("Masked changed the config it was given")
	}
	secrets := confval.SecretPaths(reflect.TypeFor[Config]())
	for _, p := range secrets {
		if strings.Contains(out, "val-"+p+"\n") || strings.Contains(out, "val-"+p+"[]\n") {
			t.Errorf("%s is printed unmasked", p)
		}
	}
	if n := strings.Count(out, confval.Mask); n < len(secrets) {
		t.Errorf("%d masked values, want at least the %d secret keys", n, len(secrets))
	}
	for _, keep := range []string{"val-model", "val-workers[].url", "val-auth.api_keys_file", "val-cluster.nats_user", "val-cluster.embedded_nats.users[].user"} {
		if !strings.Contains(out, keep) {
			t.Errorf("%s was masked though it is no secret", keep)
		}
	}
	for _, leak := range []string{"hunter2", "s3cr3t-token"} {
		if strings.Contains(out, leak) {
			t.Errorf("the NATS URL's credentials %q are printed", leak)
		}
	}
	if want := "nats://" + confval.Mask + "@nats-0:4222"; !strings.Contains(out, want) {
		t.Errorf("nats_url printed without %q:\n%s", want, out)
	}
}

func yaml2(t *testing.T, c Config) string {
	t.Helper()
	b, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
