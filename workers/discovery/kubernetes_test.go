package discovery

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/kubefake"
	"github.com/kvgate/kvgate/workers/discoveryconfig"
)

// newAPI starts a fake API for service vllm in namespace llm, shut down after the test's
// sources stopped (cleanups run last-registered first).
func newAPI(t *testing.T) *kubefake.Server {
	api := kubefake.New("llm", "vllm")
	t.Cleanup(api.Shutdown)
	return api
}

var vllmPorts = map[string]int32{"http": 8000, "kv-events": 5557, "kv-replay": 5558}

func kubeConfig(api *kubefake.Server) discoveryconfig.Kubernetes {
	k := discoveryconfig.Default().Kubernetes
	k.Service, k.Namespace, k.APIURL, k.TokenFile, k.CAFile = "vllm", "llm", api.URL, "", ""
	return k
}

func newKube(t *testing.T, f *fixture, k discoveryconfig.Kubernetes) *kubernetes {
	t.Helper()
	src, err := newKubernetes(k, f.reg, f.opts)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

func ready(addrs ...string) kubefake.Endpoint {
	return kubefake.Endpoint{Addresses: addrs, Ready: kubefake.Bool(true)}
}

func terminating(addrs ...string) kubefake.Endpoint {
	return kubefake.Endpoint{Addresses: addrs, Ready: kubefake.Bool(false), Terminating: kubefake.Bool(true)}
}

// List (in pages), then watch: added, modified (terminating), bookmark and deleted events
// change the fleet without listing again.
func TestKubernetesListThenWatch(t *testing.T) {
	api := newAPI(t)
	api.SetPageSize(1) // two slices: the list follows its continue token
	api.Put(kubefake.Slice{Name: "vllm-a", Ports: vllmPorts, Endpoints: []kubefake.Endpoint{ready("10.0.0.1"), terminating("10.0.0.2")}})
	api.Put(kubefake.Slice{Name: "vllm-b", Ports: vllmPorts, Endpoints: []kubefake.Endpoint{{Addresses: []string{"10.0.0.3"}}}}) // ready unset: ready
	f := newFixture(t)
	src := newKube(t, f, kubeConfig(api))
	if _, ok, reason := src.Readiness(); ok || reason == "" {
		t.Fatalf("ready before any sync (reason %q)", reason)
	}
	run(t, src)
	want := []string{"http://10.0.0.1:8000", "http://10.0.0.2:8000 draining", "http://10.0.0.3:8000"}
	eventually(t, "the listed fleet", func() bool { return equal(f.fleet(), want) })
	eventually(t, "readiness", func() bool { _, ok, _ := src.Readiness(); return ok })
	w := f.reg.Get("http://10.0.0.1:8000").Config()
	if w.KVEvents != "tcp://10.0.0.1:5557" || w.Replay != "tcp://10.0.0.1:5558" || w.DPSize != 1 {
		t.Errorf("worker config %+v", w)
	}
	if f.reg.Get("http://10.0.0.2:8000").Routable() {
		t.Error("a terminating endpoint is routable")
	}
	eventually(t, "the watch", func() bool { return api.WatcherCount() == 1 })

	api.Put(kubefake.Slice{Name: "vllm-c", Ports: vllmPorts, Endpoints: []kubefake.Endpoint{ready("10.0.0.4")}})
	api.Put(kubefake.Slice{Name: "vllm-a", Ports: vllmPorts, Endpoints: []kubefake.Endpoint{terminating("10.0.0.1"), terminating("10.0.0.2")}})
	api.Bookmark()
	api.Delete("vllm-b")
	want = []string{"http://10.0.0.1:8000 draining", "http://10.0.0.2:8000 draining", "http://10.0.0.4:8000"}
	eventually(t, "the watched changes", func() bool { return equal(f.fleet(), want) })
	eventually(t, "the bookmark", func() bool { return f.events(sourceKubernetes, "bookmark") == 1 })
	if n := api.Lists.Load(); n != 2 { // one list of two pages
		t.Errorf("%d list requests, want 2 (one paged list, no re-list)", n)
	}
	for typ, want := range map[string]float64{"list": 1, "added": 1, "modified": 1, "deleted": 1,
		"worker_added": 4, "worker_draining": 2, "worker_removed": 1} {
		if got := f.events(sourceKubernetes, typ); got != want {
			t.Errorf("events{type=%s} = %v, want %v", typ, got, want)
		}
	}

	// The endpoint comes back ready, then the whole slice goes.
	api.Put(kubefake.Slice{Name: "vllm-a", Ports: vllmPorts, Endpoints: []kubefake.Endpoint{ready("10.0.0.1")}})
	eventually(t, "the undrained worker", func() bool { return f.reg.Get("http://10.0.0.1:8000").Routable() })
	api.Delete("vllm-a")
	eventually(t, "removal", func() bool { return equal(f.fleet(), []string{"http://10.0.0.4:8000"}) })
}

// A slice deleted in a gap of the watch is gone from the re-list that a 410 (as an ERROR
// event, or as the status of a watch from an expired resourceVersion) or a severed watch
// forces; the re-list removes its workers.
func TestKubernetesRelistRemovesVanishedSlices(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cut    func(*kubefake.Server)
		reason string
	}{
		{"410 ERROR event", (*kubefake.Server).Expire, "gone"},
		{"410 on re-watch", (*kubefake.Server).EndWatches, "gone"},
		{"severed watch", (*kubefake.Server).Sever, "severed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := newAPI(t)
			api.Put(kubefake.Slice{Name: "vllm-a", Ports: vllmPorts, Endpoints: []kubefake.Endpoint{ready("10.0.0.1")}})
			api.Put(kubefake.Slice{Name: "vllm-b", Ports: vllmPorts, Endpoints: []kubefake.Endpoint{ready("10.0.0.2")}})
			f := newFixture(t)
			run(t, newKube(t, f, kubeConfig(api)))
			eventually(t, "the watch", func() bool { return api.WatcherCount() == 1 && f.reg.Len() == 2 })
			api.DeleteUnseen("vllm-b")
			tc.cut(api)
			eventually(t, "the re-list", func() bool { return equal(f.fleet(), []string{"http://10.0.0.1:8000"}) })
			if n := api.Lists.Load(); n != 2 {
				t.Errorf("%d lists, want 2", n)
			}
			if got := f.errors(sourceKubernetes, tc.reason); got != 1 {
				t.Errorf("errors{reason=%s} = %v, want 1", tc.reason, got)
			}
			// And the new watch follows changes again.
			eventually(t, "the new watch", func() bool { return api.WatcherCount() == 1 })
			api.Put(kubefake.Slice{Name: "vllm-c", Ports: vllmPorts, Endpoints: []kubefake.Endpoint{ready("10.0.0.3")}})
			eventually(t, "a watched add", func() bool { return f.reg.Get("http://10.0.0.3:8000") != nil })
		})
	}
}

