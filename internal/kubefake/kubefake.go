// Package kubefake is a fake Kubernetes API serving the EndpointSlices of one Service
// (discovery.k8s.io/v1 list and watch), for tests of worker discovery: no kube-apiserver runs
// here. It speaks the API's wire format (list with continue tokens and resourceVersion, watch
// streams of JSON events with bookmarks, 410 Gone as a status or an ERROR event) and lets a
// test cut a watch, expire resource versions, refuse with 403 and check the bearer token.
package kubefake

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Endpoint is one endpoint of a slice: its addresses and conditions (nil: unset).
type Endpoint struct {
	Addresses   []string
	Ready       *bool
	Terminating *bool
}

// Slice is one EndpointSlice of the Service: named ports and endpoints.
type Slice struct {
	Name      string
	Ports     map[string]int32
	Endpoints []Endpoint
}

// Bool returns a pointer to v, for Endpoint conditions.
func Bool(v bool) *bool { return &v }

// Server is the fake API. Its exported fields may be changed while it runs only through the
// setters.
type Server struct {
	*httptest.Server
	namespace, service string

	mu        sync.Mutex
	rv        int
	compacted int // watches from a resourceVersion below this get 410
	slices    map[string]Slice
	sliceRV   map[string]int
	history   []event
	watchers  map[chan event]struct{}
	token     string // expected bearer token ("": not checked)
	forbidden bool
	pageSize  int

	stop     chan struct{} // closed by Shutdown: open watches end
	stopOnce sync.Once

	Lists, Watches atomic.Int64
	// Tokens are the bearer tokens seen, in order (for rotation tests).
	tokensMu sync.Mutex
	tokens   []string
}

type event struct {
	typ  string // ADDED, MODIFIED, DELETED, BOOKMARK, ERROR, or "sever"
	rv   int
	body []byte
}

// New starts a fake API for the slices of service in namespace.
func New(namespace, service string) *Server {
	s := &Server{namespace: namespace, service: service, rv: 100, slices: map[string]Slice{},
		sliceRV: map[string]int{}, watchers: map[chan event]struct{}{}, stop: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(s.handle))
	return s
}

// Shutdown ends the open watches and closes the server (httptest's Close alone would wait
// for the watches forever).
func (s *Server) Shutdown() {
	s.stopOnce.Do(func() { close(s.stop) })
	s.Close()
}

// SetToken makes the server require Authorization: Bearer token ("" stops checking).
func (s *Server) SetToken(token string) { s.mu.Lock(); s.token = token; s.mu.Unlock() }

// SetForbidden makes every request answer 403, as without the RBAC Role.
func (s *Server) SetForbidden(v bool) { s.mu.Lock(); s.forbidden = v; s.mu.Unlock() }

// SetPageSize makes lists answer in pages of n slices with continue tokens (0: one page).
func (s *Server) SetPageSize(n int) { s.mu.Lock(); s.pageSize = n; s.mu.Unlock() }

// Tokens returns the bearer tokens requests carried, in order.
func (s *Server) Tokens() []string {
	s.tokensMu.Lock()
	defer s.tokensMu.Unlock()
	return append([]string(nil), s.tokens...)
}

// Put creates or replaces a slice and tells the watchers (ADDED or MODIFIED).
func (s *Server) Put(sl Slice) {
	s.mu.Lock()
	defer s.mu.Unlock()
	typ := "MODIFIED"
	if _, ok := s.slices[sl.Name]; !ok {
		typ = "ADDED"
	}
	s.rv++
	s.slices[sl.Name], s.sliceRV[sl.Name] = sl, s.rv
	s.broadcastLocked(event{typ: typ, rv: s.rv, body: s.objectLocked(sl, s.rv)})
}

// Delete removes a slice and tells the watchers (DELETED).
func (s *Server) Delete(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sl, ok := s.slices[name]
	if !ok {
		return
	}
	delete(s.slices, name)
	delete(s.sliceRV, name)
	s.rv++
	s.broadcastLocked(event{typ: "DELETED", rv: s.rv, body: s.objectLocked(sl, s.rv)})
}

