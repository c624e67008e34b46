package server

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"testing"
)

// GET /v1/models/{id} (the OpenAI clients' models.retrieve; vLLM has no such route) answers
// the card of that id from the workers' merged /v1/models, LoRA adapters and ids with a slash
// included, and vLLM's unknown-model 404 otherwise.
func TestModelRetrieve(t *testing.T) {
	o := fastSim()
	o.ServedModelName = "org/base-model"
	o.LoRAModules = []string{"adapter-a"}
	a := startSim(t, o)
	b := startSim(t, o)
	g := startGateway(t, nil, a.srv.URL, b.srv.URL)
	cases := []struct {
		name, id string
		status   int
		parent   string // the card's parent ("" for the base model)
	}{
		{"base model with a slash", "org/base-model", 200, ""},
		{"base model with an escaped slash", url.PathEscape("org/base-model"), 200, ""},
		{"adapter", "adapter-a", 200, "org/base-model"},
		{"unknown", "gpt-9", 404, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := http.Get(g.url + "/v1/models/" + tc.id)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if tc.status != 200 {
				checkModelNotFound(t, resp, body, tc.id)
				return
			}
			var card struct {
				ID, Object string
				Parent     *string
			}
			if err := json.Unmarshal(body, &card); resp.StatusCode != 200 || err != nil {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			want, _ := url.PathUnescape(tc.id)
			if card.ID != want || card.Object != "model" || (card.Parent == nil) != (tc.parent == "") || card.Parent != nil && *card.Parent != tc.parent {
				t.Errorf("card %s", body)
			}
		})
	}
}
