// Package chat renders a model's Jinja chat template exactly as HF transformers does inside
// vLLM: vLLM's request parsing and message preprocessing (content parts, tool-call arguments,
// content-format detection), HF's Jinja environment (tojson, raise_exception, strftime_now,
// {% generation %}), and Python semantics for the operators where the Go engine differs. It
// builds on github.com/ardanlabs/jinja, rewriting templates at compile time so that every
// golden prompt from Python Jinja2 3.1.6 is reproduced byte for byte.
package chat
