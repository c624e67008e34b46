package engine

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// bpe is HF's BPE model. Vocabulary keys are raw bytes when the pre-tokenizer is byte-level (the
// GPT-2 alphabet is mapped back at load time), UTF-8 text otherwise.
type bpe struct {
	vocab        map[string]uint32
	idToToken    map[uint32]string // original vocabulary strings, for decoding
	merges       map[uint64]uint64 // left<<32|right -> rank<<32|newID
	byteLevel    bool
	byteIDs      [256]int64 // byte-level: id of each single byte, -1 when absent
	fallbackIDs  [256]int64 // byte_fallback: id of "<0xXX>", -1 when absent
	ignoreMerges bool
	byteFallback bool
	fuseUnk      bool
	unkID        int64 // -1 when no unk token
	contPrefix   string
	eowSuffix    string
	cache        *pieceCache
	// chunkUnsafe is set for SentencePiece-style vocabularies where words can be cut before a
	// U+2581 without changing the result; it lists the characters after which that is not so.
	chunkUnsafe map[string]bool
	// runeIDs maps BMP runes to their single-character token (-1 when absent), for char-level
	// vocabularies; it saves a string-map lookup per character.
	runeIDs []int32
}

// metaspace is SentencePiece's word-boundary mark.
const metaspace = "\u2581"

func pairKey(a, b uint32) uint64 { return uint64(a)<<32 | uint64(b) }

// buildBPE also returns the vocabulary as spelled in tokenizer.json, which added-token id
// resolution needs once.
func buildBPE(raw json.RawMessage, byteLevel bool, bl *byteLevelTables, cacheEntries int) (*bpe, map[string]uint32, error) {
	m, j, err := buildBPEInner(raw, byteLevel, bl, cacheEntries)
	if err != nil {
		return nil, nil, err
	}
	return m, j.Vocab, nil
}

func buildBPEInner(raw json.RawMessage, byteLevel bool, bl *byteLevelTables, cacheEntries int) (*bpe, *bpeJSON, error) {
	var j bpeJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		// Other model types (Unigram, WordLevel, ...) have other field shapes: name the type.
		var probe struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(raw, &probe) == nil && probe.Type != "BPE" && probe.Type != "" {
			return nil, nil, unsupported("model", probe.Type)
		}
		return nil, nil, fmt.Errorf("parse model: %w", err)
	}
	if j.Type != "BPE" && !(j.Type == "" && j.Merges.set) {
		return nil, nil, unsupported("model", j.Type)
	}
	if j.Dropout != nil && *j.Dropout > 0 && *j.Dropout < 1 {
		return nil, nil, unsupported("model", "BPE with dropout")
	}
	m := &bpe{
		vocab:        make(map[string]uint32, len(j.Vocab)),
		idToToken:    make(map[uint32]string, len(j.Vocab)),
		merges:       make(map[uint64]uint64, len(j.Merges.pairs)),
		byteLevel:    byteLevel,
		ignoreMerges: j.IgnoreMerges,
		byteFallback: j.ByteFallback,
		fuseUnk:      j.FuseUnk,
		unkID:        -1,
		cache:        newPieceCache(cacheEntries),
	}
	if j.ContinuingSubwordPrefix != nil {
		m.contPrefix = *j.ContinuingSubwordPrefix
	}
	if j.EndOfWordSuffix != nil {
		m.eowSuffix = *j.EndOfWordSuffix
	}
	// key converts a vocabulary string to the engine's key space.
	key := func(tok string) (string, bool) {
		if !byteLevel {
			return tok, true
		}
		b, ok := bl.toBytes(tok)
		return string(b), ok
	}
	for tok, id := range j.Vocab {
		m.idToToken[id] = tok
		if k, ok := key(tok); ok {
			m.vocab[k] = id
		}
	}
	for b := 0; b < 256; b++ {
		m.byteIDs[b], m.fallbackIDs[b] = -1, -1
		if id, ok := m.vocab[string([]byte{byte(b)})]; ok && byteLevel {
			m.byteIDs[b] = int64(id)
		}
		if id, ok := j.Vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
			m.fallbackIDs[b] = int64(id)
		}
	}
	if j.UnkToken != nil {
		id, ok := j.Vocab[*j.UnkToken]
		if !ok {
			return nil, nil, fmt.Errorf("model: unk_token %q not in vocabulary", *j.UnkToken)
		}
		m.unkID = int64(id)
	}
	for rank, pair := range j.Merges.pairs {
		a, b := pair[0], pair[1]
		ida, oka := j.Vocab[a]
		idb, okb := j.Vocab[b]
		merged := a + strings.TrimPrefix(b, m.contPrefix)
		idm, okm := j.Vocab[merged]
		if !oka || !okb || !okm {
			return nil, nil, fmt.Errorf("model: merge %d (%q %q): token not in vocabulary", rank, a, b)
		}
		// Later duplicates overwrite earlier ones, as in HF's HashMap collect.
		m.merges[pairKey(ida, idb)] = uint64(rank)<<32 | uint64(idm)
	}
	m.chunkUnsafe = chunkUnsafeChars(&j, byteLevel)
	if !byteLevel {
		m.runeIDs = make([]int32, 0x10000)
		for i := range m.runeIDs {
			m.runeIDs[i] = -1
		}
		for tok, id := range m.vocab {
			if r, n := utf8.DecodeRuneInString(tok); n == len(tok) && r < 0x10000 && r != utf8.RuneError {
				m.runeIDs[r] = int32(id)
			}
		}
	}
	return m, &j, nil
}

