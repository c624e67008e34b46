// Package engine is a pure-Go implementation of HF tokenizers' tokenizer.json pipeline (added
// tokens, normalizers, pre-tokenizers, BPE, post-processors, decoders). It produces the same ids
// as the Rust library for the models kvgate serves, and caches encoded segments so that a
// conversation re-sent with a new tail only pays for the tail.
package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"unicode/utf8"
	"unsafe"
)

// Tokenizer is a loaded tokenizer.json. It is safe for concurrent use.
type Tokenizer struct {
	model      *bpe
	norm       normalizer
	pre        preTokenizer
	post       postProcessor
	dec        decoder
	added      []addedToken
	addedByID  map[uint32]int32
	rawTrie    *tokenTrie // added tokens matched on the raw text (normalized=false)
	normTrie   *tokenTrie // added tokens matched after normalization (normalized=true)
	segments   *segmentCache
	startAware bool // the pipeline depends on a segment starting the input (Metaspace "first")
	pool       sync.Pool
	bl         *byteLevelTables
	// boundOnce computes maxTokenBytes (see tokenBytesBound) on the first limited encode.
	boundOnce     sync.Once
	maxTokenBytes int
	window        int // pre-tokenizer window; 0: windowBytes (tests set a small one)
}

// Option configures Load.
type Option func(*config)

type config struct {
	segmentCacheBytes int
	pieceCacheEntries int
	ignoreConfig      bool
}

// WithoutTokenizerConfig makes Load ignore tokenizer_config.json and behave exactly like HF
// tokenizers on tokenizer.json alone (the golden tests compare against that library).
func WithoutTokenizerConfig() Option {
	return func(c *config) { c.ignoreConfig = true }
}

// WithSegmentCache caches encoded segments (text between added tokens) in an LRU bounded to
// maxBytes; 0 disables it. Results never depend on the cache.
func WithSegmentCache(maxBytes int) Option {
	return func(c *config) { c.segmentCacheBytes = maxBytes }
}

// WithPieceCache bounds the cache of pre-token ids to about entries; 0 disables it.
func WithPieceCache(entries int) Option {
	return func(c *config) { c.pieceCacheEntries = entries }
}

// workspace holds per-call scratch buffers, recycled through a sync.Pool.
type workspace struct {
	pieces    []piece
	seqBufs   [][]piece
	seqDepth  int
	spans     []span
	parts     []part
	parts2    []part
	syms      []symbol
	heap      []mergeCand
	smallIDs  []uint32
	smallCand []uint64
	splits    []addedSplit
	splits2   []addedSplit
	// limit and maxTokenBytes are the current EncodeLimit call's (0: no limit).
	limit         int
	maxTokenBytes int
}

// Load reads dir/tokenizer.json (a path to the file itself is accepted too) and, unless
// WithoutTokenizerConfig, applies the parts of dir/tokenizer_config.json that transformers applies
// on top (add_bos_token / add_eos_token for Llama- and Gemma-class tokenizers), so that ids match
// what vLLM computes.
func Load(dir string, opts ...Option) (*Tokenizer, error) {
	path := dir
	if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
		path = filepath.Join(dir, "tokenizer.json")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	t, err := FromJSON(data, opts...)
	if err != nil {
		return nil, fmt.Errorf("engine: %s: %w", path, err)
	}
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	if !cfg.ignoreConfig {
		if err := t.applyTokenizerConfig(filepath.Dir(path)); err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
	}
	return t, nil
}

