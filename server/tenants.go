package server

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"

	"github.com/gin-gonic/gin"

	"github.com/kvgate/kvgate/apireq"
	"github.com/kvgate/kvgate/configs"
)

// tenant is what the gateway knows of one client key once the request presented it: its name
// (Responses ownership, logs, POST /debug/route?as_key) and its cache salt ("" when
// auth.cache_isolation is none).
type tenant struct {
	name string
	salt string
	// priority is the key's auth.keys[].priority: the highest flow-control priority its
	// requests get (flow_priority.go).
	priority int
}

// tenants maps the client keys (in keySet order) to their tenants.
type tenants struct {
	byIndex []*tenant
	byName  map[string]*tenant
}

// Domain prefixes of the derived salts: a salt is never the plain hash of a key (which the key
// set holds) nor of another salt kind.
const (
	keySaltPrefix   = "kvgate cache salt v1 key\x00"
	groupSaltPrefix = "kvgate cache salt v1 group\x00"
	mixSaltPrefix   = "kvgate cache salt v1 client\x00"
)

// keySalt is a key's own salt: SHA-256 over a fixed prefix and the key, hex. It is stable
// across restarts and replicas, and nobody without the key can compute it.
func keySalt(key string) string {
	h := sha256.Sum256([]byte(keySaltPrefix + key))
	return hex.EncodeToString(h[:])
}

// groupSalt is a cache group's salt: HMAC-SHA256 keyed by auth.cache_salt_secret_file over a
// fixed prefix and the group name, hex. Without the secret a group's name does not give its salt.
func groupSalt(secret []byte, group string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(groupSaltPrefix + group))
	return hex.EncodeToString(m.Sum(nil))
}

// mixSalt combines a tenant's salt with the cache_salt its client sent: a fixed-length hex digest
// (vLLM's Anthropic endpoint caps cache_salt at 1,024 characters), different for every client
// salt and unrelated to the same client salt under another tenant.
func mixSalt(tenantSalt, clientSalt string) string {
	if clientSalt == "" {
		return tenantSalt
	}
	h := sha256.Sum256([]byte(mixSaltPrefix + tenantSalt + "\x00" + clientSalt))
	return hex.EncodeToString(h[:])
}

// newTenants derives every client key's tenant from the config (auth.keys, api_keys,
// api_keys_file; cache_isolation and cache_salt_secret_file).
func newTenants(cfg configs.Config, entries []configs.ClientKey) (*tenants, error) {
	ts := &tenants{byName: make(map[string]*tenant, len(entries))}
	perKey := cfg.Auth.CacheIsolation == configs.CacheIsolationPerKey
	var secret []byte
	if perKey {
		var err error
		if secret, err = cfg.CacheSaltSecret(); err != nil {
			return nil, err
		}
	}
	for _, e := range entries {
		if _, dup := ts.byName[e.Name]; dup {
			return nil, fmt.Errorf("auth: two client keys are named %q (a derived name \"key-…\" may equal a configured one: rename it)", e.Name)
		}
		tn := &tenant{name: e.Name, priority: e.Priority}
		switch {
		case !perKey:
		case e.CacheGroup != "":
			if secret == nil {
				return nil, fmt.Errorf("auth.cache_salt_secret_file: required for the cache_group of key %q", e.Name)
			}
			tn.salt = groupSalt(secret, e.CacheGroup)
		default:
			tn.salt = keySalt(e.Key)
		}
		ts.byIndex = append(ts.byIndex, tn)
		ts.byName[e.Name] = tn
	}
	return ts, nil
}

// find returns the index of token in the set, or -1. Like has, it compares against every key
// whatever matches, so the time does not tell which key matched.
func (ks keySet) find(token string) int {
	d := sha256.Sum256([]byte(token))
	found := -1
	for i := range ks {
		eq := subtle.ConstantTimeCompare(d[:], ks[i][:])
		found = subtle.ConstantTimeSelect(eq, i, found)
	}
	return found
}

// ctxTenant is the gin context key of the request's *tenant.
const ctxTenant = "kvgate.tenant"

// identifyTenant records which client key the request presented, however it arrived (after
// clientAuth admitted it; the first presented key that is a client key wins).
func (s *Server) identifyTenant(c *gin.Context) {
	for _, k := range clientKeys(c.Request.Header) {
		if i := s.clientKeys.find(k); i >= 0 {
			c.Set(ctxTenant, s.tenants.byIndex[i])
			break
		}
	}
	c.Next()
}

// tenantOf is the request's tenant (nil without client keys).
func tenantOf(c *gin.Context) *tenant {
	v, _ := c.Get(ctxTenant)
	tn, _ := v.(*tenant)
	return tn
}

// owner is the name the request's Responses pins are kept under ("" without a tenant).
func (tn *tenant) owner() string {
	if tn == nil {
		return ""
	}
	return tn.name
}

// isolate salts the request for its tenant: the tenant's salt combined with the client's own
// cache_salt becomes the request's cache_salt, in the block hashes the gateway asks its index
// with and in the body the worker gets. count_tokens is left alone (vLLM's has no cache_salt).
func (tn *tenant) isolate(in *apireq.Request) *apiError {
	if tn == nil || tn.salt == "" || in.Endpoint == apireq.MessagesCountTokens {
		return nil
	}
	if err := in.SetCacheSalt(mixSalt(tn.salt, in.CacheSalt)); err != nil {
		return badRequest("cache_salt", err.Error())
	}
	return nil
}
