package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/kvgate/kvgate/sim"
)

// A fleet of simulators started with --api-key behind a gateway that holds the worker key and
// its own client keys: health probing, model listing, chat and the KV policy's /metrics scrape
// all work; a client without a key gets 401.
func TestWorkerAPIKeyEndToEnd(t *testing.T) {
	tok := needModel(t)
	f := startFleet(t, tok, fleetSpec{workers: 2,
		simOpts: func(_ int, o *sim.Options) { o.APIKeys = []string{"worker-key"} },
		args:    []string{"--router-policy", "kv", "--auth-worker-api-key", "worker-key", "--auth-api-keys", "client-key"}})
	if got := f.get("/health"); !strings.Contains(got, `"routable_workers":2`) {
		t.Fatalf("/health: %s", got)
	}
	cc := openai.DefaultConfig("client-key")
	cc.BaseURL = f.gw.URL + "/v1"
	client := openai.NewClientWithConfig(cc)
	models, err := client.ListModels(context.Background())
	if err != nil || len(models.Models) == 0 || models.Models[0].ID != servedModel {
		t.Fatalf("models: %+v %v", models, err)
	}
	for _, stream := range []bool{false, true} {
		req := chatRequest("You are terse.", "Say hi.")
		req.MaxCompletionTokens, req.Stream = 4, stream
		if stream {
			st, err := client.CreateChatCompletionStream(context.Background(), req)
			if err != nil {
				t.Fatalf("stream: %v", err)
			}
			for err == nil {
				_, err = st.Recv()
			}
			st.Close()
			if !errors.Is(err, io.EOF) {
				t.Fatalf("stream ended with %v", err)
			}
			continue
		}
		if _, err := client.CreateChatCompletion(context.Background(), req); err != nil {
			t.Fatalf("chat: %v", err)
		}
	}
	for _, u := range f.urls {
		if !f.pollTarget(u, 5*time.Second, func(v targetJSON) bool { return v.Metrics != nil }) {
			t.Errorf("%s: no /metrics reading reached the gateway", u)
		}
	}
	_, err = f.client.CreateChatCompletion(context.Background(), chatRequest("x", "y")) // key "none"
	var apiErr *openai.APIError
	if !errors.As(err, &apiErr) || apiErr.HTTPStatusCode != http.StatusUnauthorized || apiErr.Code != "invalid_api_key" {
		t.Errorf("a client with a wrong key: %v", err)
	}
}

// kvgate serve with --admin-listen serves /debug/* there (behind the token) and not on the
// client listener.
func TestServeAdminListener(t *testing.T) {
	worker := newModelsWorker(t)
	addr, admin := freeAddr(t), freeAddr(t)
	t.Setenv("KVGATE_ADMIN_TOKEN", "adm-token") // secrets come from the environment like every key
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--model", "m", "--worker", worker, "--listen", addr,
			"--admin-listen", admin, "--log-level", "error", "--shutdown-drain-delay", "0s"}, io.Discard, io.Discard)
	}()
	t.Cleanup(func() {
		stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve returned %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("serve did not stop")
		}
	})
	waitUp(t, "http://"+addr+"/health")
	get := func(url, auth string) int {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get("http://"+addr+"/debug/workers", ""); code != http.StatusNotFound {
		t.Errorf("client listener /debug/workers: %d", code)
	}
	for auth, want := range map[string]int{"": 401, "Bearer nope": 401, "Bearer adm-token": 200} {
		if code := get("http://"+admin+"/debug/workers", auth); code != want {
			t.Errorf("admin listener /debug/workers with %q: %d, want %d", auth, code, want)
		}
	}
	if code := get("http://"+addr+"/debug/workers", "Bearer adm-token"); code != http.StatusNotFound {
		t.Errorf("client listener /debug/workers with the admin token: %d", code)
	}
}

// kvgate serve without --admin-listen has no debug endpoints anywhere.
func TestServeWithoutAdminListener(t *testing.T) {
	worker := newModelsWorker(t)
	addr := freeAddr(t)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--model", "m", "--worker", worker, "--listen", addr, "--log-level", "error", "--shutdown-drain-delay", "0s"}, io.Discard, io.Discard)
	}()
	defer func() { stop(); <-done }()
	waitUp(t, "http://"+addr+"/health")
	resp, err := http.Get("http://" + addr + "/debug/workers")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("/debug/workers without admin_listen: %d", resp.StatusCode)
	}
}

func newModelsWorker(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"m","object":"model"}]}`))
		}
	}), ReadHeaderTimeout: time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func waitUp(t *testing.T, url string) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			return
		}
	}
	t.Fatalf("%s never answered", url)
}