// FromJSON builds a tokenizer from the contents of a tokenizer.json.
func FromJSON(data []byte, opts ...Option) (tk *Tokenizer, err error) {
	defer recoverMatchError(&err)
	cfg := config{pieceCacheEntries: 1 << 16}
	for _, o := range opts {
		o(&cfg)
	}
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("parse tokenizer.json: %w", err)
	}
	if !isNull(f.Truncation) || !isNull(f.Padding) {
		return nil, unsupported("setting", "truncation/padding")
	}
	t := &Tokenizer{addedByID: make(map[uint32]int32, len(f.AddedTokens))}
	var byteLevel bool
	if t.pre, byteLevel, err = buildPreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if t.norm, err = buildNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	bl := newByteLevelTables()
	t.bl = bl
	var vocab map[string]uint32
	if t.model, vocab, err = buildBPE(f.Model, byteLevel, bl, cfg.pieceCacheEntries); err != nil {
		return nil, err
	}
	if t.post, err = buildPostProcessor(f.PostProcessor); err != nil {
		return nil, err
	}
	if t.dec, err = buildDecoder(f.Decoder, bl); err != nil {
		return nil, err
	}
	t.startAware = strings.Contains(string(f.PreTokenizer), `"first"`)
	t.buildAdded(f.AddedTokens, vocab)
	t.segments = newSegmentCache(cfg.segmentCacheBytes)
	t.pool.New = func() any { return new(workspace) }
	return t, nil
}

// buildAdded registers the added tokens the way HF's deserializer does: the ids written in the
// file are not trusted; a content already in the vocabulary (or added before) keeps that id, a
// new one gets the next id after the vocabulary and the added tokens so far.
func (t *Tokenizer) buildAdded(list []addedTokenJSON, vocab map[string]uint32) {
	t.rawTrie, t.normTrie = newTokenTrie(), newTokenTrie()
	byContent := make(map[string]uint32, len(list))
	maxAdded, haveAdded := uint32(0), false
	vocabSize := uint32(len(vocab))
	for _, a := range list {
		if a.Content == "" {
			continue
		}
		id, ok := byContent[a.Content]
		if !ok {
			id, ok = vocab[a.Content]
		}
		if !ok {
			id = vocabSize
			if haveAdded && (maxAdded >= vocabSize || vocabSize == 0) {
				id = maxAdded + 1
			}
		}
		byContent[a.Content] = id
		if !haveAdded || id > maxAdded {
			maxAdded, haveAdded = id, true
		}
		tok := addedToken{
			id: id, content: a.Content, singleWord: a.SingleWord, lstrip: a.LStrip, rstrip: a.RStrip,
			special: a.Special, normalized: a.Normalized,
		}
		if idx, dup := t.addedByID[id]; dup {
			t.added[idx] = tok // a later entry for the same id replaces the earlier one
			continue
		}
		t.addedByID[id] = int32(len(t.added))
		t.added = append(t.added, tok)
	}
	var hasRaw, hasNorm bool
	for idx, a := range t.added {
		if a.normalized {
			content := a.content
			if t.norm != nil {
				content = t.norm.normalize(content)
			}
			t.normTrie.insert(content, int32(idx))
			hasNorm = true
		} else {
			t.rawTrie.insert(a.content, int32(idx))
			hasRaw = true
		}
	}
	if !hasRaw {
		t.rawTrie = nil
	}
	if !hasNorm {
		t.normTrie = nil
	}
}

// Encode tokenizes text. With addSpecialTokens the post-processor adds its special tokens (BOS
// for Llama 3 and Gemma 3). Ill-formed UTF-8 is replaced with U+FFFD first.
func (t *Tokenizer) Encode(text string, addSpecialTokens bool) (ids []uint32, err error) {
	return t.encode(text, addSpecialTokens, 0)
}

// LimitError is returned by EncodeLimit when the text has more tokens than the limit. Encoding
// stopped as soon as that was certain, so AtLeast is a lower bound of the true count (> Limit).
type LimitError struct {
	Limit   int
	AtLeast int
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("engine: text has at least %d tokens, over the limit of %d", e.AtLeast, e.Limit)
}

// EncodeLimit is Encode that gives up with a *LimitError as soon as the result is known to
// exceed limit tokens, so the work done is bounded by the limit rather than by len(text).
// Within the limit its ids equal Encode's. limit <= 0 means no limit.
func (t *Tokenizer) EncodeLimit(text string, addSpecialTokens bool, limit int) ([]uint32, error) {
	return t.encode(text, addSpecialTokens, limit)
}

