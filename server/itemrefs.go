package server

import (
	"bytes"
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/kvgate/kvgate/apireq"
	"github.com/kvgate/kvgate/internal/jsonobj"
	"github.com/kvgate/kvgate/router"
)

// Responses API item references. OpenAI clients that store their responses (the AI SDK, by
// default) send the output items of earlier turns back as {"type": "item_reference", "id": ...}
// instead of the items themselves. vLLM has no mapping for them, but the worker that produced
// the response stores it whole (GET /v1/responses/{id}), and the gateway pins that worker: so
// the gateway notes which stored response each output item belongs to as it relays the
// response, and before routing a request that references items it fetches those responses
// from their workers and puts the items in place of the references. A reference it cannot
// resolve is a 400 that names the item and the store: false workaround.

// itemFetchTimeout bounds fetching one stored response from its worker.
const itemFetchTimeout = 10 * time.Second

// itemIndex is a bounded LRU of output item id → the id of the stored response holding it.
type itemIndex struct {
	max int // 0: nothing is remembered

	mu  sync.Mutex
	lru *list.List // of itemEntry, most recent at the front
	ids map[string]*list.Element
}

type itemEntry struct{ item, response string }

func newItemIndex(max int) *itemIndex {
	return &itemIndex{max: max, lru: list.New(), ids: map[string]*list.Element{}}
}