// chunkUnsafeChars decides whether a word may be cut before each U+2581 that follows another
// character y. A merge can only join two symbols (A, B) if (A, B) is a merge; if no merge has B
// starting with U+2581 and A ending with y, the symbols on each side of such a cut never merge,
// so both halves can be encoded on their own (and cached). It returns the set of those y for
// which some merge does cross, or nil when the optimisation does not apply.
func chunkUnsafeChars(j *bpeJSON, byteLevel bool) map[string]bool {
	if byteLevel || j.IgnoreMerges || (j.ContinuingSubwordPrefix != nil && *j.ContinuingSubwordPrefix != "") ||
		(j.EndOfWordSuffix != nil && *j.EndOfWordSuffix != "") {
		return nil
	}
	if _, ok := j.Vocab[metaspace]; !ok {
		return nil
	}
	unsafe := map[string]bool{metaspace: true}
	for _, p := range j.Merges.pairs {
		if strings.HasPrefix(p[1], metaspace) {
			_, n := utf8.DecodeLastRuneInString(p[0])
			unsafe[p[0][len(p[0])-n:]] = true
		}
	}
	if len(unsafe) > 64 {
		return nil // too many crossings to be worth it
	}
	return unsafe
}

// encode appends the ids of one pre-token.
func (m *bpe) encode(dst []uint32, word string, ws *workspace) ([]uint32, error) {
	if word == "" {
		return dst, nil
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[word]; ok {
			return append(dst, id), nil
		}
	}
	if len(word) == 1 && m.byteLevel && m.contPrefix == "" && m.eowSuffix == "" {
		if id := m.byteIDs[word[0]]; id >= 0 {
			return append(dst, uint32(id)), nil
		}
	}
	if m.chunkUnsafe != nil && len(word) > 2*len(metaspace) {
		return m.encodeChunks(dst, word, ws)
	}
	return m.encodePiece(dst, word, ws)
}

// encodeChunks cuts a SentencePiece-style word before each safe U+2581 (see chunkUnsafeChars)
// and encodes the chunks separately, so that the piece cache works on words again.
func (m *bpe) encodeChunks(dst []uint32, word string, ws *workspace) ([]uint32, error) {
	var err error
	start, prevStart := 0, -1
	for i := 0; i < len(word); {
		r, n := utf8.DecodeRuneInString(word[i:])
		if i > start && r == '\u2581' {
			prev := word[prevStart:i]
			pr, _ := utf8.DecodeRuneInString(prev)
			inVocab := pr < 0x10000 && m.runeIDs[pr] >= 0
			if !inVocab && pr >= 0x10000 {
				_, inVocab = m.vocab[prev]
			}
			if inVocab && !m.chunkUnsafe[prev] {
				if dst, err = m.encodePiece(dst, word[start:i], ws); err != nil {
					return dst, err
				}
				start = i
			}
		}
		prevStart = i
		i += n
	}
	return m.encodePiece(dst, word[start:], ws)
}

