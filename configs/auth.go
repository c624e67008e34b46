package configs

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"strings"
)

// maxKeysFileBytes bounds auth.api_keys_file.
const maxKeysFileBytes = 4 << 20

// ClientAPIKeys returns the client keys: auth.api_keys followed by the keys of
// auth.api_keys_file, without duplicates. None means the client listener is open. The file is
// read on every call; an unreadable file, or one that holds no key, is an error (a configured
// but empty file must never turn authentication off).
func (c *Config) ClientAPIKeys() ([]string, error) {
	seen := map[string]bool{}
	var out []string
	add := func(k string) {
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	for _, k := range c.Auth.APIKeys {
		add(k)
	}
	if c.Auth.APIKeysFile == "" {
		return out, nil
	}
	keys, err := readKeysFile(c.Auth.APIKeysFile)
	if err != nil {
		return nil, err
	}
	for _, k := range keys {
		add(k)
	}
	return out, nil
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
