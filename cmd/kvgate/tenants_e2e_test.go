package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/configs"
)

// bKeys are the other keys, each presented one way (OpenAI SDKs send Bearer, Anthropic SDKs
// x-api-key): each must be its own tenant, since one key's request caches its own prompt.
var bKeys = []map[string]string{{"Authorization": "Bearer key-bravo-secret"}, {"X-Api-Key": "key-charlie-secret"}}

// tenantKeys is the --auth-api-keys value of the tenant tests.
const tenantKeys = "key-alpha-secret,key-bravo-secret,key-charlie-secret"

// tenantCall sends method path (body nil: none) to the gateway's client listener with the
// given auth headers and returns status and body.
func tenantCall(t *testing.T, f *fleet, method, path string, body any, h map[string]string) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		data, _ := json.Marshal(body)
		r = strings.NewReader(string(data))
	}
	req, _ := http.NewRequest(method, f.gw.URL+path, r)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// cachedTokens sends a chat request and returns the worker's cached_tokens for it.
func cachedTokens(t *testing.T, f *fleet, body map[string]any, h map[string]string) int {
	t.Helper()
	code, data := tenantCall(t, f, http.MethodPost, "/v1/chat/completions", body, h)
	if code != http.StatusOK {
		t.Fatalf("chat: %d %s", code, data)
	}
	var r struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
			Details      struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(data, &r); err != nil || r.Usage.PromptTokens == 0 {
		t.Fatalf("chat body %s (%v)", data, err)
	}
	return r.Usage.Details.Cached
}

// Client keys on one worker (auth.cache_isolation per_key, the default): another key's exact
// guess of key A's prompt, with or without A's cache_salt, sent as Bearer or as x-api-key,
// finds nothing cached (the worker computes it cold), while A's own repeat is a hit;
// the dry run as each key (POST /debug/route?as_key) shows the same. Before per-key salts, the
// guess was served from A's cache (the probe of issue 32: 21.5 ms against 777 ms).
func TestTenantsDoNotShareCache(t *testing.T) {
	tok := needModel(t)
	f := startFleet(t, tok, fleetSpec{workers: 1, events: true,
		args: []string{"--router-policy", "kv", "--auth-api-keys", tenantKeys}})
	nameB := configs.DerivedKeyName("key-bravo-secret")
	asA := map[string]string{"Authorization": "Bearer key-alpha-secret"}
	promptOf := func(seed int, salt string) map[string]any {
		b := map[string]any{"model": servedModel, "max_tokens": 2, "messages": []map[string]string{
			{"role": "system", "content": fmt.Sprintf("You keep ledger %d.", seed)},
			{"role": "user", "content": longText(seed, 120)}}}
		if salt != "" {
			b["cache_salt"] = salt
		}
		return b
	}
	prompt := func(salt string) map[string]any { return promptOf(7, salt) }
	for _, salt := range []string{"", "shared-salt"} {
		t.Run("salt="+salt, func(t *testing.T) {
			if got := cachedTokens(t, f, prompt(salt), asA); got != 0 {
				t.Fatalf("A's first request found %d cached tokens", got)
			}
			if got := cachedTokens(t, f, prompt(salt), asA); got == 0 {
				t.Fatal("A's repeat found nothing cached: the test cannot tell isolation from no caching")
			}
			for _, h := range bKeys {
				if got := cachedTokens(t, f, prompt(salt), h); got != 0 {
					t.Errorf("B (%v) guessed A's prompt and got %d cached tokens, want 0", h, got)
				}
			}
		})
	}
	// A prompt only A sent: the dry run as A sees its blocks on the worker once its events
	// arrive; as B, none.
	u := f.urls[0]
	if got := cachedTokens(t, f, promptOf(8, ""), asA); got != 0 {
		t.Fatalf("A's new prompt found %d cached tokens", got)
	}
	f.awaitCachedAs(promptOf(8, ""), u, configs.DerivedKeyName("key-alpha-secret"))
	code, _, data := f.post("/debug/route?as_key="+nameB, promptOf(8, ""), nil)
	var d routeJSON
	if code != http.StatusOK || json.Unmarshal(data, &d) != nil {
		t.Fatalf("/debug/route as B: %d %s", code, data)
	}
	if d.g1Of(u) != 0 {
		t.Errorf("as B the worker holds %d of A's blocks, want 0: %s", d.g1Of(u), data)
	}
	if code, _, data := f.post("/debug/route?as_key=nobody", prompt(""), nil); code != http.StatusBadRequest {
		t.Errorf("/debug/route?as_key=nobody: %d %s, want 400", code, data)
	}
}