// DeleteUnseen removes a slice without telling the watchers, as when its DELETED event fell
// in a gap the watch never delivered: only a re-list shows it is gone.
func (s *Server) DeleteUnseen(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.slices, name)
	delete(s.sliceRV, name)
	s.rv++
	s.compacted = s.rv // the gap cannot be watched across
}

// Bookmark sends a BOOKMARK with the current resourceVersion to every watcher.
func (s *Server) Bookmark() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rv++
	body := fmt.Sprintf(`{"kind":"EndpointSlice","apiVersion":"discovery.k8s.io/v1","metadata":{"resourceVersion":"%d"}}`, s.rv)
	s.broadcastLocked(event{typ: "BOOKMARK", rv: s.rv, body: []byte(body)})
}

// Expire compacts history: every open watch gets an ERROR event with a 410 status, and a
// watch from an older resourceVersion gets 410 Gone.
func (s *Server) Expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rv++
	s.compacted = s.rv
	s.history = nil
	body := `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too old resource version","reason":"Expired","code":410}`
	for ch := range s.watchers {
		trySend(ch, event{typ: "ERROR", body: []byte(body)})
	}
}

// Sever cuts every open watch mid-stream (the connection drops without the closing chunk).
func (s *Server) Sever() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.watchers {
		trySend(ch, event{typ: "sever"})
	}
}

// EndWatches ends every open watch cleanly, as the API does at the watch's timeoutSeconds.
func (s *Server) EndWatches() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.watchers {
		trySend(ch, event{typ: "end"})
	}
}

// WatcherCount is the number of open watches.
func (s *Server) WatcherCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.watchers)
}

func trySend(ch chan event, ev event) {
	select {
	case ch <- ev:
	default: // a watcher this far behind is cut by its full channel's close below
	}
}

func (s *Server) broadcastLocked(ev event) {
	s.history = append(s.history, ev)
	if len(s.history) > 256 { // enough for a watch to resume; a soak must not grow it
		s.history = append(s.history[:0:0], s.history[len(s.history)-256:]...)
		s.compacted = s.history[0].rv - 1
	}
	for ch := range s.watchers {
		trySend(ch, ev)
	}
}

func (s *Server) objectLocked(sl Slice, rv int) []byte {
	type port struct {
		Name     string `json:"name"`
		Port     int32  `json:"port"`
		Protocol string `json:"protocol"`
	}
	type cond struct {
		Ready       *bool `json:"ready,omitempty"`
		Serving     *bool `json:"serving,omitempty"`
		Terminating *bool `json:"terminating,omitempty"`
	}
	type ep struct {
		Addresses  []string `json:"addresses"`
		Conditions cond     `json:"conditions"`
	}
	names := make([]string, 0, len(sl.Ports))
	for n := range sl.Ports {
		names = append(names, n)
	}
	sort.Strings(names)
	ports := make([]port, 0, len(names))
	for _, n := range names {
		ports = append(ports, port{Name: n, Port: sl.Ports[n], Protocol: "TCP"})
	}
	eps := make([]ep, 0, len(sl.Endpoints))
	for _, e := range sl.Endpoints {
		eps = append(eps, ep{Addresses: e.Addresses, Conditions: cond{Ready: e.Ready, Serving: e.Ready, Terminating: e.Terminating}})
	}
	obj := map[string]any{
		"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
		"metadata": map[string]any{"name": sl.Name, "namespace": s.namespace, "resourceVersion": strconv.Itoa(rv),
			"labels": map[string]string{"kubernetes.io/service-name": s.service}},
		"addressType": "IPv4", "endpoints": eps, "ports": ports,
	}
	b, _ := json.Marshal(obj)
	return b
}

