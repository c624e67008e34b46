package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestResponsesItemReferences: a client that stores its responses (the AI SDK's default
// store: true) sends turn 1's output items back by id on turn 2. The gateway puts the stored
// items in their place, fetched from the worker that stores them (streamed or not), so the
// follow-up works and the gateway counts its prompt as the worker does; a reference nobody
// can resolve is a 400 naming the item and the store: false workaround.
func TestResponsesItemReferences(t *testing.T) {
	tok := needModel(t)
	f := startFleet(t, tok, fleetSpec{workers: 2, args: []string{"--router-policy", "kv_no_load"}})
	for _, stream := range []bool{false, true} {
		code, _, body := respCall(t, f, http.MethodPost, "/v1/responses", map[string]any{
			"model": servedModel, "input": "Tell me about Paris.", "max_output_tokens": 6, "stream": stream})
		if code != http.StatusOK {
			t.Fatalf("turn 1 (stream %v): %d %s", stream, code, body)
		}
		msgID, text := outputMessage(t, body, stream)
		follow := map[string]any{"model": servedModel, "max_output_tokens": 2, "input": []any{
			map[string]any{"role": "user", "content": "Tell me about Paris."},
			map[string]any{"type": "item_reference", "id": msgID},
			map[string]any{"role": "user", "content": "And Rome?"}}}
		d := f.dryRun(follow, nil)
		code, _, body = respCall(t, f, http.MethodPost, "/v1/responses", follow)
		if code != http.StatusOK {
			t.Fatalf("turn 2 (stream %v) referencing %s: %d %s", stream, msgID, code, body)
		}
		var r struct {
			Usage struct {
				InputTokens int `json:"input_tokens"`
			} `json:"usage"`
		}
		_ = json.Unmarshal(body, &r)
		// The same conversation with the item spelled out: what the reference stands for.
		spelled := map[string]any{"model": servedModel, "max_output_tokens": 2, "store": false, "input": []any{
			map[string]any{"role": "user", "content": "Tell me about Paris."},
			map[string]any{"role": "assistant", "content": text},
			map[string]any{"role": "user", "content": "And Rome?"}}}
		want := f.dryRun(spelled, nil)
		if d.PromptTokens == 0 || d.PromptTokens != r.Usage.InputTokens || d.PromptTokens != want.PromptTokens {
			t.Errorf("stream %v: gateway %d prompt tokens, worker %d, spelled-out conversation %d", stream, d.PromptTokens, r.Usage.InputTokens, want.PromptTokens)
		}
	}
	code, _, body := respCall(t, f, http.MethodPost, "/v1/responses", map[string]any{"model": servedModel, "input": []any{
		map[string]any{"role": "user", "content": "Hi"}, map[string]any{"type": "item_reference", "id": "msg_nowhere"}}})
	if code != http.StatusBadRequest || !strings.Contains(string(body), "msg_nowhere") || !strings.Contains(string(body), `\"store\": false`) {
		t.Errorf("unresolvable reference: %d %s", code, body)
	}
}

// outputMessage is the id and text of a Responses answer's first output message.
func outputMessage(t *testing.T, body []byte, stream bool) (string, string) {
	t.Helper()
	obj := body
	if stream {
		for _, line := range strings.Split(string(body), "\n") {
			if data, ok := strings.CutPrefix(line, "data: "); ok && strings.Contains(data, `"response.completed"`) {
				var ev struct {
					Response json.RawMessage `json:"response"`
				}
				_ = json.Unmarshal([]byte(data), &ev)
				obj = ev.Response
			}
		}
	}
	var r struct {
		Output []struct {
			ID, Type string
			Content  []struct{ Text string }
		} `json:"output"`
	}
	if err := json.Unmarshal(obj, &r); err != nil || len(r.Output) == 0 || r.Output[0].Type != "message" || r.Output[0].ID == "" || len(r.Output[0].Content) == 0 {
		t.Fatalf("no output message in %s", body)
	}
	return r.Output[0].ID, r.Output[0].Content[0].Text
}

// TestResponsesItemReferencesAreTheKeys: with client keys, an item of key A's stored response
// resolves for A and, referenced by another key (Bearer or x-api-key), is the same 400 as an
// item nobody stored: the other key learns nothing of A's responses.
func TestResponsesItemReferencesAreTheKeys(t *testing.T) {
	tok := needModel(t)
	f := startFleet(t, tok, fleetSpec{workers: 1, args: []string{"--router-policy", "kv_no_load", "--auth-api-keys", tenantKeys}})
	asA := map[string]string{"Authorization": "Bearer key-alpha-secret"}
	code, body := tenantCall(t, f, http.MethodPost, "/v1/responses", map[string]any{
		"model": servedModel, "input": "Tell me about Paris.", "max_output_tokens": 4}, asA)
	if code != http.StatusOK {
		t.Fatalf("turn 1: %d %s", code, body)
	}
	msgID, _ := outputMessage(t, body, false)
	follow := func(id string) map[string]any {
		return map[string]any{"model": servedModel, "max_output_tokens": 2, "input": []any{
			map[string]any{"role": "user", "content": "Tell me about Paris."},
			map[string]any{"type": "item_reference", "id": id},
			map[string]any{"role": "user", "content": "And Rome?"}}}
	}
	if code, body := tenantCall(t, f, http.MethodPost, "/v1/responses", follow(msgID), asA); code != http.StatusOK {
		t.Fatalf("key A's own reference: %d %s", code, body)
	}
	_, nobody := tenantCall(t, f, http.MethodPost, "/v1/responses", follow("msg_nowhere"), asA)
	for _, h := range bKeys {
		code, body := tenantCall(t, f, http.MethodPost, "/v1/responses", follow(msgID), h)
		if code != http.StatusBadRequest || !strings.Contains(string(body), "cannot be resolved") {
			t.Fatalf("another key (%v) referencing A's item: %d %s", h, code, body)
		}
		got := strings.ReplaceAll(string(body), msgID, "ID")
		want := strings.ReplaceAll(string(nobody), "msg_nowhere", "ID")
		if got != want {
			t.Errorf("another key's answer differs from an unknown item's:\n got %s\nwant %s", got, want)
		}
	}
}