// The token file is read for every request: after it rotates, the next request carries the
// new token.
func TestKubernetesTokenRotates(t *testing.T) {
	api := newAPI(t)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("token-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	api.SetToken("token-1")
	api.Put(kubefake.Slice{Name: "vllm-a", Ports: vllmPorts, Endpoints: []kubefake.Endpoint{ready("10.0.0.1")}})
	f := newFixture(t)
	k := kubeConfig(api)
	k.TokenFile = tokenFile
	run(t, newKube(t, f, k))
	eventually(t, "the watch", func() bool { return api.WatcherCount() == 1 && f.reg.Len() == 1 })

	if err := os.WriteFile(tokenFile, []byte("token-2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	api.SetToken("token-2") // the old token is refused from now on
	api.Sever()
	eventually(t, "the re-list and watch with the new token", func() bool { return api.Lists.Load() == 2 && api.WatcherCount() == 1 })
	api.Put(kubefake.Slice{Name: "vllm-b", Ports: vllmPorts, Endpoints: []kubefake.Endpoint{ready("10.0.0.2")}})
	eventually(t, "a watched add", func() bool { return f.reg.Len() == 2 })
	toks := api.Tokens()
	if toks[0] != "token-1" || toks[len(toks)-1] != "token-2" {
		t.Errorf("tokens sent %v: want token-1 first and token-2 after the rotation", toks)
	}
	if got := f.errors(sourceKubernetes, "unauthorized"); got != 0 {
		t.Errorf("%v requests were refused: the rotated token was not re-read before use", got)
	}
}

// Without the RBAC Role the API answers 403: the log names the Role to grant, readiness says
// why, and the source retries until the Role exists.
func TestKubernetesForbidden(t *testing.T) {
	api := newAPI(t)
	api.SetForbidden(true)
	api.Put(kubefake.Slice{Name: "vllm-a", Ports: vllmPorts, Endpoints: []kubefake.Endpoint{ready("10.0.0.1")}})
	f := newFixture(t)
	src := newKube(t, f, kubeConfig(api))
	run(t, src)
	eventually(t, "retries", func() bool { return f.errors(sourceKubernetes, "forbidden") >= 3 })
	name, ok, reason := src.Readiness()
	if ok || name != "discovery.kubernetes" || !strings.Contains(reason, "endpointslices") || !strings.Contains(reason, "list, watch") {
		t.Errorf("readiness %s %v %q: want not ready, naming the endpointslices list/watch Role", name, ok, reason)
	}
	if logs := f.log.String(); strings.Count(logs, "level=ERROR") != 1 || !strings.Contains(logs, "Role") {
		t.Errorf("want one log line naming the Role, got:\n%s", logs)
	}
	if f.reg.Len() != 0 {
		t.Error("workers added without a list")
	}
	api.SetForbidden(false)
	eventually(t, "sync once the Role exists", func() bool { _, ok, _ := src.Readiness(); return ok && f.reg.Len() == 1 })
}

// An API that cannot be reached at start holds readiness; one that goes away after the sync
// leaves the known workers serving and readiness ready.
func TestKubernetesUnreachable(t *testing.T) {
	api := newAPI(t)
	api.Put(kubefake.Slice{Name: "vllm-a", Ports: vllmPorts, Endpoints: []kubefake.Endpoint{ready("10.0.0.1")}})
	dead := kubefake.New("llm", "vllm")
	dead.Shutdown()

	f := newFixture(t)
	src := newKube(t, f, kubeConfig(dead))
	run(t, src)
	eventually(t, "an unreachable error", func() bool { return f.errors(sourceKubernetes, "unreachable") >= 1 })
	if _, ok, reason := src.Readiness(); ok || !strings.Contains(reason, "cannot reach the Kubernetes API") {
		t.Errorf("readiness %v %q", ok, reason)
	}

	f2 := newFixture(t)
	src2 := newKube(t, f2, kubeConfig(api))
	run(t, src2)
	eventually(t, "sync", func() bool { return f2.reg.Len() == 1 && api.WatcherCount() == 1 })
	api.Shutdown()
	eventually(t, "failed re-lists", func() bool { return f2.errors(sourceKubernetes, "unreachable") >= 2 })
	if _, ok, _ := src2.Readiness(); !ok || f2.reg.Len() != 1 || !f2.reg.Get("http://10.0.0.1:8000").Routable() {
		t.Errorf("the known worker must keep serving while the API is away (ready %v, workers %v)", ok, f2.fleet())
	}
}

// A slice's ports become workers: DP ranks from kv-events-<r>, approximate mode (warned once
// per slice) without an event port or with ranks vLLM would not bind, IPv6 in brackets.
func TestKubernetesSlicePorts(t *testing.T) {
	type want struct {
		url, kv, replay string
		dp              int
	}
	for _, tc := range []struct {
		name  string
		ports map[string]int32
		addr  string
		want  want
		warn  string
	}{
		{"one rank", vllmPorts, "10.0.0.1", want{"http://10.0.0.1:8000", "tcp://10.0.0.1:5557", "tcp://10.0.0.1:5558", 1}, ""},
		{"two ranks", map[string]int32{"http": 8000, "kv-events-0": 5557, "kv-events-1": 5558, "kv-replay-0": 5600, "kv-replay-1": 5601},
			"10.0.0.1", want{"http://10.0.0.1:8000", "tcp://10.0.0.1:5557", "tcp://10.0.0.1:5600", 2}, ""},
		{"no event port", map[string]int32{"http": 8000}, "10.0.0.1", want{"http://10.0.0.1:8000", "", "", 1}, "no port named kv-events"},
		{"ranks not consecutive", map[string]int32{"http": 8000, "kv-events-0": 5557, "kv-events-1": 6000},
			"10.0.0.1", want{"http://10.0.0.1:8000", "", "", 2}, "is not kv-events-0 + 1"},
		{"ipv6", vllmPorts, "fd00::1", want{"http://[fd00::1]:8000", "tcp://[fd00::1]:5557", "tcp://[fd00::1]:5558", 1}, ""},
		{"no http port", map[string]int32{"metrics": 9000}, "10.0.0.1", want{}, "no port named http"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			k := &kubernetes{cfg: discoveryconfig.Default().Kubernetes, o: f.opts, warned: map[string]bool{},
				slices: map[string]endpointSlice{}}
			k.cfg.Service = "vllm"
			var s endpointSlice
			s.Metadata.Name = "vllm-x"
			for name, port := range tc.ports {
				s.Ports = append(s.Ports, slicePort{Name: &name, Port: &port})
			}
			s.Endpoints = []sliceMember{{Addresses: []string{tc.addr}}}
			k.slices["vllm-x"] = s
			for range 2 { // twice: the warning is logged once
				got := k.desired()
				if tc.want.url == "" {
					if len(got) != 0 {
						t.Fatalf("workers %v from a slice without the http port", got)
					}
					continue
				}
				ep, ok := got[tc.want.url]
				if !ok || len(got) != 1 {
					t.Fatalf("desired %v, want %s", got, tc.want.url)
				}
				w := ep.Worker
				if w.KVEvents != tc.want.kv || w.Replay != tc.want.replay || w.DPSize != tc.want.dp || !ep.Ready {
					t.Errorf("worker %+v ready %v, want %+v", w, ep.Ready, tc.want)
				}
			}
			if logs := f.log.String(); tc.warn != "" && strings.Count(logs, tc.warn) != 1 {
				t.Errorf("want one warning %q, got:\n%s", tc.warn, logs)
			} else if tc.warn == "" && logs != "" {
				t.Errorf("unexpected log:\n%s", logs)
			}
		})
	}
}

// The in-cluster defaults: the API URL from the service environment, brackets for IPv6.
func TestKubernetesInClusterURL(t *testing.T) {
	f := newFixture(t)
	k := discoveryconfig.Default().Kubernetes
	k.Service, k.Namespace, k.TokenFile, k.CAFile = "vllm", "llm", "", ""
	for _, tc := range []struct{ host, port, want string }{
		{"10.96.0.1", "443", "https://10.96.0.1:443"},
		{"fd00::1", "6443", "https://[fd00::1]:6443"},
	} {
		f.opts.Getenv = func(k string) string {
			return map[string]string{"KUBERNETES_SERVICE_HOST": tc.host, "KUBERNETES_SERVICE_PORT": tc.port}[k]
		}
		src, err := newKubernetes(k, f.reg, f.opts)
		if err != nil {
			t.Fatal(err)
		}
		if src.client.base != tc.want {
			t.Errorf("api %s, want %s", src.client.base, tc.want)
		}
	}
	f.opts.Getenv = func(string) string { return "" }
	if _, err := newKubernetes(k, f.reg, f.opts); err == nil || !strings.Contains(err.Error(), "api_url") {
		t.Errorf("outside a pod without api_url: err %v", err)
	}
	k.CAFile = filepath.Join(t.TempDir(), "missing.crt")
	k.APIURL = "https://10.96.0.1:443"
	if _, err := newKubernetes(k, f.reg, f.opts); err == nil || !strings.Contains(err.Error(), "ca_file") {
		t.Errorf("missing CA file: err %v", err)
	}
}
