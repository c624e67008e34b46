// Package apireq is the gateway's model of one inference API request: the body parsed once (by
// tokenize/chat's order-preserving parser) and validated, the endpoint, model, stream flags,
// cache_salt, session identity, and for the template path the chat messages or the completions
// prompts. Every endpoint maps its body into the same Request, so the server, the session layer
// and the tokenizer read one parse.
package apireq
