//go:build hftokenizers

package tokenize

import (
	"fmt"
	"path/filepath"

	hf "github.com/daulet/tokenizers"
)

// hfEncoder wraps HF tokenizers (Rust, through cgo and libtokenizers.a). The Rust tokenizer is
// safe for concurrent use; it is never closed because encoders live as long as the process.
type hfEncoder struct {
	tk *hf.Tokenizer
}

// newEncoder loads dir/tokenizer.json with HF tokenizers, which has no segment cache.
func newEncoder(dir string, _ int64) (Encoder, error) {
	tk, err := hf.FromFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, fmt.Errorf("tokenize: load %s with HF tokenizers: %w", dir, err)
	}
	return &hfEncoder{tk: tk}, nil
}

// Encode tokenizes text with HF tokenizers.
func (e *hfEncoder) Encode(text string, addSpecialTokens bool) ([]uint32, error) {
	ids, _ := e.tk.Encode(text, addSpecialTokens)
	return ids, nil
}

// Decode turns ids back into text with HF tokenizers.
func (e *hfEncoder) Decode(ids []uint32, skipSpecialTokens bool) (string, error) {
	return e.tk.Decode(ids, skipSpecialTokens), nil
}
