// Package sim is a simulated vLLM worker: the OpenAI server surface a client can observe,
// a paged prefix cache with vLLM's block-pool semantics, KV events on ZMQ, and a timing model.
package sim