// encodePiece encodes one word through the piece cache.
func (m *bpe) encodePiece(dst []uint32, word string, ws *workspace) ([]uint32, error) {
	if ids, ok := m.cache.get(word); ok {
		return append(dst, ids...), nil
	}
	start := len(dst)
	dst, err := m.mergeWord(dst, word, ws)
	if err != nil {
		return dst[:start], err
	}
	m.cache.put(word, dst[start:])
	return dst, nil
}

// symbol is one node of the doubly linked list a word is merged on.
type symbol struct {
	id         uint32
	prev, next int32
	removed    bool
}

// mergeCand is a queued merge: lowest rank first, then leftmost position, as in HF's BinaryHeap.
type mergeCand struct {
	rank  uint32
	pos   int32
	newID uint32
}

func (a mergeCand) less(b mergeCand) bool {
	if a.rank != b.rank {
		return a.rank < b.rank
	}
	return a.pos < b.pos
}

func (m *bpe) addInitial(syms []symbol, id uint32) []symbol {
	n := int32(len(syms))
	return append(syms, symbol{id: id, prev: n - 1, next: n + 1})
}

// initialSymbols splits word into its first symbols (bytes or characters) the way HF's
// merge_word does, including byte fallback and unknown-token fusion.
func (m *bpe) initialSymbols(syms []symbol, word string) ([]symbol, error) {
	if m.byteLevel && m.contPrefix == "" && m.eowSuffix == "" {
		for i := 0; i < len(word); i++ {
			id := m.byteIDs[word[i]]
			if id < 0 {
				return nil, fmt.Errorf("byte 0x%02x not in byte-level vocabulary", word[i])
			}
			syms = m.addInitial(syms, uint32(id))
		}
		return syms, nil
	}
	unk := int64(-1)
	var sb []byte
	for i := 0; i < len(word); {
		size := 1
		if !m.byteLevel {
			var r rune
			r, size = utf8.DecodeRuneInString(word[i:])
			if plain := m.contPrefix == "" && m.eowSuffix == ""; plain && r < 0x10000 && m.runeIDs[r] >= 0 {
				if unk >= 0 {
					syms = m.addInitial(syms, uint32(unk))
					unk = -1
				}
				syms = m.addInitial(syms, uint32(m.runeIDs[r]))
				i += size
				continue
			}
		}
		unit := word[i : i+size]
		isFirst, isLast := i == 0, i+size == len(word)
		i += size
		s := unit
		if (m.contPrefix != "" && !isFirst) || (m.eowSuffix != "" && isLast) {
			sb = sb[:0]
			if !isFirst {
				sb = append(sb, m.contPrefix...)
			}
			sb = append(sb, unit...)
			if isLast {
				sb = append(sb, m.eowSuffix...)
			}
			s = string(sb)
		}
		if id, ok := m.vocab[s]; ok {
			if unk >= 0 {
				syms = m.addInitial(syms, uint32(unk))
				unk = -1
			}
			syms = m.addInitial(syms, id)
			continue
		}
		if m.byteFallback {
			all := true
			for k := 0; k < len(s); k++ {
				if m.fallbackIDs[s[k]] < 0 {
					all = false
					break
				}
			}
			if all {
				if unk >= 0 {
					syms = m.addInitial(syms, uint32(unk))
					unk = -1
				}
				for k := 0; k < len(s); k++ {
					syms = m.addInitial(syms, uint32(m.fallbackIDs[s[k]]))
				}
				continue
			}
		}
		if m.unkID < 0 {
			return nil, fmt.Errorf("%q is not in the vocabulary and the model has no unk_token", s)
		}
		if unk >= 0 && !m.fuseUnk {
			syms = m.addInitial(syms, uint32(unk))
		}
		unk = m.unkID
	}
	if unk >= 0 {
		syms = m.addInitial(syms, uint32(unk))
	}
	return syms, nil
}

