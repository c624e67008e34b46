package sim

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// With runtime LoRA updating on, an adapter loaded through POST /v1/load_lora_adapter is listed
// in /v1/models (parent: the base model) and served, its blocks hashed with its name; unloading
// removes it. Without the option the routes do not exist, as in vLLM.
func TestRuntimeLoRA(t *testing.T) {
	_, base := startWorker(t, Options{ServedModelName: "m", LoRAModules: []string{"static"}, AllowRuntimeLoRAUpdating: true,
		TTFT: time.Millisecond, ITL: time.Millisecond})
	post := func(path, body string) (int, string) {
		t.Helper()
		resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	models := func() []string {
		t.Helper()
		resp, err := http.Get(base + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var l struct {
			Data []struct {
				ID     string  `json:"id"`
				Root   string  `json:"root"`
				Parent *string `json:"parent"`
			} `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, c := range l.Data {
			s := c.ID
			if c.Parent != nil {
				s += "<" + *c.Parent + "@" + c.Root
			}
			out = append(out, s)
		}
		return out
	}
	chat := `{"model":"sql","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
	steps := []struct {
		name, path, body string
		status           int
		want             string
		models           string
	}{
		{"unknown adapter", "/v1/chat/completions", chat, 404, "The model `sql` does not exist.", "m,static<m@static"},
		{"load", "/v1/load_lora_adapter", `{"lora_name":"sql","lora_path":"/adapters/sql"}`, 200,
			"Success: LoRA adapter 'sql' added successfully.", "m,static<m@static,sql<m@/adapters/sql"},
		{"served", "/v1/chat/completions", chat, 200, `"model":"sql"`, ""},
		{"load twice", "/v1/load_lora_adapter", `{"lora_name":"sql","lora_path":"/x"}`, 400,
			`"message":"The lora adapter 'sql' has already been loaded.","type":"InvalidUserInput"`, ""},
		{"load without path", "/v1/load_lora_adapter", `{"lora_name":"x"}`, 400, "Both 'lora_name' and 'lora_path' must be provided.", ""},
		{"unload", "/v1/unload_lora_adapter", `{"lora_name":"sql"}`, 200, "Success: LoRA adapter 'sql' removed successfully.", "m,static<m@static"},
		{"unload unknown", "/v1/unload_lora_adapter", `{"lora_name":"sql"}`, 404, "The lora adapter 'sql' cannot be found.", ""},
		{"gone", "/v1/chat/completions", chat, 404, "does not exist", ""},
	}
	for _, st := range steps {
		code, body := post(st.path, st.body)
		if code != st.status || !strings.Contains(body, st.want) {
			t.Fatalf("%s: %d %s, want %d with %s", st.name, code, body, st.status, st.want)
		}
		if st.models != "" {
			if got := strings.Join(models(), ","); got != st.models {
				t.Fatalf("%s: models %s, want %s", st.name, got, st.models)
			}
		}
	}

	_, closed := startWorker(t, Options{ServedModelName: "m", TTFT: time.Millisecond, ITL: time.Millisecond})
	resp, err := http.Post(closed+"/v1/load_lora_adapter", "application/json", strings.NewReader(`{"lora_name":"a","lora_path":"/a"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("load without the option: %d, want no such route", resp.StatusCode)
	}
}
