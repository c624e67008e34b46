// Package kvkey is the vocabulary that request-side matching and event-side indexing share:
// kvgate's block hash (BlockHash, the content key of a prompt prefix, with its definition),
// vLLM's opaque per-engine block hash as decoded from KV events (EngineHash), and the routing
// target (Target, a worker and a data-parallel rank). It is a leaf: it imports nothing of the
// module, so the event index does not depend on the tokenizer or the worker registry
// (docs/ARCHITECTURE.md, "Block hashes").
package kvkey
