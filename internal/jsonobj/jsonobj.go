// Package jsonobj writes a JSON object whose keys keep the order they are added in
// (encoding/json sorts a map's keys), from values already encoded. The gateway uses it to put
// a request body back together field by field; the simulator, to answer with the key order
// vLLM's responses have.
package jsonobj

import (
	"bytes"
	"encoding/json"
)

// Writer builds one JSON object. The zero value is an empty object.
type Writer struct {
	b bytes.Buffer
}

// Raw adds key with value written as given (it must be one valid JSON value).
func (w *Writer) Raw(key string, value []byte) {
	if w.b.Len() == 0 {
		w.b.WriteByte('{')
	} else {
		w.b.WriteByte(',')
	}
	k, _ := json.Marshal(key) // a string always encodes
	w.b.Write(k)
	w.b.WriteByte(':')
	w.b.Write(value)
}

// Bytes ends the object and returns it; the Writer is not to be used again.
func (w *Writer) Bytes() []byte {
	if w.b.Len() == 0 {
		return []byte("{}")
	}
	w.b.WriteByte('}')
	return w.b.Bytes()
}