func (t *Tokenizer) encode(text string, addSpecialTokens bool, limit int) (ids []uint32, err error) {
	defer recoverMatchError(&err)
	text = validUTF8(text)
	ws := t.pool.Get().(*workspace)
	defer t.pool.Put(ws)
	ws.limit = max(limit, 0)
	if ws.limit > 0 {
		ws.maxTokenBytes = t.tokenBytesBound()
	}
	capacity := len(text)/3 + 8
	if ws.limit > 0 {
		capacity = min(capacity, ws.limit+8)
	}
	ids = make([]uint32, 0, capacity)
	if t.rawTrie == nil {
		ids, err = t.encodeSegment(ids, text, true, ws)
	} else {
		splits := t.rawTrie.split(ws.splits[:0], text, t.added)
		ws.splits = splits
		for _, sp := range splits {
			if sp.tok >= 0 {
				ids = append(ids, t.added[sp.tok].id)
				if err = ws.check(len(ids)); err != nil {
					break
				}
				continue
			}
			if ids, err = t.encodeSegment(ids, text[sp.start:sp.end], sp.start == 0, ws); err != nil {
				break
			}
		}
		if len(ws.splits) > maxPooledSpans {
			ws.splits = nil // do not keep a huge buffer alive in the pool
		}
	}
	var le *LimitError
	if errors.As(err, &le) {
		return nil, le
	}
	if err != nil {
		return nil, fmt.Errorf("engine: encode: %w", err)
	}
	if addSpecialTokens && t.post != nil {
		ids = t.post.process(make([]uint32, 0, len(ids)+4), ids)
	}
	if limit > 0 && len(ids) > limit {
		return nil, &LimitError{Limit: limit, AtLeast: len(ids)}
	}
	return ids, nil
}

// check reports a *LimitError once n tokens exceed the workspace's limit.
func (ws *workspace) check(n int) error {
	if ws.limit > 0 && n > ws.limit {
		return &LimitError{Limit: ws.limit, AtLeast: n}
	}
	return nil
}

// maxPooledSpans bounds the scratch slices a workspace keeps between calls.
const maxPooledSpans = 1 << 16

// windowBytes is how much of one segment is pre-tokenized at a time. Pre-tokenizing a long
// segment whole costs tens of bytes of pieces and spans per input byte.
const windowBytes = 64 << 10

// windowSize is windowBytes, or the window a test set.
func (t *Tokenizer) windowSize() int {
	if t.window > 0 {
		return t.window
	}
	return windowBytes
}

// tokenBytesBound returns an upper bound of the input bytes one token can cover (the longest
// vocabulary entry, at least one UTF-8 character), or 0 when there is none: with fuse_unk a
// single unknown token covers any run of unknown characters.
func (t *Tokenizer) tokenBytesBound() int {
	t.boundOnce.Do(func() {
		if t.model.fuseUnk && t.model.unkID >= 0 {
			return
		}
		n := utf8.UTFMax
		for k := range t.model.vocab {
			n = max(n, len(k))
		}
		t.maxTokenBytes = n
	})
	return t.maxTokenBytes
}

// encodeSegment encodes text that contains no raw-matched added token, through the segment cache.
func (t *Tokenizer) encodeSegment(dst []uint32, seg string, atStart bool, ws *workspace) ([]uint32, error) {
	cacheable := t.segments != nil && !(atStart && t.startAware)
	if cacheable {
		if ids, ok := t.segments.get(seg); ok {
			dst = append(dst, ids...)
			return dst, ws.check(len(dst))
		}
	}
	start := len(dst)
	dst, err := t.encodeUncached(dst, seg, atStart, ws)
	if err != nil {
		return dst[:start], err
	}
	if cacheable {
		t.segments.put(seg, dst[start:])
	}
	return dst, nil
}

