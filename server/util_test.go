package server

import (
	"bytes"
	"encoding/json"
	"strconv"
	"testing"

	"github.com/kvgate/kvgate/router"
)

// routerFor wraps a policy in a router.Dispatcher, the router the gateway builds for any policy.
func routerFor(t testing.TB, p router.Policy) router.Router {
	t.Helper()
	e, err := router.NewDispatcher(router.DispatcherOptions{Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func jsonUnmarshalStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

func jsonEscape(s string) string {
	b, _ := json.Marshal(s)
	return string(b[1 : len(b)-1])
}

func itoa(n int) string { return strconv.Itoa(n) }
