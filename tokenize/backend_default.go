//go:build !hftokenizers

package tokenize

import (
	"fmt"

	"github.com/kvgate/kvgate/tokenize/engine"
)

// defaultSegmentCacheBytes bounds the engine's cache of encoded segments (text between special
// tokens). 64 MiB holds the histories of a few hundred long agentic conversations.
const defaultSegmentCacheBytes = 64 << 20

// newEncoder loads the pure-Go tokenizer.json engine from a HF model folder with a segment cache
// of segmentCacheBytes (0: the default; negative: none).
func newEncoder(dir string, segmentCacheBytes int64) (Encoder, error) {
	switch {
	case segmentCacheBytes == 0:
		segmentCacheBytes = defaultSegmentCacheBytes
	case segmentCacheBytes < 0:
		segmentCacheBytes = 0
	}
	tk, err := engine.Load(dir, engine.WithSegmentCache(int(segmentCacheBytes)))
	if err != nil {
		return nil, fmt.Errorf("tokenize: load %s: %w", dir, err)
	}
	return tk, nil
}