func (t *Tokenizer) encodeUncached(dst []uint32, seg string, atStart bool, ws *workspace) ([]uint32, error) {
	s := seg
	if t.norm != nil {
		s = t.norm.normalize(s)
	}
	if t.normTrie == nil {
		return t.encodeText(dst, s, atStart, ws)
	}
	splits := t.normTrie.split(ws.splits2[:0], s, t.added)
	// encodeText does not touch splits2, so iterating it here is safe.
	ws.splits2 = splits
	var err error
	for _, sp := range splits {
		if sp.tok >= 0 {
			dst = append(dst, t.added[sp.tok].id)
			if err = ws.check(len(dst)); err != nil {
				return dst, err
			}
			continue
		}
		if dst, err = t.encodeText(dst, s[sp.start:sp.end], atStart && sp.start == 0, ws); err != nil {
			return dst, err
		}
	}
	if len(ws.splits2) > maxPooledSpans {
		ws.splits2 = nil
	}
	return dst, nil
}

// encodeText pre-tokenizes normalized text and runs the model on each piece. A long text whose
// pre-tokenizer starts with a regex split is pre-tokenized window by window (encodeWindowed).
func (t *Tokenizer) encodeText(dst []uint32, s string, first bool, ws *workspace) ([]uint32, error) {
	if s == "" {
		return dst, nil
	}
	var err error
	if t.pre == nil {
		return t.encodeWord(dst, s, ws)
	}
	if len(s) > t.windowSize() {
		if head, rest, ok := splitHead(t.pre); ok {
			return t.encodeWindowed(dst, s, first, head, rest, ws)
		}
	}
	pieces := t.pre.split(ws.pieces[:0], piece{s, first}, ws)
	ws.pieces = pieces
	for _, p := range pieces {
		if dst, err = t.encodeWord(dst, p.s, ws); err != nil {
			return dst, err
		}
	}
	return dst, nil
}

// encodeWord runs the model on one pre-token, refusing first when even the longest tokens could
// not cover it within the limit.
func (t *Tokenizer) encodeWord(dst []uint32, w string, ws *workspace) ([]uint32, error) {
	if ws.limit > 0 && ws.maxTokenBytes > 0 {
		if least := len(dst) + (len(w)+ws.maxTokenBytes-1)/ws.maxTokenBytes; least > ws.limit {
			return dst, &LimitError{Limit: ws.limit, AtLeast: least}
		}
	}
	dst, err := t.model.encode(dst, w, ws)
	if err != nil {
		return dst, err
	}
	return dst, ws.check(len(dst))
}

// splitHead returns the leading regex split of a pre-tokenizer (itself, or the first stage of a
// sequence) and the stages after it.
func splitHead(pre preTokenizer) (splitPre, preTokenizer, bool) {
	switch x := pre.(type) {
	case splitPre:
		return x, nil, true
	case preSequence:
		if len(x) > 0 {
			if h, ok := x[0].(splitPre); ok {
				if len(x) == 1 {
					return h, nil, true
				}
				return h, x[1:], true
			}
		}
	}
	return splitPre{}, nil, false
}

// windowGuard is how close to a window's end a split piece may end and still be kept: the split
// patterns look at most one character past a match (e.g. `\s+(?!\S)`).
const windowGuard = 2 * utf8.UTFMax

