package chat

import (
	"bytes"
	"container/list"
	"fmt"
	"sync"

	"github.com/ardanlabs/jinja"
	"github.com/zeebo/xxh3"
)

// Agentic clients re-send the whole history every turn, byte for byte. messageCache keeps the
// preprocessed form of each message (vLLM's normalisation applied, ready for the template)
// keyed by the message's raw JSON bytes and the content format, so a new turn decodes only its
// new messages. A hit requires the stored bytes to equal the request's bytes, so the cache can
// never change a result; entries are LRU-evicted beyond a byte budget.
type messageCache struct {
	mu       sync.Mutex
	maxBytes int64
	size     int64
	lru      *list.List               // of *msgEntry, most recent first
	byKey    map[uint64]*list.Element // xxh3(format, raw) → entry
}

type msgEntry struct {
	key    uint64
	format ContentFormat
	raw    []byte
	msg    jinja.Value
}

// entryOverhead approximates the decoded value's size beside its raw bytes.
const entryOverhead = 256

func newMessageCache(maxBytes int64) *messageCache {
	if maxBytes <= 0 {
		return nil
	}
	return &messageCache{maxBytes: maxBytes, lru: list.New(), byKey: map[uint64]*list.Element{}}
}

func msgKey(format ContentFormat, raw []byte) uint64 {
	return xxh3.HashSeed(raw, uint64(len(format)))
}

func (c *messageCache) get(format ContentFormat, raw []byte) (jinja.Value, bool) {
	if c == nil {
		return jinja.Undefined(), false
	}
	k := msgKey(format, raw)
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[k]
	if !ok {
		return jinja.Undefined(), false
	}
	e := el.Value.(*msgEntry)
	if e.format != format || !bytes.Equal(e.raw, raw) {
		return jinja.Undefined(), false
	}
	c.lru.MoveToFront(el)
	return e.msg, true
}

func (c *messageCache) put(format ContentFormat, raw []byte, msg jinja.Value) {
	if c == nil {
		return
	}
	cost := int64(2*len(raw) + entryOverhead) // raw copy + decoded strings
	if cost > c.maxBytes/4 {
		return // one huge message must not flush everything else
	}
	k := msgKey(format, raw)
	e := &msgEntry{key: k, format: format, raw: bytes.Clone(raw), msg: msg}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.byKey[k]; ok {
		c.size -= int64(2*len(old.Value.(*msgEntry).raw) + entryOverhead)
		c.lru.Remove(old)
	}
	c.byKey[k] = c.lru.PushFront(e)
	c.size += cost
	for c.size > c.maxBytes {
		last := c.lru.Back()
		le := last.Value.(*msgEntry)
		c.lru.Remove(last)
		delete(c.byKey, le.key)
		c.size -= int64(2*len(le.raw) + entryOverhead)
	}
}

// conversationFromRaw builds the conversation from the raw JSON of each message, through the
// cache. When the template can mutate values (copy is set: it calls update, append, pop, ...)
// cached messages are deep-copied so the cache cannot be corrupted.
func (c *messageCache) conversationFromRaw(raws [][]byte, format ContentFormat, copyMsgs bool) ([]jinja.Value, error) {
	share := func(v jinja.Value) jinja.Value {
		if copyMsgs {
			return deepCopy(v)
		}
		return v
	}
	conv := make([]jinja.Value, len(raws))
	for i, raw := range raws {
		if msg, ok := c.get(format, raw); ok {
			conv[i] = share(msg)
			continue
		}
		v, err := parseJSON(raw)
		if err != nil {
			return nil, &RequestError{Message: fmt.Sprintf("messages[%d] is not valid JSON: %v", i, err), Param: fmt.Sprintf("messages[%d]", i), Err: err}
		}
		msg, err := buildMessage(v, i, format)
		if err != nil {
			return nil, err
		}
		if err := normalizeToolCalls(msg.AsDict()); err != nil {
			return nil, err
		}
		c.put(format, raw, msg)
		conv[i] = share(msg)
	}
	return conv, nil
}

// mutatingMethods are the Python list/dict methods that change their receiver.
var mutatingMethods = map[string]bool{
	"update": true, "append": true, "pop": true, "extend": true, "insert": true, "clear": true,
	"setdefault": true, "remove": true, "sort": true, "reverse": true, "popitem": true,
}

// mayMutate reports whether a template calls a method that mutates a list or dict in place
// (`.append(`, `.update(`, ...) or assigns an attribute of something other than a namespace;
// only then must cached messages be copied per render.
func mayMutate(src string) bool {
	tags, err := lexTags(src)
	if err != nil {
		return true
	}
	namespaces := map[string]bool{}
	for _, t := range tags {
		if t.stmt && len(t.toks) >= 4 && t.toks[0].text == "set" && t.toks[2].text == "=" && t.toks[3].text == "namespace" {
			namespaces[t.toks[1].text] = true
		}
	}
	for _, t := range tags {
		// {% set x.attr = ... %} on anything but a namespace would write into a shared dict.
		if t.stmt && len(t.toks) >= 3 && t.toks[0].text == "set" && t.toks[2].text == "." && !namespaces[t.toks[1].text] {
			return true
		}
		for i := 0; i+2 < len(t.toks); i++ {
			if t.toks[i].text == "." && t.toks[i+1].kind == tokName && mutatingMethods[t.toks[i+1].text] && t.toks[i+2].text == "(" {
				return true
			}
		}
	}
	return false
}

// MessageCacheMemory reports the preprocessed-message cache's accounted bytes and its byte
// budget (TemplateOptions.MessageCacheBytes; both 0 when the cache is off).
func (t *Template) MessageCacheMemory() (used, budget int64) {
	c := t.msgs
	if c == nil {
		return 0, 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.size, c.maxBytes
}
