package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// fileJSON is the subset of tokenizer.json the engine reads.
type fileJSON struct {
	AddedTokens   []addedTokenJSON `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Decoder       json.RawMessage  `json:"decoder"`
	Model         json.RawMessage  `json:"model"`
	Truncation    json.RawMessage  `json:"truncation"`
	Padding       json.RawMessage  `json:"padding"`
}

type addedTokenJSON struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// patternJSON is {"String": "..."} or {"Regex": "..."}.
type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

// componentJSON holds the fields of every supported normalizer, pre-tokenizer, post-processor
// and decoder; each constructor reads the ones its type uses.
type componentJSON struct {
	Type string `json:"type"`

	Normalizers   []json.RawMessage `json:"normalizers"`
	Pretokenizers []json.RawMessage `json:"pretokenizers"`
	Processors    []json.RawMessage `json:"processors"`
	Decoders      []json.RawMessage `json:"decoders"`

	Pattern    *patternJSON `json:"pattern"`
	Content    string       `json:"content"`
	Prepend    string       `json:"prepend"`
	StripLeft  bool         `json:"strip_left"`
	StripRight bool         `json:"strip_right"`

	Behavior         string `json:"behavior"`
	Invert           bool   `json:"invert"`
	AddPrefixSpace   *bool  `json:"add_prefix_space"`
	UseRegex         *bool  `json:"use_regex"`
	IndividualDigits bool   `json:"individual_digits"`
	Replacement      string `json:"replacement"`
	PrependScheme    string `json:"prepend_scheme"`
	Split            *bool  `json:"split"`

	Single        []templateItemJSON          `json:"single"`
	SpecialTokens map[string]specialTokenJSON `json:"special_tokens"`
	Sep           []json.RawMessage           `json:"sep"`
	Cls           []json.RawMessage           `json:"cls"`

	Start int `json:"start"`
	Stop  int `json:"stop"`
}

type templateItemJSON struct {
	SpecialToken *struct {
		ID string `json:"id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID string `json:"id"`
	} `json:"Sequence"`
}

type specialTokenJSON struct {
	ID  string   `json:"id"`
	IDs []uint32 `json:"ids"`
}

// bpeJSON is the BPE model section.
type bpeJSON struct {
	Type                    string            `json:"type"`
	Dropout                 *float64          `json:"dropout"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	FuseUnk                 bool              `json:"fuse_unk"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Vocab                   map[string]uint32 `json:"vocab"`
	Merges                  mergesJSON        `json:"merges"`
}

// mergesJSON accepts both spellings of BPE merges: ["a b", ...] and [["a", "b"], ...].
type mergesJSON struct {
	pairs [][2]string
	set   bool
}

// UnmarshalJSON decodes the whole list in one call (decoding merge by merge is several times slower).
func (m *mergesJSON) UnmarshalJSON(data []byte) error {
	m.set = true
	i := 1
	for i < len(data) && (data[i] == ' ' || data[i] == '\n' || data[i] == '\r' || data[i] == '\t') {
		i++
	}
	if i < len(data) && data[i] == '"' {
		var list []string
		if err := json.Unmarshal(data, &list); err != nil {
			return err
		}
		m.pairs = make([][2]string, len(list))
		for k, s := range list {
			a, b, ok := strings.Cut(s, " ")
			if !ok {
				return fmt.Errorf("merge %d %q has no space", k, s)
			}
			m.pairs[k] = [2]string{a, b}
		}
		return nil
	}
	return json.Unmarshal(data, &m.pairs)
}

// errUnsupported marks a tokenizer.json component the engine does not implement.
var errUnsupported = errors.New("unsupported tokenizer component")

func unsupported(kind, typ string) error {
	return fmt.Errorf("%w: %s %q", errUnsupported, kind, typ)
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

func parseComponent(raw json.RawMessage) (*componentJSON, error) {
	var c componentJSON
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("parse component: %w", err)
	}
	return &c, nil
}
