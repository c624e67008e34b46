package tokenize

import (
	"fmt"
	"sync"
)

// testEncoders shares the encoders this test binary loads: a real tokenizer.json takes
// seconds to load under -race (Gemma 3's about 25 s on a loaded machine), and the tests load the
// same five folders again and again. Each test still gets a Tokenizer of its own (template,
// clock and options as it asks) around the shared encoder: the engine is safe for concurrent
// use and its segment cache only memoizes (engine's TestSegmentCacheExact), so sharing it changes
// no result. The first load of each folder goes through Load itself.
var testEncoders = &encoderCache{m: map[string]Encoder{}}

// encoderCache loads each model folder's encoder once per segment cache setting.
type encoderCache struct {
	mu sync.Mutex
	m  map[string]Encoder // by folder and segment cache setting
}

// load is Load(dir, opts) with the encoder shared.
func (c *encoderCache) load(dir string, opts Options) (*Tokenizer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := fmt.Sprintf("%s\x00%d", dir, opts.SegmentCacheBytes)
	if enc, ok := c.m[key]; ok {
		return NewWithEncoder(enc, dir, opts)
	}
	tk, err := Load(dir, opts)
	if err != nil {
		return nil, err
	}
	c.m[key] = tk.Encoder()
	return tk, nil
}
