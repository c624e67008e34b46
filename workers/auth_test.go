package workers

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kvgate/kvgate/configs"
)

// AuthTransport gives each worker's requests that worker's key and leaves other hosts alone.
func TestAuthTransport(t *testing.T) {
	seen := map[string]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen[r.URL.Path] = r.Header.Get("Authorization")
	}))
	defer srv.Close()
	cfg := configs.Default()
	cfg.Auth.WorkerAPIKey = "fleet"
	cfg.Workers = []configs.Worker{{URL: srv.URL + "/a", DPSize: 1, APIKey: "key-a"}, {URL: srv.URL + "/ab", DPSize: 1}}
	reg, err := NewRegistry(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: reg.AuthTransport(nil)}
	cases := []struct{ path, caller, want string }{
		{"/a/metrics", "", "Bearer key-a"},
		{"/ab/metrics", "", "Bearer fleet"}, // longest base wins; the default fills in
		{"/abc/metrics", "", ""},            // not a worker's URL
		{"/other", "Bearer mine", "Bearer mine"},
		{"/a/v1/models", "Bearer client", "Bearer key-a"},
	}
	for _, tc := range cases {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+tc.path, nil)
		if tc.caller != "" {
			req.Header.Set("Authorization", tc.caller)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if seen[tc.path] != tc.want {
			t.Errorf("%s: Authorization %q, want %q", tc.path, seen[tc.path], tc.want)
		}
		if tc.caller != "" && req.Header.Get("Authorization") != tc.caller {
			t.Errorf("%s: the caller's request was modified", tc.path)
		}
	}
}
