package tokenize

// Encoder is a tokenizer backend loaded from a HF model folder. The default backend is the pure-Go
// tokenizer.json engine; builds with the hftokenizers tag use HF tokenizers through cgo instead.
// Implementations are safe for concurrent use.
type Encoder interface {
	// Encode tokenizes text; addSpecialTokens applies the post-processor (e.g. BOS) as HF does.
	Encode(text string, addSpecialTokens bool) ([]uint32, error)
	// Decode turns ids back into text; skipSpecialTokens drops special tokens as HF does.
	Decode(ids []uint32, skipSpecialTokens bool) (string, error)
}