// awaitCachedAs waits until the dry run as key name shows all of req's blocks on worker u.
func (f *fleet) awaitCachedAs(req any, u, name string) {
	f.t.Helper()
	for range 500 {
		code, _, data := f.post("/debug/route?as_key="+name, req, nil)
		var d routeJSON
		if code == http.StatusOK && json.Unmarshal(data, &d) == nil && d.PromptBlocks > 0 && d.g1Of(u) == d.PromptBlocks {
			return
		}
		sleepBriefly()
	}
	f.t.Fatalf("the dry run as %s never saw the prompt's blocks on %s", name, u)
}

// A stored response is its creating key's: another key gets vLLM's 404 for GET, DELETE, cancel,
// input_items and previous_response_id, exactly as for an id nobody produced; the creator's own
// requests reach the worker.
func TestTenantsResponsesOwnership(t *testing.T) {
	tok := needModel(t)
	f := startFleet(t, tok, fleetSpec{workers: 2,
		args: []string{"--router-policy", "round_robin", "--auth-api-keys", tenantKeys}})
	asA := map[string]string{"Authorization": "Bearer key-alpha-secret"}
	code, data := tenantCall(t, f, http.MethodPost, "/v1/responses", map[string]any{
		"model": servedModel, "input": "remember the number 42", "max_output_tokens": 4}, asA)
	var r struct{ ID string }
	if code != http.StatusOK || json.Unmarshal(data, &r) != nil || r.ID == "" {
		t.Fatalf("create: %d %s", code, data)
	}
	_, unknown := tenantCall(t, f, http.MethodGet, "/v1/responses/resp_nobody_made_this", nil, asA)
	if code, data := tenantCall(t, f, http.MethodGet, "/v1/responses/"+r.ID, nil, asA); code != http.StatusOK {
		t.Fatalf("A's GET of its own response: %d %s", code, data)
	}
	for _, h := range bKeys {
		for _, tc := range []struct {
			method, path string
			body         any
		}{
			{http.MethodGet, "/v1/responses/" + r.ID, nil},
			{http.MethodDelete, "/v1/responses/" + r.ID, nil},
			{http.MethodPost, "/v1/responses/" + r.ID + "/cancel", nil},
			{http.MethodGet, "/v1/responses/" + r.ID + "/input_items", nil},
			{http.MethodPost, "/v1/responses", map[string]any{"model": servedModel, "input": "what number?",
				"previous_response_id": r.ID, "max_output_tokens": 4}},
		} {
			code, data := tenantCall(t, f, tc.method, tc.path, tc.body, h)
			want := strings.ReplaceAll(string(unknown), "resp_nobody_made_this", r.ID)
			if code != http.StatusNotFound || string(data) != want {
				t.Errorf("B (%v) %s %s: %d %s, want 404 %s", h, tc.method, tc.path, code, data, want)
			}
		}
	}
	code, data = tenantCall(t, f, http.MethodPost, "/v1/responses", map[string]any{"model": servedModel,
		"input": "what number?", "previous_response_id": r.ID, "max_output_tokens": 4}, asA)
	if code != http.StatusOK {
		t.Errorf("A's follow-up: %d %s", code, data)
	}
	if pins := f.get("/debug/sessions/"); !strings.Contains(pins, fmt.Sprintf(`"owner":%q`, configs.DerivedKeyName("key-alpha-secret"))) {
		t.Errorf("/debug/sessions/ does not name the pin's owner: %s", pins)
	}
}

func sleepBriefly() { time.Sleep(10 * time.Millisecond) }
