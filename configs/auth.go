package configs

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"github.com/kvgate/kvgate/flowcontrol"
	"io"
	"net"
	"os"
	"regexp"
	"strings"
)

// maxKeysFileBytes bounds auth.api_keys_file.
const maxKeysFileBytes = 4 << 20

// ClientAPIKeys returns the client keys' secrets, in ClientKeys' order. None means the client
// listener is open.
func (c *Config) ClientAPIKeys() ([]string, error) {
	entries, err := c.ClientKeys()
	if err != nil {
		return nil, err
	}
	out := make([]string, len(entries))
	for i, e := range entries {
		out[i] = e.Key
	}
	return out, nil
}

// ClientKeys returns every client key as an entry: auth.keys, then auth.api_keys, then the
// keys of auth.api_keys_file, without duplicate secrets (the first entry of a secret wins). A
// plain key gets DerivedKeyName and no cache group. The file is read on every call; an
// unreadable file, or one that holds no key, is an error (a configured but empty file must never
// turn authentication off).
func (c *Config) ClientKeys() ([]ClientKey, error) {
	seen := map[string]bool{}
	var out []ClientKey
	add := func(k ClientKey) {
		if seen[k.Key] {
			return
		}
		seen[k.Key] = true
		if k.Name == "" {
			k.Name = DerivedKeyName(k.Key)
		}
		out = append(out, k)
	}
	for _, k := range c.Auth.Keys {
		add(k)
	}
	for _, k := range c.Auth.APIKeys {
		add(ClientKey{Key: k})
	}
	if c.Auth.APIKeysFile == "" {
		return out, nil
	}
	keys, err := readKeysFile(c.Auth.APIKeysFile)
	if err != nil {
		return nil, err
	}
	for _, k := range keys {
		add(ClientKey{Key: k})
	}
	return out, nil
}

// DerivedKeyName is the name of a client key configured without one: "key-" and the first 8 hex
// digits of SHA-256 over a fixed prefix and the key. It tells keys apart in logs and /debug
// views without revealing them (guessing a key from 32 bits of its hash is no easier than
// guessing the key).
func DerivedKeyName(key string) string {
	h := sha256.Sum256([]byte("kvgate key name v1\x00" + key))
	return "key-" + hex.EncodeToString(h[:4])
}

// keyNamePattern is what auth.keys[].name and cache_group may hold: they appear in logs,
// metrics-free /debug views and the Responses pin keys (router.pinKey separates with a NUL).
var keyNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// minSaltSecretBytes is the shortest auth.cache_salt_secret_file accepted.
const minSaltSecretBytes = 32

// CacheSaltSecret reads auth.cache_salt_secret_file (surrounding whitespace trimmed): the
// secret cache groups' salts are derived from. "" is no secret (nil).
func (c *Config) CacheSaltSecret() ([]byte, error) {
	path := c.Auth.CacheSaltSecretFile
	if path == "" {
		return nil, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("auth.cache_salt_secret_file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("auth.cache_salt_secret_file: %w", err)
	}
	data = bytes.TrimSpace(data)
	if len(data) < minSaltSecretBytes {
		return nil, fmt.Errorf("auth.cache_salt_secret_file: %s holds %d bytes; at least %d are needed (e.g. head -c 32 /dev/urandom | base64)", path, len(data), minSaltSecretBytes)
	}
	return data, nil
}

// usesCacheGroups reports whether any auth.keys entry names a cache group.
func (c *Config) usesCacheGroups() bool {
	for _, k := range c.Auth.Keys {
		if k.CacheGroup != "" {
			return true
		}
	}
	return false
}

func readKeysFile(path string) ([]string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("auth.api_keys_file: %w", err)
	}
	if st.Size() > maxKeysFileBytes {
		return nil, fmt.Errorf("auth.api_keys_file: %s is larger than %d bytes", path, maxKeysFileBytes)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth.api_keys_file: %w", err)
	}
	var keys []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), maxKeysFileBytes)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if msg := checkSecret(line); msg != "" {
			return nil, fmt.Errorf("auth.api_keys_file: %s line %d: the key %s", path, n, msg)
		}
		keys = append(keys, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("auth.api_keys_file: %s: %w", path, err)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("auth.api_keys_file: %s holds no key (authentication would be off)", path)
	}
	return keys, nil
}