// encodeWindowed pre-tokenizes s window by window: the leading split runs on windowBytes of
// text, the pieces that end well before the window's end are kept (their matches cannot depend
// on what follows), and the next window starts where the first dropped piece started. A regex
// split scans left to right from the end of the previous match, so restarting at a piece
// boundary finds the same pieces as one pass over the whole text; the window grows when one
// piece is longer than it. Scratch memory stays bounded by the window.
func (t *Tokenizer) encodeWindowed(dst []uint32, s string, first bool, head splitPre, rest preTokenizer, ws *workspace) ([]uint32, error) {
	var (
		heads []piece
		err   error
	)
	base := unsafe.StringData(s)
	offset := func(p string) int {
		return int(uintptr(unsafe.Pointer(unsafe.StringData(p))) - uintptr(unsafe.Pointer(base)))
	}
	w := t.windowSize()
	for a := 0; a < len(s); {
		b := min(a+w, len(s))
		for b < len(s) && !utf8.RuneStart(s[b]) {
			b--
		}
		heads = head.split(heads[:0], piece{s[a:b], first && a == 0}, ws)
		next := b
		keep := len(heads)
		if b < len(s) {
			keep = 0
			for k, p := range heads {
				if k == len(heads)-1 || offset(p.s)+len(p.s) > b-windowGuard {
					break
				}
				keep = k + 1
			}
			if keep == 0 {
				w *= 2 // one piece longer than the window: look further
				continue
			}
			next = offset(heads[keep].s)
		}
		for _, hp := range heads[:keep] {
			if rest == nil {
				dst, err = t.encodeWord(dst, hp.s, ws)
			} else {
				pieces := rest.split(ws.pieces[:0], hp, ws)
				ws.pieces = pieces
				for _, p := range pieces {
					if dst, err = t.encodeWord(dst, p.s, ws); err != nil {
						break
					}
				}
			}
			if err != nil {
				return dst, err
			}
		}
		a, w = next, t.windowSize()
	}
	return dst, nil
}

// ErrUnknownID is returned by Decode for an id that is neither in the vocabulary nor an added token.
var ErrUnknownID = errors.New("unknown token id")

// Decode turns ids back into text like HF's decode: added tokens and vocabulary entries are looked
// up, special tokens dropped when skipSpecialTokens, and the decoder chain applied.
func (t *Tokenizer) Decode(ids []uint32, skipSpecialTokens bool) (string, error) {
	tokens := make([]string, 0, len(ids))
	for _, id := range ids {
		if idx, ok := t.addedByID[id]; ok {
			if skipSpecialTokens && t.added[idx].special {
				continue
			}
			tokens = append(tokens, t.added[idx].content)
			continue
		}
		tok, ok := t.model.idToToken[id]
		if !ok {
			return "", fmt.Errorf("engine: decode: %w: %d", ErrUnknownID, id)
		}
		tokens = append(tokens, tok)
	}
	if t.dec == nil {
		return strings.Join(tokens, " "), nil
	}
	return strings.Join(t.dec.decodeChain(tokens), ""), nil
}

// TokenToID returns the id of an added token or vocabulary entry (in tokenizer.json spelling).
func (t *Tokenizer) TokenToID(token string) (uint32, bool) {
	for i := range t.added {
		if t.added[i].content == token {
			return t.added[i].id, true
		}
	}
	key := token
	if t.model.byteLevel {
		b, ok := t.bl.toBytes(token)
		if !ok {
			return 0, false
		}
		key = string(b)
	}
	id, ok := t.model.vocab[key]
	return id, ok
}

// IDToToken returns the tokenizer.json spelling of id.
func (t *Tokenizer) IDToToken(id uint32) (string, bool) {
	if idx, ok := t.addedByID[id]; ok {
		return t.added[idx].content, true
	}
	s, ok := t.model.idToToken[id]
	return s, ok
}

// SpecialTokens returns the contents of the added tokens flagged special, sorted.
func (t *Tokenizer) SpecialTokens() []string {
	var out []string
	for _, a := range t.added {
		if a.special {
			out = append(out, a.content)
		}
	}
	sort.Strings(out)
	return out
}

// CacheStats reports the segment cache's entry count and accounted bytes.
func (t *Tokenizer) CacheStats() (entries, bytes int) { return t.segments.stats() }

// SegmentCacheMemory reports the segment cache's accounted bytes and its byte budget (both 0
// when the cache is off).
func (t *Tokenizer) SegmentCacheMemory() (used, budget int64) {
	if t.segments == nil {
		return 0, 0
	}
	_, b := t.segments.stats()
	return int64(b), int64(t.segments.maxBytes)
}
