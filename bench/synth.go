package bench

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/zeebo/xxh3"
)

// TokenEncoder is the part of a tokenizer prompt synthesis needs (tokenize.Tokenizer has it).
type TokenEncoder interface {
	Encode(text string, addSpecialTokens bool) ([]uint32, error)
}

// synthWords are common English words that are each exactly one token, with a leading space, in
// the byte-level BPE and SentencePiece-BPE vocabularies of the models kvgate serves (Qwen3,
// Llama 3.1, DeepSeek V3, gpt-oss, Gemma 3). Every synthetic token is " word": the pre-tokenizers
// split before each space+letter run, so no merge can cross a word — and therefore no merge can
// cross a block boundary either. That makes encode(concat(blocks)) == concat(encode(block)).
const synthWords = `time year people way day man thing woman life child world school
state family student group country problem hand part place case week company system program
question work government number night point home water room mother area money story fact month
lot right study book eye job word business issue side kind head house service friend father power
hour game line end member law car city community name president team minute idea kid body
information back parent face others level office door health person art war history party result
change morning reason research girl guy moment air teacher force education foot boy age policy
music market sense nation plan college interest death experience effect use class control care
field development role effort rate heart drug show leader light voice wife police mind price
report decision son view relationship town road arm difference value building action model season
society tax director position player record paper space ground form event official matter center
couple site project activity star table need court oil situation cost industry figure street
image phone data picture practice piece land product doctor wall patient worker news test movie
north love support technology step baby computer type attention film tree source organization
hair window evidence population rock garden river stone green blue red black white small large
great little good new old long high open simple clear quiet bright strong early late young free
full real best easy hard warm cold fast slow deep`

// Synth turns hash_ids into prompt text: the same (namespace, hash_id) always yields the same
// text, exactly blockSize tokens long under the served model's tokenizer, so replayed prompts
// share exactly the prefixes the trace records. It is safe for concurrent use (it is immutable).
type Synth struct {
	words     []string
	blockSize int
}

// NewSynth builds a synthesiser for blockSize-token blocks. With an encoder it keeps only the
// words that are a single token for that tokenizer (and fails if too few remain); without one it
// trusts the built-in list, which is single-token for all the reference models.
func NewSynth(enc TokenEncoder, blockSize int) (*Synth, error) {
	if blockSize <= 0 {
		return nil, fmt.Errorf("synth: block size must be > 0, got %d", blockSize)
	}
	all := strings.Fields(synthWords)
	words := all
	if enc != nil {
		words = nil
		for _, w := range all {
			ids, err := enc.Encode(" "+w, false)
			if err != nil {
				return nil, fmt.Errorf("synth: encode %q: %w", w, err)
			}
			if len(ids) == 1 {
				words = append(words, w)
			}
		}
		if len(words) < 64 {
			return nil, fmt.Errorf("synth: only %d of %d filler words are single tokens for this tokenizer", len(words), len(all))
		}
	}
	return &Synth{words: words, blockSize: blockSize}, nil
}

// BlockSize is the number of tokens one hash_id stands for.
func (s *Synth) BlockSize() int { return s.blockSize }

// Block returns the first n tokens (n <= block size) of the block hash_id in namespace ns. A
// partial use is a prefix of the full block, so a hash_id first seen as a partial last block still
// matches its later full uses (avoiding an aiperf quirk: a hash first seen as a
// partial last block is cached short there).
func (s *Synth) Block(ns string, id int64, n int) string {
	var key [8]byte
	binary.LittleEndian.PutUint64(key[:], uint64(id))
	return s.words1(xxh3.HashString(ns)^xxh3.Hash(key[:]), min(n, s.blockSize))
}

// Filler returns n tokens of text seeded by key (tails without a hash_id, prompts without hash_ids).
func (s *Synth) Filler(key string, n int) string {
	return s.words1(xxh3.HashString("filler:"+key), n)
}

func (s *Synth) words1(seed uint64, n int) string {
	if n <= 0 {
		return ""
	}
	rng := rand.New(rand.NewPCG(seed, 0x6b7662656e6368)) // "kvbench"
	var b strings.Builder
	b.Grow(n * 8)
	for range n {
		b.WriteByte(' ')
		b.WriteString(s.words[rng.IntN(len(s.words))])
	}
	return b.String()
}

// Prompt returns inputTokens tokens whose leading blocks are hashIDs; the last block may be partial
// (mooncake rule). Tokens beyond the hashed blocks come from Filler(tailKey).
func (s *Synth) Prompt(ns string, hashIDs []int64, inputTokens int, tailKey string) string {
	var b strings.Builder
	left := inputTokens
	for _, id := range hashIDs {
		if left <= 0 {
			break
		}
		n := min(left, s.blockSize)
		b.WriteString(s.Block(ns, id, n))
		left -= n
	}
	b.WriteString(s.Filler(tailKey, left))
	return b.String()
}

// CheckExact verifies with enc that every block of text is exactly one block of tokens and that
// encoding the concatenation equals concatenating the encodings (no merge across boundaries).
func (s *Synth) CheckExact(enc TokenEncoder, ns string, hashIDs []int64) error {
	var all []uint32
	var text strings.Builder
	for _, id := range hashIDs {
		blk := s.Block(ns, id, s.blockSize)
		ids, err := enc.Encode(blk, false)
		if err != nil {
			return fmt.Errorf("encode block %d: %w", id, err)
		}
		if len(ids) != s.blockSize {
			return fmt.Errorf("block %d is %d tokens, want %d", id, len(ids), s.blockSize)
		}
		all = append(all, ids...)
		text.WriteString(blk)
	}
	got, err := enc.Encode(text.String(), false)
	if err != nil {
		return fmt.Errorf("encode concatenation: %w", err)
	}
	if len(got) != len(all) {
		return fmt.Errorf("concatenation is %d tokens, blocks sum to %d", len(got), len(all))
	}
	for i := range got {
		if got[i] != all[i] {
			return fmt.Errorf("token %d differs: concat %d, blocks %d (merge across a block boundary)", i, got[i], all[i])
		}
	}
	return nil
}