// checkSecret returns why s cannot be sent as a bearer token ("" when it can).
func checkSecret(s string) string {
	if s == "" {
		return "is empty"
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f {
			return "contains whitespace or a control character"
		}
	}
	return ""
}

// validateAuth checks the admin listener, client keys and worker keys.
func (c *Config) validateAuth(bad func(key, format string, args ...any)) {
	if c.AdminListen != "" {
		if _, port, err := net.SplitHostPort(c.AdminListen); err != nil || port == "" {
			bad("admin_listen", "%q is not host:port", c.AdminListen)
		} else if c.AdminListen == c.Listen {
			bad("admin_listen", "%q is the client listener's address; the admin listener needs its own", c.AdminListen)
		}
	}
	if c.AdminToken != "" {
		if msg := checkSecret(c.AdminToken); msg != "" {
			bad("admin_token", "%s", msg)
		}
		if c.AdminListen == "" {
			bad("admin_token", "is set but admin_listen is not (the token protects the admin listener)")
		}
	}
	for i, k := range c.Auth.APIKeys {
		if msg := checkSecret(k); msg != "" {
			bad(fmt.Sprintf("auth.api_keys[%d]", i), "%s", msg)
		}
	}
	if c.Auth.APIKeysFile != "" {
		if _, err := readKeysFile(c.Auth.APIKeysFile); err != nil {
			errs := strings.TrimPrefix(err.Error(), "auth.api_keys_file: ")
			bad("auth.api_keys_file", "%s", errs)
		}
	}
	names := map[string]int{}
	for i, k := range c.Auth.Keys {
		at := fmt.Sprintf("auth.keys[%d]", i)
		if msg := checkSecret(k.Key); msg != "" {
			bad(at+".key", "%s", msg)
		}
		if k.Name != "" {
			if !keyNamePattern.MatchString(k.Name) {
				bad(at+".name", "%q must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit", k.Name)
			} else if j, dup := names[k.Name]; dup {
				bad(at+".name", "%q is also the name of auth.keys[%d]", k.Name, j)
			}
			names[k.Name] = i
		}
		for _, f := range []struct {
			name string
			v    int
		}{{"requests_per_minute", k.RequestsPerMinute}, {"tokens_per_minute", k.TokensPerMinute}, {"max_concurrent", k.MaxConcurrent}, {"burst", k.Burst}} {
			if f.v < 0 {
				bad(at+"."+f.name, "must be 0 (no limit) or positive, got %d", f.v)
			}
		}
		if k.Burst > 0 && k.RequestsPerMinute == 0 && k.TokensPerMinute == 0 {
			bad(at+".burst", "is set but neither requests_per_minute nor tokens_per_minute is (burst sizes their buckets)")
		}
		if k.Priority < flowcontrol.MinPriority || k.Priority > flowcontrol.MaxPriority {
			bad(at+".priority", "must be between %d and %d, got %d", flowcontrol.MinPriority, flowcontrol.MaxPriority, k.Priority)
		}
		if k.CacheGroup != "" && !keyNamePattern.MatchString(k.CacheGroup) {
			bad(at+".cache_group", "%q must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit", k.CacheGroup)
		}
	}
	switch c.Auth.CacheIsolation {
	case CacheIsolationNone, CacheIsolationPerKey:
	default:
		bad("auth.cache_isolation", "%q is not none or per_key", c.Auth.CacheIsolation)
	}
	if c.Auth.CacheSaltSecretFile != "" {
		if _, err := c.CacheSaltSecret(); err != nil {
			bad("auth.cache_salt_secret_file", "%s", strings.TrimPrefix(err.Error(), "auth.cache_salt_secret_file: "))
		}
	} else if c.Auth.CacheIsolation == CacheIsolationPerKey && c.usesCacheGroups() {
		bad("auth.cache_salt_secret_file", "is required when auth.keys name a cache_group (the group's salt is derived from it)")
	}
	if c.Auth.WorkerAPIKey != "" {
		if msg := checkSecret(c.Auth.WorkerAPIKey); msg != "" {
			bad("auth.worker_api_key", "%s", msg)
		}
	}
	for i, w := range c.Workers {
		if w.APIKey != "" {
			if msg := checkSecret(w.APIKey); msg != "" {
				bad(fmt.Sprintf("workers[%d].api_key", i), "%s", msg)
			}
		}
	}
}
