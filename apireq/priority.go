package apireq

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// SetVLLMPriority writes vLLM's priority field into the body forwarded to the worker and
// returns the value written. vLLM's priority scheduling policy handles a smaller priority
// earlier (vllm/v1/request.py, Request.__lt__; the field is PriorityRequestMixin.priority in
// vllm/entrypoints/openai/engine/protocol.py). The value is floor, or the client's own
// priority field when that is larger: a client may ask to be handled later, never earlier
// than floor. Every top-level occurrence is replaced, so no duplicate key can win over it. A
// client priority that is not an integer is an *Error (400), as vLLM refuses it.
func (r *Request) SetVLLMPriority(floor int64) (int64, error) {
	spans, err := topLevelValues(r.Body, "priority")
	if err != nil {
		return 0, badRequest("priority", err.Error())
	}
	p := floor
	for _, s := range spans {
		asked, ok, err := parsePriority(r.Body[s[0]:s[1]])
		if err != nil {
			return 0, err
		}
		if ok {
			p = max(p, asked)
		}
	}
	out, err := setTopLevel(r.Body, "priority", strconv.AppendInt(nil, p, 10))
	if err != nil {
		return 0, badRequest("priority", err.Error())
	}
	r.Body = out
	return p, nil
}

// parsePriority reads a client's priority value: an integer (or a number with no fractional
// part, which pydantic's int accepts) within int64; false for null.
func parsePriority(raw []byte) (int64, bool, error) {
	if string(raw) == "null" {
		return 0, false, nil
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		if p, err := n.Int64(); err == nil {
			return p, true, nil
		}
		if f, err := n.Float64(); err == nil && f == math.Trunc(f) && f >= math.MinInt64 && f < math.MaxInt64 {
			return int64(f), true, nil
		}
	}
	return 0, false, badRequest("priority", fmt.Sprintf("priority must be an integer, got %s", raw))
}
