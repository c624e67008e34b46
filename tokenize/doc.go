// Package tokenize turns an OpenAI request into the token ids a vLLM worker would compute: it
// renders the model's chat template, encodes with the model's tokenizer.json, and cuts the result
// into full blocks whose chained xxh3 hashes key the KV index (docs/ARCHITECTURE.md, "Block
// hashes").
package tokenize
