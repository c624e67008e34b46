// Package server is the gin HTTP front: the OpenAI endpoints, SSE proxying to workers,
// OpenAI-style errors, Prometheus metrics and the debug endpoints.
package server