// put notes that the stored response holds items.
func (x *itemIndex) put(response string, items []string) {
	if x == nil || x.max <= 0 || response == "" {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, it := range items {
		if it == "" {
			continue
		}
		if el, ok := x.ids[it]; ok {
			el.Value = itemEntry{it, response}
			x.lru.MoveToFront(el)
			continue
		}
		x.ids[it] = x.lru.PushFront(itemEntry{it, response})
	}
	for x.lru.Len() > x.max {
		old := x.lru.Back()
		x.lru.Remove(old)
		delete(x.ids, old.Value.(itemEntry).item)
	}
}

// get is the stored response holding item.
func (x *itemIndex) get(item string) (string, bool) {
	if x == nil {
		return "", false
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	el, ok := x.ids[item]
	if !ok {
		return "", false
	}
	x.lru.MoveToFront(el)
	return el.Value.(itemEntry).response, true
}

// outputItemIDs are the ids of a response object's output items.
func outputItemIDs(output []struct {
	ID string `json:"id"`
}) []string {
	ids := make([]string, 0, len(output))
	for _, o := range output {
		ids = append(ids, o.ID)
	}
	return ids
}

// resolveItemReferences returns body with every item_reference input item replaced by the
// item it names, fetched from the stored response that holds it; a body without references is
// returned as is. Only "input" changes; the other fields keep their bytes and order.
func (s *Server) resolveItemReferences(ctx context.Context, body []byte, h http.Header, owner string) ([]byte, *apiError) {
	if !bytes.Contains(body, []byte(apireq.ItemReference)) {
		return body, nil
	}
	fields, err := topLevelFields(body)
	if err != nil {
		return body, nil // the parser answers malformed bodies
	}
	at := -1
	for i, f := range fields {
		if f.key == "input" {
			at = i
		}
	}
	if at < 0 {
		return body, nil
	}
	var items []json.RawMessage
	if json.Unmarshal(fields[at].value, &items) != nil {
		return body, nil
	}
	fetched := map[string]map[string]json.RawMessage{} // response id → its output items by id
	changed := false
	for i, raw := range items {
		var ref struct {
			Type string `json:"type"`
			ID   string `json:"id"`
		}
		if json.Unmarshal(raw, &ref) != nil || ref.Type != apireq.ItemReference {
			continue
		}
		item, reason := s.referencedItem(ctx, ref.ID, fetched, h, owner)
		if item == nil {
			e := &apireq.UnresolvedReferenceError{Index: i, ID: ref.ID, Reason: reason}
			return nil, &apiError{Status: http.StatusBadRequest, Param: "input", errType: "invalid_request_error", Message: e.Error()}
		}
		items[i], changed = item, true
	}
	if !changed {
		return body, nil
	}
	input, err := json.Marshal(items)
	if err != nil {
		return nil, &apiError{Status: http.StatusInternalServerError, Message: "re-encoding input: " + err.Error()}
	}
	fields[at].value = input
	return joinFields(fields), nil
}

// referencedItem is the output item id, fetched (once per request and response) from the
// worker storing the response that holds it; nil with the reason when it cannot be had.
func (s *Server) referencedItem(ctx context.Context, id string, fetched map[string]map[string]json.RawMessage, h http.Header, owner string) (json.RawMessage, string) {
	resp, ok := s.items.get(id)
	if !ok {
		return nil, errNoStoredResponse
	}
	out, ok := fetched[resp]
	if !ok {
		var reason string
		if out, reason = s.fetchOutput(ctx, resp, h, owner); out == nil {
			return nil, reason
		}
		fetched[resp] = out
	}
	item, ok := out[id]
	if !ok {
		return nil, errNoStoredResponse
	}
	return item, ""
}

// errNoStoredResponse is the reason given for an item no stored response of the client's
// holds: the same whether the gateway never saw it, or it belongs to another client key (whose
// responses are never looked up), or its worker is gone.
const errNoStoredResponse = "no stored response this gateway can reach for you holds it"

// fetchOutput reads a stored response's output items from the worker it is pinned to; the pin
// is owner's or it is not found (router.Request.Owner).
func (s *Server) fetchOutput(ctx context.Context, response string, h http.Header, owner string) (map[string]json.RawMessage, string) {
	// The response id names no model: the pool whose router pinned it holds it.
	var (
		p    *pool
		d    router.Decision
		life router.Lifecycle
		err  error = router.ErrUnknownResponse
	)
	for _, p = range s.pools {
		rreq := &router.Request{Model: p.Model, BlockSize: p.BlockSize, PinResponseID: response, Owner: owner, Header: h}
		if d, life, err = p.Router.Route(ctx, rreq, candidates(p, "", nil)); err == nil {
			break
		}
	}
	if err != nil {
		return nil, errNoStoredResponse
	}
	w := p.Registry.Get(d.Chosen.Worker)
	if w == nil {
		life.Failed(errors.New("unknown worker"))
		return nil, errNoStoredResponse
	}
	ctx, cancel := context.WithTimeout(ctx, itemFetchTimeout)
	defer cancel()
	up, err := http.NewRequestWithContext(ctx, http.MethodGet, w.Endpoint(pathResponses+"/"+url.PathEscape(response), ""), nil)
	if err != nil {
		life.Failed(err)
		return nil, err.Error()
	}
	w.Authorize(up.Header)
	life.Sent()
	res, err := w.Client().Do(up)
	if err != nil {
		life.Failed(err)
		return nil, fmt.Sprintf("fetching the stored response from its worker failed: %v", err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, int64(s.cfg.Proxy.MaxBodyBytes)+1))
	life.Done()
	if err != nil || res.StatusCode != http.StatusOK {
		return nil, fmt.Sprintf("the worker storing it answered %d", res.StatusCode)
	}
	var obj struct {
		Output []json.RawMessage `json:"output"`
	}
	if json.Unmarshal(raw, &obj) != nil {
		return nil, "the worker storing it did not answer with a response object"
	}
	out := make(map[string]json.RawMessage, len(obj.Output))
	for _, o := range obj.Output {
		var it struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(o, &it) == nil && it.ID != "" {
			out[it.ID] = o
		}
	}
	return out, ""
}

// field is one top-level key of a JSON object and its value's bytes.
type field struct {
	key   string
	value json.RawMessage
}

// topLevelFields splits a JSON object into its fields, in order.
func topLevelFields(body []byte) ([]field, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	t, err := dec.Token()
	if err != nil || t != json.Delim('{') {
		return nil, errors.New("not a JSON object")
	}
	var out []field
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil, err
		}
		k, _ := kt.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		out = append(out, field{k, v})
	}
	return out, nil
}

// joinFields writes the fields back as one JSON object.
func joinFields(fields []field) []byte {
	var w jsonobj.Writer
	for _, f := range fields {
		w.Raw(f.key, f.value)
	}
	return w.Bytes()
}