func writeStatus(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":%q,"reason":%q,"code":%d}`, msg, reason, code)
}

func (s *Server) handle(w http.ResponseWriter, r *http.Request) {
	tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	s.tokensMu.Lock()
	if len(s.tokens) >= 64 {
		s.tokens = append(s.tokens[:0:0], s.tokens[32:]...) // keep the latest
	}
	s.tokens = append(s.tokens, tok)
	s.tokensMu.Unlock()
	s.mu.Lock()
	want, forbidden := s.token, s.forbidden
	s.mu.Unlock()
	if want != "" && tok != want {
		writeStatus(w, http.StatusUnauthorized, "Unauthorized", "Unauthorized")
		return
	}
	if forbidden {
		writeStatus(w, http.StatusForbidden, "Forbidden", `endpointslices.discovery.k8s.io is forbidden: User "system:serviceaccount:`+s.namespace+`:kvgate" cannot list resource "endpointslices" in API group "discovery.k8s.io" in the namespace "`+s.namespace+`"`)
		return
	}
	path := "/apis/discovery.k8s.io/v1/namespaces/" + s.namespace + "/endpointslices"
	if r.URL.Path != path || r.URL.Query().Get("labelSelector") != "kubernetes.io/service-name="+s.service {
		writeStatus(w, http.StatusNotFound, "NotFound", "not found: "+r.URL.String())
		return
	}
	if r.URL.Query().Get("watch") == "1" {
		s.watch(w, r)
		return
	}
	s.list(w, r)
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	s.Lists.Add(1)
	s.mu.Lock()
	names := make([]string, 0, len(s.slices))
	for n := range s.slices {
		names = append(names, n)
	}
	sort.Strings(names)
	start := 0
	if c := r.URL.Query().Get("continue"); c != "" {
		start, _ = strconv.Atoi(c)
	}
	end := len(names)
	next := ""
	if s.pageSize > 0 && start+s.pageSize < end {
		end = start + s.pageSize
		next = strconv.Itoa(end)
	}
	items := make([]json.RawMessage, 0, end-start)
	for _, n := range names[min(start, len(names)):end] {
		items = append(items, s.objectLocked(s.slices[n], s.sliceRV[n]))
	}
	rv := s.rv
	s.mu.Unlock()
	b, _ := json.Marshal(map[string]any{"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
		"metadata": map[string]any{"resourceVersion": strconv.Itoa(rv), "continue": next}, "items": items})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

func (s *Server) watch(w http.ResponseWriter, r *http.Request) {
	s.Watches.Add(1)
	from, err := strconv.Atoi(r.URL.Query().Get("resourceVersion"))
	if err != nil {
		writeStatus(w, http.StatusBadRequest, "BadRequest", "resourceVersion required")
		return
	}
	ch := make(chan event, 4096)
	s.mu.Lock()
	if from < s.compacted {
		s.mu.Unlock()
		writeStatus(w, http.StatusGone, "Expired", fmt.Sprintf("too old resource version: %d (%d)", from, s.compacted))
		return
	}
	for _, ev := range s.history {
		if ev.rv > from {
			ch <- ev
		}
	}
	s.watchers[ch] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.watchers, ch)
		s.mu.Unlock()
	}()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Transfer-Encoding", "chunked")
	w.WriteHeader(http.StatusOK)
	fl := w.(http.Flusher)
	fl.Flush()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-s.stop:
			return
		case ev := <-ch:
			if ev.typ == "end" {
				return
			}
			if ev.typ == "sever" {
				// Half an event, then the connection drops: the client sees an unexpected EOF.
				_, _ = w.Write([]byte(`{"type":"MODIFIED","object":{"kind":`))
				fl.Flush()
				panic(http.ErrAbortHandler)
			}
			fmt.Fprintf(w, `{"type":%q,"object":%s}`+"\n", ev.typ, ev.body)
			fl.Flush()
			if ev.typ == "ERROR" {
				return
			}
		}
	}
}