// mergeWord runs HF's merge loop (Word::merge_all) and appends the resulting ids.
func (m *bpe) mergeWord(dst []uint32, word string, ws *workspace) ([]uint32, error) {
	syms, err := m.initialSymbols(ws.syms[:0], word)
	if err != nil {
		return dst, err
	}
	ws.syms = syms
	if len(syms) == 0 {
		return dst, nil
	}
	if len(syms) <= smallWord {
		return m.mergeSmall(dst, syms, ws), nil
	}
	syms[len(syms)-1].next = -1
	h := ws.heap[:0]
	for i := 0; i+1 < len(syms); i++ {
		if v, ok := m.merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
			h = append(h, mergeCand{rank: uint32(v >> 32), pos: int32(i), newID: uint32(v)})
		}
	}
	heapInit(h)
	for len(h) > 0 {
		var top mergeCand
		top, h = heapPop(h)
		cur := &syms[top.pos]
		if cur.removed || cur.next < 0 {
			continue
		}
		nextPos := cur.next
		right := syms[nextPos]
		// Skip stale entries: the pair at pos must still merge into the same token.
		if v, ok := m.merges[pairKey(cur.id, right.id)]; !ok || uint32(v) != top.newID {
			continue
		}
		cur.id = top.newID
		cur.next = right.next
		syms[nextPos].removed = true
		if right.next >= 0 {
			syms[right.next].prev = top.pos
		}
		if cur.prev >= 0 {
			if v, ok := m.merges[pairKey(syms[cur.prev].id, cur.id)]; ok {
				h = heapPush(h, mergeCand{rank: uint32(v >> 32), pos: cur.prev, newID: uint32(v)})
			}
		}
		if cur.next >= 0 {
			if v, ok := m.merges[pairKey(cur.id, syms[cur.next].id)]; ok {
				h = heapPush(h, mergeCand{rank: uint32(v >> 32), pos: top.pos, newID: uint32(v)})
			}
		}
	}
	ws.heap = h
	for i := int32(0); i >= 0; i = syms[i].next {
		dst = append(dst, syms[i].id)
	}
	return dst, nil
}

// smallWord is the symbol count up to which mergeSmall's quadratic scan beats the heap.
const smallWord = 48

// mergeSmall is the same merge loop as the heap in mergeWord, written as a scan: repeatedly merge
// the pair with the lowest (rank, position). It is equivalent because a queued heap entry whose
// pair changed can never pass HF's staleness check: a symbol only grows by absorbing its right
// neighbour, so no later pair at that position can produce the same token.
func (m *bpe) mergeSmall(dst []uint32, syms []symbol, ws *workspace) []uint32 {
	ids := ws.smallIDs[:0]
	for _, s := range syms {
		ids = append(ids, s.id)
	}
	const none = ^uint64(0)
	// cand[i] is rank<<32|newID of the pair (ids[i], ids[i+1]), none when they do not merge.
	cand := ws.smallCand[:0]
	lookup := func(a, b uint32) uint64 {
		if v, ok := m.merges[pairKey(a, b)]; ok {
			return v
		}
		return none
	}
	for i := 0; i+1 < len(ids); i++ {
		cand = append(cand, lookup(ids[i], ids[i+1]))
	}
	for len(cand) > 0 {
		best := 0
		for i := 1; i < len(cand); i++ {
			if cand[i]>>32 < cand[best]>>32 {
				best = i
			}
		}
		if cand[best] == none {
			break
		}
		ids[best] = uint32(cand[best])
		ids = append(ids[:best+1], ids[best+2:]...)
		cand = append(cand[:best], cand[best+1:]...)
		if best > 0 {
			cand[best-1] = lookup(ids[best-1], ids[best])
		}
		if best < len(cand) {
			cand[best] = lookup(ids[best], ids[best+1])
		}
	}
	ws.smallIDs, ws.smallCand = ids, cand
	return append(dst, ids...)
}

// A small binary min-heap on a slice, to avoid container/heap's interface boxing.
func heapInit(h []mergeCand) {
	for i := len(h)/2 - 1; i >= 0; i-- {
		heapDown(h, i)
	}
}

func heapPush(h []mergeCand, x mergeCand) []mergeCand {
	h = append(h, x)
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if !h[i].less(h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	return h
}

func heapPop(h []mergeCand) (mergeCand, []mergeCand) {
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	heapDown(h, 0)
	return top, h
}

func heapDown(h []mergeCand, i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		small := l
		if r := l + 1; r < len(h) && h[r].less(h[l]) {
			small = r
		}
		if !h[small].less(h[i]) {
			return
		}
		h[i], h[small] = h[small], h[i]
		i = small
	}
}
