package server

import (
	"errors"

	"github.com/kvgate/kvgate/apireq"
)

const (
	pathChat        = string(apireq.ChatCompletions)
	pathCompletions = string(apireq.Completions)
)

// parseRequest decodes and validates a body for endpoint (one parse, apireq.Parser.Parse).
// Model existence and session identity are checked by the caller. It never panics on any input
// (see FuzzParseRequest).
func parseRequest(p *apireq.Parser, endpoint string, body []byte) (*apireq.Request, *apiError) {
	in, e := p.Parse(apireq.Endpoint(endpoint), body)
	if e != nil {
		return nil, fromRequestError(e)
	}
	return in, nil
}

// fromRequestError maps the request model's refusal onto the OpenAI error response.
func fromRequestError(e *apireq.Error) *apiError {
	return &apiError{Status: e.Status, Message: e.Message, Param: e.Param}
}

// asRequestError reports whether err is a request-model refusal and maps it.
func asRequestError(err error) (*apiError, bool) {
	var re *apireq.Error
	if errors.As(err, &re) {
		return fromRequestError(re), true
	}
	return nil, false
}
