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

// LimitEncoder is an Encoder that can stop as soon as a text is known to have more than a
// limit of tokens, doing work bounded by the limit rather than by the text. The default backend
// implements it; others are limited after a full Encode.
type LimitEncoder interface {
	// EncodeLimit is Encode that fails with an *engine.LimitError once the result is known to
	// have more than limit tokens (limit <= 0: no limit). Within the limit it equals Encode.
	EncodeLimit(text string, addSpecialTokens bool, limit int) ([]uint32, error)
}
